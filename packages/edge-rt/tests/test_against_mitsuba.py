"""Agreement with an independent renderer: edge_rt's scenes rebuilt in Mitsuba 3 (variant
llvm_ad_rgb: ``pip install mitsuba`` plus ``apt-get install libllvm19`` on this image) and
rendered at the same settings (box pixel filter, two-sided diffuse, same depth). Metric: the
images' 8 x 8 block means; each block must agree within 4 combined standard errors (estimated
from independent seeds of both renderers, floored at float32 rounding) and the mean relative
block difference is below 2%. Skipped where Mitsuba or its LLVM backend is absent."""

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
        d[f"m{k}"] = _mitsuba_shape(mesh, folder / f"m{k}")
    if scene.envmap is not None:
        radiance = scene.envmap.radiance
        assert radiance.is_constant or bool((radiance.values == radiance.values[0, 0]).all())
        value = radiance.values.reshape(-1, 3)[0].detach().double().numpy().tolist()
        d["sky"] = {"type": "constant", "radiance": {"type": "rgb", "value": value}}
    return d


def _mitsuba_shape(mesh, stem):
    """One mesh as an OBJ file (positions, UVs and shading normals kept per vertex) with a
    two-sided diffuse BSDF (constant or bitmap albedo) and an optional area emitter."""
    v = mesh.vertices.detach().double().numpy()
    visual = None
    if mesh.uvs is not None:
        visual = trimesh.visual.TextureVisuals(uv=mesh.uvs.detach().double().numpy())
    normals = None if mesh.normals is None else mesh.normals.detach().double().numpy()
    tm = trimesh.Trimesh(v, mesh.faces.numpy(), vertex_normals=normals, visual=visual,
                         process=False)
    path = stem.with_suffix(".obj")
    path.write_text(trimesh.exchange.obj.export_obj(tm, include_normals=normals is not None,
                                                    include_texture=visual is not None))
    albedo = mesh.material.diffuse
    if albedo.is_constant:
        reflectance = {"type": "rgb", "value": albedo.values.detach().double().numpy().tolist()}
    else:
        texels = albedo.values.detach().float().numpy()
        reflectance = {"type": "bitmap", "filter_type": "bilinear", "raw": True,
                       "bitmap": __import__("mitsuba").Bitmap(texels)}
    shape = {"type": "obj", "filename": str(path), "face_normals": normals is None,
             "bsdf": {"type": "twosided", "bsdf": {"type": "diffuse",
                                                   "reflectance": reflectance}}}
    if mesh.emission is not None:
        shape["emitter"] = {"type": "area", "radiance": {
            "type": "rgb", "value": mesh.emission.detach().double().numpy().tolist()}}
    return shape


def block_stats(images):
    b = np.stack([im.reshape(SIZE // BLOCK, BLOCK, SIZE // BLOCK, BLOCK, 3).mean((1, 3))
                  for im in images])
    return b.mean(0), b.std(0, ddof=1) / np.sqrt(len(images))


def agree(mi, scene, folder, max_depth=2):
    ours = [edge_rt.render_image(scene, spp=SPP, seed=s, max_depth=max_depth,
                                 dtype=torch.float64, progress=False).numpy()
            for s in range(SEEDS)]
    mscene = mi.load_dict(to_mitsuba(mi, scene, max_depth=max_depth, folder=folder))
    theirs = [np.asarray(mi.render(mscene, spp=SPP, seed=s)) for s in range(SEEDS)]
    (a, sa), (b, sb) = block_stats(ours), block_stats(theirs)
    # Blocks of pure sky have no Monte Carlo noise: float32 rounding (1e-3) is their floor.
    z = np.abs(a - b) / (np.sqrt(sa ** 2 + sb ** 2) + 1e-3 * np.abs(b))
    rel = np.abs(a - b).sum() / np.abs(b).sum()
    assert rel < 0.02, rel
    assert z.max() < 4.0, (z.max(), rel)


def test_cornell_box_agrees_with_mitsuba(mi, tmp_path):
    agree(mi, scenes.cornell_box(resolution=(SIZE, SIZE)), tmp_path)


def test_textured_sphere_agrees_with_mitsuba(mi, tmp_path):
    """The textured sphere (smooth normals, UVs, checker albedo, floor, quad light, sky) with
    a diffuse material (Mitsuba has no Blinn-Phong lobe to compare the specular with)."""
    scene = scenes.textured_sphere(resolution=(SIZE, SIZE))
    sphere = scene.meshes[0]
    sphere.material = edge_rt.Material(diffuse=sphere.material.diffuse)
    agree(mi, scene, tmp_path)
