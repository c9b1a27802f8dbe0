"""PCG on device vectors with its scalars in device memory (the cuda backend's all-device loop).

The loop is :func:`.pcg.pcg`'s (spec §4.4, same stopping tests and reasons), but alpha, beta,
rho and the stopping tests live on the device, so an iteration is a fixed sequence of kernel
launches that never waits for the host:

1. ``q = A p`` (the problem's product);
2. ``lsq_pcg_dot``: per-thread partial sums (float64) of ``p.q``, and their device sum;
3. ``lsq_pcg_step``: ``alpha = rho / p.q`` read from device memory, ``x += alpha p``,
   ``r -= alpha q``, ``z = M^-1 r`` (Jacobi) and per-thread partial sums of ``z.r``, ``r.r``
   and, for the Q test, ``x.(r + b)`` -- one kernel; on a residual-reset iteration
   ``lsq_pcg_x`` (``x += alpha p``), ``A x`` and ``lsq_pcg_residual`` (``r = b - A x``, ``z``,
   the partial sums) instead;
4. one device sum of those partial sums (``partial.sum(axis=1)``);
5. ``lsq_pcg_scalars`` (one thread): breakdown / non-finite ``p.q``, ``rho_new``, ``beta``,
   ``||r||``, the tolerance and Q tests, recorded in the state vector;
6. ``lsq_pcg_direction``: ``p = beta p + z``.

The vector kernels run at most :data:`PCG_GRID` blocks (a grid-stride loop covers the rest), so
the device sums read a few partial sums per block rather than one per entry: CuPy sums a
row in one block (without its CUB accelerator), whose time grows with the row's length.

The state vector (float64, :data:`STATE`) carries the stop reason: once it is set every kernel
above is a no-op, so ``x`` stays the iterate of the stopping iteration exactly. The host fetches
the state (one transfer) every ``check_every`` iterations and at the iteration cap; a solve that
stops at iteration ``k`` therefore launches up to ``check_every - 1`` iterations more (products
included) whose kernels change nothing, and synchronises ``ceil(k / check_every) + 1`` times
(the first: ``||b||`` for the zero / non-finite right-hand side checks). ``check_every=1``
checks after every iteration. The iterates are the host loop's up to rounding (the dots sum in
another order, a device may contract ``a * x + y`` into a fused multiply-add); ``n_apply``
counts every product launched, the ones after the stop included.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["device_pcg", "STATE", "kernel_sources"]

#: the state vector's slots (float64); the Q history (Q_1, Q_2, ...) follows them
STATE = ("reason", "iterations", "rho", "beta", "residual_norm", "q_previous", "q_count")
_S = {name: k for k, name in enumerate(STATE)}
#: stop reason codes of the state's ``reason`` slot (0: running)
REASONS = (None, "tolerance", "q tolerance", "breakdown", "non-finite")
_CODE = {name: k for k, name in enumerate(REASONS) if name}
#: most blocks of the vector kernels: bounds the partial sums the device sums read per
#: iteration (16384 per dot) while keeping half an H100's SMs busy on the vector updates
PCG_GRID = 64

_SOURCES: dict = {}


def _gate(w, T):
    """The vector kernels' first lines: nothing to do once the solve stopped, or when ``p.q`` is
    a breakdown (not positive) or non-finite (``lsq_pcg_scalars`` records which)."""
    w.line(f"const {T} den = ({T})*pq;")
    w.line(f"if (s[{_S['reason']}] != 0.0 || !(den > ({T})0) || !isfinite(den)) return;")


def _partial_sums(w, T, with_q, update):
    """A grid-stride loop running ``update`` (statements on lane ``i`` that leave ``r[i]``) then
    ``z = M^-1 r`` and this thread's partial sums of z.r, r.r (and x.(r + b))."""
    sums = ("zr", "rr", "xq") if with_q else ("zr", "rr")
    w.line(f"double {' = 0.0, '.join(sums)} = 0.0;")
    with w.grid_stride_loop("i", "n"):
        for line in update:
            w.line(line)
        w.line(f"const {T} ri = r[i], zi = minv[i] * ri;")
        w.line("z[i] = zi;")
        w.line("zr += (double)zi * ri;")
        w.line("rr += (double)ri * ri;")
        if with_q:
            w.line("xq += (double)x[i] * (ri + b[i]);")
    _store_partials(w, sums)


def _store_partials(w, sums):
    """This thread's partial sums ``sums`` (C names) into the rows of ``partial``."""
    w.line("const long long lanes = (long long)gridDim.x * blockDim.x;")
    w.line("const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;")
    for k, name in enumerate(sums):
        w.line(f"partial[{k} * lanes + t] = {name};")


def _source(name: str, T: str, with_q: bool) -> str:
    from core_ad import codegen

    w = codegen.CudaWriter()
    n = ("const long long n", "vector length")
    state = ("const double* __restrict__ s", "the state vector (read only)")
    pq = ("const double* __restrict__ pq", "p.q (0-d)")
    vec = lambda decl, note="": (decl.format(T=T), note)  # noqa: E731 - a short spelling
    partial = ("double* __restrict__ partial", "per-thread partial sums, one row per dot")
    if name == "lsq_pcg_dot":
        with w.kernel(name, [n, state, vec("const {T}* __restrict__ p"), vec("const {T}* __restrict__ q"),
                             partial]):
            w.line(f"if (s[{_S['reason']}] != 0.0) return;")
            w.line("double pq = 0.0;")
            with w.grid_stride_loop("i", "n"):
                w.line("pq += (double)p[i] * q[i];")
            _store_partials(w, ("pq",))
    elif name == "lsq_pcg_step":
        params = [n, state, pq, vec("const {T}* __restrict__ p"), vec("const {T}* __restrict__ q"),
                  vec("{T}* __restrict__ x"), vec("{T}* __restrict__ r"),
                  vec("const {T}* __restrict__ minv", "the inverse diagonal preconditioner"),
                  vec("{T}* __restrict__ z"), vec("const {T}* __restrict__ b", "the right-hand side"),
                  partial]
        with w.kernel(name, params):
            _gate(w, T)
            w.line(f"const {T} alpha = ({T})s[{_S['rho']}] / den;")
            _partial_sums(w, T, with_q, ["x[i] += alpha * p[i];", "r[i] -= alpha * q[i];"])
    elif name == "lsq_pcg_x":
        with w.kernel(name, [n, state, pq, vec("const {T}* __restrict__ p"),
                             vec("{T}* __restrict__ x")]):
            _gate(w, T)
            w.line(f"const {T} alpha = ({T})s[{_S['rho']}] / den;")
            with w.grid_stride_loop("i", "n"):
                w.line("x[i] += alpha * p[i];")
    elif name == "lsq_pcg_residual":
        params = [n, state, pq, vec("const {T}* __restrict__ ax", "A x"), vec("const {T}* __restrict__ x"),
                  vec("{T}* __restrict__ r"), vec("const {T}* __restrict__ minv"),
                  vec("{T}* __restrict__ z"), vec("const {T}* __restrict__ b"), partial]
        with w.kernel(name, params):
            _gate(w, T)
            _partial_sums(w, T, with_q, ["r[i] = b[i] - ax[i];"])
    elif name == "lsq_pcg_scalars":
        params = [("double* __restrict__ s", "the state vector"), pq,
                  ("const double* __restrict__ sums", "z.r, r.r (, x.(r + b)) of this iteration"),
                  ("const double tol_abs", "tolerance * ||b||"), ("const double q_tol", "Q tolerance")]
        with w.kernel(name, params):
            S = {k: f"s[{v}]" for k, v in _S.items()}
            w.line(f"if (blockIdx.x != 0 || threadIdx.x != 0 || {S['reason']} != 0.0) return;")
            w.line(f"const {T} den = ({T})*pq;")
            w.line(f"if (!isfinite(den)) {{ {S['reason']} = {_CODE['non-finite']}; return; }}")
            w.line(f"if (!(den > ({T})0)) {{ {S['reason']} = {_CODE['breakdown']}; return; }}")
            w.line(f"const double it = {S['iterations']} + 1.0;")
            w.line(f"{S['iterations']} = it;")
            w.line(f"const {T} rho_old = ({T}){S['rho']}, rho_new = ({T})sums[0];")
            w.line(f"{S['beta']} = rho_old > ({T})0 ? (double)(rho_new / rho_old) : 0.0;")
            w.line(f"{S['rho']} = rho_new;")
            w.line("const double r_norm = sqrt(sums[1]);")
            w.line(f"{S['residual_norm']} = r_norm;")
            w.line(f"if (!isfinite(r_norm)) {{ {S['reason']} = {_CODE['non-finite']}; return; }}")
            w.line(f"if (r_norm <= tol_abs) {{ {S['reason']} = {_CODE['tolerance']}; return; }}")
            if with_q:
                w.line("const double Q = 0.5 * sums[2];")
                w.line(f"s[{len(STATE)} + (long long){S['q_count']}] = Q;")
                w.line(f"{S['q_count']} += 1.0;")
                w.line(f"if (Q != 0.0 && it * (Q - {S['q_previous']}) / Q < q_tol) "
                       f"{{ {S['reason']} = {_CODE['q tolerance']}; return; }}")
                w.line(f"{S['q_previous']} = Q;")
    elif name == "lsq_pcg_direction":
        with w.kernel(name, [n, state, vec("{T}* __restrict__ p"), vec("const {T}* __restrict__ z")]):
            w.line(f"if (s[{_S['reason']}] != 0.0) return;")
            w.line(f"const {T} beta = ({T})s[{_S['beta']}];")
            with w.grid_stride_loop("i", "n"):
                w.line("p[i] = beta * p[i] + z[i];")
    else:
        raise KeyError(f"no PCG kernel {name!r}")
    return w.source()


KERNELS = ("lsq_pcg_dot", "lsq_pcg_step", "lsq_pcg_x", "lsq_pcg_residual", "lsq_pcg_scalars", "lsq_pcg_direction")


def kernel_source(name: str, dtype, with_q: bool) -> str:
    """The CUDA source of the PCG kernel ``name`` (:data:`KERNELS`) for vectors of ``dtype``
    (``with_q``: the variant that also sums ``x.(r + b)`` for the Q test)."""
    key = (name, np.dtype(dtype), bool(with_q))
    src = _SOURCES.get(key)
    if src is None:
        from core_ad import codegen

        src = _SOURCES[key] = _source(name, codegen.c_type(dtype), bool(with_q))
    return src


def kernel_sources(dtype) -> list:
    """Every PCG kernel's ``(name, source)`` for ``dtype`` (both variants)."""
    return [(name, kernel_source(name, dtype, q)) for q in (False, True) for name in KERNELS]


class _Kernels:
    """The launches of one solve (vectors of ``n`` entries of ``dtype``)."""

    def __init__(self, n, dtype, with_q):
        from core_ad import codegen
        from core_ad._codegen.cuda.launcher import BLOCK

        self.n = np.int64(n)
        self.grid = (min((n + BLOCK - 1) // BLOCK, PCG_GRID),)
        self.block = (BLOCK,)
        self.lanes = self.grid[0] * BLOCK
        self.k = {name: codegen.cuda_kernel(kernel_source(name, dtype, with_q), name) for name in KERNELS}

    def vector(self, name, *args):
        self.k[name](self.grid, self.block, (self.n, *args))

    def scalars(self, *args):
        self.k["lsq_pcg_scalars"]((1,), self.block, args)


def device_pcg(apply_A, b, m_inv, *, max_iterations, tolerance, q_tolerance, residual_reset_period,
               ops, check_every):
    """:func:`.pcg.pcg` for device vectors (``ops.xp`` not numpy); see the module docstring."""
    from .pcg import PCGResult

    if callable(m_inv):
        raise TypeError("the device PCG loop takes an inverse diagonal preconditioner (a vector),"
                        " not an operator")
    xp = ops.xp
    b = xp.asarray(b)
    dt = b.dtype
    x = xp.zeros_like(b)
    b_norm = ops.norm(b)  # the one synchronisation before the loop
    if b_norm == 0.0:
        return PCGResult(x, 0, "zero rhs", 0.0, 0.0, 0)
    if not math.isfinite(b_norm):
        return PCGResult(x, 0, "non-finite", float("nan"), b_norm, 0)
    if max_iterations <= 0:
        return PCGResult(x, 0, "max iterations", b_norm, b_norm, 0)
    minv = xp.ones_like(b) if m_inv is None else xp.asarray(m_inv, dtype=dt)
    with_q = q_tolerance is not None
    r = b.copy()
    z = minv * r
    p = z.copy()
    state = xp.zeros(len(STATE) + (max_iterations if with_q else 0), np.float64)
    state[_S["rho"]] = ops.dot(r, z)  # a device copy
    state[_S["residual_norm"]] = b_norm
    k = _Kernels(b.size, dt, with_q)
    # zeros: the sums of a no-op launch (after the stop) stay finite
    pq_partial = xp.zeros(k.lanes, np.float64)
    partial = xp.zeros((3 if with_q else 2, k.lanes), np.float64)
    consts = (np.float64(tolerance * b_norm), np.float64(q_tolerance if with_q else 0.0))
    n_apply = 0
    i = 0
    while i < max_iterations:
        i += 1
        q = xp.asarray(apply_A(p), dtype=dt)
        n_apply += 1
        k.vector("lsq_pcg_dot", state, p, q, pq_partial)
        pq = pq_partial.sum()
        if residual_reset_period and i % residual_reset_period == 0:
            k.vector("lsq_pcg_x", state, pq, p, x)
            ax = xp.asarray(apply_A(x), dtype=dt)
            n_apply += 1
            k.vector("lsq_pcg_residual", state, pq, ax, x, r, minv, z, b, partial)
        else:
            k.vector("lsq_pcg_step", state, pq, p, q, x, r, minv, z, b, partial)
        k.scalars(state, pq, partial.sum(axis=1), *consts)
        k.vector("lsq_pcg_direction", state, p, z)
        if i % check_every == 0 or i == max_iterations:
            s = ops.to_host(state)
            if s[_S["reason"]]:
                break
    iterations = int(s[_S["iterations"]])
    reason = REASONS[int(s[_S["reason"]])] or "max iterations"
    r_norm = float(s[_S["residual_norm"]])
    q_hist = [float(v) for v in s[len(STATE):len(STATE) + int(s[_S["q_count"]])]] if with_q else []
    return PCGResult(x, iterations, reason, r_norm, b_norm, n_apply, q_hist)
