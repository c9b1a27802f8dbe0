"""The fused LLVM kernels (default ``kernels="fused"``) against the numpy oracle
(``kernels="lanes"``: per-term lane kernels composed with numpy) and against the materialised J.

Every product (cost, J^T F, diag(J^T J), J^T J p) is compared in float64 to 1e-12 relative
(the two paths sum the same terms in a different order; differences are rounding only) and in
float32 to 1e-4 (spec AE-1). Energies cover: 2-D stencils with default masks and InBounds,
Index leaves, multi-channel unknowns, Exclude, a 3-D grid, a 1-D domain mixed with graph
terms, hyperedges with repeated vertices, non-square sizes that are not multiples of the
vector width."""

import numpy as np
import pytest
from lsq_opt import (
    Array, Dim, Energy, Exclude, Graph, InBounds, Index, Not, Param, Select, Unknown,
    compile_problem, cos, eq, sin, solve,
)
from lsq_opt.examples import arap as arap_example


def _energies(rng):
    """(name, energy, kwargs) of compile_problem for each case."""
    out = []
    W, H = Dim("W"), Dim("H")
    # nonlinear 2-channel with default masks, params, asymmetric stencil, odd sizes
    Y = Unknown("Y", (W, H), 2)
    B = Array("B", (W, H), 2)
    k = Param("k")
    e = Energy(sin(Y(0, 0)) - B(0, 0),
               (Y(2, 0)[0] * Y(0, -1)[1] - B(0, 0)[1]) * k,
               cos(Y(0, 0)[1] * 0.5) * Y(-1, 1)[0] - k)
    out.append(("sinexp", e, dict(arrays={"B": rng.random((19, 11, 2))}, params={"k": 0.7})))
    # InBounds + Index + Select
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    e = Energy(Select(InBounds(1, 0), X(0, 0) - X(1, 0) * (1 + 0.01 * Index(0)), X(0, 0) * 0.5),
               Select(InBounds(0, -2), X(0, 0) * X(0, -2) - A(0, 0), 0.0),
               (X(0, 0) - A(0, 0)) * (0.1 + 0.02 * Index(1)))
    out.append(("inbounds_index", e, dict(arrays={"A": rng.random((13, 10))})))
    # ARAP image warping with Exclude (the example's energy)
    ii, jj = np.meshgrid(np.arange(21), np.arange(14), indexing="ij")
    ur = np.stack([ii, jj], -1).astype(float)
    cons = np.where(rng.random((21, 14, 1)) < 0.2, ur + rng.normal(size=(21, 14, 2)), -1.0)
    mask = (rng.random((21, 14)) < 0.3).astype(float)
    out.append(("arap", arap_example.energy(True),
                dict(arrays={"UrShape": ur, "Constraints": cons, "Mask": mask},
                     params={"w_fitSqrt": 3.0, "w_regSqrt": 1.0})))
    # Poisson-like with Exclude
    M = Array("M", (W, H))
    T = Array("T", (W, H))
    terms = [Select(InBounds(dx, dy), (X(0, 0) - X(dx, dy)) - (T(0, 0) - T(dx, dy)), 0)
             for dx, dy in [(1, 0), (-1, 0), (0, 1), (0, -1)]]
    out.append(("poisson", Energy(*terms, Exclude(Not(eq(M(0, 0), 0)))),
                dict(arrays={"T": rng.random((23, 9)), "M": (rng.random((23, 9)) < 0.4) * 1.0,
                             "X": rng.random((23, 9))})))
    # 3-D grid
    D = Dim("D")
    V = Unknown("V", (W, H, D))
    Vd = Array("Vd", (W, H, D))
    e = Energy(V(0, 0, 0) - Vd(0, 0, 0), V(0, 0, 0) - V(1, 0, 0), V(0, 0, 0) - V(0, 1, 0),
               sin(V(0, 0, 0)) - V(0, 0, -1))
    out.append(("grid3d", e, dict(arrays={"Vd": rng.random((5, 7, 4))})))
    # mesh-like: 1-D domain stencil terms + graph terms with repeated vertices
    N = Dim("N")
    P = Unknown("P", N, 3)
    Q = Unknown("Q", N)
    C = Array("C", N, 3)
    G = Graph("G", ["a", "b", "c"], N)
    w = Param("w")
    e = Energy(w * (P(0) - C(0)),
               (P(G.a) - P(G.b)) * cos(Q(G.a)) - (C(G.a) - C(G.c)) * Q(G.c),
               sin(Q(G.a) * Q(G.b)) - P(G.c, 1))
    n_v, n_e = 37, 90
    gr = {s: rng.integers(0, n_v, n_e) for s in "abc"}
    gr["b"][:10] = gr["a"][:10]  # the same vertex through two slots
    out.append(("mesh", e, dict(arrays={"C": rng.normal(size=(n_v, 3))}, params={"w": 2.0},
                                graphs={"G": gr})))
    # the same with some vertices' unknowns excluded (held at their values)
    M = Array("M", N)
    out.append(("mesh_exclude", Energy(e, Exclude(Not(eq(M(0), 0)))),
                dict(arrays={"C": rng.normal(size=(n_v, 3)), "M": (rng.random(n_v) < 0.3) * 1.0},
                     params={"w": 2.0}, graphs={"G": gr})))
    return out


CASES = [c[0] for c in _energies(np.random.default_rng(0))]


def _pair(name, dtype):
    rng = np.random.default_rng(1)
    case = {c[0]: c for c in _energies(rng)}[name]
    _, e, kw = case
    fused = compile_problem(e, dtype=dtype, **kw)
    lanes = compile_problem(e, dtype=dtype, kernels="lanes", **kw)
    assert fused.kernels == "fused" and lanes.kernels == "lanes"
    return fused, lanes


@pytest.mark.parametrize("name", CASES)
def test_fused_equals_oracle_float64(name):
    fused, lanes = _pair(name, np.float64)
    rng = np.random.default_rng(2)
    x = fused.x0 + rng.normal(scale=0.3, size=fused.n)
    p = rng.normal(size=fused.n)
    J = lanes.jacobian(x)
    F = lanes.residuals(x)
    assert fused.cost(x) == pytest.approx(lanes.cost(x), rel=1e-12)
    assert fused.cost(x) == pytest.approx(0.5 * F @ F, rel=1e-12)
    np.testing.assert_allclose(fused.jtf(x), lanes.jtf(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fused.jtf(x), J.T @ F, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fused.jtj_diag(x), lanes.jtj_diag(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fused.jtj_diag(x), np.asarray(J.multiply(J).sum(0)).ravel(),
                               rtol=1e-12, atol=1e-12)
    jtjp = fused.jtjp(x, p)
    np.testing.assert_allclose(jtjp, lanes.jtjp(x, p), rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(jtjp, J.T @ (J @ p), rtol=1e-12, atol=1e-11)
    q = rng.normal(size=fused.n)  # symmetry (AE-1)
    assert q @ jtjp == pytest.approx(p @ fused.jtjp(x, q), rel=1e-12)
    # a second x (cache keyed on the value of x)
    x2 = x + 0.1
    np.testing.assert_allclose(fused.jtf(x2), lanes.jtf(x2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fused.jtjp(x2, p), lanes.jtjp(x2, p), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("name", ["sinexp", "arap", "mesh"])
def test_fused_equals_oracle_float32(name):
    fused, lanes = _pair(name, np.float32)
    rng = np.random.default_rng(3)
    x = (fused.x0 + rng.normal(scale=0.3, size=fused.n)).astype(np.float32)
    p = rng.normal(size=fused.n).astype(np.float32)
    assert fused.jtf(x).dtype == np.float32 and fused.jtjp(x, p).dtype == np.float32
    assert fused.cost(x) == pytest.approx(lanes.cost(x), rel=1e-4)
    for a, b in [(fused.jtf(x), lanes.jtf(x)), (fused.jtj_diag(x), lanes.jtj_diag(x)),
                 (fused.jtjp(x, p), lanes.jtjp(x, p))]:
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


def test_fused_follows_params_arrays_and_fixed_values():
    rng = np.random.default_rng(4)
    fused, lanes = _pair("arap", np.float64)
    x = fused.x0 + rng.normal(scale=0.1, size=fused.n)
    p = rng.normal(size=fused.n)
    fused.jtjp(x, p)
    for plan in (fused, lanes):
        plan.set_param("w_regSqrt", 2.5)
        plan.set_array("UrShape", plan.data["UrShape"][..., :] * 1.1)
    assert fused.cost(x) == pytest.approx(lanes.cost(x), rel=1e-12)
    np.testing.assert_allclose(fused.jtjp(x, p), lanes.jtjp(x, p), rtol=1e-12, atol=1e-11)
    f2, l2 = _pair("poisson", np.float64)
    x = f2.x0.copy()
    c0 = f2.cost(x)
    new = {"X": np.full((23, 9), 3.0)}  # new fixed (excluded) values change the cost
    xf, xl = f2.unknowns_to_vector(new), l2.unknowns_to_vector(new)
    assert f2.cost(xf) == pytest.approx(l2.cost(xl), rel=1e-12) and f2.cost(xf) != c0


def test_fused_nonfinite_cost():
    W, H = Dim("W"), Dim("H")
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    A_ = np.random.default_rng(5).random((9, 6))
    A_[2, 3] = np.nan
    plan = compile_problem(Energy(X(0, 0) - A(0, 0), X(0, 0) - X(1, 0)), arrays={"A": A_})
    assert np.isnan(plan.cost(np.zeros(plan.n)))
    with pytest.raises(ValueError, match="initial cost is not finite"):
        solve(plan, np.zeros(plan.n))


def test_fused_solve_matches_oracle_iterates():
    """LM on ARAP: fused and oracle plans give the same per-iteration costs."""
    fused, lanes = _pair("arap", np.float64)
    kw = dict(method="lm", max_iterations=6, pcg_max_iterations=20)
    rf = solve(fused, fused.x0, **kw)
    rl = solve(lanes, lanes.x0, **kw)
    np.testing.assert_allclose([e.cost for e in rf.log], [e.cost for e in rl.log], rtol=1e-9)


def test_bad_kernels_option():
    W = Dim("W")
    X = Unknown("X", W)
    with pytest.raises(ValueError, match="kernels must be"):
        compile_problem(Energy(X(0) - 1.0), sizes={"W": 3}, kernels="gpu")
    with pytest.raises(ValueError, match="backend must be"):
        compile_problem(Energy(X(0) - 1.0), sizes={"W": 3}, backend="opencl")


def test_graph_terms_split_over_threads_by_their_own_edge_counts(monkeypatch):
    """Each graph term runs on as many threads as its edge count allows; the private per-thread
    outputs summed are only those some term wrote. A large and a small term (one split over
    two threads, one not) give the lanes oracle's products and gradient."""
    import lsq_opt._compiler.fused as fused_module

    monkeypatch.setattr(fused_module, "_MIN_LANES_PER_THREAD", 64)
    monkeypatch.setattr(fused_module.codegen, "num_threads", lambda *a: 2)
    N = Dim("N")
    X, A = Unknown("X", (N,), 2), Array("A", (N,), 2)
    big, small = Graph("Big", v0=N, v1=N), Graph("Small", v0=N, v1=N)
    n = 300
    rng = np.random.default_rng(7)
    e_big = rng.integers(0, n, (2, 400))
    e_small = rng.integers(0, n, (2, 50))
    energy = Energy(X(0) - A(0), 0.7 * (X(big.v0) - X(big.v1)) * (X(big.v0)[0] + 2.0),
                    X(small.v0) * X(small.v1)[1] - 0.1)
    plan = compile_problem(energy, arrays={"A": rng.standard_normal((n, 2))},
                           graphs={"Big": {"v0": e_big[0], "v1": e_big[1]},
                                   "Small": {"v0": e_small[0], "v1": e_small[1]}})
    x = rng.standard_normal(plan.n)
    p = rng.standard_normal(plan.n)
    assert plan.fused.graph.threads == 2
    np.testing.assert_allclose(plan.fused.jtjp(x, p), plan.jtjp_lanes(x, p), rtol=1e-12, atol=1e-12)
    g, dg = plan.fused.grad(x)
    np.testing.assert_allclose(g, plan.jtf_lanes(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dg, plan.jtj_diag_lanes(x), rtol=1e-12, atol=1e-12)


def test_graph_plan_products_move_whole_unknowns_by_strided_copies():
    """A graph plan's 1-D domain holding whole free unknowns copies p in and out by strided
    views (``_GridDomain.blocks``); with exclusions it falls back to the index maps. Both give
    J^T J p (the cases above check the values)."""
    plain, _ = _pair("mesh", np.float64)
    excluded, _ = _pair("mesh_exclude", np.float64)
    blocks = plain.fused.grids[0].blocks
    assert [(sl.start, sl.stop, ch) for sl, _, ch in blocks] == [(0, 111, 3), (111, 148, 1)]
    assert excluded.fused.grids[0].blocks is None and excluded.n < excluded.n_full
