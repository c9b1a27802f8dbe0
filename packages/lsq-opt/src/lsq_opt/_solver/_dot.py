"""A single-threaded dot product for the PCG loop, compiled once through core_ad's JIT.

Why not ``np.dot``: on small shared machines a multi-threaded BLAS (OpenBLAS' pool) turns a
0.03 ms dot of 10^5 doubles into 1-8 ms (thread wake-up, and spinning threads competing with
our kernels' pool); PCG does 3 dots per iteration. This kernel sums in 4 x <W x T> vector
accumulators (W = the host's SIMD width), then the remainder, in the input dtype (as BLAS
does). Falls back to ``np.dot`` for other dtypes, non-contiguous input or if the JIT fails.
"""
from __future__ import annotations

import ctypes
import hashlib

import numpy as np

__all__ = ["dot"]

_FNS: dict = {}
_FAILED = set()


def _build(dtype):
    from core_ad import codegen
    from llvmlite import ir

    T = ir.DoubleType() if dtype == np.float64 else ir.FloatType()
    V = max(1, codegen.host_vector_width(dtype))
    VT = ir.VectorType(T, V)
    i64 = ir.IntType(64)
    mod = ir.Module(name="lsq_dot")
    fn = ir.Function(mod, ir.FunctionType(T, [T.as_pointer(), T.as_pointer(), i64]), "dot_TOKEN")
    a, b_, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(VT, [0.0] * V)
    accs = [b.alloca(VT) for _ in range(4)]
    for s in accs:
        b.store(zero, s)
    item = np.dtype(dtype).itemsize
    step = 4 * V
    nmain = b.mul(b.sdiv(n, i64(step)), i64(step))
    head = fn.append_basic_block("head")
    body = fn.append_basic_block("body")
    rest = fn.append_basic_block("rest")
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(i64(0), pre)
    b.cbranch(b.icmp_signed("<", i, nmain), body, rest)
    b.position_at_end(body)
    for k in range(4):
        off = b.add(i, i64(k * V))
        x = b.load(b.bitcast(b.gep(a, [off]), VT.as_pointer()), align=item)
        y = b.load(b.bitcast(b.gep(b_, [off]), VT.as_pointer()), align=item)
        b.store(b.fadd(b.load(accs[k]), b.fmul(x, y)), accs[k])
    i.add_incoming(b.add(i, i64(step)), b.block)
    b.branch(head)
    b.position_at_end(rest)
    tot = b.fadd(b.fadd(b.load(accs[0]), b.load(accs[1])), b.fadd(b.load(accs[2]), b.load(accs[3])))
    s = b.extract_element(tot, ir.IntType(32)(0))
    for k in range(1, V):
        s = b.fadd(s, b.extract_element(tot, ir.IntType(32)(k)))
    rhead = fn.append_basic_block("rhead")
    rbody = fn.append_basic_block("rbody")
    done = fn.append_basic_block("done")
    pre2 = b.block
    b.branch(rhead)
    b.position_at_end(rhead)
    j = b.phi(i64)
    acc = b.phi(T)
    j.add_incoming(nmain, pre2)
    acc.add_incoming(s, pre2)
    b.cbranch(b.icmp_signed("<", j, n), rbody, done)
    b.position_at_end(rbody)
    t = b.fmul(b.load(b.gep(a, [j]), align=item), b.load(b.gep(b_, [j]), align=item))
    acc2 = b.fadd(acc, t)
    j.add_incoming(b.add(j, i64(1)), rbody)
    acc.add_incoming(acc2, rbody)
    b.branch(rhead)
    b.position_at_end(done)
    b.ret(acc)
    text = str(mod)
    h = hashlib.sha256((text + codegen.host_signature()).encode()).hexdigest()[:20]
    text = text.replace("TOKEN", h)
    addr, _ = codegen.compile_ir(text, f"lsq_opt_dot_{h}", f"dot_{h}")
    ct = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    return ctypes.CFUNCTYPE(ct, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(addr)


def dot(a: np.ndarray, b: np.ndarray):
    """``a . b`` for 1-D arrays of one float dtype (a numpy scalar of that dtype)."""
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
    return dt.type(fn(a.ctypes.data, b.ctypes.data, a.size))
