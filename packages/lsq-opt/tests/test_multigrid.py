"""The multigrid preconditioner (``preconditioner="multigrid"``) and the J^T J assembly it
uses (``Plan.jtj_matrix``: generated stencil planes on grid energies)."""

import numpy as np
import pytest
import scipy.sparse.linalg as spla
from lsq_opt import DenseProblem, compile_problem, solve
from lsq_opt._solver.multigrid import Multigrid
from lsq_opt._solver.pcg import pcg
from lsq_opt.examples import arap as arap_example
from lsq_opt.examples import laplacian, mesh


def test_jtj_matrix_equals_materialised_grid():
    """Stencil-plane assembly = J^T J of the materialised J (multi-channel, Exclude, masks)."""
    rng = np.random.default_rng(0)
    ur, mask, handles, targets = arap_example.make_data((21, 14))
    cons = -np.ones((21, 14, 2))
    for (hx, hy), t in zip(handles, targets):
        cons[hx, hy] = t
    plan = compile_problem(arap_example.energy(), arrays={
        "UrShape": ur, "Mask": mask, "Constraints": cons, "Offset": ur, "Angle": np.zeros((21, 14))},
        params={"w_fitSqrt": 3.0, "w_regSqrt": 1.0})
    x = plan.x0 + rng.normal(scale=0.2, size=plan.n)
    J = plan.jacobian(x)
    np.testing.assert_allclose(plan.jtj_matrix(x).toarray(), (J.T @ J).toarray(), rtol=1e-12,
                               atol=1e-12)
    c = plan.unknown_coords()
    assert c.shape == (plan.n, 3) and c[:, 0].max() == 2  # planes: Offset x, Offset y, Angle


def test_jtj_matrix_graph_fallback():
    plan, _, _ = mesh.arap_plan(4, 5)
    x = plan.x0 + np.random.default_rng(1).normal(scale=0.1, size=plan.n)
    J = plan.jacobian(x)
    np.testing.assert_allclose(plan.jtj_matrix(x).toarray(), (J.T @ J).toarray(), atol=1e-13)


def test_multigrid_pcg_converges_fast_on_laplacian():
    """A 96 x 80 screened Laplacian: the V-cycle-preconditioned CG reaches 1e-10 in far fewer
    iterations than Jacobi-PCG (iteration counts, not times), and equals a direct solve."""
    clean, noisy = laplacian.make_data((96, 80))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.05, "w_reg": 1.0})
    x0 = np.zeros(plan.n)
    A = plan.jtj_matrix(x0)
    b = -plan.jtf(x0)
    M = Multigrid(A, plan.unknown_coords())
    assert M.n_levels >= 3
    r_mg = pcg(lambda p: A @ p, b, M, max_iterations=500, tolerance=1e-10)
    r_j = pcg(lambda p: A @ p, b, 1.0 / A.diagonal(), max_iterations=2000, tolerance=1e-10)
    assert r_mg.reason == "tolerance" and r_j.reason == "tolerance"
    assert r_mg.iterations * 4 < r_j.iterations, (r_mg.iterations, r_j.iterations)
    np.testing.assert_allclose(r_mg.x, spla.spsolve(A.tocsc(), b), atol=1e-8)
    # the V-cycle is symmetric (required for PCG)
    rng = np.random.default_rng(2)
    u, v = rng.normal(size=plan.n), rng.normal(size=plan.n)
    assert u @ M(v) == pytest.approx(v @ M(u), rel=1e-10)


def test_gn_multigrid_equals_direct_solve():
    """AE-2 with the multigrid preconditioner: one GN step = spsolve of the normal equations."""
    clean, noisy = laplacian.make_data((40, 33))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.1, "w_reg": 0.9})
    x0 = np.zeros(plan.n)
    res = solve(plan, x0, method="gn", max_iterations=1, pcg_max_iterations=200,
                pcg_tolerance=1e-12, preconditioner="multigrid")
    np.testing.assert_allclose(res.x, laplacian.direct_solution(plan, x0), atol=1e-9)
    assert res.pcg_iterations < 60


def test_lm_multigrid_arap_monotone():
    ur, mask, handles, targets = arap_example.make_data((24, 16))
    cons = -np.ones((24, 16, 2))
    for (hx, hy), t in zip(handles, targets):
        cons[hx, hy] = t
    plan = compile_problem(arap_example.energy(), arrays={
        "UrShape": ur, "Mask": mask, "Constraints": cons, "Offset": ur, "Angle": np.zeros((24, 16))},
        params={"w_fitSqrt": 10.0, "w_regSqrt": 0.1})
    res = solve(plan, plan.x0, method="lm", max_iterations=15, pcg_max_iterations=20,
                preconditioner="multigrid")
    acc = res.accepted_costs
    assert all(b <= a for a, b in zip(acc, acc[1:]))
    assert res.cost < 1e-2 * res.initial_cost


def test_multigrid_needs_a_plan():
    p = DenseProblem(lambda x: x - 1.0, lambda x: np.eye(3), 3)
    with pytest.raises(TypeError, match="multigrid"):
        solve(p, np.zeros(3), method="gn", preconditioner="multigrid")


def test_over_correction_must_keep_the_cycle_definite():
    clean, noisy = laplacian.make_data((20, 16))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.05, "w_reg": 1.0})
    A, coords = plan.jtj_matrix(np.zeros(plan.n)), plan.unknown_coords()
    with pytest.raises(ValueError, match="over_correction"):
        Multigrid(A, coords, coarse_size=20, over_correction=2.0)
    with pytest.raises(ValueError, match="coords"):
        Multigrid(A, coords[:-1], coarse_size=20)


def test_over_correction_cuts_pcg_iterations():
    """Braess' over-correction of the unsmoothed-aggregation coarse step: fewer PCG iterations
    to the same tolerance than the plain cycle (iteration counts, not times)."""
    clean, noisy = laplacian.make_data((128, 96))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.01, "w_reg": 1.0})
    x0 = np.zeros(plan.n)
    A, b = plan.jtj_matrix(x0), -plan.jtf(x0)
    its = {a: pcg(lambda p: A @ p, b, Multigrid(A, plan.unknown_coords(), over_correction=a),
                  max_iterations=500, tolerance=1e-10).iterations for a in (1.0, 1.6)}
    assert its[1.6] < its[1.0], its


def test_damping_added_to_a_copy_of_the_diagonal():
    """LM's multigrid adds its damping D to a copy of J^T J's stored diagonal (the solve's
    J^T J is reused across rejected steps, so it must stay as it was); a pattern without some
    diagonal entry takes the sparse sum."""
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    coords = np.stack([np.zeros(36, int), np.arange(36) // 6, np.arange(36) % 6], 1)
    full = sp.random(36, 36, density=0.2, random_state=4, format="csr")
    full = (full + full.T + 20 * sp.eye(36)).tocsr()
    holed = sp.random(36, 36, density=0.1, random_state=5, format="csr")
    holed = (holed + holed.T).tocsr()
    holed.setdiag(0.0)
    holed.eliminate_zeros()
    for A in (full, holed):
        shift = 1.0 + rng.random(36)
        before = A.toarray()
        M = Multigrid(A, coords, coarse_size=4, shift=shift)
        np.testing.assert_allclose(M.levels[0][0].toarray(), before + np.diag(shift))
        np.testing.assert_array_equal(A.toarray(), before)


def test_reused_hierarchy_gives_the_solves_of_a_fresh_one():
    """A hierarchy built for one J^T J and reused on another of the same pattern (other values,
    another damping) gives the V-cycle, and the PCG solve, of a hierarchy built afresh for it,
    to 1e-12; a matrix of another pattern gets a hierarchy of its own."""
    clean, noisy = laplacian.make_data((70, 53))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.05, "w_reg": 1.0})
    rng = np.random.default_rng(7)
    coords = plan.unknown_coords()
    A1 = plan.jtj_matrix(np.zeros(plan.n))
    first = Multigrid(A1, coords, coarse_size=50, shift=rng.random(plan.n))
    assert first.n_levels >= 3
    # same pattern, other values: a random symmetric positive scaling of every entry
    A2 = A1.copy()
    A2.data *= 1.0 + 0.5 * rng.random(A2.nnz)
    A2 = ((A2 + A2.T) * 0.5).tocsr()
    A2.sort_indices()
    assert np.array_equal(A2.indptr, A1.indptr) and np.array_equal(A2.indices, A1.indices)
    shift = rng.random(plan.n)
    reused = Multigrid(A2, coords, coarse_size=50, shift=shift, hierarchy=first.hierarchy)
    fresh = Multigrid(A2, coords, coarse_size=50, shift=shift)
    assert reused.hierarchy is first.hierarchy and fresh.hierarchy is not first.hierarchy
    r = rng.normal(size=plan.n)
    np.testing.assert_allclose(reused(r), fresh(r), rtol=1e-12, atol=1e-12 * np.abs(fresh(r)).max())
    A2s = A2 + __import__("scipy.sparse", fromlist=["diags"]).diags(shift)
    b = rng.normal(size=plan.n)
    x_reused = pcg(lambda p: A2s @ p, b, reused, max_iterations=200, tolerance=1e-10)
    x_fresh = pcg(lambda p: A2s @ p, b, fresh, max_iterations=200, tolerance=1e-10)
    assert x_reused.iterations == x_fresh.iterations
    np.testing.assert_allclose(x_reused.x, x_fresh.x, rtol=1e-12, atol=1e-12 * np.abs(x_fresh.x).max())
    # coarse operators = Galerkin products P^T (A + diag(shift)) P, level by level
    Ak = A2s.tocsr()
    for (Al, _, P, R) in reused.levels:
        np.testing.assert_allclose(Al.toarray(), Ak.toarray(), rtol=1e-12, atol=1e-12)
        Ak = (R @ Ak @ P).tocsr()
    # another pattern (a sub-block): not reused
    sub = A2[:plan.n // 2, :plan.n // 2].tocsr()
    other = Multigrid(sub, coords[:plan.n // 2], coarse_size=50, hierarchy=first.hierarchy)
    assert other.hierarchy is not first.hierarchy


def test_multigrid_cache_assembles_jtj_once_per_point():
    """The solve's cache assembles J^T J once per linearisation point (LM's rejected steps
    re-solve at the same x with another damping) and builds one hierarchy for all."""
    from lsq_opt._solver.multigrid import MultigridCache

    clean, noisy = laplacian.make_data((40, 33))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.1, "w_reg": 0.9})

    class Counting:
        def __init__(self):
            self.n, self.calls = plan.n, 0

        def jtj_matrix(self, x):
            self.calls += 1
            return plan.jtj_matrix(x)

        def unknown_coords(self):
            return plan.unknown_coords()

    problem, cache = Counting(), MultigridCache()
    x0, x1 = np.zeros(plan.n), np.full(plan.n, 0.5)
    r = np.random.default_rng(0).normal(size=plan.n)
    M_small = cache.preconditioner(problem, x0, np.full(plan.n, 1e-3))
    M_large = cache.preconditioner(problem, x0.copy(), np.full(plan.n, 1e3))
    assert problem.calls == 1 and not np.allclose(M_small(r), M_large(r))
    np.testing.assert_allclose(M_large(r), Multigrid(plan.jtj_matrix(x0), plan.unknown_coords(),
                                                     shift=np.full(plan.n, 1e3))(r), rtol=1e-12)
    cache.preconditioner(problem, x1, None)
    assert problem.calls == 2 and cache.assemblies == 2 and cache.setups == 3 and cache.hierarchies == 1


def test_lm_keeps_one_hierarchy_per_plan(monkeypatch):
    """The LM solve builds the multigrid hierarchy once for all its systems, and a later solve
    on the same plan reuses it (same iterates)."""
    import sys

    from lsq_opt._solver.multigrid import MultigridCache

    lm = sys.modules["lsq_opt._solver.levenberg_marquardt"]
    caches = []

    class Recording(MultigridCache):
        def __init__(self):
            super().__init__()
            caches.append(self)

    monkeypatch.setattr(lm, "MultigridCache", Recording)
    clean, noisy = laplacian.make_data((40, 33))
    plan = compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.1, "w_reg": 0.9})
    options = dict(method="lm", max_iterations=4, pcg_max_iterations=20, pcg_tolerance=1e-12,
                   preconditioner="multigrid", function_tolerance=0.0)
    first = solve(plan, np.zeros(plan.n), **options)
    second = solve(plan, np.zeros(plan.n), **options)  # the plan's hierarchy is remembered
    assert first.iterations == 4 and [c.setups for c in caches] == [4, 4]
    assert [c.hierarchies for c in caches] == [1, 0]
    np.testing.assert_array_equal(first.x, second.x)
