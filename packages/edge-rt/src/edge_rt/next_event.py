"""Next-event estimation (one light sample per lane, power-heuristic MIS) in two compiled
kernels: the sampled point's geometry without derivatives (shadow ray and MIS weight, held
constant, spec 5.3), and the contribution with its VJP and JVP. The autograd graph then holds
one node for the whole light sample instead of ~30 torch operations per bounce.

Light points use the barycentric parameterisation of ``Geometry.sample_light``: they move
with the light's vertices, and the light's area Jacobian is differentiated. A textured
envmap is sampled too (``next_event_environment``): directions by the texels' luminance, the
radiance differentiated with respect to the texels, the direction and pdf held constant."""

from __future__ import annotations

import numpy as np
import torch

from core_ad import sym

from . import bsdf
from ._compiled import CompiledOp, columns, run_kernel


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _towards_light(p, a, b, c, u1, u2):
    """The point y of triangle (a, b, c) picked by uniforms (u1, u2), the direction to it,
    its squared distance, the cosine at the light (positive on its front side) and the
    triangle's area."""
    su = sym.sqrt(u1)
    b0, b1 = 1.0 - su, u2 * su
    b2 = 1.0 - b0 - b1
    y = [b0 * a[i] + b1 * b[i] + b2 * c[i] for i in range(3)]
    to_light = [y[i] - p[i] for i in range(3)]
    dist2 = _dot(to_light, to_light)
    dist = sym.sqrt(dist2)
    wo = [x / dist for x in to_light]
    e1 = [b[i] - a[i] for i in range(3)]
    e2 = [c[i] - a[i] for i in range(3)]
    cross = [e1[1] * e2[2] - e1[2] * e2[1], e1[2] * e2[0] - e1[0] * e2[2],
             e1[0] * e2[1] - e1[1] * e2[0]]
    length = sym.sqrt(_dot(cross, cross))
    return y, wo, dist2, -_dot(cross, wo) / length, 0.5 * length


def _vec(prefix, dtype):
    return [sym.var(f"{prefix}{c}", dtype) for c in "xyz"]


def _shadow_ray(p, ng, a, b, c, u1, u2, pmf, eps):
    """A light sample's direction ``wo``, its cosines at the light and the surface, the
    shadow ray's origin (Geometry.spawn's offset: along the normal, to the side the ray
    leaves to) and tmax (just short of the light), the light-sampling pdf in solid angle,
    and the light's area as seen from ``p`` (cos_l area / dist^2, 0 behind the light)."""
    y, wo, dist2, cos_l, area = _towards_light(p, a, b, c, u1, u2)
    cos_g = _dot(ng, wo)
    offset = sym.where(cos_g >= 0.0, eps, -eps)
    origin = [p[i] + offset * ng[i] for i in range(3)]
    gap = [y[i] - origin[i] for i in range(3)]
    tmax = sym.sqrt(_dot(gap, gap)) * (1.0 - 1e-3)
    p_light = pmf / area * dist2 / sym.maximum(cos_l, 1e-12)
    return wo, cos_l, cos_g, origin, tmax, p_light, sym.maximum(cos_l, 0.0) / dist2 * area


def _shadow_ray_expressions(dtype, two_sided):
    """(p, ng, a, b, c, u1, u2, pmf, eps) -> shadow ray origin (3), direction (3), its tmax,
    the light-sampling pdf in solid angle, and 1 where the sample can contribute (0 else):
    lights on the viewer's side only, or on either side (``two_sided``, a dielectric, whose
    BSDF decides between reflection and transmission)."""
    p, ng, a, b, c = (_vec(k, dtype) for k in ("p", "g", "a", "b", "c"))
    u1, u2, pmf, eps = (sym.var(k, dtype) for k in ("u1", "u2", "pmf", "eps"))
    wo, cos_l, cos_g, origin, tmax, p_light, _ = _shadow_ray(p, ng, a, b, c, u1, u2, pmf, eps)
    usable = sym.logical_and(cos_l > 0.0, pmf > 0.0)
    if not two_sided:
        usable = sym.logical_and(usable, cos_g > 0.0)
    outputs = origin + wo + [tmax, p_light, sym.where(usable, sym.const(1.0, dtype), sym.const(0.0, dtype))]
    return p + ng + a + b + c + [u1, u2, pmf, eps], outputs


_SHADOW_RAY: dict = {}


def shadow_rays(p, ng, light_corners, u, pmf, eps, two_sided=False):
    """Detached (origin (N, 3), direction (N, 3), tmax (N,), light pdf (N,), usable (N,)
    bool) for light points ``u`` (N, 2) on triangles with corners ``light_corners`` (a, b,
    c; (N, 3) each)."""
    dtype = str(p.dtype).removeprefix("torch.")
    key = (dtype, two_sided)
    if key not in _SHADOW_RAY:
        inputs, outputs = _shadow_ray_expressions(dtype, two_sided)
        _SHADOW_RAY[key] = sym.compile(outputs, inputs)
    if p.shape[0] == 0:
        out = p.new_zeros(0, 9)
    else:
        cols = columns([p, ng, *light_corners, u, pmf[:, None]])
        out = run_kernel(_SHADOW_RAY[key], [*cols, np.asarray(eps, dtype=dtype)], p.shape[0])
    return out[:, :3], out[:, 3:6], out[:, 6], out[:, 7], out[:, 8] > 0


def _contribution_expressions(dtype):
    """BSDF * cos * emission * geometry term * weight of the light point: the BSDF's
    expressions with the light direction substituted."""
    v, f = bsdf.bsdf_expressions(dtype)
    p, a, b, c, le = (_vec(k, dtype) for k in ("p", "a", "b", "c", "e"))
    u1, u2, weight = (sym.var(k, dtype) for k in ("u1", "u2", "weight"))
    _, wo, dist2, cos_l, area = _towards_light(p, a, b, c, u1, u2)
    f = sym.substitute(f, {v["ox"]: wo[0], v["oy"]: wo[1], v["oz"]: wo[2]})
    scale = sym.maximum(cos_l, 0.0) / dist2 * area * weight
    inputs = (p + [v[k] for k in ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz",
                                  "kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")]
              + a + b + c + [u1, u2] + le + [weight])
    return inputs, [f[k] * le[k] * scale for k in range(3)]


# (p, ns, ng, wi, kd, ks, rough (N, 1), light vertices a, b, c, light uniforms (N, 2),
# emission, weight (N, 1)) -> contribution (N, 3). The geometric normal only gates grazing
# angles; the uniforms and the weight (MIS / pmf, visibility) are held constant.
CONTRIBUTION = CompiledOp(_contribution_expressions, (3, 3, 3, 3, 3, 3, 1, 3, 3, 3, 2, 3, 1),
                          (3,), differentiable=(True, True, False, True, True, True, True,
                                                True, True, True, False, True, False))


def _dielectric_contribution_expressions(dtype):
    """As ``_contribution_expressions`` with the rough dielectric's BSDF (colourless: one
    expression times the RGB emission)."""
    v, f = bsdf.dielectric_expressions(dtype)
    p, a, b, c, le = (_vec(k, dtype) for k in ("p", "a", "b", "c", "e"))
    u1, u2, weight = (sym.var(k, dtype) for k in ("u1", "u2", "weight"))
    _, wo, dist2, cos_l, area = _towards_light(p, a, b, c, u1, u2)
    f = sym.substitute(f, {v["ox"]: wo[0], v["oy"]: wo[1], v["oz"]: wo[2]})
    scale = f * sym.maximum(cos_l, 0.0) / dist2 * area * weight
    inputs = (p + [v[k] for k in ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz", "eta",
                                  "rough")]
              + a + b + c + [u1, u2] + le + [weight])
    return inputs, [le[k] * scale for k in range(3)]


# (p, ns, ng, wi, relative eta (N, 1), rough (N, 1), light vertices a, b, c, light uniforms
# (N, 2), emission, weight (N, 1)) -> contribution (N, 3).
DIELECTRIC_CONTRIBUTION = CompiledOp(
    _dielectric_contribution_expressions, (3, 3, 3, 3, 1, 1, 3, 3, 3, 2, 3, 1), (3,),
    differentiable=(True, True, False, True, True, True, True, True, True, False, True, False))


def light_sample_expressions(dtype):
    """Next-event estimation at an opaque surface as values only (the forward render, no
    derivatives): the shadow ray (origin, direction, tmax) and the contribution it carries if
    unblocked, MIS weight and 1 / pmf included (zero where the sample cannot contribute).
    What ``shadow_rays``, ``bsdf.pdf``, ``power_heuristic`` and ``CONTRIBUTION`` compute
    apart for the replay, in one pass. Inputs: p, ns, ng, wi, kd, ks, rough, light vertices
    a, b, c, light uniforms (lu1, lu2), pmf, emission, eps, as named vars."""
    v, f = bsdf.bsdf_expressions(dtype)
    _, ((p_of,), _) = bsdf.sampling_expressions(dtype)
    p, a, b, c, le = (_vec(k, dtype) for k in ("p", "a", "b", "c", "e"))
    ng = [v["gx"], v["gy"], v["gz"]]
    u1, u2, pmf, eps = (sym.var(k, dtype) for k in ("lu1", "lu2", "pmf", "eps"))
    wo, cos_l, cos_g, origin, tmax, p_light, solid = _shadow_ray(p, ng, a, b, c, u1, u2, pmf,
                                                                 eps)
    to_wo = {v["ox"]: wo[0], v["oy"]: wo[1], v["oz"]: wo[2]}
    p_bsdf = sym.substitute(p_of, to_wo)
    usable = sym.logical_and(sym.logical_and(cos_l > 0.0, pmf > 0.0), cos_g > 0.0)
    a2, b2 = p_light * p_light, p_bsdf * p_bsdf
    mis = sym.where(a2 + b2 > 0.0, a2 / sym.maximum(a2 + b2, 1e-30), 0.0)
    weight = sym.where(usable, mis / sym.maximum(pmf, 1e-30), 0.0)
    scale = solid * weight
    f = sym.substitute(f, to_wo)
    inputs = (p + [v[k] for k in ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz",
                                  "kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")]
              + a + b + c + [u1, u2, pmf] + le + [eps])
    return inputs, origin + wo + [tmax] + [f[k] * le[k] * scale for k in range(3)]


def power_heuristic(a, b):
    """MIS weight a^2 / (a^2 + b^2) of the strategy with pdf ``a`` (0 where both are 0)."""
    a2, b2 = a * a, b * b
    return torch.where(a2 + b2 > 0, a2 / torch.clamp(a2 + b2, min=1e-300), torch.zeros_like(a))


def _light_sample(g, si, u, two_sided):
    """One light sample per interaction: (triangle, its corners, direction, light pdf,
    pmf, usable and visible)."""
    tri, pmf = g.pick_light(u[:, 0])
    corners = g.corners(tri)
    origin, wo, tmax, p_light, usable = shadow_rays(si.p, si.ng, corners, u[:, 1:], pmf,
                                                    g.eps, two_sided)
    visible = ~g.occluded(origin, wo, tmax)
    return tri, corners, wo, p_light, pmf, usable & visible


def next_event(g, si, wi, kd, ks, rough, u):
    """Radiance (N, 3) reaching the interactions ``si`` from one light sample each, weighted
    by the power heuristic against BSDF sampling; ``u`` (N, 3) uniforms (u[:, 0] picks the
    triangle)."""
    tri, corners, wo, p_light, pmf, ok = _light_sample(g, si, u, False)
    p_bsdf = bsdf.pdf(si.ns, wi, wo, kd, ks, rough)
    weight = torch.where(ok, power_heuristic(p_light, p_bsdf) / pmf, 0.0)
    return CONTRIBUTION(si.p, si.ns, si.ng, wi, kd, ks, rough[:, None], *corners, u[:, 1:],
                        g.light_emission(tri), weight[:, None])[0]


def next_event_dielectric(g, si, wi, eta, rough, u):
    """``next_event`` at rough dielectric interactions (``eta`` the relative index, (N,)):
    lights on either side of the surface, reflected or transmitted (the BSDF rejects light
    leaks, where the shading and geometric normals disagree on the side)."""
    tri, corners, wo, p_light, pmf, ok = _light_sample(g, si, u, True)
    p_bsdf = bsdf.pdf_dielectric(si.ns, wi, wo, eta, rough)
    weight = torch.where(ok, power_heuristic(p_light, p_bsdf) / pmf, 0.0)
    return DIELECTRIC_CONTRIBUTION(si.p, si.ns, si.ng, wi, eta[:, None], rough[:, None],
                                   *corners, u[:, 1:], g.light_emission(tri),
                                   weight[:, None])[0]


def next_event_environment(g, si, wi, kd, ks, rough, u):
    """Radiance (N, 3) reaching the (opaque) interactions ``si`` from one envmap direction
    each (``Geometry.sample_environment`` from uniforms ``u`` (N, 3)), weighted by the power
    heuristic against BSDF sampling (whose escaped rays ``trace`` weights to match)."""
    wo, p_env = g.sample_environment(u)
    cos_g = (si.ng.detach() * wo).sum(1)
    usable = (cos_g > 0.0) & (p_env > 0.0)
    rows = torch.nonzero(usable).flatten()
    visible = torch.zeros_like(usable)
    if len(rows):  # shadow rays to infinity
        origin = g.spawn(si, wo).detach()
        hit = g.intersect(origin.index_select(0, rows), wo.index_select(0, rows))
        visible = visible.index_fill(0, rows.index_select(0, torch.nonzero(hit < 0).flatten()),
                                     True)
    p_bsdf = bsdf.pdf(si.ns, wi, wo, kd, ks, rough)
    weight = torch.where(visible, power_heuristic(p_env, p_bsdf)
                         / torch.clamp(p_env, min=1e-300), 0.0)
    f = bsdf.evaluate(si.ns, si.ng, wi, wo, kd, ks, rough)
    return f * g.environment(wo) * weight[:, None]

