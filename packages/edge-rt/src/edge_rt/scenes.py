"""Built-in generated scenes (no downloads) and scene loading from dicts and mesh files."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .scene import Camera, EnvironmentMap, Material, Mesh, Scene, SceneError, look_at
from .texture import Texture


def quad(corner, u, v, material=None, emission=None, name="quad", flip=False):
    c, u, v = (np.asarray(x, dtype=np.float64) for x in (corner, u, v))
    verts = np.stack([c, c + u, c + u + v, c + v])
    faces = np.array([[0, 1, 2], [0, 2, 3]])
    if flip:
        faces = faces[:, ::-1].copy()
    uvs = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    return Mesh(torch.tensor(verts), faces, material or Material(), uvs=torch.tensor(uvs),
                emission=None if emission is None else torch.tensor(emission, dtype=torch.float64),
                name=name)


def cube_mesh(center=(0.0, 0.0, 0.0), size=1.0, material=None, name="cube"):
    """A closed cube with outward winding, flat shaded (8 shared vertices, 12 faces)."""
    c = np.asarray(center, dtype=np.float64)
    s = size / 2.0
    verts = np.array([[x, y, z] for x in (-s, s) for y in (-s, s) for z in (-s, s)]) + c
    faces = np.array([
        [0, 1, 3], [0, 3, 2],  # -x
        [4, 6, 7], [4, 7, 5],  # +x
        [0, 4, 5], [0, 5, 1],  # -y
        [2, 3, 7], [2, 7, 6],  # +y
        [0, 2, 6], [0, 6, 4],  # -z
        [1, 5, 7], [1, 7, 3],  # +z
    ])
    return Mesh(torch.tensor(verts), faces, material or Material(), name=name)


def uv_sphere(center=(0.0, 0.0, 0.0), radius=1.0, rings=24, segments=48, material=None,
              name="sphere"):
    """A UV sphere with shading normals and UVs (seam vertices duplicated)."""
    theta = np.linspace(0.0, math.pi, rings + 1)
    phi = np.linspace(0.0, 2.0 * math.pi, segments + 1)
    th, ph = np.meshgrid(theta, phi, indexing="ij")
    n = np.stack([np.sin(th) * np.cos(ph), np.cos(th), -np.sin(th) * np.sin(ph)], -1)
    verts = (np.asarray(center) + radius * n).reshape(-1, 3)
    uvs = np.stack([ph / (2.0 * math.pi), 1.0 - th / math.pi], -1).reshape(-1, 2)
    faces = []
    for i in range(rings):
        for j in range(segments):
            a, b = i * (segments + 1) + j, (i + 1) * (segments + 1) + j
            if i > 0:
                faces.append([a, b, a + 1])
            if i < rings - 1:
                faces.append([a + 1, b, b + 1])
    return Mesh(torch.tensor(verts), np.array(faces), material or Material(),
                uvs=torch.tensor(uvs), normals=torch.tensor(n.reshape(-1, 3)), name=name)


def torus_mesh(center=(0.0, 0.0, 0.0), major_radius=1.0, minor_radius=0.25, height=None,
               rings=48, sides=24, material=None, name="torus", rotation=None):
    """A closed, smooth-shaded torus about the y axis: a tube of ``minor_radius`` swept along a
    circle of ``major_radius``. ``height`` (default ``2 * minor_radius``) stretches the tube's
    cross-section vertically into an ellipse (a ring band for ``height >> minor_radius``).
    ``rotation``: an optional 3x3 matrix applied about the centre. Outward winding, analytic
    vertex normals, UVs (u around the axis, v around the tube; seam vertices duplicated)."""
    a = float(minor_radius)
    b = a if height is None else float(height) / 2.0
    if not 0.0 < a < major_radius or b <= 0.0:
        raise SceneError(f"torus_mesh: need 0 < minor_radius < major_radius and height > 0, got "
                         f"{minor_radius}, {major_radius}, {height}")
    u = np.linspace(0.0, 2.0 * math.pi, rings + 1)
    v = np.linspace(0.0, 2.0 * math.pi, sides + 1)
    uu, vv = np.meshgrid(u, v, indexing="ij")
    radial = major_radius + a * np.cos(vv)
    verts = np.stack([radial * np.cos(uu), b * np.sin(vv), -radial * np.sin(uu)], -1)
    # the ellipse's normal (cos v / a, sin v / b) swept around the axis
    nr, ny = np.cos(vv) / a, np.sin(vv) / b
    normals = np.stack([nr * np.cos(uu), ny, -nr * np.sin(uu)], -1)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    uvs = np.stack([uu / (2.0 * math.pi), vv / (2.0 * math.pi)], -1).reshape(-1, 2)
    verts, normals = verts.reshape(-1, 3), normals.reshape(-1, 3)
    idx = np.arange((rings + 1) * (sides + 1)).reshape(rings + 1, sides + 1)
    a0, a1 = idx[:-1, :-1].ravel(), idx[1:, :-1].ravel()
    b0, b1 = idx[:-1, 1:].ravel(), idx[1:, 1:].ravel()
    faces = np.concatenate([np.stack([a0, b0, b1], 1), np.stack([a0, b1, a1], 1)])
    fn = np.cross(verts[faces[:, 1]] - verts[faces[:, 0]], verts[faces[:, 2]] - verts[faces[:, 0]])
    if (fn * normals[faces].mean(1)).sum() < 0:
        faces = faces[:, ::-1].copy()
    if rotation is not None:
        rot = np.asarray(rotation, dtype=np.float64)
        verts, normals = verts @ rot.T, normals @ rot.T
    return Mesh(torch.tensor(verts + np.asarray(center, dtype=np.float64)), faces,
                material or Material(), uvs=torch.tensor(uvs), normals=torch.tensor(normals),
                name=name)


def facing_quad(center, target, size, emission, name="light"):
    """A square area light of side ``size`` centred at ``center``, emitting toward ``target``
    (black: it reflects nothing)."""
    c = np.asarray(center, dtype=np.float64)
    d = np.asarray(target, dtype=np.float64) - c
    d /= np.linalg.norm(d)
    up = np.array([0.0, 1.0, 0.0]) if abs(d[1]) < 0.9 else np.array([1.0, 0.0, 0.0])
    e1 = np.cross(d, up)
    e1 *= size / np.linalg.norm(e1)
    e2 = np.cross(e1, d)
    e2 *= size / np.linalg.norm(e2)
    light = quad(c - 0.5 * (e1 + e2), e1, e2, Material(diffuse=(0.0, 0.0, 0.0)),
                 emission=emission, name=name)
    v, f = light.vertices.numpy(), light.faces.numpy()
    if np.dot(np.cross(v[f[0, 1]] - v[f[0, 0]], v[f[0, 2]] - v[f[0, 0]]), d) < 0:
        light.faces = light.faces.flip(1)
    return light


def _rotation_x(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


GOLD = (1.0, 0.78, 0.34)  # gold's normal-incidence reflectance (sRGB-ish), the Phong Ks


def ring_scene(resolution=(128, 128)):
    """Fig 6-2 analog (h2mc spec 7.4, AE-9): a highly glossy gold ring (a torus whose tube is
    a tall thin ellipse: a band of radius 1, height 0.5, wall 0.08; Blinn-Phong Ks = gold,
    roughness 0.004, exponent 498, no diffuse) standing on a diffuse floor, lit by a small
    (0.4 x 0.4) bright light 5 units away, 30 degrees above the floor: its inner wall focuses
    the light into a cardioid caustic on the floor inside the ring. The thesis uses a distant
    point light; edge_rt has area lights only (spec 2.5)."""
    ring = torus_mesh((0.0, 0.25, 0.0), 1.0, 0.04, height=0.5, rings=96, sides=16,
                      material=Material(diffuse=(0.0, 0.0, 0.0), specular=GOLD,
                                        roughness=(0.004,)), name="ring")
    floor = quad((-6, 0, -6), (0, 0, 12), (12, 0, 0), Material(diffuse=(0.7, 0.7, 0.7)),
                 name="floor")
    angle = math.radians(30.0)
    light = facing_quad((-5.0 * math.cos(angle), 5.0 * math.sin(angle), 0.0), (0.0, 0.0, 0.0),
                        0.4, (300.0, 300.0, 300.0))
    cam = Camera(look_at((0.0, 3.2, 2.6), (0.15, 0.0, 0.0)), fov=45.0, resolution=resolution)
    return Scene(cam, [ring, floor, light])


def torus_glass_cube(resolution=(128, 128)):
    """Fig 6-7 analog (h2mc spec 7.4, AE-10): a diffuse torus (radii 0.45 / 0.15, tilted 60
    degrees) inside a glossy glass cube (side 1.6, rough dielectric eta 1.5, roughness
    0.0064: GGX alpha 0.08) resting just above a diffuse floor, lit by a small (0.5 x 0.5)
    area light above and to the side. Every path to the torus crosses the glass twice
    (specular-diffuse-specular); the thesis uses a point light."""
    torus = torus_mesh((0.0, 0.81, 0.0), 0.45, 0.15, rings=48, sides=24,
                       material=Material(diffuse=(0.75, 0.35, 0.15)), name="torus",
                       rotation=_rotation_x(math.radians(60.0)))
    glass = cube_mesh((0.0, 0.81, 0.0), 1.6, Material(roughness=(0.0064,), eta=1.5),
                      name="glass_cube")
    floor = quad((-6, 0, -6), (0, 0, 12), (12, 0, 0), Material(diffuse=(0.6, 0.6, 0.6)),
                 name="floor")
    light = facing_quad((2.0, 4.0, 1.5), (0.0, 0.8, 0.0), 0.5, (120.0, 120.0, 120.0))
    cam = Camera(look_at((0.0, 2.4, 4.6), (0.0, 0.7, 0.0)), fov=40.0, resolution=resolution)
    return Scene(cam, [torus, glass, floor, light])


def moving_caustics(resolution=(64, 64), velocity=(0.8, 0.0, 0.0)):
    """AE-11 analog (h2mc spec 10, the thesis' Balls/Cars): a near-specular glass ball (radius
    0.5, rough dielectric eta 1.5, roughness 0.0025: GGX alpha 0.05) translating by
    ``velocity`` over the shutter (centre from (-0.4, 0.65, 0) to (0.4, 0.65, 0) by default)
    above a diffuse floor, lit by a small (0.3 x 0.3) bright light 3.5 units above: the ball
    focuses it into a caustic on the floor that sweeps with the ball (motion-blurred). The
    thesis uses a point light; edge_rt has area lights only."""
    v = np.asarray(velocity, dtype=np.float64)
    ball = dataclasses.replace(
        uv_sphere((-0.5 * v[0], 0.65 - 0.5 * v[1], -0.5 * v[2]), 0.5, rings=24, segments=48,
                  material=Material(roughness=(0.0025,), eta=1.5), name="glass_ball"),
        velocity=v)
    floor = quad((-6, 0, -6), (0, 0, 12), (12, 0, 0), Material(diffuse=(0.7, 0.7, 0.7)),
                 name="floor")
    light = facing_quad((0.6, 4.0, 0.3), (0.0, 0.0, 0.0), 0.3, (400.0, 400.0, 400.0))
    cam = Camera(look_at((0.0, 2.6, 3.0), (0.0, 0.35, 0.0)), fov=40.0, resolution=resolution)
    return Scene(cam, [ball, floor, light])


def glossy_cornell(resolution=(64, 64)):
    """AE-8's scene: the Cornell box (``cornell_box``) with glossy Blinn-Phong materials: a
    near-mirror tall box (Ks 0.7, roughness 0.01, exponent 198), a glossy floor (Kd 0.5, Ks
    0.2, roughness 0.05) and a diffuse short box and walls, lit by the ceiling light."""
    scene = cornell_box(resolution)
    for m in scene.meshes:
        if m.name == "tall_box":
            m.material = Material(diffuse=(0.1, 0.1, 0.1), specular=(0.7, 0.7, 0.7),
                                  roughness=(0.01,))
        elif m.name == "floor":
            m.material = Material(diffuse=(0.5, 0.5, 0.5), specular=(0.2, 0.2, 0.2),
                                  roughness=(0.05,))
    return scene


def checker(res=64, tiles=8, a=(0.8, 0.2, 0.1), b=(0.1, 0.3, 0.8)):
    yy, xx = np.mgrid[0:res, 0:res]
    mask = ((xx * tiles // res) + (yy * tiles // res)) % 2 == 0
    img = np.where(mask[..., None], np.asarray(a), np.asarray(b))
    return torch.tensor(img)


def cornell_box(resolution=(64, 64), fov=40.0):
    """The Cornell box: white floor/ceiling/back, red left, green right wall, a square
    ceiling light, two boxes (one rotated); camera looking in through the open front."""
    white, red, green = (Material(diffuse=c) for c in ((0.73, 0.73, 0.73), (0.65, 0.05, 0.05),
                                                       (0.12, 0.45, 0.15)))
    m = [
        quad((-1, -1, -1), (2, 0, 0), (0, 0, 2), white, name="floor"),
        quad((-1, 1, -1), (0, 0, 2), (2, 0, 0), white, name="ceiling"),
        quad((-1, -1, -1), (0, 2, 0), (2, 0, 0), white, name="back"),
        quad((-1, -1, -1), (0, 0, 2), (0, 2, 0), red, name="left"),
        quad((1, -1, -1), (0, 2, 0), (0, 0, 2), green, name="right"),
        quad((-0.25, 0.999, -0.25), (0.5, 0, 0), (0, 0, 0.5), emission=(17.0, 12.0, 4.0),
             name="light"),
    ]
    m.append(_box((0.35, -0.7, 0.3), (0.55, 0.6, 0.55), -0.3, white, "short_box"))
    m.append(_box((-0.35, -0.4, -0.3), (0.55, 1.2, 0.55), 0.3, white, "tall_box"))
    cam = Camera(look_at((0.0, 0.0, 3.9), (0.0, 0.0, 0.0)), fov=fov, resolution=resolution)
    scene = Scene(cam, m)
    _orient_inward(scene)
    return scene


def _box(center, size, angle, material, name):
    box = cube_mesh((0, 0, 0), 1.0, material, name)
    v = box.vertices.numpy() * np.asarray(size)
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    box.vertices = torch.tensor(v @ rot.T + np.asarray(center))
    return box


def _orient_inward(scene):
    # Quads are built with the normal toward the box interior (the light faces down).
    for m in scene.meshes:
        if m.name in ("floor", "ceiling", "back", "left", "right", "light"):
            v = m.vertices.numpy()
            f = m.faces.numpy()
            n = np.cross(v[f[0, 1]] - v[f[0, 0]], v[f[0, 2]] - v[f[0, 0]])
            if np.dot(n, -v[f[0]].mean(0)) < 0:
                m.faces = m.faces.flip(1)


def textured_sphere(resolution=(64, 64), texture_res=64):
    """A checker-textured glossy sphere on a floor, lit by a quad light and an envmap."""
    mat = Material(diffuse=Texture(checker(texture_res)), specular=(0.04, 0.04, 0.04),
                   roughness=(0.2,))
    sphere = uv_sphere((0.0, 0.0, 0.0), 1.0, material=mat)
    floor = quad((-4, -1, -4), (0, 0, 8), (8, 0, 0), Material(diffuse=(0.5, 0.5, 0.5)),
                 name="floor")
    light = quad((-1, 3, -1), (2, 0, 0), (0, 0, 2), emission=(6.0, 6.0, 6.0), name="light")
    env = EnvironmentMap(torch.tensor(np.full((8, 16, 3), 0.2)))
    cam = Camera(look_at((0.0, 1.0, 4.0), (0.0, 0.0, 0.0)), fov=45.0, resolution=resolution)
    return Scene(cam, [sphere, floor, light], env)


def closed_cube(resolution=(32, 32), envmap=0.8):
    """A diffuse closed cube under a constant environment, seen at an angle."""
    cube = cube_mesh((0.0, 0.0, 0.0), 1.0, Material(diffuse=(0.7, 0.5, 0.3)))
    cam = Camera(look_at((2.0, 1.5, 2.5), (0.0, 0.0, 0.0)), fov=40.0, resolution=resolution)
    return Scene(cam, [cube], EnvironmentMap(torch.tensor([envmap] * 3)))


# (radius, height) from the bottom centre to the knob's top: body, shoulder, lid, knob.
TEAPOT_PROFILE = ((0.0, -0.8), (0.6, -0.8), (0.95, -0.65), (1.18, -0.3), (1.22, 0.05),
                  (1.1, 0.4), (0.85, 0.62), (0.7, 0.68), (0.66, 0.76), (0.45, 0.88),
                  (0.16, 0.94), (0.12, 1.02), (0.2, 1.1), (0.14, 1.17), (0.0, 1.19))


def revolve(profile, segments=32, material=None, name="revolved"):
    """A closed, smooth-shaded surface of revolution about the y axis: ``profile`` lists
    (radius, height) points from one pole (radius 0) to the other. Outward winding; vertex
    normals are the area-weighted face normals (no interpenetration, spec 2.3)."""
    prof = np.asarray(profile, dtype=np.float64)
    if prof[0, 0] != 0.0 or prof[-1, 0] != 0.0:
        raise SceneError("revolve: the profile must start and end on the axis (radius 0)")
    ring = prof[1:-1]
    phi = np.linspace(0.0, 2.0 * math.pi, segments, endpoint=False)
    rings = np.stack([ring[:, None, 0] * np.cos(phi), np.repeat(ring[:, None, 1], segments, 1),
                      -ring[:, None, 0] * np.sin(phi)], -1).reshape(-1, 3)
    verts = np.concatenate([[[0.0, prof[0, 1], 0.0]], rings, [[0.0, prof[-1, 1], 0.0]]])
    top = len(verts) - 1
    idx = 1 + np.arange(len(ring) * segments).reshape(len(ring), segments)
    nxt = np.roll(idx, -1, axis=1)
    faces = [np.stack([np.zeros(segments, int), nxt[0], idx[0]], 1)]
    for k in range(len(ring) - 1):
        a, b, c, d = idx[k], nxt[k], nxt[k + 1], idx[k + 1]
        faces += [np.stack([a, b, c], 1), np.stack([a, c, d], 1)]
    faces.append(np.stack([idx[-1], nxt[-1], np.full(segments, top)], 1))
    faces = np.concatenate(faces)
    fn = np.cross(verts[faces[:, 1]] - verts[faces[:, 0]], verts[faces[:, 2]] - verts[faces[:, 0]])
    normals = np.zeros_like(verts)
    for k in range(3):
        np.add.at(normals, faces[:, k], fn)
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    return Mesh(torch.tensor(verts), faces, material or Material(), normals=torch.tensor(normals),
                name=name)


def teapot_like(segments=32):
    """A teapot-like closed mesh: body, lid and knob as one smooth surface of revolution
    (spout and handle left out: attached as separate parts they would interpenetrate the
    body, whose intersection curves are discontinuities that no edge sampler sees)."""
    return revolve(TEAPOT_PROFILE, segments,
                   Material(diffuse=(0.6, 0.5, 0.4), specular=(0.2, 0.2, 0.2), roughness=(0.1,)),
                   name="teapot")


def teapot_scene(resolution=(32, 32)):
    cam = Camera(look_at((0.0, 1.5, 4.5), (0.0, 0.0, 0.0)), fov=45.0, resolution=resolution)
    light = quad((-1, 3, -1), (2, 0, 0), (0, 0, 2), emission=(5.0, 5.0, 5.0), name="light")
    orient_down(light)
    return Scene(cam, [teapot_like(), light], EnvironmentMap(torch.tensor([0.3, 0.3, 0.3])))


def orient_down(light):
    """Flip ``light``'s faces (in place) so that it emits downwards (-y): area lights emit
    on the side their winding's normal points to."""
    v, f = light.vertices.detach().numpy(), light.faces.numpy()
    n = np.cross(v[f[0, 1]] - v[f[0, 0]], v[f[0, 2]] - v[f[0, 0]])
    if n[1] > 0:
        light.faces = light.faces.flip(1)


def load_mesh(path, material=None, name=None):
    """A Mesh from an OBJ / PLY (anything trimesh reads); UVs and vertex normals when the
    file has them."""
    import trimesh

    try:
        tm = trimesh.load(path, force="mesh", process=False)
    except Exception as e:  # trimesh raises many types for unreadable files
        raise SceneError(f"load_mesh: cannot read {path}: {e}") from e
    if len(tm.faces) == 0:
        raise SceneError(f"load_mesh: {path}: mesh has no faces")
    uvs = getattr(tm.visual, "uv", None)
    normals = None
    if "vertex_normals" in tm._cache.cache or getattr(tm, "_vertex_normals", None) is not None:
        normals = torch.tensor(np.asarray(tm.vertex_normals, dtype=np.float64))
    return Mesh(torch.tensor(np.asarray(tm.vertices, dtype=np.float64)),
                np.asarray(tm.faces, dtype=np.int64), material or Material(),
                uvs=None if uvs is None else torch.tensor(np.asarray(uvs, dtype=np.float64)),
                normals=normals, name=name or str(path))


def _numbers(x, name):
    """``x`` as a float64 array, or a SceneError naming ``name`` (ragged lists, strings)."""
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise SceneError(f"{name}: must be numbers, got {x!r}") from None


def from_dict(d):
    """Build a Scene from a plain dict::

        {"camera": {"position": ..., "target": ..., "up": ..., "fov": ..., "resolution": ...,
                    "clip_near": ..., "kind": ...} or {"cam_to_world": 4x4, ...},
         "meshes": [{"vertices": ..., "faces": ..., "uvs": ..., "normals": ...,
                     "material": {"diffuse": ..., "specular": ..., "roughness": ...},
                     "emission": ..., "velocity": (3,), "file": "path.obj", "name": ...},
                    ...],
         "envmap": radiance (H, W, 3) or (3,)}

    ``velocity``: the mesh's translation over the shutter (Mesh.velocity), on inline and file
    meshes alike.
    """
    if "camera" not in d:
        raise SceneError("from_dict: missing 'camera'")
    c = dict(d["camera"])
    if "cam_to_world" not in c:
        c["cam_to_world"] = look_at(c.pop("position"), c.pop("target"),
                                    c.pop("up", (0.0, 1.0, 0.0)))
    cam = Camera(**c)
    meshes = []
    for k, md in enumerate(d.get("meshes", [])):
        md = dict(md)
        mat = Material(**md.pop("material", {}))
        if md.get("velocity") is not None:
            md["velocity"] = _numbers(md["velocity"], f"from_dict: mesh {k}: velocity")
        if "file" in md:
            mesh = load_mesh(md.pop("file"), mat, md.pop("name", None))
            # replace re-runs Mesh's checks (shape, finite, no moving light) on the extras
            mesh = dataclasses.replace(mesh, emission=md.pop("emission", None),
                                       velocity=md.pop("velocity", None))
        else:
            md.setdefault("name", f"mesh{k}")
            mesh = Mesh(material=mat, **md)
        meshes.append(mesh)
    env = EnvironmentMap(d["envmap"]) if d.get("envmap") is not None else None
    return Scene(cam, meshes, env)
