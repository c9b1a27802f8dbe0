"""Mesh (graph-domain) examples: Rotate3D, ARAP mesh deformation (spec 3.4, Fig. 25) and
Laplacian mesh smoothing (spec 3.2, Fig. 5).

Finite differences: float64 4-point central differences with h = 1e-3 (truncation O(h^4) ~ 1e-12
relative for these smooth residuals, well under the 1e-6 tolerance of spec AE-1)."""

import numpy as np
from lsq_opt.testing import fd_jacobian
import pytest
from core_ad import sym
from lsq_opt import Rotate3D, Vec, solve
from lsq_opt.examples import mesh


def test_rotate3d_matches_numpy_and_is_a_rotation():
    """Rotate3D = Rz(g) Ry(b) Rx(a) (spec 2.3); orthonormal with det 1; sym derivative = FD."""
    rng = np.random.default_rng(0)
    a = [sym.var(f"a{i}") for i in range(3)]
    v = [sym.var(f"v{i}") for i in range(3)]
    out = Rotate3D(Vec(a), Vec(v)).items
    f = sym.compile(out, a + v, backend="numpy")
    ang = rng.normal(size=3)
    vec = rng.normal(size=3)
    got = np.array([float(o) for o in f(*ang, *vec)])
    M = mesh.rot3d(ang)
    np.testing.assert_allclose(got, M @ vec, rtol=1e-14, atol=1e-14)
    Rx = np.array([[1, 0, 0], [0, np.cos(ang[0]), -np.sin(ang[0])], [0, np.sin(ang[0]), np.cos(ang[0])]])
    Ry = np.array([[np.cos(ang[1]), 0, np.sin(ang[1])], [0, 1, 0], [-np.sin(ang[1]), 0, np.cos(ang[1])]])
    Rz = np.array([[np.cos(ang[2]), -np.sin(ang[2]), 0], [np.sin(ang[2]), np.cos(ang[2]), 0], [0, 0, 1]])
    np.testing.assert_allclose(M, Rz @ Ry @ Rx, atol=1e-14)
    np.testing.assert_allclose(M @ M.T, np.eye(3), atol=1e-14)
    # derivative w.r.t. each angle vs central differences (h = 1e-6: smooth, |a| ~ 1)
    h = 1e-6
    for k in range(3):
        d = [sym.diff(o, a[k]) for o in out]
        g = np.array([float(x) for x in sym.compile(d, a + v, backend="numpy")(*ang, *vec)])
        e = np.zeros(3)
        e[k] = h
        fd = (mesh.rot3d(ang + e) @ vec - mesh.rot3d(ang - e) @ vec) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)
    with pytest.raises(TypeError, match="3-channel"):
        Rotate3D(Vec(a[:2]), Vec(v))


def test_arap_mesh_derivatives_against_fd_and_oracle():
    """AE-1 on the Fig. 25 energy (6 unknowns per vertex, 2 terms: vertex stencil + edge graph)."""
    rng = np.random.default_rng(1)
    plan, data, _ = mesh.arap_plan(5, 6)
    lanes, _, _ = mesh.arap_plan(5, 6, kernels="lanes")
    assert plan.n == 5 * 6 * 6
    x = plan.x0 + rng.normal(scale=0.3, size=plan.n)
    J = plan.jacobian(x).toarray()
    Jfd = fd_jacobian(plan, x)
    big = np.abs(Jfd) > 1e-8
    assert np.all(np.abs(J - Jfd)[big] <= 1e-6 * np.abs(Jfd[big]))
    assert np.all(np.abs(J - Jfd)[~big] <= 1e-8)
    F = plan.residuals(x)
    p, q = rng.normal(size=plan.n), rng.normal(size=plan.n)
    np.testing.assert_allclose(plan.jtf(x), J.T @ F, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jtj_diag(x), (J * J).sum(0), rtol=1e-12)
    np.testing.assert_allclose(plan.jtjp(x, p), J.T @ (J @ p), rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(plan.jtjp(x, p), lanes.jtjp(x, p), rtol=1e-12, atol=1e-11)
    assert q @ plan.jtjp(x, p) == pytest.approx(p @ plan.jtjp(x, q), rel=1e-12)
    # the residuals are the spec's: independent numpy evaluation
    u = plan.vector_to_unknowns(x)
    off, ang = u["Offset"], u["Angle"]
    v0, v1, U = data["v0"], data["v1"], data["UrShape"]
    reg = (off[v0] - off[v1]) - np.einsum("eij,ej->ei", mesh.rot3d(ang[v0]), U[v0] - U[v1])
    C = data["Constraints"]
    fit = np.where(C[:, :1] >= -999999.9, 2.0 * (off - C), 0.0)
    np.testing.assert_allclose(plan.residuals(x), np.concatenate([fit.T.ravel(), reg.T.ravel()]),
                               rtol=1e-13, atol=1e-13)


def test_arap_mesh_lm_decreases_and_meets_handles():
    r = mesh.run_arap((8, 8), outer_steps=2, lm_iterations=15, pcg_max_iterations=50)
    assert r["finite"] and r["monotone_accepted_costs"]
    # soft constraints (w_fit = 4, w_reg = 1 as in [R]): the handles move by >= 2 units (top
    # ring: shift 2 plus a 60 degree twist); they must end within 10% of that
    V, _, _, handles, targets = mesh.arap_setup(8, 8)
    move = np.linalg.norm(targets - V[handles], axis=1).max()
    assert move >= 2 and r["handle_max_err"] < 0.1 * move
    for res in r["results"]:
        assert res.cost < res.initial_cost


def test_arap_mesh_rigid_motion_has_zero_cost():
    """Moving every handle by one rigid motion: the exact solution is that motion with the
    rotation as Euler angles; LM from the rest shape gets the cost to ~0."""
    plan, data, _ = mesh.arap_plan(6, 6)
    V = data["UrShape"]
    ang = np.array([0.2, -0.1, 0.3])
    R = mesh.rot3d(ang)
    moved = V @ R.T + np.array([0.5, -0.2, 0.1])
    C = data["Constraints"].copy()
    h = C[:, 0] > -999999.9
    C[h] = moved[h]
    plan.set_array("Constraints", C)
    x_exact = plan.unknowns_to_vector({"Offset": moved, "Angle": np.tile(ang, (len(V), 1))})
    assert plan.cost(x_exact) < 1e-20
    res = solve(plan, plan.x0, method="lm", max_iterations=50, pcg_max_iterations=200)
    assert res.cost < 1e-10 * res.initial_cost


def test_laplacian_mesh_equals_direct_solve():
    """AE-2 (mesh version): one GN step with PCG to 1e-12 equals spsolve (max abs <= 1e-9)."""
    r = mesh.run_laplacian((6, 7))
    assert r["max_abs_diff_direct"] <= 1e-9
    assert r["cost"] < r["initial_cost"]


def test_mesh_edges_both_directions():
    V, tris = mesh.tube_mesh(4, 5)
    v0, v1 = mesh.directed_edges(tris)
    pairs = set(zip(v0.tolist(), v1.tolist()))
    assert all((b, a) in pairs for a, b in pairs) and len(pairs) == len(v0)
    # every vertex of a closed tube ring has 4 to 6 neighbours
    deg = np.bincount(v0, minlength=len(V))
    assert deg.min() >= 3 and deg.max() <= 6
