"""Wavefront path tracer: next-event estimation with MIS (power heuristic), BSDF sampling,
maximum depth, box pixel filter. The same code runs without autograd (forward render) and
with it (the backward pass differentiates each chunk's path contributions; the BSDF's VJP is
a core_ad compiled kernel).

Which quantities are held constant when differentiating (all unbiased, spec 5.3): sampled
BSDF directions, BSDF and light-selection pdfs, MIS weights, hit triangle ids and shadow-ray
visibility. Light sample points move with the light's vertices (barycentric
parameterisation) and the light's area Jacobian is differentiated.
"""

from __future__ import annotations

import numpy as np
import torch

from . import bsdf
from .geometry import Geometry

OUTPUTS = ("radiance", "depth", "position", "normal", "albedo")
CHANNELS = {"radiance": 3, "depth": 1, "position": 3, "normal": 3, "albedo": 3}


# Random numbers are drawn per block of this many paths, so the streams do not depend on how
# a render is cut into chunks (forward and backward replay chunk differently).
STREAM_BLOCK = 4096


def uniforms(seed, start, n, k, *stream):
    """(n, k) uniforms for paths start..start+n of a render's stream ``(seed, *stream)``."""
    blocks = []
    first = start // STREAM_BLOCK * STREAM_BLOCK
    for b in range(first, start + n, STREAM_BLOCK):
        u = np.random.default_rng([*seed, b, *stream]).random((STREAM_BLOCK, k))
        lo, hi = max(start - b, 0), min(start + n - b, STREAM_BLOCK)
        blocks.append(u[lo:hi])
    return np.concatenate(blocks) if blocks else np.zeros((0, k))


class Sampler:
    """Deterministic uniforms per (seed, path index, purpose, bounce) for the paths
    start..start+n; ``repeat`` tiles each draw so that lanes k, k + n, ... share random
    numbers (the two sides of an edge sample)."""

    def __init__(self, seed, start, n, repeat=1):
        self.seed = tuple(np.atleast_1d(seed).tolist())
        self.start, self.n, self.repeat = start, n, repeat

    def uniform(self, purpose, bounce, k, dtype):
        u = torch.as_tensor(uniforms(self.seed, self.start, self.n, k, purpose, bounce))
        u = u.to(dtype)
        return u.repeat(self.repeat, 1) if self.repeat > 1 else u


_PIXEL, _LIGHT, _BSDF = 0, 1, 2


def _mis(a, b):
    a2, b2 = a * a, b * b
    return torch.where(a2 + b2 > 0, a2 / torch.clamp(a2 + b2, min=1e-300), torch.zeros_like(a))


def trace(scene, geometry: Geometry, xy, sampler: Sampler, max_depth=2, output="radiance"):
    """Per-lane values (N, C) for screen points ``xy`` (N, 2) in pixels."""
    g, dt = geometry, geometry.dtype
    n = xy.shape[0]
    o, d, valid = scene.camera.rays(xy, dt)
    if output != "radiance":
        return _aov(g, o, d, valid, output)
    radiance = torch.zeros((n, 3), dtype=dt)
    beta = torch.ones((n, 3), dtype=dt)
    lanes = torch.nonzero(valid).flatten()
    prev_pdf = None
    travelled = torch.zeros(n, dtype=dt)
    pixel_angle = 2.0 * float(torch.tan(scene.camera.fov.detach() * np.pi / 360.0)) / (
        scene.camera.width)
    o, d = o[lanes], d[lanes]
    has_lights = len(g.light_tris) > 0
    for depth in range(max_depth + 1):
        if len(lanes) == 0:
            break
        tri = g.intersect(o, d)
        hit = tri >= 0
        miss = torch.nonzero(~hit).flatten()
        if len(miss) and scene.envmap is not None:
            radiance = radiance.index_add(0, lanes[miss], beta[lanes[miss]] *
                                          g.environment(d[miss]))
        keep = torch.nonzero(hit).flatten()
        lanes, o, d, tri = lanes[keep], o[keep], d[keep], tri[keep]
        if prev_pdf is not None:
            prev_pdf = prev_pdf[keep]
        if len(lanes) == 0:
            break
        si = g.interact(tri, o, d)
        travelled = travelled.index_add(0, lanes, si.t.detach())
        wi = -d
        if has_lights:
            le = g.emission(si)
            if depth > 0:
                cos_l = torch.clamp((si.ng.detach() * wi.detach()).sum(1), min=1e-12)
                p_light = (g.light_pmf[tri].to(dt) / si.area.detach() * si.t.detach() ** 2
                           / cos_l)
                le = le * _mis(prev_pdf, p_light)[:, None]
            radiance = radiance.index_add(0, lanes, beta[lanes] * le)
        if depth == max_depth:
            break
        kd, ks, rough = g.material(si, footprint=travelled[lanes] * pixel_angle)
        b = beta[lanes]
        if has_lights:
            radiance = radiance.index_add(
                0, lanes, b * _next_event(g, si, wi, kd, ks, rough,
                                         sampler.uniform(_LIGHT, depth, 3, dt)[lanes]))
        u = sampler.uniform(_BSDF, depth, 3, dt)[lanes]
        # Held constant (spec 5.3): the compiled sampler returns plain tensors, and the MIS
        # weights below are detached (not no_grad(), which forward mode would ignore).
        wo, pdf = bsdf.sample(si.ns, wi, kd, ks, rough, u)
        f = bsdf.evaluate(si.ns, si.ng, wi, wo, kd, ks, rough)
        ok = (pdf > 0) & ((si.ng.detach() * wo).sum(1) > 0)
        new_beta = b * f / torch.where(ok, pdf, torch.ones_like(pdf))[:, None]
        beta = beta.index_copy(0, lanes, torch.where(ok[:, None], new_beta,
                                                     torch.zeros_like(new_beta)))
        keep = torch.nonzero(ok).flatten()
        o = g.spawn(si, wo)[keep]
        lanes, d, prev_pdf = lanes[keep], wo[keep], pdf[keep]
    return radiance


def _next_event(g, si, wi, kd, ks, rough, u):
    dt = g.dtype
    tri, y, nl, area, pmf = g.sample_light(u)
    to_light = y - si.p
    dist2 = (to_light * to_light).sum(1)
    dist = torch.sqrt(dist2)
    wo = to_light / dist[:, None]
    cos_l = -(nl * wo).sum(1)
    origin = g.spawn(si, wo)
    with torch.no_grad():
        tmax = (y - origin).norm(dim=1) * (1.0 - 1e-3)
        blocked = g.intersect(origin, wo, tmax=tmax) >= 0
        ok = (~blocked) & (cos_l > 0) & (pmf > 0) & ((si.ng * wo).sum(1) > 0)
        p_light = pmf / area * dist2 / torch.clamp(cos_l, min=1e-12)
        p_bsdf = bsdf.pdf(si.ns, wi, wo, kd, ks, rough)
        weight = torch.where(ok, _mis(p_light, p_bsdf), torch.zeros_like(p_light)).detach()
    le = torch.zeros((si.p.shape[0], 3), dtype=dt)
    for mi, m in enumerate(g.scene.meshes):
        if m.emission is None:
            continue
        sel = torch.nonzero(g.mesh_of[tri] == mi).flatten()
        if len(sel):
            le = le.index_copy(0, sel, m.emission.to(dt).expand(len(sel), 3))
    f = bsdf.evaluate(si.ns, si.ng, wi, wo, kd, ks, rough)
    geo = torch.clamp(cos_l, min=0.0) / dist2 * area / torch.clamp(pmf, min=1e-300)
    return f * le * (geo * weight)[:, None]


def _aov(g, o, d, valid, output):
    n, dt = o.shape[0], g.dtype
    out = torch.zeros((n, CHANNELS[output]), dtype=dt)
    lanes = torch.nonzero(valid).flatten()
    tri = g.intersect(o[lanes], d[lanes])
    keep = torch.nonzero(tri >= 0).flatten()
    lanes, tri = lanes[keep], tri[keep]
    if len(lanes) == 0:
        return out
    si = g.interact(tri, o[lanes], d[lanes])
    if output == "depth":
        value = si.t[:, None]
    elif output == "position":
        value = si.p
    elif output == "normal":
        value = si.ns
    else:
        value = g.material(si)[0]
    return out.index_copy(0, lanes, value)
