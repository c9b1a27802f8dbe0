"""Application-flavoured integration tests (docs/design/core-ad.md §5: CA-APP-3 and CA-APP-4)."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp


def _estimate(p, u):
    """Monte Carlo estimate of int_0^1 step(x - p) * x dx with samples u (AD sees only the
    integrand's smooth part: the step's derivative is a Dirac delta point samples never hit)."""
    return anp.mean(anp.where(u > p, u, 0.0))


@ad.custom_vjp
def estimate_with_edge(p, u):
    return _estimate(p, u)


def _fwd(p, u):
    return _estimate(p, u), p


def _bwd(p, ct):
    # Boundary (edge) term of the Reynolds transport: the integrand jumps from p to 0 at x = p,
    # so d/dp picks up -f(p) = -p. The interior term is zero (the integrand does not depend on p).
    return (ct * -p, None)


estimate_with_edge.defvjp(_fwd, _bwd)


def test_edge_term_through_custom_rule():  # CA-APP-3
    p0, n = 0.3, 2_000_000
    u = np.random.default_rng(0).uniform(size=n)
    g_edge = ad.grad(estimate_with_edge)(p0, u)
    g_plain = ad.grad(_estimate)(p0, u)
    h = 1e-2  # common random numbers: the same u on both sides; the step must cover samples
    fd = (float(_estimate(p0 + h, u)) - float(_estimate(p0 - h, u))) / (2 * h)
    assert g_plain == 0.0  # plain AD misses the Dirac term entirely
    assert g_edge == pytest.approx(-p0, rel=1e-12)
    # The difference counts the ~2hn = 40000 samples in the band: relative noise ~0.5%, so 2%
    # is four standard errors.
    assert fd == pytest.approx(-p0, rel=0.02)


def test_zero_throughput_lanes_stay_local():  # CA-APP-4
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (256, 3))
    x[::7, 0] = 0.0  # f = 0 exactly on these lanes: log f = -inf

    def log_f(v):
        return anp.log(anp.abs(v[:, 0]) * anp.exp(v[:, 1] * v[:, 2]))

    with np.errstate(divide="ignore"):
        g, H = ad.batch_hessian(log_f, x)
    dead = x[:, 0] == 0.0
    assert np.all(np.isfinite(g[~dead])) and np.all(np.isfinite(H[~dead]))
    assert not np.all(np.isfinite(g[dead]))  # flagged lanes are visibly non-finite
    ref = ad.hessian(lambda v: log_f(v[None, :])[0])(x[1])
    # atol: entries that cancel to exactly 0 in one evaluation order are ~1e-17 in another
    # (the fused kernels of lazy mode); the Hessian's scale is 1
    np.testing.assert_allclose(H[1], ref, rtol=1e-12, atol=1e-15)
