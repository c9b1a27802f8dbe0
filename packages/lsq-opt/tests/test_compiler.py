"""Compiler tests: F, J^T F, diag(J^T J), J^T J p and the sparse J of compiled plans, checked
against finite differences, against each other, across backends and dtypes.

Convention tested: cost = 1/2 sum r^2, gradient J^T F, Gauss-Newton matrix J^T J (spec 10.1;
the paper's E = sum r^2 has 2 J^T F and 2 J^T J)."""

import numpy as np
from lsq_opt.testing import fd_jacobian, rel_check
from lsq_opt.examples import arap as arap_example
import pytest
from core_ad import sym
from lsq_opt._compiler import compile_problem
from lsq_opt._language import (
    Array,
    Dim,
    Energy,
    Exclude,
    Graph,
    InBounds,
    Not,
    Param,
    Select,
    Unknown,
    eq,
    exp,
    sin,
)

BACKENDS = ["llvm", "numpy"]
W_, H_ = 17, 13
NBRS = [(1, 0), (-1, 0), (0, 1), (0, -1)]


# ----------------------------------------------------------------------------- energies
def laplacian_energy(offsets=((1, 0), (0, 1))):
    """Spec 3.1 (Fig. 3): fit = w_fit (X - A), reg = w_reg (X(0,0) - X(dx,dy))."""
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    terms = [w_fit * (X(0, 0) - A(0, 0))]
    for dx, dy in offsets:
        terms.append(w_reg * (X(0, 0) - X(dx, dy)))
    return Energy(*terms)


def arap_energy(exclude=False):
    """Spec 3.3 ARAP image warping (Fig. 24): the example's energy, the one definition."""
    return arap_example.energy(exclude)


def arap_data(rng, mask_frac=0.0):
    ii, jj = np.meshgrid(np.arange(W_), np.arange(H_), indexing="ij")
    ur = np.stack([ii, jj], -1).astype(float)
    cons = np.where(rng.random((W_, H_, 1)) < 0.2, ur + rng.normal(size=(W_, H_, 2)), -1.0)
    mask = (rng.random((W_, H_)) < mask_frac).astype(float)
    return {"UrShape": ur, "Constraints": cons, "Mask": mask}


def sin_exp_energy():
    """A simple nonlinear 2-channel energy with vector residuals and default masking."""
    W, H = Dim("W"), Dim("H")
    Y = Unknown("Y", (W, H), 2)
    B = Array("B", (W, H), 2)
    k = Param("k")
    return Energy(
        sin(Y(0, 0)) - B(0, 0),
        exp(Y(1, 0) * 0.3) * Y(0, 0)[1] - Y(0, 1) * k,
        (Y(0, 0)[0] * Y(-1, 1)[1] - B(0, 0)[1]) * k,
    )


def build(kind, rng, backend="llvm", dtype=np.float64):
    if kind == "laplacian":
        return compile_problem(
            laplacian_energy(), arrays={"A": rng.random((W_, H_))},
            params={"w_fit": 0.1, "w_reg": 0.9}, backend=backend, dtype=dtype)
    if kind == "laplacian4":
        return compile_problem(
            laplacian_energy(NBRS), arrays={"A": rng.random((W_, H_))},
            params={"w_fit": 0.1, "w_reg": 0.9}, backend=backend, dtype=dtype)
    if kind == "arap":
        return compile_problem(
            arap_energy(), arrays=arap_data(rng, 0.15),
            params={"w_fitSqrt": 10.0, "w_regSqrt": 0.1}, backend=backend, dtype=dtype)
    if kind == "sinexp":
        return compile_problem(
            sin_exp_energy(), arrays={"B": rng.random((W_, H_, 2))}, params={"k": 0.7},
            backend=backend, dtype=dtype)
    raise ValueError(kind)


def scaled_check(a, b, scale, rel=1e-6):
    """|a - b| <= rel * scale elementwise, scale = the same product over |J| (the FD error bound
    of a product of the FD Jacobian: entry errors <= rel |J_ij|)."""
    err = np.abs(np.asarray(a) - np.asarray(b))
    assert np.all(err <= rel * scale + 1e-12), np.max(err / (scale + 1e-300))


def x_random(plan, rng):
    return plan.x0 + rng.normal(scale=0.5, size=plan.n)


# ----------------------------------------------------------------------------- AE-1
@pytest.mark.parametrize("kind", ["laplacian", "arap", "sinexp"])
def test_ae1_against_finite_differences(kind):
    rng = np.random.default_rng(1)
    plan = build(kind, rng)
    x = x_random(plan, rng)
    F = plan.residuals(x)
    Jfd = fd_jacobian(plan, x)
    J = plan.jacobian(x)
    assert J.shape == (plan.m, plan.n)
    rel_check(J.toarray(), Jfd)
    assert plan.cost(x) == pytest.approx(0.5 * float(F @ F), rel=1e-14)
    aJ = np.abs(Jfd)
    scaled_check(plan.jtf(x), Jfd.T @ F, aJ.T @ np.abs(F))
    scaled_check(plan.jtj_diag(x), (Jfd * Jfd).sum(0), (aJ * aJ).sum(0))
    p = rng.normal(size=plan.n)
    scaled_check(plan.jtjp(x, p), Jfd.T @ (Jfd @ p), aJ.T @ (aJ @ np.abs(p)))
    # the FD check must be able to fail: a perturbed J is rejected
    with pytest.raises(AssertionError):
        rel_check(J.toarray() * (1 + 1e-4), Jfd)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["laplacian4", "arap", "sinexp"])
def test_matrix_free_equals_materialised(kind, backend):
    rng = np.random.default_rng(2)
    plan = build(kind, rng, backend)
    x = x_random(plan, rng)
    J = plan.jacobian(x)
    F = plan.residuals(x)
    p, q = rng.normal(size=plan.n), rng.normal(size=plan.n)
    np.testing.assert_allclose(plan.jtf(x), J.T @ F, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jtjp(x, p), J.T @ (J @ p), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jtj_diag(x), np.asarray(J.multiply(J).sum(0)).ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jp(x, p), J @ p, rtol=1e-12, atol=1e-12)
    # symmetry of J^T J
    a, b = q @ plan.jtjp(x, p), p @ plan.jtjp(x, q)
    assert abs(a - b) <= 1e-12 * max(1.0, abs(a))


@pytest.mark.parametrize("kind", ["laplacian4", "arap", "sinexp"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_llvm_vs_numpy(kind, dtype, tol):
    rng = np.random.default_rng(3)
    pl = build(kind, np.random.default_rng(7), "llvm", dtype)
    pn = build(kind, np.random.default_rng(7), "numpy", dtype)
    assert pl.n == pn.n
    x = x_random(pl, rng).astype(dtype)
    p = rng.normal(size=pl.n).astype(dtype)
    for name, a, b in [
        ("F", pl.residuals(x), pn.residuals(x)),
        ("jtf", pl.jtf(x), pn.jtf(x)),
        ("diag", pl.jtj_diag(x), pn.jtj_diag(x)),
        ("jtjp", pl.jtjp(x, p), pn.jtjp(x, p)),
    ]:
        assert a.dtype == dtype, name
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=name)
    assert pl.cost(x) == pytest.approx(pn.cost(x), rel=tol)


def test_float32_close_to_float64():
    rng = np.random.default_rng(4)
    p64 = build("arap", np.random.default_rng(8), "llvm", np.float64)
    p32 = build("arap", np.random.default_rng(8), "llvm", np.float32)
    x = x_random(p64, rng)
    g64, g32 = p64.jtf(x), p32.jtf(x.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, g64, rtol=1e-3, atol=1e-3 * np.abs(g64).max())


# ----------------------------------------------------------------------------- CA-SYM-6
@pytest.mark.parametrize("backend", BACKENDS)
def test_ca_sym6_interior_diagonal(backend):
    """Fig. 3 energy, w_fit = .1, w_reg = .9, 1/2 sum r^2 convention: diag(J^T J) at an interior
    pixel = 0.1^2 + 4 * 0.9^2 = 3.25 (the paper's E = sum r^2 doubles it to 6.5)."""
    rng = np.random.default_rng(5)
    plan = build("laplacian", rng, backend)
    x = x_random(plan, rng)
    d = plan.jtj_diag(x).reshape(W_, H_)
    assert d[5, 5] == pytest.approx(3.25, rel=1e-14)
    assert np.allclose(d[1:-1, 1:-1], 3.25)
    # corner (0,0): fit + h_00 + v_00 -> 0.01 + 2*0.81 ; corner (W-1,H-1): fit + h_{-1} + v_{-1}
    assert d[0, 0] == pytest.approx(0.01 + 2 * 0.81)
    assert d[-1, -1] == pytest.approx(0.01 + 2 * 0.81)
    assert d[0, 5] == pytest.approx(0.01 + 3 * 0.81)
    # J^T J p for p = e_q: interior column = 3.25 at q, -0.81 at the 4 neighbours
    q = 5 * H_ + 6
    e = np.zeros(plan.n)
    e[q] = 1
    col = plan.jtjp(x, e).reshape(W_, H_)
    assert col[5, 6] == pytest.approx(3.25)
    for i, j in [(4, 6), (6, 6), (5, 5), (5, 7)]:
        assert col[i, j] == pytest.approx(-0.81)
    assert np.count_nonzero(np.abs(col) > 1e-14) == 5


def test_default_boundary_mask():
    """A residual reading X(1,0) is dropped on the last row of axis 0 (spec 2.6 default)."""
    rng = np.random.default_rng(6)
    plan = build("laplacian", rng)
    x = x_random(plan, rng)
    F = plan.residuals(x)
    L = W_ * H_
    h = F[L: 2 * L].reshape(W_, H_)
    v = F[2 * L: 3 * L].reshape(W_, H_)
    X = x.reshape(W_, H_)
    assert np.all(h[-1, :] == 0) and np.all(v[:, -1] == 0)
    np.testing.assert_allclose(h[:-1], 0.9 * (X[:-1] - X[1:]), rtol=1e-14)
    np.testing.assert_allclose(v[:, :-1], 0.9 * (X[:, :-1] - X[:, 1:]), rtol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inbounds_custom_rule(backend):
    """Select(InBounds(1,0), t, 0) equals the default mask; InBounds(0,0) disables the mask and
    an out-of-bounds read then yields 0 (spec 10.3)."""
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H))
    rng = np.random.default_rng(9)
    t = 0.9 * (X(0, 0) - X(1, 0))
    e_def = compile_problem(Energy(t), sizes={"W": 6, "H": 5}, backend=backend)
    e_sel = compile_problem(Energy(Select(InBounds(1, 0), t, 0)), sizes={"W": 6, "H": 5}, backend=backend)
    e_all = compile_problem(Energy(Select(InBounds(0, 0), t, 0)), sizes={"W": 6, "H": 5}, backend=backend)
    x = rng.normal(size=30)
    np.testing.assert_array_equal(e_def.residuals(x), e_sel.residuals(x))
    np.testing.assert_array_equal(e_def.jtf(x), e_sel.jtf(x))
    F = e_all.residuals(x).reshape(6, 5)
    np.testing.assert_allclose(F[-1], 0.9 * x.reshape(6, 5)[-1], rtol=1e-14)
    J = e_all.jacobian(x)
    np.testing.assert_allclose(e_all.jtf(x), J.T @ e_all.residuals(x), rtol=1e-13)
    Jfd = fd_jacobian(e_all, x)
    rel_check(J.toarray(), Jfd)


# ----------------------------------------------------------------------------- graphs
def grid_edges(W, H, off):
    ii, jj = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")
    ok = (ii + off[0] < W) & (jj + off[1] < H) & (ii + off[0] >= 0) & (jj + off[1] >= 0)
    a = np.stack([ii[ok], jj[ok]], -1)
    b = a + np.array(off)
    return a, b


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_equals_stencil(backend):
    """Implicit (stencil) vs explicit (graph) connectivity, AE-4's core: the Fig. 3 energy on a
    grid equals the Fig. 5 mesh Laplacian on the grid graph (fit per vertex over {N}, reg per
    edge), in cost, J^T F, diag and J^T J p."""
    rng = np.random.default_rng(10)
    A = rng.random((W_, H_))
    stencil = compile_problem(laplacian_energy(), arrays={"A": A}, params={"w_fit": 0.1, "w_reg": 0.9},
                              backend=backend)
    N = Dim("N")
    X = Unknown("X", N)
    Av = Array("A", N)
    G = Graph("Edges", vertex0=N, vertex1=N)
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    mesh_e = Energy(w_fit * (X(0) - Av(0)), w_reg * (X(G.vertex0) - X(G.vertex1)))
    e0, e1 = [], []
    for off in [(1, 0), (0, 1)]:
        a, b = grid_edges(W_, H_, off)
        e0.append(np.ravel_multi_index(a.T, (W_, H_)))
        e1.append(np.ravel_multi_index(b.T, (W_, H_)))
    perm = rng.permutation(sum(len(e) for e in e0))  # edge order is irrelevant
    graph = {"vertex0": np.concatenate(e0)[perm], "vertex1": np.concatenate(e1)[perm]}
    mesh = compile_problem(mesh_e, arrays={"A": A.ravel()}, params={"w_fit": 0.1, "w_reg": 0.9},
                           graphs={"Edges": graph}, backend=backend)
    assert mesh.n == stencil.n
    x = rng.normal(size=stencil.n)
    p = rng.normal(size=stencil.n)
    assert mesh.cost(x) == pytest.approx(stencil.cost(x), rel=1e-13)
    np.testing.assert_allclose(mesh.jtf(x), stencil.jtf(x), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(mesh.jtj_diag(x), stencil.jtj_diag(x), rtol=1e-12)
    np.testing.assert_allclose(mesh.jtjp(x, p), stencil.jtjp(x, p), rtol=1e-12, atol=1e-13)
    Jm = mesh.jacobian(x)
    np.testing.assert_allclose((Jm.T @ Jm).toarray(), (stencil.jacobian(x).T @ stencil.jacobian(x)).toarray(),
                               atol=1e-13)
    # a wrong graph (one edge dropped) is detected
    bad = {k: v[1:] for k, v in graph.items()}
    mesh_bad = compile_problem(mesh_e, arrays={"A": A.ravel()}, params={"w_fit": 0.1, "w_reg": 0.9},
                               graphs={"Edges": bad}, backend=backend)
    assert not np.allclose(mesh_bad.jtf(x), stencil.jtf(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_on_2d_index_space_nonlinear(backend):
    """Graph reads of a 2-D unknown with (E, 2) coordinates, a nonlinear hyperedge residual with
    3 slots, duplicate vertices across edges: matrix-free products vs J vs finite differences."""
    rng = np.random.default_rng(11)
    W, H = Dim("W"), Dim("H")
    Y = Unknown("Y", (W, H), 2)
    T = Graph("Tri", ["a", "b", "c"], (W, H))
    k = Param("k")
    r = Energy(
        sin(Y(T.a)) * Y(T.b, 1) - Y(T.c) * k,
        Y(T.a, 0) * Y(T.c, 1) - 0.5,
    )
    E = 40
    coords = {s: np.stack([rng.integers(0, 5, E), rng.integers(0, 4, E)], -1) for s in "abc"}
    plan = compile_problem(r, sizes={"W": 5, "H": 4}, params={"k": 1.3}, graphs={"Tri": coords},
                           backend=backend)
    assert plan.n == 5 * 4 * 2 and plan.m == E * 3
    x = rng.normal(size=plan.n)
    J = plan.jacobian(x)
    rel_check(J.toarray(), fd_jacobian(plan, x))
    F = plan.residuals(x)
    p = rng.normal(size=plan.n)
    np.testing.assert_allclose(plan.jtf(x), J.T @ F, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(plan.jtjp(x, p), J.T @ (J @ p), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jtj_diag(x), np.asarray(J.multiply(J).sum(0)).ravel(), rtol=1e-12)


# ----------------------------------------------------------------------------- exclude
@pytest.mark.parametrize("backend", BACKENDS)
def test_exclude_fixes_unknowns(backend):
    """Poisson (spec 3.6): Exclude(M != 0) -> those pixels are not in x and keep their values;
    the energy is unchanged (J over the free columns = the full J restricted)."""
    rng = np.random.default_rng(12)
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H), 4)
    T = Array("T", (W, H), 4)
    M = Array("M", (W, H))
    terms = []
    for x_, y_ in NBRS:
        e = (X(0, 0) - X(x_, y_)) - (T(0, 0) - T(x_, y_))
        terms.append(Select(InBounds(x_, y_), e, 0))
    M_ = (rng.random((9, 7)) < 0.6).astype(float)
    X0 = rng.random((9, 7, 4))
    data = {"T": rng.random((9, 7, 4)), "M": M_, "X": X0}
    free_data = {k: data[k] for k in ("T", "X")}  # the free energy does not read M
    free_plan = compile_problem(Energy(*terms), arrays=free_data, backend=backend)
    ex_plan = compile_problem(Energy(*terms, Exclude(Not(eq(M(0, 0), 0)))), arrays=data, backend=backend)
    n_free = int((M_ == 0).sum()) * 4
    assert ex_plan.n == n_free and free_plan.n == 9 * 7 * 4
    x = ex_plan.x0 + rng.normal(size=ex_plan.n)
    out = ex_plan.vector_to_unknowns(x)["X"]
    np.testing.assert_array_equal(out[M_ != 0], X0[M_ != 0])  # excluded: unchanged
    assert not np.allclose(out[M_ == 0], X0[M_ == 0])
    xf = free_plan.unknowns_to_vector({"X": out})
    np.testing.assert_allclose(ex_plan.residuals(x), free_plan.residuals(xf), rtol=1e-14)
    assert ex_plan.cost(x) == pytest.approx(free_plan.cost(xf), rel=1e-14)
    cols = np.flatnonzero(np.repeat((M_ == 0).ravel(), 4))
    np.testing.assert_allclose(ex_plan.jtf(x), free_plan.jtf(xf)[cols], rtol=1e-13, atol=1e-13)
    Jf = free_plan.jacobian(xf)[:, cols].toarray()
    np.testing.assert_allclose(ex_plan.jacobian(x).toarray(), Jf, atol=1e-14)
    p = rng.normal(size=ex_plan.n)
    np.testing.assert_allclose(ex_plan.jtjp(x, p), Jf.T @ (Jf @ p), rtol=1e-12, atol=1e-12)
    # round trip
    np.testing.assert_array_equal(ex_plan.unknowns_to_vector(ex_plan.vector_to_unknowns(x)), x)
    # unknowns_to_vector sets new fixed (boundary) values of the excluded unknowns
    X1 = X0 + 1.0
    x1 = ex_plan.unknowns_to_vector({"X": X1})
    np.testing.assert_array_equal(ex_plan.vector_to_unknowns(x1)["X"], X1)
    ex_plan.unknowns_to_vector({"X": X0})
    # one GN step with an exact solve reaches the (linear) optimum: gradient ~ 0
    Jx = ex_plan.jacobian(x).toarray()
    dx = np.linalg.lstsq(Jx, -ex_plan.residuals(x), rcond=None)[0]
    assert np.abs(ex_plan.jtf(x + dx)).max() < 1e-9


def test_exclude_arap_with_mask():
    rng = np.random.default_rng(13)
    data = arap_data(rng, 0.3)
    plan = compile_problem(arap_energy(exclude=True), arrays=data,
                           params={"w_fitSqrt": 10.0, "w_regSqrt": 0.1})
    n_free = int((data["Mask"] == 0).sum()) * 3
    assert plan.n == n_free
    x = x_random(plan, rng)
    rel_check(plan.jacobian(x).toarray(), fd_jacobian(plan, x))


# ----------------------------------------------------------------------------- caching / API
def test_linearisation_cache_and_params():
    rng = np.random.default_rng(14)
    plan = build("sinexp", rng)
    x = x_random(plan, rng)
    g1 = plan.jtf(x)
    x2 = x.copy()
    x2[3] += 0.1
    assert not np.allclose(plan.jtf(x2), g1)  # cache keyed on the value of x
    np.testing.assert_array_equal(plan.jtf(x), g1)
    c = plan.cost(x)
    plan.set_param("k", 0.2)
    assert plan.cost(x) != c
    u = plan.vector_to_unknowns(x)
    assert u["Y"].shape == (W_, H_, 2)
    np.testing.assert_array_equal(plan.unknowns_to_vector(u), x)


def test_nonfinite_cost_is_reported():
    rng = np.random.default_rng(15)
    A = rng.random((W_, H_))
    A[3, 4] = np.nan
    plan = compile_problem(laplacian_energy(), arrays={"A": A}, params={"w_fit": 0.1, "w_reg": 0.9})
    assert np.isnan(plan.cost(np.zeros(plan.n)))
    ok = build("laplacian", rng)
    x = np.zeros(ok.n)
    x[0] = np.inf
    assert not np.isfinite(ok.cost(x))


def test_sym_leaves_are_the_stencil_reads():
    """Residuals are plain core_ad expressions whose leaves are the stencil reads."""
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H))
    r = X(0, 0) - X(1, 0)
    leaves = sym.free_leaves(r, "X")
    assert {lf.key[1] for lf in leaves} == {(0, 0), (1, 0)}
    assert sym.diff(r, X(1, 0)) is sym.const(-1.0) or float(sym.evaluate(sym.diff(r, X(1, 0)), {})) == -1.0


@pytest.mark.parametrize("exponent", [0.25, -0.25, 0.5, -0.5, 0.75, -0.75, 1.5, -1.5])
def test_fractional_powers_become_roots_with_equal_values(exponent):
    """pow(x, c) for c in +-{1/4, 1/2, 3/4, 3/2} compiles as sqrt (twice for quarters) and an
    integer power, the same function to rounding; other exponents stay pow."""
    from lsq_opt._compiler import _roots_for_fractional_powers

    x = sym.var("x")
    e = (x * x + 0.5) ** exponent
    r = _roots_for_fractional_powers(e)
    assert not [n for n in sym.calls([r], "pow") if float(n.args[1].value) != round(float(n.args[1].value))]
    xs = np.random.default_rng(0).uniform(-3.0, 3.0, 200)
    (want,), (got,) = (sym.compile([f], [x], backend="numpy")(xs) for f in (e, r))
    np.testing.assert_allclose(got, want, rtol=4e-16 * 8)
    for keep in (x ** 0.3, x ** 1.25, x ** 2.0, x ** x):
        assert _roots_for_fractional_powers(keep) is keep


@pytest.mark.parametrize("backend", ["llvm", "numpy"])
def test_charbonnier_roots_against_finite_differences(backend):
    """A Charbonnier-type term (d (d^2 + eps^2)^-1/4) and a root of a root: residuals equal the
    numpy formula, J equals 4-point central differences (float64, rel 1e-6), the products
    J^T J p and J^T F equal the materialised J's (1e-10), and no fractional pow is left in the
    compiled term or its partials."""
    W, H = Dim("W"), Dim("H")
    X, F = Unknown("X", (W, H)), Array("F", (W, H))
    eps = Param("eps")
    d = X(0, 0) - X(1, 0)
    energy = Energy(X(0, 0) - F(0, 0),
                    Select(InBounds(1, 0), d * (d * d + eps * eps) ** -0.25, 0),
                    ((X(0, 0) * X(0, 0) + 1.0) ** 0.5 + 1.0) ** 0.75)
    rng = np.random.default_rng(1)
    f = rng.normal(size=(6, 5))
    plan = compile_problem(energy, arrays={"F": f, "X": f + 0.1 * rng.normal(size=(6, 5))},
                           params={"eps": 0.3}, backend=backend)
    for t in plan.terms:
        exps = [float(n.args[1].value) for n in sym.calls(list(t.chans) + [p for row in t.partials for p in row], "pow")]
        assert all(v == round(v) for v in exps), exps
    x = plan.x0
    xv = x.reshape(6, 5)
    dd = xv[:-1] - xv[1:]
    want = np.concatenate([(xv - f).ravel(), np.vstack([dd * (dd * dd + 0.09) ** -0.25, np.zeros((1, 5))]).ravel(),
                           ((np.sqrt(xv * xv + 1.0) + 1.0) ** 0.75).ravel()])
    np.testing.assert_allclose(np.sort(plan.residuals(x)), np.sort(want), rtol=1e-13)
    J = plan.jacobian(x).toarray()
    rel_check(J, fd_jacobian(plan, x))
    p = rng.normal(size=plan.n)
    np.testing.assert_allclose(plan.jtjp(x, p), J.T @ (J @ p), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(plan.jtf(x), J.T @ plan.residuals(x), rtol=1e-10, atol=1e-10)
