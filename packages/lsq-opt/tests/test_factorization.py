"""preconditioner="factorization": a sparse factorisation of the damped J^T J, reused across
the linear systems of a solve (``lsq_opt._solver.factorization``)."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from lsq_opt import solve
from lsq_opt._solver.factorization import REFACTOR_AFTER, LaggedFactorization, factorize
from lsq_opt._solver.options import SolverOptions
from lsq_opt._solver.pcg import pcg
from lsq_opt._solver.problem import resolve_preconditioner
from lsq_opt.examples import mesh
from lsq_opt.testing import spring_network


def damped_jtj(plan, x, mu=1e2):
    A = sp.csr_matrix(plan.jtj_matrix(x))
    return A, A.diagonal() / mu + 1e-9


def test_factor_inverts_the_damped_jtj_and_pcg_takes_the_direct_step():
    """On a small ARAP mesh: the factor applied to A (+ shift) gives back the identity, and PCG
    preconditioned by it reaches the direct solve's step to 1e-10 in one or two iterations."""
    plan, _, _ = mesh.arap_plan(5, 6)
    x = plan.x0 + np.random.default_rng(0).normal(scale=0.1, size=plan.n)
    plan.linearize(x)
    A, shift = damped_jtj(plan, x)
    Ad = (A + sp.diags(shift)).tocsc()
    solve_with = factorize(A, shift)
    np.testing.assert_allclose(solve_with(Ad.toarray()), np.eye(plan.n), atol=1e-10)
    b = -plan.jtf(x)
    direct = spla.spsolve(Ad, b)
    res = pcg(lambda p: Ad @ p, b, solve_with, max_iterations=10, tolerance=1e-12)
    assert res.reason == "tolerance" and res.iterations <= 2, (res.reason, res.iterations)
    np.testing.assert_allclose(res.x, direct, rtol=1e-10, atol=1e-10 * np.abs(direct).max())


class CountingPlan:
    """A plan's jtj_matrix, counted."""

    def __init__(self, plan):
        self.plan, self.assemblies = plan, 0

    def jtj_matrix(self, x):
        self.assemblies += 1
        return self.plan.jtj_matrix(x)


def test_lagged_factorization_reuses_its_factor_until_a_solve_needs_many_iterations():
    plan = spring_network(6, 5)
    x = plan.x0
    plan.linearize(x)
    counted = CountingPlan(plan)
    factors = LaggedFactorization()
    A, shift = damped_jtj(plan, x)
    Ad = A + sp.diags(shift)
    b = -plan.jtf(x)

    def solve_with(M, iterations):
        return pcg(lambda p: Ad @ p, b, M, max_iterations=iterations, tolerance=0.0)

    solve_with(factors.preconditioner(counted, x, shift), 1)
    M = factors.preconditioner(counted, x, 10 * shift)  # a new damping: the old factor serves
    assert (factors.factorizations, factors.reuses, counted.assemblies) == (1, 1, 1)
    solve_with(M, REFACTOR_AFTER + 1)  # too many iterations: the next call refactors
    factors.preconditioner(counted, x, shift)
    assert (factors.factorizations, factors.reuses, counted.assemblies) == (2, 1, 1)  # J^T J kept


def test_singular_system_falls_back_to_jacobi():
    """An undamped J^T J with an unknown no residual reads cannot be factored: the inverse
    diagonal (with its zero guard) preconditions instead, and the failure is counted."""
    A = sp.csr_matrix(np.diag([2.0, 4.0, 0.0]))

    class Singular:
        def jtj_matrix(self, x):
            return A

    factors = LaggedFactorization()
    M = factors.preconditioner(Singular(), np.zeros(3))
    np.testing.assert_allclose(M, [0.5, 0.25, 1.0])
    assert (factors.factorizations, factors.failures) == (0, 1)


@pytest.mark.parametrize("build, gn", [(lambda: mesh.arap_plan(8, 6)[0], True),
                                       (lambda: spring_network(12, 8), False)],  # GN diverges there
                         ids=["arap mesh", "spring network"])
def test_factorization_reaches_the_same_minimum_in_fewer_iterations(build, gn):
    plan = build()
    mf = dict(linear_system="matrix_free")  # "auto"'s timed choices move the rounding
    jacobi = solve(plan, plan.x0, preconditioner="jacobi", **mf)
    factored = solve(plan, plan.x0, preconditioner="factorization", **mf)
    assert jacobi.converged and factored.converged, (jacobi.termination_detail, factored.termination_detail)
    assert factored.cost == pytest.approx(jacobi.cost, rel=1e-4)
    assert factored.pcg_iterations < jacobi.pcg_iterations
    assert factored.preconditioner == "factorization"
    if gn:
        gn_factored = solve(plan, plan.x0, method="gn", preconditioner="factorization", **mf)
        assert gn_factored.cost == pytest.approx(jacobi.cost, rel=1e-4)


def test_factorization_is_opt_in_and_host_only():
    plan = spring_network(6, 5)
    assert resolve_preconditioner(plan, SolverOptions()) == "jacobi"
    assert resolve_preconditioner(plan, SolverOptions(preconditioner="factorization")) == "factorization"

    class DeviceProblem:
        xp = object()

    with pytest.raises(ValueError, match="cannot precondition the all-device solver loop"):
        resolve_preconditioner(DeviceProblem(), SolverOptions(preconditioner="factorization"))
