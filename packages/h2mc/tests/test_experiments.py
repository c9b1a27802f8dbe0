"""AE-5 (mixing vs RWM / MALA / HMC), AE-6 (acceptance vs sigma2), AE-13 (proposal economy)."""

import numpy as np
import pytest

from h2mc import _experiments as E


def test_ae5_gaussian_ridge_h2mc_beats_rwm_5x_and_hmc():
    r = E.ae5_mixing("a", chains=32, steps=600, hmc_steps=20,
                     rwm_sigmas=(1e-3, 3e-3, 1e-2, 3e-2), mala_steps=(1e-3, 3e-3))
    assert r["h2mc"]["reliable"]  # H2MC's tau (~7) is measured, not truncated
    # the baselines' taus are truncated by the short runs, which over-estimates their ESS:
    # the ratios below are lower bounds
    assert r["ratio_rwm"] >= 5
    assert r["ratio_hmc"] > 1
    assert r["h2mc"]["acceptance"] > r["rwm"]["acceptance"]


@pytest.mark.slow
@pytest.mark.parametrize("key", ["a", "b"])
def test_ae5_full(key):
    r = E.ae5_mixing(key, chains=32, steps=20000, hmc_steps=400, with_mixture=True)
    assert r["ratio_hmc"] > 1
    assert r["h2mc"]["acceptance"] > r["rwm"]["acceptance"]
    if key == "a":
        assert r["ratio_rwm"] >= 5
    # target (b): measured ~0.5x (mixture ~1x, see the package README): the min-ESS is set by
    # the diffusion around the circumference, and even a ring-aware local Gaussian stays < 5x
    # (test_ae5_ring_oracle_bound below).


def test_ae5_ring_h2mc_resamples_the_radial_profile_rwm_does_not():
    """Where H2MC does beat RWM on the ring: its radial move is (locally) an exact draw from
    the ring's cross-section, so the distance to the ring decorrelates in one step. Measured
    lag-1 correlations of d between consecutive on-ring states: H2MC 0.45, RWM 0.63 (sigma
    1e-2) to 0.91 (sigma 0.1, the best for min-ESS) and higher for smaller sigmas."""
    target = E.make_target("b")
    x0 = E.stationary_starts(target, 32, np.random.default_rng(1000))
    h = E._tau_run(target, E.H2MCStep(sigma2=E.TUNED_SIGMA2["b"]), 32, 600, 0, x0)
    rw = [E._tau_run(target, E.RandomWalk(sigma=s), 32, 600, 0, x0) for s in E.RWM_SIGMAS[2:]]
    assert h["radial_lag1"] < 0.55 < min(r["radial_lag1"] for r in rw), (h, rw)
    assert h["acceptance"] > max(r["acceptance"] for r in rw[-3:])  # sigma >= 1e-2


@pytest.mark.slow
def test_ae5_ring_oracle_bound():
    """The best ring-aware local Gaussian (exact ring geometry, curvature drift compensated)
    over a (s_t, s_r) grid stays below 5x RWM's min-ESS per evaluation, even with log f left
    out of its tau: the spec's 5x on (b) is out of reach of any H2MC-type Gaussian proposal.
    Measured (32 x 20000): see the package README."""
    r = E.ae5_ring_oracle_bound()
    assert r["oracle"]["reliable"] and r["rwm"]["reliable"]
    assert r["ratio"] < 5
    assert r["ratio_xy"] < 5


def test_ae5_ring_min_ess_rewards_global_moves():
    """On the ring, the independent uniform proposal alone (no derivatives, no local move)
    has ~5x best RWM's min-ESS per evaluation (measured 5.25x, tau 66 vs 345), and mixing it
    into RWM only dilutes it: AE-5's 5x on (b) measures jumps around the circumference, which
    no local proposal makes."""
    r = E.ae5_ring_global_moves(chains=32, steps=8000, p_large=(0.5,), with_h2mc=False)
    assert all(v["reliable"] for v in r.values())
    assert r["large only"]["ratio_rwm"] > 4
    assert r["large only"]["ess_per_eval"] > r["large 0.5 + rwm"]["ess_per_eval"]


@pytest.mark.slow
def test_ae5_ring_large_steps_help_h2mc_and_rwm_alike():
    """The thesis' chain mixes H2MC with large steps; on (b) the large steps set the mixing,
    for H2MC and for RWM (Kelemen) alike, and neither mixture beats the large steps alone.
    Measured (32 x 20000): large 0.3 + H2MC 2.1x, + RWM 2.5x; large 0.5: 3.1x / 3.4x;
    large only 5.3x."""
    r = E.ae5_ring_global_moves()
    assert all(v["reliable"] for v in r.values())
    for p in (0.3, 0.5):
        h, k = r[f"large {p:g} + h2mc"], r[f"large {p:g} + rwm"]
        assert 0.5 < h["ess_per_eval"] / k["ess_per_eval"] < 2
        assert h["ess_per_eval"] < r["large only"]["ess_per_eval"]


def test_ae6_acceptance_falls_as_sigma2_grows():
    rows = E.ae6_sigma_sweep("b", chains=600, steps=60)
    acc = [r["acceptance"] for r in rows]
    se = [r["se"] for r in rows]
    for i in range(len(rows) - 1):
        # strictly decreasing, each step by more than 4 combined standard errors
        assert acc[i] - acc[i + 1] > 4 * np.hypot(se[i], se[i + 1]), rows
    assert any(0.5 <= a <= 0.7 for a in acc)


def test_ae13_evaluation_counts_match_fig_6_6():
    rows = E.ae13_economy("b")
    assert rows["HMC, 128 proposals"]["evals"] == 12929
    assert rows["H2MC, 128 proposals"]["evals"] == 129
    assert rows["HMC, 128 states"]["evals"] == 12929
    assert rows["H2MC, 128 states"]["evals"] == 129
    assert rows["H2MC, 1024 states"]["evals"] == 1025
    for v in rows.values():
        assert 0 < v["acceptance"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_ae4_twice_the_spec_size(key):
    """AE-4 with another seed and 4e6 steps of the mixture (16000 chains x 250 steps)."""
    r = E.ae4_stationarity(key, chains=16000, steps=250, seed=7)
    assert r["tv"] < 0.02
    for k in ("Ex", "Ey", "Ex2"):
        assert abs(r[k]["z"]) < 4


@pytest.mark.slow
@pytest.mark.parametrize("key", ["b", "c"])
def test_ae4_from_uniform_starts(key):
    """Convergence, not just invariance: uniform seeds, 1500 burn-in steps (the ring <-> floor
    exchange has tau ~ 150-300 steps), then 4e6 states (unstratified seeds: at 2e6 states the
    histogram noise alone is ~0.015-0.02 TV)."""
    r = E.ae4_stationarity(key, chains=8000, steps=500, seed=11, start="uniform", burn_in=1500)
    assert r["tv"] < 0.02
    for k in ("Ex", "Ey", "Ex2"):
        assert abs(r[k]["z"]) < 4
