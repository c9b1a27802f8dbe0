"""core_ad.sym: hash-consing, simplification, symbolic derivatives, Hessians, compilation.

Spec tests CA-SYM-1, -2, -4, -5, -6 and CA-HES-1..4 (docs/design/core-ad.md, "Acceptance
tests"), plus a finite-difference check of every lane-wise differentiable primitive of the
rule table.

Tolerances (float64):
* analytic values: rtol 1e-12 (a few roundings of well-conditioned arithmetic);
* central differences with h = 1e-6 * max(1, |x|): truncation error ~h^2 |f'''| <= 1e-11,
  rounding error ~eps |f| / h <= 1e-9 for |f| <= 10, so rtol 1e-6 with atol 1e-7;
* forward (diff) versus reverse (grad) derivatives: the same rules summed in a different
  order, rtol 1e-12.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

from core_ad import _rules as R
from core_ad import sym
from core_ad._primitives import Primitive, primitives
from core_ad._sym.simplify import FLATTEN_MAX

RTOL = 1e-12


def close(a, b, rtol=RTOL, atol=0.0):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                               rtol=rtol, atol=atol)


@pytest.fixture
def xyz():
    return sym.var("x"), sym.var("y"), sym.var("z")


# --------------------------------------------------------------------------------------------
# hash-consing and simplification


def test_hash_consing_identities(xyz):
    x, y, z = xyz
    assert sym.exp(x) is sym.exp(x)
    assert R.exp(x) is sym.exp(x)  # the rule table's math builds the same node
    assert x + y is y + x
    assert (x + y) + z is x + (y + z)
    assert x * y is y * x
    assert (x * y) * z is x * (y * z)
    assert sym.var("x") is x and sym.var("x", "float32") is not x
    assert sym.leaf("X", (0, 1)) is sym.leaf("X", (0, 1))
    assert sym.leaf("X", (0, 1)) is not sym.leaf("X", (1, 0))
    # `==` is structural identity, eq() the lane-wise comparison
    assert (x + y) == (y + x) and not (x == y)
    assert isinstance(sym.eq(x, y), sym.Expr) and sym.eq(x, y).dtype == np.bool_
    assert {x + y: 1}[y + x] == 1


def test_simplification_identities(xyz):
    x, y, z = xyz
    assert x + 0 is x and 0.0 + x is x
    assert x * 1 is x and 1.0 * x is x
    assert sym.is_const(x * 0, 0) and sym.is_const(0.0 * sym.exp(x), 0)
    assert sym.is_const(x - x, 0)
    assert sym.is_const((x + y) - (y + x), 0)
    assert x / 1 is x
    assert x**1 is x
    assert sym.is_const(x**0, 1)
    assert -(-x) is x
    assert 2 * x + 3 * x is 5 * x
    assert x * x is x**2
    p = x**3
    assert isinstance(p, sym.Apply) and p.prim is R.pow_p and sym.is_const(p.args[1], 3)
    assert sym.is_const(x * x**-1, 1)
    assert (x**2) ** 3 is x**6
    assert x - y is x + (-1) * y  # sub is canonicalised
    assert sym.is_const(sym.exp(sym.const(0.0)), 1.0)  # constant folding
    c = sym.const(2) + 3
    assert sym.is_const(c, 5) and c.weak
    assert sym.where(sym.const(True), x, y) is x and sym.where(x > 0, y, y) is y
    assert sym.astype(x, "float64") is x
    # the constant is collected in front of the sum, the identities hold inside it
    e = (x + 2) + (y + 3) - 5
    assert e is x + y


def _stage(i, coordinate_first):
    """``8 * nx * exp(t)`` over stage ``i``'s own leaves, its operands created in either order."""
    x, t = sym.leaf("loop", (i, "x")), sym.leaf("buf", (i, "theta"))
    if coordinate_first:
        nx = 0.25 * sym.astype(x, "float64") - 0.875
        tv = sym.exp(t)
    else:
        tv = sym.exp(t)
        nx = 0.25 * sym.astype(x, "float64") - 0.875
    return 8.0 * nx * tv, x, t


def test_sums_and_products_that_differ_only_in_their_leaves_are_evaluated_alike():
    """The operand order of an n-ary add / mul depends on structure, not on which operand
    was created first: expressions equal up to their leaves (a bilinear adjoint's k scatters,
    each over its own loop variables) round alike. In creation order, ``(8 nx) t`` and
    ``(8 t) nx`` differ by an ulp, enough for ``floor`` to pick two corners."""
    e1, x1, t1 = _stage(1, coordinate_first=True)
    e2, x2, t2 = _stage(2, coordinate_first=False)
    assert [type(a).__name__ + str(getattr(a, "op", "")) for a in e1.args] == \
        [type(a).__name__ + str(getattr(a, "op", "")) for a in e2.args]
    f1 = sym.compile([e1], [x1, t1], backend="numpy")
    f2 = sym.compile([e2], [x2, t2], backend="numpy")
    xs = np.arange(64, dtype=np.float64)
    ts = np.random.default_rng(3).uniform(0.5, 1.5, 64)
    np.testing.assert_array_equal(f1(xs, ts)[0], f2(xs, ts)[0])
    s1 = sym.compile([e1 + t1 * x1 * 3.0], [x1, t1], backend="numpy")
    s2 = sym.compile([3.0 * x2 * t2 + e2], [x2, t2], backend="numpy")
    np.testing.assert_array_equal(s1(xs, ts)[0], s2(xs, ts)[0])


def test_intern_table_is_weak():
    sym.clear_build_cache()  # the memo of recent constructions holds nodes until it is cleared
    gc.collect()
    before = sym.intern_table_size()
    u = sym.var("u_tmp")
    e = sym.sin(u) * sym.cos(u) + u**3
    assert sym.intern_table_size() > before
    del u, e
    sym.clear_build_cache()
    gc.collect()
    assert sym.intern_table_size() == before


def test_dtypes_follow_numpy_promotion_with_weak_scalars():
    x32 = sym.var("x", "float32")
    x64 = sym.var("x")
    i = sym.var("i", "int64")
    assert (x32 * 2.0).dtype == np.float32
    assert (x32 * 2.0) is (x32 * np.float32(2.0))  # weak scalar adopts float32
    assert (x32 * np.float64(2.0)).dtype == np.float64  # numpy scalars are strong
    assert (x32 + x64).dtype == np.float64
    assert (x32 < 1).dtype == np.bool_
    assert (i + 1).dtype == np.int64 and (i / 2).dtype == np.float64
    assert sym.where(x32 > 0, x32, 0).dtype == np.float32
    assert sym.exp(x32).dtype == np.float32 and sym.erf(x32).dtype == np.float32
    assert sym.astype(x32, "float64").dtype == np.float64
    assert sym.diff(sym.sin(x32) * 3.0, x32).dtype == np.float32
    # a simplification that drops a wider constant keeps the wider dtype
    e = x32 * np.float64(1.0)
    assert e.dtype == np.float64


def test_float32_compiles_to_float32():
    x = sym.var("x", "float32")
    f = sym.sin(x) * 2.0 + x**2 + sym.where(x > 0, sym.sqrt(x), 0.5)
    d = sym.diff(f, x)
    fn = sym.compile([f, d], [x])
    xv = np.array([-1.0, 0.5, 2.0], dtype=np.float32)  # the LLVM backend does not cast inputs
    fv, dv = fn(xv)
    assert fv.dtype == np.float32 and dv.dtype == np.float32
    x64 = xv.astype(np.float32).astype(np.float64)
    ref = np.sin(x64) * 2 + x64**2 + np.where(x64 > 0, np.sqrt(np.abs(x64)), 0.5)
    dref = 2 * np.cos(x64) + 2 * x64 + np.where(x64 > 0, 0.5 / np.sqrt(np.abs(x64)), 0)
    close(fv, ref, rtol=1e-6)  # float32 rounding
    close(dv, dref, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# spec tests 6.2


def _tree_size_naive(e):
    """Tree size with multiplicity, the way a tree-based engine stores it (memoised count)."""
    size = {}
    for n in sym.toposort(e):
        size[id(n)] = 1 + sum(size[id(a)] for a in n.args)
    return size[id(e)]


def test_ca_sym_1_tree_swells_dag_does_not():
    """CA-SYM-1: a Times chain whose factors share the previous level, e_k = e_{k-1} *
    sin(e_{k-1}). As a tree, d e_k / dx at least doubles in size per level (blog: Terms(d(a*b))
    >= Terms(d a) + Terms(d b)); as a hash-consed DAG the node count grows linearly."""
    x = sym.var("x")
    e = x
    trees, dags = [], []
    for k in range(1, 21):
        e = e * sym.sin(e)
        d = sym.diff(e, x)
        trees.append(_tree_size_naive(d))
        dags.append(sym.count_nodes(d))
        assert trees[-1] >= 2**k
    assert trees[-1] == sym.tree_size(d)
    steps = np.diff(dags)
    # linear: a bounded number of new nodes per level (products are flattened up to
    # FLATTEN_MAX factors, and the derivative of an n-ary product has n partial products)
    assert steps.max() <= 2 * FLATTEN_MAX, dags
    assert dags[-1] <= 2 * FLATTEN_MAX * 20, dags


def _nested_exp(x, n):
    r = x
    for _ in range(n):
        r = sym.exp(r)
    return r


@pytest.mark.parametrize(
    "n, x0, f, d1, d2",
    [
        (3, 0.0, 15.154262241479262, 41.19355567471612, 194.36280518962906),
        (4, -1.0, 69.43864051197012, 156.48979410404516, 649.8996789005884),
        (2, 0.5, None, 8.573887702979121, 22.709838731475063),
    ],
)
def test_ca_sym_2_nested_exp(n, x0, f, d1, d2):
    x = sym.var("x")
    e = _nested_exp(x, n)
    de = sym.diff(e, x)
    d2e = sym.diff(de, x)
    # hash-consing reuses the primal's exponentials: exactly n exp nodes (thesis: 8, not 37)
    assert sym.count_nodes(de, "exp") == n
    assert sym.count_nodes([e, de, d2e], "exp") == n
    fv, dv, d2v = sym.compile([e, de, d2e], [x])(x0)
    if f is not None:
        close(fv, f)
    close(dv, d1)
    close(d2v, d2)


def test_ca_sym_3_nested_exp_overflow_is_inf_not_nan():
    """N = 8 overflows float64 at level 6 for every x: value and derivative are +inf (the
    trap is visible), never a silent NaN."""
    x = sym.var("x")
    e = _nested_exp(x, 8)
    fv, dv = sym.compile([e, sym.diff(e, x)], [x])(np.array([-3.0, 0.0, 0.5]))
    assert np.all(np.isposinf(fv)) and np.all(np.isposinf(dv))


def test_ca_sym_4_onepass_memo():
    """Each (node, var) partial is created once; shared sub-expressions are memo hits."""
    x = sym.var("x")
    s = sym.sin(x)
    k = 12
    e = sym.add(*[sym.sin((i + 1) * s) for i in range(k)])
    memo = sym.DiffMemo()
    d = sym.diff(e, x, memo)
    non_const = [n for n in sym.toposort(e) if not sym.is_const(n)]
    # x, s, k - 1 products (i+1)*s (the first is s itself), k sines, the sum
    assert len(non_const) == 2 * k + 2
    # every node but the seed x computed once; hits: s from its k - 1 other parents, x from s
    assert memo.computed == len(non_const) - 1
    assert memo.hits == k
    assert len(memo) == memo.computed + 1  # one entry per (node, x), the seed included
    d_again = sym.diff(e, x, memo)
    assert d_again is d and memo.computed == len(non_const) - 1 and memo.hits == k + 1
    sym.diff(sym.cos(s), x, memo)  # a new parent of a memoised node
    assert memo.computed == len(non_const) and memo.hits == k + 2
    # value against the analytic derivative, and the reverse sweep
    xs = np.linspace(-2, 2, 7)
    ref = sum((i + 1) * np.cos((i + 1) * np.sin(xs)) * np.cos(xs) for i in range(k))
    dv, gv = sym.compile([d, sym.grad(e, x)], [x])(xs)
    close(dv, ref)
    close(gv, ref)


def test_ca_sym_5_derivative_of_linear_function_is_a_constant(xyz):
    x, y, z = xyz
    f = 3 * x - 2 * y + 5 + x / 4 - (x - z) * 0.5 + 2 * (x + 3 * y) / 8
    d = sym.diff(f, x)
    assert isinstance(d, sym.Const)
    close(d.value, 3 + 0.25 - 0.5 + 0.25)
    g = sym.grad(f, [x, y, z])
    assert all(isinstance(gi, sym.Const) for gi in g)
    close([gi.value for gi in g], [3.0, -2 + 0.75, 0.5])
    assert sym.is_const(sym.diff(d, x), 0)


def test_ca_sym_6_laplacian_residual_jacobian():
    """Opt-like: residuals over a shift-invariant stencil of unknown leaves X(dx, dy)."""
    w_fit, w_reg = 0.1, 0.9
    X = {o: sym.leaf("X", o) for o in [(0, 0), (1, 0), (0, 1)]}
    A00 = sym.leaf("A", (0, 0))
    res = [
        w_fit * (X[0, 0] - A00),
        w_reg * (X[0, 0] - X[1, 0]),
        w_reg * (X[0, 0] - X[0, 1]),
    ]
    # sparsity query: which unknowns each residual uses
    assert [set(sym.free_leaves(r, "X")) for r in res] == [
        {X[0, 0]},
        {X[0, 0], X[1, 0]},
        {X[0, 0], X[0, 1]},
    ]
    unknowns = sym.free_leaves(res, "X")
    J = sym.jacobian(res, unknowns)
    expect = {
        (0, (0, 0)): 0.1, (0, (1, 0)): 0.0, (0, (0, 1)): 0.0,
        (1, (0, 0)): 0.9, (1, (1, 0)): -0.9, (1, (0, 1)): 0.0,
        (2, (0, 0)): 0.9, (2, (1, 0)): 0.0, (2, (0, 1)): -0.9,
    }
    for i, r in enumerate(res):
        for j, u in enumerate(unknowns):
            assert isinstance(J[i][j], sym.Const)
            assert J[i][j].value == expect[i, u.key]
    # diag(J^T J) of an interior pixel: every residual of the stencil touches the pixel through
    # each of its offsets (shift invariance), so sum all squared partials of the stencil
    diag = sum(J[i][j].value ** 2 for i in range(3) for j in range(len(unknowns)))
    assert diag == pytest.approx(0.1**2 + 4 * 0.9**2, rel=1e-15)
    assert diag == pytest.approx(3.25, rel=1e-15)


# --------------------------------------------------------------------------------------------
# Hessians (6.6)


def _rosenbrock(x, y):
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def test_ca_hes_1_2_rosenbrock():
    x, y = sym.var("x"), sym.var("y")
    f = _rosenbrock(x, y)
    g = sym.grad(f, [x, y])
    H = sym.hessian(f, [x, y])
    assert H[0][1] is H[1][0]
    hv = sym.hvp(f, [x, y], [1.0, 2.0])
    fn = sym.compile([f, *g, H[0][0], H[0][1], H[1][1], *hv], [x, y])
    fv, g0, g1, h00, h01, h11, hv0, hv1 = fn(1.0, 1.0)
    close([fv, g0, g1], [0, 0, 0])
    close([[h00, h01], [h01, h11]], [[802, -400], [-400, 200]])
    fv, g0, g1, h00, h01, h11, hv0, hv1 = fn(-1.2, 1.0)
    close(fv, 24.2)
    close([g0, g1], [-215.6, -88])
    close([[h00, h01], [h01, h11]], [[1330, 480], [480, 200]])
    close([hv0, hv1], [2290, 880])
    close(1 * hv0 + 2 * hv1, 4050)  # v^T H v


def test_ca_hes_3_gaussian_log_density():
    sigma = np.array([[2.0, 0.6], [0.6, 1.0]])
    mu = np.array([0.5, -1.0])
    P = np.linalg.inv(sigma)
    x = [sym.var("x0"), sym.var("x1")]
    d = [x[0] - mu[0], x[1] - mu[1]]
    quad = P[0, 0] * d[0] ** 2 + 2 * P[0, 1] * d[0] * d[1] + P[1, 1] * d[1] ** 2
    logp = -0.5 * quad - math.log(2 * math.pi) - 0.5 * math.log(np.linalg.det(sigma))
    g = sym.grad(logp, x)
    H = sym.hessian(logp, x)
    assert H[0][1] is H[1][0]
    fn = sym.compile([logp, *g, H[0][0], H[0][1], H[1][1]], x)
    out = fn(1.0, 1.0)
    close(out[0], -4.234615431229837)
    close(out[1:3], [0.42682927, -2.25609756], rtol=1e-8)  # spec prints 8 decimals
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(2, 100)) * 3
    _, _, _, h00, h01, h11 = fn(xs[0], xs[1])
    Hn = np.stack([np.stack([h00, h01]), np.stack([h01, h11])])  # (2, 2, 100)
    assert Hn.shape == (2, 2, 100)
    close(Hn, np.broadcast_to(-P[:, :, None], Hn.shape))
    close(-P, [[-0.6097561, 0.36585366], [0.36585366, -1.2195122]], rtol=1e-7)


def test_ca_hes_4_sin_xy():
    x, y = sym.var("x"), sym.var("y")
    f = sym.sin(x * y) + x**3 * y
    g = sym.grad(f, [x, y])
    H = sym.hessian(f, [x, y])
    out = sym.compile([f, *g, H[0][0], H[0][1], H[1][1]], [x, y])(1.0, 2.0)
    close(out[0], 2.9092974268256815)
    close(out[1:3], [5.167706326905715, 0.5838531634528576])
    close(out[3:], [8.362810292697274, 0.7652583098014942, -0.9092974268256817])


def test_hessian_is_symmetric_by_construction():
    """The two mixed partials of atan2(x, y) * exp(y) are structurally different expressions
    (equal values); hessian() builds one and uses it for both entries."""
    x, y = sym.var("x"), sym.var("y")
    f = sym.arctan2(x, y) * sym.exp(y)
    g = sym.grad(f, [x, y])
    assert sym.diff(g[0], y) is not sym.diff(g[1], x)
    H = sym.hessian(f, [x, y])
    assert H[0][1] is H[1][0]
    a, b = sym.compile([sym.diff(g[0], y), sym.diff(g[1], x)], [x, y])(0.3, 0.8)
    close(a, b)


def test_hessian_symmetry_and_hvp_against_dense():
    v = [sym.var(f"v{i}") for i in range(4)]
    f = sym.exp(v[0] * v[1]) + sym.sin(v[2]) * v[3] ** 2 + v[0] * v[2] * v[3] + sym.log(
        1 + v[1] ** 2
    )
    H = sym.hessian(f, v)
    for i in range(4):
        for j in range(4):
            assert H[i][j] is H[j][i]
    w = [0.3, -1.0, 2.0, 0.5]
    hv = sym.hvp(f, v, w)
    fn = sym.compile([h for row in H for h in row] + hv, v)
    pt = [0.2, -0.4, 0.7, 1.3]
    out = fn(*pt)
    Hn = np.array(out[:16], dtype=float).reshape(4, 4)
    close(out[16:], Hn @ np.array(w))
    assert np.array_equal(Hn, Hn.T)


# --------------------------------------------------------------------------------------------
# every lane-wise differentiable primitive versus finite differences

_U = "uniform"


def _domain(name, rng, n):
    """Operands (float arrays, except a bool condition) and params for primitive ``name``."""
    u = lambda lo, hi: rng.uniform(lo, hi, n)  # noqa: E731
    pm = lambda lo, hi: u(lo, hi) * rng.choice([-1.0, 1.0], n)  # noqa: E731
    if name in ("add", "mul"):
        return [u(-2, 2), u(-2, 2), u(-2, 2)], {}
    if name in ("sub", "safe_mul"):
        return [u(-2, 2), u(-2, 2)], {}
    if name in ("neg", "identity", "exp", "expm1", "sinh", "cosh", "tanh", "erf", "atan"):
        return [u(-2, 2)], {}
    if name in ("sin", "cos"):
        return [u(-3, 3)], {}
    if name == "tan":
        return [u(-1.2, 1.2)], {}
    if name in ("asin", "acos"):
        return [u(-0.9, 0.9)], {}
    if name in ("log", "sqrt", "rsqrt"):
        return [u(0.5, 3)], {}
    if name == "log1p":
        return [u(-0.5, 3)], {}
    if name == "abs":
        return [pm(0.2, 2)], {}
    if name == "div":
        return [u(-2, 2), pm(0.5, 2)], {}
    if name == "pow":
        return [u(0.5, 2), u(-2, 2)], {}
    if name == "atan2":
        return [u(-2, 2), pm(0.5, 2)], {}
    if name == "mod":  # a / b kept 0.2 away from the integers (the jumps)
        b = pm(0.5, 2)
        return [b * (rng.integers(-3, 4, n) + u(0.2, 0.8)), b], {}
    if name in ("maximum", "minimum"):
        a = u(-2, 2)
        return [a, a + pm(0.1, 1)], {}
    if name == "clamp":
        lo, hi = u(-1, -0.1), u(0.1, 1)
        x = u(-2, 2)
        x = np.where(np.minimum(np.abs(x - lo), np.abs(x - hi)) < 0.05, 0.0, x)
        return [x, lo, hi], {}
    if name == "select":
        return [rng.uniform(size=n) > 0.5, u(-2, 2), u(-2, 2)], {}
    return None


def _fd(fn, args, i, h):
    ap, am = list(args), list(args)
    ap[i] = args[i] + h
    am[i] = args[i] - h
    return (fn(*ap)[0] - fn(*am)[0]) / (2 * h)


def _lanewise_differentiable():
    return {
        name: p
        for name, p in primitives().items()
        if p.elementwise and p.differentiable and name != "convert"
        and "buffer_args" not in p.extra  # kernel buffer access: test_sym_buffers.py
        and not p.extra.get("reduction")  # a kernel output (lane_sum): test_sym_buffers.py
    }


def test_every_lanewise_primitive_has_a_test_domain():
    missing = [n for n in _lanewise_differentiable() if _domain(n, np.random.default_rng(0), 1)
               is None]
    assert not missing, f"add a finite-difference domain for new primitives: {missing}"


@pytest.mark.parametrize("name", sorted(_lanewise_differentiable()))
def test_primitive_derivatives_match_finite_differences(name):
    prim = primitives()[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    n = 16
    dom = _domain(name, rng, n)
    assert dom is not None
    vals, params = dom
    vs = [
        sym.var(f"a{i}", "bool" if v.dtype == np.bool_ else "float64") for i, v in enumerate(vals)
    ]
    f = sym.call(prim, *vs, **params)
    fl = [i for i, v in enumerate(vals) if v.dtype != np.bool_]
    assert f.dtype == np.float64
    f_fn = sym.compile([f], vs)
    h = [1e-6 * np.maximum(1.0, np.abs(vals[i])) if i in fl else None for i in range(len(vals))]
    first = {i: sym.diff(f, vs[i]) for i in fl}
    rev = sym.grad(f, [vs[i] for i in fl])
    d_fn = sym.compile([first[i] for i in fl] + rev, vs)
    dv = d_fn(*vals)
    for k, i in enumerate(fl):
        fd = _fd(f_fn, vals, i, h[i])
        close(dv[k], fd, rtol=1e-6, atol=1e-7)
        close(dv[len(fl) + k], dv[k])  # reverse == forward
        # second derivatives: diff of diff against differences of the compiled derivative
        g_fn = sym.compile([first[i]], vs)
        second = sym.compile([sym.diff(first[i], vs[j]) for j in fl], vs)(*vals)
        for kj, j in enumerate(fl):
            fd2 = _fd(g_fn, vals, j, h[j])
            close(second[kj], fd2, rtol=1e-6, atol=1e-7)


def test_convert_derivative():
    x = sym.var("x")
    y = sym.astype(x, "float32")
    d = sym.diff(y, x)
    assert d.dtype == np.float32 and sym.is_const(d, 1)
    g = sym.grad(sym.sin(y), x)
    assert g.dtype == np.float64
    gv = sym.compile([g], [x])(np.array([0.3, 1.2]))[0]
    close(gv, np.cos(np.float32([0.3, 1.2])), rtol=1e-6)
    assert sym.is_const(sym.diff(d, x), 0)


def test_nondifferentiable_primitives_have_zero_derivative(xyz):
    x, y, _ = xyz
    for e in [sym.floor(x), sym.sign(x), x < y, sym.round(x * y), sym.astype(x, "int64")]:
        assert sym.is_const(sym.diff(e, x), 0)
    e = x * sym.floor(x)
    d = sym.compile([sym.diff(e, x)], [x])(np.array([1.5, -2.5]))[0]
    close(d, [1.0, -3.0])


# --------------------------------------------------------------------------------------------
# reverse versus forward, jvp / vjp, NaN-safety


def _random_composition(vs, rng, depth=5):
    pool = list(vs)
    un = [sym.sin, sym.cos, sym.tanh, sym.exp, lambda a: sym.log(1 + a * a), sym.erf,
          sym.arctan, lambda a: sym.sqrt(a * a + 1)]
    bi = [lambda a, b: a * b, lambda a, b: a + 2.5 * b, lambda a, b: a - b,
          lambda a, b: a / (1 + b * b), sym.arctan2, sym.maximum,
          lambda a, b: sym.where(a > b, a * a, sym.sin(b))]
    for _ in range(depth):
        if rng.uniform() < 0.4:
            pool.append(un[rng.integers(len(un))](pool[rng.integers(len(pool))]))
        else:
            a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
            pool.append(bi[rng.integers(len(bi))](a, b))
    return sym.add(*pool[-3:])


def test_grad_equals_diff_per_variable():
    rng = np.random.default_rng(7)
    vs = [sym.var(f"v{i}") for i in range(4)]
    pts = [rng.uniform(-1.5, 1.5, 32) for _ in vs]
    for _ in range(20):
        f = _random_composition(vs, rng)
        g = sym.grad(f, vs)
        d = [sym.diff(f, v) for v in vs]
        out = sym.compile(g + d, vs)(*pts)
        close(out[:4], out[4:])


def test_jvp_vjp_against_jacobian(xyz):
    x, y, z = xyz
    outs = [sym.sin(x * y) + z, x * sym.exp(z), y**3 - x]
    vs = [x, y, z]
    J = sym.jacobian(outs, vs)
    t = [0.5, -1.0, 2.0]
    w = [1.5, 0.25, -2.0]
    jv = sym.jvp(outs, vs, t)
    vj = sym.vjp(outs, vs, w)
    fn = sym.compile([j for row in J for j in row] + jv + vj, vs)
    out = fn(0.3, -0.7, 1.1)
    Jn = np.array(out[:9], dtype=float).reshape(3, 3)
    close(out[9:12], Jn @ t)
    close(out[12:15], np.array(w) @ Jn)
    # symbolic tangents / cotangents
    tx = sym.var("tx")
    assert sym.jvp(x * y, [x], [tx]) is tx * y
    assert sym.vjp(x * y, x, tx) is tx * y
    assert sym.vjp(x * y, [x, y], [tx]) == [tx * y, tx * x]


def test_nan_safety_where_sqrt():
    """CA-NUM-3 symbolically: d/dx where(x > 0, sqrt(x), 0) at [-1, 0, 4] is [0, 0, 0.25]."""
    x = sym.var("x")
    e = sym.where(x > 0, sym.sqrt(x), 0)
    d = sym.diff(e, x)
    g = sym.grad(e, x)
    h = sym.diff(d, x)
    dv, gv, hv = sym.compile([d, g, h], [x])(np.array([-1.0, 0.0, 4.0]))
    close(dv, [0, 0, 0.25])
    close(gv, [0, 0, 0.25])
    close(hv, [0, 0, -0.25 / 8])
    # the reverse sweep needed a safe multiply (masked adjoint times a non-finite partial) ...
    assert sym.calls(g, R.safe_mul_p)
    # ... and a select-free derivative keeps plain multiplies that simplify
    assert not sym.calls(sym.grad(sym.sqrt(x) * 3, x), R.safe_mul_p)
    # masked log and division, reverse and forward
    y = sym.var("y")
    e2 = sym.where(y > 0, sym.log(y) * x, x / y) + sym.where(x < 1, sym.sqrt(1 - x), 0.0)
    outs = sym.compile(sym.grad(e2, [x, y]) + [sym.diff(e2, x), sym.diff(e2, y)], [x, y])(
        np.array([2.0, 0.5, 0.0]), np.array([-2.0, 2.0, -1.0])
    )
    for o in outs:
        assert np.all(np.isfinite(o)), outs
    close(outs[0], outs[2])
    close(outs[1], outs[3])


# --------------------------------------------------------------------------------------------
# extension hooks: leaves and user call primitives


def _func_call_primitive():
    """A Halide-like Func call f(ix, iy): reads a buffer at integer coordinates; the index
    operands get no derivative."""
    buf = np.arange(20.0).reshape(4, 5) ** 1.5

    def impl(ix, iy, func):
        return buf[np.clip(ix, 0, 3), np.clip(iy, 0, 4)]

    return Primitive(
        "test_func_call",
        impl,
        partials=lambda args, out, wrt, func: (None, None),
        elementwise=True,
        extra={"out_dtype": np.float64, "fold": False},
    ), buf


def test_differentiate_with_respect_to_call_nodes_and_leaves():
    prim, buf = _func_call_primitive()
    ix, iy = sym.var("ix", "int64"), sym.var("iy", "int64")
    p = sym.var("p")
    c1 = sym.call(prim, ix + 1, iy, func="f")
    c0 = sym.call(prim, ix, iy, func="f")
    assert c1 is sym.call(prim, 1 + ix, iy, func="f")  # hash-consed
    assert c1 is not sym.call(prim, ix + 1, iy, func="g")  # params are part of the key
    e = p * c1 + c0**2 + sym.sin(c0 * c1)
    assert sym.calls(e) == [c0, c1] or sym.calls(e) == [c1, c0]
    assert set(sym.calls(e, "test_func_call")) == {c0, c1}
    assert set(sym.free_leaves(e)) == {ix, iy, p}
    # treat the calls as independent inputs
    assert sym.diff(c1, c1).value == 1
    d1 = sym.diff(e, c1)
    g = sym.grad(e, [c1, c0, p, ix])
    assert sym.is_const(g[3], 0)  # index operands carry no derivative
    assert sym.is_const(sym.diff(e, ix), 0)
    fn = sym.compile([e, d1, *g[:3]], [ix, iy, p])
    ixv, iyv, pv = np.array([0, 1, 2]), np.array([1, 3, 4]), np.array([0.5, -1.0, 2.0])
    ev, dv, g1, g0, gp = fn(ixv, iyv, pv)
    v1, v0 = buf[ixv + 1, iyv], buf[ixv, iyv]
    close(ev, pv * v1 + v0**2 + np.sin(v0 * v1))
    close(dv, pv + np.cos(v0 * v1) * v0)
    close(g1, dv)
    close(g0, 2 * v0 + np.cos(v0 * v1) * v1)
    close(gp, v1)
    # the Hessian with respect to call nodes and a var
    H = sym.hessian(e, [c1, c0, p])
    assert sym.is_const(H[2][2], 0) and sym.is_const(H[0][2], 1)


def test_diff_with_respect_to_an_interior_node_holds_its_operands_fixed(xyz):
    x, y, _ = xyz
    s = sym.sin(x)
    e = s * y + x
    assert sym.diff(e, s) is y
    gs, gx = sym.grad(e, [s, x])
    assert gs is y
    assert gx is sym.diff(e, x)


def test_substitute(xyz):
    x, y, z = xyz
    e = sym.sin(x) * y + x
    e2 = sym.substitute(e, {x: z + 1, y: 2.0})
    assert e2 is sym.sin(z + 1) * 2.0 + (z + 1)
    prim, _ = _func_call_primitive()
    ix = sym.var("ix", "int64")
    c = sym.call(prim, ix, ix, func="f")
    assert sym.substitute(c, {ix: ix + 1}) is sym.call(prim, ix + 1, ix + 1, func="f")


# --------------------------------------------------------------------------------------------
# cse / compile


def test_cse_program(xyz):
    x, y, _ = xyz
    s = sym.sin(x * y)
    outs = [s + 1, s * s]
    prog = sym.cse(outs)
    names = [n for n, _ in prog.assignments]
    nodes = [n for _, n in prog.assignments]
    assert len(set(map(id, nodes))) == len(nodes)  # each node once
    assert sum(1 for n in nodes if isinstance(n, sym.Apply) and n.prim is R.sin_p) == 1
    pos = {id(n): i for i, n in enumerate(nodes)}
    for n in nodes:
        assert all(pos[id(a)] < pos[id(n)] for a in n.args)  # topological
    assert prog.outputs == [prog.names()[outs[0]], prog.names()[outs[1]]]
    assert set(names) >= {"x", "y"}
    assert "sin" in str(prog)


def test_compile_broadcasting_and_constant_outputs(xyz, monkeypatch):
    x, y, _ = xyz
    # numpy-backend semantics: broadcasting lane shapes, converting inputs (the LLVM backend
    # takes exact dtypes and 1-D lanes: tests/test_codegen_errors.py)
    fn = sym.compile([x * y, sym.const(2.5), x, sym.sin(y)], [x, y], backend="numpy")
    xv = np.array([[1.0], [2.0]])
    yv = np.array([1.0, 2.0, 3.0])
    a, b, c, d = fn(xv, yv)
    assert a.shape == b.shape == c.shape == d.shape == (2, 3)
    close(a, xv * yv)
    close(b, np.full((2, 3), 2.5))
    close(d, np.broadcast_to(np.sin(yv), (2, 3)))
    c[0, 0] = 99.0  # outputs are fresh arrays, never the caller's
    assert xv[0, 0] == 1.0
    # inputs are converted to the leaf dtype
    i = sym.var("i", "int64")
    fi = sym.compile([i * 2], [i], backend="numpy")
    r = fi(np.array([1.7, 2.2]))[0]
    assert r.dtype == np.int64 and list(r) == [2, 4]
    # scalars in, 0-d arrays out
    assert fn(2.0, 3.0)[0].shape == ()
    # the callable is generated once: calling it does not traverse the DAG again
    from core_ad._sym import graph

    def boom(*a, **k):
        raise AssertionError("DAG traversed at call time")

    monkeypatch.setattr(graph, "toposort", boom)
    close(fn(xv, yv)[0], xv * yv)
    assert "def compiled" in fn.source


def test_compiled_products_reuse_shorter_products():
    """Reverse mode through a chain makes adjoints a_k = a_{k+1} * cos(e_k); flattening stores
    them as n-ary products, and the generated code evaluates each as (previous product) * (one
    factor): one multiply per adjoint, not one per factor."""
    x = sym.var("x")
    chain = [x]
    for _ in range(40):
        chain.append(sym.sin(chain[-1]))
    adjoints = sym.grad(chain[-1], chain[:-1])
    fn = sym.compile(adjoints, [x], backend="numpy")  # inspects the generated numpy source
    assert fn.source.count(" * ") <= len(adjoints)
    xs = np.array([0.2, 0.9])
    vals = [xs]
    for _ in range(40):
        vals.append(np.sin(vals[-1]))
    ref, a = [], np.ones(2)
    for k in range(39, -1, -1):  # d chain[40] / d chain[k] = prod_{j >= k} cos(chain[j])
        a = a * np.cos(vals[k])
        ref.append(a)
    close(fn(xs), ref[::-1], rtol=1e-13)


@pytest.mark.parametrize("backend", [
    "numpy",
    # LLVM's O3 on one 10^4-call function takes about a minute on 2 cores
    pytest.param("llvm", marks=pytest.mark.slow),
])
def test_deep_chain_is_iterative(backend):
    """10^4 nested nodes: construction, derivatives, queries and compile without recursion."""
    x = sym.var("x")
    e = x
    for _ in range(10_000):
        e = sym.sin(e)
    assert sym.count_nodes(e) == 10_001
    assert sym.tree_size(e) == 10_001
    d = sym.diff(e, x)
    g = sym.grad(e, x)
    assert len(sym.free_leaves(d)) == 1
    xs = np.array([0.3, 1.0])
    ev, dv, gv = sym.compile([e, d, g], [x], backend=backend)(xs)
    ref, dref = xs.copy(), np.ones_like(xs)
    for _ in range(10_000):
        dref = dref * np.cos(ref)
        ref = np.sin(ref)
    close(ev, ref, rtol=1e-10)
    close(dv, dref, rtol=1e-9)  # 10^4 roundings
    close(gv, dref, rtol=1e-9)
    assert len(repr(e)) < 400


# --------------------------------------------------------------------------------------------
# agreement with the tracing engine (F9: compiled symbolic derivatives match it to 1e-12)


def test_matches_tracing_engine():
    import core_ad

    def f(x, y):  # written once with the rule table's math: runs on Exprs and traced arrays
        return R.add(
            R.mul(R.sin(R.mul(x, y)), R.exp(R.neg(x))),
            R.where(R.gt(x, y), R.sqrt(R.add(R.mul(x, x), 1.0)), R.tanh(y)),
        )

    x, y = sym.var("x"), sym.var("y")
    e = f(x, y)
    fn = sym.compile(sym.grad(e, [x, y]), [x, y])
    tracing = core_ad.grad(f, argnums=(0, 1))
    for xv, yv in [(0.3, -0.7), (1.5, 0.2), (-0.4, 0.9)]:
        gx, gy = tracing(np.float64(xv), np.float64(yv))
        sx, sy = fn(xv, yv)
        close([sx, sy], [gx, gy], rtol=1e-12, atol=1e-15)


_BUILD_IN_ORDER = """
import sys
from core_ad import sym
from core_ad._codegen.cache import code_key
from core_ad._sym.program import cse
first, second = sys.argv[1:3]
sym.var(first), sym.var(second)  # interned in this order: their creation serials differ
x, y = sym.var("x"), sym.var("y")
if sys.argv[3] == "other-kernel-first":
    sym.sin(y) * sym.cos(x) + y * x
e = sym.sin(x) * sym.sin(y) + sym.cos(y) * sym.cos(x) + x * y + sym.exp(x + y) * 3.0
h = sym.hessian(e, [x, y])
outs = [e] + [h[i][j] for i in range(2) for j in range(2)]
print(code_key(cse(outs), outs, [x, y]))
"""


def test_program_does_not_depend_on_build_order():
    """The same expression over vars compiles to the same program (so the same disk-cache
    entry) whatever was built before it in the process: operands of equal shape are ordered
    by a hash of their structure and var names, not by when they were first made."""
    import subprocess
    import sys

    keys = {subprocess.run([sys.executable, "-c", _BUILD_IN_ORDER, *args], check=True,
                           capture_output=True, text=True).stdout
            for args in (("x", "y", "-"), ("y", "x", "-"), ("y", "x", "other-kernel-first"))}
    assert len(keys) == 1, keys
