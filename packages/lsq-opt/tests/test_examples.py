"""End-to-end examples (lsq_opt.examples): AE-2 (Laplacian vs spsolve of the normal equations),
AE-3(a) (Poisson editing vs a direct SuperLU solve of the Dirichlet Poisson system), ARAP image
warping (LM monotone, handles reached, finite), and PNG output. Small sizes keep this fast."""
import numpy as np
import pytest
from lsq_opt.examples import arap, laplacian, poisson
from lsq_opt.examples._image import read_png_size
from lsq_opt.examples.__main__ import main


def test_ae2_laplacian_equals_spsolve(tmp_path):
    r = laplacian.run(size=(64, 48), out_dir=str(tmp_path))
    assert r["unknowns"] == 64 * 48 and r["iterations"] == 1
    assert r["max_abs_diff_direct"] <= 1e-9
    assert r["cost"] == pytest.approx(r["cost_direct"], rel=1e-12)
    assert r["cost"] < 0.5 * r["initial_cost"]          # the solve did something
    assert r["rmse_result"] < r["rmse_noisy"]            # and it smoothed the noise
    assert read_png_size(r["png"]) == (2 * 64 * 4 + 4, 48 * 4)


def test_ae2_check_has_teeth():
    """A truncated inner solve (5 PCG iterations) misses the 1e-9 bound."""
    r = laplacian.run(size=(64, 48), pcg_max_iterations=5)
    assert r["max_abs_diff_direct"] > 1e-9


def test_ae3a_poisson_equals_direct_solve(tmp_path):
    r = poisson.run(size=(96, 80), out_dir=str(tmp_path))
    target, source, mask = poisson.make_data((96, 80))
    assert r["unknowns"] == int((mask == 0).sum()) * 4   # Exclude: only masked pixels are free
    assert r["fixed_unchanged"]
    assert r["rel_err_direct"] <= 1e-6
    assert r["cost"] < r["initial_cost"]
    assert read_png_size(r["png"])[1] == 80 * 2


def test_ae3a_direct_solve_is_a_real_reference():
    """The independent direct solve satisfies the discrete Poisson equation and differs from the
    naive paste, and a truncated PCG is caught by the 1e-6 x range check."""
    target, source, mask = poisson.make_data((40, 32))
    X = poisson.direct_solve(target, source, mask)
    i, j = 20, 16
    assert mask[i, j] == 0
    lap = lambda A: 4 * A[i, j] - A[i + 1, j] - A[i - 1, j] - A[i, j + 1] - A[i, j - 1]  # noqa: E731
    np.testing.assert_allclose(lap(X), lap(source), atol=1e-12)
    assert np.abs(X[mask == 0] - source[mask == 0]).max() > 1e-2
    r = poisson.run(size=(40, 32), pcg_max_iterations=3)
    assert r["rel_err_direct"] > 1e-6


def test_arap_warp(tmp_path):
    r = arap.run(size=(40, 24), outer_steps=3, lm_iterations=8, out_dir=str(tmp_path))
    assert r["finite"]
    for res in r["results"]:
        acc = res.accepted_costs
        assert all(b <= a for a, b in zip(acc, acc[1:])), acc
        assert res.cost < res.initial_cost
    assert r["monotone_accepted_costs"]
    assert r["handle_max_err_px"] <= 0.05
    # locally near-rigid: no edge collapsed or blown up
    assert 0.3 < r["edge_len_min"] and r["edge_len_max"] < 2.0
    # the handles actually moved (the bar was bent by ~40 degrees)
    _, _, handles, targets = arap.make_data((40, 24))
    assert np.linalg.norm(targets[2] - np.array(handles[2])) > 5
    assert read_png_size(r["png"])[0] > 0


def test_main_writes_pngs(tmp_path, capsys):
    rc = main(["--out", str(tmp_path), "--only", "laplacian"])
    assert rc == 0
    assert (tmp_path / "laplacian.png").stat().st_size > 100
    assert "PASS" in capsys.readouterr().out
