"""Agreement with an independent renderer: edge_rt's scenes rebuilt in Mitsuba 3 (variant
llvm_ad_rgb: ``pip install mitsuba`` plus ``apt-get install libllvm19`` on this image) and
rendered at the same settings (box pixel filter, two-sided diffuse, same depth). Metric: the
images' 8 x 8 block means; each block must agree within 4 combined standard errors (estimated
from independent seeds of both renderers) and the mean relative block difference is below 2%.
Skipped where Mitsuba or its LLVM backend is absent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

import edge_rt
from edge_rt import scenes

SIZE, SPP, SEEDS, BLOCK = 32, 256, 4, 8


@pytest.fixture(scope="module")
def mi():
    mitsuba = pytest.importorskip("mitsuba")
    try:
        mitsuba.set_variant("llvm_ad_rgb")
    except Exception as e:  # the LLVM backend needs libLLVM >= 16
        pytest.skip(f"Mitsuba's llvm_ad_rgb variant is unavailable: {e}")
    return mitsuba


def to_mitsuba(mi, scene, max_depth, folder):
    """The same scene as a Mitsuba dict: meshes (PLY files in ``folder``) with their winding, two-sided diffuse BSDFs
    with constant albedo, area emitters, a perspective camera with a box filter."""
    m = scene.camera.cam_to_world.detach().double().numpy()
    origin, forward, up = m[:3, 3], m[:3, 2], m[:3, 1]
    # Mitsuba's camera x axis points left of ours: mirror the image with a negative x scale.
    to_world = mi.ScalarTransform4f().look_at(origin=origin.tolist(),
                                             target=(origin + forward).tolist(),
                                             up=up.tolist())
    d = {"type": "scene",
         "integrator": {"type": "path", "max_depth": max_depth + 1, "hide_emitters": False},
         "sensor": {"type": "perspective", "fov": float(scene.camera.fov), "fov_axis": "x",
                    "to_world": to_world,
                    "film": {"type": "hdrfilm", "width": SIZE, "height": SIZE,
                             "rfilter": {"type": "box"}, "pixel_format": "rgb"}}}
    for k, mesh in enumerate(scene.meshes):
        path = folder / f"m{k}.ply"
        trimesh.Trimesh(mesh.vertices.detach().double().numpy(), mesh.faces.numpy(),
                        process=False).export(path)
        albedo = mesh.material.diffuse.values.detach().double().numpy().tolist()
        shape = {"type": "ply", "filename": str(path), "face_normals": True,
                 "bsdf": {"type": "twosided", "bsdf": {
                     "type": "diffuse", "reflectance": {"type": "rgb", "value": albedo}}}}
        if mesh.emission is not None:
            shape["emitter"] = {"type": "area", "radiance": {
                "type": "rgb", "value": mesh.emission.detach().double().numpy().tolist()}}
        d[f"m{k}"] = shape
    return d


def block_stats(images):
    b = np.stack([im.reshape(SIZE // BLOCK, BLOCK, SIZE // BLOCK, BLOCK, 3).mean((1, 3))
                  for im in images])
    return b.mean(0), b.std(0, ddof=1) / np.sqrt(len(images))


def test_cornell_box_agrees_with_mitsuba(mi, tmp_path):
    scene = scenes.cornell_box(resolution=(SIZE, SIZE))
    ours = [edge_rt.render_image(scene, spp=SPP, seed=s, max_depth=2, dtype=torch.float64,
                                 progress=False).numpy() for s in range(SEEDS)]
    mscene = mi.load_dict(to_mitsuba(mi, scene, max_depth=2, folder=tmp_path))
    theirs = [np.asarray(mi.render(mscene, spp=SPP, seed=s)) for s in range(SEEDS)]
    (a, sa), (b, sb) = block_stats(ours), block_stats(theirs)
    z = np.abs(a - b) / np.sqrt(sa ** 2 + sb ** 2 + 1e-12)
    rel = np.abs(a - b).sum() / np.abs(b).sum()
    assert rel < 0.02, rel
    assert z.max() < 4.0, (z.max(), rel)
