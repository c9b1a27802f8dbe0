"""Flattened scene geometry for one render: Embree ray casting on detached float32 copies,
differentiable surface interactions (ray-triangle intersection recomputed for the hit
triangle in a compiled core_ad kernel with its VJP and JVP, so hit points move with vertices
and rays), and area-light sampling."""

from __future__ import annotations

from dataclasses import dataclass

import math
import threading

import numpy as np
import torch
from core_ad import sym
from embreex import rtcore_scene
from embreex.mesh_construction import TriangleMesh

from ._compiled import CompiledOp
from ._embree import TriangleScene
from ._hit import hit_values
from .texture import direction_to_latlong


@dataclass
class Interaction:
    """Surface points of a batch of hits; everything differentiable except the ids."""

    tri: torch.Tensor       # global triangle id
    mesh: torch.Tensor      # mesh index
    p: torch.Tensor         # hit point
    t: torch.Tensor         # ray distance
    ng: torch.Tensor        # geometric normal, flipped toward the viewer
    ns: torch.Tensor        # shading normal, flipped toward the viewer
    uv: torch.Tensor
    front: torch.Tensor     # bool: the ray hit the side the winding normal points to
    area: torch.Tensor      # triangle area


_CORNER_UVS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])


class Geometry:
    def __init__(self, scene, dtype, ray_caster=None):
        """``ray_caster``: a Geometry of the same scene whose Embree scene is reused (the
        backward pass rebuilds the differentiable part per chunk, not the BVH)."""
        self.scene, self.dtype = scene, dtype
        self._env_lock = threading.Lock()
        verts, tris, mesh_of, offsets, uvs = [], [], [], [], []
        base = 0
        for mi, m in enumerate(scene.meshes):
            keep = np.setdiff1d(np.arange(m.faces.shape[0]), m.degenerate_faces)
            verts.append(m.vertices.to(dtype))
            tris.append(m.faces[keep] + base)
            # Without uvs a triangle's uv is its barycentrics (b1, b2): corners (0,0) (1,0) (0,1).
            uvs.append(m.uvs.to(dtype)[m.faces[keep]] if m.uvs is not None
                       else _CORNER_UVS.to(dtype).expand(len(keep), 3, 2))
            mesh_of.append(np.full(len(keep), mi))
            offsets.append(base)
            base += m.vertices.shape[0]
        self.vertices = torch.cat(verts, 0)
        self.faces = torch.cat(tris, 0)
        self.mesh_of = torch.as_tensor(np.concatenate(mesh_of))
        self.vertex_offset = offsets
        self.tri_verts = self.vertices[self.faces]  # (T, 3, 3)
        # Its corners, (T, 3) each: hits and light samples gather them one by one, so the
        # backward adds into these small tables (slicing a gathered (N, 3, 3) block instead
        # made each slice's backward allocate and fill an (N, 3, 3) gradient).
        self.tri_corners = self.tri_verts.unbind(1)
        self.tri_uvs = torch.cat(uvs, 0)  # (T, 3, 2)
        movers = {id(m) for m in scene.moving_meshes}
        moving = [mi for mi, m in enumerate(scene.meshes) if id(m) in movers]
        # (T, 3) translation of each triangle over the shutter (None: a static scene)
        self.tri_velocity = None
        if moving:
            vel = torch.stack([torch.zeros(3, dtype=dtype) if mi not in moving
                               else m.velocity.to(dtype) for mi, m in enumerate(scene.meshes)])
            self.tri_velocity = vel.index_select(0, self.mesh_of)
        if ray_caster is not None:
            self.embree, self.eps = ray_caster.embree, ray_caster.eps
            self.movers, self.static_tris = ray_caster.movers, ray_caster.static_tris
            self.light_tris, self.light_pmf = ray_caster.light_tris, ray_caster.light_pmf
            self.light_cdf = getattr(ray_caster, "light_cdf", None)
            return
        packed = self.tri_verts.detach().to(torch.float32).numpy()
        bound = float(np.abs(packed).max())
        if moving:  # the moving meshes' sweep bounds the offset too
            bound += float(max(scene.meshes[mi].velocity.detach().abs().max() for mi in moving))
        self.eps = 1e-4 * max(bound, 1e-3)
        # Moving meshes: one Embree scene each, in their own frame at t = 0 (a ray (o, d) at
        # time t meets the mesh where (o - t v, d) meets it at rest); the rest in one more.
        # movers: (global triangle ids, velocity, Embree scene) per moving mesh; the static
        # scene's ids map through self.static_tris (None: every triangle, no motion).
        self.movers, self.static_tris = [], None
        mesh_of = self.mesh_of.numpy()
        if moving:
            for mi in moving:
                ids = np.flatnonzero(mesh_of == mi)
                self.movers.append((ids, scene.meshes[mi].velocity.detach().double().numpy(),
                                    _embreex_scene(packed[ids])))
            self.static_tris = np.flatnonzero(~np.isin(mesh_of, moving))
            packed = packed[self.static_tris]
            self.embree = _embreex_scene(packed) if len(packed) else None
        else:
            self.embree = TriangleScene(packed)
        self._init_lights()

    def _init_lights(self):
        sc = self.scene
        emit = torch.zeros(self.faces.shape[0], dtype=torch.bool)
        power = torch.zeros(self.faces.shape[0], dtype=torch.float64)
        v = self.tri_verts.detach().double()
        area = 0.5 * torch.linalg.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]).norm(dim=1)
        for mi, m in enumerate(sc.meshes):
            if m.emission is not None:
                sel = self.mesh_of == mi
                emit |= sel
                power[sel] = area[sel] * float(m.emission.detach().abs().mean())
        self.light_tris = torch.nonzero(emit & (power > 0)).flatten()
        self.light_pmf = torch.zeros(self.faces.shape[0], dtype=torch.float64)
        if len(self.light_tris):
            p = power[self.light_tris]
            self.light_pmf[self.light_tris] = p / p.sum()
            self.light_cdf = torch.cumsum(p / p.sum(), 0)

    # -- ray casting (detached) -----------------------------------------------------------
    def intersect(self, o, d, tmax=None, time=None):
        """Global triangle ids of the closest hits, -1 for misses. ``time`` (N,) in [0, 1):
        the rays' times, where the scene has moving meshes (None: t = 0)."""
        if self.movers:
            return self._intersect_moving(o, d, tmax, time)
        return self.embree.intersect(o, d, tmax)

    def occluded(self, o, d, tmax, time=None):
        """(N,) bool: whether each ray hits something before ``tmax`` (shadow rays)."""
        if self.movers:
            return self._intersect_moving(o, d, tmax, time) >= 0
        return self.embree.occluded(o, d, tmax)

    def _intersect_moving(self, o, d, tmax, time):
        """``intersect`` with moving meshes: the static scene first, then each moving mesh in
        its own frame with the ray cut at the closest hit so far (nearest hit wins)."""
        n = o.shape[0]
        if n == 0:
            return torch.zeros(0, dtype=torch.long)
        t = np.zeros(n) if time is None else time.detach().double().numpy()
        if t.shape != (n,):
            raise ValueError(f"Geometry.intersect: time must be (N,) = ({n},), got {t.shape}")
        od, dd = o.detach().double().numpy(), np.ascontiguousarray(
            d.detach().to(torch.float32).numpy())
        best = np.full(n, np.inf, np.float32) if tmax is None else np.ascontiguousarray(
            tmax.detach().to(torch.float32).numpy())
        ids = np.full(n, -1, np.int64)
        for tris, velocity, embree in ([(self.static_tris, np.zeros(3), self.embree)]
                                       if self.embree is not None else []) + self.movers:
            oo = np.ascontiguousarray((od - t[:, None] * velocity).astype(np.float32))
            out = embree.run(oo, dd, dists=best.copy(), output=1)
            hit = out["primID"] >= 0
            ids[hit] = tris[out["primID"][hit]]
            best = np.where(hit, out["tfar"], best).astype(np.float32)
        return torch.as_tensor(ids)

    def corners(self, tri, time=None):
        """The corners a, b, c ((N, 3) each) of triangles ``tri`` at times ``time`` (N,)
        (None: t = 0)."""
        if self.tri_velocity is None or time is None:
            return tuple(c.index_select(0, tri) for c in self.tri_corners)
        shift = time.to(self.dtype)[:, None] * self.tri_velocity.index_select(0, tri)
        return tuple(c.index_select(0, tri) + shift for c in self.tri_corners)

    # -- differentiable interactions ------------------------------------------------------
    def interact(self, tri, o, d, time=None):
        """Surface interactions of rays (o, d) with their hit triangles ``tri``, at times
        ``time`` (N,) where meshes move."""
        mesh = self.mesh_of.index_select(0, tri)
        moves = self.tri_velocity is not None and time is not None
        if torch.is_grad_enabled() or moves:
            p, t, ng, bary, area = RAY_TRIANGLE(*self.corners(tri, time), o, d)
            t, area = t[:, 0], area[:, 0]
            w = torch.stack([1.0 - bary[:, 0] - bary[:, 1], bary[:, 0], bary[:, 1]], 1)
            uv = (self.tri_uvs.index_select(0, tri) * w[:, :, None]).sum(1)
            front = ((ng * d).sum(1) < 0).detach()
            ng = ng * torch.where(front, 1.0, -1.0).to(self.dtype)[:, None]
        else:  # the forward render of a scene at rest: one kernel, no derivatives
            p, t, ng, bary, area, uv, front = hit_values(tri, o, d, self.tri_verts,
                                                         self.tri_uvs)
        ns = self._shading_normals(tri, mesh, bary, ng, front)
        return Interaction(tri, mesh, p, t, ng, ns, uv, front, area)

    def _shading_normals(self, tri, mesh, bary, ng, front):
        """Interpolated vertex normals on meshes that have them, ``ng`` elsewhere; both
        flipped toward the viewer (``ng`` already is)."""
        ns = ng
        for mi, m in enumerate(self.scene.meshes):
            if m.normals is None:
                continue
            sel = torch.nonzero(mesh == mi).flatten()
            if len(sel) == 0:
                continue
            b = bary.index_select(0, sel)
            w = torch.stack([1.0 - b[:, 0] - b[:, 1], b[:, 0], b[:, 1]], 1)[:, :, None]
            fi = self.faces[tri[sel]] - self.vertex_offset[mi]
            n_interp = (m.normals.to(self.dtype)[fi] * w).sum(1)
            sign = torch.where(front[sel], 1.0, -1.0).to(self.dtype)[:, None]
            ns = ns.index_copy(0, sel, n_interp / n_interp.norm(dim=1, keepdim=True) * sign)
        return ns

    def spawn(self, si, direction):
        """Ray origins offset off the surface on the side ``direction`` leaves to."""
        side = torch.where((si.ng * direction).sum(1) >= 0, 1.0, -1.0).to(self.dtype)
        return si.p + (self.eps * side)[:, None] * si.ng.detach()

    def eps_column(self, n):
        """The ray offset of ``spawn`` as an (n, 1) column (an input of compiled ops)."""
        return torch.full((n, 1), self.eps, dtype=self.dtype)

    def material(self, si, footprint=None):
        """(kd, ks, roughness) at the interactions; ``footprint`` (N,) is the world-space
        pixel footprint for the mip level."""
        # constant materials: one gather from per-mesh tables; textured meshes looked up apart
        kd = self._per_mesh_constant("diffuse", 3).index_select(0, si.mesh)
        ks = self._per_mesh_constant("specular", 3).index_select(0, si.mesh)
        rough = self._per_mesh_constant("roughness", 1).index_select(0, si.mesh)[:, 0]
        for mi, m in enumerate(self.scene.meshes):
            mat = m.material
            if mat.diffuse.is_constant and mat.specular.is_constant and mat.roughness.is_constant:
                continue
            sel = torch.nonzero(si.mesh == mi).flatten()
            if len(sel) == 0:
                continue
            uv = si.uv[sel]
            level = None
            if footprint is not None and m.uvs is not None:
                level = self._mip_level(m, si, sel, footprint[sel])
            kd = kd.index_copy(0, sel, _lookup(mat.diffuse, uv, level, self.dtype))
            ks = ks.index_copy(0, sel, _lookup(mat.specular, uv, level, self.dtype))
            rough = rough.index_copy(0, sel, _lookup(mat.roughness, uv, level, self.dtype)[:, 0])
        return kd, ks, rough

    @property
    def has_dielectric(self):
        return any(m.material.is_dielectric for m in self.scene.meshes)

    def eta(self, si):
        """(N,) interior index of refraction of the dielectric meshes at the interactions, 0 on
        opaque ones; differentiable in the materials' ``eta``."""
        rows = [torch.zeros((), dtype=self.dtype) if m.material.eta is None
                else m.material.eta.to(self.dtype).reshape(()) for m in self.scene.meshes]
        return torch.stack(rows).index_select(0, si.mesh)

    def _per_mesh_constant(self, name, channels):
        """(meshes, channels): each mesh's constant material texture ``name`` (zeros where it
        is a texel grid), differentiable in the constants."""
        rows = []
        for m in self.scene.meshes:
            tex = getattr(m.material, name)
            rows.append(tex.values.to(self.dtype)[:channels].expand(channels) if tex.is_constant
                        else torch.zeros(channels, dtype=self.dtype))
        return torch.stack(rows)

    def _mip_level(self, m, si, sel, footprint):
        # Texels per footprint: world footprint scaled by the triangle's uv/world area ratio.
        fi = (self.faces[si.tri[sel]] - self.vertex_offset[m_index(self.scene, m)]).detach()
        uv = m.uvs.detach().to(self.dtype)[fi]
        uv_area = 0.5 * (torch.abs((uv[:, 1, 0] - uv[:, 0, 0]) * (uv[:, 2, 1] - uv[:, 0, 1])
                                   - (uv[:, 2, 0] - uv[:, 0, 0]) * (uv[:, 1, 1] - uv[:, 0, 1])))
        world_area = si.area[sel].detach()
        res = max(m.material.diffuse.values.shape[:2]) if not m.material.diffuse.is_constant \
            else 1
        texels = footprint.detach() * torch.sqrt(uv_area / torch.clamp(world_area, 1e-20)) * res
        return torch.log2(torch.clamp(texels, min=1.0))

    def emission(self, si):
        """Radiance leaving the front side of emissive meshes (zero elsewhere)."""
        return torch.where(si.front[:, None], self._emission_rows().index_select(0, si.mesh),
                           0.0)

    def light_emission(self, tri):
        """Emitted radiance (N, 3) of the triangles ``tri`` (sampled on lights)."""
        return self._emission_rows().index_select(0, self.mesh_of.index_select(0, tri))

    def _emission_rows(self):
        """(meshes, 3): each mesh's emission (zeros for non-emitters), differentiable."""
        rows = [torch.zeros(3, dtype=self.dtype) if m.emission is None
                else m.emission.to(self.dtype).expand(3) for m in self.scene.meshes]
        return torch.stack(rows)

    def environment(self, d):
        env = self.scene.envmap
        if env is None:
            return torch.zeros((d.shape[0], 3), dtype=self.dtype)
        return _lookup(env.radiance, direction_to_latlong(d), None, self.dtype)

    # -- environment sampling (next-event estimation towards the envmap) ------------------
    @property
    def samples_environment(self) -> bool:
        """Whether next-event estimation samples the envmap: a textured one with some light
        (a constant envmap is sampled as well by the BSDF's cosine lobe)."""
        return self._environment_distribution() is not None

    def _environment_distribution(self):
        """(cdf over the texels in row-major order, pmf per texel, H, W), or None: texels
        picked by luminance (its mean over their cell, or the envmap's ``importance``) times
        the sine of their row's polar angle (their solid angle), from the detached radiance
        (the pdfs are held constant, spec 5.3). Built once, under a lock: a render's chunks
        run in threads, and one that found a half-built (None) distribution skipped the
        envmap's next-event estimation while the others did not."""
        with self._env_lock:
            if not hasattr(self, "_env_dist"):
                self._env_dist = self._build_environment_distribution()
        return self._env_dist

    def _build_environment_distribution(self):
        env = self.scene.envmap
        if env is not None and not env.radiance.is_constant:
            rad = env.radiance.values.detach().to(torch.float64)
            h, w = rad.shape[0], rad.shape[1]
            if env.importance is None:
                lum = torch.clamp(rad @ torch.tensor([0.2126, 0.7152, 0.0722],
                                                     dtype=torch.float64), min=0.0)
                # the mean of the bilinear lookup (which wraps both ways) over each
                # texel's cell: (1, 6, 1) / 8 along each axis; positive wherever the
                # radiance is, and close to it
                for axis in (0, 1):
                    lum = (6.0 * lum + torch.roll(lum, 1, axis)
                           + torch.roll(lum, -1, axis)) / 8.0
            else:
                lum = torch.as_tensor(env.importance)
            sin_t = torch.sin((torch.arange(h, dtype=torch.float64) + 0.5) * math.pi / h)
            weight = (lum * sin_t[:, None]).flatten()
            total = float(weight.sum())
            if total > 0.0 and math.isfinite(total):
                pmf = weight / total
                return torch.cumsum(pmf, 0), pmf, h, w
        return None

    def sample_environment(self, u):
        """Directions towards the envmap from (N, 3) uniforms, and their pdf in solid angle
        (both detached): a texel by its pmf, then a uniform point of it in (u, v)."""
        cdf, pmf, h, w = self._environment_distribution()
        k = torch.clamp(torch.searchsorted(cdf, u[:, 0].double().contiguous(), right=True),
                        max=h * w - 1)
        row, col = k // w, k % w
        theta = (row.double() + u[:, 1].double()) * (math.pi / h)
        alpha = ((col.double() + u[:, 2].double()) / w - 0.5) * (2.0 * math.pi)
        sin_t = torch.sin(theta)
        d = torch.stack([sin_t * torch.sin(alpha), torch.cos(theta), -sin_t * torch.cos(alpha)],
                        1)
        pdf = pmf.index_select(0, k) * (h * w) / (2.0 * math.pi ** 2 * torch.clamp(sin_t,
                                                                                   1e-12))
        return d.to(self.dtype), pdf.to(self.dtype)

    def environment_pdf(self, d):
        """The solid-angle pdf of ``sample_environment`` for directions ``d`` (N, 3)."""
        cdf, pmf, h, w = self._environment_distribution()
        uv = direction_to_latlong(d.detach().double())
        theta = (1.0 - uv[:, 1]) * math.pi
        row = torch.clamp((theta * (h / math.pi)).long(), 0, h - 1)
        col = torch.clamp((uv[:, 0] * w).long(), 0, w - 1)
        pdf = pmf.index_select(0, row * w + col) * (h * w) / (
            2.0 * math.pi ** 2 * torch.clamp(torch.sin(theta), 1e-12))
        return pdf.to(self.dtype)

    # -- light sampling -------------------------------------------------------------------
    def pick_light(self, u0):
        """Emissive triangles picked by power from (N,) uniforms: (tri, pmf)."""
        k = torch.searchsorted(self.light_cdf, u0.double().contiguous())
        tri = self.light_tris.index_select(0, torch.clamp(k, max=len(self.light_tris) - 1))
        return tri, self.light_pmf.index_select(0, tri).to(self.dtype)

    def sample_light(self, u):
        """Points on emissive triangles from (N, 3) uniforms: (tri, y, normal, area, pmf)."""
        tri, pmf = self.pick_light(u[:, 0])
        v = self.tri_verts.index_select(0, tri)
        su = torch.sqrt(u[:, 1])
        b0, b1 = 1.0 - su, u[:, 2] * su
        y = b0[:, None] * v[:, 0] + b1[:, None] * v[:, 1] + (1.0 - b0 - b1)[:, None] * v[:, 2]
        cross = torch.linalg.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
        area = 0.5 * cross.norm(dim=1)
        return tri, y, cross / (2.0 * area[:, None]), area, pmf


def _embreex_scene(packed):
    """An embreex scene: moving meshes' casts need the hit distance, which ``TriangleScene``
    does not return."""
    scene = rtcore_scene.EmbreeScene()
    TriangleMesh(scene, np.ascontiguousarray(packed))
    return scene


def _ray_triangle_expressions(dtype):
    """Moller-Trumbore on the triangle Embree reported, differentiable in its vertices and
    the ray: hit point, distance, unit geometric normal, barycentrics (b1, b2), area."""
    names = [f"{g}{c}" for g in ("a", "b", "c", "o", "d") for c in "xyz"]
    v = [sym.var(n, dtype) for n in names]
    a, b, c, o, d = (v[k:k + 3] for k in range(0, 15, 3))

    def sub(p, q):
        return [p[i] - q[i] for i in range(3)]

    def cross(p, q):
        return [p[1] * q[2] - p[2] * q[1], p[2] * q[0] - p[0] * q[2], p[0] * q[1] - p[1] * q[0]]

    def dot(p, q):
        return p[0] * q[0] + p[1] * q[1] + p[2] * q[2]

    e1, e2 = sub(b, a), sub(c, a)
    pvec, tvec = cross(d, e2), sub(o, a)
    qvec = cross(tvec, e1)
    inv_det = 1.0 / dot(e1, pvec)
    t = dot(e2, qvec) * inv_det
    normal = cross(e1, e2)
    length = sym.sqrt(dot(normal, normal))
    outputs = ([o[i] + t * d[i] for i in range(3)] + [t] + [n / length for n in normal]
               + [dot(tvec, pvec) * inv_det, dot(d, qvec) * inv_det, 0.5 * length])
    return v, outputs


# (v0, v1, v2, o, d) -> (p (N,3), t (N,1), ng (N,3), (b1, b2) (N,2), area (N,1))
RAY_TRIANGLE = CompiledOp(_ray_triangle_expressions, (3, 3, 3, 3, 3), (3, 1, 3, 2, 1))


def m_index(scene, mesh):
    for i, m in enumerate(scene.meshes):
        if m is mesh:
            return i
    raise KeyError(mesh.name)


def _lookup(tex, uv, level, dtype):
    return tex.lookup(uv, level, dtype)
