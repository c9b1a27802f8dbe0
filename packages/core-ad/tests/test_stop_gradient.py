"""stop_gradient: the value passes, every derivative (symbolic, traced, compiled) is zero."""

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
from core_ad import sym


def test_symbolic_derivatives_see_a_constant():
    x, y = sym.var("x"), sym.var("y")
    e = sym.sin(x) * sym.stop_gradient(x * y)
    gx, gy = sym.grad(e, [x, y])
    env = {x: 0.7, y: -1.3}
    # d/dx = cos(x) * (x*y) only: the stopped factor is a constant
    np.testing.assert_allclose(sym.evaluate(gx, env), np.cos(0.7) * 0.7 * -1.3, rtol=1e-14)
    np.testing.assert_allclose(sym.evaluate(gy, env), 0.0)
    assert sym.evaluate(sym.diff(sym.stop_gradient(x), x), env) == 0.0
    H = sym.hessian(sym.stop_gradient(x * x) * y * y, [x, y])
    assert sym.evaluate(H[0][0], env) == 0.0 and sym.evaluate(H[0][1], env) == 0.0
    np.testing.assert_allclose(sym.evaluate(H[1][1], env), 2 * 0.7 * 0.7, rtol=1e-14)


def test_compiled_backends_agree_with_numpy():
    x = sym.var("x")
    e = sym.stop_gradient(sym.exp(x)) * x
    outs = [e] + list(sym.grad(e, [x]))
    xs = np.linspace(-2, 2, 37)
    ref = sym.compile(outs, [x], backend="numpy")(xs)
    got = sym.compile(outs, [x], backend="llvm")(xs)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-14)
    np.testing.assert_allclose(got[1], np.exp(xs), rtol=1e-14)  # d/dx = exp(x) only


def test_traced_arrays_forward_and_reverse():
    x0 = np.array([0.3, -1.1, 2.0])

    def f(x):
        return anp.sum(x * anp.stop_gradient(x * x))

    g = ad.grad(f)(x0)
    np.testing.assert_allclose(g, x0 * x0, rtol=1e-14)
    _, t = ad.jvp(f, (x0,), (np.ones(3),))
    np.testing.assert_allclose(t, np.sum(x0 * x0), rtol=1e-14)
    np.testing.assert_allclose(ad.hessian(f)(x0), np.zeros((3, 3)))
