"""Preconditioned conjugate gradients, as in spec §4.4 (with the LM early exit of §4.3).

Solves ``A delta = b`` for SPD ``A`` given only ``apply_A(p)`` (matrix-free), starting from
``delta = 0``, with a diagonal (Jacobi) preconditioner ``M^-1`` given as a vector.  All work
vectors stay in the dtype of ``b`` and in its array module (``ops``, :mod:`.vectors`: numpy, or
CuPy for the cuda backend's all-device loop, which runs this loop in :mod:`.device_pcg` with
alpha, beta and the stopping tests on the device, the host checking the outcome every
``check_every`` iterations).

Loop (spec §4.4, 1-based iteration counter i)::

    delta = 0; r = b; z = M^-1 r; p = z; rho_old = r.z
    repeat:
        q = A p; alpha_den = p.q
        alpha = rho_old / alpha_den                (breakdown stop if alpha_den <= 0, see below)
        delta += alpha p
        r = b - A delta   if reset_period and i % reset_period == 0   (explicit residual reset)
        r -= alpha q      otherwise
        z = M^-1 r; rho_new = z.r
        beta = rho_new / rho_old (0 if rho_old <= 0); p = z + beta p; rho_old = rho_new
        stop if ||r|| <= tolerance * ||b||                         ("tolerance")
        stop if decrease_tolerance is not None and the remaining model
                decrease (estimated, see pcg) <= decrease_tolerance   ("decrease tolerance")
        stop if q_tolerance is not None and
                i * (Q_i - Q_{i-1}) / Q_i < q_tolerance,
                Q_i = 1/2 delta_i.(r_i + b), Q_0 = 0               ("q tolerance", spec §4.3)
        stop if i == max_iterations                                ("max iterations")

Deviation from the literal spec text (documented): where the spec sets ``alpha = 0`` when
``p.Ap <= 0`` and carries on, we stop with reason "breakdown" instead; continuing with alpha = 0
cannot change delta any more, so the returned step is the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.linalg as sla

from ._fused_update import PCGUpdate
from .device_pcg import device_pcg
from .options import PCG_CHECK_EVERY
from .vectors import VectorOps

__all__ = ["PCGResult", "pcg", "inverse_diagonal", "PRECONDITIONERS"]

#: fewer CG iterations than this give no :meth:`PCGResult.remaining_decrease` (the smallest
#: Ritz value of a short Lanczos run can lie far above the smallest eigenvalue)
MIN_RITZ_ITERATIONS = 8

#: PCG's ``decrease_tolerance`` test runs every this many iterations (a tridiagonal eigenvalue,
#: ~30 us)
DECREASE_CHECK_EVERY = 4

PRECONDITIONERS = ("jacobi", "none", "ceres", "modified_ceres", "epsilon", "multigrid")


def inverse_diagonal(diag, kind: str = "jacobi", epsilon: float = 1e-12, xp=np):
    """The Jacobi preconditioner ``M^-1`` from the diagonal of the system matrix (spec §4.4, §10.6),
    an array of the array module ``xp`` (numpy, or CuPy for device vectors).

    * ``"jacobi"`` (default, the paper's form): ``1/d``, with ``1`` where ``d == 0`` (zero guard
      for unknowns that no residual touches) or ``d`` is not finite/positive.
    * ``"none"``: ``1`` (plain CG; the paper's ``UsePreconditioner(false)``).
    * ``"ceres"``: ``1/(1 + sqrt(d))**2`` (the Ceres-guarded form used by [R]'s GN).
    * ``"modified_ceres"``: ``1/(1 + d)``.
    * ``"epsilon"``: ``1/(epsilon + d)``.
    """
    d = xp.asarray(diag)
    one = d.dtype.type(1)
    if kind == "jacobi":
        ok = xp.isfinite(d) & (d > 0)
        return xp.where(ok, one / xp.where(ok, d, one), one).astype(d.dtype, copy=False)
    if kind == "none":
        return xp.ones_like(d)
    if kind == "ceres":
        s = one + xp.sqrt(xp.maximum(d, 0))
        return one / (s * s)
    if kind == "modified_ceres":
        return one / (one + xp.maximum(d, 0))
    if kind == "epsilon":
        return one / (d.dtype.type(epsilon) + xp.maximum(d, 0))
    raise ValueError(f"unknown preconditioner {kind!r}; expected one of {PRECONDITIONERS}")


@dataclass
class PCGResult:
    x: np.ndarray  # the step delta (an array of the module of b)
    iterations: int  # PCG iterations performed
    reason: str  # "tolerance" | "decrease tolerance" | "q tolerance" | "max iterations" | "breakdown" | "zero rhs" | "non-finite"
    residual_norm: float  # ||r|| of the (recursively updated or reset) residual at exit
    rhs_norm: float  # ||b||
    n_apply: int  # number of apply_A calls (iterations + residual resets)
    q_history: list = field(default_factory=list)  # Q_1..Q_i (only when q_tolerance is used)
    # the final residual vector r = b - A x (recursively updated, explicitly at resets): the
    # solvers' model quantities come from it instead of one more product A x
    residual: object = None
    # CG's coefficients alpha_1.., beta_1.. (the Lanczos tridiagonal of M^-1 A) and the final
    # r.z = r.M^-1 r, for :meth:`remaining_decrease` (host PCG only)
    alphas: list = field(default_factory=list)
    betas: list = field(default_factory=list)
    final_rz: float = float("nan")

    def remaining_decrease(self, min_iterations: int = MIN_RITZ_ITERATIONS) -> float:
        """An estimate of how much the quadratic model ``1/2 s.A s + b.s`` could still fall
        below its value at the returned step: ``1/2 r.A^-1 r <= 1/2 (r.M^-1 r) / lambda_min(M^-1 A)``
        with ``lambda_min`` estimated by the smallest Ritz value of the Lanczos tridiagonal built
        from CG's own coefficients (Golub & Meurant; the Ritz value converges to it from above,
        so after few iterations this can underestimate: nan below ``min_iterations``
        iterations, or without the coefficients)."""
        return remaining_decrease(self.alphas, self.betas, self.final_rz, min_iterations)


def remaining_decrease(alphas, betas, rz: float, min_iterations: int = MIN_RITZ_ITERATIONS) -> float:
    """:meth:`PCGResult.remaining_decrease` from CG's coefficients and the current ``r.z``."""
    k = len(alphas)
    if k < min_iterations or len(betas) < k - 1 or not math.isfinite(rz):
        return float("nan")
    a = np.asarray(alphas, np.float64)
    bt = np.asarray(betas[:k - 1], np.float64)
    if not (np.all(a > 0) and np.all(bt >= 0)):
        return float("nan")
    diag = 1.0 / a
    diag[1:] += bt / a[:-1]
    off = np.sqrt(bt) / a[:-1]
    theta_min = float(sla.eigvalsh_tridiagonal(diag, off, select="i", select_range=(0, 0),
                                               check_finite=False)[0])
    return 0.5 * rz / theta_min if theta_min > 0 else float("nan")


def pcg(
    apply_A: Callable[[np.ndarray], np.ndarray],
    b: np.ndarray,
    m_inv: np.ndarray | None = None,
    *,
    max_iterations: int = 100,
    tolerance: float = 1e-10,
    q_tolerance: float | None = None,
    residual_reset_period: int = 0,
    ops: VectorOps | None = None,
    check_every: int = PCG_CHECK_EVERY,
    decrease_tolerance: float | None = None,
) -> PCGResult:
    """Solve ``A x = b`` by PCG from ``x = 0`` (see the module docstring for the exact loop).

    ``m_inv``: the inverse diagonal preconditioner (vector), a callable ``r -> M^-1 r`` (a
    symmetric positive definite operator, e.g. a multigrid V-cycle), or ``None`` for plain CG.
    ``tolerance``: relative residual ``||r|| / ||b||`` stop (0 disables).
    ``q_tolerance``: Nash-Sofer / Ceres early exit (None disables; LM uses 1e-4).
    ``residual_reset_period``: recompute ``r = b - A x`` every that many iterations (0 disables).
    ``ops``: the vectors' array module (:class:`.vectors.VectorOps`; default numpy).
    ``decrease_tolerance``: stop ("decrease tolerance") once the model
    decrease the solve could still gain (:func:`remaining_decrease`, checked every
    :data:`DECREASE_CHECK_EVERY` iterations from :data:`MIN_RITZ_ITERATIONS` on) is at most
    this: a step whose remaining gain is below what the caller can resolve needs no more
    iterations, however large its relative residual still is.
    ``check_every``: device vectors only (:mod:`.device_pcg`): the host fetches the stopping
    state every that many iterations (up to ``check_every - 1`` iterations more are launched,
    as no-ops, after the one that stops: the step, iteration count and reason are unchanged,
    ``n_apply`` counts their products).
    """
    if int(check_every) != check_every or check_every < 1:
        raise ValueError(f"check_every must be a positive integer, got {check_every!r}")
    ops = VectorOps(np) if ops is None else ops
    if not ops.on_host:
        return device_pcg(apply_A, b, m_inv, max_iterations=max_iterations, tolerance=tolerance,
                          q_tolerance=q_tolerance, residual_reset_period=residual_reset_period,
                          ops=ops, check_every=int(check_every), decrease_tolerance=decrease_tolerance)
    xp = ops.xp
    b = xp.asarray(b)
    dt = b.dtype
    x = xp.zeros_like(b)
    b_norm = ops.norm(b)
    if b_norm == 0.0:
        return PCGResult(x, 0, "zero rhs", 0.0, 0.0, 0, residual=b.copy())
    if not math.isfinite(b_norm):
        return PCGResult(x, 0, "non-finite", float("nan"), b_norm, 0)
    if callable(m_inv):  # a preconditioner operator (e.g. a multigrid V-cycle)
        def precond(v, out):
            out[...] = m_inv(v)
    else:
        minv = xp.ones_like(b) if m_inv is None else xp.asarray(m_inv, dtype=dt)

        def precond(v, out):
            xp.multiply(minv, v, out=out)
    r = b.copy()
    z = xp.empty_like(b)
    precond(r, z)
    p = z.copy()
    tmp = xp.empty_like(b)
    # one compiled pass for the updates and dots of an iteration (host vectors, a diagonal
    # preconditioner, no Q test): ~5 us instead of ~11 at 3000 unknowns, 25 instead of ~60 at 16384
    fused = PCGUpdate.bind(x, r, z, p, minv) if ops.on_host and not callable(m_inv) \
        and q_tolerance is None else None
    rho_old = dt.type(ops.scalars(ops.dot(r, z))[0])
    Q_prev = 0.0
    q_hist: list = []
    n_apply = 0
    reason = "max iterations"
    i = 0
    r_norm = b_norm
    alphas: list = []
    betas: list = []
    while i < max_iterations:
        i += 1
        q = xp.asarray(apply_A(p), dtype=dt)
        n_apply += 1
        alpha_den = dt.type(ops.scalars(ops.dot(p, q))[0])
        if not np.isfinite(alpha_den):
            reason = "non-finite"
            i -= 1
            break
        if alpha_den <= 0:
            reason = "breakdown"
            i -= 1
            break
        alpha = dt.type(rho_old / alpha_den)
        alphas.append(float(alpha))
        reset = residual_reset_period and i % residual_reset_period == 0
        updated = None if fused is None or reset else fused(q, alpha)
        if updated is not None:
            rho_new, rr = updated
        else:
            ops.axpy(alpha, p, x, tmp)
            if reset:
                r[...] = b - xp.asarray(apply_A(x), dtype=dt)  # in place: fused holds r's address
                n_apply += 1
            else:
                ops.axpy(-alpha, q, r, tmp)
            precond(r, z)
            dots = [ops.dot(z, r), ops.dot(r, r)]
            if q_tolerance is not None:
                xp.add(r, b, out=tmp)
                dots.append(ops.dot(x, tmp))
            rho_new, rr, *q_dot = ops.scalars(*dots)
        rho_new = dt.type(rho_new)
        beta = dt.type(rho_new / rho_old) if rho_old > 0 else dt.type(0)
        betas.append(float(beta))
        ops.scale_add(beta, p, z)
        rho_old = rho_new
        r_norm = math.sqrt(float(rr))
        if not np.isfinite(r_norm):
            reason = "non-finite"
            break
        if r_norm <= tolerance * b_norm:
            reason = "tolerance"
            break
        if decrease_tolerance is not None and i >= MIN_RITZ_ITERATIONS \
                and i % DECREASE_CHECK_EVERY == 0 \
                and remaining_decrease(alphas, betas, float(rho_new)) <= decrease_tolerance:
            reason = "decrease tolerance"
            break
        if q_tolerance is not None:
            Q = 0.5 * float(q_dot[0])
            q_hist.append(Q)
            if Q != 0.0 and i * (Q - Q_prev) / Q < q_tolerance:
                reason = "q tolerance"
                break
            Q_prev = Q
    return PCGResult(x, i, reason, r_norm, b_norm, n_apply, q_hist, residual=r, alphas=alphas,
                     betas=betas, final_rz=float(rho_old))
