"""PCG on device vectors with its scalars in device memory (the cuda backend's all-device loop).

The loop is :func:`.pcg.pcg`'s (spec §4.4, same stopping tests and reasons), but alpha, beta,
rho and the stopping tests live on the device, so an iteration is a fixed sequence of kernel
launches that never waits for the host:

1. ``q = A p`` (the problem's product);
2. ``lsq_pcg_dot``: ``p.q``;
3. ``lsq_pcg_step``: ``alpha = rho / p.q`` read from device memory, ``x += alpha p``,
   ``r -= alpha q``, ``z = M^-1 r`` (Jacobi), ``z.r``, ``r.r`` and, for the Q test,
   ``x.(r + b)`` -- one kernel; on a residual-reset iteration ``lsq_pcg_x`` (``x += alpha p``),
   ``A x`` and ``lsq_pcg_residual`` (``r = b - A x``, ``z`` and the dots) instead;
4. ``lsq_pcg_scalars`` (one thread): breakdown / non-finite ``p.q``, ``rho_new``, ``beta``,
   ``||r||``, the tolerance and Q tests, recorded in the state vector;
5. ``lsq_pcg_direction``: ``p = beta p + z``.

The dots need no reduction launch: the vector kernels run at most :data:`PCG_GRID` blocks (a
grid-stride loop covers the rest); each thread sums its entries in float64 and adds that to its
block's slot of ``acc`` atomically, and the readers add the (at most 64) slots of a dot in
order. The atomic adds make a dot's rounding depend on the threads' order, as in the products.

The state vector (float64, :data:`STATE`) carries the stop reason: once it is set every kernel
above is a no-op, so ``x`` stays the iterate of the stopping iteration exactly. The host fetches
the state (one transfer) every ``check_every`` iterations and at the iteration cap; a solve that
stops at iteration ``k`` therefore launches up to ``check_every - 1`` iterations more (products
included) whose kernels change nothing, and synchronises ``ceil(k / check_every) + 1`` times
(the first: ``||b||`` for the zero / non-finite right-hand side checks), and once more with
the Q test (the history of Q, fetched at the end). ``check_every=1`` checks after every
iteration. ``lsq_pcg_scalars`` also records CG's coefficients (alpha_i, beta_i) after the
state, fetched at the end for :meth:`.pcg.PCGResult.remaining_decrease` (LM's predicted stop)
and, with a ``decrease_tolerance``, at the host loop's test iterations (every
``DECREASE_CHECK_EVERY`` from ``MIN_RITZ_ITERATIONS`` on: one synchronisation each), where the
host evaluates the test and stops the loop as :func:`.pcg.pcg` does. The iterates are the host loop's up to rounding (the dots sum in
another order, a device may contract ``a * x + y`` into a fused multiply-add); ``n_apply``
counts every product launched, the ones after the stop included.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["device_pcg", "KERNELS", "PCG_GRID", "STATE", "kernel_sources"]

#: the state vector's slots (float64); the Q history (Q_1, Q_2, ...) follows them
STATE = ("reason", "iterations", "rho", "beta", "residual_norm", "q_previous", "q_count")
_S = {name: k for k, name in enumerate(STATE)}
#: stop reason codes of the state's ``reason`` slot (0: running)
REASONS = (None, "tolerance", "q tolerance", "breakdown", "non-finite")
_CODE = {name: k for k, name in enumerate(REASONS) if name}
#: most blocks of the vector kernels (a grid-stride loop covers the rest): each block adds its
#: threads' partial sums into one slot per dot, which the readers add up in a fixed order
PCG_GRID = 64
#: doubles between two slots of ``acc`` (one 128-byte line each: the blocks' atomic adds do
#: not contend for a line)
SLOT = 16
#: the rows of ``acc``, one slot per block each: the dots of an iteration
DOTS = ("pq", "zr", "rr", "xq")

_SOURCES: dict = {}


def _finite(v: str) -> str:
    """C for ``isfinite(v)`` spelled arithmetically, as core_ad's CUDA sources do: no header
    needed under NVRTC."""
    return f"({v} - {v} == {v} - {v})"


def _slot(row: str, block: str) -> str:
    return f"acc[({DOTS.index(row)} * {PCG_GRID} + {block}) * {SLOT}]"


def _gate(w, T):
    """The vector kernels' first lines after ``lsq_pcg_dot``: ``den`` = p.q (its blocks' slots
    added in order, so every thread and ``lsq_pcg_scalars`` get the same value); nothing to do
    once the solve stopped, or when ``p.q`` is a breakdown (not positive) or non-finite
    (``lsq_pcg_scalars`` records which)."""
    w.line(f"if (s[{_S['reason']}] != 0.0) return;")
    w.line("double pq = 0.0;")
    w.line("// lsq_pcg_dot ran on this grid: one slot per block")
    w.line(f"for (unsigned int k = 0; k < gridDim.x; ++k) pq += {_slot('pq', 'k')};")
    w.line(f"const {T} den = ({T})pq;")
    w.line(f"if (!(den > ({T})0) || !{_finite('den')}) return;")


def _accumulate(w, names):
    """This thread's partial sums ``names`` (C variables, also the rows of ``acc``) added to its
    block's slots."""
    from core_ad import codegen

    for name in names:
        w.line(codegen.CudaWriter.atomic_add(_slot(name, "blockIdx.x"), name))


def _dots_of_residual(w, T, with_q, update):
    """A grid-stride loop running ``update`` (statements on lane ``i`` that leave ``r[i]``) then
    ``z = M^-1 r``, with this thread's partial sums of z.r, r.r (and x.(r + b)) added to ``acc``."""
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
    _accumulate(w, sums)


def _source(name: str, T: str, with_q: bool) -> str:
    from core_ad import codegen

    w = codegen.CudaWriter()
    n = ("const long long n", "vector length")
    state = ("const double* __restrict__ s", "the state vector (read only)")
    vec = lambda decl, note="": (decl.format(T=T), note)  # noqa: E731 - a short spelling
    acc = ("double* __restrict__ acc", f"per-block sums of {', '.join(DOTS)}")
    if name == "lsq_pcg_dot":
        with w.kernel(name, [n, state, vec("const {T}* __restrict__ p"), vec("const {T}* __restrict__ q"),
                             acc]):
            w.line(f"if (s[{_S['reason']}] != 0.0) return;")
            w.line("double pq = 0.0;")
            with w.grid_stride_loop("i", "n"):
                w.line("pq += (double)p[i] * q[i];")
            _accumulate(w, ["pq"])
    elif name == "lsq_pcg_step":
        params = [n, state, vec("const {T}* __restrict__ p"), vec("const {T}* __restrict__ q"),
                  vec("{T}* __restrict__ x"), vec("{T}* __restrict__ r"),
                  vec("const {T}* __restrict__ minv", "the inverse diagonal preconditioner"),
                  vec("{T}* __restrict__ z"), vec("const {T}* __restrict__ b", "the right-hand side"),
                  acc]
        with w.kernel(name, params):
            _gate(w, T)
            w.line(f"const {T} alpha = ({T})s[{_S['rho']}] / den;")
            _dots_of_residual(w, T, with_q, ["x[i] += alpha * p[i];", "r[i] -= alpha * q[i];"])
    elif name == "lsq_pcg_x":
        with w.kernel(name, [n, state, vec("const {T}* __restrict__ p"), vec("{T}* __restrict__ x"),
                             ("const double* __restrict__ acc", "")]):
            _gate(w, T)
            w.line(f"const {T} alpha = ({T})s[{_S['rho']}] / den;")
            with w.grid_stride_loop("i", "n"):
                w.line("x[i] += alpha * p[i];")
    elif name == "lsq_pcg_residual":
        params = [n, state, vec("const {T}* __restrict__ ax", "A x"), vec("const {T}* __restrict__ x"),
                  vec("{T}* __restrict__ r"), vec("const {T}* __restrict__ minv"),
                  vec("{T}* __restrict__ z"), vec("const {T}* __restrict__ b"), acc]
        with w.kernel(name, params):
            _gate(w, T)
            _dots_of_residual(w, T, with_q, ["r[i] = b[i] - ax[i];"])
    elif name == "lsq_pcg_scalars":
        rows = DOTS if with_q else DOTS[:3]
        params = [("double* __restrict__ s", "the state vector"),
                  ("double* __restrict__ acc", "the per-block sums (read, then zeroed)"),
                  ("const long long blocks", "the vector kernels' grid"),
                  ("const double tol_abs", "tolerance * ||b||"), ("const double q_tol", "Q tolerance"),
                  ("const long long lanczos", "the slot of alpha_1 in s: (alpha_i, beta_i) pairs")]
        with w.kernel(name, params):
            S = {k: f"s[{v}]" for k, v in _S.items()}
            w.line(f"if (blockIdx.x != 0 || threadIdx.x != 0 || {S['reason']} != 0.0) return;")
            w.line(f"double {' = 0.0, '.join(rows)} = 0.0;")
            w.line("// the slots in _gate's order (the same p.q), zeroed for the next iteration")
            with w.for_range("k", "blocks", "long long"):
                for row in rows:
                    w.line(f"{row} += {_slot(row, 'k')};")
                    w.line(f"{_slot(row, 'k')} = 0.0;")
            w.line(f"const {T} den = ({T})pq;")
            w.line(f"if (!{_finite('den')}) {{ {S['reason']} = {_CODE['non-finite']}; return; }}")
            w.line(f"if (!(den > ({T})0)) {{ {S['reason']} = {_CODE['breakdown']}; return; }}")
            w.line(f"const double it = {S['iterations']} + 1.0;")
            w.line(f"{S['iterations']} = it;")
            w.line(f"const {T} rho_old = ({T}){S['rho']}, rho_new = ({T})zr;")
            w.line(f"{S['beta']} = rho_old > ({T})0 ? (double)(rho_new / rho_old) : 0.0;")
            w.line("// CG's coefficients: the Lanczos tridiagonal of the remaining-decrease estimate")
            w.line("const long long at = lanczos + 2 * ((long long)it - 1);")
            w.line("s[at] = (double)(rho_old / den);")
            w.line(f"s[at + 1] = {S['beta']};")
            w.line(f"{S['rho']} = rho_new;")
            w.line("const double r_norm = sqrt(rr);")
            w.line(f"{S['residual_norm']} = r_norm;")
            w.line(f"if (!{_finite('r_norm')}) {{ {S['reason']} = {_CODE['non-finite']}; return; }}")
            w.line(f"if (r_norm <= tol_abs) {{ {S['reason']} = {_CODE['tolerance']}; return; }}")
            if with_q:
                w.line("const double Q = 0.5 * xq;")
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


KERNELS = ("lsq_pcg_dot", "lsq_pcg_step", "lsq_pcg_x", "lsq_pcg_residual", "lsq_pcg_scalars",
           "lsq_pcg_direction")


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
        self.k = {name: codegen.cuda_kernel(kernel_source(name, dtype, with_q), name) for name in KERNELS}

    def vector(self, name, *args):
        self.k[name](self.grid, self.block, (self.n, *args))

    def scalars(self, state, acc, *args):
        self.k["lsq_pcg_scalars"]((1,), self.block, (state, acc, np.int64(self.grid[0]), *args))


def device_pcg(apply_A, b, m_inv, *, max_iterations, tolerance, q_tolerance, residual_reset_period,
               ops, check_every, decrease_tolerance=None):
    """:func:`.pcg.pcg` for device vectors (``ops.xp`` not numpy); see the module docstring."""
    from .pcg import DECREASE_CHECK_EVERY, MIN_RITZ_ITERATIONS, PCGResult, remaining_decrease

    if callable(m_inv):
        raise TypeError("the device PCG loop takes an inverse diagonal preconditioner (a vector),"
                        " not an operator")
    xp = ops.xp
    b = xp.asarray(b)
    dt = b.dtype
    x = xp.zeros_like(b)
    b_norm = ops.norm(b)  # the one synchronisation before the loop
    if b_norm == 0.0:
        return PCGResult(x, 0, "zero rhs", 0.0, 0.0, 0, residual=b.copy())
    if not math.isfinite(b_norm):
        return PCGResult(x, 0, "non-finite", float("nan"), b_norm, 0)
    if max_iterations <= 0:
        return PCGResult(x, 0, "max iterations", b_norm, b_norm, 0, residual=b.copy())
    minv = xp.ones_like(b) if m_inv is None else xp.asarray(m_inv, dtype=dt)
    with_q = q_tolerance is not None
    r = b.copy()
    z = minv * r
    p = z.copy()
    lanczos = len(STATE) + (max_iterations if with_q else 0)
    state = xp.zeros(lanczos + 2 * max_iterations, np.float64)
    state[_S["rho"]] = ops.dot(r, z)  # a device copy
    state[_S["residual_norm"]] = b_norm
    k = _Kernels(b.size, dt, with_q)
    acc = xp.zeros(len(DOTS) * PCG_GRID * SLOT, np.float64)  # lsq_pcg_scalars zeroes it after use
    consts = (np.float64(tolerance * b_norm), np.float64(q_tolerance if with_q else 0.0),
              np.int64(lanczos))

    def coefficients(k):
        pairs = ops.to_host(state[lanczos:lanczos + 2 * k])
        return pairs[0::2].tolist(), pairs[1::2].tolist()

    n_apply = 0
    i = 0
    decrease_stop = False
    while i < max_iterations:
        i += 1
        q = xp.asarray(apply_A(p), dtype=dt)
        n_apply += 1
        k.vector("lsq_pcg_dot", state, p, q, acc)
        if residual_reset_period and i % residual_reset_period == 0:
            k.vector("lsq_pcg_x", state, p, x, acc)
            ax = xp.asarray(apply_A(x), dtype=dt)
            n_apply += 1
            k.vector("lsq_pcg_residual", state, ax, x, r, minv, z, b, acc)
        else:
            k.vector("lsq_pcg_step", state, p, q, x, r, minv, z, b, acc)
        k.scalars(state, acc, *consts)
        k.vector("lsq_pcg_direction", state, p, z)
        check_decrease = decrease_tolerance is not None and i >= MIN_RITZ_ITERATIONS \
            and i % DECREASE_CHECK_EVERY == 0
        if i % check_every == 0 or i == max_iterations or check_decrease:
            s = ops.to_host(state[:len(STATE)])  # the histories stay behind: they grow
            if s[_S["reason"]]:
                break
            # the host loop's test, at the same iterations: the device has run exactly i
            if check_decrease and remaining_decrease(*coefficients(i), s[_S["rho"]]) \
                    <= decrease_tolerance:
                decrease_stop = True
                break
    iterations = int(s[_S["iterations"]])
    reason = "decrease tolerance" if decrease_stop else REASONS[int(s[_S["reason"]])] or "max iterations"
    r_norm = float(s[_S["residual_norm"]])
    q_hist = []
    if with_q and s[_S["q_count"]]:
        q_hist = ops.to_host(state[len(STATE):len(STATE) + int(s[_S["q_count"]])]).tolist()
    alphas, betas = coefficients(iterations)
    return PCGResult(x, iterations, reason, r_norm, b_norm, n_apply, q_hist, residual=r,
                     alphas=alphas, betas=betas, final_rz=float(s[_S["rho"]]))
