"""Primary-visibility edge sampling (spec 3.4, 4.1).

Preprocess: the edge list (v0, v1, f0, f1) per mesh; per render, camera silhouettes (plus
every non-coplanar edge of flat-shaded meshes, whose shading jumps there), near-plane
clipping in camera space, projection, clipping to the screen, and a discrete distribution
proportional to clipped screen length. Each sample picks an edge and a uniform point on
its clipped segment; the renderer evaluates both sides and weights by
``len_clip / (P(E) * ||grad_xy alpha||)`` with alpha built from the (near-clipped)
projected endpoints, so the boundary term is the gradient of ``sum_j c_j alpha_j(Phi)``.

Thin lens (spec 3.4): the silhouette test runs at the four corners of the pupil's bounding
square (conservative: a face's orientation is affine in the viewpoint, so it changes over the
disk only if it does over the square); each sample first takes its lens point, then an edge,
whose segment it projects through that lens point (a central projection: still a segment).
The edge distribution is the pinhole one (lens centre) mixed with a uniform share
(:data:`LENS_UNIFORM_SHARE`) over every candidate in front of the near plane, so an edge that
only some lens points see has a non-zero probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

COPLANAR = 1.0 - 1e-6
LENS_UNIFORM_SHARE = 0.1


def edge_equation(a, b, xy):
    """alpha (5.5) of the line through screen points a, b at xy (all (N, 2))."""
    return ((a[:, 1] - b[:, 1]) * xy[:, 0] + (b[:, 0] - a[:, 0]) * xy[:, 1]
            + (a[:, 0] * b[:, 1] - b[:, 0] * a[:, 1]))


def edge_equation_derivatives(a, b, xy):
    """The analytic partials (5.9): dict with keys ax, ay, bx, by, x, y."""
    x, y = xy[:, 0], xy[:, 1]
    return {"ax": b[:, 1] - y, "ay": x - b[:, 0], "bx": y - a[:, 1], "by": a[:, 0] - x,
            "x": a[:, 1] - b[:, 1], "y": b[:, 0] - a[:, 0]}


_EDGE_CACHE: dict = {}


def canonical_vertices(positions: np.ndarray) -> np.ndarray:
    """Index of the first vertex at the same position (to 1e-9 of the mesh's extent), per
    vertex: UV seams and poles duplicate vertices, and their edges are not boundaries."""
    scale = max(float(np.abs(positions).max()), 1e-30)
    key = np.round(positions / scale * 1e9)
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


def edge_list(faces: np.ndarray, skip=(), positions=None):
    """Unique edges (E, 4): v0 < v1, f0, f1 (-1 on a boundary). Faces listed in ``skip``
    (degenerate) are left out; with ``positions``, vertices at the same position are merged
    first (redner's seam re-association) and zero-length edges dropped. Non-manifold edges
    keep their first two faces."""
    canon = None if positions is None else canonical_vertices(positions)
    key = (faces.tobytes(), tuple(np.asarray(skip).tolist()),
           None if canon is None else canon.tobytes())
    cached = _EDGE_CACHE.get(key)  # one lookup: another thread may clear the memo
    if cached is not None:
        return cached
    keep = np.setdiff1d(np.arange(len(faces)), skip)
    f = faces[keep] if canon is None else canon[faces[keep]]
    pairs = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    face_id = np.tile(keep, 3)
    live = pairs[:, 0] != pairs[:, 1]
    pairs, face_id = np.sort(pairs[live], axis=1), face_id[live]
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    pairs, face_id = pairs[order], face_id[order]
    start = np.ones(len(pairs), dtype=bool)
    start[1:] = np.any(pairs[1:] != pairs[:-1], axis=1)
    idx = np.nonzero(start)[0]
    out = np.full((len(idx), 4), -1, dtype=np.int64)
    out[:, :2] = pairs[idx]
    out[:, 2] = face_id[idx]
    second = idx + 1
    has_two = (second < len(pairs)) & ~start[np.minimum(second, len(pairs) - 1)]
    out[has_two, 3] = face_id[second[has_two]]
    if len(_EDGE_CACHE) > 64:  # a bounded memo: one entry per mesh topology in use
        _EDGE_CACHE.clear()
    _EDGE_CACHE[key] = out
    return out


@dataclass
class PrimaryEdges:
    mesh: np.ndarray        # mesh index per candidate edge
    v0: np.ndarray          # vertex indices within the mesh
    v1: np.ndarray
    seg0: np.ndarray        # screen-clipped segment endpoints (E, 2), pixels
    seg1: np.ndarray
    pmf: np.ndarray         # selection probability, proportional to clipped length

    def __len__(self):
        return len(self.mesh)


def _liang_barsky(p0, p1, w, h):
    d = p1 - p0
    t0, t1 = np.zeros(len(p0)), np.ones(len(p0))
    for p, q in ((-d[:, 0], p0[:, 0]), (d[:, 0], w - p0[:, 0]),
                 (-d[:, 1], p0[:, 1]), (d[:, 1], h - p0[:, 1])):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = q / p
        para = p == 0
        t0 = np.where(~para & (p < 0), np.maximum(t0, r), t0)
        t1 = np.where(~para & (p > 0), np.minimum(t1, r), t1)
        t1 = np.where(para & (q < 0), -1.0, t1)
    ok = t1 > t0
    return p0 + t0[:, None] * d, p0 + t1[:, None] * d, ok


def silhouette_edges(scene, mi):
    """Edges (E, 4) of mesh ``mi`` that can be discontinuities seen from the camera: camera
    silhouettes and boundary edges, plus every non-coplanar edge of a flat-shaded mesh."""
    m = scene.meshes[mi]
    v = m.vertices.detach().double().numpy()
    f = m.faces.numpy()
    e = edge_list(f, m.degenerate_faces, v)
    fn = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    fn /= np.maximum(np.linalg.norm(fn, axis=1, keepdims=True), 1e-300)
    boundary = e[:, 3] < 0
    f1 = np.where(boundary, e[:, 2], e[:, 3])
    facing = np.stack([np.stack([np.einsum("ij,ij->i", q - v[f[face, 0]], fn[face]) > 0
                                 for face in (e[:, 2], f1)]) for q in _viewpoints(scene.camera)])
    sil = boundary | ~(facing.all(axis=(0, 1)) | ~facing.any(axis=(0, 1)))
    if m.normals is None:
        sil |= np.einsum("ij,ij->i", fn[e[:, 2]], fn[f1]) < COPLANAR
    return e[sil]


def _viewpoints(cam):
    """World-space points the silhouettes are seen from: the camera's position, or the four
    corners of a thin lens's bounding square."""
    m = cam.cam_to_world.detach().double().numpy()
    if not cam.thin_lens:
        return [m[:3, 3]]
    r = float(cam.aperture_radius.detach())
    return [m[:3, 3] + m[:3, :3] @ np.array([sx * r, sy * r, 0.0])
            for sx in (-1.0, 1.0) for sy in (-1.0, 1.0)]


def primary_edges(scene) -> PrimaryEdges:
    """Candidate edges with their clipped screen segments (detached, float64), pinhole."""
    cam = scene.camera
    if cam.kind != "pinhole":
        raise ValueError("primary_edges: the pinhole camera's screen-space edges; use "
                         "curved_edges for the fisheye")
    cols = {k: [] for k in ("mesh", "v0", "v1", "s0", "s1", "len")}
    for mi, m in enumerate(scene.meshes):
        v = m.vertices.detach().double().numpy()
        e = silhouette_edges(scene, mi)
        pc0 = _camera_space(cam, v[e[:, 0]])
        pc1 = _camera_space(cam, v[e[:, 1]])
        pc0, pc1, front = _clip_near(pc0, pc1, cam.clip_near)
        a, b = _project(cam, pc0), _project(cam, pc1)
        s0, s1, inside = _liang_barsky(a, b, cam.width, cam.height)
        length = np.where(inside, np.linalg.norm(s1 - s0, axis=1), 0.0)
        ok = front & inside & (length > 0) & (np.linalg.norm(b - a, axis=1) > 1e-12)
        if cam.thin_lens:  # seen through other lens points: off the centre's screen too
            ok = front
        cols["mesh"].append(np.full(ok.sum(), mi))
        cols["v0"].append(e[ok, 0])
        cols["v1"].append(e[ok, 1])
        cols["s0"].append(s0[ok])
        cols["s1"].append(s1[ok])
        cols["len"].append(length[ok])
    length = np.concatenate(cols["len"])
    total = length.sum()
    pmf = length / total if total > 0 else length
    if cam.thin_lens and len(length):
        share = LENS_UNIFORM_SHARE if total > 0 else 1.0
        pmf = (1.0 - share) * pmf + share / len(length)
    return PrimaryEdges(np.concatenate(cols["mesh"]), np.concatenate(cols["v0"]),
                        np.concatenate(cols["v1"]), np.concatenate(cols["s0"]).reshape(-1, 2),
                        np.concatenate(cols["s1"]).reshape(-1, 2), pmf)


@dataclass
class CurvedEdges:
    """Silhouette edges under a non-linear projection (spec 3.6): sampled by a uniform edge
    parameter t on the 3D segment, selected proportionally to the screen length of their
    visible part (a polyline estimate; any pmf that is positive on every visible edge is
    unbiased, samples that land outside the image are rejected)."""

    mesh: np.ndarray
    v0: np.ndarray
    v1: np.ndarray
    pmf: np.ndarray

    def __len__(self):
        return len(self.mesh)


POLYLINE_SEGMENTS = 16


def curved_edges(scene) -> CurvedEdges:
    cam = scene.camera
    cols = {k: [] for k in ("mesh", "v0", "v1", "len")}
    t = np.linspace(0.0, 1.0, POLYLINE_SEGMENTS + 1)
    for mi, m in enumerate(scene.meshes):
        v = m.vertices.detach().double().numpy()
        e = silhouette_edges(scene, mi)
        p = v[e[:, 0]][:, None] + t[None, :, None] * (v[e[:, 1]] - v[e[:, 0]])[:, None]
        pc = torch.as_tensor(_camera_space(cam, p.reshape(-1, 3)))
        xy = cam.project(pc)
        seen = cam.sees(xy).numpy().reshape(len(e), -1)
        xy = xy.numpy().reshape(len(e), -1, 2)
        seg = np.linalg.norm(np.diff(xy, axis=1), axis=2)
        length = (seg * (seen[:, 1:] | seen[:, :-1])).sum(1)
        ok = length > 0
        cols["mesh"].append(np.full(ok.sum(), mi))
        cols["v0"].append(e[ok, 0])
        cols["v1"].append(e[ok, 1])
        cols["len"].append(length[ok])
    length = np.concatenate(cols["len"])
    total = length.sum()
    return CurvedEdges(np.concatenate(cols["mesh"]), np.concatenate(cols["v0"]),
                       np.concatenate(cols["v1"]), length / total if total > 0 else length)


def sample_curved(edges: CurvedEdges, n, rng):
    """n samples: (edge index, edge parameter t, weight 1 / P(E))."""
    k = rng.choice(len(edges), size=n, p=edges.pmf)
    return k, rng.random(n), 1.0 / edges.pmf[k]


def edge_equation_3d(scene, xy, a, b):
    """alpha(x, y) = d(x, y) . ((a - c) x (b - c)) (spec 3.6): the camera ray through pixel
    point ``xy`` against the plane through the camera centre c and the edge (a, b); zero on
    the projected edge under any projection, differentiable in the camera and vertices."""
    origin, d, _ = scene.camera.rays(xy, a.dtype)
    return (d * torch.linalg.cross(a - origin, b - origin)).sum(1)


def _camera_space(cam, p):
    m = cam.cam_to_world.detach().double().numpy()
    return (p - m[:3, 3]) @ np.linalg.inv(m[:3, :3]).T


def _project(cam, pc):
    return cam.project(torch.as_tensor(pc)).detach().numpy()


def _clip_near(p0, p1, near):
    z0, z1 = p0[:, 2], p1[:, 2]
    front = (z0 >= near) | (z1 >= near)
    crossing = (z0 < near) != (z1 < near)
    # Only edges that cross the plane are clipped; the others keep t = 0 (no 0/0).
    t = np.where(crossing, near - z0, 0.0) / np.where(crossing, z1 - z0, 1.0)
    clip = p0 + t[:, None] * (p1 - p0)
    c0 = np.where((z0 < near)[:, None], clip, p0)
    c1 = np.where((z1 < near)[:, None], clip, p1)
    return c0, c1, front


def endpoints(scene, mesh, v0, v1, dtype):
    """World-space endpoints (N, 3) of edges given by mesh index and vertex indices,
    differentiable in the meshes' vertex tensors."""
    pa = torch.zeros((len(mesh), 3), dtype=dtype)
    pb = torch.zeros((len(mesh), 3), dtype=dtype)
    for mi, m in enumerate(scene.meshes):
        sel = torch.nonzero(torch.as_tensor(mesh == mi)).flatten()
        if len(sel):
            vs = m.vertices.to(dtype)
            pa = pa.index_copy(0, sel, vs[torch.as_tensor(v0)[sel]])
            pb = pb.index_copy(0, sel, vs[torch.as_tensor(v1)[sel]])
    return pa, pb


def clipped_endpoints(scene, mesh, v0, v1, dtype, lens=None):
    """Differentiable projected endpoints a, b (N, 2) of the sampled edges, after the
    near-plane clip (the clip point is differentiated through); ``lens`` (N, 2): each
    sample's thin-lens point (camera space), projected through."""
    cam = scene.camera
    pa, pb = endpoints(scene, mesh, v0, v1, dtype)
    c0, c1 = cam.to_camera(pa, dtype), cam.to_camera(pb, dtype)
    near = cam.clip_near
    z0, z1 = c0[:, 2:], c1[:, 2:]
    behind0, behind1 = (z0 < near).detach(), (z1 < near).detach()
    denom = torch.where(behind0 | behind1, z1 - z0, torch.ones_like(z0))
    clip = c0 + (near - z0) / denom * (c1 - c0)
    c0 = torch.where(behind0, clip, c0)
    c1 = torch.where(behind1, clip, c1)
    return cam.project(c0, lens), cam.project(c1, lens)


def sample(edges: PrimaryEdges, n, rng):
    """n samples: (edge index, screen point (n, 2), weight len_clip / P(E))."""
    k = rng.choice(len(edges), size=n, p=edges.pmf)
    t = rng.random(n)
    p = edges.seg0[k] + t[:, None] * (edges.seg1[k] - edges.seg0[k])
    length = np.linalg.norm(edges.seg1[k] - edges.seg0[k], axis=1)
    return k, p, length / edges.pmf[k]


def sample_through_lens(scene, edges: PrimaryEdges, lens, rng):
    """One sample per lens point (N, 2; camera space, detached): an edge by ``edges.pmf``,
    its segment projected through the lens point and clipped to the screen, a uniform point
    on it. Returns (edge index, screen point (N, 2), weight len_clip / P(E)); the weight is
    0 where the segment misses the screen for that lens point."""
    cam = scene.camera
    n = len(lens)
    k = rng.choice(len(edges), size=n, p=edges.pmf)
    t = rng.random(n)
    with torch.no_grad():
        a, b = clipped_endpoints(scene, edges.mesh[k], edges.v0[k], edges.v1[k],
                                 torch.float64, torch.as_tensor(lens, dtype=torch.float64))
    s0, s1, inside = _liang_barsky(a.numpy(), b.numpy(), cam.width, cam.height)
    p = s0 + t[:, None] * (s1 - s0)
    length = np.where(inside, np.linalg.norm(s1 - s0, axis=1), 0.0)
    return k, p, length / edges.pmf[k]
