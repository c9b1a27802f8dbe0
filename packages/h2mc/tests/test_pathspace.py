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


def _valid_states(ps, length, rng, n):
    """``n`` states with a path of ``length``, those whose first vertex is glossy first (a
    third of them take the specular lobe there)."""
    u = rng.random((max(1024, 16 * n), ps.dim))
    lanes, params = ps.trace(u).structure[length]
    glossy = params[_VERTEX_KS] > 0
    order = np.concatenate([lanes[glossy], lanes[~glossy]])
    return u[order[:n]]


_VERTEX_KS = _VERTEX.index("ksr")  # the first vertex's specular red among kernel parameters


def _same_piece(ps, u, length):
    """``same(p, up, pp)``: lanes whose path of ``length`` keeps its structure and every
    branch decision of its expression between states ``u`` (paths ``p``) and ``up``."""
    base = {}

    def same(p, up, pp):
        if "b" not in base:
            base["b"] = ps.branches(u, length, p)
        return (p.same_structure(pp, length)
                & (ps.branches(up, length, pp) == base["b"]).all(1))
    return same


def _central_differences(ps, u, derivatives, value, same, dims, h):
    """Central differences of ``log value(paths)`` (gradient) and of the exact gradient
    (Hessian) along ``dims``, Richardson-extrapolated from steps ``2h`` and ``h`` (error
    O(h^4): near the light or at grazing glossy angles single central differences at h = 1e-6
    were measured to err by up to 6e-3, scaling as h^2, i.e. truncation); ``ok`` drops lanes
    whose structure or branches change within +-2h. ``h``: a step per lane."""
    p = ps.trace(u)
    ok = np.ones(len(u), bool)
    n = len(dims)
    est = []
    for step in (2 * h, h):
        gfd, Hfd = np.zeros((len(u), n)), np.zeros((len(u), n, n))
        for a, j in enumerate(dims):
            vals, grads = [], []
            for s in (1.0, -1.0):
                up = u.copy()
                up[:, j] += s * step
                pp = ps.trace(up)
                ok &= same(p, up, pp)
                with np.errstate(divide="ignore"):
                    vals.append(np.log(value(pp)))
                grads.append(derivatives(up, pp)[1])
            with np.errstate(invalid="ignore"):
                gfd[:, a] = (vals[0] - vals[1]) / (2 * step)
            Hfd[:, :, a] = (grads[0] - grads[1]) / (2 * step)[:, None]
        est.append((gfd, Hfd))
    (g2, H2), (g1, H1) = est
    with np.errstate(invalid="ignore"):
        return (4 * g1 - g2) / 3, (4 * H1 - H2) / 3, ok


def _steps(H):
    """1e-6 (PRACTICES' default for samples in [0, 1]), shrunk on lanes whose curvature
    |H| exceeds 1e4 so that h^2 |H| stays <= 1e-8: the features of such paths (the light seen
    from right next to it, a sharp glossy lobe) are ~1/sqrt(|H|) wide."""
    return 1e-6 / np.sqrt(np.maximum(1.0, np.abs(H).max(axis=(1, 2)) / 1e4))


def _relative_errors(g, H, gfd, Hfd, ok):
    g_err = np.abs(g - gfd)[ok].max(1) / np.abs(g[ok]).max(1)
    H_err = np.abs(H - Hfd)[ok].max((1, 2)) / np.abs(H[ok]).max((1, 2))
    return g_err.max(), H_err.max()


@pytest.mark.parametrize("scene, length, n", [
    ("cornell", 2, 40), ("cornell", 3, 40), ("glossy", 4, 40),
    *(pytest.param("glossy", k, 1000, marks=pytest.mark.slow) for k in (2, 3, 4, 5, 6)),
])
def test_log_f_derivatives_match_central_differences(cornell, scene, length, n):
    """AE-7: gradient and Hessian of log f* of one path length (2, 3, 4 on 40 paths; 2..6
    on 1000 paths each in the slow run) against float64 central differences, relative 1e-4
    of each lane's largest entry, on the Cornell box (Lambertian) and on its glossy variant
    (Phong lobes sampled and evaluated, shading normals). Lanes whose discrete structure
    (triangles, light, or a branch of the BSDF's where / max / abs) changes within the steps
    are skipped. Steps h and 2h, Richardson-extrapolated, with h = 1e-6 shrunk on strongly
    curved lanes (``_steps``), not AE-7's single 1e-5: paths that reach the light from right
    next to it have Hessian entries up to 1e7, and their differences were measured to err as
    h^2 (single central differences: 1.7e-4 at 1e-5, 1.7e-6 at 1e-6) and as h^4
    (extrapolated: 2e-4 at 1e-6, 2e-8 at 1e-7), i.e. truncation, not the derivatives."""
    if scene == "cornell":
        ps = cornell if length > 2 else PathSpace(cornell.scene, max_length=2, min_length=2,
                                                  backend="numpy")
    else:
        ps = PathSpace(_glossy_box(), max_length=length, min_length=length, backend="numpy")
    u = _valid_states(ps, length, np.random.default_rng(7), n)
    p = ps.trace(u)
    lf, g, H = ps.log_f_derivatives(u, length, p)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(lf, np.log(p.f_star_of(length)), rtol=1e-12)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))  # symmetric (to 0, spec: 1e-10)
    dims = ps.dims(length)
    gfd, Hfd, ok = _central_differences(
        ps, u, lambda v, pp: ps.log_f_derivatives(v, length, pp),
        lambda pp: pp.f_star_of(length), _same_piece(ps, u, length), dims, _steps(H))
    ok &= np.isfinite(lf)
    assert ok.sum() >= 0.75 * n
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
    u = np.random.default_rng(8).random((24, ps.dim))
    lf, g, H = ps.log_f_star_derivatives(u)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))

    pieces = {k: _same_piece(ps, u, k) for k in (3, 4)}

    def same(a, up, b):
        return ((pieces[3](a, up, b) | ~(a.valid[:, 0] | b.valid[:, 0]))
                & (pieces[4](a, up, b) | ~(a.valid[:, 1] | b.valid[:, 1])))

    gfd, Hfd, ok = _central_differences(ps, u, ps.log_f_star_derivatives, lambda pp: pp.f_star,
                                        same, np.arange(ps.dim), _steps(H))
    both = np.isfinite(lf) & ps.trace(u).valid.all(1)
    ok &= np.isfinite(lf)
    assert (ok & both).sum() >= 3  # lanes where the sum mixes both lengths
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
    with pytest.raises(PathSpaceError, match="non-finite"):
        ps.trace(np.full((2, 8), np.nan))
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

