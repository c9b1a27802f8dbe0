"""Target: values, core_ad derivatives vs central differences, and bad input handling."""

import numpy as np
import pytest

import core_ad.numpy as anp
from h2mc import NonSymmetricHessianError, Target, TargetShapeError, toy


def _fd_grad(t, x, h=1e-6):
    # h = 1e-6 * max(1, |x|) with x in [0, 1]: the default for smooth code (docs/ARCHITECTURE.md)
    g = np.zeros_like(x)
    for j in range(x.shape[1]):
        e = np.zeros(x.shape[1])
        e[j] = h
        g[:, j] = (t.log_f(x + e) - t.log_f(x - e)) / (2 * h)
    return g


def _fd_hess(t, x, h=1e-6):
    n = x.shape[1]
    H = np.zeros((x.shape[0], n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = h
        gp, _ = t.derivatives(x + e)
        gm, _ = t.derivatives(x - e)
        H[:, :, j] = (gp - gm) / (2 * h)
    return H


def _nd_target(n, derivatives="traced"):
    c = np.linspace(0.3, 0.7, n)

    def log_f(x):
        s = 0.0
        for j in range(n):
            d = x[:, j] - c[j]
            s = s - 20.0 * d * d + 0.5 * anp.sin(6.0 * x[:, j] * x[:, (j + 1) % n])
        return s + anp.log(1.0 + x[:, 0] * x[:, n - 1])

    return Target(log_f, n, derivatives=derivatives)


@pytest.mark.parametrize("key", ["a", "b"])
def test_toy_derivatives_match_central_differences(key, rng):
    t = toy.TOY_TARGETS[key]()
    # points near the feature, where derivatives are large
    x = toy.stationary_starts(t, 50, rng)
    g, H = t.derivatives(x)
    gfd = _fd_grad(t, x)
    # tolerance: h^2 f''' truncation + eps/h rounding, relative to the gradient scale
    scale_g = np.max(np.abs(g))
    assert np.max(np.abs(g - gfd)) < 1e-6 * scale_g
    Hfd = _fd_hess(t, x)
    assert np.max(np.abs(H - Hfd)) < 1e-5 * np.max(np.abs(H))
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))


@pytest.mark.parametrize("n", [3, 8])
def test_compiled_traced_and_gradient_paths_agree(n, rng):
    tt, tc = _nd_target(n, "traced"), _nd_target(n, "compiled")
    x = rng.random((64, n))
    g1, H1 = tt.derivatives(x)
    g2, H2 = tc.derivatives(x)
    np.testing.assert_allclose(g2, g1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(H2, H1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tt.gradient(x), g1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tc.gradient(x), g1, rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(g1 - _fd_grad(tt, x))) < 1e-6 * np.max(np.abs(g1))


def test_nan_and_posinf_values_become_minus_inf_and_are_counted():
    def log_f(x):
        v = -x[:, 0] ** 2
        return np.where(x[:, 1] < 0.3, np.nan, np.where(x[:, 1] > 0.9, np.inf, v))

    t = Target(log_f, 2, derivatives=lambda x: (np.zeros((len(x), 2)), np.zeros((len(x), 2, 2))))
    lf = t.log_f(np.array([[0.5, 0.1], [0.5, 0.5], [0.5, 0.95]]))
    assert lf[0] == -np.inf and lf[2] == -np.inf and lf[1] == -0.25
    assert t.counts["nonfinite_value"] == 2


def test_support_gives_minus_inf_without_calling_log_f():
    calls = []

    def log_f(x):
        calls.append(len(x))
        return -x[:, 0]

    t = Target(log_f, 2, support=lambda x: x[:, 0] < 0.5)
    lf = t.log_f(np.array([[0.2, 0.0], [0.7, 0.0], [0.4, 0.1]]))
    assert calls == [2] and lf[1] == -np.inf and np.isfinite(lf[[0, 2]]).all()


def test_non_symmetric_user_hessian_is_a_clear_error():
    def derivs(x):
        H = np.zeros((len(x), 2, 2))
        H[:, 0, 1] = 1.0
        return np.zeros((len(x), 2)), H

    t = Target(lambda x: -x[:, 0] ** 2, 2, derivatives=derivs, name="lopsided")
    with pytest.raises(NonSymmetricHessianError, match="lopsided.*not symmetric at lane 0"):
        t.derivatives(np.full((3, 2), 0.5))


def test_rounding_level_asymmetry_is_accepted():
    def derivs(x):
        H = np.array([[[-100.0, 3.0], [3.0 + 1e-12, -50.0]]] * len(x))
        return np.zeros((len(x), 2)), H

    t = Target(lambda x: -x[:, 0] ** 2, 2, derivatives=derivs)
    g, H = t.derivatives(np.full((2, 2), 0.5))
    assert H.shape == (2, 2, 2)


def test_shape_errors_name_the_problem():
    t = Target(lambda x: -x, 2, derivatives=lambda x: (0, 0))
    with pytest.raises(TargetShapeError, match=r"must map \(B, 2\) to \(B,\)"):
        t.log_f(np.full((3, 2), 0.5))
    with pytest.raises(TargetShapeError, match=r"x must have shape \(B, 2\)"):
        t.log_f(np.full((3, 3), 0.5))
    with pytest.raises(TargetShapeError, match="derivatives must return"):
        t.derivatives(np.full((3, 2), 0.5))
    with pytest.raises(ValueError, match="derivatives must be one of"):
        Target(lambda x: x[:, 0], 2, derivatives="magic")


def test_active_mask_zeroes_inactive_derivatives(rng):
    t0 = _nd_target(3)
    t = Target(t0.log_f_fn, 3, active=lambda x: np.stack(
        [np.ones(len(x), bool), x[:, 0] > 0.5, np.ones(len(x), bool)], axis=1))
    x = rng.random((20, 3))
    g, H = t.derivatives(x)
    g0, H0 = t0.derivatives(x)
    off = x[:, 0] <= 0.5
    assert np.all(g[off, 1] == 0) and np.all(H[off, 1, :] == 0) and np.all(H[off, :, 1] == 0)
    np.testing.assert_array_equal(g[~off], g0[~off])
