"""The ring oracle of AE-5 (h2mc._oracle): its sampler and its density agree, and it is exact."""

import numpy as np

from h2mc import _experiments as E
from h2mc._oracle import RingOracleStep
from h2mc._sampler import Sampler


def test_oracle_samples_follow_its_density():
    k = RingOracleStep(s_t=0.05, s_r=0.01)
    x = np.array([[0.5 + 0.303, 0.5]])  # d = 0.003 outside the ring; n = +x, t = +y
    state = Sampler(E.make_target("b"), k).init(np.repeat(x, 40000, axis=0))
    z, _, _ = k.propose(None, state, np.arange(40000), np.random.default_rng(0))
    shift = 0.05 ** 2 / (2 * 0.3)
    assert abs(z[:, 0].mean() - (-0.003 - shift)) < 4 * 0.01 / 200
    assert abs(z[:, 1].mean()) < 4 * 0.05 / 200
    assert abs(z[:, 0].std() / 0.01 - 1) < 0.02 and abs(z[:, 1].std() / 0.05 - 1) < 0.02
    # the density integrates to 1 (midpoint rule over +-6 std-devs)
    u = np.linspace(-6, 6, 601)[:-1] + 0.01
    gx, gy = np.meshgrid(-0.003 - shift + 0.01 * u, 0.05 * u, indexing="ij")
    zz = np.stack([gx.ravel(), gy.ravel()], axis=1)
    dens = np.exp(k.log_density(np.repeat(x, len(zz), axis=0), zz))
    assert abs(dens.sum() * (0.02 * 0.01) * (0.02 * 0.05) - 1) < 1e-6


def test_oracle_chain_keeps_the_ring_distribution():
    """Exactness: from stationary seeds the oracle leaves the ring's radial profile in place
    (mean distance to the centre and the floor's share, vs quadrature of the same seeds)."""
    target = E.make_target("b")
    x0 = E.stationary_starts(target, 4000, np.random.default_rng(3))
    s = Sampler(target, RingOracleStep(s_t=0.1, s_r=0.01))
    res = s.run(s.init(x0), 40, np.random.default_rng(4))
    r = np.hypot(res.samples[:, :, 0] - 0.5, res.samples[:, :, 1] - 0.5)
    r0 = np.hypot(x0[:, 0] - 0.5, x0[:, 1] - 0.5)
    on, on0 = np.abs(r - 0.3) < 0.02, np.abs(r0 - 0.3) < 0.02
    assert abs(on.mean() - on0.mean()) < 0.01
    assert abs(r[on].mean() - r0[on0].mean()) < 2e-4
