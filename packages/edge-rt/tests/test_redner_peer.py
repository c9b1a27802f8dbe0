"""The redner peer of benchmarks/bench_render.py: the npz that benchmarks/redner_driver.py reads
is edge_rt's Cornell box (meshes, materials, light, and a camera whose rays are edge_rt's),
unsupported scenes are refused, and, where a Python 3.8 with redner 0.4.28 is found
(``$EDGE_RT_REDNER_PYTHON`` or pyenv), the driver renders a tiny image and its gradient."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_rt import scenes
from edge_rt.scene import Scene, SceneError

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


redner_peer = _load("redner_peer")
redner_driver = _load("redner_driver")  # its npz reader is NumPy only; redner is imported lazily


def test_export_round_trips(tmp_path):
    scene = scenes.cornell_box(resolution=(24, 16))
    read = redner_driver.ExportedScene(redner_peer.export_scene(scene, tmp_path / "cb.npz"))
    assert (read.width, read.height) == (24, 16)
    assert read.clip_near == pytest.approx(scene.camera.clip_near)
    assert len(read.meshes) == len(scene.meshes)
    for ours, theirs in zip(scene.meshes, read.meshes):
        assert theirs["name"] == ours.name
        np.testing.assert_allclose(theirs["vertices"], ours.vertices.numpy(), atol=1e-6)
        np.testing.assert_array_equal(theirs["faces"], ours.faces.numpy())
        for field in ("diffuse", "specular", "roughness"):
            np.testing.assert_allclose(theirs[field], getattr(ours.material, field).values.numpy(),
                                       atol=1e-7)
        if ours.emission is None:
            assert theirs["emission"] is None
        else:
            np.testing.assert_allclose(theirs["emission"], ours.emission.numpy())
    # The driver's camera (redner's perspective model, camera.h sample_primary) shoots
    # edge_rt's rays through the same screen points.
    xy = torch.tensor([[0.5, 0.5], [23.5, 0.5], [12.0, 8.0], [3.25, 15.75]], dtype=torch.float64)
    origin, direction, _ = scene.camera.rays(xy, torch.float64)
    u, v = xy[:, 0].numpy() / read.width, xy[:, 1].numpy() / read.height
    pt = np.stack([2.0 * u - 1.0, -2.0 * (v - 0.5) * read.height / read.width, np.ones_like(u)], 1)
    local = pt @ read.intrinsic_inv.T
    world = local @ read.cam_to_world[:3, :3].T
    world /= np.linalg.norm(world, axis=1, keepdims=True)
    np.testing.assert_allclose(world, direction.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.broadcast_to(read.cam_to_world[:3, 3], (4, 3)), origin.numpy(),
                               atol=1e-6)


def test_export_refuses_what_the_driver_cannot_render(tmp_path):
    with pytest.raises(SceneError, match="environment maps"):
        redner_peer.export_scene(scenes.textured_sphere(), tmp_path / "s.npz")
    teapot = scenes.teapot_scene()
    with pytest.raises(SceneError, match="shading normals"):
        redner_peer.scene_arrays(Scene(teapot.camera, teapot.meshes))


@pytest.fixture(scope="module")
def redner_python():
    python, note = redner_peer.find_python()
    if python is None:
        pytest.skip(note)
    return python


def test_driver_renders_a_tiny_image_and_gradient(tmp_path, redner_python):
    npz = redner_peer.export_scene(scenes.cornell_box(resolution=(16, 16)), tmp_path / "cb.npz")
    out = subprocess.run([redner_python, str(redner_peer.DRIVER), str(npz), "--spp", "1",
                          "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reply = json.loads(out.stdout)
    image, grad = redner_peer.report_arrays(reply)
    assert image.shape == (16, 16, 3) and grad.shape == (8, 3)
    assert np.isfinite(image).all() and np.isfinite(grad).all()
    assert image.mean() > 0.01  # the light reaches the walls
    assert np.abs(grad).max() > 0.0
    assert all(t > 0 for key in ("forward", "fwd_bwd") for t in reply[key])


def test_driver_serves_requests(tmp_path, redner_python):
    npz = redner_peer.export_scene(scenes.cornell_box(resolution=(16, 16)), tmp_path / "cb.npz")
    with redner_peer.RednerProcess(redner_python, npz, threads=1, spp=1) as proc:
        assert proc.request("forward", seed=3)["seconds"] > 0
        image, grad = redner_peer.report_arrays(proc.request("result", seed=3, edges="primary"))
        assert np.isfinite(image).all() and np.isfinite(grad).all()
        with pytest.raises(RuntimeError, match="unknown op"):
            proc.request("nonsense")
