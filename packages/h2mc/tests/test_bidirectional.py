"""Bidirectional techniques (light subpaths connected to camera subpaths): layout, that every
technique estimates the same light, derivatives against central differences (AE-7), bad
input."""

import numpy as np
import pytest

from edge_rt import scenes

from h2mc import HIT, NEE, PathSpace, PathSpaceError
from h2mc.testing import check_technique_derivatives, glossy_box, modified_states, valid_states


def test_layout_and_techniques():
    ps = PathSpace(scenes.cornell_box((16, 12)), max_length=4, bidirectional=True,
                   backend="numpy")
    uni = PathSpace(ps.scene, max_length=4, backend="numpy")
    # the unidirectional coordinates first, then the light point, the emission and one
    # bounce of the light subpath
    assert ps.dim == uni.dim + 3 + 2 + 3
    np.testing.assert_array_equal(ps.light_point_dims, [17, 18, 19])
    np.testing.assert_array_equal(ps.emission_dims, [20, 21])
    assert ps.techniques == [(3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2), (4, 3)]
    assert ps.techniques_of(4) == [0, 1, 2, 3]
    for s in (HIT, NEE):
        np.testing.assert_array_equal(ps.dims(4, s), uni.dims(4, s))
    np.testing.assert_array_equal(ps.dims(3, 2), [0, 1, 17, 18, 19, 20, 21])  # t = 2
    np.testing.assert_array_equal(ps.dims(4, 2), [0, 1, 2, 3, 4, 17, 18, 19, 20, 21])
    np.testing.assert_array_equal(ps.dims(4, 3), [0, 1, 17, 18, 19, 20, 21, 22, 23, 24])
    u = np.random.default_rng(3).random((4096, ps.dim))
    p = ps.trace(u)
    assert p.contrib.shape == (4096, 7, 3) and not p.nonfinite.any()
    assert 0.2 < p.valid[:, ps.techniques.index((3, 2))].mean() < 0.9
    assert (p.contrib[~p.valid] == 0).all()
    np.testing.assert_allclose(p.f_star_of(4), p.scores[:, 3:].sum(1))
    # the unidirectional techniques trace the same paths (their weights differ)
    q = uni.trace(u[:, :uni.dim])
    np.testing.assert_array_equal(p.valid[:, [0, 1, 3, 4]], q.valid)
    np.testing.assert_array_equal(ps.trace(u).contrib, p.contrib)  # deterministic


def test_every_technique_estimates_the_same_light():
    """Glossy box (Phong lobes, shading normals), 2^15 uniform states, per length 3 and 4:
    the MIS-weighted sum over all techniques agrees with the unidirectional path space's
    (its two techniques) within 4 standard errors, and so does every technique alone,
    unweighted (C_s / w_s = f / p_s: a wrong density of its own sampling biases it; a wrong
    density in another technique's weight biases the sum). Measured: sum -0.12 / +0.33
    combined SE; single techniques within 1.3 SE. The light-subpath techniques carry 38% of
    length 3 and 55% of length 4, and the sum's standard error is 1.3-2x lower than the
    unidirectional one."""
    scene = glossy_box()
    ps = PathSpace(scene, max_length=4, bidirectional=True, backend="numpy")
    uni = PathSpace(scene, max_length=4, backend="numpy")
    n = 1 << 15
    u = np.random.default_rng(12).random((n, ps.dim))
    p, q = ps.trace(u), uni.trace(u[:, :uni.dim])

    def mean_se(x):
        return x.mean(), x.std() / np.sqrt(n)

    for k in (3, 4):
        (m, se), (m_uni, se_uni) = mean_se(p.f_star_of(k)), mean_se(q.f_star_of(k))
        assert abs(m - m_uni) < 4 * np.hypot(se, se_uni), k
        assert se < 0.9 * se_uni, k
        for s in ps.techniques_of(k):
            w = ps.mis_weights(u, k, s, p)
            assert ((w >= 0) & (w <= 1)).all()
            alone = np.where(w > 0, p.f_star_of(k, s) / np.where(w > 0, w, 1.0), 0.0)
            m_s, se_s = mean_se(alone)
            assert abs(m_s - m) < 4 * np.hypot(se_s, se), (k, s)
        light = sum(p.f_star_of(k, s) for s in range(2, k))
        assert light.mean() > 0.2 * m


@pytest.mark.parametrize("length, technique, n", [
    (3, 2, 30), (4, 2, 30), (4, 3, 30), (4, HIT, 30), (4, NEE, 30),
    *(pytest.param(k, s, 300, marks=pytest.mark.slow) for k in (5, 6) for s in range(k)),
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


def test_modified_coordinates_reproduce_the_pss_paths():
    """u -> w -> path on every technique, light subpaths included (threshold 0.001: every
    rough bounce of both subpaths absolute): tracing w in the technique's coordinates gives
    u's contribution to 1e-11, with |det du/dw| != 1 wherever a direction was sampled, and
    the light subpath's bounce numbers are the ones that changed on techniques that sample
    it."""
    ps = PathSpace(glossy_box(), max_length=4, bidirectional=True, roughness_threshold=0.001,
                   backend="numpy")
    rng = np.random.default_rng(5)
    u = rng.random((4096, ps.dim))
    p = ps.trace(u)
    for t, (k, s) in enumerate(ps.techniques):
        tech = np.full(len(u), t)
        w = ps.to_modified(u, p, tech, rng)
        q = ps.trace(w, coords=tech)
        lit = p.scores[:, t] > 0
        assert lit.sum() >= 20, (k, s)
        np.testing.assert_allclose(q.scores[lit, t], p.scores[lit, t], rtol=1e-11)
        sampled = ps.modified_vertices(t) + max(s - 2, 0)
        assert (q.jacobian[lit, t] != 1).all() == bool(sampled), (k, s)
        light_numbers = (w != u)[:, np.concatenate(ps.light_bsdf_dims)].any(1)
        assert light_numbers[lit].all() == (s == 3), (k, s)


@pytest.mark.parametrize("length, technique, n", [(4, 2, 20), (4, 3, 20), (4, NEE, 20)])
def test_log_f_w_derivatives_match_central_differences(length, technique, n):
    """AE-7 in the modified coordinates of the bidirectional techniques (glossy box,
    threshold 0.05: absolute on the rough vertices of either subpath, Kelemen's on the
    roughness-0.02 box): log f*_w's gradient and Hessian against central differences of the
    traced f*_w, relative 1e-4."""
    ps = PathSpace(glossy_box(), max_length=length, min_length=length, bidirectional=True,
                   roughness_threshold=0.05, backend="numpy")
    w, t = modified_states(ps, length, technique, np.random.default_rng(8), n)
    c = check_technique_derivatives(ps, w, length, technique, modified=True)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(c.logf, np.log(c.paths.scores_w[:, t]), rtol=1e-11)
    assert c.ok.sum() >= 0.6 * n, c.ok.sum()
    assert c.grad_error < 1e-4 and c.hess_error < 1e-4, (c.grad_error, c.hess_error)
    assert (c.paths.jacobian[:, t] != 1).mean() >= 0.3


def test_bad_combinations_are_named():
    box = scenes.cornell_box((8, 6))
    with pytest.raises(PathSpaceError, match="light coordinates are not written"):
        PathSpace(box, bidirectional=True, roughness_threshold=0.03, light_coordinates=True)
    with pytest.raises(PathSpaceError, match="dielectric"):
        PathSpace(scenes.torus_glass_cube((8, 8)), bidirectional=True)
    ps = PathSpace(box, max_length=3, bidirectional=True, backend="numpy")
    with pytest.raises(PathSpaceError, match=r"s must be an integer in \[0, 2\]"):
        ps.dims(3, 3)
    with pytest.raises(PathSpaceError, match="outside"):
        ps.dims(4, 2)
    modified = PathSpace(box, max_length=3, bidirectional=True, roughness_threshold=0.03,
                         backend="numpy")
    with pytest.raises(PathSpaceError, match="lens perturbation is not written"):
        modified.compile_kernels(lens=True)
