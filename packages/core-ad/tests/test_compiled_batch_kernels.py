"""Compiled per-lane kernels: gradient only, and value + gradient + Hessian in one kernel."""

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
import pytest


def log_f(x):
    # non-symmetric in its columns (a swapped axis fails), with a branch
    a, b, c = x[:, 0], x[:, 1], x[:, 2]
    return anp.sin(3.0 * a) * anp.exp(-b * b) + anp.where(c > 0, c * c * a, 0.5 * c) + a * b * c


def _fd_grad(x, h=1e-6):
    # central differences in float64, h ~ 1e-6 * max(1, |x|) for smooth code
    g = np.empty_like(x)
    for j in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, j] = h * np.maximum(1.0, np.abs(x[:, j]))
        g[:, j] = (log_f(x + e) - log_f(x - e)) / (2 * e[:, j])
    return g


@pytest.fixture
def x():
    return np.random.default_rng(0).uniform(-1.5, 1.5, (203, 3))


def test_value_grad_hessian_kernel(x):
    hess = ad.compiled_batch_hessian(log_f, 3, value=True)
    v, g, H = hess(x)
    np.testing.assert_allclose(v, log_f(x), rtol=1e-13, atol=1e-14)
    g_ref, H_ref = ad.batch_hessian(log_f, x)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(H, H_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g, _fd_grad(x), rtol=1e-7, atol=1e-8)  # FD truncation ~h^2
    # the Hessian against differences of the exact gradient
    grad_only = ad.compiled_batch_grad(log_f, 3)
    for j in range(3):
        e = np.zeros_like(x)
        e[:, j] = 1e-6
        col = (grad_only(x + e) - grad_only(x - e)) / 2e-6
        np.testing.assert_allclose(H[:, :, j], col, rtol=1e-6, atol=1e-7)
    # without value=True the old (grad, hessian) contract holds (another kernel: the
    # compiler may contract other products into FMAs, so agreement is to a few ulps)
    g2, H2 = ad.compiled_batch_hessian(log_f, 3)(x)
    np.testing.assert_allclose(g2, g, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(H2, H, rtol=1e-14, atol=1e-14)


def test_gradient_only_kernel(x):
    g = ad.compiled_batch_grad(log_f, 3)(x)
    np.testing.assert_allclose(g, ad.grad(lambda v: anp.sum(log_f(v)))(x), rtol=1e-12,
                               atol=1e-13)
    v, g2 = ad.compiled_batch_grad(log_f, 3, value=True)(x)
    np.testing.assert_allclose(g2, g, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(v, log_f(x), rtol=1e-13, atol=1e-14)


def test_lane_independent_output_broadcasts():
    v, g = ad.compiled_batch_grad(lambda x: 2.0 * x[:, 0] + 1.0, 2, value=True)(np.ones((4, 2)))
    np.testing.assert_array_equal(g, np.broadcast_to([2.0, 0.0], (4, 2)))
    np.testing.assert_array_equal(v, np.full(4, 3.0))


def test_bad_input_named():
    k = ad.compiled_batch_grad(log_f, 3)
    with pytest.raises(ValueError, match=r"\(B, 3\)"):
        k(np.zeros((4, 2)))
    with pytest.raises(TypeError, match="float32"):
        k(np.zeros((4, 3), np.float32))
    with pytest.raises(ad.SymbolicTraceError, match="x\\[:, j\\]"):
        ad.compiled_batch_grad(lambda v: anp.sum(v * v, axis=1), 3)
