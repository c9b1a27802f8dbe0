"""ESS (Geyer) on AR(1) chains with known autocorrelation time; histograms; PNG output."""


import numpy as np
import pytest

from h2mc import (
    ess,
    histogram2d,
    histogram_png,
    integrated_autocorrelation_time,
    min_ess,
    read_png_size,
    total_variation,
    write_png,
)


def _ar1(phi, N, B, rng):
    x = np.empty((N, B))
    x[0] = rng.standard_normal(B) / np.sqrt(1 - phi * phi)
    e = rng.standard_normal((N, B))
    for t in range(1, N):
        x[t] = phi * x[t - 1] + e[t]
    return x


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9])
def test_tau_of_ar1(phi, rng):
    """AR(1): tau = (1 + phi) / (1 - phi). 64 chains x 20000 steps: the estimator's relative
    SE is ~ sqrt(2 (2M+1) / N_total) ~ 1-3 %; 10 % tolerance."""
    x = _ar1(phi, 20000, 64, rng)
    tau = integrated_autocorrelation_time(x)
    assert abs(tau / ((1 + phi) / (1 - phi)) - 1) < 0.1
    assert abs(ess(x) / (x.size / tau) - 1) < 1e-12


def test_constant_chain_has_zero_ess():
    assert ess(np.ones((100, 3))) == 0.0


def test_min_ess_reports_each_coordinate(rng):
    s = np.stack([_ar1(0.0, 2000, 8, rng), _ar1(0.9, 2000, 8, rng)], axis=-1)
    r = min_ess(s, logf=s[..., 0])
    assert r["min"] == r["x1"] < r["x0"]
    assert set(r) == {"x0", "x1", "logf", "min"}


def test_histogram_and_tv(rng):
    s = rng.random((10000, 2))
    h = histogram2d(s, bins=8)
    assert h.shape == (8, 8) and abs(h.sum() - 1) < 1e-12
    assert total_variation(h, np.full((8, 8), 1 / 64)) < 0.05
    # [i_x, i_y] indexing
    h2 = histogram2d(np.array([[0.9, 0.1]]), bins=4)
    assert h2[3, 0] == 1.0


def test_png_writer_roundtrip(tmp_path, rng):
    img = rng.random((5, 7, 3))
    p = write_png(tmp_path / "x.png", img)
    assert read_png_size(p) == (7, 5)
    from PIL import Image

    with Image.open(p) as im:  # decodes to the quantised image
        np.testing.assert_array_equal(np.asarray(im), (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8))
    q = histogram_png(tmp_path / "h.png", [rng.random((16, 16)), rng.random((16, 16))], scale=2)
    assert read_png_size(q) == (2 * 32 + 4, 32)
    with pytest.raises(ValueError, match=r"need \(H, W\)"):
        write_png(tmp_path / "bad.png", np.zeros((2, 2, 4)))
