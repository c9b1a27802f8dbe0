"""Per-lane small symmetric eigen-solvers: cyclic Jacobi rotations, compiled.

``(B, n, n) -> eigenvalues (B, n) ascending, eigenvectors (B, n, n) as columns`` (numpy's
``eigh`` convention) for ``n <= 16``, of the symmetric part ``(H + H^T) / 2``.

CPU: one LLVM module per ``(n, dtype)``; ``W`` lanes (one SIMD register) are solved together in
vector registers, each lane with its own rotations; sweeps repeat until every lane of the
group has converged (relative off-diagonal mass below the dtype's epsilon squared, at most
``MAX_SWEEPS``); an exchange sort then orders each lane's eigenvalues and eigenvector columns.
Groups of lanes are spread over the kernels' thread pool. CUDA (:func:`cuda_source`): the same
rotations and stopping rule, in one of two layouts. ``"lane"``: one thread per matrix, the
matrix in the thread's own (local) memory -- fine while ``A`` and ``V`` are small, but at
``n = 16`` their 512 words spill, and the kernel is bound by local-memory traffic.
``"group"``: ``n`` threads of one warp per matrix, ``A`` and ``V`` in shared memory; thread
``k`` applies each rotation to row ``k`` (two warp-level barriers per rotation).

Why Jacobi: for n <= 16 it is short, branch-free per rotation (vectorises across lanes),
and accurate to full relative precision; numpy's batched ``eigh`` pays LAPACK's setup per
matrix, which dominates at these sizes.
"""

from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir

from .llvm.builder import Arg, KernelModule, loop, parallel_for
from .llvm.runtime import num_threads
from .llvm.vecmath import VecMath, intrinsic

__all__ = ["CUDA_VARIANTS", "MAX_N", "MAX_SWEEPS", "cuda_launch_shape", "cuda_source",
           "cuda_variant", "eigh_cpu", "eigh_cuda"]

MAX_N = 16
MAX_SWEEPS = 40
CUDA_VARIANTS = ("lane", "group")
# The smallest n for which the shared-memory "group" layout is the default CUDA kernel.
GROUP_FROM_N = 5
_KERNELS: dict = {}
_LOCK = threading.Lock()


def _tolerance(dtype) -> float:
    """Stop when off(A)^2 <= tol * ||A||_F^2 (quadratic convergence: one sweep below this
    is at rounding level)."""
    eps = float(np.finfo(dtype).eps)
    return eps * eps


def _loop(b, lo, hi, body):
    """``for i in range(lo, hi): body(i)`` (i64 values), on the kernel-building layer."""
    with loop(b, lo, hi, name="k") as i:
        body(i)


def _build(n: int, dtype: np.dtype, W: int):
    """The compiled kernel ``int32 eigh(g0, g1, H, lam, E)`` over lane groups [g0, g1)."""
    f = ir.DoubleType() if dtype == np.float64 else ir.FloatType()
    v = ir.VectorType(f, W)
    i64 = ir.IntType(64)
    km = KernelModule(f"core_ad_eigh_{n}_{dtype.name}_{MAX_SWEEPS}")
    fn = km.function("eigh", [Arg("g0", np.int64), Arg("g1", np.int64),
                              Arg("H", dtype, pointer=True), Arg("lam", dtype, pointer=True),
                              Arg("E", dtype, pointer=True)])
    g0, g1, Hp, Lp, Ep = (fn.arg(a) for a in ("g0", "g1", "H", "lam", "E"))
    b = fn.builder
    mod = km.module
    nn = n * n
    A = b.alloca(ir.ArrayType(v, nn), name="A")
    V = b.alloca(ir.ArrayType(v, nn), name="V")
    sweep_slot = b.alloca(i64)
    acc_off = b.alloca(v)
    acc_all = b.alloca(v)
    C = lambda k: ir.Constant(i64, k)
    zero, one = ir.Constant(v, [0.0] * W), ir.Constant(v, [1.0] * W)
    half = ir.Constant(v, [0.5] * W)
    two = ir.Constant(v, [2.0] * W)
    sqrt = intrinsic(mod, "llvm.sqrt", v, [v])
    fabs = intrinsic(mod, "llvm.fabs", v, [v])
    copysign = intrinsic(mod, "llvm.copysign", v, [v, v])

    def slot(M, idx):
        return b.gep(M, [C(0), idx], inbounds=True)

    def at(i, j):
        return b.add(b.mul(i, C(n)), j)

    def group(g):
        base = b.mul(g, C(W))
        # load the symmetric part, lanes of the group side by side
        def load_row(i):
            def load_col(j):
                val = ir.Constant(v, ir.Undefined)
                for w in range(W):
                    lane = b.add(base, C(w))
                    off = b.mul(lane, C(nn))
                    hij = b.load(b.gep(Hp, [b.add(off, at(i, j))], inbounds=True))
                    hji = b.load(b.gep(Hp, [b.add(off, at(j, i))], inbounds=True))
                    val = b.insert_element(val, b.fadd(hij, hji), ir.Constant(ir.IntType(32), w))
                b.store(b.fmul(val, half), slot(A, at(i, j)))
                b.store(b.select(b.icmp_signed("==", i, j), one, zero), slot(V, at(i, j)))
            _loop(b, C(0), C(n), load_col)
        _loop(b, C(0), C(n), load_row)

        b.store(C(0), sweep_slot)
        sweep_head = b.append_basic_block("sweep")
        after = b.append_basic_block("sorted")
        b.branch(sweep_head)
        b.position_at_end(sweep_head)

        def rotate_p(p):
            def rotate_q(q):
                app = b.load(slot(A, at(p, p)))
                aqq = b.load(slot(A, at(q, q)))
                apq = b.load(slot(A, at(p, q)))
                is0 = b.fcmp_ordered("==", apq, zero)
                theta = b.fdiv(b.fsub(aqq, app), b.fmul(two, b.select(is0, one, apq)))
                t = b.fdiv(b.call(copysign, [one, theta]),
                           b.fadd(b.call(fabs, [theta]),
                                  b.call(sqrt, [b.fadd(b.fmul(theta, theta), one)])))
                c = b.fdiv(one, b.call(sqrt, [b.fadd(b.fmul(t, t), one)]))
                s = b.fmul(t, c)
                c = b.select(is0, one, c)
                s = b.select(is0, zero, s)
                t = b.select(is0, zero, t)

                # A stays symmetric: one pass updates row and column k of p and q; the
                # entries k = p, q are overwritten with their closed forms afterwards
                def sym_k(k):
                    kp, kq = slot(A, at(k, p)), slot(A, at(k, q))
                    x, y = b.load(kp), b.load(kq)
                    xp = b.fsub(b.fmul(c, x), b.fmul(s, y))
                    yq = b.fadd(b.fmul(s, x), b.fmul(c, y))
                    b.store(xp, kp)
                    b.store(xp, slot(A, at(p, k)))
                    b.store(yq, kq)
                    b.store(yq, slot(A, at(q, k)))

                def vec_k(k):
                    kp, kq = slot(V, at(k, p)), slot(V, at(k, q))
                    x, y = b.load(kp), b.load(kq)
                    b.store(b.fsub(b.fmul(c, x), b.fmul(s, y)), kp)
                    b.store(b.fadd(b.fmul(s, x), b.fmul(c, y)), kq)

                _loop(b, C(0), C(n), sym_k)
                b.store(b.fsub(app, b.fmul(t, apq)), slot(A, at(p, p)))
                b.store(b.fadd(aqq, b.fmul(t, apq)), slot(A, at(q, q)))
                b.store(zero, slot(A, at(p, q)))
                b.store(zero, slot(A, at(q, p)))
                _loop(b, C(0), C(n), vec_k)
            _loop(b, b.add(p, C(1)), C(n), rotate_q)
        _loop(b, C(0), C(n - 1), rotate_p)

        # convergence of every lane of the group
        b.store(zero, acc_off)
        b.store(zero, acc_all)

        def norm_row(i):
            def norm_col(j):
                a = b.load(slot(A, at(i, j)))
                a2 = b.fmul(a, a)
                b.store(b.fadd(b.load(acc_all), a2), acc_all)
                off = b.select(b.icmp_signed("==", i, j), zero, a2)
                b.store(b.fadd(b.load(acc_off), off), acc_off)
            _loop(b, C(0), C(n), norm_col)
        _loop(b, C(0), C(n), norm_row)
        tol = ir.Constant(v, [_tolerance(dtype)] * W)
        done = b.fcmp_unordered("<=", b.load(acc_off), b.fmul(tol, b.load(acc_all)))
        all_done = b.extract_element(done, ir.Constant(ir.IntType(32), 0))
        for w in range(1, W):
            all_done = b.and_(all_done, b.extract_element(done, ir.Constant(ir.IntType(32), w)))
        sweeps = b.add(b.load(sweep_slot), C(1))
        b.store(sweeps, sweep_slot)
        stop = b.or_(all_done, b.icmp_signed(">=", sweeps, C(MAX_SWEEPS)))
        b.cbranch(stop, after, sweep_head)
        b.position_at_end(after)

        # exchange sort: ascending eigenvalues, eigenvector columns follow
        def sort_i(i):
            def sort_j(j):
                ii, jj = slot(A, at(i, i)), slot(A, at(j, j))
                di, dj = b.load(ii), b.load(jj)
                swap = b.fcmp_ordered("<", dj, di)
                b.store(b.select(swap, dj, di), ii)
                b.store(b.select(swap, di, dj), jj)

                def col(k):
                    ki, kj = slot(V, at(k, i)), slot(V, at(k, j))
                    x, y = b.load(ki), b.load(kj)
                    b.store(b.select(swap, y, x), ki)
                    b.store(b.select(swap, x, y), kj)
                _loop(b, C(0), C(n), col)
            _loop(b, b.add(i, C(1)), C(n), sort_j)
        _loop(b, C(0), C(n - 1), sort_i)

        def store_row(i):
            lam = b.load(slot(A, at(i, i)))
            for w in range(W):
                lane = b.add(base, C(w))
                el = b.extract_element(lam, ir.Constant(ir.IntType(32), w))
                b.store(el, b.gep(Lp, [b.add(b.mul(lane, C(n)), i)], inbounds=True))

            def store_col(j):
                e = b.load(slot(V, at(i, j)))
                for w in range(W):
                    lane = b.add(base, C(w))
                    el = b.extract_element(e, ir.Constant(ir.IntType(32), w))
                    b.store(el, b.gep(Ep, [b.add(b.mul(lane, C(nn)), at(i, j))], inbounds=True))
            _loop(b, C(0), C(n), store_col)
        _loop(b, C(0), C(n), store_row)

    _loop(b, g0, g1, group)
    fn.ret()
    return km.compile()["eigh"]


class _CpuEigh:
    def __init__(self, n: int, dtype: np.dtype):
        self.n, self.dtype = n, dtype
        self.width = VecMath().width(dtype)
        self.fn = _build(n, dtype, self.width)

    def __call__(self, H, threads=None):
        B, n = H.shape[0], self.n
        W = self.width
        groups = -(-B // W)
        if groups * W != B:  # pad the last group with zero matrices (no rotations)
            Hp = np.zeros((groups * W, n, n), self.dtype)
            Hp[:B] = H
        else:
            Hp = np.ascontiguousarray(H, self.dtype)
        lam = np.empty((groups * W, n), self.dtype)
        E = np.empty((groups * W, n, n), self.dtype)
        ptrs = [a.ctypes.data for a in (Hp, lam, E)]
        # at least 16 groups per thread: below that, waking a thread costs more than the work
        parallel_for(self.fn, groups, ptrs, threads=num_threads(threads), min_per_thread=16)
        return lam[:B], E[:B]


def _check(H, who):
    if H.ndim != 3 or H.shape[1] != H.shape[2]:
        raise ValueError(f"{who}: need a batch of square matrices (B, n, n), got shape {H.shape}")
    n = H.shape[1]
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{who}: matrices must be n x n with 1 <= n <= {MAX_N}, got n = {n}")
    if H.dtype not in (np.float32, np.float64):
        raise TypeError(f"{who}: dtype must be float32 or float64, got {H.dtype}")


def eigh_cpu(H, threads=None):
    """Eigenvalues (ascending) and eigenvectors (columns) of every ``(n, n)`` lane of ``H``."""
    H = np.asarray(H)
    _check(H, "eigh")
    n, dt = H.shape[1], H.dtype
    key = (n, dt)
    k = _KERNELS.get(key)
    if k is None:
        with _LOCK:
            k = _KERNELS.get(key)
            if k is None:
                k = _KERNELS[key] = _CpuEigh(n, np.dtype(dt))
    return k(H, threads)


def cuda_variant(n: int, variant: str | None = None) -> str:
    """The CUDA layout used for ``n x n`` lanes: ``variant`` if given, else ``"group"`` from
    ``n >= GROUP_FROM_N`` on."""
    if variant is None:
        return "group" if n >= GROUP_FROM_N else "lane"
    if variant not in CUDA_VARIANTS:
        raise ValueError(f"eigh: CUDA variant must be one of {CUDA_VARIANTS}, got {variant!r}")
    return variant


def cuda_source(n: int, dtype="float64", variant: str | None = None) -> tuple[str, str]:
    """``(source, kernel name)``: CUDA C for ``n x n`` lanes,
    ``kernel(const T* H, T* lam, T* E, long long B)``, in the layout :func:`cuda_variant`
    picks (launch: ``cuda_launch_shape``)."""
    dtype = np.dtype(dtype)
    if not 1 <= n <= MAX_N:
        raise ValueError(f"eigh: n must be in [1, {MAX_N}], got {n}")
    T = "double" if dtype == np.float64 else "float"
    sfx = "" if dtype == np.float64 else "f"
    tol = repr(_tolerance(dtype))
    if cuda_variant(n, variant) == "group":
        return _group_source(n, T, sfx, tol)
    return _lane_source(n, T, sfx, tol)


def _rotation(T, sfx):
    """C statements: ``t, c, s`` of the Jacobi rotation zeroing ``apq`` (``apq != 0``)."""
    return f"""{T} theta = (aqq - app) / (({T})2 * apq);
                {T} t = copysign{sfx}(({T})1, theta)
                        / (fabs{sfx}(theta) + sqrt{sfx}(theta * theta + ({T})1));
                {T} c = ({T})1 / sqrt{sfx}(t * t + ({T})1), s = t * c;"""


def _lane_source(n, T, sfx, tol):
    name = f"core_ad_eigh_{n}_{T}"
    src = f"""
extern "C" __global__ void {name}(const {T}* __restrict__ H, {T}* __restrict__ lam,
                                  {T}* __restrict__ E, long long B) {{
    const int n = {n};
    long long lane = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (lane >= B) return;
    {T} A[{n * n}], V[{n * n}];
    const {T}* h = H + lane * n * n;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {{
            A[i * n + j] = ({T})0.5 * (h[i * n + j] + h[j * n + i]);
            V[i * n + j] = i == j ? ({T})1 : ({T})0;
        }}
    for (int sweep = 0; sweep < {MAX_SWEEPS}; ++sweep) {{
        for (int p = 0; p < n - 1; ++p)
            for (int q = p + 1; q < n; ++q) {{
                {T} apq = A[p * n + q], app = A[p * n + p], aqq = A[q * n + q];
                if (apq == ({T})0) continue;
                {_rotation(T, sfx)}
                for (int k = 0; k < n; ++k) {{
                    {T} x = A[k * n + p], y = A[k * n + q];
                    A[k * n + p] = A[p * n + k] = c * x - s * y;
                    A[k * n + q] = A[q * n + k] = s * x + c * y;
                }}
                A[p * n + p] = app - t * apq;
                A[q * n + q] = aqq + t * apq;
                A[p * n + q] = A[q * n + p] = ({T})0;
                for (int k = 0; k < n; ++k) {{
                    {T} x = V[k * n + p], y = V[k * n + q];
                    V[k * n + p] = c * x - s * y; V[k * n + q] = s * x + c * y;
                }}
            }}
        {T} off = 0, all = 0;
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {{
                {T} a2 = A[i * n + j] * A[i * n + j];
                all += a2;
                if (i != j) off += a2;
            }}
        if (!(off > ({T}){tol} * all)) break;
    }}
    for (int i = 0; i < n - 1; ++i)
        for (int j = i + 1; j < n; ++j)
            if (A[j * n + j] < A[i * n + i]) {{
                {T} d = A[i * n + i]; A[i * n + i] = A[j * n + j]; A[j * n + j] = d;
                for (int k = 0; k < n; ++k) {{
                    {T} x = V[k * n + i]; V[k * n + i] = V[k * n + j]; V[k * n + j] = x;
                }}
            }}
    for (int i = 0; i < n; ++i) {{
        lam[lane * n + i] = A[i * n + i];
        for (int j = 0; j < n; ++j) E[lane * n * n + i * n + j] = V[i * n + j];
    }}
}}
"""
    return src, name


# Threads per block of the "group" kernel (whole warps: a matrix's threads never straddle two).
_GROUP_WARPS = 4


def _group_source(n, T, sfx, tol):
    name = f"core_ad_eigh_group_{n}_{T}"
    per_warp = 32 // n
    ld = n + 1  # padded rows: column accesses A[k][p] of the n threads hit distinct banks
    mats = _GROUP_WARPS * per_warp
    src = f"""
extern "C" __global__ void __launch_bounds__({32 * _GROUP_WARPS})
{name}(const {T}* __restrict__ H, {T}* __restrict__ lam, {T}* __restrict__ E, long long B) {{
    const int n = {n}, ld = {ld};
    __shared__ {T} sA[{mats}][{n * ld}], sV[{mats}][{n * ld}], sR[{mats}][{2 * n}];
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / n, k = threadIdx.x % 32 % n;
    if (g >= {per_warp}) return;
    const long long m = ((long long)blockIdx.x * {_GROUP_WARPS} + warp) * {per_warp} + g;
    if (m >= B) return;  // the whole group leaves together: its barriers name only its lanes
    const unsigned mask = {hex((1 << n) - 1)}u << (g * n);  // this group's lanes
    {T}* A = sA[warp * {per_warp} + g];
    {T}* V = sV[warp * {per_warp} + g];
    {T}* R = sR[warp * {per_warp} + g];
    const {T}* h = H + m * n * n;
    for (int j = 0; j < n; ++j) {{
        A[k * ld + j] = ({T})0.5 * (h[k * n + j] + h[j * n + k]);
        V[k * ld + j] = k == j ? ({T})1 : ({T})0;
    }}
    for (int sweep = 0; sweep < {MAX_SWEEPS}; ++sweep) {{
        for (int p = 0; p < n - 1; ++p)
            for (int q = p + 1; q < n; ++q) {{
                __syncwarp(mask);  // the last rotation's writes are visible
                {T} apq = A[p * ld + q], app = A[p * ld + p], aqq = A[q * ld + q];
                if (apq == ({T})0) continue;  // the same for every thread of the group
                {_rotation(T, sfx)}
                {T} x = A[k * ld + p], y = A[k * ld + q];
                {T} vx = V[k * ld + p], vy = V[k * ld + q];
                __syncwarp(mask);  // every read of A is done before any write
                if (k == p) {{
                    A[p * ld + p] = app - t * apq;
                    A[p * ld + q] = A[q * ld + p] = ({T})0;
                }} else if (k == q) {{
                    A[q * ld + q] = aqq + t * apq;
                }} else {{
                    A[k * ld + p] = A[p * ld + k] = c * x - s * y;
                    A[k * ld + q] = A[q * ld + k] = s * x + c * y;
                }}
                V[k * ld + p] = c * vx - s * vy;
                V[k * ld + q] = s * vx + c * vy;
            }}
        __syncwarp(mask);
        {T} off = 0, all = 0;
        for (int j = 0; j < n; ++j) {{
            {T} a2 = A[k * ld + j] * A[k * ld + j];
            all += a2;
            if (j != k) off += a2;
        }}
        R[k] = off;
        R[n + k] = all;
        __syncwarp(mask);
        off = 0;
        all = 0;
        for (int j = 0; j < n; ++j) {{
            off += R[j];
            all += R[n + j];
        }}
        __syncwarp(mask);  // R is read by all before the next sweep writes it
        if (!(off > ({T}){tol} * all)) break;
    }}
    // thread k owns eigenpair k; its rank among the eigenvalues (ascending, NaN last, ties by
    // index: a permutation) is its output column
    const {T} d = A[k * ld + k];
    int r = 0;
    for (int j = 0; j < n; ++j) {{
        {T} dj = A[j * ld + j];
        bool below = dj < d || (dj == dj && d != d), above = d < dj || (d == d && dj != dj);
        r += below || (!above && j < k);
    }}
    lam[m * n + r] = d;
    for (int i = 0; i < n; ++i) E[m * n * n + i * n + r] = V[i * ld + k];
}}
"""
    return src, name


def cuda_launch_shape(n: int, B: int, variant: str | None = None) -> tuple[int, int]:
    """``(blocks, threads per block)`` for :func:`cuda_source`'s kernel on ``B`` lanes."""
    if cuda_variant(n, variant) == "group":
        per_block = _GROUP_WARPS * (32 // n)
        return -(-B // per_block), 32 * _GROUP_WARPS
    block = 128
    return -(-B // block), block


def eigh_cuda(H, variant: str | None = None):
    """The CUDA kernel on a CuPy array ``(B, n, n)`` (needs CuPy and a device); ``variant``
    overrides the layout :func:`cuda_variant` picks."""
    import cupy

    from .cuda.launcher import get_kernel

    _check(H, "eigh")
    B, n = H.shape[0], H.shape[1]
    src, name = cuda_source(n, H.dtype, variant)
    Hc = cupy.ascontiguousarray(H)
    lam = cupy.empty((B, n), H.dtype)
    E = cupy.empty((B, n, n), H.dtype)
    if B:
        blocks, threads = cuda_launch_shape(n, B, variant)
        get_kernel(src, name)((blocks,), (threads,), (Hc, lam, E, np.int64(B)))
    return lam, E
