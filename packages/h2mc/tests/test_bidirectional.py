"""Bidirectional techniques (light subpaths connected to camera subpaths): layout, that every
technique estimates the same light, derivatives against central differences (AE-7), bad
input."""

import numpy as np
import pytest
import torch

from edge_rt import scenes, torch_single_thread

from h2mc import HIT, NEE, PathSpace, PathSpaceError
from h2mc._pathspace import _VERTEX, spherical_coordinates
from h2mc._surface import relative_eta
from h2mc.testing import (check_technique_derivatives, glass_box, glossy_box, modified_states,
                          valid_states)

_ETA = _VERTEX.index("eta")


def _glass_vertices(ps, structure, length, technique, n):
    """(n, length - 1) bool: which surface vertices of each lane's path of the technique are
    dielectric (all False where the lane has none)."""
    out = np.zeros((n, length - 1), bool)
    if (length, technique) in structure:
        lanes, params = structure[length, technique]
        out[lanes] = (params[[v * len(_VERTEX) + _ETA for v in range(length - 1)]] > 0).T
    return out


def test_layout_and_techniques():
    ps = PathSpace(scenes.cornell_box((16, 12)), max_length=4, bidirectional=True,
                   backend="numpy")
    uni = PathSpace(ps.scene, max_length=4, backend="numpy")
    # the unidirectional coordinates first, then the light point, the emission and two
    # bounces of the light subpath (light tracing's longest subpath has three vertices)
    assert ps.dim == uni.dim + 3 + 2 + 2 * 3
    np.testing.assert_array_equal(ps.light_point_dims, [17, 18, 19])
    np.testing.assert_array_equal(ps.emission_dims, [20, 21])
    assert ps.techniques == [(3, 0), (3, 1), (3, 2), (3, 3), (4, 0), (4, 1), (4, 2), (4, 3),
                             (4, 4)]
    assert ps.techniques_of(4) == [0, 1, 2, 3, 4]
    for s in (HIT, NEE):
        np.testing.assert_array_equal(ps.dims(4, s), uni.dims(4, s))
    np.testing.assert_array_equal(ps.dims(3, 2), [0, 1, 17, 18, 19, 20, 21])  # t = 2
    np.testing.assert_array_equal(ps.dims(4, 2), [0, 1, 2, 3, 4, 17, 18, 19, 20, 21])
    np.testing.assert_array_equal(ps.dims(4, 3), [0, 1, 17, 18, 19, 20, 21, 22, 23, 24])
    # light tracing (t = 1) reads no screen position: its pixel is where the path meets
    # the camera
    np.testing.assert_array_equal(ps.dims(4, 4), np.arange(17, 28))
    u = np.random.default_rng(3).random((4096, ps.dim))
    p = ps.trace(u)
    assert p.contrib.shape == (4096, 9, 3) and not p.nonfinite.any()
    assert 0.2 < p.valid[:, ps.techniques.index((3, 2))].mean() < 0.9
    assert (p.contrib[~p.valid] == 0).all()
    np.testing.assert_allclose(p.f_star_of(4), p.scores[:, 4:].sum(1))
    # the unidirectional techniques trace the same paths (their weights differ)
    q = uni.trace(u[:, :uni.dim])
    np.testing.assert_array_equal(p.valid[:, [0, 1, 4, 5]], q.valid)
    np.testing.assert_array_equal(ps.trace(u).contrib, p.contrib)  # deterministic
    # every technique splats at the state's pixel but light tracing
    traced = [ps.techniques.index((k, k)) for k in (3, 4)]
    others = np.setdiff1d(np.arange(9), traced)
    np.testing.assert_array_equal(p.pixels[:, others], np.repeat(p.pixel[:, None], 7, 1))
    lit = p.valid[:, traced]
    assert lit.mean() > 0.2 and (p.pixels[:, traced][lit] != p.pixel[:, None].repeat(2, 1)[
        lit]).mean() > 0.9
    assert ((p.pixels >= 0) & (p.pixels < 16 * 12)).all()


def _both_path_spaces(scene, n, seed):
    """The bidirectional and the unidirectional path spaces of ``scene`` (paths of 3-4
    segments), ``n`` uniform states, and the paths of both on them."""
    ps = PathSpace(scene, max_length=4, bidirectional=True, backend="numpy")
    uni = PathSpace(scene, max_length=4, backend="numpy")
    u = np.random.default_rng(seed).random((n, ps.dim))
    return ps, uni, u, ps.trace(u), uni.trace(u[:, :uni.dim])


def _mean_se(x):
    return x.mean(), x.std() / np.sqrt(len(x))


def test_every_technique_estimates_the_same_light():
    """Glossy box (Phong lobes, shading normals), 2^15 uniform states, per length 3 and 4:
    the MIS-weighted sum over all techniques agrees with the unidirectional path space's
    (its two techniques) within 4 standard errors, and so does every technique alone,
    unweighted (C_s / w_s = f / p_s: a wrong density of its own sampling biases it; a wrong
    density in another technique's weight biases the sum). Measured: sum -1.7 / +0.3
    combined SE; single techniques within 2.4 SE (light tracing -0.5 / -0.5). The
    light-subpath techniques carry 65% of length 3 and 69% of length 4 (light tracing 45% and
    34%), and the sum's standard error is 2-4x lower than the unidirectional one."""
    ps, _, u, p, q = _both_path_spaces(glossy_box(), 1 << 15, 12)
    mean_se = _mean_se
    for k in (3, 4):
        (m, se), (m_uni, se_uni) = mean_se(p.f_star_of(k)), mean_se(q.f_star_of(k))
        assert abs(m - m_uni) < 4 * np.hypot(se, se_uni), k
        assert se < 0.6 * se_uni, k
        for s in ps.techniques_of(k):
            w = ps.mis_weights(u, k, s, p)
            assert ((w >= 0) & (w <= 1)).all()
            alone = np.where(w > 0, p.f_star_of(k, s) / np.where(w > 0, w, 1.0), 0.0)
            m_s, se_s = mean_se(alone)
            assert abs(m_s - m) < 4 * np.hypot(se_s, se), (k, s)
        light = sum(p.f_star_of(k, s) for s in range(2, k + 1))
        assert light.mean() > 0.4 * m


def test_paths_through_glass_are_estimated_alike():
    """The glass box (its sphere rough glass: GGX alpha 0.3, eta 1.5), 2^17 uniform states,
    lengths 3 and 4, restricted to paths with a dielectric vertex: the MIS-weighted sum over
    all techniques agrees with the unidirectional path space's within 4 standard errors
    (measured, five seeds: -0.9 .. +0.8 SE, with a standard error 0.56-0.91x the
    unidirectional one), and at length 3 every technique alone too (-1.3 .. +1.9 SE). At
    length 4 the connection techniques alone are too heavy-tailed for a mean (a connection
    through two refractions: one seed 8 SE low, another 3x high), so their light-side frames
    are checked path by path in the test below. The light-subpath techniques (light tracing
    included) carry about half of these paths' light at length 3 and 15 % at length 4."""
    n = 1 << 17
    ps, uni, u, p, q = _both_path_spaces(glass_box(), n, 2)
    mean_se = _mean_se

    def through_glass(paths, space, k, s):
        glassy = _glass_vertices(space, paths.structure, k, s, n).any(1)
        return np.where(glassy, paths.f_star_of(k, s), 0.0)

    for k in (3, 4):
        m, se = mean_se(sum(through_glass(p, ps, k, s) for s in ps.techniques_of(k)))
        m_uni, se_uni = mean_se(sum(through_glass(q, uni, k, s) for s in (HIT, NEE)))
        assert abs(m - m_uni) < 4 * np.hypot(se, se_uni), k
        light = sum(through_glass(p, ps, k, s) for s in range(2, k + 1)).mean()
        assert light > (0.4 if k == 3 else 0.1) * m, k
        if k == 3:
            for s in ps.techniques_of(k):
                w = ps.mis_weights(u, k, s, p)
                alone = np.where(w > 0, through_glass(p, ps, k, s) / np.where(w > 0, w, 1), 0)
                m_s, se_s = mean_se(alone)
                assert abs(m_s - m) < 4 * np.hypot(se_s, se), s


def test_light_tracing_lands_in_the_right_pixels():
    """Light tracing (t = 1) splats where its path meets the camera: on the Cornell box
    (paths of 3 segments, 2^17 states) its unweighted image, each state's f / p in the
    pixel the trace projected it to, agrees pixel by pixel with the unidirectional path
    space's image (its states' screen pixels): the mean squared z-score over the 192 pixels
    is ~1 (measured 1.00 and 0.93 on two seeds), which a projection off by one pixel or
    flipped would not give (measured: 22 with columns shifted by one, 40 with rows
    flipped)."""
    scene = scenes.cornell_box((16, 12))
    ps = PathSpace(scene, max_length=3, bidirectional=True, backend="numpy")
    uni = PathSpace(scene, max_length=3, backend="numpy")
    n, npix = 1 << 17, 16 * 12
    u = np.random.default_rng(4).random((n, ps.dim))
    p, q = ps.trace(u), uni.trace(u[:, :uni.dim])
    t = ps.techniques.index((3, 3))
    w = ps.mis_weights(u, 3, 3, p)
    alone = np.where(w > 0, p.scores[:, t] / np.where(w > 0, w, 1.0), 0.0)
    reference = q.f_star_of(3)

    def image(values, pixel):  # per-pixel mean and standard error of the estimator
        m = np.bincount(pixel, values, npix) / n
        m2 = np.bincount(pixel, values * values, npix) / n
        return m, np.sqrt(np.maximum(m2 - m * m, 0.0) / n)

    (a, sa), (b, sb) = image(alone, p.pixels[:, t]), image(reference, q.pixel)
    z = (a - b) / np.hypot(sa, sb)
    assert np.mean(z * z) < 1.5, np.mean(z * z)
    assert abs(a.sum() / b.sum() - 1) < 0.02


def _cosine_numbers(normal, d):
    """The two numbers edge_rt's cosine lobe (bsdf.sampling_expressions: Duff et al.'s frame,
    ``(sqrt(u1) cos 2 pi u2, sqrt(u1) sin 2 pi u2, sqrt(1 - u1))``) maps to direction ``d``
    around ``normal``; (N, 2)."""
    sign = np.where(normal[:, 2] >= 0, 1.0, -1.0)
    a = -1.0 / (sign + normal[:, 2])
    b = normal[:, 0] * normal[:, 1] * a
    t = np.stack([1 + sign * normal[:, 0] ** 2 * a, sign * b, -sign * normal[:, 0]], 1)
    bt = np.stack([b, sign + normal[:, 1] ** 2 * a, -normal[:, 1]], 1)
    x, y = (d * t).sum(1), (d * bt).sum(1)
    return np.stack([x * x + y * y, np.mod(np.arctan2(y, x) / (2 * np.pi), 1.0)], 1)


def test_one_path_through_glass_by_two_techniques():
    """Paths camera -> glass sphere -> through it -> its far side -> an opaque wall -> light
    (length 4), sampled by NEE (s = 1: every vertex traced from the camera side), rebuilt as
    technique s = 3 (the same light point, the emission towards the wall, the wall's bounce
    back to the sphere in absolute coordinates, connected to x_1 through the sphere: the
    sphere's far side is then traced from the light side, and the contribution sees it from
    the camera side across the refraction). Both kernels evaluate the same f and densities:
    C_s / w_s = f / p_s and w_s ~ p_s^2, so (C_1 / w_1) / (C_3 / w_3) = sqrt(w_3 / w_1),
    to 1e-6 (the rebuilt path's points come from Embree's offset rays)."""
    ps = PathSpace(glass_box(), max_length=4, min_length=4, bidirectional=True,
                   roughness_threshold=0.001, backend="numpy")
    rng = np.random.default_rng(21)
    u = rng.random((1 << 15, ps.dim))
    p = ps.trace(u)
    lanes, _ = p.structure[4, NEE]
    kinds = _glass_vertices(ps, p.structure, 4, NEE, len(u))[lanes]
    lit = p.f_star_of(4, NEE)[lanes] > 1e-6
    u = u[lanes[lit & kinds[:, 0] & kinds[:, 1] & ~kinds[:, 2]][:40]]
    assert len(u) == 40
    p = ps.trace(u)
    g, dt = ps.geometry, torch.float64
    with torch.no_grad(), torch_single_thread():  # the path's points: edge_rt's walk
        o, d, _ = ps.scene.camera.rays(torch.as_tensor(u[:, :2] * [ps.width, ps.height]), dt)
        ray, points = o, []
        for i in range(1, 4):
            si = g.interact(g.intersect(ray, d), o, d)
            points.append(si.p.numpy())
            if i == 3:
                break
            wo, _ = ps._sample(si, -d, *g.material(si), relative_eta(g, si),
                               torch.as_tensor(u[:, ps.bsdf_dims[i - 1]]))
            o, ray, d = si.p, g.spawn(si, wo), wo
        _, y, nl, _, _ = g.sample_light(torch.as_tensor(u[:, ps.light_dims[4]]))
    y, nl = y.numpy(), nl.numpy()
    t3 = ps.techniques.index((4, 3))
    w = u.copy()
    w[:, ps.light_point_dims] = u[:, ps.light_dims[4]]
    emission = points[2] - y
    w[:, ps.emission_dims] = _cosine_numbers(nl, emission / np.linalg.norm(emission, axis=1,
                                                                         keepdims=True))
    back = points[1] - points[2]
    w[:, ps.light_bsdf_dims[0][1:]] = spherical_coordinates(
        back / np.linalg.norm(back, axis=1, keepdims=True))
    q = ps.trace(w, coords=np.full(len(w), t3))
    both = q.valid[:, t3]
    assert both.sum() >= 36, both.sum()
    w1 = ps.mis_weights(u, 4, NEE, p)[both]
    w3 = ps.mis_weights(w, 4, 3, q)[both]
    assert (w3 > 0).all() and (w1 > 0).all()
    alone1 = p.f_star_of(4, NEE)[both] / w1
    alone3 = q.f_star_of(4, 3)[both] / w3
    np.testing.assert_allclose(alone1 / alone3, np.sqrt(w3 / w1), rtol=1e-6)


@pytest.mark.parametrize("length, technique, n", [
    (3, 2, 30), (3, 3, 30), (4, 2, 30), (4, 3, 30), (4, 4, 30), (4, HIT, 30), (4, NEE, 30),
    *(pytest.param(k, s, 300, marks=pytest.mark.slow) for k in (5, 6) for s in range(k + 1)),
])
def test_log_f_derivatives_match_central_differences(length, technique, n):
    """AE-7 on the bidirectional techniques of the glossy box: gradient and Hessian of log f*
    (the MIS weight over all of the length's techniques included) against Richardson-
    extrapolated central differences, relative 1e-4 (test_pathspace's procedure). Measured:
    1e-9 or better. The discrete numbers (the light-triangle pick, every lobe selector of
    either subpath) have zero derivatives."""
    ps = PathSpace(glossy_box(), max_length=length, min_length=length, bidirectional=True,
                   backend="numpy")
    u = valid_states(ps, length, technique, np.random.default_rng(7), n)
    c = check_technique_derivatives(ps, u, length, technique)
    g, H = c.grad, c.hess
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(c.logf, np.log(c.paths.f_star_of(length, technique)),
                                   rtol=1e-12)
    np.testing.assert_array_equal(H, np.swapaxes(H, 1, 2))
    assert c.ok.sum() >= 0.75 * n
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    dims = ps.dims(length, technique)
    selectors = ([b[0] for b in ps.bsdf_dims] + [ps.light_dims[length][0]]
                 + [ps.light_point_dims[0]] + [b[0] for b in ps.light_bsdf_dims])
    discrete = [list(dims).index(j) for j in selectors if j in dims]
    assert discrete and (g[:, discrete] == 0).all() and (H[:, discrete] == 0).all()


def _glass_states(ps, length, technique, rng, n, samples):
    """``n`` states whose path of the technique carries light (f* > 1e-6: at the edge of
    total internal reflection 1 - F cancels and central differences lose accuracy) and has
    a dielectric vertex."""
    u = rng.random((samples, ps.dim))
    p = ps.trace(u)
    glassy = _glass_vertices(ps, p.structure, length, technique, samples).any(1)
    picked = np.flatnonzero(glassy & (p.f_star_of(length, technique) > 1e-6))[:n]
    assert len(picked) == n, len(picked)
    return u[picked]


@pytest.mark.parametrize("length, technique, samples", [
    (3, 2, 1 << 13), (4, 2, 1 << 14), (4, 3, 1 << 14), (4, 4, 1 << 14), (4, NEE, 1 << 14),
    *(pytest.param(5, s, 1 << 15, marks=pytest.mark.slow) for s in range(6)),
])
def test_glass_path_derivatives_match_central_differences(length, technique, samples):
    """AE-7 on bidirectional paths through the glass box's rough glass sphere, the light
    subpath's vertices on it seen from either side: gradient and Hessian of log f* (every
    technique's density in the weight, the frames across each refraction) against
    Richardson-extrapolated central differences, relative 1e-4. Measured: 1e-7 or better
    at lengths 3-4."""
    ps = PathSpace(glass_box(), max_length=length, min_length=length, bidirectional=True,
                   backend="numpy")
    u = _glass_states(ps, length, technique, np.random.default_rng(31), 20, samples)
    c = check_technique_derivatives(ps, u, length, technique)
    np.testing.assert_array_equal(c.hess, np.swapaxes(c.hess, 1, 2))
    assert c.ok.sum() >= 14, c.ok.sum()
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)


@pytest.mark.parametrize("scene, light_coordinates", [(glossy_box, False), (glass_box, False),
                                                       (glossy_box, True), (glass_box, True)])
def test_modified_coordinates_reproduce_the_pss_paths(scene, light_coordinates):
    """u -> w -> path on every technique, light subpaths included (threshold 0.001: every
    rough bounce of both subpaths absolute, the glass sphere's too): tracing w in the
    technique's coordinates gives u's contribution to 1e-11, with |det du/dw| != 1 wherever
    a direction was sampled, and the light subpath's bounce numbers are the ones that
    changed on techniques that sample it. In the glass box one NEE lane in 3156 is
    reproduced to 4e-4 only: reflected off the low-polygon sphere onto a neighbouring facet
    of it at grazing incidence, where a direction's last bits move the hit that much; there
    the bound is 1e-3 on every lane and 1e-11 on all but one in a thousand. With light
    coordinates, the ``s = 0`` techniques' last camera bounce holds the light sample of the
    point it hits (its vertex flagged ``lightcoord``, its pick number inside the light cdf,
    its Jacobian the light-coordinate one), and nothing else changes."""
    ps = PathSpace(scene(), max_length=4, bidirectional=True, roughness_threshold=0.001,
                   light_coordinates=light_coordinates, backend="numpy")
    plain = PathSpace(scene(), max_length=4, bidirectional=True, roughness_threshold=0.001,
                      backend="numpy")
    rng = np.random.default_rng(5)
    u = rng.random((8192, ps.dim))
    p = ps.trace(u)
    nv, cdf = len(ps._vertex_names), ps.geometry.light_cdf.numpy()
    for t, (k, s) in enumerate(ps.techniques):
        tech = np.full(len(u), t)
        w = ps.to_modified(u, p, tech, np.random.default_rng(t))
        q = ps.trace(w, coords=tech)
        lit = p.scores[:, t] > 0
        assert lit.sum() >= 20, (k, s)
        rel = np.abs(q.scores[lit, t] / p.scores[lit, t] - 1)
        if scene is glossy_box:
            assert rel.max() < 1e-11, (k, s, rel.max())
        else:
            assert rel.max() < 1e-3 and (rel > 1e-11).mean() < 1e-3, (k, s, rel.max())
        sampled = ps.modified_vertices(t) + max(s - 2, 0)
        assert (q.jacobian[lit, t] != 1).all() == bool(sampled), (k, s)
        light_numbers = (w != u)[:, np.concatenate(ps.light_bsdf_dims)].any(1)
        assert light_numbers[lit].all() == (s >= 3), (k, s)
        if not light_coordinates:
            continue
        flags = ps.lane_params(q, tech)[lit][:, ps._vertex_names.index("lightcoord")
                                             + nv * np.arange(k - 1)]
        assert (flags[:, -1] == (s == HIT)).all() and not flags[:, :-1].any(), (k, s)
        w_plain = plain.to_modified(u, plain.trace(u), tech, np.random.default_rng(t))
        last = ps.bsdf_dims[k - 2]
        if s != HIT:
            np.testing.assert_array_equal(w, w_plain)
            continue
        assert ((w[lit, last[0]] > 0) & (w[lit, last[0]] < cdf[-1])).all()
        np.testing.assert_array_equal(np.delete(w, last, 1), np.delete(w_plain, last, 1))
        q_plain = plain.trace(w_plain, coords=tech)
        assert (np.abs(q.jacobian[lit, t] / q_plain.jacobian[lit, t] - 1) > 1e-6).all()


@pytest.mark.parametrize("scene, length, technique, n", [
    ("glossy", 4, 2, 20), ("glossy", 4, 3, 20), ("glossy", 4, 4, 20), ("glossy", 4, NEE, 20),
    ("glass", 4, 2, 20), ("glass", 4, 3, 20), ("light", 3, HIT, 20), ("light", 4, HIT, 20),
])
def test_log_f_w_derivatives_match_central_differences(scene, length, technique, n):
    """AE-7 in the modified coordinates of the bidirectional techniques (threshold 0.05:
    absolute on the rough vertices of either subpath, the glass sphere's included, Kelemen's
    on the roughness-0.02 box): log f*_w's gradient and Hessian against central differences
    of the traced f*_w, relative 1e-4. ``glass``: paths with a vertex on the glass sphere.
    ``light``: the glossy box with light coordinates, the ``s = 0`` technique's last bounce
    aimed at a point of the light (its Jacobian inside the expression)."""
    ps = PathSpace(glass_box() if scene == "glass" else glossy_box(), max_length=length,
                   min_length=length, bidirectional=True, roughness_threshold=0.05,
                   light_coordinates=scene == "light", backend="numpy")
    rng = np.random.default_rng(8)
    if scene != "glass":
        w, t = modified_states(ps, length, technique, rng, n)
    else:
        u = _glass_states(ps, length, technique, rng, n, 1 << 14)
        t = ps.techniques.index((length, technique))
        w = ps.to_modified(u, ps.trace(u), np.full(n, t), rng)
    c = check_technique_derivatives(ps, w, length, technique, modified=True)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(c.logf, np.log(c.paths.scores_w[:, t]), rtol=1e-11)
    assert c.ok.sum() >= 0.6 * n, c.ok.sum()
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    assert (c.paths.jacobian[:, t] != 1).mean() >= 0.3
    if scene == "light":  # the lanes checked had their last bounce in light coordinates
        nv = len(ps._vertex_names)
        flags = ps.lane_params(c.paths, np.full(n, t))[:, ps._vertex_names.index("lightcoord")
                                                          + nv * (length - 2)]
        assert (flags[c.ok] == 1).all()


def test_a_zero_jacobian_is_no_contribution():
    """A proposal of H2MC's on the torus scene (12x12, paths of 4 segments, technique
    ``(4, 0)``) whose absolute direction at the torus has zero pdf as the kernel rounds it at
    a grazing angle, though the trace followed it: ``|det du/dw| = 0`` and the contribution
    in w is 0, so f*_w = 0 (a plain rejection), not 0 / 0 voiding the state as non-finite."""
    ps = PathSpace(scenes.torus_glass_cube((12, 12)), max_length=4, bidirectional=True,
                   roughness_threshold=0.03, backend="numpy")
    w = np.array([[0.6402017178226183, 0.6012147514672448, 0.21382950768009498,
                   0.2902989154805841, 0.42963973490264956, 0.6457225014684373,
                   0.20331692099572168, 0.4219574524018731, 0.3252856214664844,
                   0.33766021472096813, 0.5177982679105612, 0.09855037099649344,
                   0.48951781414316253, 0.7210742066033168, 0.2818599124109553,
                   0.5318704889872052, 0.17415938517325857, 0.07970807900682175,
                   0.14226454527453403, 0.24067539679597982, 0.8007426432752871,
                   0.5485026451572618, 0.5662046575140215, 0.1423809776322682,
                   0.1520245640119262, 0.2034334067953154, 0.22170919246939513,
                   0.3151903265902658]])
    t = ps.techniques.index((4, 0))
    p = ps.trace(w, coords=[t])
    assert not p.nonfinite[0] and p.valid[0, t]
    assert p.jacobian[0, t] == 0 and p.scores_w[0, t] == 0 and (p.contrib[0, t] == 0).all()


def test_bad_combinations_are_named():
    box = scenes.cornell_box((8, 6))
    ps = PathSpace(box, max_length=3, bidirectional=True, backend="numpy")
    with pytest.raises(PathSpaceError, match=r"s must be an integer in \[0, 3\]"):
        ps.dims(3, 4)
    with pytest.raises(PathSpaceError, match="outside"):
        ps.dims(4, 2)
    stretched = scenes.cornell_box((8, 6))
    stretched.camera.cam_to_world[:3, 0] *= 2.0
    with pytest.raises(PathSpaceError, match="without scale or shear"):
        PathSpace(stretched, bidirectional=True)


def test_lens_kernels_cover_each_reconnection_vertex(monkeypatch):
    """compile_kernels(lens=True) on the BDPT techniques builds the lens kernels of every
    reconnection vertex lens_vertex can return (and every technique's vertex positions):
    j <= length - 2 on the s = 0, 1 techniques, j <= t - 2 with a light subpath (none where
    t <= 2: light tracing, and x_1 connected to the light subpath). The builds are recorded,
    not run."""
    ps = PathSpace(scenes.cornell_box((8, 6)), max_length=4, bidirectional=True,
                   roughness_threshold=0.03, backend="numpy")
    tasks = []
    monkeypatch.setattr(ps, "_build_kernel",
                        lambda task, cached_only=False: tasks.append(task) or object())
    ps.compile_kernels(lens=True, workers=1)
    for kind in ("lens_direction", "lens_hessian"):
        built = {task[1:] for task in tasks if task[0] == kind}
        assert built == {(3, 0, 1), (3, 1, 1), (4, 0, 1), (4, 0, 2), (4, 1, 1), (4, 1, 2),
                         (4, 2, 1)}
    assert list(ps.lens_vertex_range(4, 3)) == [] and list(ps.lens_vertex_range(4, 4)) == []
    # the lens's anchor and light coordinates read the vertex positions: built up front too
    assert {task[1:] for task in tasks if task[0] == "positions"} == set(ps.techniques)
