"""Levenberg-Marquardt: spec §4.2/§4.3 mechanics (AE-7) and a NIST StRD problem (AE-8, Misra1a)."""
import math

import numpy as np
import pytest
from scipy.optimize import least_squares

from lsq_opt._solver import (DenseProblem, SolverOptions, lm_damping, lm_step_accepted,
                             lm_update_radius, solve)


# ---------------------------------------------------------------- problems
def rosenbrock(dtype=np.float64):
    fun = lambda x: np.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])
    jac = lambda x: np.array([[-20.0 * x[0], 10.0], [-1.0, 0.0]])
    return DenseProblem(fun, jac, 2, dtype=dtype)


def sqrt_problem():
    # r = sqrt(x) - 0.5, minimum x = 0.25; from x = 4 the GN step lands at x = -2 (NaN residual)
    def fun(x):
        with np.errstate(invalid="ignore"):
            return np.sqrt(x) - 0.5

    def jac(x):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (0.5 / np.sqrt(x)).reshape(1, 1)

    return DenseProblem(fun, jac, 1)


MISRA1A_X = np.array([77.6, 114.9, 141.1, 190.8, 239.9, 289.0, 332.8, 378.4, 434.8, 477.3, 536.8,
                      593.1, 689.1, 760.0])
MISRA1A_Y = np.array([10.07, 14.73, 17.94, 23.93, 29.61, 35.18, 40.02, 44.82, 50.76, 55.05, 61.01,
                      66.40, 75.47, 81.78])
MISRA1A_CERT = np.array([2.3894212918e02, 5.5015643181e-04])
MISRA1A_RSS = 1.2455138894e-01


def misra1a_fun(b):
    return MISRA1A_Y - b[0] * (1.0 - np.exp(-b[1] * MISRA1A_X))


def misra1a_jac(b):
    e = np.exp(-b[1] * MISRA1A_X)
    return np.stack([-(1.0 - e), -b[0] * MISRA1A_X * e], axis=1)


# ---------------------------------------------------------------- rule transcription (hand values)
def test_radius_update_on_hand_made_rho():
    mx = 1e16
    # accept: mu / max(1/3, 1 - (2 rho - 1)^3), nu -> 2
    assert lm_update_radius(1.0, 8.0, 1.0, True, mx) == (pytest.approx(3.0), 2.0)  # 1-1=0 -> 1/3
    assert lm_update_radius(1.0, 8.0, 0.5, True, mx) == (pytest.approx(1.0), 2.0)  # 1-0
    assert lm_update_radius(1.0, 2.0, 0.75, True, mx)[0] == pytest.approx(1.0 / 0.875)
    assert lm_update_radius(1.0, 2.0, 0.25, True, mx)[0] == pytest.approx(1.0 / 1.125)
    assert lm_update_radius(1.0, 2.0, 0.9, True, mx)[0] == pytest.approx(1.0 / (1.0 - 0.8 ** 3))
    assert lm_update_radius(1e16, 2.0, 1.0, True, mx)[0] == 1e16  # clamp at max radius
    # reject: mu / nu, nu -> 2 nu (successive rejections shrink 2, 4, 8, ...)
    mu, nu = 100.0, 2.0
    seq = []
    for _ in range(4):
        mu, nu = lm_update_radius(mu, nu, float("nan"), False, mx)
        seq.append((mu, nu))
    assert seq == [(50.0, 4.0), (12.5, 8.0), (1.5625, 16.0), (1.5625 / 16, 32.0)]


def test_accept_reject_on_hand_made_values():
    t = 1e-3
    assert lm_step_accepted(1.0, 2.0, t)  # rho 0.5
    assert lm_step_accepted(1.1e-3, 1.0, t)  # rho 1.1e-3 > 1e-3
    assert not lm_step_accepted(1e-3, 1.0, t)  # rho == min_relative_decrease -> reject (strict >)
    assert not lm_step_accepted(0.0, 1.0, t)  # dc >= 0 but rho = 0
    assert not lm_step_accepted(-1.0, 1.0, t)  # cost increased
    assert not lm_step_accepted(-1.0, -1.0, t)  # rho = 1 but cost increased
    assert not lm_step_accepted(1.0, 0.0, t)  # model decrease must be positive
    assert not lm_step_accepted(float("-inf"), 1.0, t)  # non-finite trial cost
    assert not lm_step_accepted(float("nan"), 1.0, t)


def test_damping_clamp():
    diag = np.array([0.0, 1e-9, 4.0, 1e40])
    diag_first = np.array([0.0, 1e-9, 4.0, 1.0])  # the scale s is frozen at the first iteration
    s = (1.0 + np.sqrt(diag_first)) ** 2
    D = lm_damping(diag, s, 10.0, 1e-6, 1e2)
    # lower clamp (0, 1e-9), untouched (4 in [9e-6, 900]), upper clamp (1e40 > 1e2 * 4)
    expect = np.array([1e-6 * 1.0, 1e-6 * s[1], 4.0, 1e2 * s[3]]) / 10.0
    np.testing.assert_allclose(D, expect, rtol=1e-15)
    D32 = lm_damping(diag[:3].astype(np.float32), s[:3].astype(np.float32), 10.0, 1e-6, 1e32)
    assert D32.dtype == np.float32


# ---------------------------------------------------------------- full-run transcription
def reference_lm(fun, jac, x0, opts: SolverOptions):
    """Direct transcription of spec §4.3 steps 1-9 with dense linear algebra (exact linear solve)."""
    x = np.array(x0, float)
    cost = 0.5 * fun(x) @ fun(x)
    mu, nu = opts.initial_trust_region_radius, opts.radius_decrease_factor
    J = jac(x); F = fun(x); diag = (J * J).sum(0)
    s = (1 + np.sqrt(diag)) ** 2
    out = []
    for _ in range(opts.max_iterations):
        if not np.any(J.T @ F):  # addition (documented in the solver): exactly zero gradient
            return x, out, "gradient tolerance"
        D = np.clip(diag, opts.min_lm_diagonal * s, opts.max_lm_diagonal * s) / mu
        delta = np.linalg.solve(J.T @ J + np.diag(D), -J.T @ F)
        dm = cost - 0.5 * np.sum((F + J @ delta) ** 2)
        new_cost = 0.5 * np.sum(fun(x + delta) ** 2)
        dc = cost - new_cost
        rho = dc / dm
        acc = dc >= 0 and rho > opts.min_relative_decrease
        out.append((mu, acc, rho, new_cost if acc else cost))
        if acc:
            x = x + delta
            stop = dc <= opts.function_tolerance * cost
            cost = new_cost
            if stop:
                return x, out, "function tolerance"
            mu = min(mu / max(1 / 3, 1 - (2 * rho - 1) ** 3), opts.max_trust_region_radius)
            nu = 2.0
            J = jac(x); F = fun(x); diag = (J * J).sum(0)
        else:
            mu = mu / nu
            nu = 2 * nu
            if mu <= opts.min_trust_region_radius:
                return x, out, "min trust region radius"
    return x, out, "max iterations"


@pytest.mark.parametrize("extra", [
    dict(),  # spec defaults (mu0 = 1e4)
    dict(initial_trust_region_radius=1e-2),  # start strongly damped: rejections + growth
    dict(initial_trust_region_radius=1.0, min_lm_diagonal=0.5, max_lm_diagonal=0.6),  # clamp active
])
def test_lm_run_matches_transcription_of_spec(extra):
    opts = SolverOptions.paper(max_iterations=25, pcg_max_iterations=50, pcg_tolerance=1e-15,
                               q_tolerance=None, function_tolerance=1e-10, **extra)
    p = rosenbrock()
    x_ref, ref, ref_reason = reference_lm(p.fun, p.jac, [-1.2, 1.0], opts)
    res = solve(p, np.array([-1.2, 1.0]), "lm", options=opts)
    assert res.termination_reason == ref_reason
    assert len(res.log) == len(ref)
    for e, (mu, acc, rho, cost) in zip(res.log, ref):
        assert e.mu == pytest.approx(mu, rel=1e-9)
        assert e.accepted == acc
        if acc:
            assert e.rho == pytest.approx(rho, rel=1e-6, abs=1e-9)
        assert e.cost == pytest.approx(cost, rel=1e-6, abs=1e-20)
    np.testing.assert_allclose(res.x, x_ref, rtol=1e-7)
    # the run really exercised both branches of the rules
    if extra:
        assert any(not e.accepted for e in res.log) or any(e.mu != res.log[0].mu for e in res.log)


# ---------------------------------------------------------------- behaviour
def test_rosenbrock_converges_and_accepted_costs_never_increase():
    res = solve(rosenbrock(), np.array([-1.2, 1.0]), "lm", max_iterations=200, pcg_max_iterations=10)
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-8)
    c = res.accepted_costs
    assert all(b <= a for a, b in zip(c, c[1:])), c
    assert res.cost <= 1e-16
    assert res.converged or res.termination_reason == "min trust region radius", res.termination_reason
    assert np.all(np.isfinite(res.x))
    text = res.report()
    assert "termination" in text and res.termination_reason in text and len(text.splitlines()) > len(res.log)


def test_rosenbrock_float32():
    res = solve(rosenbrock(np.float32), np.array([-1.2, 1.0], np.float32), "lm", max_iterations=200)
    assert res.x.dtype == np.float32
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-3)
    c = res.accepted_costs
    assert all(b <= a for a, b in zip(c, c[1:]))


def test_termination_max_iterations():
    res = solve(rosenbrock(), np.array([-1.2, 1.0]), "lm", max_iterations=3)
    assert res.termination_reason == "max iterations" and res.iterations == 3 and not res.converged


def test_termination_function_tolerance():
    p = DenseProblem(misra1a_fun, misra1a_jac, 2)
    res = solve(p, np.array([500.0, 1e-4]), "lm", max_iterations=500, function_tolerance=1e-6)
    assert res.termination_reason == "function tolerance"
    last = res.log[-1]
    assert last.accepted and last.cost_change <= 1e-6 * (last.cost + last.cost_change)


def test_termination_gradient_tolerance():
    p = rosenbrock()
    res = solve(p, np.array([1.0, 1.0]), "lm", gradient_tolerance=1e-12)
    assert res.termination_reason == "gradient tolerance" and res.iterations == 0


def test_termination_min_trust_region_radius_and_nan_step_rejected():
    # mu0 = 1e4 -> nearly a GN step into x < 0 (NaN cost) -> rejected; 5e3, 1.25e3, 156 <= 1e3 -> stop
    res = solve(sqrt_problem(), np.array([4.0]), "lm",
                options=SolverOptions.paper(min_trust_region_radius=1e3, max_iterations=50))
    assert res.termination_reason == "min trust region radius"
    assert [e.accepted for e in res.log] == [False, False, False]
    assert [e.mu for e in res.log] == [1e4, 5e3, 1.25e3]
    assert not math.isfinite(res.log[0].trial_cost)
    assert res.x[0] == 4.0 and np.isfinite(res.cost)


def test_jacobian_that_is_not_the_derivative_stops_with_no_descent():
    """Residuals r = (x - 1, (x - 3) / 2) with a Jacobian whose second entry is -0.3 instead of
    0.5 (an approximated derivative, like optical flow's precomputed image gradients): the
    first step lands at 1.165, where the approximate gradient points left while the cost
    falls to the right (its minimum is 1.4). LM stops there with "no descent" after one
    rejection instead of rejecting steps down to the function tolerance; with the exact
    derivative the same start converges to 1.4."""
    def fun(x):
        return np.array([x[0] - 1.0, 0.5 * (x[0] - 3.0)])

    x0 = np.array([3.0])
    approx = DenseProblem(fun, lambda x: np.array([[1.0], [-0.3]]), 1)
    res = solve(approx, x0, "lm", max_iterations=100)
    assert res.termination_reason == "no descent", res.termination_reason
    assert [e.accepted for e in res.log] == [True, False]
    assert "Jacobian is not the residuals' derivative" in res.termination_detail
    assert res.x[0] == pytest.approx(3.0 - 2.0 / 1.09)
    without = solve(approx, x0, "lm", max_iterations=100, slope_check=False)
    assert without.termination_reason != "no descent"
    assert sum(not e.accepted for e in without.log) > 2
    assert without.cost == pytest.approx(res.cost, rel=1e-12)
    exact = solve(DenseProblem(fun, lambda x: np.array([[1.0], [0.5]]), 1), x0, "lm",
                  max_iterations=100)
    assert exact.converged and exact.x[0] == pytest.approx(1.4, rel=1e-10)


def test_nan_region_never_yields_nan_and_converges():
    res = solve(sqrt_problem(), np.array([4.0]), "lm", max_iterations=100, function_tolerance=1e-14)
    assert np.all(np.isfinite(res.x)) and np.isfinite(res.cost)
    assert any(not math.isfinite(e.trial_cost) for e in res.log)  # NaN trial steps happened ...
    assert all(not e.accepted for e in res.log if not math.isfinite(e.trial_cost))  # ... and were rejected
    assert abs(res.x[0] - 0.25) < 1e-8
    c = res.accepted_costs
    assert all(b <= a for a, b in zip(c, c[1:]))


def test_linearize_hook_once_per_accepted_step():
    p = rosenbrock()
    calls = []
    orig = p.linearize
    p.linearize = lambda x: (calls.append(x.copy()), orig(x))
    res = solve(p, np.array([-1.2, 1.0]), "lm", max_iterations=30, initial_trust_region_radius=1e-2)
    n_acc = sum(e.accepted for e in res.log)
    assert any(not e.accepted for e in res.log)
    # once at the start, then after every accepted step that does not end the solve
    assert len(calls) == 1 + n_acc - (1 if res.converged and res.log[-1].accepted else 0)
    assert p.n_jac_evals == len(calls)


def test_verbose_progress_lines(capsys):
    lines = []
    res = solve(rosenbrock(), np.array([-1.2, 1.0]), "lm", max_iterations=5, verbose=True, progress=lines.append)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(lines) == res.iterations + 3  # initial line, header, 1/iteration, final line
    stops = []
    res2 = solve(rosenbrock(), np.array([-1.2, 1.0]), "lm", max_iterations=50,
                 callback=lambda e, x: stops.append(e.iteration) or len(stops) >= 2)
    assert res2.termination_reason == "user callback" and res2.iterations == 2


# ---------------------------------------------------------------- NIST StRD Misra1a (AE-8)
def _sig_digits(x, ref):
    return -np.log10(np.abs(x - ref) / np.abs(ref))


def test_misra1a_certified_values_and_scipy():
    p = DenseProblem(misra1a_fun, misra1a_jac, 2)
    # [R] NIST settings: LM, up to 10000 non-linear iterations, K + 3 = 5 linear iterations
    res = solve(p, np.array([500.0, 1e-4]), "lm", max_iterations=10000, pcg_max_iterations=5,
                function_tolerance=1e-12)
    assert res.converged, res.termination_reason
    assert np.all(_sig_digits(res.x, MISRA1A_CERT) >= 6), res.x  # >= 6 significant digits
    assert 2 * res.cost == pytest.approx(MISRA1A_RSS, rel=1e-8)  # RSS = sum r^2 = 2 * cost
    ref = least_squares(misra1a_fun, [500.0, 1e-4], jac=misra1a_jac, method="lm",
                        xtol=1e-15, ftol=1e-15, gtol=1e-15)
    assert np.all(_sig_digits(ref.x, MISRA1A_CERT) >= 6)
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-6)
    # the spec default function tolerance (1e-6) with the paper's settings also gives >= 6
    # digits (measured ~7.8)
    res_def = solve(p, np.array([500.0, 1e-4]), "lm",
                    options=SolverOptions.paper(max_iterations=10000, pcg_max_iterations=5))
    assert res_def.termination_reason == "function tolerance"
    assert np.all(_sig_digits(res_def.x, MISRA1A_CERT) >= 6), res_def.x


def test_function_tolerance_uses_cost_before_the_step():
    # r = [x - 1, 1]: from x = 2 one (almost GN) step gives dc ~ 0.5; cost before 1.0, after ~0.5.
    # spec §4.3 rule 7: stop iff dc <= ftol * cost(x) (the cost *before* the step):
    # 0.5 <= 0.75 * 1.0 -> stop after one iteration (dc / cost_after ~ 1 would not stop).
    p = DenseProblem(lambda x: np.array([x[0] - 1.0, 1.0]), lambda x: np.array([[1.0], [0.0]]), 1)
    res = solve(p, np.array([2.0]), "lm", function_tolerance=0.75)
    assert res.termination_reason == "function tolerance" and res.iterations == 1
    assert res.log[0].cost_change == pytest.approx(0.5, rel=1e-3)


def test_lm_preconditioner_includes_damping():
    # spec §4.3 rule 4: M^-1 = 1/(diag + D).  With one PCG iteration the step is alpha * M^-1 b,
    # so its direction shows which preconditioner was used.
    p = rosenbrock()
    x0 = np.array([-1.2, 1.0])
    mu = 0.05
    J, F = p.jac(x0), p.fun(x0)
    diag = (J * J).sum(0)
    s = (1 + np.sqrt(diag)) ** 2
    D = np.clip(diag, 1.0 * s, 1e32 * s) / mu  # min_lm_diagonal = 1: clamp active, D not ~ diag
    A = J.T @ J + np.diag(D)
    b = -J.T @ F
    z = b / (diag + D)
    delta = (b @ z) / (z @ A @ z) * z
    res = solve(p, x0, "lm", max_iterations=1, pcg_max_iterations=1, initial_trust_region_radius=mu,
                min_lm_diagonal=1.0)
    assert res.log[0].step_norm == pytest.approx(np.linalg.norm(delta), rel=1e-12)
    assert res.log[0].trial_cost == pytest.approx(0.5 * np.sum(p.fun(x0 + delta) ** 2), rel=1e-12)


def test_lm_inner_loop_uses_q_exit_and_reset_gn_does_not():
    import scipy.sparse as sp
    from lsq_opt._solver import inverse_diagonal, pcg

    rng = np.random.default_rng(7)
    m, n = 300, 80
    J = sp.csr_matrix(sp.random(m, n, density=0.05, random_state=7) + sp.eye(m, n))
    J = sp.csr_matrix(J @ sp.diags(np.logspace(0, 2, n)))
    y = rng.standard_normal(m)
    p = DenseProblem(lambda x: J @ x - y, lambda x: J, n)
    n_jtjp = []
    orig = p.jtjp
    p.jtjp = lambda x, v: (n_jtjp.append(1), orig(x, v))[1]
    x0 = np.zeros(n)
    opts = SolverOptions.paper(max_iterations=1, pcg_max_iterations=200, pcg_tolerance=0.0)
    res = solve(p, x0, "lm", options=opts)
    g = J.T @ (J @ x0 - y)
    diag = np.asarray(J.multiply(J).sum(0)).ravel()
    s = (1 + np.sqrt(diag)) ** 2
    D = np.clip(diag, 1e-6 * s, 1e32 * s) / 1e4
    A = lambda v: J.T @ (J @ v) + D * v
    ref = pcg(A, -g, inverse_diagonal(diag + D), max_iterations=200, tolerance=0.0,
              q_tolerance=1e-4, residual_reset_period=10)
    assert ref.reason == "q tolerance" and ref.iterations < 200
    assert res.log[0].pcg_reason == "q tolerance"
    assert res.log[0].pcg_iterations == ref.iterations
    # jtjp calls: one per PCG iteration + one per explicit reset (every 10); none for the model
    # change, whose J^T J delta comes from PCG's final residual
    assert ref.iterations >= 10
    assert len(n_jtjp) == ref.iterations + ref.iterations // 10 == ref.n_apply
    assert res.log[0].step_norm == pytest.approx(np.linalg.norm(ref.x), rel=1e-10)
    gn = solve(p, x0, "gn", options=opts)
    assert gn.log[0].pcg_reason != "q tolerance" and gn.log[0].pcg_iterations > ref.iterations


@pytest.mark.parametrize("damped", [True, False])
@pytest.mark.parametrize("tolerance", [1e-1, 1e-12])
def test_model_product_from_the_pcg_residual_equals_the_product(damped, tolerance):
    """J^T J delta for the model decrease comes from PCG's final residual (-g - r - D delta)
    instead of one more product: equal to the product to 1e-10 relative, after a loose solve
    and after a long one with explicit residual resets."""
    import scipy.sparse as sp
    from lsq_opt._solver import inverse_diagonal, pcg
    from lsq_opt._solver.levenberg_marquardt import model_product

    rng = np.random.default_rng(3)
    J = sp.csr_matrix(sp.random(400, 120, density=0.04, random_state=3) + sp.eye(400, 120))
    J = sp.csr_matrix(J @ sp.diags(np.logspace(0, 2, 120)))
    g = J.T @ rng.standard_normal(400)
    diag = np.asarray(J.multiply(J).sum(0)).ravel()
    D = 1e-3 * diag if damped else None
    jtjp = lambda v: J.T @ (J @ v)  # noqa: E731
    A = (lambda v: jtjp(v) + D * v) if damped else jtjp
    res = pcg(A, -g, inverse_diagonal(diag if D is None else diag + D), max_iterations=300,
              tolerance=tolerance, residual_reset_period=10)
    assert res.iterations > (10 if tolerance < 1e-6 else 0)
    exact = jtjp(res.x)
    got = model_product(res, g, res.x, jtjp, np, np.float64, D)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-10 * np.linalg.norm(exact))
    # without a residual (a PCG that returned none) the product itself is used
    import dataclasses
    bare = dataclasses.replace(res, residual=None)
    np.testing.assert_array_equal(model_product(bare, g, res.x, jtjp, np, np.float64, D), exact)
