"""Derivatives at non-differentiable points, the 0*inf = NaN trap, and the edge equation.

docs/design/core-ad.md §3 and §5 (CA-NUM-1 .. CA-NUM-5). The conventions are documented in the
docstring of ``core_ad._rules``; ``test_docstring_lists_the_conventions`` keeps the text and
the behaviour tested here from drifting apart.

Values at kinks are exact by definition (0, 1/2, 1, +inf), so they are compared exactly; the
smooth values state their tolerance where they are checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp
from core_ad import _rules as R

# --------------------------------------------------------------------------------------------
# CA-NUM-1 / CA-NUM-2: the edge equation of edge sampling


def alpha(a, b, x, y):
    """alpha = (a_y - b_y) x + (b_x - a_x) y + (a_x b_y - b_x a_y), lanes on axis 0."""
    ax, ay = a[..., 0], a[..., 1]
    bx, by = b[..., 0], b[..., 1]
    return (ay - by) * x + (bx - ax) * y + (ax * by - bx * ay)


def test_ca_num_1_edge_equation_gradient():
    p0 = np.array([1.0, 2.0, 4.0, 6.0, 2.0, 5.0])  # a_x, a_y, b_x, b_y, x, y

    def f(p):
        return alpha(p[0:2], p[2:4], p[4], p[5])

    expected = np.array([1.0, -2.0, 3.0, -1.0, -4.0, 3.0])
    # integer-valued inputs: every product and sum is exact in float64
    assert float(f(p0)) == 5.0
    np.testing.assert_array_equal(ad.grad(f)(p0), expected)
    np.testing.assert_array_equal(ad.jacobian(f, mode="fwd")(p0), expected)
    np.testing.assert_array_equal(ad.jacobian(f, mode="rev")(p0), expected)
    # |grad_{x,y} alpha| = |b - a| = 5
    assert float(np.hypot(*ad.grad(f)(p0)[4:])) == 5.0
    # tape-level: one Array per endpoint, backward from alpha
    a = ad.Array([1.0, 2.0], requires_grad=True)
    b = ad.Array([4.0, 6.0], requires_grad=True)
    out = alpha(a, b, 2.0, 5.0)
    ad.backward(out)
    np.testing.assert_array_equal(a.grad, [1.0, -2.0])
    np.testing.assert_array_equal(b.grad, [3.0, -1.0])


def test_ca_num_2_vjp_seeded_by_per_lane_weights():
    """backward(alpha, seed=weights) over 10^4 lanes equals eq. 5.9 times weights, summed."""
    n = 10_000
    rng = np.random.default_rng(1)
    xs, ys = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    w = rng.standard_normal(n)

    # shared endpoints (scene parameters broadcast to every lane): one summed gradient
    a0, b0 = rng.uniform(0, 1, 2), rng.uniform(0, 1, 2)
    a = ad.Array(a0, requires_grad=True)
    b = ad.Array(b0, requires_grad=True)
    out = alpha(a, b, xs, ys)
    assert out.shape == (n,)
    ad.backward(out, w)  # per-lane seed (see test_backward_seed_keyword)
    ga = np.array([np.sum(w * (b0[1] - ys)), np.sum(w * (xs - b0[0]))])
    gb = np.array([np.sum(w * (ys - a0[1])), np.sum(w * (a0[0] - xs))])
    # sums of 10^4 O(1) terms in different orders: 1e-12 relative
    np.testing.assert_allclose(a.grad, ga, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.grad, gb, rtol=1e-12, atol=1e-12)

    # per-lane endpoints: per-lane analytic partials times the weights. AD adds the adjoints
    # w*b_y and -w*y separately where the formula subtracts first, so near-cancelling lanes
    # differ by a few ulp of |w| (<= ~4 * 2^-52 * 4 ~ 1e-15 absolute)
    A = ad.Array(rng.uniform(0, 1, (n, 2)), requires_grad=True)
    B = ad.Array(rng.uniform(0, 1, (n, 2)), requires_grad=True)
    ad.backward(alpha(A, B, xs, ys), w)
    Av, Bv = A.value, B.value
    np.testing.assert_allclose(A.grad[:, 0], w * (Bv[:, 1] - ys), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(A.grad[:, 1], w * (xs - Bv[:, 0]), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(B.grad[:, 0], w * (ys - Av[:, 1]), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(B.grad[:, 1], w * (Av[:, 0] - xs), rtol=1e-14, atol=1e-15)


def test_backward_seed_keyword():
    a = ad.Array([1.0, 2.0], requires_grad=True)
    ad.backward(a * a, seed=np.array([1.0, 10.0]))
    np.testing.assert_array_equal(a.grad, [2.0, 40.0])


# --------------------------------------------------------------------------------------------
# CA-NUM-3: the NaN trap


def masked_sqrt(x):
    with np.errstate(invalid="ignore"):  # sqrt(-1) = NaN in the unselected lane, by design
        return anp.where(x > 0, anp.sqrt(x), 0.0)


X3 = np.array([-1.0, 0.0, 4.0])


def test_ca_num_3_reverse():
    x = ad.Array(X3, requires_grad=True)
    ad.backward(anp.sum(masked_sqrt(x)))
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.25])
    np.testing.assert_array_equal(ad.grad(lambda a: anp.sum(masked_sqrt(a)))(X3), [0, 0, 0.25])


def test_ca_num_3_forward():
    x = ad.Array(X3, requires_grad=True)
    y = masked_sqrt(x)
    ad.forward(x)
    np.testing.assert_array_equal(y.tangent, [0.0, 0.0, 0.25])
    _, t = ad.jvp(masked_sqrt, (X3,), (np.ones(3),))
    np.testing.assert_array_equal(t, [0.0, 0.0, 0.25])
    # vector forward mode (direction axis) and reverse Jacobians: diagonal, no NaN
    for mode in ("fwd", "rev"):
        J = ad.jacobian(masked_sqrt, mode=mode)(X3)
        np.testing.assert_array_equal(J, np.diag([0, 0, 0.25]))


def test_ca_num_3_second_order():
    # d2/dx2 sqrt(x) = -x^(-3/2) / 4 = -1/32 at x = 4 (exact in binary)
    expected = np.diag([0.0, 0.0, -1.0 / 32.0])
    f = lambda a: anp.sum(masked_sqrt(a))  # noqa: E731
    np.testing.assert_array_equal(ad.hessian(f)(X3), expected)
    np.testing.assert_array_equal(ad.jacobian(ad.grad(f), mode="rev")(X3), expected)
    np.testing.assert_array_equal(ad.hvp(f, X3, np.ones(3)), [0.0, 0.0, -1.0 / 32.0])
    # reverse over reverse on the tape
    x = ad.Array(X3, requires_grad=True)
    ad.backward(f(x), create_graph=True)
    g = x.grad
    x.grad = None
    ad.backward(anp.sum(g))
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, -1.0 / 32.0])


def test_safe_mul_zero_times_inf_and_nan():
    a = np.array([0.0, 0.0, 2.0, 0.0])
    p = np.array([np.inf, np.nan, 3.0, -np.inf])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(R.safe_mul(a, p), [0.0, 0.0, 6.0, 0.0])


# --------------------------------------------------------------------------------------------
# CA-NUM-4: documented values at kinks


def _grad_and_tangent(f, x):
    """Reverse-mode gradient of sum(f) and forward-mode tangent for an all-ones seed."""
    g = ad.grad(lambda a: anp.sum(f(a)))(x)
    _, t = ad.jvp(f, (x,), (np.ones_like(x),))
    return g, t


def test_abs_at_zero():
    x = np.array([0.0, -0.0, -1.5, 2.0])
    for d in _grad_and_tangent(anp.abs, x):
        np.testing.assert_array_equal(d, [0.0, 0.0, -1.0, 1.0])


@pytest.mark.parametrize("op", [anp.floor, anp.ceil, anp.round, anp.trunc, anp.sign])
def test_piecewise_constant_ops_have_zero_derivative(op):
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.5, 2.0])  # integers and halves: the jumps included
    xt = ad.Array(x, requires_grad=True)
    assert not op(xt).requires_grad
    g = ad.grad(lambda a: anp.sum(op(a) * a))(x)  # d/dx (op(x) x) = op(x) when op' = 0
    np.testing.assert_array_equal(g, op(x))
    np.testing.assert_array_equal(ad.jacobian(op, mode="fwd")(x), np.zeros((6, 6)))


def test_clamp_at_and_outside_the_bounds():
    lo = np.full(5, -1.0)
    hi = np.full(5, 2.0)
    x = np.array([-1.0, 2.0, -3.0, 5.0, 0.5])  # at lo, at hi, below, above, inside
    # w.r.t. x: 1 on the closed interval (bounds included), 0 outside
    for d in _grad_and_tangent(lambda a: anp.clamp(a, lo, hi), x):
        np.testing.assert_array_equal(d, [1.0, 1.0, 0.0, 0.0, 1.0])
    # w.r.t. the bounds: 1 only where x is strictly outside on that side
    g_lo = ad.grad(lambda b: anp.sum(anp.clamp(x, b, hi)))(lo)
    g_hi = ad.grad(lambda b: anp.sum(anp.clamp(x, lo, b)))(hi)
    np.testing.assert_array_equal(g_lo, [0.0, 0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(g_hi, [0.0, 0.0, 0.0, 1.0, 0.0])
    # the three partials sum to 1 everywhere (clamp(x + t, lo + t, hi + t) = clamp + t)
    g_x = ad.grad(lambda a: anp.sum(anp.clamp(a, lo, hi)))(x)
    np.testing.assert_array_equal(g_lo + g_hi + g_x, np.ones(5))


@pytest.mark.parametrize("op", [anp.maximum, anp.minimum], ids=["maximum", "minimum"])
def test_maximum_minimum_ties_split(op):
    a = np.array([1.0, 3.0, -2.0])
    b = np.array([1.0, 2.0, 0.0])  # tie, a > b, a < b
    big_a = op is anp.maximum
    ga, gb = ad.grad(lambda u, v: anp.sum(op(u, v)), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(ga, [0.5, 1.0 if big_a else 0.0, 0.0 if big_a else 1.0])
    np.testing.assert_array_equal(gb, [0.5, 0.0 if big_a else 1.0, 1.0 if big_a else 0.0])
    _, ta = ad.jvp(op, (a, b), (np.ones(3), np.zeros(3)))
    np.testing.assert_array_equal(ta, ga)
    # op(x, x): the two halves add back up to 1
    np.testing.assert_array_equal(ad.grad(lambda u: anp.sum(op(u, u)))(a), np.ones(3))


@pytest.mark.parametrize("op", [anp.max, anp.min], ids=["max", "min"])
def test_reduction_ties_split_equally(op):
    x = np.array([[3.0, 1.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, 0.0, 1.0, 2.0]])
    s = 1.0 if op is anp.max else -1.0
    x = s * x
    g = ad.grad(lambda a: anp.sum(op(a, axis=1)))(x)
    np.testing.assert_array_equal(g, [[0.5, 0.0, 0.5, 0.0], [0.25] * 4, [0.0, 0.0, 0.0, 1.0]])
    # forward mode uses the same weights
    J = ad.jacobian(lambda a: op(a, axis=1), mode="fwd")(x)
    np.testing.assert_array_equal(J[0, 0], [0.5, 0.0, 0.5, 0.0])
    np.testing.assert_array_equal(J[1, 1], [0.25] * 4)
    # a full reduction with k tied maxima gives 1/k each (1/3 rounded once)
    y = s * np.array([7.0, 1.0, 7.0, 7.0])
    np.testing.assert_array_equal(ad.grad(lambda a: op(a))(y), [1 / 3, 0.0, 1 / 3, 1 / 3])


# --------------------------------------------------------------------------------------------
# CA-NUM-5 and the remaining documented values


def diff_abs(x):
    return anp.sqrt(x * x + 1e-8)


def test_ca_num_5_diff_abs():
    g = ad.grad(lambda a: anp.sum(diff_abs(a)))(np.array([0.0, 1.0]))
    assert g[0] == 0.0
    # x / sqrt(x^2 + 1e-8) evaluated as 2x * 0.5 / sqrt(...): a few roundings, 4e-16 relative
    assert g[1] == pytest.approx(1.0 / np.sqrt(1.0 + 1e-8), rel=4e-16, abs=0)
    _, t = ad.jvp(diff_abs, (np.array([0.0, 1.0]),), (np.ones(2),))
    assert t[0] == 0.0 and t[1] == pytest.approx(1.0 / np.sqrt(1.0 + 1e-8), rel=4e-16, abs=0)


@pytest.mark.parametrize("op", [anp.log, anp.sqrt], ids=["log", "sqrt"])
def test_log_and_sqrt_derivative_at_zero_is_plus_inf(op):
    x = np.array([0.0])
    with np.errstate(divide="ignore"):
        g = ad.grad(lambda a: anp.sum(op(a)))(x)
        _, t = ad.jvp(op, (x,), (np.ones(1),))
    assert g[0] == np.inf and t[0] == np.inf


def test_atan2_at_origin_has_zero_derivative():
    z = np.zeros(2)
    gy, gx = ad.grad(lambda y, x: anp.sum(anp.arctan2(y, x)), argnums=(0, 1))(z, z)
    np.testing.assert_array_equal(gy, [0.0, 0.0])
    np.testing.assert_array_equal(gx, [0.0, 0.0])
    _, t = ad.jvp(anp.arctan2, (z, z), (np.ones(2), np.ones(2)))
    np.testing.assert_array_equal(t, [0.0, 0.0])
    # away from the origin the usual values: d/dy = x / r^2, d/dx = -y / r^2
    gy, gx = ad.grad(lambda y, x: anp.arctan2(y, x), argnums=(0, 1))(1.0, 2.0)
    assert gy == pytest.approx(2.0 / 5.0, rel=1e-15) and gx == pytest.approx(-1.0 / 5.0, rel=1e-15)


def test_norm_at_origin_has_zero_derivative():
    z = np.zeros((2, 3))
    np.testing.assert_array_equal(ad.grad(lambda a: anp.norm(a))(z), np.zeros((2, 3)))
    x = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]])
    g = ad.grad(lambda a: anp.sum(anp.norm(a, axis=1)))(x)
    np.testing.assert_array_equal(g, [[0.0, 0.0, 0.0], [0.6, 0.0, 0.8]])
    _, t = ad.jvp(lambda a: anp.norm(a), (z,), (np.ones((2, 3)),))
    assert t == 0.0


def test_pow_derivative_in_exponent_is_zero_for_nonpositive_base():
    x = np.array([-2.0, 0.0, 0.0, -1.5, 2.0])
    y = np.array([3.0, 2.0, -1.0, 0.5, 3.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        gy = ad.grad(lambda b: anp.sum(anp.pow(x, b)))(y)
        _, ty = ad.jvp(lambda b: anp.pow(x, b), (y,), (np.ones(5),))
    # pow(0, -1) = inf and pow(-1.5, 0.5) = NaN, yet d/dy is exactly 0 there
    expected = np.array([0.0, 0.0, 0.0, 0.0, 8.0 * np.log(2.0)])
    np.testing.assert_array_equal(gy, expected)
    np.testing.assert_array_equal(ty, expected)
    # d/dx at a negative base with an integer exponent is the usual y x^(y-1)
    gx = ad.grad(lambda a: anp.sum(anp.pow(a, y[:1])))(x[:1])
    assert gx[0] == 12.0


def test_pow_zero_exponent_has_zero_derivative_at_zero():
    # x**0 = 1 everywhere (numpy: 0**0 = 1), so d/dx = 0 also at x = 0, where the generic
    # y * x**(y - 1) would be 0 * inf
    x = np.array([0.0, 2.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        for y in (0, 0.0, np.zeros(2)):
            g = ad.grad(lambda a, y=y: anp.sum(anp.pow(a, y)))(x)
            np.testing.assert_array_equal(g, [0.0, 0.0])
            np.testing.assert_array_equal(ad.hessian(lambda a, y=y: anp.sum(anp.pow(a, y)))(x),
                                          np.zeros((2, 2)))
        gx, gy = ad.grad(lambda a, b: anp.sum(anp.pow(a, b)), argnums=(0, 1))(x, np.zeros(2))
    np.testing.assert_array_equal(gx, [0.0, 0.0])
    np.testing.assert_array_equal(gy, [0.0, np.log(2.0)])


def test_where_sends_adjoint_to_selected_branch_only():
    c = np.array([True, False, True])
    a, b = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    w = np.array([1.0, 10.0, 100.0])
    ga, gb = ad.grad(lambda u, v: anp.sum(anp.where(c, u, v) * w), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(ga, [1.0, 0.0, 100.0])
    np.testing.assert_array_equal(gb, [0.0, 10.0, 0.0])


# --------------------------------------------------------------------------------------------
# the docstring states exactly these conventions


def test_docstring_lists_the_conventions():
    doc = " ".join(R.__doc__.split())  # line wrapping does not matter
    for phrase in [
        "abs'(0) = 0",
        "``floor``",
        "``ceil``",
        "``round``",
        "comparisons",
        "casts to integer/bool types have zero derivative",
        "ties share the derivative equally",
        "1/2 each for two arguments; 1/k among k tied entries of a reduction",
        "``lo <= x <= hi`` (bounds included)",
        "1 with respect to ``lo`` where ``x < lo`` and to ``hi`` where ``x > hi``",
        "``sqrt'(0) = +inf``",
        "``log'(0) = +inf``",
        "``d/dy = 0`` where ``x <= 0``",
        "``atan2`` has zero derivative at the origin",
        "``norm`` has zero derivative at the zero vector",
        "sends the adjoint only to the selected branch",
        "*safe multiply*",
        "masked-off lanes never turn into NaN gradients",
    ]:
        assert phrase in doc, f"_rules docstring no longer states: {phrase!r}"
    # and the per-primitive docs carry the same conventions
    prims = ad.primitives()
    assert "abs'(0) = 0" in prims["abs"].doc
    assert "bounds included" in prims["clamp"].doc
    assert "1/2" in prims["maximum"].doc and "1/2" in prims["minimum"].doc
    assert "equally" in prims["reduce_max"].doc and "equally" in prims["reduce_min"].doc
    assert "+inf" in prims["sqrt"].doc and "+inf" in prims["log"].doc
    assert "x <= 0" in prims["pow"].doc
    assert "(0, 0)" in prims["atan2"].doc
    assert "zero vector" in prims["norm"].doc
    assert "selected branch" in prims["select"].doc
