"""Pipelines: compile once (cached), realize many times.

``Pipeline([f, g]).realize([w, h])`` infers bounds (numerically, for these sizes), allocates
the root Funcs, and runs the compiled definitions in order; a parallel outermost loop is split
across core_ad's thread pool. Compiled code depends on the algorithm, the schedule and the
types, never on sizes or Param values: realizing again, at any size, compiles nothing.
"""

from __future__ import annotations

import numpy as np
from core_ad import codegen, sym

from . import _expr as E
from ._autoschedule import auto_schedule
from ._bounds import const_value, interval
from ._buffer import Buffer
from ._cuda import is_gpu_stmt, kernel_source
from ._func import Func, FuncError, register_pipeline_class
from ._graph import Graph
from ._llvm import ModuleBuilder, Slots
from ._lower import lower_pipeline, root_regions
from ._print import loop_nest_text
from ._storage import element_strides, padded_empty
from ._schedule import ScheduleError

__all__ = ["Pipeline", "Realization"]



class Realization(list):
    """The Buffers of a multi-valued realize (one per Tuple component / output)."""


class _Compiled:
    def __init__(self, outputs):
        self.graph = g = Graph(outputs)
        self.roots = [fid for fid in g.order if g.levels[fid].kind == "root"]
        self.slots = slots = Slots()
        self.storage_orders = {}  # CPU intermediates laid out by reorder_storage
        storage = {}
        for fid, buf in g.buffers.items():
            storage[fid] = ([buf.type().dtype], buf.dimensions(), "buffer", 0)
            for d in range(buf.dimensions()):
                for w in ("min", "extent"):
                    slots.int_slot(("leaf", sym.leaf("hl.bufdim", (fid, d, w), np.int32)))
                slots.int_slot(("stride", fid, d))
            slots.ptr_slot(("store", fid, 0))
        self.python_stored = [fid for fid in g.order
                              if g.levels[fid].kind == "root" or g.stores[fid].kind == "root"]
        for fid in self.python_stored:
            f = g.funcs[fid]
            storage[fid] = ([t.dtype for t in f.types()], f.dimensions(), "func", 0)
            for d in range(f.dimensions()):
                for kind in ("region", "store"):
                    if kind == "region" and g.levels[fid].kind != "root":
                        continue
                    for w in ("min", "extent"):
                        slots.int_slot(("leaf", sym.leaf(f"hl.{kind}", (fid, d, w), np.int32)))
            for k in range(len(f.types())):
                slots.ptr_slot(("store", fid, k))
        self.params = list(g.params)
        for p in self.params:
            slots.ptr_slot(("param", p))
        self.kernels = []  # (fid, def index, stmt, kernel index, ranged)
        self.regions_cache: dict = {}
        self.scratch: dict = {}  # bounds key -> {fid: arrays} of intermediate root Funcs
        lowered = lower_pipeline(g, self.roots)
        gpu = [is_gpu_stmt(stmt) for _, _, stmt in lowered]
        self.gpu = any(gpu)
        if self.gpu:
            if not all(gpu):
                cpu = sorted({g.funcs[fid].name() for (fid, _, _), on in zip(lowered, gpu)
                              if not on})
                raise ScheduleError(
                    "a pipeline runs wholly on the GPU or on the CPU: give "
                    f"{', '.join(cpu)} a GPU schedule (gpu_tile) too"
                )
            self.gpu_kernels = []
            for n, (fid, k, stmt) in enumerate(lowered):
                where = f"{g.funcs[fid].name()}{g.defs[fid][k].source.stage_name()}"
                self.gpu_kernels.append(
                    (stmt, kernel_source(f"halide_ad_k{n}", stmt, slots, storage, where)))
                self.kernels.append((fid, k, stmt, n, False))
            self.ir = "\n\n".join(kern.source for _, kern in self.gpu_kernels)
            self.versions = _versions(g)
            return
        output_fids = {f.fid for f in outputs}
        for fid in self.python_stored:  # on the CPU, strides come with the arrays
            dtypes, ndim, _, _ = storage[fid]
            order = g.funcs[fid].storage_order
            if order is not None and fid not in output_fids:
                self.storage_orders[fid] = order
            storage[fid] = (dtypes, ndim, "strided", self.storage_orders.get(fid, [0])[0])
            for d in range(ndim):
                slots.int_slot(("stride", fid, d))
        mb = ModuleBuilder("halide_ad_pipeline", slots, storage, self.params,
                           list(g.buffers) + list(g.order))
        names = []
        for fid, k, stmt in lowered:
            name = f"def{len(names)}"
            ranged = mb.add_kernel(name, stmt)
            self.kernels.append((fid, k, stmt, len(names), ranged))
            names.append(name)
        fns = mb.compile()
        self.entries = [fns[name] for name in names]
        self.ir = mb.kernels.ir
        self.versions = _versions(g)

    def current(self) -> bool:
        """No Func of the pipeline was redefined or rescheduled since compilation."""
        return all(f.version == v for f, v in self.versions)


class Pipeline:
    """Several output Funcs computed together (shared producers computed once)."""

    def __init__(self, outputs):
        if isinstance(outputs, Func):
            outputs = [outputs]
        self.outputs = list(outputs)
        if not self.outputs:
            raise FuncError("a Pipeline needs at least one output Func")
        self._compiled: _Compiled | None = None
        self._last_sizes = None  # per output, [(min, extent), ...] of the last realize

    def _compile(self) -> _Compiled:
        c = self._compiled
        if c is None or not c.current():
            c = self._compiled = _Compiled(self.outputs)
        return c

    def compile_jit(self, target=None):
        self._compile()
        return self

    def auto_schedule(self, estimates=None, target="cpu", **options):
        """Schedule this pipeline's Funcs with :func:`halide_ad.auto_schedule` (estimates
        default to the sizes of the last ``realize``); returns its decisions."""
        if estimates is None and self._last_sizes is not None:
            estimates = dict(zip(self.outputs, self._last_sizes))
        return auto_schedule(self.outputs, estimates, target, **options)

    # ---- realize -----------------------------------------------------------------------
    def realize(self, sizes=None, target=None):
        """Compute every output: ``sizes`` is one list of extents for all outputs (``[W, H]``),
        one list per output (``[[W, H], [N]]``: outputs of different shapes or
        dimensionality), or output Buffers (one per output value, realized into in place).
        Returns one array per output value (a single array for a single-valued output)."""
        c = self._compile()
        g = c.graph
        outs = self._outputs(sizes)
        values = self._values(c)
        out_regions = {f.fid: [(0, int(ext)) for ext in reversed(arrs[0].shape)]
                       for f, arrs in outs}
        self._last_sizes = list(out_regions.values())
        key = (tuple((fid, tuple(r)) for fid, r in out_regions.items()),
               tuple((leaf, np.asarray(v).item()) for leaf, v in values.items()))
        cached = c.regions_cache.get(key)
        if cached is None:  # bounds depend only on sizes and Param values: remember them
            regions = root_regions(g, out_regions, values)
            if c.gpu:  # each kernel's grid (its block loops' extents)
                extents = [tuple(max(_outer_extent(b, g, regions, values), 0)
                                 for b in kern.blocks) for _, kern in c.gpu_kernels]
            else:
                extents = [_outer_extent(stmt, g, regions, values) if ranged else 1
                           for _, _, stmt, _, ranged in c.kernels]
            if len(c.regions_cache) > 16:
                c.regions_cache.clear()
            cached = c.regions_cache[key] = (regions, extents)
        regions, extents = cached
        arrays = {f.fid: arrs for f, arrs in outs}
        on_device = [buf.name() for buf in g.buffers.values() if buf.on_device] + [
            f.name() for f, arrs in outs if not isinstance(arrs[0], np.ndarray)]
        if on_device and not c.gpu:
            raise FuncError(
                f"realize: {', '.join(on_device)} live(s) on the GPU, but this pipeline is"
                " scheduled for the CPU: give it a GPU schedule (gpu_tile, or"
                " auto_schedule(target='gpu')), or pass numpy arrays"
            )
        for f, arrs in outs:  # compiled code assumes storages never alias (as Halide)
            for a in arrs:
                for buf in g.buffers.values():
                    if isinstance(a, np.ndarray) and not buf.on_device and \
                            np.shares_memory(a, buf.numpy()):
                        raise FuncError(
                            f"realize: the output buffer of {f.name()} shares memory with the"
                            f" input {buf.name()}; realize into a separate array"
                        )
        # intermediate Funcs reuse the arrays of the previous realize of the same sizes (taken
        # out of the pool while in use, so concurrent realizes never share one): fresh large
        # arrays would pay the kernel's page faults again on every call
        pooled = c.scratch.pop(key, None)
        scratch = {}
        for fid in c.python_stored:
            if fid not in arrays:
                f = g.funcs[fid]
                shape = tuple(ext for _, ext in reversed(regions[fid]))
                arrays[fid] = scratch[fid] = (pooled or {}).get(fid) or padded_empty(
                    shape, [t.dtype for t in f.types()], c.storage_orders.get(fid))
        # the kernels index a Tuple's values with one set of strides: values laid out
        # differently from the first are computed into dense arrays and copied back
        copies = []
        for f, arrs in ([] if c.gpu else outs):
            if any(element_strides(a) != element_strides(arrs[0]) for a in arrs[1:]):
                arrays[f.fid] = [np.empty(a.shape, a.dtype) for a in arrs]
                copies += zip(arrs, arrays[f.fid])
        for fid, arrs in arrays.items():
            _check_index_range(g.funcs[fid].name(), arrs[0])
        for buf in g.buffers.values():
            _check_index_range(buf.name(), buf.array())
        ints = np.zeros(max(len(c.slots.int), 1), np.int64)
        for slot_key, slot in c.slots.int.items():
            ints[slot] = self._int_value(slot_key, g, regions, values, arrays)
        if c.gpu:
            _run_gpu(c, g, arrays, {f.fid for f, _ in outs}, ints, values, extents)
            return self._results(outs, arrays)
        keep = []
        ptrs = np.zeros(max(len(c.slots.ptr), 1), np.uintp)
        for slot_key, slot in c.slots.ptr.items():
            if slot_key[0] == "store":
                _, fid, k = slot_key
                a = g.buffers[fid].numpy() if fid in g.buffers else arrays[fid][k]
            else:
                p = slot_key[1]
                a = np.array(values[p], dtype=p.dtype).reshape(1)
            keep.append(a)
            ptrs[slot] = a.__array_interface__["data"][0]
        for (fid, k, stmt, index, ranged), n in zip(c.kernels, extents):
            self._run(c, index, n, ranged and stmt.kind == "parallel", ptrs, ints)
        del keep
        for user, dense in copies:
            user[...] = dense
        if len(c.scratch) >= 2:
            c.scratch.clear()
        c.scratch[key] = scratch
        return self._results(outs, {f.fid: arrs for f, arrs in outs})

    @staticmethod
    def _results(outs, arrays):
        results = []
        for f, _ in outs:
            arrs = arrays[f.fid]
            bufs = [Buffer(a, name=f.name()) for a in arrs]
            results.append(bufs[0] if len(bufs) == 1 else Realization(bufs))
        return results[0] if len(results) == 1 else Realization(results)

    @staticmethod
    def _run(c, index, n, parallel, ptrs, ints):
        pa, ia = ptrs.ctypes.data, ints.ctypes.data
        if n <= 0:
            return
        # several chunks per thread balance uneven rows (boundary tiles, clamped tails)
        for rc in codegen.parallel_for(c.entries[index], n, (pa, ia),
                                       threads=None if parallel else 1, chunks_per_thread=4):
            _check_rc(rc)

    def _outputs(self, sizes):
        outs = []
        if isinstance(sizes, Buffer) or (isinstance(sizes, (list, tuple)) and sizes
                                         and isinstance(sizes[0], Buffer)):
            bufs = [sizes] if isinstance(sizes, Buffer) else list(sizes)
            k = 0
            for f in self.outputs:
                n = len(f.types())
                group = bufs[k:k + n]
                k += n
                if len(group) != n:
                    raise FuncError(f"realize: {f.name()} needs {n} output buffer(s)")
                for bf, t in zip(group, f.types()):
                    if bf.type() != t:
                        raise FuncError(
                            f"realize: output buffer {bf.name()} is {bf.type()}, {f.name()} is {t}"
                        )
                outs.append((f, [bf.array() for bf in group]))
            return outs
        sizes = [] if sizes is None else list(sizes)
        if sizes and all(isinstance(s, (list, tuple)) for s in sizes):  # one list per output
            if len(sizes) != len(self.outputs):
                raise FuncError(f"realize: {len(sizes)} size lists for {len(self.outputs)} "
                                f"outputs ({', '.join(f.name() for f in self.outputs)})")
            per_output = [[int(e) for e in s] for s in sizes]
        elif any(isinstance(s, (list, tuple)) for s in sizes):
            raise FuncError(f"realize: sizes must be one list of extents or one list per "
                            f"output, got {sizes}")
        else:
            per_output = [[int(e) for e in sizes]] * len(self.outputs)
        for f, sizes in zip(self.outputs, per_output):
            if len(sizes) != f.dimensions():
                raise FuncError(
                    f"realize: {f.name()} has {f.dimensions()} dimension(s), got {len(sizes)}"
                    f" size(s) {sizes}"
                )
            if any(s < 0 for s in sizes):
                raise FuncError(f"realize: negative size in {sizes}")
            shape = tuple(reversed(sizes))
            outs.append((f, [np.empty(shape, t.dtype) for t in f.types()]))
        return outs

    @staticmethod
    def _values(c):
        values = {}
        for p in c.params:
            obj = E.PARAMS.get(p.key)
            v = None if obj is None else obj.get()
            if v is None:
                name = obj.name() if obj is not None else p.key
                raise FuncError(f"Param {name} has no value: call .set(value) before realize")
            values[p] = v
        for fid, buf in c.graph.buffers.items():
            for d in range(buf.dimensions()):
                values[sym.leaf("hl.bufdim", (fid, d, "min"), np.int32)] = buf.dim(d).min()
                values[sym.leaf("hl.bufdim", (fid, d, "extent"), np.int32)] = buf.dim(d).extent()
        return values

    @staticmethod
    def _int_value(key, g, regions, values, arrays):
        if key[0] == "stride":
            _, fid, d = key
            if fid in g.buffers:
                return g.buffers[fid].dim(d).stride()
            a = arrays[fid][0]
            return a.strides[a.ndim - 1 - d] // a.itemsize
        leaf = key[1]
        if leaf.kind == "hl.bufdim":
            return values[leaf]
        fid, d, w = leaf.key
        lo, ext = regions[fid][d]
        return lo if w == "min" else ext

    # ---- inspection --------------------------------------------------------------------
    def loop_nest(self) -> str:
        c = self._compile()
        return loop_nest_text(c.graph, c.roots, [(fid, k, s) for fid, k, s, _, _ in c.kernels])

    def print_loop_nest(self):
        text = self.loop_nest()
        print(text)
        return text

    def ir(self) -> str:
        """The LLVM IR of the compiled pipeline."""
        return self._compile().ir


register_pipeline_class(Pipeline)


def _run_gpu(c, g, arrays, outputs, ints, values, grids):
    """Run a GPU pipeline (``grids``: each kernel's launch grid): inputs and Funcs on the
    device, the numpy arrays of the Funcs in ``outputs`` copied back (device Buffers are read
    and written where they are)."""
    if not codegen.cuda_available():
        raise RuntimeError(
            "this pipeline has a GPU schedule (gpu_tile / gpu_blocks), which needs CuPy and a"
            " CUDA device (pip install 'difvis-halide-ad[cuda]'); none is available here"
        )
    import cupy as cp

    dev = {}
    ptrs = np.zeros(max(len(c.slots.ptr), 1), np.uint64)
    for key, slot in c.slots.ptr.items():
        if key[0] == "store":
            _, fid, k = key
            if fid in g.buffers:
                buf = g.buffers[fid]
                a = buf.array() if buf.on_device else cp.asarray(np.ascontiguousarray(
                    buf.numpy()))
            elif not isinstance(arrays[fid][k], np.ndarray):
                a = arrays[fid][k]
            else:
                a = cp.empty(arrays[fid][k].shape, arrays[fid][k].dtype)
        else:
            a = cp.asarray(np.array(values[key[1]], dtype=key[1].dtype).reshape(1))
        dev[key] = a
        ptrs[slot] = a.data.ptr
    # device buffers are contiguous: their strides replace the host ones
    for (kind, *rest), slot in c.slots.int.items():
        if kind == "stride":
            fid, d = rest
            a = dev[("store", fid, 0)]
            ints[slot] = a.strides[a.ndim - 1 - d] // a.itemsize
    d_ptrs, d_ints = cp.asarray(ptrs), cp.asarray(ints)
    for (_, kern), grid in zip(c.gpu_kernels, grids):
        if min(grid) == 0:
            continue
        block = tuple(kern.threads) or (1,)
        fn = codegen.cuda_kernel(kern.source, kern.name)
        fn(grid, block, (d_ptrs, d_ints))
    for fid in outputs:
        for k, a in enumerate(arrays[fid]):
            if isinstance(a, np.ndarray):
                a[...] = cp.asnumpy(dev[("store", fid, k)])


def _versions(g):
    return [(f, f.version) for f in g.funcs.values()]


def _check_index_range(name, a):
    span = sum((n - 1) * abs(st) // a.itemsize for n, st in zip(a.shape, a.strides) if n > 0)
    if a.size and span >= 2**31:
        raise FuncError(
            f"{name}: {a.size} elements span {span + 1} positions; compiled pipelines index"
            " with int32 (as Halide), so a buffer must span fewer than 2^31 elements"
        )


def _check_rc(rc):
    if rc == 2:
        raise MemoryError("halide_ad: allocation of an intermediate Func failed")
    if rc != 0:
        raise RuntimeError(f"halide_ad: pipeline kernel failed with code {rc}")


def _outer_extent(stmt, g, regions, values):
    env = {}
    for fid, reg in regions.items():
        for d, (lo, ext) in enumerate(reg):
            for w, v in (("min", lo), ("extent", ext)):
                for kind in ("hl.region", "hl.store"):
                    leaf = sym.leaf(kind, (fid, d, w), np.int32)
                    env[leaf] = (sym.const(v, np.int32), sym.const(v, np.int32))
    for leaf, v in values.items():
        env[leaf] = (sym.const(v, leaf.dtype), sym.const(v, leaf.dtype))
    iv = interval(stmt.extent, env)
    v = None if iv is None else const_value(iv[0])
    if v is None:
        raise FuncError(f"cannot evaluate the extent of loop {stmt.name}")
    return int(v)
