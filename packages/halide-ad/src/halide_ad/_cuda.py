"""GPU code generation: one CUDA kernel per definition of a GPU-scheduled root Func, compiled
and launched through CuPy.

A definition is GPU-scheduled when its outermost loops are ``gpu_block`` loops followed by
``gpu_thread`` loops (``gpu_tile`` makes exactly that); the innermost block (thread) loop maps
to ``blockIdx.x`` (``threadIdx.x``). Block counts are the block loops' extents (evaluated on
the host); the block size is the thread loops' split factors, and threads past a partial
tile's extent do nothing. Loops inside run serially in each thread. Expressions are spelled
with core_ad's C spellings (``core_ad.codegen.c_spell_node``), so the GPU computes what the CPU
does.

A GPU loop over a reduction dimension (an RVar, or a part of one) runs iterations that may
write one point concurrently: the stage must be marked ``atomic()`` (Halide's API) and the
update must add to its Func at the point it writes (``f(e) = f(e) + v``, the form of every
adjoint scatter); its stores become ``atomicAdd`` (the paper's GPU atomics, §4.2.1). Anything
else is refused with a ``ScheduleError`` naming the Func. Float
sums then depend on the order the atomics land in, as in Halide. ``gpu_single_thread()`` runs
a definition (a zero-dimensional Func, say) as one thread of one block.

Kernel signature::

    extern "C" __global__ void k(char* const* __restrict__ ptrs,
                                 const long long* __restrict__ ints)

with ``ptrs`` / ``ints`` laid out as for the CPU kernels (device copies). A pipeline runs
either wholly on the GPU (every root Func GPU-scheduled) or on the CPU.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from core_ad import codegen, sym

from . import _expr as E
from ._bounds import const_int
from ._lower import Allocate, Block, For, LetStmt, Provide, addend, atomic_addend
from ._schedule import ScheduleError

__all__ = ["MAX_BLOCK", "GpuKernel", "is_gpu_stmt", "kernel_source"]

_AXES = "xyz"
MAX_BLOCK = 1024  # threads per block (every CUDA device since compute capability 2.0)


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


# atomicAdd's operand type per element type (64-bit integers add as unsigned: two's complement)
_ATOMIC_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
                 np.dtype(np.int32): "int", np.dtype(np.uint32): "unsigned int",
                 np.dtype(np.int64): "unsigned long long",
                 np.dtype(np.uint64): "unsigned long long"}


class _CWriter:
    """The lowered statements of one kernel body, written through core_ad's CUDA writer.
    ``racy``: the reduction loops among the kernel's GPU loops (their stores must be atomic)."""

    def __init__(self, w: codegen.CudaWriter, slots, root_storage, where="", racy=()):
        self.w = w
        self.where, self.racy = where, list(racy)
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
        dtypes, ndim, kind, _ = self.root_storage[fid]
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
        for _, n in prog.assignments:
            self._assign(n, local)
        outs = dict(prog.assignments)
        return [local[id(outs[o])] for o in prog.outputs]

    def _assign(self, n, local):
        """One CSE'd node as a C constant (``local``: node id -> C name of computed ones)."""
        if not hasattr(n, "prim"):
            if getattr(n, "op", None) == "const":
                local[id(n)] = codegen.c_literal(n.value, n.dtype)
            else:
                local[id(n)] = self.leaf(n)
            return
        var = self.fresh()
        ct = codegen.c_type(n.dtype)
        args = [local[id(a)] for a in n.args]
        if n.prim is E.CALL:
            base, idx = self.index(n.params["fid"], n.params["index"], args)
            self.w.line(f"const {ct} {var} = {base}[{idx}];")
        else:
            self.w.line(f"const {ct} {var} = {codegen.c_spell_node(n, args)};")
        local[id(n)] = var

    def _nest(self, loops, nodes, written, inner):
        """``loops`` (outermost first) around ``inner(names of nodes)``, each subexpression of
        ``nodes`` computed in the outermost loop where its operands are known (loop-invariant
        code motion: nvcc does not hoist what it cannot prove free of side effects, such as
        the floor-division helpers, nor loads it cannot prove unaliased). Loads of Func
        ``written`` (stored in the nest) stay innermost; other loads are not hoisted above a
        loop that may run no iteration (they would read where the loop never reads)."""
        prog = sym.cse(list(nodes))
        depth = {loop.leaf: j + 1 for j, loop in enumerate(loops)}
        runs = [j + 1 for j, loop in enumerate(loops)
                if not (const_int(loop.extent) or 0) >= 1]
        load_floor = max(runs, default=0)
        level = {}
        for _, n in prog.assignments:
            if not hasattr(n, "prim"):
                level[id(n)] = depth.get(n, 0)
            elif n.prim is E.CALL and n.params["fid"] == written:
                level[id(n)] = len(loops)
            else:
                level[id(n)] = max([level[id(a)] for a in n.args]
                                   + ([load_floor] if n.prim is E.CALL else []))
        local = {}
        outs = dict(prog.assignments)

        def emit(j):
            for _, n in prog.assignments:
                if level[id(n)] == j:
                    self._assign(n, local)
            if j == len(loops):
                inner([local[id(outs[o])] for o in prog.outputs])
                return
            (ext,) = self.exprs([loops[j].extent])
            name = self.fresh("i")
            self.names[loops[j].leaf] = name
            with self.w.for_range(name, ext):
                emit(j + 1)
        with self.w.block():
            emit(0)

    def stmt(self, s):
        if isinstance(s, Block):
            with self.w.block():
                for t in s.stmts:
                    self.stmt(t)
        elif isinstance(s, For):
            if s.kind in ("gpu_block", "gpu_thread", "parallel"):
                raise ScheduleError(f"loop {s.name}: {s.kind} loops must be outermost in a GPU"
                                    " kernel")
            loops, t = [], s
            while isinstance(t, For) and t.kind in ("serial", "unrolled", "vectorized"):
                loops.append(t)
                t = t.body
            if isinstance(t, Provide):
                addends = self._reduction(loops, t)
                if addends is not None:
                    self._accumulate(loops, t, addends)
                else:
                    self._provide(t, loops)
                return
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
            self._provide(s, [])

    def _provide(self, s, loops):
        """``s`` inside ``loops``: plain stores, or atomic additions under racy GPU loops."""
        values = list(s.values)
        atomic = bool(self.racy)
        if atomic:
            values = [self._atomic_addend(s, k) for k in range(len(values))]
        nodes = values + list(s.args) + ([s.predicate] if s.predicate is not None else [])
        n = len(values)
        types = [_ATOMIC_TYPES[np.dtype(v.dtype)] for v in values] if atomic else None

        def store(vals):
            coords = vals[n:n + len(s.args)]
            stores = [self.index(s.func.fid, k, coords) for k in range(n)]
            if s.predicate is None:
                self._store(stores, vals, types)
            else:
                with self.w.if_(vals[-1]):
                    self._store(stores, vals, types)
        self._nest(loops, nodes, s.func.fid, store)

    def _reduction(self, loops, p):
        """The addends when ``p``, inside ``loops``, adds to its Func at a point none of those
        loops moves (a gathered reduction, ``d_in(x, y) += w(r) * d_out(x - r, y)``); else
        None. Its sum is then kept in a register: through the pointer table, the compiler
        cannot prove that the store does not alias the loads, so it would load and store the
        point on every iteration."""
        if self.racy or not loops:
            return None
        moved = {loop.leaf for loop in loops}
        if any(moved & set(sym.free_leaves(a, "hl.loop")) for a in p.args):
            return None
        addends = [addend(v, p.func.fid, k, p.args) for k, v in enumerate(p.values)]
        return None if any(a is None for a in addends) else addends

    def _accumulate(self, loops, p, addends):
        with self.w.block():
            coords = self.exprs(list(p.args))
            stores = [self.index(p.func.fid, k, coords) for k in range(len(addends))]
            accs = []
            for (base, idx), v in zip(stores, addends):
                accs.append(self.fresh("acc"))
                self.w.line(f"{codegen.c_type(v.dtype)} {accs[-1]} = {base}[{idx}];")

            def add(vals):
                with self.w.if_(vals[-1]) if p.predicate is not None else nullcontext():
                    for acc, v in zip(accs, vals):
                        self.w.line(f"{acc} = {acc} + {v};")
            nodes = list(addends) + ([p.predicate] if p.predicate is not None else [])
            self._nest(loops, nodes, p.func.fid, add)
            for (base, idx), acc in zip(stores, accs):
                self.w.line(f"{base}[{idx}] = {acc};")

    def _atomic_addend(self, s, k):
        v = atomic_addend(s, k, self.where, self.racy,
                          "else keep them serial inside each thread: GPU-tile the pure Vars")
        if np.dtype(v.dtype) not in _ATOMIC_TYPES:
            raise ScheduleError(
                f"{self.where}: GPU atomics add float32, float64 and 32/64-bit integers;"
                f" {s.func.name()} is {np.dtype(v.dtype)}: keep the reduction loops serial"
                " inside each thread"
            )
        return v

    def _store(self, stores, vals, atomic_types=None):
        for k, ((base, idx), v) in enumerate(zip(stores, vals)):
            if atomic_types is None:
                self.w.line(f"{base}[{idx}] = {v};")
            else:
                t = atomic_types[k]
                self.w.line(f"atomicAdd(({t}*)&{base}[{idx}], ({t})({v}));")


def kernel_source(name, stmt, slots, root_storage, where) -> GpuKernel:
    blocks, threads, body = _split_gpu_loops(stmt, where)
    factors = [t.factor if t.factor is not None else const_int(t.extent) for t in threads]
    if int(np.prod(factors)) > MAX_BLOCK:
        raise ScheduleError(f"{where}: a GPU block of {' x '.join(map(str, factors))} threads;"
                            f" CUDA allows at most {MAX_BLOCK}")
    w = codegen.CudaWriter()
    w.line(f"// {where}")  # the definition this kernel computes (for readers and profiles)
    # restrict: stores through the buffer pointers never change the tables (no reloads)
    with w.kernel(name, [("char* const* __restrict__ ptrs", "buffer and parameter pointers"),
                         ("const long long* __restrict__ ints", "sizes, strides and bounds")],
                  max_threads=int(np.prod(factors))):
        c = _CWriter(w, slots, root_storage, where,
                     [loop for loop in blocks + threads if not loop.pure])
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
    return GpuKernel(name, w.source(), blocks, factors)
