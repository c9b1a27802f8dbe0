"""Bidirectional path tracing in primary sample space (spec 1.2, 1.4; Veach's BDPT with
Kelemen's states): the techniques ``(k, s)`` with ``s >= 2`` light-subpath vertices, and the
power-heuristic MIS weights over all ``s = 0 .. k`` of a path of ``k`` segments.

A state carries, beside the camera subpath's numbers, a light subpath's: a light point (the
triangle pick and two area coordinates, edge_rt's ``Geometry.sample_light``), a
cosine-distributed emission direction (two numbers) and three numbers per bounce (edge_rt's
BSDF sampling). Technique ``(k, s)`` with ``t = k + 1 - s`` connects camera vertex
``x_{t-1}`` to light vertex ``y_{s-1}`` by a visibility ray; light tracing (``t = 1``,
``s = k``) connects ``y_{k-1}`` to the pinhole and lands in the pixel it is seen in, not the
state's screen position (``Paths.pixels``; the MLT splats each technique into its own).

Each technique's contribution is one core_ad expression of its numbers, written in area
measure: ``C_s = f(x) p_s(x) / sum_j p_j(x)^2`` with ``f`` the path's measurement
contribution (emitted radiance, BRDF * cos at each surface vertex with the viewer towards the
camera, ``|cos| / d^2`` at each receiving vertex) and ``p_j`` the area density with which
technique ``j`` samples the same path (forward BSDF pdfs on the camera side, the light's
area pdf, the emission pdf and reverse BSDF pdfs on the light side; the camera vertex's
density is common to all and cancels, and so does ``x_1``'s from the camera, common to every
``t >= 2``, which light tracing's density is divided by instead). Evaluating ``f`` in full
instead of propagating a light subpath's throughput keeps the shading-normal asymmetry of
light transport exact with no adjoint BSDF. The camera factor cancels against the pixel's,
as in the unidirectional techniques (``C`` is the PSS contribution ``f / p``): for light
tracing that factor is the camera's density of ``x_1``, ``cos_1 / (d^2 A cos^3)`` for a
screen position uniform on an image plane of area ``A`` at distance 1.

The modified parameterisation (spec 5.1 (i), 5.2) covers both subpaths: on the bounce
vertices a state's technique samples (camera ``x_1 .. x_{t-2}``, light ``y_1 .. y_{s-2}``)
that are rougher than the threshold, the direction numbers are absolute spherical coordinates
and ``|det du/dw|`` gains the vertex's ``p_bsdf 2 pi^2 sin phi`` (the light side's pdf is the
one that sampled it, towards the camera). The emission direction stays a cosine sample (its
two numbers are the light's own, in either coordinates). Light coordinates (5.1 (ii)) apply
to the ``s = 0`` techniques, whose camera subpath hits the light as the unidirectional HIT
technique's does: the last bounce aims at a point of the light, as there. The lens
perturbation (spec 5.3) moves the camera subpath only: its reconnection vertex is a sampled
camera bounce ``x_j``, ``j <= t - 2``, and the light subpath, fixed by its own numbers, stays
where it was (the connection vertex ``x_{t-1}`` joins it, so it is a fixed vertex ``j + 1``
as the unidirectional next-event vertex is).

Rough dielectrics: a light subpath refracts or reflects as a camera
subpath does (edge_rt's dielectric sampling, from the side the light arrives on), and a
connection may leave or reach a dielectric vertex on either side where its shading normal
agrees (:func:`.sides_ok`). Each surface vertex is seen from both neighbours: the frame it
was traced in (normals facing the neighbour it was reached from, the relative index of
refraction from that side) and, across a refraction, the other side's (normals flipped, the
index inverted). ``f`` takes the camera-side frames (edge_rt's BSDF is written for a viewer
towards the camera, radiance scaling included), forward pdfs the camera-side ones and
reverse pdfs the light-side ones, so no adjoint BSDF is needed here either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from core_ad import sym
from edge_rt import bsdf

from ._surface import by_material, relative_eta, sides_ok, subset
from ._vector import dot, sub

_HIT, _NEE = 0, 1  # the unidirectional techniques (PathSpace's HIT and NEE)
_MATERIAL = ("kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")


def layout(first, max_length):
    """The light subpath's coordinates from index ``first`` of ``u``: light point (3),
    emission direction (2) and one BSDF sample per light vertex that sends its subpath on
    (``max_length - 2``: light tracing's longest subpath ends on the surface vertex it
    connects to the camera); ``(point, emission, bounces, end)``."""
    point = first + np.arange(3)
    emission = first + 3 + np.arange(2)
    n = max(max_length - 2, 0)
    bounces = [first + 5 + 3 * b + np.arange(3) for b in range(n)]
    return point, emission, bounces, first + 5 + 3 * n


def techniques(lengths):
    """Every ``(k, s)``, ``s = 0 .. k``, in the order of ``Paths.contrib``'s axis."""
    return [(k, s) for k in lengths for s in range(k + 1)]


def dims(ps, k, s):
    """The coordinates technique ``(k, s >= 2)`` reads: the screen (not for light tracing,
    ``t = 1``: its pixel is where the path meets the camera), the camera subpath's ``t - 2``
    bounces, the light point, the emission and the light subpath's ``s - 2`` bounces (the
    shutter time first where meshes move)."""
    t = k + 1 - s
    return np.concatenate([np.arange(ps._screen + (2 if t >= 2 else 0))]
                          + ps.bsdf_dims[:max(t - 2, 0)]
                          + [ps.light_point_dims, ps.emission_dims]
                          + ps.light_bsdf_dims[:s - 2])


# ------------------------------------------------------------------ discrete structure
def light_bounces(ps, technique_index):
    """Number of light-subpath bounces (``y_1 .. y_{s-2}``) whose directions technique
    ``techniques[t]`` samples, per entry of ``technique_index`` (-1, PSS: 0)."""
    used = np.array([max(s - 2, 0) for _, s in ps.techniques] + [0])
    return used[np.asarray(technique_index, np.int64)]


def light_subpaths(ps, ut, times, n_abs):
    """Trace every lane's light subpath with edge_rt: the light parameters of its light
    point, one row per lane (B, P_light), and per light surface vertex ``y_j``, ``j = 1,
    2, ...``: ``(lanes there, interactions (normals facing the light side), dielectric
    flags, vertex parameters)``. ``n_abs`` (B,): the lane's light bounces in absolute
    coordinates where rougher than the threshold (:func:`light_bounces`; zeros in PSS)."""
    g, dt = ps.geometry, torch.float64
    B = ut.shape[0]
    tri, y, nl, _, pmf = g.sample_light(ut[:, ps.light_point_dims])
    ue = torch.stack([torch.full((B,), 0.5, dtype=dt), ut[:, ps.emission_dims[0]],
                      ut[:, ps.emission_dims[1]]], 1)
    white = torch.ones((B, 3), dtype=dt)
    d, _ = bsdf.sample(nl, nl, white, torch.zeros_like(white), torch.ones(B, dtype=dt), ue)
    o, lanes = y + g.eps * nl, torch.arange(B)
    light = ps._light_params(tri.numpy(), pmf.numpy())
    vertices = []
    for j in range(1, ps.max_length):
        time = None if times is None else times[lanes]
        hit = g.intersect(o, d, time=time)
        keep = torch.nonzero(hit >= 0).flatten()
        lanes, o, d, hit = lanes[keep], o[keep], d[keep], hit[keep]
        if len(lanes) == 0:
            break
        time = None if times is None else times[lanes]
        si = g.interact(hit, o, d, time)
        kd, ks, rough = g.material(si)
        eta = relative_eta(g, si)
        glass = eta > 0
        absolute = (torch.as_tensor(n_abs[lanes.numpy()] >= j)
                    & (rough > (ps.roughness_threshold or 0.0)))
        params = ps._vertex_params(si, kd, ks, rough, eta, absolute, None)
        vertices.append((lanes.numpy(), si, glass, params))
        if j == ps.max_length - 1:
            break
        wo, pdf = ps._sample(si, -d, kd, ks, rough, eta,
                             ut[lanes][:, ps.light_bsdf_dims[j - 1]], absolute)
        ok = torch.nonzero((pdf > 0) & sides_ok(si, wo, glass)).flatten()
        o, d, lanes = g.spawn(si, wo)[ok], wo[ok], lanes[ok]
    return light, vertices


def connections(ps, camera, light, light_vertices, times):
    """The lanes of each technique ``(k, s >= 2)`` whose camera vertex ``x_{t-1}`` sees light
    vertex ``y_{s-1}`` (the connection leaving and reaching each on a side its material
    allows, :func:`sides_ok`; no occluder), or, for light tracing (``t = 1``), whose vertex
    ``y_{k-1}`` the camera sees inside its image; their kernel parameters in path order
    (``x_1 .. x_{t-1}``, ``y_{s-1} .. y_1``, the light): ``{(k, s): (lanes, (P, n))}``; and
    the pixel light tracing splats each lane into, ``{(k, k): (n,)}``. ``camera``: per camera
    surface vertex ``(lanes, interactions (normals facing the camera side), dielectric
    flags, vertex parameters)``."""
    out, pixels = {}, {}
    for k, s in ps.techniques:
        t = k + 1 - s
        if s < 2 or t - 2 >= len(camera) or s - 2 >= len(light_vertices):
            continue
        ll, sl, gl, _ = light_vertices[s - 2]
        if t == 1:
            lanes, pixel = _seen_by_camera(ps, ll, sl, gl, times)
        else:
            lc, sc, gc, _ = camera[t - 2]
            lanes, ic, il = np.intersect1d(lc, ll, assume_unique=True, return_indices=True)
            if len(lanes):
                x, y = subset(sc, torch.as_tensor(ic)), subset(sl, torch.as_tensor(il))
                ok = _visible(ps, x, gc[ic], y.p, times, lanes) & sides_ok(
                    y, -_unit(y.p - x.p), gl[il])
                lanes = lanes[ok.numpy()]
        if not len(lanes):
            continue
        rows = [table[3][np.searchsorted(table[0], lanes)]
                for table in camera[:t - 1] + light_vertices[:s - 1][::-1]]
        out[k, s] = (lanes, np.ascontiguousarray(np.concatenate(rows + [light[lanes]], 1).T))
        if t == 1:
            pixels[k, s] = pixel
    return out, pixels


def _unit(v):
    return v / v.norm(dim=1, keepdim=True)


def _visible(ps, x, glass, target, times, lanes):
    """Whether the segment from interactions ``x`` to points ``target`` leaves ``x`` on a
    side its material allows and meets no surface before ``target``, (n,) bool."""
    g = ps.geometry
    w = _unit(target - x.p)
    origin = g.spawn(x, w)
    tmax = (target - origin).norm(dim=1) * (1.0 - 1e-3)
    time = None if times is None else times[torch.as_tensor(lanes)]
    return sides_ok(x, w, glass) & (g.intersect(origin, w, tmax=tmax, time=time) < 0)


def _seen_by_camera(ps, lanes, si, glass, times):
    """The lanes whose light-subpath vertex (interactions ``si``) the pinhole sees inside
    its image (in front of it, unoccluded, leaving towards it on an allowed side), and the
    pixel each lands in."""
    cam = ps.scene.camera
    local = cam.to_camera(si.p, torch.float64)  # x right, y up, z forward
    xy = cam.project(local)  # pixel coordinates, y down
    ok = ((local[:, 2] > 0) & cam.sees(xy)).numpy() & _visible(
        ps, si, glass, cam.position(torch.float64).expand_as(si.p), times, lanes).numpy()
    xy = xy.numpy()[ok]
    px = np.minimum(np.floor(xy[:, 0]).astype(np.int64), ps.width - 1)
    py = np.minimum(np.floor(xy[:, 1]).astype(np.int64), ps.height - 1)
    return lanes[ok], py * ps.width + px


# ------------------------------------------------------------------ the smooth piece
def contribution(ps, k, s, at, verts, light, time, lens=None, anchor=None):
    """The MIS-weighted contribution of technique ``(k, s)`` (RGB expressions, PSS), its
    weight, ``|det du/dw|`` (1 without a roughness threshold), the sampled directions
    (camera bounces, then light bounces) and the surface vertices ``x_1 .. x_{k-1}`` (path
    order). ``at``: coordinate index -> its variable;
    ``verts``: the surface vertices' and ``light`` the light's parameter variables (path
    order). ``lens`` (a camera vertex ``j``): the lens perturbation's path, whose vertex
    ``j`` sends its direction to the point ``anchor`` (variables) of vertex ``j + 1``'s
    triangle, and whose factor of ``|det du/dw|`` at vertex ``j`` is ``p_bsdf(omega_j)
    |cos theta_{j+1}| / d^2`` (PathSpace's unidirectional lens paths, the same rule)."""
    (s_out, s_in), ((p_out,), p_in) = bsdf.sampling_expressions("float64")
    e_vars, e_out = bsdf.bsdf_expressions("float64")
    pdfs = ((p_out, p_in), None)
    if ps._dielectric:
        (sd_out, sd_in), ((pd_out,), pd_in) = bsdf.dielectric_sampling_expressions("float64")
        pdfs = ((p_out, p_in), (pd_out, pd_in))
        d_vars, d_out = bsdf.dielectric_expressions("float64")

    def sample(ns, wi, side, du):
        env = dict(zip(("nx", "ny", "nz", "ix", "iy", "iz", "u0", "u1", "u2"), (*ns, *wi, *du)))
        return tuple(by_material(
            side.glass, lambda: sym.substitute(sd_out, {v: env.get(v.name, side.glass_mat.get(
                v.name)) for v in sd_in}),
            lambda: sym.substitute(s_out, {v: env.get(v.name, side.mat.get(v.name))
                                           for v in s_in})))

    jacobian, directions = 1.0, []

    def bounce(vp, ns, wi, side, du, at_light=None):
        """The direction leaving a vertex: absolute where flagged; ``at_light`` (the vertex's
        position, on the last bounce of a path that hits the light): towards a point of the
        light where flagged ``lightcoord``."""
        nonlocal jacobian
        wo = sample(ns, wi, side, du)
        wo, pdf = wo[:3], wo[3]
        if ps.roughness_threshold is not None:
            wo, pdf, jac = ps._absolute(vp, du, wo, pdf, ns, wi, side.mat, side.glass,
                                        side.glass_mat, *pdfs)
            if at_light is not None and ps.light_coordinates:
                wo, pdf, jac = ps._light_coordinates(vp, du, at_light, wo, pdf, jac, light, ns,
                                                     wi, side.mat, side.glass, side.glass_mat,
                                                     *pdfs)
            jacobian = jacobian * jac
        directions.extend(wo)
        return wo

    def pdf(frame, wi, wo):
        return ps._pdf_of(wo, frame.ns, wi, frame.mat, frame.glass, frame.glass_mat, *pdfs)

    def neg(a):
        return tuple(-x for x in a)

    sides = [_Material.of(ps, vp) for vp in verts]
    t = k + 1 - s
    rotation, eye, tan = ps._pinhole()
    if t >= 2:
        o, d = ps._camera_ray(at[ps._screen], at[ps._screen + 1])
    else:  # light tracing: the path ends at the pinhole
        o = tuple(sym.const(float(c)) for c in eye)
    points, hits = [o], [None]  # x_0 .. x_k; the surface vertices' hit frames
    n_camera = k - 1 if s <= _NEE else t - 1
    for i in range(1, n_camera + 1):
        p, n_g, n_s = ps._hit(o, d, verts[i - 1], time)
        points.append(p), hits.append((n_g, n_s))
        if lens is not None and i == lens + 1:  # the area measure at the fixed vertex
            jacobian = jacobian * sym.abs(dot(n_g, d))
        if lens is not None and i == lens:  # vertex j aims at the fixed vertex j + 1
            to_anchor = sub(anchor, p)
            dist2 = dot(to_anchor, to_anchor)
            wi, side = neg(d), sides[i - 1]
            d = tuple(c * sym.rsqrt(dist2) for c in to_anchor)
            jacobian = jacobian * ps._pdf_of(d, n_s, wi, side.mat, side.glass, side.glass_mat,
                                             *pdfs) / dist2
            directions.extend(d)
            o = p
        elif i < n_camera or s == _HIT:
            d = bounce(verts[i - 1], n_s, neg(d), sides[i - 1],
                       [at[int(j)] for j in ps.bsdf_dims[i - 1]],
                       p if s == _HIT and i == n_camera else None)
            o = p
    if s == _HIT:  # where the last sampled ray meets the emitter's plane
        y = ps._plane_point(o, d, *ps._light_corners(light))
        nl, area = ps._light_frame(light)
    else:
        dims = ps.light_dims[k][1:] if s == _NEE else ps.light_point_dims[1:]
        y, nl, area = ps._light_point(light, at[int(dims[0])], at[int(dims[1])])
    if s >= 2:  # the light subpath y_1 .. y_{s-1} = x_{k-1} .. x_t
        emission = (0.5, *(at[int(j)] for j in ps.emission_dims))
        d = sample(nl, nl, _EMITTER, emission)[:3]
        o, tail = y, []
        for j in range(1, s):
            p, n_g, n_s = ps._hit(o, d, verts[k - j - 1], time)
            tail.append((p, (n_g, n_s)))
            if j < s - 1:
                d = bounce(verts[k - j - 1], n_s, neg(d), sides[k - j - 1],
                           [at[int(x)] for x in ps.light_bsdf_dims[j - 1]])
                o = p
        for p, hit in tail[::-1]:
            points.append(p), hits.append(hit)
    points.append(y)
    # unit directions x_i -> x_{i+1} and squared lengths
    w, d2 = [], []
    for i in range(k):
        v = sub(points[i + 1], points[i])
        d2.append(dot(v, v))
        w.append(tuple(c * sym.rsqrt(d2[i]) for c in v))
    # each surface vertex seen from its camera-side and from its light-side neighbour: the
    # traced frame, and on a dielectric the path refracts through, the other side's
    camera_frames, light_frames = [None], [None]
    for i in range(1, k):
        traced = sides[i - 1].frame(*hits[i])
        other = sides[i - 1].across(traced, w[i - 1], w[i]) if ps._dielectric else traced
        from_camera = i <= n_camera
        camera_frames.append(traced if from_camera else other)
        light_frames.append(other if from_camera else traced)
    cos_l = -dot(nl, w[k - 1])

    def cos_at(i, toward):  # |cos| at receiving vertex x_i of the segment along ``toward``
        return cos_l if i == k else sym.abs(dot(hits[i][0], toward))

    f = [light["ler"], light["leg"], light["leb"]]
    for i in range(1, k):
        fc = camera_frames[i].bsdf(ps, neg(w[i - 1]), w[i], (e_vars, e_out),
                                   (d_vars, d_out) if ps._dielectric else None)
        g = cos_at(i + 1, w[i]) / d2[i]
        f = [f[c] * fc[c] * g for c in range(3)]
    forward = {i: pdf(camera_frames[i - 1], neg(w[i - 2]), w[i - 1]) * cos_at(i, w[i - 1])
               / d2[i - 1] for i in range(2, k + 1)}
    reverse = {k: light["pmf"] / area, k - 1: cos_l / math.pi * cos_at(k - 1, w[k - 1])
               / d2[k - 1]}
    for i in range(k - 2, 0, -1):
        reverse[i] = pdf(light_frames[i + 1], w[i + 1], neg(w[i])) * cos_at(i, w[i]) / d2[i]
    # The camera's density of x_1 (uniform screen position, pinhole) is common to every
    # technique with t >= 2 and left out of them; light tracing's is divided by it instead:
    # p_cam = cos_1 / (d_01^2 A cos_axis^3), A the image plane's area at distance 1.
    cos_axis = dot(tuple(float(rotation[r, 2]) for r in range(3)), w[0])
    area_1 = 4.0 * tan * tan * ps.height / ps.width
    p_camera = cos_at(1, w[0]) / (d2[0] * area_1 * cos_axis * cos_axis * cos_axis)
    densities = []
    # technique j: x_2 .. x_{k-j} from the camera, the rest from the light (j = k: x_1 too)
    for j in range(k + 1):
        p = 1.0
        for i in range(2, k - j + 1):
            p = p * forward[i]
        for i in range(max(k - j + 1, 1), k + 1):
            p = p * reverse[i]
        densities.append(p / p_camera if j == k else p)
    total = sym.maximum(sum(p * p for p in densities), 1e-300)
    own = densities[s]
    rgb = [sym.where(cos_l > 0.0, f[c] * own / total, 0.0) for c in range(3)]
    positions = [c for p in points[1:k] for c in p]
    return rgb, own * own / total, jacobian, directions, positions


@dataclass(frozen=True)
class _Material:
    """A surface vertex's material as the BSDF expressions read it: the opaque parameters,
    whether it is a dielectric (False in scenes without one, else an expression) and the
    dielectric's parameters (its relative index of refraction ``eta`` as seen from the side
    the vertex was traced from; a glass index on opaque vertices keeps the unused dielectric
    branch regular, as in the unidirectional techniques)."""

    mat: dict
    glass: object
    glass_mat: dict

    @classmethod
    def of(cls, ps, vp):
        mat = {nm: vp[nm] for nm in _MATERIAL}
        if not ps._dielectric:
            return cls(mat, False, {})
        glass = vp["eta"] > 0.0
        return cls(mat, glass, {"eta": sym.where(glass, vp["eta"], 1.5), "rough": vp["rough"]})

    def frame(self, ng, ns):
        return _Frame(ng, ns, self.mat, self.glass, self.glass_mat)

    def across(self, frame, w_in, w_out):
        """``frame`` seen from the other neighbour of a vertex the path arrives at along
        ``w_in`` and leaves along ``w_out``: on a refraction (the neighbours on opposite sides
        of the surface) the normals flip and the relative index inverts; unchanged on a
        reflection."""
        refracts = dot(frame.ng, w_in) * dot(frame.ng, w_out) > 0.0
        ng = tuple(sym.where(refracts, -x, x) for x in frame.ng)
        ns = tuple(sym.where(refracts, -x, x) for x in frame.ns)
        eta = self.glass_mat["eta"]
        return _Frame(ng, ns, self.mat, self.glass,
                      {"eta": sym.where(refracts, 1.0 / eta, eta), "rough": self.mat["rough"]})


@dataclass(frozen=True)
class _Frame:
    """A surface vertex's normals facing one neighbour, with its material as seen from there."""

    ng: tuple
    ns: tuple
    mat: dict
    glass: object
    glass_mat: dict

    def bsdf(self, ps, wi, wo, opaque, dielectric):
        """BSDF * cos (RGB) for a viewer along ``wi`` (on this frame's side) and light along
        ``wo``; the dielectric's is grey, reflection or transmission by the side of ``wo``."""
        def grey():
            d_vars, d_out = dielectric
            return ps._bsdf(d_vars, [d_out], self.ns, self.ng, wi, wo, self.glass_mat) * 3

        return by_material(self.glass, grey,
                           lambda: ps._bsdf(*opaque, self.ns, self.ng, wi, wo, self.mat))


# the emission lobe: edge_rt's BSDF sampling of a white Lambertian around the light normal
_EMITTER = _Material({"kdr": 1.0, "kdg": 1.0, "kdb": 1.0, "ksr": 0.0, "ksg": 0.0, "ksb": 0.0,
                      "rough": 1.0}, False, {})
