"""Levenberg-Marquardt with the Ceres-derived strategy of spec §4.3.

Rules (spec §4.3 steps 1-9; numbers refer to that list):

1. ``diag_i = diag(J^T J)_i`` at the current iterate.
2. On the first iteration only: ``s_i = (1 + sqrt(diag_i))**2`` (Ceres ONCE_PER_SOLVE Jacobi
   scaling; with ``jacobi_scaling=False``, ``s_i = 1``).
3. ``D_i = clamp(diag_i, min_lm_diagonal * s_i, max_lm_diagonal * s_i) / mu``  (:func:`lm_damping`).
4. PCG on ``(J^T J + D) delta = -J^T F`` from 0, ``M^-1 = inv(diag_i + D_i)`` (:func:`.pcg.inverse_diagonal`),
   Q-based early exit (q_tolerance) and residual reset every ``residual_reset_period`` iterations.
5. Predicted decrease ``dm = cost(x) - 1/2||F + J delta||^2 = -(g.delta + 1/2 delta.J^T J delta)``
   (evaluated in this cancellation-free form; ``J^T J delta = -g - r - D delta`` from PCG's
   final residual ``r``, :func:`model_product`, instead of one more product).
6. ``dc = cost(x) - cost(x + delta)``, ``rho = dc / dm``.
7. Accept iff ``dc >= 0 and rho > min_relative_decrease`` (:func:`lm_step_accepted`); on accept stop
   if ``dc <= function_tolerance * cost(x)``, else ``mu = min(mu / max(1/3, 1 - (2 rho - 1)**3),
   max_trust_region_radius)``, ``nu = 2`` (:func:`lm_update_radius`).
8. Reject: keep x, ``mu = mu / nu``, ``nu = 2 nu``; stop if ``mu <= min_trust_region_radius``,
   or (Ceres) if ``|dc| <= function_tolerance * cost(x)`` (the trial differs by round-off only)
   and the model did not predict more (``dm <= function_tolerance * cost(x)``, or ``dm`` not
   finite): a rejected step the model expected to gain from is a bad step, not convergence
   (a crawling spring network stopped there 1.8e-3 above its minimum).
   Default addition (``reject_to_step_curvature``, off in :meth:`.SolverOptions.paper`):
   ``mu`` also falls at least to ``mu * (delta.D delta) / (delta.J^T J delta)``, where the
   damping along the rejected step equals the model's curvature along it, so the next trial
   is about half as long in that direction (:func:`lm_reject_radius`). Without it, a rejection
   at a large ``mu`` (nearly undamped steps) repeats almost the same step: measured 8 rejections
   in a row, 65 PCG iterations each, on an ARAP mesh, and 5 x 100 on a spring network.
   Default addition (``slope_check``, off in :meth:`.SolverOptions.paper`): after a rejected
   step whose cost rose, one more cost evaluation on a short step ``t delta``
   (:func:`first_order_decrease`); when the cost does not fall there either, the Jacobian's
   descent direction is not one of the cost (approximate derivatives), shrinking the step
   cannot help, and the solve stops with "no descent" instead of rejecting steps down to the
   function tolerance (optical flow's precomputed image gradients: 7 rejections of its 12
   iterations).
9. Stop after ``max_iterations`` iterations (rejected trial steps count as iterations).

Default addition to rule 7 (``step_extension``, off in :meth:`.SolverOptions.paper`): an
accepted step with ``rho > 1.1`` is extended to ``x + t delta``, ``t`` the minimiser in
``(1, 4]`` of the parabola through ``cost(x)``, the slope ``g.delta`` and ``cost(x + delta)``
(:func:`extended_step_length`), kept if its cost is lower (one cost evaluation). ``rho`` and the
``mu`` update stay those of ``delta``; ``dc`` (and the function tolerance test) is the
extended step's.

Inner effort (not in the paper, see :mod:`.options`): with the default ``pcg_tolerance=None``
each PCG stops at the relative residual of an Eisenstat-Walker forcing sequence
(:func:`.options.forcing_term`), starting at 0.1, and at most 0.1 after three accepted steps in
a row with rho < 0.75; with the default ``pcg_max_iterations=None`` a solve after an accepted
step whose rho was off 1 by more than 0.1 stops at 30 iterations (:class:`ForcingSequence`).

Additions (documented, Ceres-like): a step with non-finite trial cost, non-finite delta, or
``dm <= 0`` is rejected (rule 8) and ``rho`` is logged as nan; the gradient test
``max|J^T F| <= gradient_tolerance`` is checked at the start and after every accepted step (with
``gradient_tolerance`` relative to ``max|J^T F(x0)|``); the parameter test
``||delta|| <= ptol (||x|| + ptol)`` is checked on every finite step.  A non-finite gradient/diagonal at the current (finite-cost) iterate
stops with "diverged: ...".  The returned x is always the last accepted (finite-cost) iterate.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np

from .adaptive import JacobiThenMultigrid
from .factorization import LaggedFactorization
from .multigrid import MultigridCache
from .options import (FORCING_INITIAL, MODEL_ERROR_PCG_CAP, MODEL_ERROR_RHO, POOR_STEP_FORCING,
                      POOR_STEP_RHO, POOR_STEP_RUN, SolverOptions, forcing_term)
from .pcg import inverse_diagonal, pcg
from .problem import assembled_preconditioner, call_linearize, jtjp_operator, resolve_preconditioner
from .report import IterationLog, SolveResult
from .vectors import VectorOps, vector_ops

__all__ = ["levenberg_marquardt", "next_step_decrease", "damping_held_back", "lm_damping", "lm_reject_radius", "lm_step_accepted", "lm_update_radius",
           "model_product"]


def lm_damping(diag, scale, mu, min_lm_diagonal, max_lm_diagonal):
    """Rule 3: ``D = clamp(diag, min*scale, max*scale) / mu`` (in the dtype of ``diag``; numpy
    or device arrays, through their ufuncs)."""
    diag = diag if hasattr(diag, "dtype") else np.asarray(diag)
    dt = diag.dtype.type
    lo = dt(min_lm_diagonal) * scale
    hi = dt(max_lm_diagonal) * scale
    return (np.minimum(np.maximum(diag, lo), hi) / dt(mu)).astype(diag.dtype, copy=False)


def lm_step_accepted(cost_change, model_cost_change, min_relative_decrease) -> bool:
    """Rule 7 acceptance test (+ rejection of non-finite / non-positive-model steps)."""
    if not (math.isfinite(cost_change) and math.isfinite(model_cost_change)) or model_cost_change <= 0:
        return False
    rho = cost_change / model_cost_change
    return cost_change >= 0 and rho > min_relative_decrease


def lm_update_radius(mu, nu, rho, accepted, max_trust_region_radius):
    """Rules 7/8: the (mu, nu) update after an accepted or rejected step."""
    if accepted:
        mu = min(mu / max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3), max_trust_region_radius)
        return mu, 2.0
    return mu / nu, 2.0 * nu


def model_product(res, g, delta, jtjp, xp, dt, D=None):
    """``J^T J delta`` for the model's decrease and gradient, from the PCG result ``res`` of
    ``(J^T J + D) delta = -g``: ``-g - r - D delta`` with its final residual ``r`` (exact up to
    the residual's rounding drift, which the periodic explicit resets bound), saving a product
    per non-linear iteration (a fifth of the products on a Charbonnier TV denoising); the product
    itself where PCG gave no residual. ``D=None``: Gauss-Newton (no damping)."""
    if res.residual is None:
        return xp.asarray(jtjp(delta), dtype=dt)
    jd = -(g + res.residual)
    if D is not None:
        jd -= D * delta
    return jd.astype(dt, copy=False)


def lm_reject_radius(mu, mu_used, step_damping, step_curvature):
    """The default addition to rule 8 after a rejected step: ``mu`` (already ``mu_used / nu``)
    capped at ``mu_used * step_damping / step_curvature``, where ``step_damping = delta.D
    delta`` and ``step_curvature = delta.J^T J delta`` of the rejected step solved with
    ``mu_used``: at the cap the damping along that step equals the model's curvature along it.
    Non-finite or non-positive inputs leave ``mu`` unchanged."""
    if not (math.isfinite(step_damping) and math.isfinite(step_curvature)) or step_curvature <= 0 \
            or step_damping <= 0:
        return mu
    return min(mu, mu_used * step_damping / step_curvature)


#: the predicted stop fires when the next step could gain at most this fraction of what the
#: function tolerance allows (a margin for the estimate: it never stops where the plain rule
#: would go on to a cost more than ftol / 10 lower)
PREDICTED_STOP_FRACTION = 0.1


def next_step_decrease(res, cost_change, model_cost_change, held_back, limit: float = math.inf) -> float:
    """What the next LM step could still gain after an accepted one, estimated from this step's
    PCG result ``res`` (:meth:`.pcg.PCGResult.remaining_decrease`: the part of the quadratic
    model's decrease the inexact solve left), plus the model's own error on this step
    ``|dc - dm|`` (the non-quadratic part), plus ``held_back`` (:func:`damping_held_back`:
    what the damping kept the step from; a damped step solved exactly leaves nothing of its
    own model, while the undamped model still has a decrease to give); nan where PCG gives no
    estimate. Used only after a PCG solve that reached its tolerance (one cut off at the
    iteration cap leaves a gradient that a further step still reduces, if by little cost).
    On a linear problem solved to the forcing term's floor this is round-off: the step after
    it (a full PCG solve, a third of a Poisson solve's time) would gain nothing and then stop
    on the function tolerance. ``held_back``: a number or a callable giving it. The terms are
    added cheapest first and the sum is returned once it exceeds ``limit`` (the Ritz value is
    an eigenvalue solve, ~30 us, on every accepted step otherwise)."""
    total = abs(cost_change - model_cost_change)
    if total > limit:
        return total
    total += held_back() if callable(held_back) else held_back
    if total > limit:
        return total
    return total + res.remaining_decrease()


def damping_held_back(D, delta, diag, ops: VectorOps) -> float:
    """``1/2 (D delta).(diag + D)^-1 (D delta)``: the model decrease the damping ``D`` kept
    the step ``delta`` from (the undamped step is ``delta + A^-1 D delta``, approximated with
    the Jacobi inverse of ``A = J^T J + D``). A step damped along ``J^T J`` (``D = c diag``)
    gives ~``c^2`` times its model decrease; a clamp on a low-curvature unknown, where
    the undamped model could go far, gives its full ``delta_i D_i delta_i``."""
    Dd = D * delta
    return 0.5 * float(ops.scalars(ops.dot(Dd, Dd / (diag + D)))[0])


#: LM step extension: tried after an accepted step whose rho exceeds this (the cost fell more
#: than the model said, so its curvature along the step is below the model's)
EXTEND_MIN_RHO = 1.1
#: the longest extension tried (a multiple of the solved step)
EXTEND_MAX = 4.0


def extended_step_length(cost: float, trial_cost: float, g_delta: float) -> float:
    """The minimiser ``t`` of the parabola through the cost along an accepted step ``delta``:
    ``phi(t) = cost + t g.delta + 1/2 c t^2`` with ``c`` fitted to ``phi(1) = trial_cost``,
    capped at ``EXTEND_MAX``; 1 where the parabola does not open upwards or ``t`` would not
    exceed 1. When rho > 1 the true curvature along the step is below J^T J's (the residuals'
    second-order term is negative there) and Gauss-Newton converges linearly by that ratio: an
    ARAP mesh's last 8 of 11 exactly solved steps had rho ~1.5 and each gained a factor ~3.3;
    the parabola's minimiser (t ~ 2 there) is one cost evaluation away."""
    c = 2.0 * (trial_cost - cost - g_delta)
    if not (math.isfinite(c) and c > 0 and g_delta < 0):
        return 1.0
    t = -g_delta / c
    return min(t, EXTEND_MAX) if t > 1.0 else 1.0


#: the probe's predicted first-order decrease, relative to the cost: far above the round-off of
#: a cost evaluation (~1e-14 relative), while the second-order term stays below 1e-3 of it
SLOPE_PROBE_DECREASE = 1e-6
#: below this predicted decrease (relative) the probe is not taken (a step the model expects
#: next to nothing from, near the minimum)
SLOPE_PROBE_FLOOR = 1e-10


def first_order_decrease(problem: Any, x, cost: float, delta, g_delta: float) -> float:
    """The cost's actual decrease along ``delta`` over the model's first-order one, both over a
    step ``t delta`` short enough for the linear term to dominate: ``(cost(x) - cost(x + t
    delta)) / (-t g.delta)``. With a Jacobian that is the derivative of the residuals this is
    1 up to ``t delta.J^T J delta / (2 |g.delta|) <= t / 2`` (an LM step has ``delta.J^T J delta
    <= -g.delta``); <= 0 means the cost does not fall along the model's descent direction at
    all, so no damping can produce an accepted step (e.g. an energy whose derivatives are
    approximated, as optical flow's image gradients are)."""
    t = min(1e-3, SLOPE_PROBE_DECREASE * cost / abs(g_delta)) if g_delta else 0.0
    if not t * abs(g_delta) > SLOPE_PROBE_FLOOR * cost:  # round-off would decide: inconclusive
        return 1.0
    probe_cost = float(problem.cost(x + t * delta))
    return (cost - probe_cost) / (-t * g_delta) if math.isfinite(probe_cost) else 1.0


def _emit(opts: SolverOptions, line: str) -> None:
    if opts.verbose:
        print(line, flush=True)
        sys.stdout.flush()
    if opts.progress is not None:
        opts.progress(line)


def gradient_stop(g: np.ndarray, diag: np.ndarray, opts: SolverOptions, g0max: float | None = None,
                  ops: VectorOps | None = None):
    """Shared by both methods at a linearisation: ``(reason to stop or None, max |g|)``; the
    reasons are a non-finite gradient or diagonal, and the gradient tolerance (relative to
    ``g0max``, the gradient's max-norm at the start point). ``max |g|`` and ``max |diag|`` are
    fetched together; either is finite exactly when every entry is."""
    ops = VectorOps(np) if ops is None else ops
    gmax, dmax = (float(v) for v in ops.scalars(ops.max_abs(g), ops.max_abs(diag))) if g.size \
        else (0.0, 0.0)
    if not (math.isfinite(gmax) and math.isfinite(dmax)):
        return "diverged: non-finite gradient or J^T J diagonal at the current iterate", math.inf
    scale = gmax if g0max is None else g0max
    return ("gradient tolerance" if gmax <= opts.gradient_tolerance * scale or gmax == 0.0 else None), gmax


def start(problem: Any, x0: np.ndarray, ops: VectorOps) -> tuple[np.dtype, np.ndarray, float]:
    """Shared by both methods: ``(dtype, x, cost)`` at the start point (x a copy of ``x0`` in
    the problem's array module), or a ValueError for a wrong-length ``x0`` or a non-finite
    initial cost (naming the first non-finite residual where the problem can say which,
    ``problem.describe_nonfinite(x)``)."""
    dt = np.dtype(problem.dtype)
    x = ops.vector(x0, dt)
    if x.shape[0] != problem.n:
        raise ValueError(f"x0 has length {x.shape[0]}, expected problem.n = {problem.n}")
    cost = float(problem.cost(x))
    if not math.isfinite(cost):
        where = ""
        describe = getattr(problem, "describe_nonfinite", None)
        if describe is not None:
            where = f": {describe(x)}"
        raise ValueError(f"initial cost is not finite ({cost}){where}")
    return dt, x, cost


def stop_detail(reason: str, opts: SolverOptions, **numbers: float) -> str:
    """A sentence saying why the solve stopped, with the numbers of the test that fired."""
    if reason == "function tolerance" and "predicted" in numbers:
        return (f"converged: the next step could change the cost by at most ~{numbers['predicted']:.3e} "
                f"(relative; PCG's error estimate, the model's error and the damping's share) <= "
                f"{PREDICTED_STOP_FRACTION:g} x function_tolerance {opts.function_tolerance:g}")
    if reason == "function tolerance":
        return (f"converged: relative cost change {numbers['rel_change']:.3e} <= "
                f"function_tolerance {opts.function_tolerance:g}")
    if reason == "gradient tolerance":
        return (f"converged: max|J^T F| {numbers['gmax']:.3e} <= gradient_tolerance "
                f"{opts.gradient_tolerance:g} x initial {numbers['g0max']:.3e}")
    if reason == "parameter tolerance":
        return (f"converged: step norm {numbers['step_norm']:.3e} <= parameter_tolerance "
                f"{opts.parameter_tolerance:g} x (|x| + ptol)")
    if reason == "max iterations":
        return (f"NOT converged: reached max_iterations = {opts.max_iterations}; the last accepted "
                f"step still changed the cost by {numbers.get('rel_change', float('nan')):.3e} (relative); "
                "raise max_iterations to go on")
    if reason == "no descent":
        return (f"stopped: the cost does not fall along the model's step (actual / predicted "
                f"first-order decrease {numbers['slope_ratio']:.3g} on a probe step): the "
                f"Jacobian is not the residuals' derivative here (approximated derivatives?)")
    if reason == "min trust region radius":
        return (f"stopped: trust region radius fell below min_trust_region_radius "
                f"{opts.min_trust_region_radius:g} (no step decreases the cost)")
    if reason == "user callback":
        return "stopped: the callback returned a true value"
    return f"stopped: {reason}"


class ForcingSequence:
    """The relative PCG tolerance per non-linear iteration: fixed (``opts.pcg_tolerance``) or
    the automatic Eisenstat-Walker sequence (:func:`.options.forcing_term`).

    LM's addition to the automatic sequence: after ``POOR_STEP_RUN`` accepted steps in a row
    with ``rho < POOR_STEP_RHO`` the next tolerance is at most ``POOR_STEP_FORCING`` (Ceres'
    eta). Nielsen's update (rule 7) leaves mu unchanged at rho = 1/2, and a loosely solved step
    has a lower rho than the exact one: on a spring network the forcing term sat at 0.3-0.5,
    its steps at rho ~0.5, and mu stayed at ~6 for 300 iterations (a crawl) although exact
    steps there had rho 0.65 at that mu and 0.84 at mu = 100 with 9x the decrease; at one such
    iterate eta 0.5 / 0.1 / exact gave rho 0.47 / 0.62 / 0.65. Isolated mediocre steps do
    not tighten: a shading or ARAP mesh solve meets a few, where a tight solve at a large mu
    costs ~100 PCG iterations and buys nothing (after one such step: shading 160 -> 261 PCG),
    and optical flow has two in a row (after two: 12 -> 16 iterations to a different end
    point). Measured, runs of 1 / 2 / 3: the spring network 178 / 226 / 286 iterations
    (406 without), the other examples unchanged from 3 on.

    The PCG cap (automatic ``pcg_max_iterations`` only): after an accepted step whose cost
    change missed its model's by more than ``MODEL_ERROR_RHO`` (``|rho - 1|``), the next solve
    stops at ``MODEL_ERROR_PCG_CAP`` iterations: the quadratic model is then a poor guide, and
    solving it more exactly buys little. A 2048-vertex ARAP mesh buckles along a valley where
    undamped (mu at its maximum) steps keep rho at 1.2-1.5 and Jacobi-PCG needs 40-100
    iterations to reach even a 0.3 relative residual: 473 iterations and 27645 PCG (10.4 s)
    became 289 and 9615 (3.8 s), ending 0.7 % lower; intrinsic at twice the benchmark's side
    11 % faster; the other benchmark energies unchanged. A linear problem (rho = 1) keeps the
    full cap."""

    def __init__(self, opts: SolverOptions, dt: np.dtype):
        self.auto = opts.auto_forcing
        self.fixed = opts.pcg_tolerance
        self.minimum = opts.min_forcing(dt)
        self.eta = FORCING_INITIAL
        self.prev = None  # (||g||, ||r||) of the last step taken
        self.poor_steps = 0  # accepted steps in a row with rho < POOR_STEP_RHO
        self.cap = opts.pcg_cap()
        self.auto_cap = opts.pcg_max_iterations is None
        self.model_missed = False  # the last accepted step's |rho - 1| > MODEL_ERROR_RHO

    def tolerance(self) -> float:
        return self.eta if self.auto else self.fixed

    def max_iterations(self) -> int:
        if self.auto_cap and self.model_missed:
            return min(self.cap, MODEL_ERROR_PCG_CAP)
        return self.cap

    def step_taken(self, g_norm: float, linear_residual: float, rho: float = 1.0) -> None:
        self.prev = (g_norm, linear_residual)
        self.poor_steps = self.poor_steps + 1 if rho < POOR_STEP_RHO else 0
        self.model_missed = math.isfinite(rho) and abs(rho - 1.0) > MODEL_ERROR_RHO

    def new_gradient(self, g_norm: float) -> None:
        if self.auto and self.prev is not None:
            self.eta = forcing_term(self.eta, g_norm, self.prev[0], self.prev[1], self.minimum)
            if self.poor_steps >= POOR_STEP_RUN:
                self.eta = min(self.eta, POOR_STEP_FORCING)


def callback_stops(opts: SolverOptions, entry: IterationLog, x, ops: VectorOps) -> bool:
    """The callback's result taken by truth value (``np.True_``, 1, ... stop; None continues).
    It receives x as a numpy array (device vectors are downloaded for it)."""
    return opts.callback is not None and bool(opts.callback(entry, ops.to_host(x)))


def levenberg_marquardt(problem: Any, x0: np.ndarray, opts: SolverOptions) -> SolveResult:
    t_start = time.perf_counter()
    ops = vector_ops(problem)
    xp = ops.xp
    dt, x, cost = start(problem, x0, ops)
    initial_cost = cost
    log: list[IterationLog] = []
    mu = float(opts.initial_trust_region_radius)
    nu = float(opts.radius_decrease_factor)
    preconditioner = resolve_preconditioner(problem, opts)
    multigrid = MultigridCache()  # hierarchy and J^T J reused across the solve's systems
    factors = LaggedFactorization()  # preconditioner='factorization': reused while it serves
    adaptive = JacobiThenMultigrid() if preconditioner == "jacobi+multigrid" else None
    forcing = ForcingSequence(opts, dt)
    q_tolerance = opts.lm_q_tolerance()

    reweights = bool(getattr(problem, "linearize_changes_cost", False))

    def linearize():
        nonlocal cost
        call_linearize(problem, x)
        if reweights:  # IRLS weights / constant views moved with x: the energy changed
            cost = float(problem.cost(x))
        g = xp.asarray(problem.jtf(x), dtype=dt).reshape(-1)
        d = xp.asarray(problem.jtj_diag(x), dtype=dt).reshape(-1)
        return g, d

    g, diag = linearize()
    g0max = float(ops.scalars(ops.max_abs(g))[0]) if g.size else 0.0
    g0max = g0max if math.isfinite(g0max) else 0.0
    if opts.jacobi_scaling:
        s = (dt.type(1) + xp.sqrt(xp.maximum(diag, 0))) ** 2  # rule 2, first iteration only
    else:
        s = xp.ones_like(diag)
    _emit(opts, f"LM ({dt.name}, preconditioner {preconditioner}): initial cost {cost:.10e}")
    _emit(opts, IterationLog.header())

    reason = None
    numbers: dict = {"g0max": g0max}
    it = 0
    while reason is None:
        reason, gmax = gradient_stop(g, diag, opts, g0max, ops)
        numbers["gmax"] = gmax
        if reason is not None:
            break
        if it >= opts.max_iterations:
            reason = "max iterations"
            break
        it += 1
        t0 = time.perf_counter()
        mu_used = mu
        D = lm_damping(diag, s, mu, opts.min_lm_diagonal, opts.max_lm_diagonal)
        jtjp = jtjp_operator(problem, x)
        damped = getattr(problem, "damped_jtjp_linearized", None)

        def apply_A(p, D=D, jtjp=jtjp):
            if damped is not None:  # the damping added inside the product (fewer launches)
                return damped(p, D)
            out = xp.asarray(jtjp(p), dtype=dt)
            out += D * p
            return out

        pcg_kw = dict(max_iterations=forcing.max_iterations(), tolerance=forcing.tolerance(),
                      q_tolerance=q_tolerance,
                      residual_reset_period=opts.residual_reset_period, ops=ops,
                      check_every=opts.pcg_check_every)
        if opts.predicted_stop:  # no PCG iterations for gains the stop rules ignore
            pcg_kw["decrease_tolerance"] = PREDICTED_STOP_FRACTION * opts.function_tolerance * cost
        if adaptive is not None:
            res = adaptive.solve(apply_A, -g, inverse_diagonal(diag + D, "jacobi"),
                                 lambda D=D: assembled_preconditioner(preconditioner, problem, x, D, multigrid,
                                                                   factors), **pcg_kw)
        else:
            if preconditioner in ("multigrid", "factorization"):
                m_inv = assembled_preconditioner(preconditioner, problem, x, D, multigrid, factors)
            else:
                m_inv = inverse_diagonal(diag + D, preconditioner, xp=xp)
            res = pcg(apply_A, -g, m_inv, **pcg_kw)
        delta = res.x
        step_norm = ops.norm(delta)
        numbers["step_norm"] = step_norm
        dm = dc = rho = float("nan")
        trial_cost = float("nan")
        stop_param = False
        if math.isfinite(step_norm):
            if step_norm <= opts.parameter_tolerance * (ops.norm(x) + opts.parameter_tolerance):
                stop_param = True
            else:
                jd = model_product(res, g, delta, jtjp, xp, dt, D)
                model_grad_norm = ops.norm(g + jd)  # forcing: the undamped model
                g_delta, delta_jd, delta_dd = ops.scalars(ops.dot(g, delta), ops.dot(delta, jd),
                                                          ops.dot(delta, D * delta))
                dm = -(float(g_delta) + 0.5 * float(delta_jd))
                x_trial = x + delta
                trial_cost = float(problem.cost(x_trial))
                dc = cost - trial_cost if math.isfinite(trial_cost) else float("-inf")
                if math.isfinite(dm) and dm > 0 and math.isfinite(dc):
                    rho = dc / dm
        accepted = (not stop_param) and lm_step_accepted(dc, dm, opts.min_relative_decrease)
        cost_before = cost
        extension = 1.0
        if accepted and opts.step_extension and rho > EXTEND_MIN_RHO:
            extension = extended_step_length(cost, trial_cost, float(g_delta))
            if extension > 1.0:
                x_far = x + extension * delta
                far_cost = float(problem.cost(x_far))
                if far_cost < trial_cost:
                    x_trial, trial_cost = x_far, far_cost
                    dc = cost - trial_cost
                    model_grad_norm = ops.norm(g + extension * jd)
                else:
                    extension = 1.0
        if stop_param:
            reason = "parameter tolerance"
        elif accepted:
            x = x_trial
            cost = trial_cost
            numbers["rel_change"] = dc / cost_before if cost_before > 0 else 0.0
            if dc <= opts.function_tolerance * cost_before:
                reason = "function tolerance"
            elif opts.predicted_stop and res.reason in ("tolerance", "decrease tolerance") \
                    and extension == 1.0:  # solved as asked
                limit = PREDICTED_STOP_FRACTION * opts.function_tolerance * cost
                predicted = next_step_decrease(res, dc, dm, lambda: damping_held_back(D, delta, diag, ops),
                                               limit)
                if predicted <= limit:
                    numbers["predicted"] = predicted / cost if cost > 0 else 0.0
                    reason = "function tolerance"
            mu, nu = lm_update_radius(mu, nu, rho, True, opts.max_trust_region_radius)
            forcing.step_taken(ops.norm(g), model_grad_norm, rho)
        else:
            mu, nu = lm_update_radius(mu, nu, rho, False, opts.max_trust_region_radius)
            if opts.reject_to_step_curvature and math.isfinite(dm):
                mu = lm_reject_radius(mu, mu_used, float(delta_dd), float(delta_jd))
            tiny = opts.function_tolerance * cost_before
            if math.isfinite(dc) and abs(dc) <= tiny and not (math.isfinite(dm) and dm > tiny):
                # Ceres' test on every evaluated step: a rejected step whose cost differs from
                # the current one by round-off only means there is nothing left to gain
                numbers["rel_change"] = abs(dc) / cost_before if cost_before > 0 else 0.0
                reason = "function tolerance"
            elif mu <= opts.min_trust_region_radius:
                reason = "min trust region radius"
            elif opts.slope_check and dc < 0 and math.isfinite(dm) and dm > 0:
                slope = first_order_decrease(problem, x, cost_before, delta, float(g_delta))
                if slope <= 0:
                    numbers["slope_ratio"] = slope
                    reason = "no descent"
        entry = IterationLog(
            iteration=it, cost=cost, trial_cost=trial_cost, cost_change=dc, model_cost_change=dm,
            rho=rho, accepted=accepted, mu=mu_used, lam=1.0 / mu_used, step_norm=step_norm,
            gradient_max_norm=gmax, pcg_iterations=res.iterations, pcg_reason=res.reason,
            wall_time=time.perf_counter() - t0)
        log.append(entry)
        _emit(opts, entry.line())
        if callback_stops(opts, entry, x, ops) and reason is None:
            reason = "user callback"
        if accepted and reason is None:
            g, diag = linearize()
            forcing.new_gradient(ops.norm(g))

    detail = stop_detail(reason, opts, **numbers)
    result = SolveResult(x=ops.to_host(x), cost=cost, initial_cost=initial_cost, iterations=it,
                         termination_reason=reason, method="lm", log=log,
                         wall_time=time.perf_counter() - t_start, dtype=dt.name,
                         termination_detail=detail,
                         preconditioner=adaptive.describe() if adaptive else preconditioner)
    _emit(opts, f"LM done: {detail}; cost {initial_cost:.6e} -> {cost:.6e} in {it} iterations")
    return result
