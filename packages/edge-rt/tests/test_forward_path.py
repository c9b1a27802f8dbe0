"""The forward render's kernels without derivatives (``trace`` under ``torch.no_grad``: the
SHADE kernel and ``_hit``'s gathering intersection kernel) against the differentiable path
the backward pass replays (the same ``trace`` with autograd on), on the same random numbers:
equal up to float32 rounding, on scenes with area lights, shading normals, textures, an
envmap, glossy materials and a rough dielectric."""

import numpy as np
import pytest
import torch

from edge_rt import scenes
from edge_rt.geometry import Geometry
from edge_rt.integrator import Sampler, trace

SCENES = {
    "cornell_box": lambda: scenes.cornell_box(resolution=(24, 24)),
    "textured_sphere": lambda: scenes.textured_sphere(resolution=(24, 24)),
    "glossy_cornell": lambda: scenes.glossy_cornell(resolution=(24, 24)),
    "closed_cube": lambda: scenes.closed_cube(resolution=(24, 24)),
    "torus_glass_cube": lambda: scenes.torus_glass_cube(resolution=(24, 24)),
}


@pytest.mark.parametrize("name", sorted(SCENES))
def test_forward_kernels_match_the_differentiable_path(name):
    scene = SCENES[name]()
    cam = scene.camera
    n = cam.width * cam.height * 2
    rng = np.random.default_rng(5)
    xy = torch.as_tensor(rng.uniform(0.0, 1.0, (n, 2)) * [cam.width, cam.height],
                         dtype=torch.float32)
    g = Geometry(scene, torch.float32)
    with torch.no_grad():
        fast = trace(scene, g, xy, Sampler((3,), 0, n), max_depth=3)
    with torch.enable_grad():
        replay = trace(scene, g, xy, Sampler((3,), 0, n), max_depth=3).detach()
    assert fast.abs().sum() > 0
    # float32 rounding of the fused expressions; a path may take another branch at a tie
    # (a grazing direction), so the bound is on the image's relative L1 and per-lane outliers
    diff = (fast - replay).abs()
    assert diff.sum() / replay.abs().sum() < 1e-5
    assert (diff > 1e-4 * (1.0 + replay.abs())).float().mean() < 1e-3
