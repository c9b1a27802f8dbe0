"""AE-1: the closed-form dynamics against RK4 integration and Monte Carlo over the momentum."""

import itertools

import numpy as np
import pytest

from h2mc import dynamics_coefficients, h2mc_proposal

ALPHAS = [-4.0, -1.0, -0.25, 0.0, 0.25, 1.0, 4.0]
BETAS = [-1.0, 0.0, 2.0]
TS = [0.3, np.pi / 2, 2.0]
PHATS = [-1.0, 0.5]


def _rk4(alpha, beta, p, T, n_steps):
    """Integrate x'' = alpha x + beta from x=0, x'=p to time T (vectorised over parameters)."""
    dt = T / n_steps
    x = np.zeros_like(alpha)
    v = p.copy()
    for _ in range(n_steps):
        k1x, k1v = v, alpha * x + beta
        k2x, k2v = v + 0.5 * dt * k1v, alpha * (x + 0.5 * dt * k1x) + beta
        k3x, k3v = v + 0.5 * dt * k2v, alpha * (x + 0.5 * dt * k2x) + beta
        k4x, k4v = v + dt * k3v, alpha * (x + dt * k3x) + beta
        x = x + dt / 6 * (k1x + 2 * k2x + 2 * k3x + k4x)
        v = v + dt / 6 * (k1v + 2 * k2v + 2 * k3v + k4v)
    return x


def test_closed_form_matches_rk4():
    # dt = T / 200000 <= 1e-5 for every T (spec: RK4 at dt = 1e-5); RK4's global error at
    # this step is ~1e-15 relative, far below the 1e-6 tolerance of the spec.
    combos = np.array(list(itertools.product(ALPHAS, BETAS, TS, PHATS)))
    a, b, T, p = combos.T
    x_num = _rk4(a, b, p, T, 200_000)
    s, o = dynamics_coefficients(a, b, T)
    assert np.max(np.abs(x_num - (s * p + o))) < 1e-6


def test_thesis_offset_variant_differs_only_for_positive_alpha_and_nonzero_beta():
    combos = np.array(list(itertools.product(ALPHAS, BETAS, TS)))
    a, b, T = combos.T
    s1, o1 = dynamics_coefficients(a, b, T, "exact")
    s2, o2 = dynamics_coefficients(a, b, T, "thesis")
    np.testing.assert_array_equal(s1, s2)
    differs = (a > 0) & (b != 0)
    assert np.all(np.abs(o1 - o2)[differs] > 1e-3)
    np.testing.assert_array_equal(o1[~differs], o2[~differs])
    # erratum D1: at T = pi/2 the factors are cosh - 1 = 1.509... vs cosh - 1/2 = 2.009...
    _, oe = dynamics_coefficients(1.0, 1.0, np.pi / 2, "exact")
    _, ot = dynamics_coefficients(1.0, 1.0, np.pi / 2, "thesis")
    assert abs(oe - 1.5091784787) < 1e-9 and abs(ot - 2.0091784787) < 1e-9


def test_table_4_4_values_at_half_pi():
    s, _ = dynamics_coefficients(np.array([-1.0, 1.0, 0.0]), 0.0, np.pi / 2)
    np.testing.assert_allclose(s, [1.0, 2.3012989023, np.pi / 2], rtol=1e-10)
    # v = s^2 a with a = 1/lam for the convex case: 5.2959766378 / lam
    lam = 3.0
    g = h2mc_proposal(np.zeros(1), np.array([[lam]]), np.inf, fallback_hessian_norm=0.0)
    np.testing.assert_allclose(1 / g.precision[0, 0], 5.2959766378 / lam, rtol=1e-10)


@pytest.mark.parametrize("alpha,a", [(-1.0, 0.5), (1.0, 2.0), (-4.0, 0.1), (0.25, 1.0)])
def test_momentum_monte_carlo(alpha, a):
    """p ~ N(0, 1/a) gives x(T) = s a p + o: mean o and variance s^2 a, within 3 SE (1e6 draws)."""
    beta, T, N = 0.7, np.pi / 2, 1_000_000
    rng = np.random.default_rng(7)
    p = rng.standard_normal(N) / np.sqrt(a)
    s, o = dynamics_coefficients(alpha, beta, T)
    x = s * a * p + o
    var = s * s * a
    # alpha = -4 at T = pi/2 is a full half-period: s = sin(pi)/2 ~ 1e-16, a point mass at o
    # (the 1e-12 absolute floor covers its rounding)
    assert abs(x.mean() - o) < 3 * np.sqrt(var / N) + 1e-12
    assert abs(x.var() - var) < 3 * var * np.sqrt(2.0 / N) + 1e-12
