"""Calling compiled kernels: argument checks, a thread pool over lane ranges, error slots.

Call contract of an :class:`LLVMKernel` ``fn(*arrays, num_threads=None)`` (the numpy
backend's, made strict):

* one argument per input, in input order (TypeError naming the count and the inputs);
* lane inputs are 1-D arrays of N lanes or 0-d scalars (numpy 0-d arrays, numpy scalars,
  Python scalars) broadcast to every lane; buffers are whole 1-D arrays; other shapes raise
  ValueError, as do 1-D inputs of different lengths (naming each input's shape);
* the dtype must be the leaf's exactly (TypeError naming the input, the expected and the
  given dtype): no silent casts. Python scalars are accepted where numpy would keep the leaf
  dtype (NEP 50 weak scalars: a ``float`` for a float32 leaf, an ``int`` for any numeric
  leaf, a ``bool`` for a bool leaf);
* arrays must be aligned; buffers contiguous (ValueError suggesting
  ``np.ascontiguousarray``); lane inputs may be strided (a stride that is a non-negative
  multiple of the itemsize: a column ``block[:, k]`` of a row-major (N, width) block is read
  in place, by the strided variant's gathers);
* returns a tuple with one new array per output: N lanes (0-d when every lane input is
  0-d); a scatter_add output is the whole updated copy of its buffer; a lane_sum output is
  0-d (each range's call sums its lanes; the partials are added in range order, so the
  result is deterministic for a given thread count);
* ``out=`` (keyword; kernels whose outputs are all lanes): one writable 1-D array of N
  lanes per output, of its dtype, strided or not (the columns of a row-major (N, width)
  block: the strided variant scatters into them), not overlapping the inputs; the kernel
  writes them and returns them;
* an out-of-range gather / scatter_add index raises IndexError naming the operation, the
  buffer, the index and the lane, before any out-of-range access.

Threads: ``num_threads`` (keyword), else ``CORE_AD_NUM_THREADS``, else the CPUs available; a
call uses at most one thread per :attr:`LLVMKernel.min_lanes` lanes. The ranges run through
:func:`~.builder.parallel_for`: without scatter outputs the lanes are cut into
:data:`CHUNKS_PER_THREAD` chunks per thread, which the threads take in turn (a core shared
with another process does less of the work); with scatter outputs there is one range per
thread. Ranges start at multiples of the vector width, so every lane is
computed by the same code path whatever the thread count (lane results are bitwise identical
for 1 and N threads). ctypes releases the GIL during the call, so the pool's threads run truly
in parallel.

scatter_add under threads (option ``scatter``): ``"partials"`` -- thread 0 accumulates into the
output copy, every other thread into a private zeroed buffer, summed afterwards (deterministic
for a given thread count; costs (T-1) x buffer length); ``"atomic"`` -- every thread
accumulates into the output copy with ``atomicrmw`` (no extra memory; order-dependent
rounding); ``"auto"`` (default) -- partials when (T-1) x buffer length <= the lane count, else
atomic.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .. import host_pool
from .builder import parallel_for
from ..._sym.buffers import is_buffer, is_reduction, is_scatter
from ..._sym.expr import Apply

__all__ = ["LLVMKernel", "map_ordered", "num_threads", "thread_pool"]

_KFUNC = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_void_p)

_POOL = None
_POOL_LOCK = threading.Lock()
CHUNKS_PER_THREAD = 4


def thread_pool() -> ThreadPoolExecutor:
    """The shared pool (``os.cpu_count()`` workers, created on first use)."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=cpu_count(),
                                           thread_name_prefix="core_ad")
    return _POOL


def map_ordered(fn, items, window=None):
    """``fn(item)`` for each of ``items`` on the pool's threads, results yielded in item
    order; at most ``window`` calls (default :func:`num_threads`) are submitted ahead of the
    one being waited for, which bounds the memory of results not yet consumed; when ``fn``
    raises or the caller stops early, the calls not started are cancelled and the running ones
    awaited before the error propagates. With a window
    of 1 the calls run in the caller, one after another. ``fn`` may call compiled kernels:
    :func:`~.builder.parallel_for` from a busy pool does not wait for helpers that never
    start."""
    window = num_threads() if window is None else max(1, int(window))
    if window == 1:
        for item in items:
            yield fn(item)
        return
    pool, pending = thread_pool(), deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # an error or an early exit: no call outlives the loop
        for f in pending:
            f.cancel()
        for f in pending:
            if not f.cancelled():
                f.exception()


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _extent(a: np.ndarray, start: int) -> tuple[int, int]:
    """The byte range [start, end) a 1-D array at address ``start`` lies in."""
    return start, start + (a.shape[0] - 1) * a.strides[0] + a.itemsize


_CPUS = None


def cpu_count() -> int:
    """CPUs this process may run on (affinity-aware; computed once)."""
    global _CPUS
    if _CPUS is None:
        try:
            _CPUS = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _CPUS = os.cpu_count() or 1
    return max(1, _CPUS)


def num_threads(requested=None) -> int:
    """Thread count: ``requested``, else ``CORE_AD_NUM_THREADS``, else ``os.cpu_count()``."""
    if requested is None:
        env = os.environ.get("CORE_AD_NUM_THREADS")
        if env:
            try:
                requested = int(env)
            except ValueError:
                raise ValueError(
                    f"CORE_AD_NUM_THREADS must be a positive integer, got {env!r}"
                ) from None
            if requested < 1:
                raise ValueError(f"CORE_AD_NUM_THREADS must be a positive integer, got {env!r}")
        else:
            return cpu_count()
    requested = int(requested)
    if requested < 1:
        raise ValueError(f"num_threads must be a positive integer, got {requested}")
    return requested


def _debug() -> bool:
    return os.environ.get("CORE_AD_DEBUG", "") not in ("", "0")


_WEAK_OK = {bool: "b", int: "iuf", float: "f"}


def _plural(n, word):
    return f"{n} {word}{'s' if n != 1 else ''}"


def min_lanes_of(prog) -> int:
    """Lanes per thread below which a call of ``prog``'s kernel does not start another
    thread: its rough per-lane cost against a thread's start-up."""
    n_ops = sum(1 for _, n in prog.assignments if isinstance(n, Apply))
    n_calls = sum(1 for _, n in prog.assignments if isinstance(n, Apply)
                  and n.prim.name in _EXPENSIVE)
    cost = 1 + n_ops + 20 * n_calls  # ~ns per lane, roughly
    return int(min(65536, max(2048, 400_000 // cost)))


class OutputSpec(NamedTuple):
    """A lane output of a kernel loaded without its program: its dtype only."""

    dtype: np.dtype


class LLVMKernel:
    """A compiled lane-wise kernel (returned by ``sym.compile(..., backend="llvm")``).

    Attributes: ``program`` (the cse Program), ``inputs``, ``outputs``, ``backend``
    (``"llvm"``), ``key`` (structural hash), ``compile_time`` (seconds to build the first
    variant: IR, O3, machine code), ``width`` (lanes per vector iteration), ``ir`` (the
    LLVM IR of the all-array variant), ``options``. Variants for 0-d (broadcast) inputs and the
    atomic-scatter variant are compiled on first use.
    """

    backend = "llvm"

    def __init__(self, prog, roots, inputs, options: dict, key: str, builder, min_lanes=None):
        # prog: the Program, or a callable building it on first use (a derived kernel whose
        # machine code came from the disk cache, see :func:`.load_derived`; ``min_lanes`` is
        # then given, and ``roots`` are :class:`OutputSpec` stand-ins of lane outputs)
        self._program = prog
        self.outputs = list(roots)
        self.inputs = list(inputs)
        self.options = dict(options)
        self.key = key
        # builder(mask, atomic, strided) -> (address, KernelIR, seconds)
        self._builder = builder
        self._variants: dict = {}
        self._lock = threading.Lock()
        self.names = [str(v.key) if is_buffer(v) else v.name for v in self.inputs]
        self.in_dtypes = [v.dtype for v in self.inputs]
        self.is_buf = [is_buffer(v) for v in self.inputs]
        self.scatter_out = [is_scatter(r) for r in self.outputs]
        self.sum_out = [k for k, r in enumerate(self.outputs) if is_reduction(r)]
        self.n_in = len(self.inputs)
        self.buf_pos = [j for j, bf in enumerate(self.is_buf) if bf]
        self.compile_times: dict = {}
        self._stacked = None  # the dtype of call_stacked, once checked
        self.last_call: dict = {}  # diagnostics: threads, atomic, variant of the last call
        # scatter outputs: the input position of their buffer; duplicates copy the first
        self.scatter_src = {}
        first = {}
        self.dup_of = {}
        for k, r in enumerate(self.outputs):
            if self.scatter_out[k]:
                self.scatter_src[k] = next(j for j, v in enumerate(self.inputs)
                                           if v is r.args[0])
                if id(r) in first:
                    self.dup_of[k] = first[id(r)]
                else:
                    first[id(r)] = k
        self.scatter_first = [k for k in range(len(self.outputs))
                              if self.scatter_out[k] and k not in self.dup_of]
        self._argmsg = (
            f"compiled function takes {_plural(self.n_in, 'array')}"
            f" ({', '.join(self.names)}), got %d"
        )
        self.min_lanes = min_lanes_of(prog) if min_lanes is None else int(min_lanes)
        addr, kir, secs = self._build((False,) * self.n_in, False)
        self.width = kir.width
        self._ir = kir.text  # None when the machine code came from the disk cache
        self.compile_time = secs

    @property
    def program(self):
        """The cse :class:`~core_ad.sym.Program` (built now for a kernel loaded without it)."""
        if callable(self._program):
            self._program = self._program()
        return self._program

    @property
    def ir(self) -> str:
        """LLVM IR of the all-array variant (built now if the disk cache supplied the code)."""
        if self._ir is None:
            self._ir = self._builder.ir_text((False,) * self.n_in, False)
        return self._ir

    # ---- variants ----------------------------------------------------------------------
    def _build(self, mask, atomic, strided=False):
        addr, kir, secs = self._builder(mask, atomic, strided)
        cfunc = _KFUNC(addr)
        self._variants[(mask, atomic, strided)] = (cfunc, kir)
        self.compile_times[(mask, atomic, strided)] = secs
        return addr, kir, secs

    def _variant(self, mask, atomic, strided):
        v = self._variants.get((mask, atomic, strided))
        if v is None:
            with self._lock:
                v = self._variants.get((mask, atomic, strided))
                if v is None:
                    self._build(mask, atomic, strided)
                    v = self._variants[(mask, atomic, strided)]
        return v

    def assembly(self) -> str:
        """Optimised machine code of the all-array variant (for inspection)."""
        from .jit import jit

        return jit().assembly(self.ir)

    # ---- argument checks ---------------------------------------------------------------
    def _arg(self, j, a):
        name, dt = self.names[j], self.in_dtypes[j]
        what = f"input {j} ({name!r})"
        t = type(a)
        if t in _WEAK_OK:
            if dt.kind not in _WEAK_OK[t]:
                raise TypeError(
                    f"{what}: expected dtype {dt}, got a Python {t.__name__} (no implicit"
                    f" casts; pass np.{dt}(value) or an array of dtype {dt})"
                )
            try:
                with np.errstate(over="raise"):
                    arr = np.array(a, dtype=dt)
            except (OverflowError, FloatingPointError):
                raise ValueError(f"{what}: the value {a!r} does not fit dtype {dt}") from None
            if is_buffer(self.inputs[j]):
                raise ValueError(f"{what} is a buffer: expected a 1-D array, got a scalar")
            return arr
        if not isinstance(a, np.ndarray):
            if isinstance(a, np.generic):
                a = np.asarray(a)
            else:
                try:
                    a = np.asarray(a)
                except Exception:  # noqa: BLE001
                    raise TypeError(
                        f"{what}: expected an array of dtype {dt}, got {t.__name__}"
                    ) from None
        if a.dtype != dt:
            raise TypeError(
                f"{what}: expected dtype {dt}, got {a.dtype} (the LLVM backend does not cast"
                f" inputs; convert with .astype(np.{dt}))"
            )
        if self.is_buf[j]:
            if a.ndim != 1:
                raise ValueError(f"{what} is a buffer: expected a 1-D array, got shape {a.shape}")
        elif a.ndim > 1:
            raise ValueError(
                f"{what}: expected a 1-D array of lanes or a 0-d scalar, got shape {a.shape}"
                " (flatten it: the LLVM backend does not broadcast)"
            )
        if a.ndim == 1 and a.shape[0] > 1 and a.strides[0] != a.itemsize and (
                self.is_buf[j] or a.strides[0] < 0 or a.strides[0] % a.itemsize):
            raise ValueError(
                f"{what} is not {'contiguous' if self.is_buf[j] else 'a strided lane array'}"
                f" (stride {a.strides[0]} bytes for itemsize {a.itemsize}); pass"
                " np.ascontiguousarray(...)"
            )
        if not a.flags.aligned:
            raise ValueError(f"{what} is not aligned; pass a copy (np.array(..., copy=True))")
        return a

    def _lanes(self, arrays):
        n = None
        for j, a in enumerate(arrays):
            if self.is_buf[j] or a.ndim == 0:
                continue
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                shapes = ", ".join(
                    f"{nm}: {x.shape}" for nm, x, bf in zip(self.names, arrays, self.is_buf)
                    if not bf
                )
                raise ValueError(
                    f"compiled function: lane counts do not match: input shapes do not"
                    f" broadcast ({shapes}); inputs are 1-D arrays of N lanes or 0-d scalars"
                )
        return n

    # ---- call --------------------------------------------------------------------------
    def _out(self, out, arrays, n):
        """The checked ``out=`` arrays, and the addresses of the inputs and outputs."""
        if any(self.scatter_out) or self.sum_out:
            raise ValueError("out=: this kernel has scatter_add or lane_sum outputs; out= "
                             "takes lane outputs only")
        out = list(out)
        if len(out) != len(self.outputs):
            raise ValueError(f"out=: expected {len(self.outputs)} arrays (one per output), "
                             f"got {len(out)}")
        in_addrs = [_addr(a) for a in arrays]
        out_addrs = []
        spans = []  # the byte ranges the outputs may write
        for k, (o, r) in enumerate(zip(out, self.outputs)):
            what = f"out[{k}]"
            if not isinstance(o, np.ndarray) or o.shape != (n,):
                raise ValueError(f"{what}: expected a 1-D array of {n} lanes, got "
                                 f"{getattr(o, 'shape', type(o).__name__)}")
            if o.dtype != r.dtype:
                raise TypeError(f"{what}: expected dtype {r.dtype}, got {o.dtype}")
            if not o.flags.writeable or not o.flags.aligned:
                raise ValueError(f"{what} must be writable and aligned")
            if n > 1 and (o.strides[0] <= 0 or o.strides[0] % o.itemsize):
                raise ValueError(f"{what}: stride {o.strides[0]} bytes is not a positive "
                                 f"multiple of the itemsize {o.itemsize}")
            out_addrs.append(_addr(o))
            spans.append(_extent(o, out_addrs[-1]))
        merged = []  # the columns of one block merge into the block's range
        for lo, hi in sorted(spans):
            if merged and lo < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        for j, (a, start) in enumerate(zip(arrays, in_addrs)):
            if a.ndim == 1 and a.size:
                s, e = _extent(a, start)
                if any(s < hi and lo < e for lo, hi in merged):
                    raise ValueError(f"out=: the outputs overlap input {j} "
                                     f"({self.names[j]!r})")
        return out, in_addrs + out_addrs

    def __call__(self, *args, num_threads=None, out=None):
        if len(args) != self.n_in:
            raise TypeError(self._argmsg % len(args))
        arrays = [self._arg(j, a) for j, a in enumerate(args)]
        n = self._lanes(arrays)
        scalar_shape = n is None
        if n is None:
            n = 1
        mask = tuple(
            (not self.is_buf[j]) and a.ndim == 0 and n > 1 for j, a in enumerate(arrays)
        )
        if out is not None:
            outs, addrs = self._out(out, arrays, n)
            if n > 0:
                self._run(arrays, outs, n, mask, num_threads, addrs)
            return tuple(outs)
        outs = []
        for k, r in enumerate(self.outputs):
            if self.scatter_out[k]:
                outs.append(np.array(arrays[self.scatter_src[k]], copy=True))
            elif k in self.sum_out:
                outs.append(np.zeros((), r.dtype))  # the sum of no lanes
            else:
                outs.append(host_pool.empty(n, r.dtype))
        if n > 0:
            self._run(arrays, outs, n, mask, num_threads)
        for k, src in self.dup_of.items():
            outs[k] = outs[src].copy()
        if scalar_shape:
            outs = [o if self.scatter_out[k] else o.reshape(())
                    for k, o in enumerate(outs)]
        return tuple(outs)

    def call_stacked(self, inputs, num_threads=None) -> np.ndarray:
        """The kernel on the rows of one array: ``inputs`` is ``(n_inputs, N)``, row ``j``
        the N lanes of input ``j`` (each row contiguous); returns a new ``(n_outputs, N)``
        array, row ``k`` output ``k``. For kernels whose inputs and outputs are all lanes of
        one dtype (no buffers, scatter_add or lane_sum outputs): the call skips the per-array
        checks, allocations and pointer tables of ``fn(*arrays)``, which cost ~3.5 us per
        array whatever the lane count (0.45 ms for 130 inputs and 120 outputs)."""
        dt = self._stacked_dtype()
        if not isinstance(inputs, np.ndarray):
            raise TypeError(f"call_stacked: expected a 2-D numpy array of dtype {dt}, got"
                            f" {type(inputs).__name__}")
        if inputs.ndim != 2 or inputs.shape[0] != self.n_in:
            raise ValueError(f"call_stacked: expected shape ({self.n_in}, N) (one row per input:"
                             f" {', '.join(self.names)}), got {inputs.shape}")
        if inputs.dtype != dt:
            raise TypeError(f"call_stacked: expected dtype {dt}, got {inputs.dtype} (no"
                            f" implicit casts; convert with .astype(np.{dt}))")
        n = inputs.shape[1]
        if (n > 1 and inputs.strides[1] != dt.itemsize) or not inputs.flags.aligned:
            raise ValueError("call_stacked: the rows must be contiguous and aligned; pass"
                             " np.ascontiguousarray(...)")
        out = np.empty((len(self.outputs), n), self.outputs[0].dtype)
        if n == 0:
            return out
        t = _threads_for(self, n, num_threads)
        cfunc, _ = self._variant((False,) * self.n_in, False, False)
        self.last_call = {"threads": t, "atomic": False, "variant": (False,) * self.n_in}
        rows_in = np.arange(self.n_in, dtype=np.uint64) * np.uint64(inputs.strides[0])
        rows_out = np.arange(len(self.outputs), dtype=np.uint64) * np.uint64(out.strides[0])
        ptrs = np.concatenate([rows_in + np.uint64(_addr(inputs)),
                               rows_out + np.uint64(_addr(out))])
        lens = np.zeros(len(ptrs), np.int64)  # no buffers
        err = np.zeros(4, np.int64)
        rcs = parallel_for(cfunc, n, (ptrs.ctypes.data, lens.ctypes.data, err.ctypes.data),
                           threads=t, chunks_per_thread=CHUNKS_PER_THREAD if t > 1 else 1,
                           align=self.width)
        if any(rcs):  # no bounds checks without buffers
            raise RuntimeError(f"call_stacked: kernel {self.key[:12]} returned {rcs}")
        return out

    def _stacked_dtype(self) -> np.dtype:
        """The one dtype of this kernel's inputs and outputs, or TypeError saying why
        :meth:`call_stacked` does not apply."""
        if self._stacked is not None:
            return self._stacked
        dts = {np.dtype(d) for d in self.in_dtypes} | {np.dtype(r.dtype) for r in self.outputs}
        why = ("it has buffer inputs" if any(self.is_buf) else
               "it has scatter_add or lane_sum outputs" if any(self.scatter_out) or self.sum_out
               else "it has no inputs" if not self.n_in else
               f"its inputs and outputs have several dtypes ({', '.join(map(str, dts))})"
               if len(dts) > 1 else None)
        if why:
            raise TypeError(f"call_stacked: kernel {self.key[:12]} takes separate arrays: {why}")
        self._stacked = dts.pop()
        return self._stacked

    def _run(self, arrays, outs, n, mask, requested, addrs=None):
        lanes = [j for j in range(self.n_in) if not (self.is_buf[j] or mask[j])]
        outputs = [k for k in range(len(outs)) if not (self.scatter_out[k] or k in self.sum_out)]
        strided = n > 1 and (any(arrays[j].strides[0] != arrays[j].itemsize for j in lanes)
                             or any(outs[k].strides[0] != outs[k].itemsize for k in outputs))
        width = self.width
        t = _threads_for(self, n, requested)
        scatter_ks = self.scatter_first
        atomic = False
        if t > 1 and scatter_ks:
            mode = self.options.get("scatter", "auto")
            if mode == "atomic":
                atomic = True
            elif mode == "auto":
                size = sum(outs[k].shape[0] for k in scatter_ks)
                atomic = (t - 1) * size > n
        cfunc, kir = self._variant(mask, atomic, strided)
        self.last_call = {"threads": t, "atomic": atomic, "variant": mask, "strided": strided}
        n_in = self.n_in
        n_ptr = n_in + len(outs)
        lens = (ctypes.c_int64 * n_ptr)()
        for j in self.buf_pos:
            lens[j] = arrays[j].shape[0]
        for k in scatter_ks:
            lens[n_in + k] = outs[k].shape[0]
        if strided:  # the lanes' strides in elements
            for j in lanes:
                lens[j] = arrays[j].strides[0] // arrays[j].itemsize
            for k in outputs:
                lens[n_in + k] = outs[k].strides[0] // outs[k].itemsize
        if addrs is None:
            addrs = [_addr(a) for a in arrays] + [_addr(o) for o in outs]
        lens_p = ctypes.addressof(lens)
        if t == 1:
            err = (ctypes.c_int64 * 4)()
            ptrs = (ctypes.c_void_p * n_ptr)(*addrs)
            if cfunc(0, n, ctypes.addressof(ptrs), lens_p, ctypes.addressof(err)):
                self._raise(kir, arrays, outs, [err])
            return
        # Without scatters the lanes go in CHUNKS_PER_THREAD chunks per thread, taken in turn
        # (a core shared with another process does less of the work); a scatter keeps one
        # range per thread, each but the first into a private partial unless atomic. A
        # lane_sum has a slot per range, added in range order: the result does not depend on
        # which thread ran which range.
        chunks = 1 if scatter_ks else CHUNKS_PER_THREAD
        partials, ptr_arrays, errs = [], {}, {}
        sums = {k: np.zeros(t * chunks, outs[k].dtype) for k in self.sum_out}

        def range_args(c):
            a_c = list(addrs)
            if c > 0 and not atomic:
                for k in scatter_ks:
                    p = host_pool.zeros(outs[k].shape[0], outs[k].dtype)
                    partials.append((k, p))
                    a_c[n_in + k] = _addr(p)
            for k, slots in sums.items():
                a_c[n_in + k] = _addr(slots) + c * slots.itemsize
            ptr_arrays[c] = (ctypes.c_void_p * n_ptr)(*a_c)
            errs[c] = (ctypes.c_int64 * 4)()
            return ctypes.addressof(ptr_arrays[c]), lens_p, ctypes.addressof(errs[c])

        rcs = parallel_for(cfunc, n, range_args, threads=t, chunks_per_thread=chunks,
                           align=width)  # whole vectors: every lane takes the same code path
        if any(rcs):
            self._raise(kir, arrays, outs, [errs[c] for c, rc in enumerate(rcs) if rc])
        for k, p in partials:
            np.add(outs[k], p, out=outs[k])
        for k, slots in sums.items():
            total = slots[0]
            for part in slots[1:]:
                total = total + part
            outs[k] = np.asarray(total)

    def _raise(self, kir, arrays, outs, errs):
        e = min(errs, key=lambda x: x[2])  # the first failing lane (slots: 1, ordinal, lane,
        # index)
        ordinal, lane, index = int(e[1]), int(e[2]), int(e[3])
        op, bufname, pos = kir.checks[ordinal]
        if pos < self.n_in:
            length = arrays[pos].shape[0]
        else:
            length = outs[pos - self.n_in].shape[0]
        opname = "gather" if op == "lane_gather" else "scatter_add"
        raise IndexError(
            f"{opname}: index {index} at lane {lane} is out of range for buffer {bufname!r}"
            f" of length {length}"
        )


def _threads_for(kernel, n, requested) -> int:
    """Threads for ``n`` lanes: the requested count, at most one per ``min_lanes`` lanes."""
    t = num_threads(requested)
    return max(1, min(t, -(-n // kernel.min_lanes))) if t > 1 else t


_EXPENSIVE = frozenset(
    "exp expm1 log log1p sin cos tan asin acos atan sinh cosh tanh erf pow atan2".split()
)


def report_compile(kernel_key: str, n_nodes: int, width: int, secs: float, times: dict,
                   variant) -> None:
    """The ``CORE_AD_DEBUG=1`` line for one compiled variant (on stderr)."""
    if not _debug():
        return
    src = "disk cache" if times.get("disk_hit") else "compiled"
    if "ir" in times:
        detail = (f"IR {times['ir'] * 1e3:.1f}, parse {times.get('parse', 0) * 1e3:.1f},"
                  f" opt {times.get('opt', 0) * 1e3:.1f}, codegen -O{times.get('codegen_level', 3)}"
                  f" {times.get('codegen', 0) * 1e3:.1f} ms")
    else:
        detail = "no IR built: object file linked"
    print(
        f"core_ad llvm: kernel {kernel_key[:12]} ({n_nodes} nodes, {width} lanes/vector,"
        f" variant {variant}) {src} in {secs * 1e3:.1f} ms ({detail})",
        file=sys.stderr,
    )

