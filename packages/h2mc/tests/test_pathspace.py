"""Path space of an edge_rt scene: contributions, derivatives of log f* (AE-7), bad input."""

import numpy as np
import pytest

import edge_rt
from edge_rt import scenes
from h2mc import PathSpace, PathSpaceError, luminance
from h2mc._pathspace import _VERTEX


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


def _glossy_box():
    """The Cornell box with a glossy tall box (Phong exponent 98) and a smooth-shaded glossy
    sphere (interpolated vertex normals) instead of the short box."""
    sc = scenes.cornell_box((16, 12))
    meshes = [m for m in sc.meshes if m.name != "short_box"]
    tall = next(m for m in meshes if m.name == "tall_box")
    tall.material = edge_rt.Material(diffuse=(0.3, 0.3, 0.3), specular=(0.6, 0.6, 0.6),
                                     roughness=(0.02,))
    meshes.append(scenes.uv_sphere((0.4, -0.65, 0.3), 0.35, rings=8, segments=16,
                                   material=edge_rt.Material(diffuse=(0.2, 0.4, 0.6),
                                                             specular=(0.4, 0.4, 0.4),
                                                             roughness=(0.1,))))
    return edge_rt.Scene(sc.camera, meshes)


def _valid_states(ps, length, rng, n=40):
    """``n`` states with a path of ``length``, those whose first vertex is glossy first (a
    third of them take the specular lobe there)."""
    u = rng.random((1024, ps.dim))
    lanes, params = ps.trace(u).structure[length]
    glossy = params[_VERTEX_KS] > 0
    order = np.concatenate([lanes[glossy], lanes[~glossy]])
    return u[order[:n]]


_VERTEX_KS = _VERTEX.index("ksr")  # the first vertex's specular red among kernel parameters


def _central_differences(ps, u, derivatives, value, same, dims, h):
    """Central differences of ``value(paths)`` (gradient) and of the exact gradient
    (Hessian) along ``dims``; ``ok`` drops lanes whose structure changes within +-h."""
    p = ps.trace(u)
    ok = np.ones(len(u), bool)
    n = len(dims)
    gfd, Hfd = np.zeros((len(u), n)), np.zeros((len(u), n, n))
    for a, j in enumerate(dims):
        vals, grads = [], []
        for s in (1.0, -1.0):
            up = u.copy()
            up[:, j] += s * h
            pp = ps.trace(up)
            ok &= same(p, pp)
            with np.errstate(divide="ignore"):
                vals.append(np.log(value(pp)))
            grads.append(derivatives(up, pp)[1])
        with np.errstate(invalid="ignore"):
            gfd[:, a] = (vals[0] - vals[1]) / (2 * h)
        Hfd[:, :, a] = (grads[0] - grads[1]) / (2 * h)
    return gfd, Hfd, ok


def _relative_errors(g, H, gfd, Hfd, ok):
    g_err = np.abs(g - gfd)[ok].max(1) / np.abs(g[ok]).max(1)
    H_err = np.abs(H - Hfd)[ok].max((1, 2)) / np.abs(H[ok]).max((1, 2))
    return g_err.max(), H_err.max()


@pytest.mark.parametrize("scene, length", [
    ("cornell", 2), ("cornell", 3), ("glossy", 4),
    pytest.param("glossy", 6, marks=pytest.mark.slow),
])
def test_log_f_derivatives_match_central_differences(cornell, scene, length):
    """AE-7: gradient and Hessian of log f* of one path length (2, 3, 4; 6 in the slow run)
    against float64 central differences, relative 1e-4 of each lane's largest entry, on the
    Cornell box (Lambertian) and on its glossy variant (Phong lobes sampled and evaluated, shading normals); lanes whose
    discrete structure changes within +-h are skipped. h = 1e-6 (PRACTICES' default for
    samples in [0, 1]), not AE-7's 1e-5: paths that reach the light from right next to it
    have Hessian entries ~1e6, and their central-difference error was measured to scale as
    h^2 (1.7e-4 at 1e-5, 1.7e-6 at 1e-6), i.e. truncation, not the derivatives; rounding at
    1e-6 stays below 1e-9."""
    if scene == "cornell":
        ps = cornell if length > 2 else PathSpace(cornell.scene, max_length=2, min_length=2,
                                                  backend="numpy")
    else:
        ps = PathSpace(_glossy_box(), max_length=length, min_length=length, backend="numpy")
    u = _valid_states(ps, length, np.random.default_rng(7))
    p = ps.trace(u)
    lf, g, H = ps.log_f_derivatives(u, length, p)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(lf, np.log(p.f_star_of(length)), rtol=1e-12)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))  # symmetric (to 0, spec: 1e-10)
    dims = ps.dims(length)
    gfd, Hfd, ok = _central_differences(
        ps, u, lambda v, pp: ps.log_f_derivatives(v, length, pp),
        lambda pp: pp.f_star_of(length), lambda a, b: a.same_structure(b, length), dims, 1e-6)
    ok &= np.isfinite(lf)
    assert ok.sum() >= 30
    g_err, H_err = _relative_errors(g, H, gfd, Hfd, ok)
    assert g_err < 1e-4 and H_err < 1e-4, (g_err, H_err)
    # the discrete coordinates (lobe and light-triangle selectors) have no derivative
    discrete = [list(dims).index(j) for j in
                [ps.bsdf_dims[b][0] for b in range(length - 2)] + [ps.light_dims[length][0]]]
    assert (g[:, discrete] == 0).all() and (H[:, discrete] == 0).all()
    # lanes without a path: -inf and zero derivatives
    assert (g[~np.isfinite(lf)] == 0).all()


def test_kelemen_state_derivatives_match_central_differences(cornell):
    """log f* of the Kelemen state (paths of lengths 3 and 4 summed) over all 14
    coordinates, assembled from the per-length derivatives: the same check, lanes whose
    structure changes at either length skipped."""
    ps = cornell
    u = np.random.default_rng(8).random((48, ps.dim))
    lf, g, H = ps.log_f_star_derivatives(u)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))

    def same(a, b):
        return ((a.same_structure(b, 3) | ~(a.valid[:, 0] | b.valid[:, 0]))
                & (a.same_structure(b, 4) | ~(a.valid[:, 1] | b.valid[:, 1])))

    gfd, Hfd, ok = _central_differences(ps, u, ps.log_f_star_derivatives, lambda pp: pp.f_star,
                                        same, np.arange(ps.dim), 1e-6)
    both = np.isfinite(lf) & ps.trace(u).valid.all(1)
    ok &= np.isfinite(lf)
    assert (ok & both).sum() >= 5  # lanes where the sum mixes both lengths
    g_err, H_err = _relative_errors(g, H, gfd, Hfd, ok)
    assert g_err < 1e-4 and H_err < 1e-4, (g_err, H_err)


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

