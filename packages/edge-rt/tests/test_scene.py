"""Scene model, loading, built-in scenes, image output and the torch interface; bad input
fails with a SceneError naming the problem (never inside a kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

import edge_rt
from edge_rt import Camera, Material, Mesh, Scene, SceneError, Texture, look_at, scenes


@pytest.mark.parametrize("build", [scenes.cornell_box, scenes.textured_sphere,
                                   scenes.closed_cube, scenes.teapot_scene, scenes.ring_scene,
                                   scenes.torus_glass_cube, scenes.glossy_cornell])
def test_builtin_scenes_render(build):
    scene = build(resolution=(16, 16))
    image = edge_rt.render_image(scene, spp=4, progress=False)
    assert image.shape == (16, 16, 3) and image.dtype == torch.float32
    assert torch.isfinite(image).all() and image.mean() > 0.01


def test_torus_mesh_is_closed_and_outward():
    """A watertight torus of the right volume (2 pi^2 R a b for the elliptic tube, within the
    tessellation's loss), winding and vertex normals pointing outward."""
    mesh = scenes.torus_mesh((0.5, 0.0, 0.0), 1.0, 0.2, height=0.6, rings=64, sides=32)
    v, f = mesh.vertices.numpy(), mesh.faces.numpy()
    tm = trimesh.Trimesh(v, f, process=True)  # merges the duplicated seam vertices
    assert tm.is_watertight
    assert tm.volume == pytest.approx(2 * np.pi ** 2 * 1.0 * 0.2 * 0.3, rel=1e-2)
    fn = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    assert ((fn * mesh.normals.numpy()[f].mean(1)).sum(1) > 0).all()
    with pytest.raises(SceneError, match="minor_radius < major_radius"):
        scenes.torus_mesh(major_radius=0.5, minor_radius=0.6)


def test_render_is_deterministic_per_seed():
    scene = scenes.cornell_box(resolution=(16, 16))
    a = edge_rt.render_image(scene, spp=2, seed=3, progress=False)
    b = edge_rt.render_image(scene, spp=2, seed=3, progress=False)
    c = edge_rt.render_image(scene, spp=2, seed=4, progress=False)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_cornell_box_converges_with_spp():
    """Monte Carlo error falls like 1/sqrt(spp) against a 1024-spp reference."""
    scene = scenes.cornell_box(resolution=(16, 16))
    ref = edge_rt.render_image(scene, spp=1024, seed=99, progress=False)
    err = [float((edge_rt.render_image(scene, spp=n, seed=1, progress=False) - ref)
                 .pow(2).mean().sqrt()) for n in (4, 64)]
    assert err[1] < err[0] / 2.5


def test_torch_interface_reaches_every_requested_tensor():
    scene = scenes.textured_sphere(resolution=(12, 12))
    params = {
        "vertices": scene.meshes[0].vertices,
        "texels": scene.meshes[0].material.diffuse.values,
        "light": scene.meshes[2].emission,
        "envmap": scene.envmap.radiance.values,
        "camera": scene.camera.cam_to_world,
    }
    for t in params.values():
        t.requires_grad_(True)
    image = edge_rt.render(scene, spp=4, progress=False)
    assert image.requires_grad
    (image ** 2).mean().backward()
    for name, t in params.items():
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name


def test_png_and_exr_output(tmp_path):
    image = edge_rt.render_image(scenes.closed_cube(resolution=(8, 6)), spp=1, progress=False)
    edge_rt.write_png(tmp_path / "a.png", image)
    edge_rt.write_exr(tmp_path / "a.exr", image)
    from PIL import Image
    assert Image.open(tmp_path / "a.png").size == (8, 6)
    np.testing.assert_array_equal(edge_rt.read_exr(tmp_path / "a.exr"), image.numpy())
    depth = edge_rt.render_image(scenes.closed_cube(resolution=(8, 6)), spp=1, output="depth",
                                 progress=False)
    edge_rt.write_exr(tmp_path / "d.exr", depth)
    np.testing.assert_array_equal(edge_rt.read_exr(tmp_path / "d.exr"), depth.numpy())


def test_scene_from_dict_and_mesh_files(tmp_path):
    box = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
    box.export(tmp_path / "box.obj")
    box.export(tmp_path / "box.ply")
    for name in ("box.obj", "box.ply"):
        scene = edge_rt.from_dict({
            "camera": {"position": (2.0, 1.5, 2.5), "target": (0, 0, 0), "fov": 40.0,
                       "resolution": (8, 8)},
            "meshes": [{"file": str(tmp_path / name), "material": {"diffuse": (0.5, 0.5, 0.5)}}],
            "envmap": (1.0, 1.0, 1.0),
        })
        assert scene.meshes[0].faces.shape == (12, 3)
        assert edge_rt.render_image(scene, spp=1, progress=False).mean() > 0.05


TRI = np.array([[0.0, 0.0, 2.0], [1.0, 0.0, 2.0], [0.0, 1.0, 2.0]])


def _moving_scene(tmp_path, velocity, file=False):
    mesh = {"material": {"diffuse": (0.5, 0.5, 0.5)}, "velocity": velocity}
    if file:
        trimesh.creation.box(extents=(1.0, 1.0, 1.0)).export(tmp_path / "box.obj")
        mesh["file"] = str(tmp_path / "box.obj")
    else:
        mesh.update(vertices=TRI.tolist(), faces=[[0, 1, 2]])
    return edge_rt.from_dict({"camera": {"position": (0, 0, 0), "target": (0, 0, 1),
                                         "resolution": (8, 8)}, "meshes": [mesh]})


@pytest.mark.parametrize("file", [False, True])
def test_from_dict_mesh_velocity(tmp_path, file):
    scene = _moving_scene(tmp_path, [0.1, -0.2, 0.0], file)
    assert scene.meshes[0].velocity.tolist() == [0.1, -0.2, 0.0]
    assert scene.moving_meshes == [scene.meshes[0]]
    assert _moving_scene(tmp_path, None, file).moving_meshes == []


@pytest.mark.parametrize("file", [False, True])
@pytest.mark.parametrize("velocity, message", [
    ([0.1, 0.2], r"velocity must be a translation \(3,\).*got shape \(2,\)"),
    ([[0.1, 0.2, 0.3]], r"velocity must be a translation \(3,\)"),
    ([0.1, float("nan"), 0.0], "velocity: contains NaN or infinity"),
    ([0.1, float("inf"), 0.0], "velocity: contains NaN or infinity"),
    ("fast", "mesh 0: velocity: must be numbers"),
    ([0.1, [0.2], 0.3], "mesh 0: velocity: must be numbers"),
])
def test_from_dict_bad_velocity_names_the_problem(tmp_path, file, velocity, message):
    with pytest.raises(SceneError, match=message):
        _moving_scene(tmp_path, velocity, file)


def test_from_dict_moving_light_refused(tmp_path):
    tri = {"vertices": TRI.tolist(), "faces": [[0, 1, 2]], "emission": [1, 1, 1],
           "velocity": [0, 0.1, 0]}
    with pytest.raises(SceneError, match="moving lights are not supported"):
        edge_rt.from_dict({"camera": {"position": (0, 0, 0), "target": (0, 0, 1)},
                           "meshes": [tri]})




def cam():
    return Camera(look_at((0, 0, 0), (0, 0, 1)), resolution=(8, 8))


@pytest.mark.parametrize("make, message", [
    (lambda: Mesh(np.array([[0, 0, np.nan], [1, 0, 2], [0, 1, 2]]), [[0, 1, 2]]), "NaN"),
    (lambda: Mesh(TRI, [[0, 1, 3]]), "out of range"),
    (lambda: Mesh(TRI, np.zeros((0, 3), dtype=int)), "no faces"),
    (lambda: Mesh(TRI[:, :2], [[0, 1, 2]]), "vertices must be"),
    (lambda: Scene(cam(), []), "empty scene"),
    (lambda: Scene(cam(), [Mesh(np.zeros((3, 3)), [[0, 1, 2]])]), "degenerate"),
    (lambda: Camera(np.eye(3)), "4x4"),
    (lambda: Camera(np.eye(4), fov=180.0), "fov"),
    (lambda: Material(diffuse=(0.5, 0.5)), "channels"),
    (lambda: edge_rt.from_dict({"meshes": []}), "camera"),
])
def test_bad_input_names_the_problem(make, message):
    with pytest.raises(SceneError, match=message):
        make()


def test_unreadable_mesh_file(tmp_path):
    bad = tmp_path / "bad.obj"
    bad.write_text("this is not an obj file\n")
    with pytest.raises(SceneError, match="bad.obj"):
        edge_rt.load_mesh(bad)


def test_nan_parameter_after_an_optimiser_step():
    scene = scenes.closed_cube(resolution=(8, 8))
    scene.meshes[0].vertices = scene.meshes[0].vertices.clone()
    scene.meshes[0].vertices[0, 0] = float("nan")
    with pytest.raises(SceneError, match="vertices contains NaN"):
        edge_rt.render_image(scene, spp=1, progress=False)


def test_degenerate_triangles_are_ignored():
    """Documented behaviour: zero-area faces are left out of ray casting, lights and edges."""
    v = np.vstack([TRI, [[0.2, 0.2, 2.0]]])
    with_degenerate = Mesh(v, [[0, 1, 2], [0, 3, 3]])
    assert list(with_degenerate.degenerate_faces) == [1]
    plain = Mesh(TRI, [[0, 1, 2]])
    env = edge_rt.EnvironmentMap(torch.tensor([1.0, 1.0, 1.0]))
    a = edge_rt.render_image(Scene(cam(), [with_degenerate], env), spp=1, progress=False)
    b = edge_rt.render_image(Scene(cam(), [plain], env), spp=1, progress=False)
    assert torch.equal(a, b)


def test_camera_inside_geometry_sees_the_inside():
    """Documented behaviour: a camera inside a closed mesh renders its inner faces (two-sided
    shading); there is no error and no NaN, and edge gradients stay finite."""
    cube = scenes.cube_mesh((0.0, 0.0, 0.0), 4.0, Material(diffuse=(0.5, 0.5, 0.5)))
    light = scenes.quad((-0.5, 1.9, -0.5), (1, 0, 0), (0, 0, 1), emission=(5.0, 5.0, 5.0))
    scenes.orient_down(light)
    scene = Scene(Camera(look_at((0.0, 0.0, 0.0), (0.0, 0.0, 1.0)), resolution=(8, 8)),
                  [cube, light])
    cube.vertices.requires_grad_(True)
    image = edge_rt.render(scene, spp=4, progress=False)
    assert torch.isfinite(image).all() and image.mean() > 0
    image.sum().backward()
    assert torch.isfinite(cube.vertices.grad).all()


def test_mip_pyramid_is_reused_until_the_texels_change():
    texels = torch.rand(8, 8, 3, requires_grad=True)
    tex = Texture(texels)
    uv = torch.rand(5, 2)
    with torch.no_grad():
        first = tex.pyramid()
        assert tex.pyramid() is first  # forward renders build it once
        texels.mul_(0.5)  # an optimiser's in-place step
        second = tex.pyramid()
    assert second is not first and torch.allclose(second[1], 0.5 * first[1])
    # under autograd the levels are rebuilt per call and carry gradients to the texels
    tracked = tex.lookup(uv, level=torch.full((5,), 1.5))
    tracked.sum().backward()
    assert texels.grad is not None and texels.grad.abs().sum() > 0
    again = tex.lookup(uv, level=torch.full((5,), 1.5))
    again.sum().backward()  # a second backward works: no freed graph was cached
