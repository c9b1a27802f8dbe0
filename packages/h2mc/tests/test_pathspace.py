"""Path space of an edge_rt scene: contributions, derivatives of log f* (AE-7), bad input."""

import numpy as np
import pytest

import edge_rt
from edge_rt import scenes, torch_single_thread
import torch

from h2mc import HIT, NEE, PathSpace, PathSpaceError, luminance
from h2mc._pathspace import _VERTEX
from h2mc._surface import relative_eta as _relative_eta
from h2mc.testing import (central_differences, check_technique_derivatives, fd_steps,
                          glass_box, glossy_box, modified_states, relative_errors, same_piece,
                          valid_states)


@pytest.fixture(scope="module")
def cornell():
    # The numpy backend builds the Hessian kernel in ~0.5 s (LLVM: ~15 s on this machine);
    # both evaluate the same core_ad expressions.
    return PathSpace(scenes.cornell_box((16, 12)), max_length=4, min_length=3, backend="numpy")


def test_layout_and_paths(cornell):
    ps = cornell
    assert ps.dim == 2 + 3 * 3 + 3 * 2  # BSDF samples at 3 bounces, light samples for 2 lengths
    assert ps.techniques == [(3, HIT), (3, NEE), (4, HIT), (4, NEE)]
    np.testing.assert_array_equal(ps.dims(3, NEE), [0, 1, 2, 3, 4, 11, 12, 13])
    np.testing.assert_array_equal(ps.dims(3, HIT), np.arange(8))
    np.testing.assert_array_equal(ps.dims(4, NEE), [0, 1, 2, 3, 4, 5, 6, 7, 14, 15, 16])
    np.testing.assert_array_equal(ps.dims(4, HIT), np.arange(11))
    np.testing.assert_array_equal(ps.dims(3), [0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13])
    u = np.random.default_rng(3).random((4096, ps.dim))
    p = ps.trace(u)
    np.testing.assert_allclose(p.xy, u[:, :2] * [16, 12])
    assert p.contrib.shape == (4096, 4, 3)
    assert 0.2 < p.valid[:, 1].mean() < 0.9  # some paths miss the light (occluded, back side)
    assert 0 < p.valid[:, 0].mean() < 0.05  # BSDF samples rarely hit the small light
    # a valid path is lit unless a BSDF gate (grazing cut-off) zeroes it: 1 of 3426 here
    assert (p.contrib[~p.valid] == 0).all() and (p.contrib[p.valid].sum(1) > 0).mean() > 0.99
    np.testing.assert_allclose(p.f_star, luminance(p.rgb))
    np.testing.assert_allclose(p.f_star, p.f_star_of(3) + p.f_star_of(4))
    np.testing.assert_allclose(p.f_star_of(3), p.f_star_of(3, HIT) + p.f_star_of(3, NEE))
    np.testing.assert_allclose(p.scores.sum(1), p.f_star)
    assert not p.nonfinite.any()
    # deterministic
    np.testing.assert_array_equal(ps.trace(u).contrib, p.contrib)


@pytest.mark.parametrize("scene, length, technique, n", [
    ("cornell", 2, NEE, 40), ("cornell", 3, NEE, 40), ("glossy", 4, NEE, 40),
    ("glossy", 3, HIT, 30),
    *(pytest.param("glossy", k, s, 1000, marks=pytest.mark.slow)
      for k in (2, 3, 4, 5, 6) for s in (HIT, NEE)),
])
def test_log_f_derivatives_match_central_differences(cornell, scene, length, technique, n):
    """AE-7: gradient and Hessian of log f* of one technique (MIS weight included; light
    sample (NEE) at lengths 2, 3, 4 and emitter hit (HIT) at 3, on 30-40 paths; both at
    2..6 on 1000 paths each in the slow run) against float64 central differences, relative 1e-4
    of each lane's largest entry, on the Cornell box (Lambertian) and on its glossy variant
    (Phong lobes sampled and evaluated, shading normals). Lanes whose discrete structure
    (triangles, light, or a branch of the BSDF's where / max / abs) changes within the steps
    are skipped. Steps h and 2h, Richardson-extrapolated, with h = 1e-6 shrunk on strongly
    curved lanes (``fd_steps``), not AE-7's single 1e-5: paths that reach the light from right
    next to it have Hessian entries up to 1e7, and their differences were measured to err as
    h^2 (single central differences: 1.7e-4 at 1e-5, 1.7e-6 at 1e-6) and as h^4
    (extrapolated: 2e-4 at 1e-6, 2e-8 at 1e-7), i.e. truncation, not the derivatives."""
    if scene == "cornell":
        ps = cornell if length > 2 else PathSpace(cornell.scene, max_length=2, min_length=2,
                                                  backend="numpy")
    else:
        ps = PathSpace(glossy_box(), max_length=length, min_length=length, backend="numpy")
    u = valid_states(ps, length, technique, np.random.default_rng(7), n)
    c = check_technique_derivatives(ps, u, length, technique)
    p, lf, g, H = c.paths, c.logf, c.grad, c.hess
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(lf, np.log(p.f_star_of(length, technique)), rtol=1e-12)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))  # symmetric (to 0, spec: 1e-10)
    assert c.ok.sum() >= 0.75 * n
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    dims = ps.dims(length, technique)
    # the discrete coordinates (lobe and light-triangle selectors) have no derivative
    selectors = ([ps.bsdf_dims[b][0] for b in range(length - 1)] if technique == HIT else
                 [ps.bsdf_dims[b][0] for b in range(length - 2)] + [ps.light_dims[length][0]])
    discrete = [list(dims).index(j) for j in selectors]
    assert (g[:, discrete] == 0).all() and (H[:, discrete] == 0).all()
    # lanes without a path: -inf and zero derivatives
    assert (g[~np.isfinite(lf)] == 0).all()
    # a subset of lanes (the render's per-group call): the same rows, and -inf elsewhere
    lanes = np.flatnonzero(np.random.default_rng(3).random(len(u)) < 0.5)
    for got, want in zip(ps.log_f_rows(u, length, technique, p, lanes), (lf, g, H)):
        np.testing.assert_array_equal(got, want[lanes])
    lf_sub = ps.log_f_derivatives(u, length, technique, paths=p, lanes=lanes[::-1])[0]
    np.testing.assert_array_equal(lf_sub[lanes], lf[lanes])
    assert np.isneginf(np.delete(lf_sub, lanes)).all()


@pytest.mark.parametrize("max_length", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_kelemen_state_derivatives_match_central_differences(cornell, max_length):
    """log f* of the Kelemen state (both techniques of lengths 3..max_length summed) over
    all 11 (17) coordinates, assembled from the per-technique derivatives: the same check,
    lanes whose structure changes at either length skipped (max_length 4: 50 s)."""
    ps = cornell if max_length == 4 else PathSpace(cornell.scene, max_length=3,
                                                   backend="numpy")
    u = np.random.default_rng(8).random((24, ps.dim))
    lf, g, H = ps.log_f_star_derivatives(u)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))

    lengths = range(3, max_length + 1)
    pieces = {k: same_piece(ps, u, k) for k in lengths}

    def same(a, up, b):
        def absent(k):  # no technique of length k in either state
            cols = [t for t, key in enumerate(ps.techniques) if key[0] == k]
            return ~(a.valid[:, cols] | b.valid[:, cols]).any(1)
        return np.logical_and.reduce([pieces[k](a, up, b) | absent(k) for k in lengths])

    gfd, Hfd, ok = central_differences(ps, u, ps.log_f_star_derivatives, lambda pp: pp.f_star,
                                        same, np.arange(ps.dim), fd_steps(H))
    ok &= np.isfinite(lf)
    if max_length == 4:
        both = ps.trace(u).valid[:, 1::2].all(1)
        assert (ok & both).sum() >= 3  # lanes where the sum mixes both lengths
    g_err, H_err = relative_errors(g, H, gfd, Hfd, ok)
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
    mirror_glass = scenes.torus_glass_cube((8, 8))
    mirror_glass.meshes[1].material = edge_rt.Material(roughness=(0.0,), eta=1.5)
    with pytest.raises(PathSpaceError, match="'glass_cube' is a perfectly specular"):
        PathSpace(mirror_glass)
    cam = edge_rt.Camera(sc.camera.cam_to_world, resolution=(8, 8), kind="fisheye")
    with pytest.raises(PathSpaceError, match="pinhole"):
        PathSpace(edge_rt.Scene(cam, sc.meshes))
    lens = edge_rt.Camera(sc.camera.cam_to_world, resolution=(8, 8), aperture_radius=0.1)
    with pytest.raises(PathSpaceError, match="thin-lens"):
        PathSpace(edge_rt.Scene(lens, sc.meshes))
    ps = PathSpace(sc, backend="numpy")
    with pytest.raises(PathSpaceError, match=r"shape \(B, 11\)"):
        ps.trace(np.zeros((3, 5)))
    with pytest.raises(PathSpaceError, match="non-finite"):
        ps.trace(np.full((2, 11), np.nan))
    with pytest.raises(PathSpaceError, match="length 4"):
        ps.dims(4)
    with pytest.raises(PathSpaceError, match="technique must be"):
        ps.dims(3, 2)
    with pytest.raises(PathSpaceError, match="paths must be a Paths"):
        ps.log_f_derivatives(np.zeros((1, ps.dim)), 3, ps.trace(np.zeros((1, ps.dim))))
    u = np.zeros((4, ps.dim))
    for lanes in ([2, 1], [1, 1], [0, 4], [-1, 2]):  # unsorted, repeated, out of range
        with pytest.raises(PathSpaceError, match="sorted, unique lane indices in"):
            ps.log_f_rows(u, 3, NEE, ps.trace(u), lanes)


def test_nonfinite_contribution_is_voided(monkeypatch, poisoned):
    ps = PathSpace(scenes.cornell_box((8, 8)), backend="numpy")

    def poison(out, calls):
        out[1, ::2] = np.nan

    kernel = poisoned(ps._value_kernel(3, NEE), poison)
    monkeypatch.setattr(ps, "_value_kernel", lambda k, s: kernel if s == NEE else
                        PathSpace._value_kernel(ps, k, s))
    u = np.random.default_rng(0).random((256, ps.dim))
    p = ps.trace(u)
    assert p.nonfinite.sum() > 10
    assert np.isfinite(p.contrib).all() and (p.f_star[p.nonfinite] == 0).all()
    assert not p.valid[p.nonfinite].any()
    lf, g, H = ps.log_f_derivatives(u, 3, NEE, paths=p)
    assert np.isneginf(lf[p.nonfinite]).all() and np.isfinite(g).all()


def _emitter_points(ps, u, length):
    """The light triangle and point that the BSDF-sampled ray of technique (length, HIT)
    hits: edge_rt's own walk (Embree, interact, bsdf.sample) on ``u``; rays leave from the
    exact vertex as in the path expressions (Embree's from the offset origin)."""
    g, dt = ps.geometry, torch.float64
    with torch.no_grad(), torch_single_thread():
        o, d, _ = ps.scene.camera.rays(torch.as_tensor(u[:, :2] * [ps.width, ps.height]), dt)
        ray = o
        for i in range(1, length):
            si = g.interact(g.intersect(ray, d), o, d)
            kd, ks, rough = g.material(si)
            wo, _ = ps._sample(si, -d, kd, ks, rough, _relative_eta(g, si),
                               torch.as_tensor(u[:, ps.bsdf_dims[i - 1]]))
            o, ray, d = si.p, g.spawn(si, wo), wo
        tri = g.intersect(ray, d)
        return tri, g.interact(tri, o, d).p


def _glass_pane():
    """A diffuse floor under a rough glass pane (alpha 0.3, eta 1.5) under a large light:
    paths of 3 segments floor -> pane -> light transmit through the pane at their last
    vertex."""
    floor = scenes.quad((-3, 0, -3), (0, 0, 6), (6, 0, 0), edge_rt.Material(diffuse=(0.7,) * 3),
                        name="floor")
    pane = scenes.quad((-1.5, 1, -1.5), (0, 0, 3), (3, 0, 0),
                       edge_rt.Material(roughness=(0.09,), eta=1.5), name="pane")
    light = scenes.facing_quad((0.0, 1.6, 0.0), (0.0, 0.0, 0.0), 2.0, (5.0, 5.0, 5.0))
    cam = edge_rt.Camera(scenes.look_at((0.0, 0.6, 2.5), (0.0, 0.0, 0.0)), fov=50.0,
                         resolution=(8, 8))
    return edge_rt.Scene(cam, [floor, pane, light])


@pytest.mark.parametrize("scene", ["glossy", "glass"])
def test_mis_weights_of_one_path_sum_to_one(scene):
    """Both techniques of the same geometric path: paths closed by a BSDF sample hitting the
    light (HIT), and the same paths closed by the light sample of that point (NEE, its light
    numbers inverted from the hit point). The two power-heuristic weights sum to 1 (to
    rounding: the point is recovered through barycentrics), and the unweighted contributions agree: C_HIT / w_HIT * p_bsdf =
    C_NEE / w_NEE * p_light is f * Le, so C_HIT / C_NEE = w_HIT / w_NEE * p_light / p_bsdf;
    checked through w: (C_HIT / w_HIT) / (C_NEE / w_NEE) = p_light / p_bsdf = sqrt(w_NEE /
    w_HIT). ``glass``: the last vertex is the rough glass pane, the light behind it: the
    dielectric's sampling pdf (refraction probability 1 - F included) against the light's,
    and NEE's transmission through the pane."""
    ps = PathSpace(glossy_box() if scene == "glossy" else _glass_pane(), max_length=3,
                   min_length=3, backend="numpy")
    u = valid_states(ps, 3, HIT, np.random.default_rng(11), 80)
    lanes, params = ps.trace(u).structure[3, HIT]
    u = u[lanes[_vertex_kinds(params, 3) == ("oo" if scene == "glossy" else "og")][:40]]
    assert len(u) == 40
    tri, y = _emitter_points(ps, u, 3)
    g = ps.geometry
    v = g.tri_verts.detach().numpy()[tri.numpy()]
    # barycentrics of y, then Geometry.sample_light's inverse: b0 = 1 - sqrt(u1), b1 = u2 sqrt(u1)
    e1, e2, r = v[:, 1] - v[:, 0], v[:, 2] - v[:, 0], y.numpy() - v[:, 0]
    gram = np.stack([np.stack([(e1 * e1).sum(1), (e1 * e2).sum(1)], 1),
                     np.stack([(e1 * e2).sum(1), (e2 * e2).sum(1)], 1)], 1)
    b1, b2 = np.linalg.solve(gram, np.stack([(r * e1).sum(1), (r * e2).sum(1)], 1)[..., None])[
        ..., 0].T
    su = b1 + b2
    k = np.searchsorted(g.light_tris.numpy(), tri.numpy())
    assert (g.light_tris.numpy()[k] == tri.numpy()).all()
    cdf = np.concatenate([[0.0], g.light_cdf.numpy()])
    un = u.copy()
    un[:, ps.light_dims[3]] = np.stack([(cdf[k] + cdf[k + 1]) / 2, su * su, b1 / su], 1)
    p_hit, p_nee = ps.trace(u), ps.trace(un)
    both = p_nee.valid[:, 1] & p_hit.valid[:, 0]
    assert both.sum() >= 0.9 * len(u)
    w_hit = ps.mis_weights(u, 3, HIT, p_hit)[both]
    w_nee = ps.mis_weights(un, 3, NEE, p_nee)[both]
    np.testing.assert_allclose(w_hit + w_nee, 1.0, rtol=0, atol=1e-9)
    assert (w_hit > 1e-3).any() and (w_nee > 1e-3).any()  # both weights matter here
    c_hit, c_nee = p_hit.f_star_of(3, HIT)[both], p_nee.f_star_of(3, NEE)[both]
    lit = (c_hit > 0) & (c_nee > 0)
    assert lit.sum() >= 0.5 * len(u)
    np.testing.assert_allclose((c_hit / w_hit)[lit] / (c_nee / w_nee)[lit],
                               np.sqrt(w_nee / w_hit)[lit], rtol=1e-6)


def test_techniques_sum_to_the_single_technique_estimator_and_edge_rt():
    """On the glossy box, per path length: the mean over uniform states of the MIS-weighted
    sum of both techniques, of the unweighted light-sample (old single-technique) estimator
    C_NEE / w_NEE, and edge_rt's path tracer (the same length by a max_depth difference)
    agree within 4 standard errors. Measured (2^15 states, edge_rt 4 x 64 spp): MIS sum vs
    single technique 0.96 / -0.32 SE, vs edge_rt -0.06 / -0.07 SE (lengths 3 / 4); the
    BSDF-hit technique carries 6.0% of length 3 and 3.3% of length 4."""
    scene = glossy_box()
    ps = PathSpace(scene, max_length=4, min_length=3, backend="numpy")
    n = 1 << 15
    u = np.random.default_rng(12).random((n, ps.dim))
    p = ps.trace(u)
    with torch_single_thread():
        imgs = [np.stack([luminance(edge_rt.render_image(
            scene, spp=64, seed=(13, s), max_depth=d, dtype=torch.float64,
            progress=False).numpy()).mean() for s in range(4)]) for d in (1, 2, 3)]
    for k in (3, 4):
        mis = p.f_star_of(k)
        w = ps.mis_weights(u, k, NEE, p)
        single = np.where(w > 0, p.f_star_of(k, NEE) / np.where(w > 0, w, 1.0), 0.0)
        ref = imgs[k - 2] - imgs[k - 3]
        se = [x.std() / np.sqrt(n) for x in (mis, single)] + [ref.std(ddof=1) / 2]
        assert abs(mis.mean() - single.mean()) < 4 * np.hypot(se[0], se[1]), k
        assert abs(mis.mean() - ref.mean()) < 4 * np.hypot(se[0], se[2]), k
        assert p.f_star_of(k, HIT).mean() > 0.005 * mis.mean()  # the HIT technique carries light


_ETA, _SIDE = _VERTEX.index("eta"), _VERTEX.index("side")


def _vertex_kinds(params, length):
    """Per lane, one letter per surface vertex: ``o`` opaque, ``G`` glass seen from outside,
    ``g`` glass seen from inside."""
    n = len(_VERTEX)
    letters = [np.where(params[v * n + _ETA] > 0, np.where(params[v * n + _SIDE] > 0, "G", "g"),
                        "o") for v in range(length - 1)]
    return np.array(["".join(x) for x in zip(*letters)])


def _glass_states(ps, length, technique, patterns, n, samples):
    """``n`` lit states of technique ``(length, technique)`` per vertex-kind pattern
    (``_vertex_kinds``), and the pattern index of each."""
    u = np.random.default_rng(11).random((samples, ps.dim))
    p = ps.trace(u)
    lanes, params = p.structure[length, technique]
    # paths that carry light: one leaving the glass at the edge of total internal reflection
    # carries ~1e-8, and there 1 - F cancels, so its value agrees between the compiled and
    # the numpy kernels to ~1e-8 only and central differences of its Hessian lose accuracy
    lit = p.f_star_of(length, technique)[lanes] > 1e-6
    kinds = _vertex_kinds(params, length)
    picked = [lanes[lit & (kinds == pat)][:n] for pat in patterns]
    assert all(len(x) == n for x in picked), [len(x) for x in picked]
    return u[np.concatenate(picked)], np.repeat(np.arange(len(patterns)), n)


# Sphere (convex): "Ggo" refracts into it at the first vertex and out at the second, "Goo"
# reflects off it, "oG" reflects at the last vertex towards the light (NEE). Cube (the torus
# inside): "Gog" refracts in, hits the torus, and NEE transmits out through the cube's inside
# face; "oG" is the emitter hit (HIT) after a reflection off the cube.
@pytest.mark.parametrize("scene, length, technique, patterns, samples", [
    ("sphere", 4, NEE, ("Ggo", "Goo"), 1 << 16),
    ("sphere", 3, NEE, ("oG",), 1 << 14),
    ("cube", 4, NEE, ("Gog",), 1 << 14),
    ("sphere", 4, HIT, ("Ggo",), 1 << 17),
])
def test_rough_dielectric_path_derivatives_match_central_differences(scene, length, technique,
                                                                     patterns, samples):
    """AE-7 on paths through rough glass (eta 1.5; sphere: GGX alpha 0.3, smooth-shaded;
    torus_glass_cube: alpha 0.08): both the reflection and the refraction branch of the first
    vertex, reflection and transmission at the last vertex (NEE evaluates the dielectric BSDF;
    the MIS weights use its pdf, reflect / refract probabilities included), and an emitter hit
    through two refractions. Gradient and Hessian of log f* against Richardson-extrapolated
    central differences, relative 1e-4, as above; the reflect / refract selectors (the lobe
    coordinates) have no derivative."""
    sc = glass_box() if scene == "sphere" else scenes.torus_glass_cube((12, 12))
    ps = PathSpace(sc, max_length=length, min_length=length, backend="numpy")
    u, pattern = _glass_states(ps, length, technique, patterns, 15, samples)
    c = check_technique_derivatives(ps, u, length, technique)
    g, H = c.grad, c.hess
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))
    np.testing.assert_allclose(c.logf, np.log(c.paths.f_star_of(length, technique)),
                               rtol=1e-12, atol=1e-12)
    assert all((c.ok & (pattern == k)).sum() >= 10 for k in range(len(patterns))), c.ok
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    dims = ps.dims(length, technique)
    n_lobes = length - 1 if technique == HIT else length - 2
    lobes = [list(dims).index(ps.bsdf_dims[b][0]) for b in range(n_lobes)]
    assert (g[:, lobes] == 0).all() and (H[:, lobes] == 0).all()


@pytest.mark.parametrize("scene, length, techniques, samples", [
    ("sphere", 2, (NEE,), 1 << 12),  # direct light: its one vertex glass or opaque
    pytest.param("sphere", 3, (HIT, NEE), 1 << 12, marks=pytest.mark.slow),
    pytest.param("torus", 4, (HIT, NEE), 1 << 13, marks=pytest.mark.slow),
    pytest.param("moving", 4, (HIT, NEE), 1 << 15, marks=pytest.mark.slow),
    pytest.param("ring", 4, (HIT, NEE), 1 << 12, marks=pytest.mark.slow),
    pytest.param("glossy_cornell", 4, (HIT, NEE), 1 << 12, marks=pytest.mark.slow),
])
def test_specialised_hessian_kernels_match_the_generic_ones(scene, length, techniques,
                                                            samples):
    """Hessian kernels specialised per material sequence (each vertex differentiates its own
    BSDF) give the value, gradient and Hessian of log f* of the kernel whose vertices hold
    both BSDFs, to 1e-9 of each lane's largest entry (the two expressions round apart:
    measured up to 2.3e-11 on the torus, 2.3e-10 on the gradients of paths through the
    moving caustics' near-specular ball, GGX alpha 0.05), on the lit
    uniform states (f* > 1e-6: near total internal reflection 1 - F cancels, as in the AE-7
    test above) of both techniques; scenes without a dielectric keep the one kernel per
    technique."""
    sc = {"sphere": glass_box, "moving": lambda: scenes.moving_caustics((12, 12))}.get(
        scene, lambda: getattr(scenes, {"torus": "torus_glass_cube", "ring": "ring_scene"}.get(
            scene, scene))((12, 12)))()
    kw = dict(max_length=length, min_length=length, backend="numpy")
    special, generic = PathSpace(sc, specialize=True, **kw), PathSpace(sc, **kw)
    special.specialize_min_lanes = 1  # every sequence its own kernel
    u = np.random.default_rng(5).random((samples, generic.dim))
    p = generic.trace(u)
    for s in techniques:
        expected = generic.log_f_derivatives(u, length, s, paths=p)
        got = special.log_f_derivatives(u, length, s, paths=p)
        np.testing.assert_array_equal(np.isfinite(got[0]), np.isfinite(expected[0]))
        lanes = np.flatnonzero(np.isfinite(expected[0]) & (p.f_star_of(length, s) > 1e-6))
        if not len(lanes):
            assert s == HIT  # emitter hits are rare at 4 segments
            continue
        for a, b in zip(got, expected):
            a, b = a[lanes].reshape(len(lanes), -1), b[lanes].reshape(len(lanes), -1)
            scale = np.abs(b).max(1, keepdims=True)
            assert (np.abs(a - b) <= 1e-9 * scale).all(), np.max(np.abs(a - b) / scale)
    sequences = {key[3] for key in special._kernels if key[0] == "hessian"}
    if generic.geometry.has_dielectric:
        assert None not in sequences and len(sequences) >= 2, sequences
    else:
        assert sequences == {None}


# ---------------------------------------------------------------- modified parameterisation


def _jacobian_in_the_direction_numbers(f, u, h=1e-6, wrap_first=False):
    """Central differences of the per-lane 2-vector ``f(u)`` in ``u[:, 1]`` and ``u[:, 2]``
    (lanes x 2 x 2); ``wrap_first``: the first component is an azimuth wrapping at 1."""
    J = np.zeros((len(u), 2, 2))
    for j in (1, 2):
        up, um = u.copy(), u.copy()
        up[:, j] += h
        um[:, j] -= h
        d = f(up) - f(um)
        if wrap_first:
            d[:, 0] -= np.round(d[:, 0])
        J[:, :, j - 1] = d / (2 * h)
    return J


def test_modified_coordinates_reproduce_the_pss_paths():
    """u -> w -> path: converting PSS states to each technique's modified coordinates
    (threshold 0.05: the glossy tall box, roughness 0.02, keeps Kelemen's coordinates, the
    walls and the glossy sphere take absolute directions) and tracing w gives the same paths:
    the same discrete structure and f*_PSS to 1e-9 relative; f*_w = f*_PSS * |det du/dw| with
    a positive Jacobian, not 1 on most lanes (those with an absolute vertex). The spherical map
    round-trips (w -> omega -> w) to 1e-12."""
    ps = PathSpace(glossy_box(), max_length=4, min_length=3, backend="numpy",
                   roughness_threshold=0.05)
    rng = np.random.default_rng(11)
    u = rng.random((16384, ps.dim))
    pu = ps.trace(u)
    for t, key in enumerate(ps.techniques):
        coords = np.full(len(u), t)
        w = ps.to_modified(u, pu, coords, rng)
        pw = ps.trace(w, coords=coords)
        v = pu.valid[:, t]
        assert v.sum() >= 40
        np.testing.assert_array_equal(pw.valid[:, t], v)
        (la, pa), (lb, pb) = pu.structure[key], pw.structure[key]
        np.testing.assert_array_equal(la, lb)
        names = [nm for _ in range(key[0] - 1) for nm in ps._vertex_names] + ["light"] * 13
        assert all((a == b).all() for a, b, nm in zip(pa, pb, names) if nm != "absolute")
        assert not any(pa[j].any() for j, nm in enumerate(names) if nm == "absolute")
        np.testing.assert_allclose(pw.scores[v, t], pu.scores[v, t], rtol=1e-9, atol=1e-300)
        np.testing.assert_allclose(pw.scores_w[:, t], pw.scores[:, t] * pw.jacobian[:, t])
        assert (pw.jacobian[v, t] > 0).all() and (pw.jacobian[v, t] != 1).mean() > 0.8
        np.testing.assert_array_equal(pu.jacobian, 1.0)
        # PSS coordinates of the dimensions the technique does not use are kept
        unused = np.setdiff1d(np.arange(ps.dim), ps.dims(*key))
        np.testing.assert_array_equal(w[:, unused], u[:, unused])
    from h2mc._pathspace import spherical_coordinates, spherical_direction
    ws = rng.random((1000, 2))
    np.testing.assert_allclose(spherical_coordinates(spherical_direction(ws)), ws, atol=1e-12)


def test_one_trace_of_two_batches_splits_into_their_own_traces():
    """render_mlt traces the next step's large-step states (PSS, coords -1) beside this step's
    modified ones in one call: ``Paths.lane_range`` of that trace equals each batch traced on
    its own (values, structure renumbered from 0, directions)."""
    ps = PathSpace(glossy_box(), max_length=4, min_length=3, backend="numpy",
                   roughness_threshold=0.05)
    rng = np.random.default_rng(5)
    u = rng.random((4096, ps.dim))
    t = rng.integers(0, len(ps.techniques), len(u))
    w = ps.to_modified(u, ps.trace(u), t, rng)
    v = rng.random((1500, ps.dim))
    both = ps.trace(np.concatenate([w, v]), coords=np.concatenate([t, np.full(len(v), -1)]))
    for alone, part in ((ps.trace(w, coords=t), both.lane_range(0, len(w))),
                        (ps.trace(v), both.lane_range(len(w), len(w) + len(v)))):
        assert part.valid.any(axis=0).sum() >= 3
        for field in ("xy", "pixel", "contrib", "valid", "nonfinite", "jacobian"):
            np.testing.assert_array_equal(getattr(part, field), getattr(alone, field))
        assert part.structure.keys() == alone.structure.keys()
        for key, (lanes, params) in alone.structure.items():
            np.testing.assert_array_equal(part.structure[key][0], lanes)
            np.testing.assert_array_equal(part.structure[key][1], params)
            assert part.structure[key][1].flags.c_contiguous  # rows of the LLVM kernels' input
        # the other batch's lanes may bounce further: empty entries past this batch's last
        assert all(not len(lanes) for lanes, _, _ in part.directions[len(alone.directions):])
        for a, b in zip(part.directions, alone.directions):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    # the split PSS paths feed the large step's conversion (kernels on their parameters)
    pss, alone = both.lane_range(len(w), len(w) + len(v)), ps.trace(v)
    tv = rng.integers(0, len(ps.techniques), len(v))
    np.testing.assert_array_equal(ps.to_modified(v, pss, tv, np.random.default_rng(1)),
                                  ps.to_modified(v, alone, tv, np.random.default_rng(1)))


@pytest.mark.parametrize("kind", ["diffuse", "glossy"])
def test_jacobian_matches_finite_differences_of_the_map(kind):
    """The factor p_bsdf |d omega/dw| of spec 5.2 is |det du/dw|: on a single-lobe BSDF
    (Lambertian, or a pure Blinn-Phong lobe of roughness 0.1) the map (u1, u2) -> w of
    edge_rt's sampling followed by spherical coordinates has, by float64 central differences
    (h = 1e-6), |det dw/du| = 1 / (p_bsdf 2 pi^2 sin phi) to 1e-5 relative."""
    from edge_rt import bsdf
    from h2mc._pathspace import spherical_coordinates
    rng = np.random.default_rng(5)
    n_lanes = 200
    normal = rng.normal(size=(n_lanes, 3))
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    wi = normal + 0.8 * rng.normal(size=(n_lanes, 3))
    wi /= np.linalg.norm(wi, axis=1, keepdims=True)
    wi *= np.sign((wi * normal).sum(1))[:, None]
    kd, ks = ((0.7, 0.0), (0.0, 0.7))[kind == "glossy"]
    kd, ks = torch.full((n_lanes, 3), kd, dtype=torch.float64), torch.full(
        (n_lanes, 3), ks, dtype=torch.float64)
    rough = torch.full((n_lanes,), 0.1, dtype=torch.float64)
    u = np.concatenate([np.full((n_lanes, 1), 0.5), 0.05 + 0.9 * rng.random((n_lanes, 2))], 1)
    nt, wit = torch.as_tensor(normal), torch.as_tensor(wi)

    def w_of(uu):
        wo, pdf = bsdf.sample(nt, wit, kd, ks, rough, torch.as_tensor(uu))
        return spherical_coordinates(wo.numpy()), pdf.numpy(), wo.numpy()

    w0, pdf, wo = w_of(u)
    J = _jacobian_in_the_direction_numbers(lambda uu: w_of(uu)[0], u, wrap_first=True)
    ok = (pdf > 0) & (np.abs(wo[:, 2]) < 0.99)  # away from the poles of the sphere
    assert ok.sum() > 150
    expected = 1.0 / (pdf[ok] * 2 * np.pi ** 2 * np.sqrt(1 - wo[ok, 2] ** 2))
    np.testing.assert_allclose(np.abs(np.linalg.det(J))[ok], expected, rtol=1e-5)


@pytest.mark.parametrize("scene, length, technique, n", [
    ("glossy", 3, NEE, 30), pytest.param("glossy", 4, NEE, 30, marks=pytest.mark.slow),
    ("glossy", 3, HIT, 20), ("torus", 4, NEE, 20), ("light", 3, HIT, 20), ("light", 4, HIT, 20),
])
def test_log_f_w_derivatives_match_central_differences(scene, length, technique, n):
    """AE-7 in the modified coordinates: value, gradient and Hessian of log f*_w (the
    compiled kernels: absolute spherical directions on vertices rougher than the threshold,
    the Jacobian p_bsdf 2 pi^2 sin phi inside the expression) against Richardson-extrapolated
    float64 central differences of the traced f*_w, relative 1e-4, on the glossy Cornell box
    (threshold 0.05: Kelemen's coordinates on the roughness-0.02 box, absolute elsewhere) and
    through the torus scene's rough glass (threshold 0.001: absolute on the glass too). The
    unused lobe numbers of absolute vertices have no derivative. ``light``: the glossy box
    with light coordinates (spec 5.1 (ii)) on the last bounce of paths that hit the light, the
    Jacobian p_bsdf |cos theta_light| area / (d^2 pmf) inside the expression."""
    if scene in ("glossy", "light"):
        ps = PathSpace(glossy_box(), max_length=length, min_length=length, backend="numpy",
                       roughness_threshold=0.05, light_coordinates=scene == "light")
    else:
        ps = PathSpace(scenes.torus_glass_cube((12, 12)), max_length=length,
                       min_length=length, backend="numpy", roughness_threshold=0.001)
    w, t = modified_states(ps, length, technique, np.random.default_rng(8), n)
    c = check_technique_derivatives(ps, w, length, technique, modified=True)
    with np.errstate(divide="ignore"):
        # compiled (traced) and numpy (derivative) kernels: rounding apart
        np.testing.assert_allclose(c.logf, np.log(c.paths.scores_w[:, t]), rtol=1e-11)
    np.testing.assert_array_equal(c.hess, np.swapaxes(c.hess, 1, 2))
    assert c.ok.sum() >= 0.6 * n, c.ok.sum()
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    assert (c.paths.jacobian[:, t] != 1).mean() >= 0.3  # lanes with an absolute vertex


def test_light_coordinates_reproduce_the_pss_paths():
    """u -> w -> path with light coordinates (spec 5.1 (ii)): on the techniques that hit the
    light, the last bounce's numbers become the light sample of the hit point and tracing w
    gives u's path (same structure, f*_PSS to 1e-9), its vertex flagged ``lightcoord``; NEE
    techniques are unchanged. A w whose light sample is blocked (here: aimed from behind the
    light's plane) has no path, not a NaN."""
    ps = PathSpace(glossy_box(), max_length=4, min_length=3, backend="numpy",
                   roughness_threshold=0.05, light_coordinates=True)
    plain = PathSpace(glossy_box(), max_length=4, min_length=3, backend="numpy",
                      roughness_threshold=0.05)
    rng = np.random.default_rng(11)
    u = rng.random((16384, ps.dim))
    pu = ps.trace(u)
    lc = ps._vertex_names.index("lightcoord")
    nv = len(ps._vertex_names)
    for t, (k, s) in enumerate(ps.techniques):
        coords = np.full(len(u), t)
        w = ps.to_modified(u, pu, coords, np.random.default_rng(t))
        pw = ps.trace(w, coords=coords)
        v = pu.valid[:, t]
        assert v.sum() >= 40
        assert (pw.valid[:, t] >= v).all()  # other lanes: w aims at the light anyway
        np.testing.assert_allclose(pw.scores[v, t], pu.scores[v, t], rtol=1e-9, atol=1e-300)
        assert np.isfinite(pw.contrib).all()
        flags = ps.lane_params(pw, coords)[v][:, lc + nv * np.arange(k - 1)]
        np.testing.assert_array_equal(flags[:, -1], s == HIT)
        assert not flags[:, :-1].any()
        w_plain = plain.to_modified(u, plain.trace(u), coords, np.random.default_rng(t))
        if s == NEE:  # the same coordinates and Jacobian as without light coordinates
            np.testing.assert_array_equal(w, w_plain)
            np.testing.assert_allclose(pw.jacobian[v, t], plain.trace(
                w_plain, coords=coords).jacobian[v, t], rtol=1e-12)
        else:
            last = ps.bsdf_dims[k - 2]
            cdf = ps.geometry.light_cdf.numpy()
            assert ((w[v][:, last[0]] > 0) & (w[v][:, last[0]] < cdf[-1])).all()
            unused = np.setdiff1d(np.arange(ps.dim), last)
            np.testing.assert_array_equal(w[:, unused], w_plain[:, unused])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_technique_swap_prices_the_same_path(bidirectional):
    """``swap_technique`` (light coordinates): a HIT state's light-coordinate numbers become
    the NEE state's light sample and back. On the glossy box (paths of 3-4 segments), for
    states of every HIT and NEE technique with a path: the swapped state traces the same path
    (the same colour, f*_w in the ratio of the two techniques' MIS weights, to 1e-9) on all
    but a few lanes (where the swapped ray or shadow ray does not reach the point at its
    tolerance: f*_w = 0, a rejection), swapping twice is the identity, and a technique
    without a partner (a light subpath's, or no light coordinates) is a named error."""
    ps = PathSpace(glossy_box(), max_length=4, roughness_threshold=0.03, light_coordinates=True,
                   bidirectional=bidirectional, backend="numpy")
    rng = np.random.default_rng(3)
    u = rng.random((1 << 14, ps.dim))
    p = ps.trace(u)
    for t, (k, s) in enumerate(ps.techniques):
        if s not in (HIT, NEE):
            continue
        lit = np.flatnonzero(p.scores[:, t] > 0)[:2000]
        assert len(lit) >= 50, (k, s)
        tech = np.full(len(lit), t)
        w = ps.to_modified(u[lit], ps.trace(u[lit]), tech, rng)
        q = ps.trace(w, coords=tech)
        w2, t2 = ps.swap_technique(w, tech)
        assert (t2 == ps.techniques.index((k, NEE if s == HIT else HIT))).all()
        q2 = ps.trace(w2, coords=t2)
        ok = q.scores_w[:, t] > 0
        there = q2.scores_w[ok, t2[0]] > 0
        assert there.mean() > 0.99, (k, s, there.mean())
        ratio = q2.scores_w[ok, t2[0]] / q.scores_w[ok, t]
        weights = ps.mis_weights(w2, k, int(1 - s), q2)[ok] / ps.mis_weights(w, k, s, q)[ok]
        np.testing.assert_allclose(ratio[there], weights[there], rtol=1e-9)
        colour = q.contrib[ok, t] / q.scores[ok, t, None]
        np.testing.assert_allclose(q2.contrib[ok, t2[0]][there]
                                   / q2.scores[ok, t2[0], None][there], colour[there],
                                   rtol=1e-9)
        np.testing.assert_array_equal(ps.swap_technique(w2, t2)[0], w)
    if bidirectional:
        with pytest.raises(PathSpaceError, match="only the HIT and NEE techniques"):
            ps.swap_technique(u[:2], [ps.techniques.index((3, 2))] * 2)
    with pytest.raises(PathSpaceError, match="technique indices must lie in"):
        ps.swap_technique(u[:1], [len(ps.techniques)])
    plain = PathSpace(glossy_box(), max_length=3, roughness_threshold=0.03, backend="numpy")
    assert (plain.swap_partner([0, 1]) == -1).all()
    with pytest.raises(PathSpaceError, match="light coordinates"):
        plain.swap_technique(u[:1, :plain.dim], [0])


@pytest.mark.parametrize("kind", ["diffuse", "glossy"])
def test_light_coordinate_jacobian_matches_finite_differences_of_the_map(kind):
    """The factor p_bsdf |cos theta_light| / d^2 / p_shape (p_shape = pmf / area) of spec 5.1
    (ii) is |det du/dw|: on a single-lobe BSDF the map (u1, u2) -> direction (edge_rt's
    sampling) -> hit point on a light triangle -> its light sample numbers (w1, w2) has, by
    float64 central differences (h = 1e-6), |det dw/du| = p_shape / (p_bsdf |cos| / d^2) to
    1e-5 relative (the pick number's factor 1 / pmf is the width of the triangle's bin)."""
    from edge_rt import bsdf
    rng = np.random.default_rng(9)
    n_lanes = 200
    normal = np.tile([0.0, 1.0, 0.0], (n_lanes, 1))
    p = np.concatenate([rng.uniform(-0.3, 0.3, (n_lanes, 1)), np.zeros((n_lanes, 1)),
                        rng.uniform(-0.3, 0.3, (n_lanes, 1))], 1)
    wi = normal + 0.5 * rng.normal(size=(n_lanes, 3))
    wi /= np.linalg.norm(wi, axis=1, keepdims=True)
    wi *= np.sign((wi * normal).sum(1))[:, None]
    v = np.array([[-2.0, 0.6, -2.0], [2.0, 0.6, -2.0], [0.0, 0.8, 2.0]])  # facing down
    area = 0.5 * np.linalg.norm(np.cross(v[1] - v[0], v[2] - v[0]))
    nl = np.cross(v[1] - v[0], v[2] - v[0])
    nl /= np.linalg.norm(nl)
    kd, ks = ((0.7, 0.0), (0.0, 0.7))[kind == "glossy"]
    kd, ks = torch.full((n_lanes, 3), kd, dtype=torch.float64), torch.full(
        (n_lanes, 3), ks, dtype=torch.float64)
    rough = torch.full((n_lanes,), 0.3, dtype=torch.float64)
    nt, wit = torch.as_tensor(normal), torch.as_tensor(wi)

    def w_of(uu):
        wo, pdf = bsdf.sample(nt, wit, kd, ks, rough, torch.as_tensor(uu))
        d = wo.numpy()
        e1, e2 = v[1] - v[0], v[2] - v[0]
        pvec, tvec = np.cross(d, e2), p - v[0]
        inv = 1.0 / (pvec @ e1)
        b1 = (tvec * pvec).sum(1) * inv
        b2 = (d * np.cross(tvec, e1)).sum(1) * inv
        t = (np.cross(tvec, e1) @ e2) * inv
        su = b1 + b2
        return np.stack([su * su, b1 / su], 1), pdf.numpy(), d, t, b1, b2

    u = np.concatenate([np.full((n_lanes, 1), 0.5), 0.05 + 0.9 * rng.random((n_lanes, 2))], 1)
    _, pdf, d, t, b1, b2 = w_of(u)
    J = _jacobian_in_the_direction_numbers(lambda uu: w_of(uu)[0], u)
    ok = (pdf > 0) & (t > 0) & (b1 > 0.01) & (b2 > 0.01) & (b1 + b2 < 0.99)
    assert ok.sum() > 50, ok.sum()
    cos = np.abs(d[ok] @ nl)
    expected = (1.0 / area) / (pdf[ok] * cos / t[ok] ** 2)  # |d omega| = cos dA / d^2, d = t
    np.testing.assert_allclose(np.abs(np.linalg.det(J))[ok], expected, rtol=1e-5)


def test_modified_coordinates_wrong_side_directions_are_zero_not_nan():
    """Uniform states read as modified coordinates point half of the absolute directions into
    the surface: those paths end (zero contribution, invalid), none is NaN; bad input gets
    named errors."""
    ps = PathSpace(scenes.cornell_box((16, 12)), max_length=4, min_length=3, backend="numpy",
                   roughness_threshold=0.03)
    w = np.random.default_rng(2).random((4096, ps.dim))
    coords = np.full(len(w), ps.techniques.index((4, NEE)))
    pw, pu = ps.trace(w, coords=coords), ps.trace(w)
    assert not pw.nonfinite.any() and np.isfinite(pw.scores_w).all()
    assert 0.02 < pw.valid[:, 3].mean() < 0.6 * pu.valid[:, 3].mean()
    assert (pw.contrib[~pw.valid] == 0).all()
    with pytest.raises(PathSpaceError, match="roughness_threshold must be >= 0"):
        PathSpace(ps.scene, roughness_threshold=-0.1)
    with pytest.raises(PathSpaceError, match="need a roughness_threshold"):
        PathSpace(ps.scene, max_length=4, backend="numpy").trace(w, coords=coords)
    with pytest.raises(PathSpaceError, match="technique indices"):
        ps.trace(w, coords=np.full(len(w), 7))
    with pytest.raises(PathSpaceError, match="coords must have shape"):
        ps.trace(w, coords=coords[:3])


# ---------------------------------------------------------------- linear motion (time)
def _moving_ball(roughness=0.09):
    """edge_rt's moving_caustics with a rougher ball (GGX alpha 0.3: finite differences of
    paths through it stay well conditioned)."""
    sc = scenes.moving_caustics((12, 12))
    sc.meshes[0].material = edge_rt.Material(roughness=(roughness,), eta=1.5)
    return sc


def test_moving_scene_puts_time_first():
    ps = PathSpace(_moving_ball(), max_length=3, min_length=2, backend="numpy")
    still = PathSpace(scenes.ring_scene((12, 12)), max_length=3, min_length=2, backend="numpy")
    assert ps.time_dim == 0 and still.time_dim is None
    assert ps.dim == still.dim + 1
    for key in ps.techniques:  # [time], screen, then the static layout shifted by one
        np.testing.assert_array_equal(ps.dims(*key), np.r_[0, still.dims(*key) + 1])
    u = np.random.default_rng(5).random((4096, ps.dim))
    p = ps.trace(u)
    np.testing.assert_allclose(p.xy, u[:, 1:3] * [12, 12])
    # the ball is seen at the time's position: the same screen point hits it at one time
    # and misses it at another
    assert p.moving.any() and not p.moving.all()
    assert not still.trace(u[:, 1:]).moving.any()


@pytest.mark.parametrize("length, technique", [
    (3, NEE), pytest.param(4, NEE, marks=pytest.mark.slow),  # 4: 20 s, same code paths
])
def test_log_f_derivatives_with_time_match_central_differences(length, technique):
    """AE-7 on paths touching the moving ball: gradient and Hessian of log f* with respect to
    time and the other coordinates (time enters through the ball's vertices, translated
    inside the expression) against Richardson-extrapolated central differences, relative
    1e-4; time has a non-zero derivative on every such path."""
    ps = PathSpace(_moving_ball(), max_length=length, min_length=length, backend="numpy")
    u = np.random.default_rng(13).random((1 << 14, ps.dim))
    p = ps.trace(u)
    t = ps.techniques.index((length, technique))
    lit = np.flatnonzero(p.moving[:, t] & (p.scores[:, t] > 0))
    assert len(lit) >= 20
    u = u[lit[:20]]
    c = check_technique_derivatives(ps, u, length, technique)
    g, H = c.grad, c.hess
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))
    assert c.ok.sum() >= 15
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    assert (np.abs(g[:, ps.time_dim]) > 0).all()
    assert (np.abs(H[:, ps.time_dim, 1:]).max(1) > 0).all()  # time correlates with the rest


def test_static_paths_have_no_time_column():
    """Paths with no vertex on the moving ball: time is no H2MC dimension (exact zeros in
    the gradient and Hessian); the Kelemen state's sum keeps them too."""
    ps = PathSpace(_moving_ball(), max_length=3, min_length=2, backend="numpy")
    u = np.random.default_rng(17).random((4096, ps.dim))
    p = ps.trace(u)
    t = ps.techniques.index((2, NEE))
    static = ~p.moving[:, t] & (p.scores[:, t] > 0)
    moving = p.moving[:, t] & (p.scores[:, t] > 0)
    assert static.sum() > 100 and moving.sum() > 5
    lf, g, H = ps.log_f_derivatives(u, 2, NEE, paths=p)
    assert (g[static, 0] == 0).all() and (H[static, 0] == 0).all() and (H[static, :, 0] == 0).all()
    assert np.isfinite(lf[static]).all() and (np.abs(g[static, 1:]).max(1) > 0).all()
    assert (np.abs(g[moving, 0]) > 0).any()
    all_static = ~p.moving.any(1) & (p.f_star > 0)
    _, gk, Hk = ps.log_f_star_derivatives(u, p)
    assert (gk[all_static, 0] == 0).all() and (Hk[all_static, 0] == 0).all()


# ---------------------------------------------------------------------------- lens perturbation
def _lens_states(ps, length, technique, rng, n):
    """States in the modified coordinates of ``(length, technique)`` that allow a lens
    perturbation: up to half of them reconnecting after a near-specular vertex (j = 2)."""
    w, t = modified_states(ps, length, technique, rng, 8 * n)
    coords = np.full(len(w), t)
    j = ps.lens_vertex(ps.trace(w, coords=coords), coords)
    after = np.flatnonzero(j == 2)[:n // 2]
    order = np.concatenate([after, np.flatnonzero(j == 1)[:n - len(after)]])
    return w[order], t, j[order]


def _traced_lens_score(ps, w, t, j, anchor, screen):
    """lensScore of the lens proposals to ``screen``, from the *traced* proposal: its f*_w
    times ``|cos theta_{j+1}| / (d^2 2 pi^2 sin phi_j)`` computed here in numpy, and the
    proposal's paths."""
    coords = np.full(len(w), t)
    lanes = np.arange(len(w))
    y = ps.lens_move(w, ps.trace(w, coords=coords), coords, j, anchor, lanes, screen)
    py = ps.trace(y, coords=coords)
    _, res = ps._run("positions", y, *ps.techniques[t], py)
    pos = np.full((len(w), 3 * (ps.techniques[t][0] - 1)), np.nan)
    pos[py.structure[ps.techniques[t]][0]] = res.T
    pos = pos.reshape(len(w), -1, 3)
    x_j, x_next = pos[lanes, j - 1], pos[lanes, j]
    nv = len(ps._vertex_names)
    params = ps.lane_params(py, coords)
    corners = np.stack([params[i, j[i] * nv:j[i] * nv + 9] for i in lanes]).reshape(-1, 3, 3)
    n = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    d = x_next - x_j
    d2 = (d * d).sum(1)
    cos = np.abs((n * d).sum(1)) / np.sqrt(d2)
    phi = np.pi * np.array([y[i, ps.bsdf_dims[j[i] - 1][2]] for i in lanes])
    score = py.scores_w[:, t] * cos / (d2 * 2 * np.pi ** 2 * np.sin(phi))
    return score, y, py


@pytest.mark.parametrize("length, technique, n, bidirectional", [
    (3, NEE, 30, False), (4, NEE, 30, False), (3, HIT, 20, False), (4, 2, 20, True),
    (4, NEE, 20, True)])
def test_lens_score_derivatives_match_central_differences(length, technique, n,
                                                          bidirectional):
    """Spec 5.3: value, gradient and Hessian of log lensScore in the 2D screen position
    (compiled lens kernels, the fixed vertex j + 1 as a parameter) on the glossy Cornell box
    (threshold 0.05: reconnections from the walls and the glossy sphere, j = 1, and through
    the near-specular tall box, j = 2). The value equals the target of the lens variables
    computed from the traced path (f*_w |cos theta_{j+1}| / (d^2 2 pi^2 sin phi_j)) to 1e-9;
    the gradient matches Richardson-extrapolated float64 central differences of that traced
    value and the Hessian those of the kernel's gradient, relative 1e-4. ``bidirectional``:
    the same over the BDPT techniques (MIS over every technique of the length; ``(4, 2)``:
    the camera vertex x_1 aims at the connection vertex x_2, which joins the light
    subpath)."""
    ps = PathSpace(glossy_box(), max_length=length, min_length=length, backend="numpy",
                   roughness_threshold=0.05, bidirectional=bidirectional)
    w, t, j = _lens_states(ps, length, technique, np.random.default_rng(5), n)
    assert len(w) == n and (j > 0).all()
    coords = np.full(len(w), t)
    p = ps.trace(w, coords=coords)
    anchor = ps.lens_anchor(w, p, coords, j)
    lf, g, H = ps.lens_derivatives(w, p, coords, j, anchor)
    screen = w[:, :2]
    score, y, _ = _traced_lens_score(ps, w, t, j, anchor, screen)
    np.testing.assert_allclose(y, w, atol=1e-12)  # aiming at the fixed vertex: w itself
    np.testing.assert_allclose(lf, np.log(score), rtol=1e-9)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))
    h = fd_steps(H)
    ok = np.ones(len(w), bool)
    est = []
    for step in (2 * h, h):
        gfd, Hfd = np.zeros((len(w), 2)), np.zeros((len(w), 2, 2))
        for a in range(2):
            vals, grads = [], []
            for s in (1.0, -1.0):
                sp = screen.copy()
                sp[:, a] += s * step
                val, yp, pp = _traced_lens_score(ps, w, t, j, anchor, sp)
                ok &= (p.same_structure(pp, length, technique)
                       & (ps.branches(yp, length, technique, pp)
                          == ps.branches(w, length, technique, p)).all(1))
                vals.append(np.log(val))
                wp = w.copy()
                wp[:, :2] = sp
                grads.append(ps.lens_derivatives(wp, p, coords, j, anchor)[1])
            gfd[:, a] = (vals[0] - vals[1]) / (2 * step)
            Hfd[:, :, a] = (grads[0] - grads[1]) / (2 * step)[:, None]
        est.append((gfd, Hfd))
    (g2, H2), (g1, H1) = est
    gfd, Hfd = (4 * g1 - g2) / 3, (4 * H1 - H2) / 3
    assert ok.sum() >= 0.6 * n, ok.sum()
    g_err, H_err = relative_errors(g, H, gfd, Hfd, ok)
    assert g_err < 1e-4 and H_err < 1e-4, (g_err, H_err)
    if length == 4 and not bidirectional:  # both reconnection kinds (j <= length - 2)
        assert (j[ok] == 2).sum() >= 3 and (j[ok] == 1).sum() >= 3, np.bincount(j[ok])


@pytest.mark.parametrize("technique, bidirectional", [(NEE, False), (2, True)])
def test_lens_move_keeps_the_rest_of_the_path(technique, bidirectional):
    """A lens proposal moves the screen position and aims vertex j at the fixed vertex j + 1:
    the traced proposal reaches it (lens_reached: the same point to rounding) unless an
    occluder or another structure before j intervenes, and every later coordinate (so every
    later vertex and the light sample; with a light subpath, all of its numbers) stays where
    it was."""
    length = 4
    ps = PathSpace(glossy_box(), max_length=length, min_length=length, backend="numpy",
                   roughness_threshold=0.05, bidirectional=bidirectional)
    rng = np.random.default_rng(6)
    w, t, j = _lens_states(ps, length, technique, rng, 40)
    coords = np.full(len(w), t)
    p = ps.trace(w, coords=coords)
    anchor = ps.lens_anchor(w, p, coords, j)
    screen = w[:, :2] + 1e-3 * rng.standard_normal((len(w), 2))
    y = ps.lens_move(w, p, coords, j, anchor, np.arange(len(w)), screen)
    py = ps.trace(y, coords=coords)
    reached = ps.lens_reached(y, py, coords, j, anchor)
    assert reached.mean() > 0.8, reached.mean()
    assert not reached[~py.valid[:, t]].any()
    # the misses: an occluder, or another triangle before j (the aim was computed on w's)
    missed = ~reached & py.valid[:, t]
    x_next = ps.lens_anchor(y, py, coords, j)
    assert (np.linalg.norm(x_next - anchor, axis=1)[missed] > 1e-6).all()
    assert not p.same_structure(py, length, technique)[missed].any()
    keep = np.ones(ps.dim, bool)
    keep[:2] = False
    for i in np.unique(j):  # vertex j's direction numbers change, nothing else
        keep_i = keep.copy()
        keep_i[ps.bsdf_dims[i - 1][1:]] = False
        np.testing.assert_array_equal(y[j == i][:, keep_i], w[j == i][:, keep_i])
    np.testing.assert_array_equal(y[:, :2], screen)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lens_vertex_rules(bidirectional):
    """lens_vertex: j = the first absolute camera-subpath vertex up to the last sampled
    bounce before a surface vertex (``length - 2``; ``t - 2`` with ``s >= 2`` light-subpath
    vertices), provided vertex j + 1 is a surface vertex with a fixed outgoing direction
    (absolute, or the next-event vertex, or the connection vertex joining a light subpath);
    0 otherwise (the structures whose lensScore is 0), checked lane by lane against the
    kernel parameters' flags for a technique drawn among each state's lit ones; PSS-only
    path spaces have no lens perturbation."""
    length = 4
    ps = PathSpace(glossy_box(), max_length=length, min_length=3, backend="numpy",
                   roughness_threshold=0.05, bidirectional=bidirectional)
    rng = np.random.default_rng(7)
    u = rng.random((3000, ps.dim))
    pu = ps.trace(u)
    t = np.argmax((pu.scores > 0) * rng.random(pu.scores.shape), 1)
    lit = pu.scores[np.arange(len(u)), t] > 0
    w = ps.to_modified(u, pu, t, rng)
    pw = ps.trace(w, coords=t)
    j = ps.lens_vertex(pw, t)
    nv, col = len(ps._vertex_names), ps._vertex_names.index("absolute")
    params = ps.lane_params(pw, t)
    connected = np.zeros(len(u), bool)  # lanes reconnecting to a bidirectional connection
    for i in np.flatnonzero(lit):
        k, s = ps.techniques[t[i]]
        last = k - 1 - max(s, NEE)
        flags = [params[i, v * nv + col] > 0.5 for v in range(k - 1)]
        first = next((v + 1 for v in range(last) if flags[v]), 0)
        fixed = first and (flags[first] or (s >= NEE and first == last))
        assert j[i] == (first if fixed else 0), (i, k, s, flags, j[i])
        connected[i] = s >= 2 and j[i] > 0
    assert (j[lit] == 0).any() and (j[lit] == 1).any() and (j[lit] == 2).any()
    assert connected.sum() > 20 if bidirectional else not connected.any()
    assert (j[~lit & ~pw.valid[np.arange(len(u)), t]] == 0).all()
    some = np.sort(rng.choice(len(u), 700, replace=False))  # the rows of some lanes only
    np.testing.assert_array_equal(ps.lane_params(pw, t, some), params[some])
    with pytest.raises(PathSpaceError, match="roughness_threshold"):
        PathSpace(glossy_box(), max_length=3, backend="numpy").lens_vertex(pw, t)
