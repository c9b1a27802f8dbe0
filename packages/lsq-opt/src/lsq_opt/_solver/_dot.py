"""A single-threaded dot product for the PCG loop, compiled once through core_ad's JIT.

Why not ``np.dot``: on small shared machines a multi-threaded BLAS (OpenBLAS' pool) turns a
0.03 ms dot of 10^5 doubles into 1-8 ms (thread wake-up, and spinning threads competing with
our kernels' pool); PCG does 3 dots per iteration. This kernel (built with core_ad's kernel-building layer) sums in 4 x <W x T> vector
accumulators (W = the host's SIMD width), then the remainder, in the input dtype (as BLAS
does). Falls back to ``np.dot`` for other dtypes, non-contiguous input or if the JIT fails.

float64 vectors of up to ``BLAS_CALLER_THREAD_MAX`` elements go to ``np.dot`` all the same: OpenBLAS
computes those on the calling thread (measured: 1.3 us for 2000 doubles, 2.4 us for 10^4, then
a step to 3.4 us at 10^4 + 1 where its threads start), and the kernel's ctypes call costs ~5
us, which was about 7 % of a small graph problem's PCG iteration (ARAP mesh, 3072 unknowns).
float32 keeps the kernel's summation order: its results are rounding-level close to the cuda
loop's (float64 partial sums), which the device tests compare at a few percent.
"""
from __future__ import annotations

import numpy as np

__all__ = ["dot", "compiled_dot", "BLAS_CALLER_THREAD_MAX"]

BLAS_CALLER_THREAD_MAX = 10_000

_FNS: dict = {}
_FAILED = set()


def _build(dtype):
    from core_ad import codegen
    from llvmlite import ir

    V = max(1, codegen.host_vector_width(dtype))
    mod = codegen.KernelModule("lsq_opt_dot")
    f = mod.function("dot", [codegen.Arg("a", dtype, pointer=True),
                             codegen.Arg("b", dtype, pointer=True), codegen.Arg("n", np.int64),
                             codegen.Arg("out", dtype, pointer=True)])
    a, b_, n, out = (f.arg(k) for k in ("a", "b", "n", "out"))
    b = f.builder
    T = a.type.pointee
    VT = ir.VectorType(T, V)
    i64 = ir.IntType(64)
    accs = [b.alloca(VT) for _ in range(4)]
    for s in accs:
        b.store(ir.Constant(VT, [0.0] * V), s)
    item = np.dtype(dtype).itemsize
    step = 4 * V
    nmain = b.mul(b.sdiv(n, i64(step)), i64(step))
    with codegen.loop(b, i64(0), nmain, step, "main") as i:
        for k in range(4):
            off = b.add(i, i64(k * V))
            x = codegen.dense_load(b, a, off, V, align=item)
            y = codegen.dense_load(b, b_, off, V, align=item)
            b.store(b.fadd(b.load(accs[k]), b.fmul(x, y)), accs[k])
    tot = b.fadd(b.fadd(b.load(accs[0]), b.load(accs[1])), b.fadd(b.load(accs[2]), b.load(accs[3])))
    acc = b.alloca(T)
    b.store(codegen.hsum(b, tot), acc)
    with codegen.loop(b, nmain, n, 1, "rest") as j:
        t = b.fmul(b.load(b.gep(a, [j]), align=item), b.load(b.gep(b_, [j]), align=item))
        b.store(b.fadd(b.load(acc), t), acc)
    b.store(b.load(acc), out)
    f.ret()
    return mod.compile()["dot"]


def dot(a: np.ndarray, b: np.ndarray):
    """``a . b`` for 1-D arrays of one float dtype (a numpy scalar of that dtype): ``np.dot``
    for float64 up to ``BLAS_CALLER_THREAD_MAX`` elements, else :func:`compiled_dot`."""
    if a.size <= BLAS_CALLER_THREAD_MAX and a.dtype == np.float64:
        return np.dot(a, b)
    return compiled_dot(a, b)


def compiled_dot(a: np.ndarray, b: np.ndarray):
    """``a . b`` by the compiled single-threaded kernel (``np.dot`` for what it cannot take)."""
    dt = a.dtype
    if (dt != b.dtype or dt not in (np.float32, np.float64) or a.ndim != 1 or b.ndim != 1
            or a.shape != b.shape or not a.flags.c_contiguous or not b.flags.c_contiguous
            or a.size < 64 or dt in _FAILED):
        return np.dot(a, b)
    fn = _FNS.get(dt)
    if fn is None:
        try:
            fn = _FNS[dt] = _build(dt)
        except Exception:  # noqa: BLE001 - no JIT here: numpy is always correct
            _FAILED.add(dt)
            return np.dot(a, b)
    out = np.empty(1, dt)
    fn(a.ctypes.data, b.ctypes.data, a.size, out.ctypes.data)
    return out[0]
