"""More Opt paper examples: cotangent-weighted mesh smoothing (per-edge weights as graph edge
attributes) and embedded deformation; acceptance checks and FD checks of their Jacobians."""
import numpy as np
from lsq_opt import compile_problem
from lsq_opt.examples import cotangent, embedded, robust, volumetric
from lsq_opt.examples.mesh import directed_edges, tube_mesh
from lsq_opt.testing import fd_jacobian, rel_check


def test_cotangent_smoothing_equals_direct_solve_and_keeps_planar_meshes(tmp_path):
    r = cotangent.run(size=(12, 9), out_dir=str(tmp_path))
    assert r["max_abs_diff_direct"] <= 1e-9
    # linear precision of the cotangent weights; uniform weights move the same planar mesh
    assert r["planar_drift_cotangent"] <= 1e-9 and r["planar_drift_uniform"] > 1e-2
    assert r["rms_result"] < 0.5 * r["rms_noise"]


def test_cotangent_weights_of_an_equilateral_lattice():
    """Interior edges of a regular triangular lattice: (cot 60 + cot 60) / 2 = 1/sqrt(3) (in the
    xy plane: the example's lattice lies on a tilted plane, which changes its angles)."""
    V, tris, boundary = cotangent.lattice_mesh(6, 5, jitter=0.0)
    v0, v1, w = cotangent.cotangent_weights(V * [1, 1, 0], tris)
    both_inner = (boundary[v0] == 0) & (boundary[v1] == 0)
    np.testing.assert_allclose(w[both_inner], 1 / np.sqrt(3), rtol=1e-12)


def test_cotangent_jacobian_matches_fd():
    V, tris, boundary = cotangent.lattice_mesh(7, 6)
    rng = np.random.default_rng(0)
    plan = cotangent.make_plan(V, tris, boundary, V + 0.05 * rng.normal(size=V.shape))
    x = plan.x0 + rng.normal(scale=0.1, size=plan.n)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x))
    p = rng.normal(size=plan.n)
    rel_check(plan.jtjp(x, p), J.T @ (J @ p), rel=1e-10)


def test_embedded_deformation_reproduces_rigid_motions_and_bends():
    r = embedded.run(size=(8, 6))
    assert r["rigid_cost"] <= 1e-12 * r["rigid_initial_cost"]
    assert r["rigid_R_err"] <= 1e-6 and r["rigid_pos_err"] <= 1e-6
    assert r["converged"] and r["monotone_accepted_costs"] and r["finite"]
    assert r["handle_max_err"] <= 0.05 and r["orthonormality_err"] <= 0.25
    assert r["cost"] < 1e-2 * r["initial_cost"]


def test_embedded_deformation_jacobian_matches_fd():
    V, tris = tube_mesh(4, 5)
    v0, v1 = directed_edges(tris)
    rng = np.random.default_rng(1)
    handles = np.arange(5)
    plan = embedded.make_plan(V, v0, v1, handles, V[handles] + 0.3)
    x = plan.x0 + rng.normal(scale=0.3, size=plan.n)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x))
    p = rng.normal(size=plan.n)
    rel_check(plan.jtjp(x, p), J.T @ (J @ p), rel=1e-10)
    rel_check(plan.jtf(x), J.T @ plan.residuals(x), rel=1e-10)


def test_wedge_cotangent_energy_matches_numpy_weights_and_fd():
    """Fig. 29 (weights recomputed from X on wedges): at the rest mesh the residuals are the
    numpy cotangent weights' (all positive on this torus), and J (with the derivatives of the
    weights) matches finite differences away from it."""
    V, tris = cotangent.torus_mesh(16, 6)
    g = cotangent.wedges(tris)
    plan = compile_problem(cotangent.wedge_energy(), arrays={"A": V},
                           params={"w_fit": 1.0, "w_reg": 0.7}, graphs={"G": g})
    v0, v1, w = cotangent.cotangent_weights(V, tris)
    weight = {**dict(zip(zip(v0, v1), w)), **dict(zip(zip(v1, v0), w))}
    sw = np.sqrt([weight[e] for e in zip(g["v0"], g["v1"])])
    ref = (0.7 * sw[:, None] * (V[g["v1"]] - V[g["v0"]])).T.ravel()
    rel_check(plan.residuals(V.ravel())[3 * len(V):], ref, rel=1e-12)
    rng = np.random.default_rng(2)
    x = V.ravel() + 0.03 * rng.normal(size=plan.n)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x, h=1e-4))


def test_wedge_cotangent_gn_run():
    out = cotangent.run_wedge((16, 6))
    acc = out["result"].accepted_costs
    assert out["finite"] and all(b <= a for a, b in zip(acc, acc[1:])) and acc[-1] < 0.9 * acc[0]


def test_volumetric_deformation_rigid_motion_exact_and_bend_reaches_handles():
    r = volumetric.run(size=(3, 8, 3))
    assert r["rigid_cost"] <= 1e-12 * r["rigid_initial_cost"]
    assert r["rigid_R_err"] <= 1e-6 and r["rigid_pos_err"] <= 1e-6
    assert r["finite"] and r["handle_max_err"] <= 0.05 and r["cost"] < 1e-2 * r["initial_cost"]


def test_volumetric_jacobian_matches_fd():
    U = volumetric.grid((3, 4, 3))
    handles = np.zeros((3, 4, 3), bool)
    handles[:, 0, :] = True
    plan = volumetric.make_plan(U, handles, U[handles] + 0.2)
    rng = np.random.default_rng(4)
    x = plan.x0 + rng.normal(scale=0.3, size=plan.n)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x))
    p = rng.normal(size=plan.n)
    rel_check(plan.jtjp(x, p), J.T @ (J @ p), rel=1e-10)


def test_robust_alignment_drops_outliers_and_fits_inliers():
    r = robust.run(size=(10, 8))
    assert r["outliers"] > 0 and r["converged"] and r["finite"]
    assert r["outlier_weight_max"] <= 0.05 and r["inlier_weight_min"] >= 0.9
    assert r["inlier_err_robust"] < 0.2 * r["inlier_err_plain"]


def test_robust_alignment_jacobian_matches_fd():
    V, edges, constraints, normals, _, _ = robust.make_data(4, 5, outlier_fraction=0.3)
    plan = robust.make_plan(V, edges, constraints, normals)
    rng = np.random.default_rng(5)
    x = plan.x0 + rng.normal(scale=0.3, size=plan.n)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x))
    p = rng.normal(size=plan.n)
    rel_check(plan.jtjp(x, p), J.T @ (J @ p), rel=1e-10)
