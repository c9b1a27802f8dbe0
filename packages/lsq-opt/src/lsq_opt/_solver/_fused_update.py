"""PCG's vector updates of one iteration in one compiled pass (core_ad's kernel-building layer).

``x += alpha p; r -= alpha q; z = m_inv * r`` and the dots ``z.r``, ``r.r``: numpy takes seven
calls and ten passes over the vectors for these (each call ~1-2 us plus the pass), one
compiled call reads each vector once. Summation as in :mod:`._dot` (vector accumulators, then
the remainder). float64 only, C-contiguous, equal lengths: :meth:`PCGUpdate.bind` gives None
for anything else and PCG keeps its numpy path. float32 keeps that path on purpose: its dots
(:func:`._dot.compiled_dot`) round as the cuda device loop's do, which the device tests compare
at a few percent (this pass's float32 dots moved a 17-iteration solve's final residual by 1.4 %).
"""
from __future__ import annotations

import numpy as np

__all__ = ["PCGUpdate"]

_FNS: dict = {}
_FAILED = set()


def _build(dtype):
    from core_ad import codegen
    from llvmlite import ir

    V = max(1, codegen.host_vector_width(dtype))
    mod = codegen.KernelModule("lsq_opt_pcg_update")
    names = ("x", "r", "z", "p", "q", "minv")
    f = mod.function("pcg_update", [codegen.Arg(k, dtype, pointer=True) for k in names]
                     + [codegen.Arg("alpha", dtype), codegen.Arg("n", np.int64),
                        codegen.Arg("out", dtype, pointer=True)])
    x, r, z, p, q, minv = (f.arg(k) for k in names)
    alpha, n, out = f.arg("alpha"), f.arg("n"), f.arg("out")
    b = f.builder
    T = x.type.pointee
    VT = ir.VectorType(T, V)
    i64 = ir.IntType(64)
    item = np.dtype(dtype).itemsize
    acc_rz, acc_rr = b.alloca(VT), b.alloca(VT)
    for acc in (acc_rz, acc_rr):
        b.store(ir.Constant(VT, [0.0] * V), acc)
    alpha_v = codegen.splat(b, alpha, V)

    def step(i, width, load, store, a, rz, rr):
        xi = b.fadd(load(x, i), b.fmul(a, load(p, i)))
        ri = b.fsub(load(r, i), b.fmul(a, load(q, i)))
        zi = b.fmul(load(minv, i), ri)
        store(xi, x, i)
        store(ri, r, i)
        store(zi, z, i)
        b.store(b.fadd(b.load(rz), b.fmul(zi, ri)), rz)
        b.store(b.fadd(b.load(rr), b.fmul(ri, ri)), rr)

    nmain = b.mul(b.sdiv(n, i64(V)), i64(V))
    with codegen.loop(b, i64(0), nmain, V, "main") as i:
        step(i, V, lambda ptr, j: codegen.dense_load(b, ptr, j, V, align=item),
             lambda val, ptr, j: codegen.dense_store(b, val, ptr, j, align=item), alpha_v, acc_rz, acc_rr)
    rz_s, rr_s = b.alloca(T), b.alloca(T)
    b.store(codegen.hsum(b, b.load(acc_rz)), rz_s)
    b.store(codegen.hsum(b, b.load(acc_rr)), rr_s)
    with codegen.loop(b, nmain, n, 1, "rest") as j:
        step(j, 1, lambda ptr, k: b.load(b.gep(ptr, [k]), align=item),
             lambda val, ptr, k: b.store(val, b.gep(ptr, [k]), align=item), alpha, rz_s, rr_s)
    b.store(b.load(rz_s), out)
    b.store(b.load(rr_s), b.gep(out, [i64(1)]))
    f.ret()
    return mod.compile()["pcg_update"]


def _kernel(dtype):
    fn = _FNS.get(dtype)
    if fn is None and dtype not in _FAILED:
        try:
            fn = _FNS[dtype] = _build(dtype)
        except Exception:  # noqa: BLE001 - no JIT here: the numpy path is always correct
            _FAILED.add(dtype)
    return fn


def _fits(v, like) -> bool:
    return v.dtype == like.dtype and v.ndim == 1 and v.shape == like.shape and v.flags.c_contiguous


class PCGUpdate:
    """The fused update bound to one PCG solve's vectors ``x, r, z, p`` and ``m_inv`` (their
    addresses taken once: numpy's ``.ctypes.data`` costs ~1 us per vector, as much as the
    kernel's work on a few thousand unknowns). :meth:`bind` gives None where the kernel does
    not apply (not float64, non-contiguous or mismatched vectors, no JIT)."""

    def __init__(self, fn, vecs):
        self.fn, self.vecs = fn, vecs  # vecs kept alive: the kernel holds their addresses
        self.x = vecs[0]
        self.ptrs = [v.ctypes.data for v in vecs]
        self.out = np.empty(2, self.x.dtype)
        self.out_ptr = self.out.ctypes.data

    @classmethod
    def bind(cls, x, r, z, p, m_inv):
        dt = x.dtype
        if dt != np.float64 or not all(_fits(v, x) for v in (x, r, z, p, m_inv)):
            return None
        fn = _kernel(dt)
        return None if fn is None else cls(fn, (x, r, z, p, m_inv))

    def __call__(self, q, alpha):
        """In place ``x += alpha p``, ``r -= alpha q``, ``z = m_inv r``; returns ``(z.r, r.r)``
        (numpy scalars of the vectors' dtype), or None for a ``q`` the kernel cannot take."""
        if not _fits(q, self.x):
            return None
        x, r, z, p, m = self.ptrs
        self.fn(x, r, z, p, q.ctypes.data, m, float(alpha), self.x.size, self.out_ptr)
        return self.out[0], self.out[1]
