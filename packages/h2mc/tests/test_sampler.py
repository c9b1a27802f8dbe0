"""The batched kernel mixture: invariance of every kernel, bookkeeping, bad states."""

import numpy as np
import pytest

import core_ad.numpy as anp
from h2mc import (
    HMC,
    MALA,
    H2MCStep,
    InvalidStateError,
    IsotropicStep,
    LargeStep,
    RandomWalk,
    Sampler,
    Target,
    chain_means_se,
    toy,
)


def _bumpy(derivatives="compiled"):
    """A smooth, skewed 2D target well inside the cube (no wrap-around mass)."""

    def log_f(x):
        u, v = x[:, 0] - 0.45, x[:, 1] - 0.55
        return -(u * u) / 0.01 - (v - 2.0 * u * u) ** 2 / 0.004 + 0.4 * anp.sin(9.0 * x[:, 0])

    return Target(log_f, 2, derivatives=derivatives, name="bumpy")


KERNELS = {
    "rwm": RandomWalk(sigma=0.03),
    "mala": MALA(step=0.02),
    "hmc": HMC(step=0.005, n_steps=10),
    "h2mc": H2MCStep(sigma2=0.01),
    "h2mc-thesis-offsets": H2MCStep(sigma2=0.01, offset_variant="thesis"),
    "mixture": [(0.1, LargeStep()), (0.2, IsotropicStep(sigma2=1e-3)),
                (0.7, H2MCStep(sigma2=0.01))],
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_each_kernel_keeps_the_target_invariant(name):
    """From stationary seeds, E[x], E[y], E[x y] stay at the quadrature values within 4 SE
    (batch means: one batch per chain; 1500 chains x 60 steps)."""
    t = _bumpy()
    rng = np.random.default_rng(3)
    B, steps = 1500, 60 if name != "hmc" else 30
    x0 = toy.stationary_starts(t, B, rng)
    d = toy.grid_density(t, 1024)
    g = (np.arange(1024) + 0.5) / 1024
    ref = {"x": d.sum(1) @ g, "y": d.sum(0) @ g, "xy": g @ d @ g}
    s = Sampler(t, KERNELS[name])
    st = s.init(x0)
    res = s.run(st, steps, rng)
    xs = res.samples
    for k, v in (("x", xs[..., 0]), ("y", xs[..., 1]), ("xy", xs[..., 0] * xs[..., 1])):
        mean, se = chain_means_se(v)
        assert abs(mean - ref[k]) < 4 * se, (k, mean, ref[k], se)
    # the chains moved
    assert all(st_.accepted > 0.1 * st_.proposed for nm, st_ in s.stats.items()
               if nm != "large")


def test_broken_reverse_density_is_detected():
    """The invariance test can fail: a kernel that drops the reverse density is caught."""

    class Broken(H2MCStep):
        def log_q_ratio(self, state, idx, z, prop, ctx):
            out = super().log_q_ratio(state, idx, z, prop, ctx)
            return out - ctx["gy"].log_density(-z) + ctx["gy"].log_normalizer()

    t = _bumpy()
    rng = np.random.default_rng(3)
    x0 = toy.stationary_starts(t, 1500, rng)
    d = toy.grid_density(t, 1024)
    g = (np.arange(1024) + 0.5) / 1024
    s = Sampler(t, Broken(sigma2=0.01))
    res = s.run(s.init(x0), 60, rng)
    worst = 0.0
    for k, v, r in (("x", res.samples[..., 0], d.sum(1) @ g), ("y", res.samples[..., 1],
                                                                 d.sum(0) @ g)):
        mean, se = chain_means_se(v)
        worst = max(worst, abs(mean - r) / se)
    assert worst > 4


@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_ae4_stationarity(key):
    """AE-4 at the spec's size, 2e6 steps of the mixture (8000 chains x 250 steps) from
    stationary seeds; at 1e6 states the histogram noise of (b) alone is ~0.02 TV."""
    from h2mc._experiments import ae4_stationarity

    r = ae4_stationarity(key, chains=8000, steps=250, seed=1)
    assert r["tv"] < 0.02
    for k in ("Ex", "Ey", "Ex2"):
        assert abs(r[k]["z"]) < 4, (k, r[k])
    assert 0.5 <= r["acceptance"]["h2mc"] <= 0.95


def test_one_hessian_evaluation_per_h2mc_step():
    t = toy.ring(derivatives="compiled")
    rng = np.random.default_rng(0)
    s = Sampler(t, H2MCStep(sigma2=7e-3))
    st = s.init(toy.stationary_starts(t, 100, rng))
    t.reset_counts()
    s.run(st, 20, rng, record=False)
    # 100 refreshes at the seeds, then one derivative evaluation per finite proposal
    assert t.counts["hess"] <= 100 + 20 * 100
    assert t.counts["value"] == 20 * 100
    assert s.evaluations() == 100 + 20 * 100


def test_progress_bar_counts_steps(capsys):
    t = toy.ring(derivatives="compiled")
    rng = np.random.default_rng(0)
    s = Sampler(t, H2MCStep(sigma2=7e-3))
    s.run(s.init(toy.stationary_starts(t, 8, rng)), 12, rng, record=False, progress="ring")
    err = capsys.readouterr().err
    assert "ring" in err and "12/12" in err


def test_states_outside_the_cube_are_wrapped():
    t = toy.ring()
    s = Sampler(t, RandomWalk(sigma=0.01))
    st = s.init(np.array([[1.3, -0.2], [0.5, 0.8]]))
    np.testing.assert_allclose(st.x, [[0.3, 0.8], [0.5, 0.8]], atol=1e-15)
    assert st.wrapped_on_init == 1


def test_nonfinite_initial_state_is_an_error():
    s = Sampler(toy.ring(), RandomWalk(sigma=0.01))
    with pytest.raises(InvalidStateError, match="non-finite entries"):
        s.init(np.array([[np.nan, 0.5]]))
    with pytest.raises(InvalidStateError, match=r"shape \(B, 2\)"):
        s.init(np.zeros((3, 3)))


def test_zero_density_start_needs_a_large_step():
    t = toy.cut_ring()
    bad = np.array([[0.95, 0.5], [0.2, 0.5]])  # the first is outside the half-plane
    with pytest.raises(InvalidStateError, match="f = 0.*chain 0"):
        Sampler(t, H2MCStep(sigma2=1e-3)).init(bad)
    s = Sampler(t, [(0.1, LargeStep()), (0.9, H2MCStep(sigma2=1e-3))])
    st = s.init(bad)
    rng = np.random.default_rng(0)
    for _ in range(200):
        s.step(st, rng)
    assert np.isfinite(st.logf).all() and toy.half_plane(st.x).all()


def test_nan_target_regions_are_never_entered():
    def log_f(x):
        r = -((x[:, 0] - 0.5) ** 2 + (x[:, 1] - 0.5) ** 2) / 0.02
        return np.where(x[:, 0] > 0.6, np.nan, r)

    def derivs(x):
        d = x - 0.5
        H = np.broadcast_to(-np.eye(2) / 0.01, (len(x), 2, 2)).copy()
        g = -d / 0.01
        g[x[:, 0] > 0.55] = np.nan  # non-finite derivatives near the NaN region too
        return g, H

    t = Target(log_f, 2, derivatives=derivs)
    s = Sampler(t, [(0.2, LargeStep()), (0.8, H2MCStep(sigma2=0.01))])
    rng = np.random.default_rng(1)
    st = s.init(np.full((500, 2), 0.5))
    res = s.run(st, 40, rng)
    assert np.all(res.samples[..., 0] <= 0.6)
    assert np.isfinite(res.logf).all()
    assert t.counts["nonfinite_value"] > 0
    assert s.stats["h2mc"].accepted > 0


def test_hmc_rejects_nonfinite_gradients():
    t = Target(lambda x: -x[:, 0] ** 2, 2,
               derivatives=lambda x: (np.full((len(x), 2), np.nan), np.zeros((len(x), 2, 2))))
    s = Sampler(t, HMC(step=0.01, n_steps=3))
    st = s.init(np.full((10, 2), 0.5))
    acc = s.step(st, np.random.default_rng(0))
    assert not acc.any() and np.all(st.x == 0.5)


def test_mixture_probabilities_are_validated():
    with pytest.raises(ValueError, match="sum to 1"):
        Sampler(toy.ring(), [(0.5, LargeStep()), (0.2, RandomWalk(sigma=0.1))])
    with pytest.raises(ValueError, match="exactly one of sigma2"):
        H2MCStep()
    with pytest.raises(ValueError, match="offset_variant"):
        H2MCStep(sigma2=0.1, offset_variant="printed")


def test_kernel_choice_frequencies_match_probabilities():
    t = toy.ring(derivatives="compiled")
    s = Sampler(t, [(0.1, LargeStep()), (0.2, IsotropicStep(sigma2=1e-4)),
                    (0.7, H2MCStep(sigma2=7e-3))])
    rng = np.random.default_rng(0)
    st = s.init(toy.stationary_starts(t, 2000, rng))
    s.run(st, 20, rng, record=False)
    N = 40000
    for nm, p in zip(s.names, s.probs):
        se = np.sqrt(p * (1 - p) / N)
        assert abs(s.stats[nm].proposed / N - p) < 4 * se


def test_changing_active_dimensions_keep_the_chain_exact():
    """Discrete structure that changes between states (the renderer's static/moving paths):
    coordinate 2 ("time") is part of the smooth structure only where x0 > 0.5, elsewhere f
    does not depend on it and its derivatives are masked, so H2MC perturbs it by the prior
    alone. Seeds are exact draws (rejection sampling; f <= 1); 2000 chains x 80 steps of the
    mixture; moments within 4 batch-means SE of 3D quadrature (128^3 midpoints)."""

    def log_f(x):
        base = -((x[:, 0] - 0.45) ** 2 + (x[:, 1] - 0.5) ** 2) / (2 * 0.12 ** 2)
        timed = -((x[:, 2] - 0.3 - 0.5 * (x[:, 0] - 0.5)) ** 2) / (2 * 0.06 ** 2)
        return base + anp.where(x[:, 0] > 0.5, timed, 0.0 * x[:, 2])

    def active(x):
        return np.stack([np.ones(len(x), bool), np.ones(len(x), bool), x[:, 0] > 0.5], axis=1)

    t = Target(log_f, 3, active=active)
    rng = np.random.default_rng(8)
    cand = rng.random((200_000, 3))
    x0 = cand[np.log(rng.random(len(cand))) < t.log_f(cand)][:2000]
    g = (np.arange(128) + 0.5) / 128
    G = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    w = np.exp(t.log_f(G))
    w /= w.sum()
    s = Sampler(t, [(0.1, LargeStep()), (0.2, IsotropicStep(sigma2=1e-3)),
                    (0.7, H2MCStep(sigma2=1e-2))])
    st = s.init(x0)
    res = s.run(st, 80, rng)
    xs = res.samples
    for name, v, ref in (("x0", xs[..., 0], w @ G[:, 0]), ("x2", xs[..., 2], w @ G[:, 2]),
                         ("x2^2", xs[..., 2] ** 2, w @ G[:, 2] ** 2),
                         ("x0 x2", xs[..., 0] * xs[..., 2], w @ (G[:, 0] * G[:, 2]))):
        mean, se = chain_means_se(v)
        assert abs(mean - ref) < 4 * se, (name, mean, ref, se)
    assert s.stats["h2mc"].acceptance > 0.3
