"""GPU code generation: one CUDA kernel per definition of a GPU-scheduled root Func, compiled
and launched through CuPy.

A definition is GPU-scheduled when its outermost loops are ``gpu_block`` loops followed by
``gpu_thread`` loops (``gpu_tile`` makes exactly that); the innermost block (thread) loop maps
to ``blockIdx.x`` (``threadIdx.x``). Block counts are the block loops' extents (evaluated on
the host); the block size is the thread loops' split factors, and threads past a partial
tile's extent do nothing. Loops inside run serially in each thread. Expressions are spelled
with core_ad's C spellings (``core_ad.codegen.c_spell_node``), so the GPU computes what the CPU
does.

Kernel signature::

    extern "C" __global__ void k(char* const* ptrs, const long long* ints)

with ``ptrs`` / ``ints`` laid out as for the CPU kernels (device copies). A pipeline runs
either wholly on the GPU (every root Func GPU-scheduled) or on the CPU.
"""

from __future__ import annotations

import numpy as np
from core_ad import codegen, sym

from . import _expr as E
from ._bounds import const_int
from ._lower import Allocate, Block, For, LetStmt, Provide
from ._schedule import ScheduleError

__all__ = ["GpuKernel", "is_gpu_stmt", "kernel_source"]

_AXES = "xyz"


def is_gpu_stmt(stmt) -> bool:
    return isinstance(stmt, For) and stmt.kind == "gpu_block"


class GpuKernel:
    """Source and launch geometry of one GPU definition."""

    def __init__(self, name, source, blocks, threads):
        self.name, self.source = name, source
        self.blocks = blocks  # For loops, innermost first (grid x, y, z)
        self.threads = threads  # thread factors, innermost first


def _split_gpu_loops(stmt, where):
    blocks, threads = [], []
    s = stmt
    while isinstance(s, For) and s.kind == "gpu_block":
        blocks.append(s)
        s = s.body
    while isinstance(s, For) and s.kind == "gpu_thread":
        threads.append(s)
        s = s.body
    if not blocks or len(blocks) > 3 or len(threads) > 3:
        raise ScheduleError(f"{where}: a GPU schedule needs 1-3 gpu_block loops outermost, then"
                            " at most 3 gpu_thread loops (use gpu_tile)")
    for t in threads:
        if t.factor is None and const_int(t.extent) is None:
            raise ScheduleError(f"{where}: the gpu_thread loop {t.name} needs a constant size")
    return blocks[::-1], threads[::-1], s


class _CWriter:
    """The lowered statements of one kernel body, written through core_ad's CUDA writer."""

    def __init__(self, w: codegen.CudaWriter, slots, root_storage):
        self.w = w
        self.slots, self.root_storage = slots, root_storage
        self.names = {}  # leaf -> C identifier
        self.count = 0

    def fresh(self, prefix="v"):
        self.count += 1
        return f"{prefix}{self.count}"

    def leaf(self, n):
        if n in self.names:
            return self.names[n]
        if E.is_param(n):
            slot = self.slots.ptr_slot(("param", n))
            return f"(*(const {codegen.c_type(n.dtype)}*)ptrs[{slot}])"
        if n.kind in ("hl.region", "hl.store", "hl.bufdim"):
            slot = self.slots.int.get(("leaf", n))
            if slot is None:
                raise ScheduleError(f"a GPU kernel needs {n.key}, computed outside the GPU")
            return f"((int)ints[{slot}])"
        raise ScheduleError(f"GPU kernels cannot read {n.kind} {n.key}")

    def storage(self, fid, k):
        dtypes, ndim, kind = self.root_storage[fid]
        slot = self.slots.ptr_slot(("store", fid, k))
        ct = codegen.c_type(dtypes[k])
        base = f"(({ct}*)ptrs[{slot}])"
        mins, strides = [], []
        stride = "1"
        for d in range(ndim):
            if kind == "buffer":
                mins.append(self.leaf(sym.leaf("hl.bufdim", (fid, d, "min"), np.int32)))
                strides.append(f"((int)ints[{self.slots.int_slot(('stride', fid, d))}])")
            else:
                mins.append(self.leaf(sym.leaf("hl.store", (fid, d, "min"), np.int32)))
                strides.append(stride)
                ext = self.leaf(sym.leaf("hl.store", (fid, d, "extent"), np.int32))
                stride = f"({stride} * {ext})"
        return base, mins, strides

    def index(self, fid, k, coords):
        base, mins, strides = self.storage(fid, k)
        terms = [f"(({c}) - {m}) * {s}" for c, m, s in zip(coords, mins, strides)]
        return base, " + ".join(terms) if terms else "0"

    def exprs(self, nodes):
        """C statements computing ``nodes``; returns their C names."""
        prog = sym.cse(list(nodes))
        local = {}
        for name, n in prog.assignments:
            var = self.fresh()
            if not hasattr(n, "prim"):
                if getattr(n, "op", None) == "const":
                    local[id(n)] = codegen.c_literal(n.value, n.dtype)
                else:
                    local[id(n)] = self.leaf(n)
                continue
            ct = codegen.c_type(n.dtype)
            args = [local[id(a)] for a in n.args]
            if n.prim is E.CALL:
                base, idx = self.index(n.params["fid"], n.params["index"], args)
                self.w.line(f"const {ct} {var} = {base}[{idx}];")
            else:
                text = codegen.c_spell_node(n, args)
                self.w.line(f"const {ct} {var} = {text};")
            local[id(n)] = var
        outs = dict(prog.assignments)
        return [local[id(outs[o])] for o in prog.outputs]

    def stmt(self, s):
        if isinstance(s, Block):
            with self.w.block():
                for t in s.stmts:
                    self.stmt(t)
        elif isinstance(s, For):
            if s.kind in ("gpu_block", "gpu_thread", "parallel"):
                raise ScheduleError(f"loop {s.name}: {s.kind} loops must be outermost in a GPU"
                                    " kernel")
            (ext,) = self.exprs([s.extent])
            name = self.fresh("i")
            self.names[s.leaf] = name
            with self.w.for_range(name, ext):
                self.stmt(s.body)
        elif isinstance(s, LetStmt):
            (v,) = self.exprs([s.value])
            name = self.fresh("let")
            self.w.line(f"const int {name} = {v};")
            self.names[s.leaf] = name
        elif isinstance(s, Allocate):
            raise ScheduleError(f"{s.func.name()} is computed inside a GPU kernel: compute_root"
                                " it (GPU kernels do not allocate)")
        elif isinstance(s, Provide):
            nodes = list(s.values) + list(s.args)
            if s.predicate is not None:
                nodes.append(s.predicate)
            vals = self.exprs(nodes)
            n = len(s.values)
            coords = vals[n:n + len(s.args)]
            stores = [self.index(s.func.fid, k, coords) for k in range(n)]
            if s.predicate is None:
                self._store(stores, vals)
            else:
                with self.w.if_(vals[-1]):
                    self._store(stores, vals)

    def _store(self, stores, vals):
        for (base, idx), v in zip(stores, vals):
            self.w.line(f"{base}[{idx}] = {v};")


def kernel_source(name, stmt, slots, root_storage, where) -> GpuKernel:
    blocks, threads, body = _split_gpu_loops(stmt, where)
    w = codegen.CudaWriter()
    with w.kernel(name, [("char* const* ptrs", "buffer and parameter pointers"),
                         ("const long long* ints", "sizes, strides and bounds")]):
        c = _CWriter(w, slots, root_storage)
        for k, b in enumerate(blocks):
            c.names[b.leaf] = f"((int)blockIdx.{_AXES[k]})"
        for k, t in enumerate(threads):
            c.names[t.leaf] = f"((int)threadIdx.{_AXES[k]})"
        # thread extents depend on the block indices only; threads past them do nothing
        exts = [c.exprs([t.extent])[0] for t in threads]
        guards = [f"((int)threadIdx.{_AXES[k]}) < {ext}" for k, ext in enumerate(exts)]
        if guards:
            w.line(f"if (!({' && '.join(guards)})) return;")
        c.stmt(body)
    factors = [t.factor if t.factor is not None else const_int(t.extent) for t in threads]
    return GpuKernel(name, w.source(), blocks, factors)
