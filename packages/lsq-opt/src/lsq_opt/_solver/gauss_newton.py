"""Gauss-Newton (spec §4.1): every step is accepted; no line search.

Per iteration: ``linearize(x)``; ``g = J^T F``; PCG on ``J^T J delta = -g`` from 0 with
``M^-1 = inv(diag(J^T J))`` (spec §4.4: no Q early exit, no residual reset); ``x += delta``.
PCG's relative tolerance follows the Eisenstat-Walker forcing sequence by default (see
:mod:`.options`). Stops: ``max_iterations``; ``max|g| <= gradient_tolerance * max|g(x0)|``;
``||delta|| <= ptol (||x|| + ptol)``; ``|cost(x) - cost(x+delta)| <= function_tolerance * cost(x)``
(Ceres-style; set ``function_tolerance=0`` for the [R] behaviour of always running max_iterations);
a non-finite trial cost or step stops with "diverged: ..." and returns the last finite iterate.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .adaptive import JacobiThenMultigrid
from .factorization import LaggedFactorization
from .multigrid import MultigridCache
from .levenberg_marquardt import (ForcingSequence, _emit, callback_stops, gradient_stop, model_product, start,
                                  stop_detail)
from .options import SolverOptions
from .pcg import inverse_diagonal, pcg
from .problem import assembled_preconditioner, call_linearize, jtjp_operator, resolve_preconditioner
from .report import IterationLog, SolveResult
from .vectors import vector_ops

__all__ = ["gauss_newton"]


def gauss_newton(problem: Any, x0: np.ndarray, opts: SolverOptions) -> SolveResult:
    t_start = time.perf_counter()
    ops = vector_ops(problem)
    xp = ops.xp
    dt, x, cost = start(problem, x0, ops)
    initial_cost = cost
    log: list[IterationLog] = []
    preconditioner = resolve_preconditioner(problem, opts)
    multigrid = MultigridCache()  # the hierarchy reused across the solve's systems
    factors = LaggedFactorization()  # preconditioner='factorization': reused while it serves
    adaptive = JacobiThenMultigrid() if preconditioner == "jacobi+multigrid" else None
    forcing = ForcingSequence(opts, dt)
    numbers: dict = {}
    _emit(opts, f"GN ({dt.name}, preconditioner {preconditioner}): initial cost {cost:.10e}")
    _emit(opts, IterationLog.header())
    reason = None
    it = 0
    while reason is None:
        if it >= opts.max_iterations:
            reason = "max iterations"
            break
        call_linearize(problem, x)
        if getattr(problem, "linearize_changes_cost", False):
            cost = float(problem.cost(x))  # IRLS weights / constant views moved with x
        g = xp.asarray(problem.jtf(x), dtype=dt).reshape(-1)
        diag = xp.asarray(problem.jtj_diag(x), dtype=dt).reshape(-1)
        if "g0max" not in numbers:
            g0max = float(ops.scalars(ops.max_abs(g))[0]) if g.size else 0.0
            numbers["g0max"] = g0max if math.isfinite(g0max) else 0.0
        reason, gmax = gradient_stop(g, diag, opts, numbers["g0max"], ops)
        numbers["gmax"] = gmax
        g_norm = ops.norm(g)
        forcing.new_gradient(g_norm)
        if reason is not None:
            break
        it += 1
        t0 = time.perf_counter()
        jtjp = jtjp_operator(problem, x)
        pcg_kw = dict(max_iterations=opts.pcg_cap(), tolerance=forcing.tolerance(), q_tolerance=None,
                      residual_reset_period=0, ops=ops,
                      check_every=opts.pcg_check_every)
        if adaptive is not None:
            res = adaptive.solve(jtjp, -g, inverse_diagonal(diag, "jacobi"),
                                 lambda: assembled_preconditioner(preconditioner, problem, x, None, multigrid,
                                                               factors), **pcg_kw)
        else:
            if preconditioner in ("multigrid", "factorization"):
                m_inv = assembled_preconditioner(preconditioner, problem, x, None, multigrid, factors)
            else:
                m_inv = inverse_diagonal(diag, preconditioner, xp=xp)
            res = pcg(jtjp, -g, m_inv, **pcg_kw)
        forcing.step_taken(g_norm, res.residual_norm)
        delta = res.x
        step_norm = ops.norm(delta)
        numbers["step_norm"] = step_norm
        dm = dc = rho = trial_cost = float("nan")
        accepted = False
        if not math.isfinite(step_norm):
            reason = f"diverged: non-finite step at iteration {it}"
        elif step_norm <= opts.parameter_tolerance * (ops.norm(x) + opts.parameter_tolerance):
            reason = "parameter tolerance"
        else:
            jd = model_product(res, g, delta, jtjp, xp, dt)
            g_delta, delta_jd = ops.scalars(ops.dot(g, delta), ops.dot(delta, jd))
            dm = -(float(g_delta) + 0.5 * float(delta_jd))
            x_trial = x + delta
            trial_cost = float(problem.cost(x_trial))
            if not math.isfinite(trial_cost):
                reason = f"diverged: non-finite cost {trial_cost} at iteration {it}"
            else:
                dc = cost - trial_cost
                rho = dc / dm if dm != 0 else float("nan")
                accepted = True
                cost_before = cost
                x, cost = x_trial, trial_cost
                numbers["rel_change"] = abs(dc) / cost_before if cost_before > 0 else 0.0
                if abs(dc) <= opts.function_tolerance * cost_before:
                    reason = "function tolerance"
        entry = IterationLog(
            iteration=it, cost=cost, trial_cost=trial_cost, cost_change=dc, model_cost_change=dm,
            rho=rho, accepted=accepted, mu=float("nan"), lam=0.0, step_norm=step_norm,
            gradient_max_norm=gmax, pcg_iterations=res.iterations, pcg_reason=res.reason,
            wall_time=time.perf_counter() - t0)
        log.append(entry)
        _emit(opts, entry.line())
        if callback_stops(opts, entry, x, ops) and reason is None:
            reason = "user callback"
    detail = stop_detail(reason, opts, **numbers)
    result = SolveResult(x=ops.to_host(x), cost=cost, initial_cost=initial_cost, iterations=it,
                         termination_reason=reason, method="gn", log=log,
                         wall_time=time.perf_counter() - t_start, dtype=dt.name,
                         termination_detail=detail,
                         preconditioner=adaptive.describe() if adaptive else preconditioner)
    _emit(opts, f"GN done: {detail}; cost {initial_cost:.6e} -> {cost:.6e} in {it} iterations")
    return result
