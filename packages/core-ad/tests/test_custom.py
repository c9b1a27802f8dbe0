"""Custom derivatives in every mode (custom_vjp, custom_jvp, Function)."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp


@ad.custom_vjp
def softplus(x):
    return anp.log1p(anp.exp(x))


def _sp_fwd(x):
    return softplus(x), x


def _sp_bwd(x, ct):
    return (ct * anp.sigmoid(x),)


softplus.defvjp(_sp_fwd, _sp_bwd)


@ad.custom_jvp
def logsumexp2(a, b):
    m = anp.maximum(a, b)
    return m + anp.log(anp.exp(a - m) + anp.exp(b - m))


@logsumexp2.defjvp
def _lse_jvp(primals, tangents):
    a, b = primals
    ta, tb = tangents
    out = logsumexp2(a, b)
    wa = anp.exp(a - out)
    wb = anp.exp(b - out)
    return out, wa * ta + wb * tb


def test_custom_vjp_first_and_second_order():
    x = np.array([-1.5, 0.2, 3.0])
    ad.check_grads(softplus, (x,), order=2)
    H = ad.hessian(lambda v: anp.sum(softplus(v) ** 2))(x)
    Href = ad.hessian(lambda v: anp.sum(anp.log1p(anp.exp(v)) ** 2))(x)
    np.testing.assert_allclose(H, Href, rtol=1e-12)


def test_custom_vjp_rule_is_used():
    calls = []

    @ad.custom_vjp
    def f(x):
        return x * 2.0

    f.defvjp(lambda x: (f(x), None), lambda res, ct: (calls.append(1) or ct * 3.0,))
    assert ad.grad(lambda x: anp.sum(f(x)))(np.ones(2)).tolist() == [3.0, 3.0]
    assert calls


def test_custom_jvp_all_modes():
    a, b = np.array([0.3, -2.0]), np.array([1.0, 0.5])
    ad.check_grads(logsumexp2, (a, b), order=2)
    H = ad.hessian(lambda v: anp.sum(logsumexp2(v[:2], v[2:])))(np.concatenate([a, b]))
    Href = ad.hessian(lambda v: anp.sum(anp.log(anp.exp(v[:2]) + anp.exp(v[2:]))))(
        np.concatenate([a, b]))
    np.testing.assert_allclose(H, Href, rtol=1e-10, atol=1e-14)


class Atan2(ad.Function):
    order = 2

    @staticmethod
    def forward(ctx, y, x):
        ctx.save_for_backward(y, x)
        return anp.arctan2(y, x)

    @staticmethod
    def backward(ctx, ct):
        y, x = ctx.saved_values
        r2 = x * x + y * y
        return ct * x / r2, -ct * y / r2

    @staticmethod
    def jvp(ctx, ty, tx):
        y, x = ctx.saved_values
        return (x * ty - y * tx) / (x * x + y * y)


def test_function_atan2():  # CA-ENO-5
    y, x = ad.Array(1.0, requires_grad=True), ad.Array(2.0, requires_grad=True)
    out = Atan2.apply(y, x)
    out.backward()
    assert float(out) == pytest.approx(0.4636476090008061, rel=1e-12)
    assert (float(y.grad), float(x.grad)) == pytest.approx((0.4, -0.2), rel=1e-12)
    ad.check_grads(lambda a, b: Atan2.apply(a, b), (np.array([1.0, -0.3]),
                                                    np.array([2.0, 0.7])), order=2)


def test_first_order_function_refuses_hessian():
    class Square(ad.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, ct):
            return (2 * ct * ctx.saved_values[0],)

    assert ad.grad(lambda x: anp.sum(Square.apply(x)))(np.array([3.0]))[0] == 6.0
    with pytest.raises(NotImplementedError, match="first-order only"):
        ad.hessian(lambda x: anp.sum(Square.apply(x)))(np.array([3.0]))
    with pytest.raises(NotImplementedError, match="defines no jvp"):
        ad.jvp(lambda x: Square.apply(x), (np.array([3.0]),), (np.array([1.0]),))


def test_multi_output_custom_vjp():
    @ad.custom_vjp
    def polar(x, y):
        return anp.sqrt(x * x + y * y), anp.arctan2(y, x)

    def fwd(x, y):
        return polar(x, y), (x, y)

    def bwd(res, cts):
        x, y = res
        cr, ct = cts
        r2 = x * x + y * y
        r = anp.sqrt(r2)
        return cr * x / r - ct * y / r2, cr * y / r + ct * x / r2

    polar.defvjp(fwd, bwd)
    ad.check_grads(lambda x, y: polar(x, y), (np.array([1.0, -0.5]), np.array([0.3, 2.0])),
                   order=2)


def test_wrong_vjp_arity_is_reported():
    @ad.custom_vjp
    def f(x, y):
        return x * y

    f.defvjp(lambda x, y: (f(x, y), (x, y)), lambda res, ct: (ct * res[1],))
    with pytest.raises(TypeError, match="1 cotangents for 2 arguments"):
        ad.grad(lambda x: anp.sum(f(x, x)))(np.ones(2))
