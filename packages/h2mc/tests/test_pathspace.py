"""Path space of an edge_rt scene: contributions, derivatives of log f* (AE-7), bad input."""

import numpy as np
import pytest

import edge_rt
from edge_rt import scenes
from h2mc import PathSpace, PathSpaceError, luminance


@pytest.fixture(scope="module")
def cornell():
    # The numpy backend builds the Hessian kernel in ~0.5 s (LLVM: ~15 s on this machine);
    # both evaluate the same core_ad expressions.
    return PathSpace(scenes.cornell_box((16, 12)), max_length=4, min_length=3, backend="numpy")


def test_layout_and_paths(cornell):
    ps = cornell
    assert ps.dim == 2 + 3 * 2 + 3 * 2
    np.testing.assert_array_equal(ps.dims(3), [0, 1, 2, 3, 4, 8, 9, 10])
    np.testing.assert_array_equal(ps.dims(4), [0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13])
    u = np.random.default_rng(3).random((512, ps.dim))
    p = ps.trace(u)
    np.testing.assert_allclose(p.xy, u[:, :2] * [16, 12])
    assert p.contrib.shape == (512, 2, 3)
    assert 0.2 < p.valid[:, 0].mean() < 0.9  # some paths miss the light (occluded, back side)
    assert (p.contrib[~p.valid] == 0).all() and (p.contrib[p.valid].sum(1) > 0).all()
    np.testing.assert_allclose(p.f_star, luminance(p.rgb))
    np.testing.assert_allclose(p.f_star, p.f_star_of(3) + p.f_star_of(4))
    assert not p.nonfinite.any()
    # deterministic
    np.testing.assert_array_equal(ps.trace(u).contrib, p.contrib)


@pytest.mark.parametrize("length", [3, 4])
def test_log_f_derivatives_match_central_differences(cornell, length):
    """AE-7 on a small Cornell box: gradient and Hessian of log f* against float64 central
    differences, relative 1e-4 of each lane's largest entry; lanes whose discrete structure
    changes within +-h are skipped. h = 1e-6 (PRACTICES' default for samples in [0, 1]), not
    AE-7's 1e-5: paths that reach the light from right next to it have Hessian entries ~1e6,
    and their central-difference error was measured to scale as h^2 (1.7e-4 at 1e-5, 1.7e-6
    at 1e-6), i.e. truncation, not the derivatives; rounding at 1e-6 stays below 1e-9."""
    ps = cornell
    rng = np.random.default_rng(7)
    u = rng.random((64, ps.dim))
    p = ps.trace(u)
    lf, g, H = ps.log_f_derivatives(u, length, p)
    ok = np.isfinite(lf)
    np.testing.assert_allclose(lf[ok], np.log(p.f_star_of(length)[ok]), rtol=1e-12)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))  # symmetric (to 0, spec: 1e-10)
    h = 1e-6
    dims = ps.dims(length)
    gfd, Hfd = np.zeros_like(g), np.zeros_like(H)
    for a, j in enumerate(dims):
        vals, grads = [], []
        for s in (1.0, -1.0):
            up = u.copy()
            up[:, j] += s * h
            pp = ps.trace(up)
            ok &= p.same_structure(pp, length)
            with np.errstate(divide="ignore"):
                vals.append(np.log(pp.f_star_of(length)))
            grads.append(ps.log_f_derivatives(up, length, pp)[1])
        with np.errstate(invalid="ignore"):
            gfd[:, a] = (vals[0] - vals[1]) / (2 * h)
        Hfd[:, :, a] = (grads[0] - grads[1]) / (2 * h)
    assert ok.sum() >= 15
    g_err = np.abs(g - gfd)[ok].max(1) / np.abs(g[ok]).max(1)
    H_err = np.abs(H - Hfd)[ok].max((1, 2)) / np.abs(H[ok]).max((1, 2))
    assert g_err.max() < 1e-4, g_err.max()
    assert H_err.max() < 1e-4, H_err.max()
    # the discrete coordinates (lobe and light-triangle selectors) have no derivative
    discrete = [list(dims).index(j) for j in
                [ps.bsdf_dims[b][0] for b in range(length - 2)] + [ps.light_dims[length][0]]]
    assert (g[:, discrete] == 0).all() and (H[:, discrete] == 0).all()
    # lanes without a path: -inf and zero derivatives
    assert (g[~np.isfinite(lf)] == 0).all()


def test_no_light_is_an_error():
    sc = scenes.cornell_box((8, 8))
    sc.meshes = [m for m in sc.meshes if m.emission is None]
    with pytest.raises(PathSpaceError, match="no light"):
        PathSpace(sc)


def test_bad_arguments():
    sc = scenes.cornell_box((8, 8))
    with pytest.raises(PathSpaceError, match="min_length"):
        PathSpace(sc, max_length=2, min_length=3)
    with pytest.raises(PathSpaceError, match="environment maps"):
        PathSpace(scenes.textured_sphere((8, 8)))
    cam = edge_rt.Camera(sc.camera.cam_to_world, resolution=(8, 8), kind="fisheye")
    with pytest.raises(PathSpaceError, match="pinhole"):
        PathSpace(edge_rt.Scene(cam, sc.meshes))
    ps = PathSpace(sc, backend="numpy")
    with pytest.raises(PathSpaceError, match=r"shape \(B, 8\)"):
        ps.trace(np.zeros((3, 5)))
    with pytest.raises(PathSpaceError, match="length 4"):
        ps.dims(4)


def test_nonfinite_contribution_is_voided(monkeypatch):
    ps = PathSpace(scenes.cornell_box((8, 8)), backend="numpy")
    kernel = ps._value_kernel(3)

    def poisoned(*cols):
        out = [np.array(c, dtype=np.float64) for c in kernel(*cols)]
        out[1][::2] = np.nan
        return out

    monkeypatch.setattr(ps, "_value_kernel", lambda k: poisoned)
    u = np.random.default_rng(0).random((256, ps.dim))
    p = ps.trace(u)
    assert p.nonfinite.sum() > 10
    assert np.isfinite(p.contrib).all() and (p.f_star[p.nonfinite] == 0).all()
    assert not p.valid[p.nonfinite].any()
    lf, g, H = ps.log_f_derivatives(u, 3, p)
    assert np.isneginf(lf[p.nonfinite]).all() and np.isfinite(g).all()

