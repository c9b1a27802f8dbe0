"""AE-8 (renderer consistency): the reference's own error estimate here; the experiment
itself under -m slow (its PathSpace derives every technique's Hessian and lens kernels: ~13 s
of CPU even at 8x8). The default tier's small AE-8 checks are test_mlt.py's convergence tests
(PSSMLT, H2MC small steps, the lens perturbation, each against edge_rt)."""

import numpy as np
import pytest

from h2mc import AE8_KERNELS, ae8_consistency, mean_with_error, read_png_size, rel_mse


def test_mean_with_error_predicts_the_relmse_of_the_mean():
    """Renders = truth + independent noise of 10% (a reference's order): the estimate from
    the spread of K = 4 renders matches the mean's actual relMSE against the truth (averaged
    over 200 trials, to 5%; its denominator uses the noisy mean, which biases it by
    ~3 (sigma / truth)^2 / K, under 1% here), and each trial's estimate scatters around it
    (chi-square with 3 degrees of freedom per value, averaged over 768: within 20%)."""
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.05, 2.0, (16, 16, 3))
    sigma = 0.1 * truth + 0.01
    actual, estimates = [], []
    for _ in range(200):
        renders = truth + sigma * rng.standard_normal((4, *truth.shape))
        mean, est = mean_with_error(renders)
        np.testing.assert_allclose(mean, renders.mean(0))
        actual.append(rel_mse(mean, truth))
        estimates.append(est)
    expected = float(np.mean(sigma ** 2 / 4 / (truth ** 2 + 1e-2)))
    assert np.mean(actual) == pytest.approx(expected, rel=0.05)
    assert np.mean(estimates) == pytest.approx(expected, rel=0.05)
    assert np.abs(np.array(estimates) / expected - 1).max() < 0.2


def test_mean_with_error_needs_two_renders():
    with pytest.raises(ValueError, match=r"need \(K >= 2, H, W, 3\)"):
        mean_with_error(np.ones((1, 4, 4, 3)))
    with pytest.raises(ValueError, match="need"):
        mean_with_error(np.ones((4, 4, 3)))


def test_ae8_rejects_unknown_kernels_and_too_few_checkpoints():
    with pytest.raises(ValueError, match="unknown kernels.*'metropolis'"):
        ae8_consistency(kernels=("h2mc", "metropolis"))
    with pytest.raises(ValueError, match="doublings >= 1"):
        ae8_consistency(doublings=0)


@pytest.mark.slow
def test_ae8_small(tmp_path):
    """The experiment at 8x8, paths of 3 segments, 4 -> 32 mutations per pixel: every kernel
    converges towards edge_rt's image (relMSE at 32 below that at 4), the total luminance is
    b's (within 5% of the reference: bootstrap of 2^16), and the PNG holds the reference and
    the four renders above their error maps."""
    out = ae8_consistency((8, 8), max_length=3, mutations_per_pixel=4, doublings=3, chains=64,
                          reference_spp=512, bootstrap_samples=1 << 16, png=tmp_path / "ae8.png")
    assert out["mutations_per_pixel"] == [4, 8, 16, 32]
    assert set(out["relmse"]) == set(AE8_KERNELS)
    assert 0 < out["reference_relmse"] < 1e-2
    for name, errors in out["relmse"].items():
        assert len(errors) == 4 and np.isfinite(errors).all()
        assert errors[-1] < errors[0], (name, errors)
        np.testing.assert_allclose(out["relmse_net"][name],
                                   np.maximum(np.array(errors) - out["reference_relmse"], 1e-300))
        assert out["slope"][name] < 0
        assert out["luminance_ratio"][name] == pytest.approx(1.0, abs=0.05)
    assert out["acceptance"]["h2mc"]["lens"] > 0
    assert "lens" not in out["acceptance"]["h2 small only"]
    assert read_png_size(tmp_path / "ae8.png") == (5 * 8, 2 * 8)


@pytest.mark.slow
def test_ae8_long(tmp_path):
    """AE-8 at 32x32, paths up to 5 segments (the spec's 64x64 / 7 is ae8_consistency's default:
    about an hour of one core, measured in the README), 256 chains, 64 -> 2048 mutations per pixel (five doublings),
    against edge_rt at 4 x 4096 spp (its own relMSE ~1e-4, subtracted). Every kernel: relMSE
    falling as 1/t (fitted slope within 0.25 of -1), total luminance within 1%; the H2 kernels
    below 1e-3 at the end, the isotropic one (~2x the error per mutation) below 1.5e-3.
    The total luminance is the bootstrap's b (one bootstrap per seed, shared by the kernels):
    2^22 samples, a standard error of 0.24 %, so that the spec's 1 % is 4 of them; at the
    default 2^20 (0.48 %) this seed's b was 1.0 % high. Measured (2026-11-29, seed 0, relMSE at
    2048 before the subtraction; slope): h2mc 8.1e-4, -0.91; h2 small only 7.8e-4, -1.04; h2
    lens only 9.6e-4, -0.91; isotropic only 1.38e-3, -0.92; luminance x1.0024 for all; ~16 min
    on one core."""
    out = ae8_consistency((32, 32), max_length=5, mutations_per_pixel=64, doublings=5,
                          chains=256, reference_spp=4096, bootstrap_samples=1 << 22,
                          png=tmp_path / "ae8.png")
    assert out["reference_relmse"] < 2e-4
    for name in AE8_KERNELS:
        bound = 1.5e-3 if name == "isotropic only" else 1e-3
        assert out["relmse_net"][name][-1] < bound, (name, out["relmse"][name])
        assert -1.25 < out["slope"][name] < -0.75, (name, out["slope"][name])
        assert out["luminance_ratio"][name] == pytest.approx(1.0, abs=0.01)
