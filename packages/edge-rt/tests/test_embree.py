"""edge_rt's Embree ray casting (``_embree.TriangleScene``) against embreex's ``run`` on the
same triangles: identical hits for closest-hit and shadow (occluded) queries, strided inputs
and empty batches."""

import numpy as np
import torch
from embreex import rtcore_scene
from embreex.mesh_construction import TriangleMesh

from edge_rt._embree import TriangleScene


def _soup(rng, n=200):
    """Random triangles (no two coplanar) in the unit cube."""
    centre = rng.uniform(-1.0, 1.0, (n, 1, 3))
    return (centre + rng.normal(scale=0.15, size=(n, 3, 3))).astype(np.float32)


def _rays(rng, n=20000):
    o = rng.uniform(-1.5, 1.5, (n, 3)).astype(np.float32)
    d = rng.normal(size=(n, 3)).astype(np.float32)
    return o, d / np.linalg.norm(d, axis=1, keepdims=True)


def test_hits_match_embreex():
    rng = np.random.default_rng(0)
    tris = _soup(rng)
    reference = rtcore_scene.EmbreeScene()
    TriangleMesh(reference, tris)
    ours = TriangleScene(tris)
    o, d = _rays(rng)
    tmax = rng.uniform(0.0, 2.0, len(o)).astype(np.float32)
    expected = reference.run(o, d).astype(np.int64)
    assert 0 < (expected >= 0).sum() < len(o)
    # the direction as a strided view (a column slice of a wider tensor)
    wide = torch.as_tensor(np.concatenate([d, o], 1))
    got = ours.intersect(torch.as_tensor(o), wide[:, :3])
    np.testing.assert_array_equal(got.numpy(), expected)
    blocked = reference.run(o, d, dists=tmax).astype(np.int64) >= 0
    assert 0 < blocked.sum() < len(o)
    np.testing.assert_array_equal(
        ours.occluded(torch.as_tensor(o), torch.as_tensor(d), torch.as_tensor(tmax)).numpy(),
        blocked)
    np.testing.assert_array_equal(
        ours.intersect(torch.as_tensor(o), torch.as_tensor(d), torch.as_tensor(tmax)).numpy(),
        reference.run(o, d, dists=tmax).astype(np.int64))


def test_empty_batch():
    ours = TriangleScene(_soup(np.random.default_rng(1), 3))
    empty = torch.zeros((0, 3))
    assert ours.intersect(empty, empty).shape == (0,)
    assert ours.occluded(empty, empty, torch.zeros(0)).shape == (0,)


def test_scene_without_triangles_misses_everything():
    ours = TriangleScene(np.zeros((0, 3, 3), np.float32))
    rays = torch.ones((4, 3))
    np.testing.assert_array_equal(ours.intersect(rays, rays).numpy(), -1)
    assert not ours.occluded(rays, rays, torch.ones(4)).any()
