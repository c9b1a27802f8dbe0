"""Functional transforms and Hessians (docs/design/core-ad.md §2.3 and §5).

Closed forms at 1e-10 relative (a few float64 operations); derivatives against finite
differences go through ``check_grads`` (central differences, tolerance documented there).
"""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp


def rosen(v):
    return (1 - v[0]) ** 2 + 100 * (v[1] - v[0] ** 2) ** 2


def test_rosenbrock_at_minimum():  # CA-HES-1
    x = np.array([1.0, 1.0])
    v, g = ad.value_and_grad(rosen)(x)
    assert v == 0.0 and np.all(g == 0.0)
    np.testing.assert_allclose(ad.hessian(rosen)(x), [[802, -400], [-400, 200]], rtol=1e-12)


def test_rosenbrock_away_from_minimum():  # CA-HES-2
    x = np.array([-1.2, 1.0])
    v, g = ad.value_and_grad(rosen)(x)
    assert v == pytest.approx(24.2, rel=1e-12)
    np.testing.assert_allclose(g, [-215.6, -88.0], rtol=1e-12)
    H = ad.hessian(rosen)(x)
    np.testing.assert_allclose(H, [[1330, 480], [480, 200]], rtol=1e-12)
    hv = ad.hvp(rosen, x, np.array([1.0, 2.0]))
    np.testing.assert_allclose(hv, [2290, 880], rtol=1e-12)
    assert np.array([1.0, 2.0]) @ hv == pytest.approx(4050, rel=1e-12)


SIGMA = np.array([[2.0, 0.6], [0.6, 1.0]])
MU = np.array([0.5, -1.0])


def log_normal(x):
    P = np.linalg.inv(SIGMA)
    d = x - MU
    return -0.5 * anp.sum(d * anp.matmul(P, d)) - 0.5 * np.log(np.linalg.det(2 * np.pi * SIGMA))


def test_gaussian_log_density():  # CA-HES-3
    x = np.array([1.0, 1.0])
    v, g = ad.value_and_grad(log_normal)(x)
    assert v == pytest.approx(-4.234615431229837, rel=1e-12)
    np.testing.assert_allclose(g, [0.42682927, -2.25609756], rtol=1e-8)
    rng = np.random.default_rng(0)
    for x in rng.normal(size=(100, 2)) * 3:
        np.testing.assert_allclose(ad.hessian(log_normal)(x), -np.linalg.inv(SIGMA), rtol=1e-12)


def sin_xy(v):
    return anp.sin(v[0] * v[1]) + v[0] ** 3 * v[1]


def test_sin_xy_hessian():  # CA-HES-4
    x = np.array([1.0, 2.0])
    v, g = ad.value_and_grad(sin_xy)(x)
    assert v == pytest.approx(2.9092974268256815, rel=1e-14)
    np.testing.assert_allclose(g, [5.167706326905715, 0.5838531634528576], rtol=1e-14)
    H = ad.hessian(sin_xy)(x)
    np.testing.assert_allclose(
        H, [[8.362810292697274, 0.7652583098014942], [0.7652583098014942, -0.9092974268256817]],
        rtol=1e-13,
    )
    assert np.array_equal(H, H.T)


def _hessian_methods(f, x):
    """Forward-over-reverse, reverse-over-reverse and reverse-over-forward Hessians."""
    n = x.size
    for_ = ad.hessian(f)(x)
    ror = ad.jacobian(ad.grad(f), mode="rev")(x)
    rof = np.stack([ad.grad(lambda y, e=e: ad.jvp(f, (y,), (e,))[1])(x) for e in np.eye(n)])
    fof = ad.jacobian(ad.grad(f), mode="fwd")(x)
    return for_, ror, rof, fof


def _random_composition(rng, n):
    ops = [anp.sin, anp.cos, anp.tanh, anp.exp, lambda t: t * t, lambda t: anp.sqrt(1 + t * t)]
    picks = rng.integers(0, len(ops), size=(3, n))
    coeffs = rng.normal(size=(3, n))

    def f(x):
        acc = 0.0
        for layer in range(3):
            h = 0.0
            for i in range(n):
                h = h + coeffs[layer, i] * ops[picks[layer, i]](x[i] + 0.1 * layer)
            acc = acc + anp.tanh(h) * x[layer % n]
        return acc

    return f


@pytest.mark.parametrize("case", range(20))
def test_hessian_methods_agree(case):  # CA-HES-6 (FoR, RoR, RoF, FoF)
    rng = np.random.default_rng(case)
    n = int(rng.integers(2, 7))
    f = _random_composition(rng, n)
    x = rng.normal(size=n)
    Hs = _hessian_methods(f, x)
    for H in Hs[1:]:
        np.testing.assert_allclose(H, Hs[0], rtol=1e-10, atol=1e-12)
    assert np.array_equal(Hs[0], Hs[0].T)


def test_hessian_matches_finite_differences_of_gradient():
    rng = np.random.default_rng(5)
    f = _random_composition(rng, 4)
    x = rng.normal(size=4)
    g = ad.grad(f)
    h = 1e-6
    fd = np.stack([(g(x + h * e) - g(x - h * e)) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(ad.hessian(f)(x), fd, rtol=1e-6, atol=1e-8)


def test_batched_gaussian_hessians():  # CA-HES-9
    P = np.linalg.inv(SIGMA)

    def lanes(x):
        d = x - MU
        return -0.5 * anp.sum(d * anp.matmul(d, P), axis=1)

    x = np.random.default_rng(1).normal(size=(10_000, 2))
    g, H = ad.batch_hessian(lanes, x)
    assert H.shape == (10_000, 2, 2) and g.shape == (10_000, 2)
    np.testing.assert_allclose(H, np.broadcast_to(-P, H.shape), rtol=1e-12)
    np.testing.assert_allclose(g, -(x - MU) @ P, rtol=1e-12)


def throughput(x):
    n = x.shape[1]
    c = 1.0
    for i in range(n):
        c = c * anp.cos(0.3 * (i + 1) * x[:, i])
    r = 1.0 + anp.sum(x * x, axis=1) * 0.25
    return c * anp.exp(-0.1 * x[:, 0] * x[:, 1]) / r


def test_batch_hessian_matches_per_lane_dense_hessian():
    x = np.random.default_rng(2).uniform(-1, 1, (64, 5))
    g, H = ad.batch_hessian(throughput, x)
    assert np.array_equal(H, np.swapaxes(H, 1, 2))  # exactly symmetric
    for b in (0, 17, 63):
        single = lambda v: throughput(v[None, :])[0]  # noqa: E731
        np.testing.assert_allclose(H[b], ad.hessian(single)(x[b]), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(g[b], ad.grad(single)(x[b]), rtol=1e-12)


def test_vhv_by_reverse_over_reverse():  # CA-HES-10
    rng = np.random.default_rng(4)
    M = rng.normal(size=(5, 5))
    A, b = M @ M.T + np.eye(5), rng.normal(size=5)
    f = lambda x: 0.5 * anp.sum(x * anp.matmul(A, x)) - anp.sum(b * x)  # noqa: E731
    x, v = rng.normal(size=5), rng.normal(size=5)
    vhv = ad.grad(lambda y: anp.sum(ad.grad(f)(y) * v))(x) @ v
    assert vhv == pytest.approx(v @ A @ v, rel=1e-12)


def test_third_derivative_by_nesting():  # CA-HES-11
    f = lambda x: anp.exp(anp.exp(x))  # noqa: E731
    assert ad.grad(f)(0.5) == pytest.approx(8.573887702979121, rel=1e-14)
    assert ad.grad(ad.grad(f))(0.5) == pytest.approx(22.709838731475063, rel=1e-14)
    assert ad.grad(ad.grad(ad.grad(f)))(0.5) == pytest.approx(74.28798393072356, rel=1e-13)
    x = ad.Array(0.5, requires_grad=True)
    y = f(x)
    y.backward(create_graph=True)
    d1, x.grad = x.grad, None
    d1.backward(create_graph=True)
    d2, x.grad = x.grad, None
    d2.backward()
    assert float(x.grad) == pytest.approx(74.28798393072356, rel=1e-13)


def test_grad_of_closure_over_outer_variable():
    # The inner grad closes over the outer variable: its result must stay differentiable.
    outer = lambda a: ad.grad(lambda y: a * y * y)(1.5)  # noqa: E731  d/dy = 3a
    assert ad.grad(outer)(2.0) == pytest.approx(3.0, rel=1e-14)


def test_pytrees_and_argnums():
    def f(params, x):
        return anp.sum(params["w"] * x) + params["b"][0] ** 2

    params = {"w": np.array([1.0, 2.0]), "b": (np.array(3.0),)}
    g = ad.grad(f)(params, np.array([4.0, 5.0]))
    np.testing.assert_array_equal(g["w"], [4.0, 5.0])
    assert g["b"][0] == 6.0
    gp, gx = ad.grad(f, argnums=(0, 1))(params, np.array([4.0, 5.0]))
    np.testing.assert_array_equal(gx, [1.0, 2.0])
    (v, aux), g = ad.value_and_grad(lambda p, x: (f(p, x), "aux"), has_aux=True)(
        params, np.array([4.0, 5.0])
    )
    assert aux == "aux" and v == 23.0


def test_vjp_and_jvp_transpose_identity():
    rng = np.random.default_rng(7)
    A = rng.normal(size=(4, 3))
    f = lambda x: anp.tanh(anp.matmul(A, x)) * x[0]  # noqa: E731
    x, v, w = rng.normal(size=3), rng.normal(size=3), rng.normal(size=4)
    _, jv = ad.jvp(f, (x,), (v,))
    out, pull = ad.vjp(f, x)
    (jtw,) = pull(w)
    assert np.dot(jv, w) == pytest.approx(np.dot(v, jtw), rel=1e-12)
    (jtw2,) = pull(2 * w)  # the pullback can be called again
    np.testing.assert_allclose(jtw2, 2 * jtw, rtol=1e-14)


def test_check_grads_on_composite():
    rng = np.random.default_rng(8)
    ad.check_grads(lambda x, y: anp.sin(x) * anp.exp(y) / (1 + x * x), (rng.normal(size=3),
                                                                       rng.normal(size=3)))


def test_compiled_batch_hessian_matches_traced():
    x = np.random.default_rng(3).uniform(-1, 1, (200, 5))
    g1, H1 = ad.batch_hessian(throughput_cols, x, compiled=True)
    g2, H2 = ad.batch_hessian(throughput_cols, x)
    np.testing.assert_allclose(g1, g2, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(H1, H2, rtol=1e-12, atol=1e-15)
    assert np.array_equal(H1, np.swapaxes(H1, 1, 2))
    hess = ad.compiled_batch_hessian(throughput_cols, 5, "float32")
    g32, H32 = hess(x.astype(np.float32))
    assert H32.dtype == np.float32
    np.testing.assert_allclose(H32, H2, rtol=2e-4, atol=1e-5)  # float32 round-off
    with pytest.raises(TypeError, match="compiled for float32"):
        hess(x)


def throughput_cols(x):
    n = x.shape[1]
    c, r = 1.0, 1.0
    for i in range(n):
        c = c * anp.cos(0.3 * (i + 1) * x[:, i])
        r = r + 0.25 * x[:, i] * x[:, i]
    return c * anp.exp(-0.1 * x[:, 0] * x[:, 1]) / r


def test_compiled_batch_hessian_rejects_whole_array_code():
    with pytest.raises(ad.SymbolicTraceError, match="columns"):
        ad.compiled_batch_hessian(lambda v: anp.sum(v * v, axis=1), 3)
