"""Gauss-Newton (spec §4.1) on explicit problems."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from lsq_opt._solver import DenseProblem, LeastSquaresProblem, solve


def _linear_problem(dtype=np.float64, seed=0, m=60, n=20):
    rng = np.random.default_rng(seed)
    J = sp.random(m, n, density=0.3, random_state=seed, format="csr") + sp.eye(m, n)
    J = sp.csr_matrix(J)
    y = rng.standard_normal(m)
    prob = DenseProblem(lambda x: J @ x - y, lambda x: J, n, dtype=dtype)
    return prob, J, y


def test_dense_problem_implements_protocol():
    prob, J, y = _linear_problem()
    assert isinstance(prob, LeastSquaresProblem)
    x = np.random.default_rng(1).standard_normal(prob.n)
    r = J @ x - y
    assert prob.cost(x) == pytest.approx(0.5 * r @ r, rel=1e-14)
    np.testing.assert_allclose(prob.jtf(x), J.T @ r, rtol=1e-13)
    np.testing.assert_allclose(prob.jtj_diag(x), np.asarray(J.multiply(J).sum(0)).ravel(), rtol=1e-13)
    p = np.random.default_rng(2).standard_normal(prob.n)
    np.testing.assert_allclose(prob.jtjp(x, p), J.T @ (J @ p), rtol=1e-13)
    assert sp.issparse(prob.jacobian(x))


def test_gn_linear_one_iteration_equals_normal_equations():
    prob, J, y = _linear_problem()
    x_ref = spla.spsolve(sp.csc_matrix(J.T @ J), J.T @ y)
    x_lstsq = np.linalg.lstsq(J.toarray(), y, rcond=None)[0]
    np.testing.assert_allclose(x_ref, x_lstsq, atol=1e-10)
    res = solve(prob, np.zeros(prob.n), "gn", max_iterations=1, pcg_max_iterations=500, pcg_tolerance=1e-14)
    assert res.iterations == 1 and res.termination_reason == "max iterations"
    assert np.max(np.abs(res.x - x_ref)) <= 1e-9  # spec AE-2 tolerance
    # a further iteration changes (almost) nothing -> function tolerance stop
    res2 = solve(prob, np.zeros(prob.n), "gn", max_iterations=10, pcg_max_iterations=500, pcg_tolerance=1e-14)
    assert res2.termination_reason in ("function tolerance", "gradient tolerance")
    assert res2.iterations <= 2
    assert res2.cost == pytest.approx(0.5 * np.sum((J @ x_ref - y) ** 2), rel=1e-12)
    # the model cost change of a linear problem equals the actual change (rho == 1)
    assert res2.log[0].rho == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("precond", ["jacobi", "none", "ceres"])
def test_gn_preconditioner_options_agree(precond):
    prob, J, y = _linear_problem(seed=3)
    x_ref = spla.spsolve(sp.csc_matrix(J.T @ J), J.T @ y)
    res = solve(prob, np.zeros(prob.n), "gn", max_iterations=1, pcg_max_iterations=1000,
                pcg_tolerance=1e-14, preconditioner=precond)
    assert np.max(np.abs(res.x - x_ref)) <= 1e-9


def test_gn_float32():
    prob, J, y = _linear_problem(dtype=np.float32)
    x_ref = spla.spsolve(sp.csc_matrix(J.T @ J), J.T @ y)
    res = solve(prob, np.zeros(prob.n, np.float32), "gn", max_iterations=2, pcg_max_iterations=200,
                pcg_tolerance=1e-6)
    assert res.x.dtype == np.float32
    assert np.linalg.norm(res.x - x_ref) <= 1e-4 * np.linalg.norm(x_ref)  # f32 rel 1e-4


def _sqrt_problem(dtype=np.float64):
    # r = sqrt(x) - 0.5; minimum at x = 0.25; a full GN step from x=4 lands at x=-2 (NaN residual)
    def fun(x):
        with np.errstate(invalid="ignore"):
            return np.sqrt(x) - 0.5

    def jac(x):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (0.5 / np.sqrt(x)).reshape(1, 1)

    return DenseProblem(fun, jac, 1, dtype=dtype)


def test_gn_stops_on_non_finite_cost_without_nan():
    res = solve(_sqrt_problem(), np.array([4.0]), "gn", max_iterations=10)
    assert res.termination_reason.startswith("diverged: non-finite cost")
    assert np.all(np.isfinite(res.x)) and res.x[0] == 4.0 and np.isfinite(res.cost)
    assert "diverged" in str(res)


def test_non_finite_initial_cost_raises():
    with pytest.raises(ValueError, match="initial cost is not finite"):
        solve(_sqrt_problem(), np.array([-1.0]), "gn")
    with pytest.raises(ValueError, match="initial cost is not finite"):
        solve(_sqrt_problem(), np.array([-1.0]), "lm")


def test_gn_linearize_hook_called_once_per_iteration():
    prob, J, y = _linear_problem()
    calls = []
    orig = prob.linearize
    prob.linearize = lambda x: (calls.append(x.copy()), orig(x))
    res = solve(prob, np.ones(prob.n), "gn", max_iterations=3, function_tolerance=0.0,
                pcg_max_iterations=5, pcg_tolerance=0.0)
    assert res.iterations == 3 and len(calls) == 3
    assert prob.n_jac_evals == 3  # jtf/jtj_diag/jtjp reuse the linearisation
