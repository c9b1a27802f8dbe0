"""Wavefront path tracer: next-event estimation with MIS (power heuristic), BSDF sampling,
maximum depth, box pixel filter. The same code runs without autograd (forward render) and
with it (the backward pass differentiates each chunk's path contributions). Each bounce is a
few compiled core_ad kernels with their VJPs and JVPs (hit point, BOUNCE, next-event
estimation) between index_select compactions of the live paths.

Which quantities are held constant when differentiating (all unbiased, spec 5.3): sampled
BSDF directions, BSDF and light-selection pdfs, MIS weights, hit triangle ids and shadow-ray
visibility. Light sample points move with the light's vertices (barycentric
parameterisation) and the light's area Jacobian is differentiated.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from core_ad import sym

from . import bsdf
from ._compiled import CompiledOp
from .geometry import Geometry, Interaction
from .next_event import (light_sample_expressions, next_event, next_event_dielectric,
                         next_event_environment, power_heuristic)

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


def uniforms_at(seed, paths, k, *stream):
    """The rows of ``uniforms`` for the paths ``paths`` (sorted indices, any gaps): blocks
    without a selected path are not drawn."""
    out = np.empty((len(paths), k))
    if len(paths) == 0:
        return out
    first, last = paths[0] // STREAM_BLOCK, paths[-1] // STREAM_BLOCK
    bounds = np.searchsorted(paths, np.arange(first, last + 2) * STREAM_BLOCK)
    for b, lo, hi in zip(range(first, last + 1), bounds[:-1], bounds[1:]):
        if lo < hi:
            u = np.random.default_rng([*seed, b * STREAM_BLOCK, *stream]).random(
                (STREAM_BLOCK, k))
            out[lo:hi] = u[paths[lo:hi] - b * STREAM_BLOCK]
    return out


class Sampler:
    """Deterministic uniforms per (seed, path index, purpose, bounce) for the paths
    start..start+n, or for the sorted path indices ``paths`` (then ``start`` and ``n`` are
    ignored); ``repeat`` tiles each draw so that lanes k, k + n, ... share random numbers (the
    two sides of an edge sample)."""

    def __init__(self, seed, start, n, repeat=1, paths=None):
        self.seed = tuple(np.atleast_1d(seed).tolist())
        self.start, self.n, self.repeat, self.paths = start, n, repeat, paths

    def uniform(self, purpose, bounce, k, dtype):
        u = torch.as_tensor(
            uniforms(self.seed, self.start, self.n, k, purpose, bounce) if self.paths is None
            else uniforms_at(self.seed, self.paths, k, purpose, bounce))
        u = u.to(dtype)
        return u.repeat(self.repeat, 1) if self.repeat > 1 else u


_PIXEL, _LIGHT, _BSDF, _ENVIRONMENT, LENS = 0, 1, 2, 3, 4


def lens_uniforms(sampler: Sampler, dtype):
    """The (N, 2) uniforms picking each path's point on a thin lens (the edge sampler draws
    the same ones for its side paths: ``Sampler.uniform(LENS, 0, 2, dtype)``)."""
    return sampler.uniform(LENS, 0, 2, dtype)


def trace(scene, geometry: Geometry, xy, sampler: Sampler, max_depth=2, output="radiance"):
    """Per-lane values (N, C) for screen points ``xy`` (N, 2) in pixels."""
    g, dt = geometry, geometry.dtype
    n = xy.shape[0]
    cam = scene.camera
    lens = cam.lens_points(lens_uniforms(sampler, dt), dt) if cam.thin_lens else None
    o, d, valid = cam.rays(xy, dt, lens)
    if output != "radiance":
        return _aov(g, o, d, valid, output)
    radiance = torch.zeros((n, 3), dtype=dt)
    # Path state is kept compact (one row per path still going, ``lanes`` maps rows to
    # paths) and compacted once per bounce, after the next rays are cast: gathers are
    # index_select (much faster than advanced indexing, forward and backward).
    lanes = torch.nonzero(valid).flatten()
    o, d = _select(o, lanes), _select(d, lanes)
    beta = torch.ones((len(lanes), 3), dtype=dt)
    travelled = torch.zeros(len(lanes), dtype=dt)
    prev_pdf = None
    pixel_angle = 2.0 * float(torch.tan(scene.camera.fov.detach() * np.pi / 360.0)) / (
        scene.camera.width)
    has_lights = len(g.light_tris) > 0
    env_nee = g.samples_environment
    prev_env = None  # rows whose previous vertex sampled the envmap (MIS of escaped rays)
    tri, traced = g.intersect(o, d), None  # traced: rows whose path went on (None: all)
    for depth in range(max_depth + 1):
        hit = tri >= 0
        if scene.envmap is not None:
            miss = torch.nonzero(~hit if traced is None else ~hit & traced).flatten()
            if len(miss):
                d_miss = d.index_select(0, miss)
                le = g.environment(d_miss)
                if prev_env is not None:
                    p_bsdf = prev_pdf.index_select(0, miss)
                    mis = torch.where(prev_env.index_select(0, miss),
                                      power_heuristic(p_bsdf, g.environment_pdf(d_miss)), 1.0)
                    le = le * mis[:, None]
                radiance = radiance.index_add(0, lanes.index_select(0, miss),
                                              beta.index_select(0, miss) * le)
        keep = torch.nonzero(hit).flatten()
        if len(keep) < len(lanes):
            lanes, o, d, tri, beta, travelled = (x.index_select(0, keep) for x in
                                                 (lanes, o, d, tri, beta, travelled))
            if prev_pdf is not None:
                prev_pdf = prev_pdf.index_select(0, keep)
            if prev_env is not None:
                prev_env = prev_env.index_select(0, keep)
        if len(lanes) == 0:
            break
        si = g.interact(tri, o, d)
        travelled = travelled + si.t.detach()
        wi = -d
        if has_lights:
            le = g.emission(si)
            if depth > 0:
                cos_l = torch.clamp((si.ng.detach() * wi.detach()).sum(1), min=1e-12)
                p_light = (g.light_pmf.index_select(0, tri).to(dt) / si.area.detach()
                           * si.t.detach() ** 2 / cos_l)
                le = le * power_heuristic(prev_pdf, p_light)[:, None]
            radiance = radiance.index_add(0, lanes, beta * le)
        if depth == max_depth:
            break
        kd, ks, rough = g.material(si, footprint=travelled * pixel_angle)
        u_light = (_select(sampler.uniform(_LIGHT, depth, 3, dt), lanes) if has_lights
                   else None)
        u = _select(sampler.uniform(_BSDF, depth, 3, dt), lanes)
        glass = (torch.nonzero(g.eta(si) > 0).flatten() if g.has_dielectric
                 else torch.zeros(0, dtype=torch.long))
        if env_nee:  # opaque rows only (a dielectric's escaped rays keep their full weight)
            prev_env = torch.ones(len(lanes), dtype=torch.bool).index_fill(0, glass, False)
            u_env = _select(sampler.uniform(_ENVIRONMENT, depth, 3, dt), lanes)
            if len(glass) == 0:
                env = next_event_environment(g, si, wi, kd, ks, rough, u_env)
                radiance = radiance.index_add(0, lanes, beta * env)
            else:
                rows = torch.nonzero(prev_env).flatten()
                env = next_event_environment(
                    g, _rows(si, rows), wi.index_select(0, rows), kd.index_select(0, rows),
                    ks.index_select(0, rows), rough.index_select(0, rows),
                    u_env.index_select(0, rows))
                radiance = radiance.index_add(0, lanes.index_select(0, rows),
                                              beta.index_select(0, rows) * env)
        if len(glass) == 0 and has_lights and not torch.is_grad_enabled():
            light, (wo, pdf, throughput, o, alive) = _shade(g, si, wi, kd, ks, rough, u_light,
                                                            u)
            radiance = radiance.index_add(0, lanes, beta * light)
        elif len(glass) == 0:
            if has_lights:
                radiance = radiance.index_add(
                    0, lanes, beta * next_event(g, si, wi, kd, ks, rough, u_light))
            wo, pdf, throughput, o, alive = BOUNCE(
                si.p, si.ns, si.ng, wi, kd, ks, rough[:, None], u, g.eps_column(len(lanes)))
        else:
            light, (wo, pdf, throughput, o, alive) = _mixed_scatter(
                g, si, wi, kd, ks, rough, u_light, u, glass)
            if has_lights:
                radiance = radiance.index_add(0, lanes, beta * light)
        # Held constant (spec 5.3): the sampled direction and its pdf (zero derivatives in
        # the kernel; detached so that the replay records nothing for them).
        beta, d, prev_pdf = beta * throughput, wo.detach(), pdf[:, 0].detach()
        traced = alive[:, 0] > 0
        if traced.all():
            tri, traced = g.intersect(o, d), None
        else:
            rows = torch.nonzero(traced).flatten()
            tri = torch.full((len(lanes),), -1, dtype=torch.long).index_copy(
                0, rows, g.intersect(o.detach().index_select(0, rows), d.index_select(0, rows)))
    return radiance


def _select(x, lanes):
    """The rows ``lanes`` (sorted, distinct) of per-path ``x``: ``x`` itself while every path
    is still going (a copy of a whole chunk's rows otherwise)."""
    return x if len(lanes) == x.shape[0] else x.index_select(0, lanes)


def _rows(si, rows):
    return Interaction(*(getattr(si, f.name).index_select(0, rows) for f in fields(si)))


def _shade(g, si, wi, kd, ks, rough, u_light, u):
    """Next-event estimation and the bounce at opaque interactions without autograd (the
    forward render): one SHADE kernel and one shadow-ray batch; as ``next_event`` and
    ``BOUNCE``, up to float rounding."""
    tri, pmf = g.pick_light(u_light[:, 0])
    origin, wo_light, tmax, light, *bounce = SHADE(
        si.p, si.ns, si.ng, wi, kd, ks, rough[:, None], *g.corners(tri), u_light[:, 1:],
        pmf[:, None], g.light_emission(tri), u, g.eps_column(len(wi)))
    blocked = g.occluded(origin, wo_light, tmax[:, 0])
    return light.masked_fill(blocked[:, None], 0.0), bounce


def _mixed_scatter(g, si, wi, kd, ks, rough, u_light, u, glass):
    """Next-event estimation (None without ``u_light``) and the bounce for a batch whose rows
    ``glass`` are rough dielectrics: each material's kernels on its own rows, merged back."""
    n = len(wi)
    opaque = torch.nonzero(
        ~torch.zeros(n, dtype=torch.bool).index_fill(0, glass, True)).flatten()
    parts = []
    for rows in (glass, opaque):
        if len(rows) == 0:
            continue
        s, w, r = _rows(si, rows), wi.index_select(0, rows), rough.index_select(0, rows)
        ul = None if u_light is None else u_light.index_select(0, rows)
        ur, eps = u.index_select(0, rows), g.eps_column(len(rows))
        if rows is glass:
            eta = bsdf.relative_eta(g.eta(s), s.front)
            nee = None if ul is None else next_event_dielectric(g, s, w, eta, r, ul)
            out = DIELECTRIC_BOUNCE(s.p, s.ns, s.ng, w, eta[:, None], r[:, None], ur, eps)
        else:
            kd_r, ks_r = kd.index_select(0, rows), ks.index_select(0, rows)
            nee = None if ul is None else next_event(g, s, w, kd_r, ks_r, r, ul)
            out = BOUNCE(s.p, s.ns, s.ng, w, kd_r, ks_r, r[:, None], ur, eps)
        parts.append((rows, nee, out))
    light = None
    if u_light is not None:
        light = parts[0][1].new_zeros(n, 3)
        for rows, nee, _ in parts:
            light = light.index_copy(0, rows, nee)
    bounce = [x.new_zeros(n, x.shape[1]) for x in parts[0][2]]
    for rows, _, out in parts:
        bounce = [b.index_copy(0, rows, x) for b, x in zip(bounce, out)]
    return light, bounce


def _bounce(dtype, sampling, evaluation, material, dielectric):
    """The expressions of one bounce over a BSDF's ``sampling`` / ``evaluation`` expressions
    (edge_rt.bsdf): a sampled direction and its pdf (held constant), the throughput
    BSDF * cos / pdf (zero where the path ends), the next ray's origin (Geometry.spawn, on the
    side the direction points to) and 1 where the path goes on. Opaque: the path ends below
    the geometric surface; ``dielectric``: it may continue on either side, and ends where the
    shading and geometric normals disagree about the side (a light leak)."""
    (sampled, _), _ = sampling(dtype)
    v, f = evaluation(dtype)
    p = [sym.var(f"p{c}", dtype) for c in "xyz"]
    u = [sym.var(f"u{k}", dtype) for k in range(3)]
    eps = sym.var("eps", dtype)
    wo = [sym.stop_gradient(x) for x in sampled[:3]]
    pdf = sym.stop_gradient(sampled[3])
    ng = [v["gx"], v["gy"], v["gz"]]
    cos_g = ng[0] * wo[0] + ng[1] * wo[1] + ng[2] * wo[2]
    if dielectric:
        cos_s = v["nx"] * wo[0] + v["ny"] * wo[1] + v["nz"] * wo[2]
        alive = sym.logical_and(pdf > 0.0, cos_g * cos_s > 0.0)
    else:
        alive = sym.logical_and(pdf > 0.0, cos_g > 0.0)
    f = sym.substitute(f, {v["ox"]: wo[0], v["oy"]: wo[1], v["oz"]: wo[2]})
    f = f if isinstance(f, list | tuple) else [f] * 3  # the dielectric is grey
    safe_pdf = sym.where(alive, pdf, sym.const(1.0, dtype))
    throughput = [sym.where(alive, x / safe_pdf, sym.const(0.0, dtype)) for x in f]
    offset = sym.where(cos_g >= 0.0, eps, -eps)
    origin = [p[k] + offset * ng[k] for k in range(3)]
    inputs = (p + [v[k] for k in ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz")]
              + [v[k] for k in material] + u + [eps])
    outputs = (wo + [pdf] + throughput + origin
               + [sym.where(alive, sym.const(1.0, dtype), sym.const(0.0, dtype))])
    return inputs, outputs


def _dielectric_bounce_expressions(dtype):
    return _bounce(dtype, bsdf.dielectric_sampling_expressions, bsdf.dielectric_expressions,
                   ("eta", "rough"), dielectric=True)


# (p, ns, ng, wi, relative eta (N, 1), rough (N, 1), uniforms (N, 3), ray offset (N, 1)) ->
# (wo, pdf (N, 1), throughput (N, 3), next origin, alive (N, 1)), as BOUNCE.
DIELECTRIC_BOUNCE = CompiledOp(_dielectric_bounce_expressions, (3, 3, 3, 3, 1, 1, 3, 1),
                               (3, 1, 3, 3, 1),
                               differentiable=(True, True, False, True, True, True, False, False))


def _bounce_expressions(dtype):
    return _bounce(dtype, bsdf.sampling_expressions, bsdf.bsdf_expressions,
                   ("kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough"), dielectric=False)


# (p, ns, ng, wi, kd, ks, rough (N, 1), uniforms (N, 3), ray offset (N, 1)) -> (wo, pdf
# (N, 1), throughput, next origin, alive (N, 1)); one kernel for sampling, evaluation and
# spawn. The geometric normal only gates and offsets, the uniforms and offset are constants.
BOUNCE = CompiledOp(_bounce_expressions, (3, 3, 3, 3, 3, 3, 1, 3, 1), (3, 1, 3, 3, 1),
                    differentiable=(True, True, False, True, True, True, True, False, False))


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


def _shade_expressions(dtype):
    light_in, light_out = light_sample_expressions(dtype)
    _, bounce_out = _bounce_expressions(dtype)  # the same named vars, plus the uniforms
    u, eps = [sym.var(f"u{k}", dtype) for k in range(3)], sym.var("eps", dtype)
    return [x for x in light_in if x is not eps] + u + [eps], light_out + bounce_out


# Forward only (values, no derivatives): (p, ns, ng, wi, kd, ks, rough (N, 1), light vertices
# a, b, c, light uniforms (N, 2), pmf (N, 1), emission, BSDF uniforms (N, 3), ray offset
# (N, 1)) -> (shadow origin, direction, tmax (N, 1), unblocked light (N, 3), then BOUNCE's
# outputs).
SHADE = CompiledOp(_shade_expressions, (3, 3, 3, 3, 3, 3, 1, 3, 3, 3, 2, 1, 3, 3, 1),
                   (3, 3, 1, 3, 3, 1, 3, 3, 1), differentiable=(False,) * 15)
