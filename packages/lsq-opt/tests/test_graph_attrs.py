"""Per-edge data on graphs (``Graph(..., attrs=...)``, read as ``G.w``) and the ordinary names of
math functions and comparisons."""
import numpy as np
import pytest
import lsq_opt
from lsq_opt import (Array, Dim, Energy, Graph, LsqCompileError, Select, Unknown, compile_problem,
                     sqrt)
from lsq_opt.testing import fd_jacobian, rel_check

N = Dim("N")
V0 = np.array([0, 1, 2, 3, 4, 0, 2])
V1 = np.array([1, 2, 3, 4, 5, 5, 5])


def spring_energy():
    """Weighted springs with per-edge rest vectors: w_e ((x_v0 - x_v1) - rest_e), plus a fit."""
    X, A = Unknown("X", N, 2), Array("A", N, 2)
    G = Graph("G", v0=N, v1=N, attrs={"w": 1, "rest": 2})
    d = X(G.v0) - X(G.v1)
    length = sqrt(d[0] * d[0] + d[1] * d[1])
    return Energy(0.5 * (X(0) - A(0)), G.w * (d - G.attr("rest")), G.w * length ** 1.5)


def bound(rng, E=len(V0)):
    return {"v0": V0[:E], "v1": V1[:E], "w": rng.uniform(0.5, 2.0, E), "rest": rng.normal(size=(E, 2))}


@pytest.mark.parametrize("kernels", ["fused", "lanes"])
def test_edge_weighted_energy_residuals_jacobian_and_jtjp(kernels):
    rng = np.random.default_rng(3)
    A = rng.normal(size=(6, 2))
    g = bound(rng)
    backend = "llvm" if kernels == "fused" else "numpy"
    plan = compile_problem(spring_energy(), arrays={"A": A}, graphs={"G": g}, kernels=kernels,
                           backend=backend)
    x = rng.normal(size=plan.n)
    X = x.reshape(6, 2)
    d = X[g["v0"]] - X[g["v1"]]
    ref = np.concatenate([(0.5 * (X - A)).T.ravel(), (g["w"][:, None] * (d - g["rest"])).T.ravel(),
                          g["w"] * np.linalg.norm(d, axis=1) ** 1.5])
    rel_check(plan.residuals(x), ref, rel=1e-12)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x), rel=1e-6)
    p = rng.normal(size=plan.n)
    rel_check(plan.jtjp(x, p), J.T @ (J @ p), rel=1e-10)
    rel_check(plan.jtf(x), J.T @ plan.residuals(x), rel=1e-10)
    rel_check(plan.jtj_diag(x), np.sum(J * J, axis=0), rel=1e-10)
    # the weights are data: rebinding them changes the residuals (no stale copy in the plan)
    plan2 = compile_problem(spring_energy(), arrays={"A": A}, graphs={"G": dict(g, w=2 * g["w"])},
                            kernels=kernels, backend=backend)
    assert np.allclose(plan2.residuals(x)[12:], 2 * plan.residuals(x)[12:])


def test_terms_reading_different_slots_and_attributes_of_one_graph():
    """The graph's bound slots are those of every term on it (the first term here reads neither
    the attribute nor v1)."""
    X = Unknown("X", N)
    G = Graph("G", v0=N, v1=N, attrs={"w": 1})
    e = Energy(2.0 * X(G.v0), G.w * (X(G.v0) + X(G.v1)))
    w = np.array([2.0, 3.0])
    plan = compile_problem(e, sizes={"N": 3}, graphs={"G": {"v0": V0[:2], "v1": V1[:2], "w": w}})
    x = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(plan.residuals(x), [2.0, 4.0, 2.0 * 3.0, 3.0 * 6.0], rtol=1e-15)


def test_missing_attribute_names_graph_attribute_and_shape():
    g = bound(np.random.default_rng(0))
    del g["rest"]
    with pytest.raises(LsqCompileError, match=r"graph 'G': edge attribute 'rest' is read by the energy "
                                              r"but not bound .*shape \(7, 2\)"):
        compile_problem(spring_energy(), arrays={"A": np.zeros((6, 2))}, graphs={"G": g})


@pytest.mark.parametrize("name, shape, expected", [("w", (6,), r"\(7,\)"), ("rest", (7,), r"\(7, 2\)"),
                                                   ("rest", (7, 3), r"\(7, 2\)")])
def test_misshaped_attribute_names_expected_shape(name, shape, expected):
    g = bound(np.random.default_rng(0))
    g[name] = np.ones(shape)
    with pytest.raises(ValueError, match=rf"graph 'G': edge attribute '{name}' has shape "
                                         rf"\({shape[0]},.*expected {expected}.*'v0' has 7 edges"):
        compile_problem(spring_energy(), arrays={"A": np.zeros((6, 2))}, graphs={"G": g})


def test_graph_attribute_declaration_errors():
    G = Graph("G", v0=N, v1=N, attrs={"w": 1})
    with pytest.raises(AttributeError, match="no edge attribute 'weight'; declared attributes: \\['w'\\]"):
        G.attr("weight")
    with pytest.raises(AttributeError, match="no vertex slot or edge attribute 'v2'"):
        G.v2  # noqa: B018
    with pytest.raises(ValueError, match="'v0' is both a vertex slot and an edge attribute"):
        Graph("H", v0=N, attrs={"v0": 1})
    X = Unknown("X", N)
    with pytest.raises(LsqCompileError, match="graph 'G' is read by the energy but not bound"):
        compile_problem(Energy(G.w * (X(G.v0) - X(G.v1))), sizes={"N": 3})


def test_ordinary_math_names_and_comparison_operators():
    X = Unknown("X", N, 2)
    A = Array("A", N, 2)
    # abs via lsq_opt.abs and the builtin; Vec comparisons as Python operators
    e = Energy(Select(X(0) >= A(0), lsq_opt.abs(X(0) - A(0)) ** 1.5, abs(X(0) - A(0))))
    a = np.array([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    plan = compile_problem(e, arrays={"A": a})
    x = np.array([1.0, 0.0, 1.0, 1.0, 0.25, 0.5])
    X_ = x.reshape(3, 2)
    diff = np.abs(X_ - a)
    ref = np.where(X_ >= a, diff ** 1.5, diff)
    np.testing.assert_allclose(plan.residuals(x), ref.T.ravel(), rtol=1e-14)
    assert lsq_opt.abs is lsq_opt.abs_
