"""Bidirectional path tracing in primary sample space (spec 1.2, 1.4; Veach's BDPT with
Kelemen's states): the techniques ``(k, s)`` with ``s >= 2`` light-subpath vertices, and the
power-heuristic MIS weights over all ``s = 0 .. k - 1`` of a path of ``k`` segments.

A state carries, beside the camera subpath's numbers, a light subpath's: a light point (the
triangle pick and two area coordinates, edge_rt's ``Geometry.sample_light``), a
cosine-distributed emission direction (two numbers) and three numbers per bounce (edge_rt's
BSDF sampling). Technique ``(k, s)`` with ``t = k + 1 - s`` connects camera vertex
``x_{t-1}`` to light vertex ``y_{s-1}`` by a visibility ray; ``t >= 2`` (light tracing to the
camera, ``t = 1``, splats to another pixel and is left out, so the weights are normalised
over ``s <= k - 1``).

Each technique's contribution is one core_ad expression of its numbers, written in area
measure: ``C_s = f(x) p_s(x) / sum_j p_j(x)^2`` with ``f`` the path's measurement
contribution (emitted radiance, BRDF * cos at each surface vertex with the viewer towards the
camera, ``|cos| / d^2`` at each receiving vertex) and ``p_j`` the area density with which
technique ``j`` samples the same path (forward BSDF pdfs on the camera side, the light's
area pdf, the emission pdf and reverse BSDF pdfs on the light side; the camera vertex's and
``x_1``'s densities are common to all and cancel). Evaluating ``f`` in full instead of
propagating a light subpath's throughput keeps the shading-normal asymmetry of light
transport exact with no adjoint BSDF. The camera factor cancels against the pixel's, as in
the unidirectional techniques (``C`` is the PSS contribution ``f / p``).

The modified parameterisation (spec 5.1 (i), 5.2) covers both subpaths: on the bounce
vertices a state's technique samples (camera ``x_1 .. x_{t-2}``, light ``y_1 .. y_{s-2}``)
that are rougher than the threshold, the direction numbers are absolute spherical coordinates
and ``|det du/dw|`` gains the vertex's ``p_bsdf 2 pi^2 sin phi`` (the light side's pdf is the
one that sampled it, towards the camera). The emission direction stays a cosine sample (its
two numbers are the light's own, in either coordinates), and light coordinates (5.1 (ii))
and the lens perturbation are not written for these techniques (PathSpace refuses them).

Opaque surfaces only: a dielectric's reverse pdf and its radiance scaling across the
interface are not written yet (PathSpace refuses the combination).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from core_ad import sym
from edge_rt import bsdf

from ._vector import dot, sub

_HIT, _NEE = 0, 1  # the unidirectional techniques (PathSpace's HIT and NEE)
_MATERIAL = ("kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")
# the emission lobe: edge_rt's BSDF sampling of a white Lambertian around the light normal
_EMITTER = {"kdr": 1.0, "kdg": 1.0, "kdb": 1.0, "ksr": 0.0, "ksg": 0.0, "ksb": 0.0,
            "rough": 1.0}


def layout(first, max_length):
    """The light subpath's coordinates from index ``first`` of ``u``: light point (3),
    emission direction (2) and one BSDF sample per light vertex that sends its subpath on
    (``max_length - 3``); ``(point, emission, bounces, end)``."""
    point = first + np.arange(3)
    emission = first + 3 + np.arange(2)
    bounces = [first + 5 + 3 * b + np.arange(3) for b in range(max(max_length - 3, 0))]
    return point, emission, bounces, first + 5 + 3 * max(max_length - 3, 0)


def techniques(lengths):
    """Every ``(k, s)``, ``s = 0 .. k - 1``, in the order of ``Paths.contrib``'s axis."""
    return [(k, s) for k in lengths for s in range(k)]


def dims(ps, k, s):
    """The coordinates technique ``(k, s >= 2)`` reads: the screen, the camera subpath's
    ``t - 2`` bounces, the light point, the emission and the light subpath's ``s - 2``
    bounces."""
    t = k + 1 - s
    return np.concatenate([np.arange(ps._screen + 2)] + ps.bsdf_dims[:t - 2]
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
    2, ...``: ``(lanes there, point, geometric normal facing the light side, vertex
    parameters)``. ``n_abs`` (B,): the lane's light bounces in absolute coordinates where
    rougher than the threshold (:func:`light_bounces`; zeros in PSS)."""
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
    for j in range(1, ps.max_length - 1):
        time = None if times is None else times[lanes]
        hit = g.intersect(o, d, time=time)
        keep = torch.nonzero(hit >= 0).flatten()
        lanes, o, d, hit = lanes[keep], o[keep], d[keep], hit[keep]
        if len(lanes) == 0:
            break
        time = None if times is None else times[lanes]
        si = g.interact(hit, o, d, time)
        kd, ks, rough = g.material(si)
        eta = torch.zeros(len(lanes), dtype=dt)
        absolute = (torch.as_tensor(n_abs[lanes.numpy()] >= j)
                    & (rough > (ps.roughness_threshold or 0.0)))
        params = ps._vertex_params(si, kd, ks, rough, eta, absolute, None)
        vertices.append((lanes.numpy(), si.p, si.ng, params))
        if j == ps.max_length - 2:
            break
        wo, pdf = ps._sample(si, -d, kd, ks, rough, eta,
                             ut[lanes][:, ps.light_bsdf_dims[j - 1]], absolute)
        ok = torch.nonzero((pdf > 0) & ((si.ng * wo).sum(1) > 0)).flatten()
        o, d, lanes = g.spawn(si, wo)[ok], wo[ok], lanes[ok]
    return light, vertices


def connections(ps, camera, light, light_vertices, times):
    """The lanes of each technique ``(k, s >= 2)`` whose camera vertex ``x_{t-1}`` sees light
    vertex ``y_{s-1}`` (both on the side the connection leaves / reaches, no occluder), and
    their kernel parameters in path order (``x_1 .. x_{t-1}``, ``y_{s-1} .. y_1``, the
    light): ``{(k, s): (lanes, (P, n))}``. ``camera``: per camera surface vertex ``(lanes,
    point, geometric normal facing the camera side, vertex parameters)``."""
    g, out = ps.geometry, {}
    for k, s in ps.techniques:
        t = k + 1 - s
        if s < 2 or t - 2 >= len(camera) or s - 2 >= len(light_vertices):
            continue
        lc, pc, ngc, _ = camera[t - 2]
        ll, pl, ngl, _ = light_vertices[s - 2]
        lanes, ic, il = np.intersect1d(lc, ll, assume_unique=True, return_indices=True)
        if not len(lanes):
            continue
        x, y, n_x, n_y = pc[ic], pl[il], ngc[ic], ngl[il]
        to = y - x
        w = to / to.norm(dim=1, keepdim=True)
        origin = x + g.eps * n_x
        tmax = (y - origin).norm(dim=1) * (1.0 - 1e-3)
        time = None if times is None else times[torch.as_tensor(lanes)]
        blocked = g.intersect(origin, w, tmax=tmax, time=time) >= 0
        ok = ((n_x * w).sum(1) > 0) & ((n_y * w).sum(1) < 0) & ~blocked
        lanes = lanes[ok.numpy()]
        if not len(lanes):
            continue
        rows = [table[3][np.searchsorted(table[0], lanes)]
                for table in camera[:t - 1] + light_vertices[:s - 1][::-1]]
        out[k, s] = (lanes, np.ascontiguousarray(np.concatenate(rows + [light[lanes]], 1).T))
    return out


# ------------------------------------------------------------------ the smooth piece
def contribution(ps, k, s, at, verts, light, time):
    """The MIS-weighted contribution of technique ``(k, s)`` (RGB expressions, PSS), its
    weight, ``|det du/dw|`` (1 without a roughness threshold) and the sampled directions
    (camera bounces, then light bounces). ``at``: coordinate index -> its variable;
    ``verts``: the surface vertices' and ``light`` the light's parameter variables (path
    order)."""
    (s_out, s_in), ((p_out,), p_in) = bsdf.sampling_expressions("float64")
    e_vars, e_out = bsdf.bsdf_expressions("float64")

    def sample(ns, wi, mat, du):
        env = dict(zip(("nx", "ny", "nz", "ix", "iy", "iz", "u0", "u1", "u2"), (*ns, *wi, *du)))
        return tuple(sym.substitute(s_out, {v: env.get(v.name, mat.get(v.name))
                                            for v in s_in}))

    jacobian, directions = 1.0, []

    def bounce(vp, ns, wi, mat, du):  # the direction leaving a vertex, absolute where flagged
        nonlocal jacobian
        wo = sample(ns, wi, mat, du)
        wo, pdf = wo[:3], wo[3]
        if ps.roughness_threshold is not None:
            wo, _, jac = ps._absolute(vp, du, wo, pdf, ns, wi, mat, False, None,
                                      (p_out, p_in), None)
            jacobian = jacobian * jac
        directions.extend(wo)
        return wo

    def pdf(ns, wi, wo, mat):
        return ps._pdf_of(wo, ns, wi, mat, False, None, (p_out, p_in), None)

    def neg(a):
        return tuple(-x for x in a)

    mats = [{nm: vp[nm] for nm in _MATERIAL} for vp in verts]
    t = k + 1 - s
    o, d = ps._camera_ray(at[ps._screen], at[ps._screen + 1])
    points, ng, ns = [o], [None], [None]  # x_0 .. x_k
    n_camera = k - 1 if s <= _NEE else t - 1
    for i in range(1, n_camera + 1):
        p, n_g, n_s = ps._hit(o, d, verts[i - 1], time)
        points.append(p), ng.append(n_g), ns.append(n_s)
        if i < n_camera or s == _HIT:
            d = bounce(verts[i - 1], n_s, neg(d), mats[i - 1],
                       [at[int(j)] for j in ps.bsdf_dims[i - 1]])
            o = p
    if s == _HIT:  # where the last sampled ray meets the emitter's plane
        y = ps._plane_point(o, d, *ps._light_corners(light))
        nl, area = ps._light_frame(light)
    else:
        dims = ps.light_dims[k][1:] if s == _NEE else ps.light_point_dims[1:]
        y, nl, area = ps._light_point(light, at[int(dims[0])], at[int(dims[1])])
    if s >= 2:  # the light subpath y_1 .. y_{s-1} = x_{k-1} .. x_t
        d = sample(nl, nl, _EMITTER, (0.5, *(at[int(j)] for j in ps.emission_dims)))[:3]
        o, tail = y, []
        for j in range(1, s):
            p, n_g, n_s = ps._hit(o, d, verts[k - j - 1], time)
            tail.append((p, n_g, n_s))
            if j < s - 1:
                d = bounce(verts[k - j - 1], n_s, neg(d), mats[k - j - 1],
                           [at[int(x)] for x in ps.light_bsdf_dims[j - 1]])
                o = p
        for p, n_g, n_s in tail[::-1]:
            points.append(p), ng.append(n_g), ns.append(n_s)
    points.append(y)
    mats = [None] + mats
    # unit directions x_i -> x_{i+1} and squared lengths
    w, d2 = [], []
    for i in range(k):
        v = sub(points[i + 1], points[i])
        d2.append(dot(v, v))
        w.append(tuple(c * sym.rsqrt(d2[i]) for c in v))
    cos_l = -dot(nl, w[k - 1])

    def cos_at(i, toward):  # |cos| at receiving vertex x_i of the segment along ``toward``
        return cos_l if i == k else sym.abs(dot(ng[i], toward))

    f = [light["ler"], light["leg"], light["leb"]]
    for i in range(1, k):
        fc = ps._bsdf(e_vars, e_out, ns[i], ng[i], neg(w[i - 1]), w[i], mats[i])
        g = cos_at(i + 1, w[i]) / d2[i]
        f = [f[c] * fc[c] * g for c in range(3)]
    forward = {i: pdf(ns[i - 1], neg(w[i - 2]), w[i - 1], mats[i - 1]) * cos_at(i, w[i - 1])
               / d2[i - 1] for i in range(2, k + 1)}
    reverse = {k: light["pmf"] / area}
    if k - 1 >= 2:
        reverse[k - 1] = cos_l / math.pi * cos_at(k - 1, w[k - 1]) / d2[k - 1]
    for i in range(k - 2, 1, -1):
        reverse[i] = pdf(ns[i + 1], w[i + 1], neg(w[i]), mats[i + 1]) * cos_at(i, w[i]) / d2[i]
    densities = []
    for j in range(k):  # technique j: x_2 .. x_{k-j} from the camera, the rest from the light
        p = 1.0
        for i in range(2, k - j + 1):
            p = p * forward[i]
        for i in range(k - j + 1, k + 1):
            p = p * reverse[i]
        densities.append(p)
    total = sym.maximum(sum(p * p for p in densities), 1e-300)
    own = densities[s]
    rgb = [sym.where(cos_l > 0.0, f[c] * own / total, 0.0) for c in range(3)]
    return rgb, own * own / total, jacobian, directions
