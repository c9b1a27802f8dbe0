"""Linear motion (scene.Mesh.velocity): ray casting at per-ray times, bad input, and the
path tracer's refusal (it renders no motion blur)."""

import dataclasses

import numpy as np
import pytest
import torch

import edge_rt
from edge_rt import scenes
from edge_rt.geometry import Geometry
from edge_rt.scene import Mesh, SceneError


def _rays(scene, n, seed=0):
    rng = np.random.default_rng(seed)
    xy = torch.as_tensor(rng.random((n, 2)) * np.array(scene.camera.resolution))
    o, d, _ = scene.camera.rays(xy, torch.float64)
    return o, d


def _frozen(scene, t):
    """The scene with each moving mesh translated to time ``t`` and at rest."""
    meshes = [dataclasses.replace(m, vertices=m.vertices + t * m.velocity, velocity=None)
              if m.velocity is not None else m for m in scene.meshes]
    return edge_rt.Scene(scene.camera, meshes)


@pytest.mark.parametrize("t", [0.0, 0.37, 0.95])
def test_intersection_at_time_is_the_translated_static_one(t):
    scene = scenes.moving_caustics((24, 24))
    g, g_static = Geometry(scene, torch.float64), Geometry(_frozen(scene, t), torch.float64)
    o, d = _rays(scene, 3000)
    times = torch.full((len(o),), t)
    tri = g.intersect(o, d, time=times)
    same = tri == g_static.intersect(o, d)
    # float32 casting differs (ray origin moved vs vertices moved): rays through shared
    # edges may pick the neighbouring triangle
    assert same.float().mean() > 0.995
    ball = g.mesh_of[tri] == 0
    assert 100 < int(ball.sum()) < len(o)  # both the ball and the floor are hit
    tri, o, d, times = tri[same], o[same], d[same], times[same]
    si, si_static = g.interact(tri, o, d, times), g_static.interact(tri, o, d)
    assert torch.allclose(si.p, si_static.p, atol=1e-6)  # grazing hits amplify rounding
    assert torch.allclose(si.ns, si_static.ns, atol=1e-6)
    # with a tmax short of the first hit, nothing is hit
    cut = g.intersect(o, d, tmax=si.t * 0.999, time=times)
    assert (cut < 0).float().mean() > 0.995


def test_per_ray_times_mix():
    scene = scenes.moving_caustics((24, 24))
    g = Geometry(scene, torch.float64)
    o, d = _rays(scene, 2000, seed=1)
    times = torch.as_tensor(np.random.default_rng(2).random(len(o)))
    tri = g.intersect(o, d, time=times)
    for t in (0.1, 0.6):
        sel = torch.nonzero((times - t).abs() < 0.05).flatten()
        near = Geometry(_frozen(scene, t), torch.float64).intersect(o[sel], d[sel])
        assert (tri[sel] == near).float().mean() > 0.9  # the ball moves 0.04 within 0.05
    static = Geometry(_frozen(scene, 0.0), torch.float64)
    assert static.movers == [] and static.tri_velocity is None


def test_bad_velocity_and_moving_lights_are_refused():
    v, f = np.eye(3), np.array([[0, 1, 2]])
    with pytest.raises(SceneError, match="velocity must be a translation"):
        Mesh(v, f, velocity=(1.0, 0.0))
    with pytest.raises(SceneError, match="NaN or infinity"):
        Mesh(v, f, velocity=(np.nan, 0.0, 0.0))
    with pytest.raises(SceneError, match="moving lights"):
        Mesh(v, f, emission=(1.0, 1.0, 1.0), velocity=(1.0, 0.0, 0.0))
    assert scenes.ring_scene((8, 8)).moving_meshes == []


def test_path_tracer_refuses_moving_meshes():
    scene = scenes.moving_caustics((8, 8))
    with pytest.raises(SceneError, match="no motion blur"):
        edge_rt.render_image(scene, spp=1, progress=False)
    with pytest.raises(SceneError, match="no motion blur"):
        edge_rt.gradients(scene, torch.ones(8, 8, 3), spp=1, progress=False)
