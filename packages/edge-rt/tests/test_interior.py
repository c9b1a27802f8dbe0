"""Interior derivatives (spec 5.3): every parameter that does not move geometry against
central differences with common random numbers. For diffuse materials the sampled paths do
not depend on these parameters, so the per-sample derivative is exact and the comparison is
tight; roughness and shading normals steer the sampled directions (held constant, unbiased
in expectation, spec 5.3), so they are compared statistically."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_rt import Camera, EnvironmentMap, Material, Scene, Texture, look_at, scenes
from edge_rt.testing import fd_directional, fd_gradient, loss_gradient


def diffuse_scene(specular=(0.0, 0.0, 0.0), roughness=0.3):
    rng = np.random.default_rng(1)
    texels = torch.as_tensor(rng.uniform(0.2, 0.8, size=(8, 8, 3)))
    sphere = scenes.uv_sphere((0.0, 0.0, 0.0), 1.0, rings=12, segments=24,
                              material=Material(diffuse=Texture(texels), specular=specular,
                                                roughness=(roughness,)))
    floor = scenes.quad((-4, -1, -4), (0, 0, 8), (8, 0, 0), Material(diffuse=(0.5, 0.4, 0.3)),
                        name="floor")
    light = scenes.quad((-1, 3, -1), (2, 0, 0), (0, 0, 2), emission=(6.0, 5.0, 4.0),
                        name="light")
    scenes.orient_down(light)
    # a fixed sampling importance: finite differences of the texels then sample the same
    # directions (common random numbers); by default it follows the radiance
    env = EnvironmentMap(torch.as_tensor(rng.uniform(0.1, 0.5, size=(4, 8, 3))),
                         importance=rng.uniform(0.5, 1.0, size=(4, 8)))
    cam = Camera(look_at((0.0, 1.0, 4.0), (0.0, 0.0, 0.0)), fov=45.0, resolution=(24, 24))
    return Scene(cam, [sphere, floor, light], env)


ADJOINT = torch.as_tensor(np.random.default_rng(2).uniform(0.5, 1.5, size=(24, 24, 3)))
EXACT = dict(spp=4, max_depth=2, seed=5)

PARAMETERS = {
    "albedo texels": lambda s: s.meshes[0].material.diffuse.values,
    "material constant": lambda s: s.meshes[1].material.diffuse.values,
    "light intensity": lambda s: s.meshes[2].emission,
    "envmap texels": lambda s: s.envmap.radiance.values,
}


@pytest.mark.parametrize("name", list(PARAMETERS))
def test_interior_gradient_is_exact_per_sample(name):
    scene = diffuse_scene()
    get = PARAMETERS[name]
    g = loss_gradient(scene, get, ADJOINT, edges=False, **EXACT)
    assert np.abs(g).max() > 0, "the parameter must influence the image"
    rng = np.random.default_rng(3)
    for _ in range(2):
        direction = rng.normal(size=g.shape)
        fd = fd_directional(scene, get, ADJOINT, direction, h=1e-3, **EXACT)
        np.testing.assert_allclose((g * direction).sum(), fd, rtol=1e-6)
    if g.size <= 3:
        np.testing.assert_allclose(g, fd_gradient(scene, get, ADJOINT, 1e-3, **EXACT),
                                   rtol=1e-6)


def agree_statistically(scene, get, direction, h, seeds, ad_spp, fd_spp):
    """Mean directional derivative (interior AD) against the mean central difference over
    independent seeds: within 3 standard errors, and the errors small enough (10% of the
    value) for the check to have teeth. The differences sample other directions on either
    side (their paths decorrelate), and the last bits of those paths differ between CPUs, so
    the sample sizes leave the standard error at about half the 10% bound or less (12 seeds
    of 256 spp for both came within 10% of it on another machine when only the differences
    had 256). Per-seed standard deviations measured: roughness AD 1.2 (64 spp), differences
    0.43 (512 spp) of a mean of -39; shading normals AD 1.3 (64 spp), differences 0.50
    (512 spp) of a mean of 4.6; the sample sizes follow from those."""
    ad = [(loss_gradient(scene, get, ADJOINT, edges=False, spp=ad_spp, seed=s) * direction).sum()
          for s in range(seeds)]
    fd = [fd_directional(scene, get, ADJOINT, direction, h, spp=fd_spp, seed=100 + s)
          for s in range(seeds)]
    diff = abs(np.mean(ad) - np.mean(fd))
    se = np.sqrt(np.var(ad, ddof=1) / seeds + np.var(fd, ddof=1) / seeds)
    assert se <= 0.1 * abs(np.mean(fd)), (np.mean(ad), np.mean(fd), se)
    print(f"AD {np.mean(ad):.4g}, differences {np.mean(fd):.4g}, standard error {se:.3g}")
    assert diff <= 3.0 * se, (np.mean(ad), np.mean(fd), se)


def test_roughness_gradient_matches_finite_differences():
    scene = diffuse_scene(specular=(0.3, 0.3, 0.3), roughness=0.4)
    agree_statistically(scene, lambda s: s.meshes[0].material.roughness.values,
                        np.ones(1), h=1e-2, seeds=8, ad_spp=64, fd_spp=128)


def test_shading_normal_gradient_matches_finite_differences():
    # at 256 spp the differences' standard error reached 0.47 against a bound of 0.45 in a CI
    # run, when chunks rendered in threads could skip the envmap's next-event estimation (the
    # mean then varied from run to run with fixed seeds; fixed, test_environment.py): 1024 spp
    # keep it at 0.15-0.19
    scene = diffuse_scene()
    direction = np.random.default_rng(4).normal(size=scene.meshes[0].normals.shape)
    agree_statistically(scene, lambda s: s.meshes[0].normals, direction, h=3e-2, seeds=8,
                        ad_spp=256, fd_spp=1024)
