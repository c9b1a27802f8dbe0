"""Gradients that move geometry (interior + primary edges) against central differences with
common random numbers (square spp: stratified samples, so the FD counts swept samples
almost exactly): the closed cube's vertices and translation (where Mitsuba 3's
projective integrator is 1.5-2.8x off, mitsuba3 issue 1895), camera pose (no gradients in
Mitsuba 3, issue 1701) and the AOV channels (A-P-8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_rt import scenes
from edge_rt.testing import fd_directional, fd_gradient, loss_gradient, rel_l1

RES = (24, 24)
ADJOINT = torch.as_tensor(np.random.default_rng(8).uniform(0.5, 1.5, size=(*RES[::-1], 3)))


def cube_gradient(scene, get, output="radiance", max_depth=1, seeds=2, adjoint=ADJOINT):
    return np.mean([loss_gradient(scene, get, adjoint[..., :_channels(output)], spp=16,
                                  max_depth=max_depth, output=output, seed=s,
                                  edge_samples=200_000) for s in range(seeds)], axis=0)


def _channels(output):
    return 1 if output == "depth" else 3


def test_closed_cube_vertex_gradients():
    scene = scenes.closed_cube(resolution=RES)

    def get(s):
        return s.meshes[0].vertices

    # 6 seeds of the gradient and 512-spp differences: rel-L1 between two 2-seed gradients
    # is 0.053 and between two 256-spp differences 0.034, and the 2-seed / 256-spp check
    # reached 0.045-0.085 against its 0.08 bound on other random streams.
    g = cube_gradient(scene, get, seeds=6)
    # Translation: the sum over the cube's vertices, one component at a time.
    fd_t = [fd_directional(scene, get, ADJOINT, np.tile(np.eye(3)[k], (8, 1)), 1e-2,
                           spp=1024, max_depth=1, seed=9) for k in range(3)]
    assert rel_l1(g.sum(0), fd_t) < 0.05, (g.sum(0), fd_t)
    # Single vertices: the silhouette corners move the outline, the others only the shading.
    fd = fd_gradient(scene, get, ADJOINT, 1e-2, components=range(24), spp=512, max_depth=1,
                     seed=9)
    assert rel_l1(g, fd) < 0.08, (g, fd)


def test_camera_pose_gradients():
    scene = scenes.closed_cube(resolution=RES)

    def get(s):
        return s.camera.cam_to_world

    g = cube_gradient(scene, get)
    assert np.all(g[3] == 0.0), "the homogeneous row does not influence the image"
    fd_pos = fd_gradient(scene, get, ADJOINT, 1e-2, components=[3, 7, 11], spp=1024,
                         max_depth=1, seed=9).reshape(-1)[[3, 7, 11]]
    assert rel_l1(g[:3, 3], fd_pos) < 0.05, (g[:3, 3], fd_pos)
    rng = np.random.default_rng(10)
    direction = np.zeros((4, 4))
    direction[:3, :3] = rng.normal(size=(3, 3))
    # h = 1e-2 as for the position: at 1e-3 the difference's seed-to-seed deviation was 2.1%
    # of the value (failing the 5% bound on another random stream), at 1e-2 0.35%.
    fd_rot = fd_directional(scene, get, ADJOINT, direction, 1e-2, spp=1024, max_depth=1, seed=9)
    np.testing.assert_allclose((g * direction).sum(), fd_rot, rtol=0.05)


@pytest.mark.parametrize("output", ["depth", "position", "normal", "albedo"])
def test_aov_gradients(output):
    """A-P-8: AOV channels are path-free shading functions; their vertex gradients (mostly the
    silhouette term: normal and albedo are piecewise constant on a flat cube) match FD.
    Translation components; means over 4 seeds each side agree within 3 standard errors and
    8% rel-L1 (the spec's 2% is the faithful tier)."""
    scene = scenes.closed_cube(resolution=RES)

    def get(s):
        return s.meshes[0].vertices

    adjoint = ADJOINT[..., :_channels(output)]
    ad = np.array([loss_gradient(scene, get, adjoint, spp=16, output=output, seed=s,
                                 edge_samples=200_000).sum(0) for s in range(4)])
    fd = np.array([[fd_directional(scene, get, adjoint, np.tile(np.eye(3)[k], (8, 1)), 1e-2,
                                   spp=1024, output=output, seed=s) for k in range(3)]
                   for s in range(9, 13)])
    se = np.sqrt(ad.var(0, ddof=1) / len(ad) + fd.var(0, ddof=1) / len(fd))
    diff = np.abs(ad.mean(0) - fd.mean(0))
    # 3 standard errors, plus 2% for the O(h^2) bias of the central difference.
    bound = 3.0 * se + 0.02 * np.abs(fd.mean(0)).max()
    assert np.all(diff <= bound), (ad.mean(0), fd.mean(0), se)
    assert rel_l1(ad.mean(0), fd.mean(0)) < 0.08, (ad.mean(0), fd.mean(0))
