"""Scene model (spec section 2): cameras, triangle meshes, materials, area lights, envmaps.

Every float field may be a ``torch.Tensor`` with ``requires_grad``; ``Scene.tensors()`` lists
them and ``Scene.with_tensors`` rebuilds the scene around replacements (the renderer's
autograd Function uses it). Validation happens in the constructors so that bad input fails
with a message naming the problem, never inside a kernel.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .texture import Texture


class SceneError(ValueError):
    """Invalid scene input (the message names the object and the problem)."""


def _tensor(x, name, dtype=torch.float64):
    t = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x, dtype=np.float64))
    if t.is_floating_point() and not torch.isfinite(t.detach()).all():
        raise SceneError(f"{name}: contains NaN or infinity")
    return t if t.is_floating_point() else t.to(dtype)


def _texture(x, name):
    if isinstance(x, Texture):
        return x
    try:
        return Texture(_tensor(x, name))
    except ValueError as e:
        raise SceneError(f"{name}: {e}") from None


def look_at(origin, target, up=(0.0, 1.0, 0.0)):
    """cam_to_world 4x4 (columns right, up, forward, position), differentiable in torch."""
    origin, target = _tensor(origin, "look_at origin"), _tensor(target, "look_at target")
    up = _tensor(up, "look_at up").to(origin.dtype)
    forward = target - origin
    forward = forward / forward.norm()
    right = torch.linalg.cross(forward, up)
    if right.norm() < 1e-9:
        raise SceneError("look_at: up is parallel to the viewing direction")
    right = right / right.norm()
    new_up = torch.linalg.cross(right, forward)
    top = torch.stack([right, new_up, forward, origin], 1)
    bottom = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=origin.dtype)
    return torch.cat([top, bottom], 0)


@dataclasses.dataclass
class Camera:
    """Camera looking along +z of its local frame (x right, y up).

    ``cam_to_world``: 4x4 pose; ``fov``: horizontal field of view in degrees (pinhole);
    ``resolution``: (width, height) in pixels; ``clip_near``: near plane distance (geometry
    closer than it is not seen, and primary edges are clipped there). ``kind``: "pinhole" or
    "fisheye" (equiangular, 180 degrees across the image's inscribed circle).

    Depth of field (pinhole kind only): ``aperture_radius`` > 0 makes it a thin lens of that
    radius (world units) in the camera's xy plane, focused at ``focus_distance`` along its
    axis; each camera sample picks a lens point (uniform on the disk), and its ray passes
    through the point its pixel sees on the plane in focus. Both can be optimised."""

    cam_to_world: torch.Tensor
    fov: torch.Tensor | float = 45.0
    resolution: tuple = (64, 64)
    clip_near: float = 1e-2
    kind: str = "pinhole"
    aperture_radius: torch.Tensor | float = 0.0
    focus_distance: torch.Tensor | float = 1.0

    def __post_init__(self):
        self.cam_to_world = _tensor(self.cam_to_world, "Camera.cam_to_world")
        if tuple(self.cam_to_world.shape) != (4, 4):
            raise SceneError(f"Camera.cam_to_world: expected 4x4, got "
                             f"{tuple(self.cam_to_world.shape)}")
        self.fov = _tensor(self.fov, "Camera.fov")
        if not 0.0 < float(self.fov) < 180.0:
            raise SceneError(f"Camera.fov: must be in (0, 180) degrees, got {float(self.fov)}")
        w, h = self.resolution
        if int(w) <= 0 or int(h) <= 0:
            raise SceneError(f"Camera.resolution: must be positive, got {self.resolution}")
        self.resolution = (int(w), int(h))
        if not self.clip_near > 0:
            raise SceneError(f"Camera.clip_near: must be > 0, got {self.clip_near}")
        if self.kind not in ("pinhole", "fisheye"):
            raise SceneError(f"Camera.kind: 'pinhole' or 'fisheye', got {self.kind!r}")
        self.aperture_radius = _tensor(self.aperture_radius, "Camera.aperture_radius")
        self.focus_distance = _tensor(self.focus_distance, "Camera.focus_distance")
        check_lens(self)

    @property
    def thin_lens(self) -> bool:
        """Whether rays leave from a lens disk (``aperture_radius`` > 0), not one point."""
        return float(self.aperture_radius.detach().reshape(())) > 0.0

    def lens_points(self, u, dtype):
        """Camera-space (x, y) points (N, 2) on the lens for uniforms ``u`` (N, 2): Shirley's
        concentric map of the square to the disk (area preserving, so uniform on the disk),
        scaled by the aperture radius (differentiably)."""
        a = 2.0 * u.to(dtype) - 1.0
        ax, ay = a[:, 0], a[:, 1]
        outer = ax.abs() > ay.abs()
        safe_x = torch.where(ax != 0, ax, torch.ones_like(ax))
        safe_y = torch.where(ay != 0, ay, torch.ones_like(ay))
        r = torch.where(outer, ax, ay)
        phi = torch.where(outer, (math.pi / 4.0) * ay / safe_x,
                          math.pi / 2.0 - (math.pi / 4.0) * ax / safe_y)
        r = torch.where((ax == 0) & (ay == 0), torch.zeros_like(r), r)
        radius = self.aperture_radius.to(dtype)
        return torch.stack([radius * r * torch.cos(phi), radius * r * torch.sin(phi)], 1)

    @property
    def width(self):
        return self.resolution[0]

    @property
    def height(self):
        return self.resolution[1]

    def position(self, dtype):
        return self.cam_to_world[:3, 3].to(dtype)

    def rays(self, xy, dtype, lens=None):
        """World-space ray origins and unit directions for pixel coordinates ``xy`` (N, 2)
        (x right in [0, W], y down in [0, H]); ``valid`` marks lanes with a ray. ``lens``:
        camera-space lens points (N, 2) of a thin lens (:meth:`lens_points`), None for the
        lens centre."""
        m = self.cam_to_world.to(dtype)
        w, h = self.width, self.height
        if self.kind == "pinhole":
            s = torch.tan(self.fov.to(dtype) * (math.pi / 360.0))
            local = torch.stack([s * (2.0 * xy[:, 0] / w - 1.0),
                                 -s * (2.0 * xy[:, 1] / h - 1.0) * (h / w),
                                 torch.ones_like(xy[:, 0])], 1)
            valid = torch.ones(xy.shape[0], dtype=torch.bool)
            if lens is not None:  # from the lens point through the pixel's focal-plane point
                origin = torch.cat([lens, torch.zeros_like(lens[:, :1])], 1)
                local = local * self.focus_distance.to(dtype) - origin
                d = local @ m[:3, :3].T
                return m[:3, 3] + origin @ m[:3, :3].T, d / d.norm(dim=1, keepdim=True), valid
        else:
            scale = float(min(w, h))
            px = (2.0 * xy[:, 0] - w) / scale
            py = -(2.0 * xy[:, 1] - h) / scale
            r = torch.sqrt(px * px + py * py)
            valid = (r < 1.0).detach()
            theta = torch.clamp(r, max=1.0) * (math.pi / 2.0)
            safe_r = torch.where(r > 1e-12, r, torch.ones_like(r))
            sin_t = torch.sin(theta)
            local = torch.stack([sin_t * px / safe_r, sin_t * py / safe_r, torch.cos(theta)], 1)
        d = local @ m[:3, :3].T
        d = d / d.norm(dim=1, keepdim=True)
        return m[:3, 3].expand_as(d), d, valid

    def to_camera(self, p, dtype):
        """World points (N, 3) to camera space."""
        m = self.cam_to_world.to(dtype)
        return (p - m[:3, 3]) @ m[:3, :3].inverse().T

    def project(self, pc, lens=None):
        """Camera-space points to pixel coordinates, (N, 2): the pinhole's perspective divide
        (points with z > 0), or the equiangular fisheye's polar map (image radius
        proportional to the angle from the optical axis; points beyond 90 degrees land
        outside the image circle). ``lens`` (N, 2): a thin lens's points: each point lands
        where the line from its lens point through it crosses the plane in focus (for one lens
        point, still a central projection: lines stay lines)."""
        w, h = self.width, self.height
        if lens is not None:
            f = self.focus_distance.to(pc.dtype)
            lxy = lens + (pc[:, :2] - lens) * (f / pc[:, 2])[:, None]
            pc = torch.cat([lxy, f.expand(len(pc))[:, None]], 1)
        if self.kind == "fisheye":
            scale = float(min(w, h))
            lateral = torch.sqrt(torch.clamp(pc[:, 0] ** 2 + pc[:, 1] ** 2, min=1e-300))
            theta = torch.atan2(lateral, pc[:, 2])
            r = theta / (math.pi / 2.0)
            px, py = r * pc[:, 0] / lateral, r * pc[:, 1] / lateral
            return torch.stack([(px * scale + w) / 2.0, (h - py * scale) / 2.0], 1)
        s = torch.tan(self.fov.to(pc.dtype) * (math.pi / 360.0))
        x = (pc[:, 0] / (pc[:, 2] * s) + 1.0) * (w / 2.0)
        y = (1.0 - pc[:, 1] / (pc[:, 2] * s) * (w / h)) * (h / 2.0)
        return torch.stack([x, y], 1)

    def sees(self, xy):
        """Which pixel coordinates (N, 2) lie in the image (and, for the fisheye, inside its
        image circle)."""
        w, h = self.width, self.height
        inside = (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
        if self.kind == "fisheye":
            scale = float(min(w, h))
            r2 = ((2.0 * xy[:, 0] - w) / scale) ** 2 + ((2.0 * xy[:, 1] - h) / scale) ** 2
            inside &= r2 < 1.0
        return inside


@dataclasses.dataclass
class Material:
    """Lambertian + Blinn-Phong (Schlick Fresnel), or a rough dielectric. Each texture field is
    a constant or a Texture.

    ``eta`` (a positive scalar, None by default) makes the material a rough dielectric
    (Walter et al. 2007, GGX; edge_rt.bsdf): ``eta`` is the index of refraction of the side
    the winding's normal points away from (a closed mesh's interior), the exterior's is 1;
    its GGX width is ``alpha = sqrt(roughness)``; ``diffuse`` and ``specular`` are ignored."""

    diffuse: Texture | torch.Tensor = (0.5, 0.5, 0.5)
    specular: Texture | torch.Tensor = (0.0, 0.0, 0.0)
    roughness: Texture | torch.Tensor = (0.5,)
    eta: torch.Tensor | float | None = None

    def __post_init__(self):
        self.diffuse = _texture(self.diffuse, "Material.diffuse")
        self.specular = _texture(self.specular, "Material.specular")
        self.roughness = _texture(self.roughness, "Material.roughness")
        for name, tex, c in (("diffuse", self.diffuse, 3), ("specular", self.specular, 3),
                             ("roughness", self.roughness, 1)):
            if tex.channels != c:
                raise SceneError(f"Material.{name}: expected {c} channels, got {tex.channels}")
        if float(self.roughness.values.detach().min()) < 0.0:
            raise SceneError(f"Material.roughness: must be >= 0, got "
                             f"{float(self.roughness.values.detach().min())}")
        if self.eta is not None:
            self.eta = _tensor(self.eta, "Material.eta")
            check_eta(self.eta, "Material.eta")

    @property
    def is_dielectric(self) -> bool:
        return self.eta is not None


def check_lens(cam):
    """A thin lens needs a non-negative radius, a positive focus distance and the pinhole
    kind (checked again at render time: an optimiser step may move them)."""
    for name in ("aperture_radius", "focus_distance"):
        t = getattr(cam, name)
        if t.numel() != 1 or not torch.isfinite(t.detach()).all():
            raise SceneError(f"Camera.{name}: must be one finite number, got {t.detach()}")
    if float(cam.aperture_radius.detach().reshape(())) < 0.0:
        raise SceneError(f"Camera.aperture_radius: must be >= 0, got "
                         f"{float(cam.aperture_radius.detach().reshape(()))}")
    if not float(cam.focus_distance.detach().reshape(())) > 0.0:
        raise SceneError(f"Camera.focus_distance: must be > 0, got "
                         f"{float(cam.focus_distance.detach().reshape(()))}")
    if cam.kind != "pinhole" and cam.thin_lens:
        raise SceneError("Camera.aperture_radius: a thin lens needs kind='pinhole' (the "
                         "fisheye has no lens model)")


def check_eta(eta, name):
    """A dielectric's index must be one positive number (checked again at render time: an
    optimiser step may move it)."""
    if eta.numel() != 1:
        raise SceneError(f"{name}: must be a scalar index of refraction, got shape "
                         f"{tuple(eta.shape)}")
    if not float(eta.detach().reshape(())) > 0.0:
        raise SceneError(f"{name}: the index of refraction must be > 0, got "
                         f"{float(eta.detach().reshape(()))}")


@dataclasses.dataclass
class Mesh:
    """Triangle mesh. ``vertices`` (V, 3) float, ``faces`` (F, 3) int; optional ``uvs`` (V, 2)
    and shading ``normals`` (V, 3) indexed by ``faces``; ``material``; ``emission`` (RGB
    radiance, emitted on the side the winding's normal points to) makes it an area light.

    ``velocity`` (3,), None by default: linear motion, the mesh's translation over the shutter
    interval; at time ``t`` in [0, 1) its vertices are ``vertices + t * velocity``
    (``Geometry.intersect`` / ``interact`` take per-ray times). Lights cannot move."""

    vertices: torch.Tensor
    faces: torch.Tensor
    material: Material = dataclasses.field(default_factory=Material)
    uvs: torch.Tensor | None = None
    normals: torch.Tensor | None = None
    emission: torch.Tensor | None = None
    name: str = "mesh"
    velocity: torch.Tensor | None = None

    def __post_init__(self):
        n = f"Mesh {self.name!r}"
        self.vertices = _tensor(self.vertices, f"{n}: vertices")
        if self.vertices.dim() != 2 or self.vertices.shape[1] != 3:
            raise SceneError(f"{n}: vertices must be (V, 3), got {tuple(self.vertices.shape)}")
        faces = self.faces.detach().cpu().numpy() if torch.is_tensor(self.faces) else (
            np.asarray(self.faces))
        if faces.size == 0:
            raise SceneError(f"{n}: mesh has no faces")
        if faces.ndim != 2 or faces.shape[1] != 3 or faces.dtype.kind not in "iu":
            raise SceneError(f"{n}: faces must be an (F, 3) integer array, got "
                             f"{faces.shape} {faces.dtype}")
        if faces.min() < 0 or faces.max() >= self.vertices.shape[0]:
            raise SceneError(f"{n}: face index out of range [0, {self.vertices.shape[0]}) "
                             f"(min {faces.min()}, max {faces.max()})")
        self.faces = torch.as_tensor(faces.astype(np.int64))
        if self.uvs is not None:
            self.uvs = _tensor(self.uvs, f"{n}: uvs")
            if tuple(self.uvs.shape) != (self.vertices.shape[0], 2):
                raise SceneError(f"{n}: uvs must be (V, 2), got {tuple(self.uvs.shape)}")
        if self.normals is not None:
            self.normals = _tensor(self.normals, f"{n}: normals")
            if tuple(self.normals.shape) != tuple(self.vertices.shape):
                raise SceneError(f"{n}: normals must be (V, 3), got "
                                 f"{tuple(self.normals.shape)}")
        if self.emission is not None:
            self.emission = _tensor(self.emission, f"{n}: emission")
            if tuple(self.emission.shape) != (3,):
                raise SceneError(f"{n}: emission must be RGB (3,)")
        if self.velocity is not None:
            self.velocity = _tensor(self.velocity, f"{n}: velocity")
            if tuple(self.velocity.shape) != (3,):
                raise SceneError(f"{n}: velocity must be a translation (3,) over the shutter "
                                 f"interval, got shape {tuple(self.velocity.shape)}")
            if self.emission is not None:
                raise SceneError(f"{n}: moving lights are not supported (a mesh with an "
                                 "emission cannot have a velocity)")
        self.degenerate_faces = self._degenerate()

    def _degenerate(self):
        """Indices of zero-area faces. Documented behaviour: they are kept out of ray casting,
        light sampling and the edge list (a warning-free no-op, as zero-area triangles have
        no image contribution)."""
        v = self.vertices.detach().double().numpy()
        f = self.faces.numpy()
        area2 = np.linalg.norm(np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]]), axis=1)
        scale = max(float(np.abs(v).max()), 1e-30)
        return np.nonzero(area2 <= 1e-12 * scale * scale)[0]


@dataclasses.dataclass
class EnvironmentMap:
    """Equirectangular radiance (H, W, 3) (or constant (3,)) seen by rays leaving the scene.

    A textured envmap is also sampled by next-event estimation, texels picked in proportion
    to ``importance`` (H, W) times their solid angle; by default the radiance's luminance.
    Give a fixed ``importance`` to keep the sampled directions unchanged while the radiance is
    optimised (common random numbers across iterations or finite differences)."""

    radiance: Texture | torch.Tensor
    importance: np.ndarray | None = None

    def __post_init__(self):
        self.radiance = _texture(self.radiance, "EnvironmentMap.radiance")
        if self.radiance.channels != 3:
            raise SceneError("EnvironmentMap.radiance: expected 3 channels")
        if self.importance is not None:
            imp = np.asarray(self.importance.detach().cpu() if torch.is_tensor(self.importance)
                             else self.importance, dtype=np.float64)
            shape = tuple(self.radiance.values.shape[:2]) if not self.radiance.is_constant \
                else None
            if shape is None or imp.shape != shape:
                raise SceneError(f"EnvironmentMap.importance: expected shape {shape} (the"
                                 f" radiance's texels), got {imp.shape}")
            if not np.isfinite(imp).all() or (imp < 0).any():
                raise SceneError("EnvironmentMap.importance: must be finite and non-negative")
            self.importance = imp


@dataclasses.dataclass
class Scene:
    camera: Camera
    meshes: list
    envmap: EnvironmentMap | None = None

    def __post_init__(self):
        if not self.meshes:
            raise SceneError("Scene: empty scene (no meshes)")
        live = [m for m in self.meshes if len(m.degenerate_faces) < m.faces.shape[0]]
        if not live:
            raise SceneError("Scene: every face of every mesh is degenerate")

    # -- parameters -------------------------------------------------------------------------
    def tensors(self):
        """Every float tensor of the scene (camera, meshes, materials, lights, envmap), in a
        fixed order; ``with_tensors`` takes replacements in the same order."""
        return [t for _, t in _walk(self)]

    def named_tensors(self):
        return list(_walk(self))

    def with_tensors(self, replacements):
        it = iter(replacements)
        return _rebuild(self, it)

    @property
    def moving_meshes(self):
        """Meshes with a non-zero velocity (linear motion over the shutter)."""
        return [m for m in self.meshes
                if m.velocity is not None and bool((m.velocity.detach() != 0).any())]

    @property
    def lights(self):
        return [m for m in self.meshes if m.emission is not None]


def _fields(obj):
    if isinstance(obj, Texture):
        return [("values", obj.values)]
    return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]


def _walk(obj, prefix=""):
    items = enumerate(obj) if isinstance(obj, list) else _fields(obj)
    for name, value in items:
        path = f"{prefix}{name}" if prefix == "" else f"{prefix}.{name}"
        if torch.is_tensor(value):
            if value.is_floating_point():
                yield path, value
        elif isinstance(value, list | Texture) or dataclasses.is_dataclass(value):
            yield from _walk(value, path)


def _rebuild(obj, it):
    if isinstance(obj, list):
        return [_rebuild(o, it) for o in obj]
    if isinstance(obj, Texture):
        return Texture._unchecked(next(it))
    new = {}
    for name, value in _fields(obj):
        if torch.is_tensor(value) and value.is_floating_point():
            new[name] = next(it)
        elif isinstance(value, list | Texture) or dataclasses.is_dataclass(value):
            new[name] = _rebuild(value, it)
        else:
            new[name] = value
    out = obj.__class__.__new__(obj.__class__)
    out.__dict__.update(obj.__dict__)
    out.__dict__.update(new)
    return out
