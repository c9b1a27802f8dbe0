"""Rendering entry points: ``render`` (a torch autograd Function over every scene tensor),
``render_image`` (forward only) and ``gradients`` (the backward pass: interior term through
per-chunk path differentiation + primary edge sampling)."""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

from . import edges as edges_mod
from .geometry import Geometry
from .integrator import CHANNELS, OUTPUTS, Sampler, trace, uniforms
from .scene import SceneError

# Paths per wavefront chunk (any size: random streams do not depend on it). The autograd
# replay uses smaller chunks to bound the graph it records (Cornell box 256^2 x 4 spp: peak
# 486 MB vs 555 MB at 65536, time the same within the machine's noise).
_CHUNK = 1 << 16
_GRAD_CHUNK = 1 << 14


def _check(scene, spp, output, max_depth):
    if output not in OUTPUTS:
        raise ValueError(f"render: output must be one of {OUTPUTS}, got {output!r}")
    if int(spp) < 1:
        raise ValueError(f"render: spp must be >= 1, got {spp}")
    if int(max_depth) < 0:
        raise ValueError(f"render: max_depth must be >= 0, got {max_depth}")
    # Parameters change after construction (an optimiser step): check them at every render.
    for name, t in scene.named_tensors():
        if not torch.isfinite(t.detach()).all():
            raise SceneError(f"render: scene parameter {name} contains NaN or infinity")


def _pixel_samples(cam, spp, seed, start, count):
    """Screen samples start..start+count of the (spp x H x W) sample sequence: pixel index
    and a jitter inside the pixel (box filter). Stratified when ``spp`` is a square (k x k
    jittered strata per pixel): lower variance, and finite differences with common random
    numbers then count the samples an edge sweeps almost exactly."""
    w, h = cam.width, cam.height
    idx = np.arange(start, start + count)
    pix = idx % (w * h)
    jitter = uniforms(seed, start, count, 2, 7)
    k = math.isqrt(int(spp))
    if k * k == int(spp) and k > 1:
        stratum = idx // (w * h)
        jitter = (np.stack([stratum % k, stratum // k], 1) + jitter) / k
    xy = np.stack([pix % w + jitter[:, 0], pix // w + jitter[:, 1]], 1)
    return torch.as_tensor(pix), xy


def _chunks(total, progress, desc, size):
    starts = range(0, total, size)
    if progress and len(starts) > 1:
        return tqdm(starts, desc=desc, leave=False)
    return starts


def render_image(scene, spp=4, seed=0, max_depth=2, output="radiance", dtype=torch.float32,
                 progress=True):
    """Forward render, (H, W, C) tensor (no autograd)."""
    _check(scene, spp, output, max_depth)
    seed = tuple(np.atleast_1d(seed).tolist())
    cam = scene.camera
    npix = cam.width * cam.height
    total = npix * int(spp)
    c = CHANNELS[output]
    image = torch.zeros((npix, c), dtype=dtype)
    with torch.no_grad():
        g = Geometry(scene, dtype)
        for start in _chunks(total, progress, "edge_rt render", _CHUNK):
            count = min(_CHUNK, total - start)
            pix, xy = _pixel_samples(cam, spp, seed, start, count)
            values = trace(scene, g, torch.as_tensor(xy, dtype=dtype),
                           Sampler(seed, start, count), max_depth, output)
            image.index_add_(0, pix, values)
    return (image / spp).reshape(cam.height, cam.width, c)


def gradients(scene, grad_image, spp=4, seed=1, max_depth=2, output="radiance",
              edge_samples=None, dtype=torch.float32, interior=True, edges=True,
              progress=True):
    """d<grad_image, render(scene)>/d(every scene tensor), as a list following
    ``scene.tensors()`` (zeros where a tensor does not influence the image).

    Interior: each chunk of pixel paths is re-traced with autograd recording, and
    <grad_image, contribution> is differentiated. Boundary: ``edge_samples`` (default: one
    per pixel sample) primary edge samples, both sides traced with shared random numbers."""
    _check(scene, spp, output, max_depth)
    seed = tuple(np.atleast_1d(seed).tolist())
    cam = scene.camera
    npix = cam.width * cam.height
    params = [t.detach().to(dtype).requires_grad_(True) for t in scene.tensors()]
    sc = scene.with_tensors(params)
    adj = grad_image.detach().to(dtype).reshape(npix, -1)
    acc = [torch.zeros_like(p) for p in params]

    def accumulate(objective):
        if not objective.requires_grad:
            return
        gs = torch.autograd.grad(objective, params, allow_unused=True)
        for k, gk in enumerate(gs):
            if gk is not None:
                acc[k] += gk

    total = npix * int(spp)
    if interior:
        with torch.no_grad():
            caster = Geometry(sc, dtype)
        for start in _chunks(total, progress, "edge_rt backward", _GRAD_CHUNK):
            count = min(_GRAD_CHUNK, total - start)
            with torch.enable_grad():
                g = Geometry(sc, dtype, ray_caster=caster)
                pix, xy = _pixel_samples(cam, spp, seed, start, count)
                values = trace(sc, g, torch.as_tensor(xy, dtype=dtype),
                               Sampler(seed, start, count), max_depth, output)
                accumulate((adj[pix] * values).sum() / spp)
    if edges:
        n_edge = total if edge_samples is None else int(edge_samples)
        objective = _pinhole_edge_objective if cam.kind == "pinhole" else \
            _curved_edge_objective
        with torch.enable_grad():
            accumulate(objective(sc, adj, n_edge, seed, max_depth, output, dtype, progress))
    return [a.to(t.dtype) for a, t in zip(acc, scene.tensors())]


# Rays are cast in float32 (Embree): the two sides of an edge sample are this many pixels
# apart, more than float32 rounding and far less than any feature.
SIDE_OFFSET = 1e-4


def _side_differences(sc, adj, point, normal, seed, max_depth, output, dtype, progress):
    """adjoint . (L_upper - L_lower) per edge sample: both sides traced with shared random
    numbers, ``normal`` (unit, pixels) pointing to the upper side."""
    cam = sc.camera
    n_edge = len(point)
    upper, lower = point + SIDE_OFFSET * normal, point - SIDE_OFFSET * normal
    w, h = cam.width, cam.height
    out = torch.zeros(n_edge, dtype=torch.float64)
    g = Geometry(sc, dtype)
    with torch.no_grad():
        for start in _chunks(n_edge, progress, "edge_rt edges", _CHUNK // 2):
            stop = min(start + _CHUNK // 2, n_edge)
            count = stop - start
            xy = np.concatenate([upper[start:stop], lower[start:stop]])
            values = trace(sc, g, torch.as_tensor(xy, dtype=dtype),
                           Sampler((*seed, 13), start, count, repeat=2), max_depth, output)
            px = np.clip(np.floor(xy[:, 0]).astype(np.int64), 0, w - 1)
            py = np.clip(np.floor(xy[:, 1]).astype(np.int64), 0, h - 1)
            weighted = (adj[torch.as_tensor(py * w + px)] * values).sum(1).double()
            out[start:stop] = weighted[:count] - weighted[count:]
    return out


def _pinhole_edge_objective(sc, adj, n_edge, seed, max_depth, output, dtype, progress):
    """sum_j c_j alpha_j(Phi) with the screen-space line equation (5.5): its gradient is the
    primary boundary term (spec 3.4, 5.4)."""
    prim = edges_mod.primary_edges(sc)
    if len(prim) == 0 or n_edge == 0:
        return torch.zeros((), dtype=dtype)
    rng = np.random.default_rng([*seed, 11])
    k, point, weight = edges_mod.sample(prim, n_edge, rng)
    # The side offset follows the normal of the near-clipped projected line.
    with torch.no_grad():
        a, b = edges_mod.clipped_endpoints(sc, prim.mesh[k], prim.v0[k], prim.v1[k],
                                           torch.float64)
    a, b = a.numpy(), b.numpy()
    normal = np.stack([a[:, 1] - b[:, 1], b[:, 0] - a[:, 0]], 1)
    grad_norm = np.linalg.norm(normal, axis=1)
    normal /= grad_norm[:, None]
    sides = _side_differences(sc, adj, point, normal, seed, max_depth, output, dtype, progress)
    coeff = sides * torch.as_tensor(weight / grad_norm) / n_edge
    keep = torch.nonzero(coeff != 0).flatten().numpy()
    if len(keep) == 0:
        return torch.zeros((), dtype=dtype)
    pa, pb = edges_mod.clipped_endpoints(sc, prim.mesh[k[keep]], prim.v0[k[keep]],
                                         prim.v1[k[keep]], dtype)
    alpha = edges_mod.edge_equation(pa, pb, torch.as_tensor(point[keep], dtype=dtype))
    return (coeff[keep].to(dtype) * alpha).sum()


def _curved_edge_objective(sc, adj, n_edge, seed, max_depth, output, dtype, progress):
    """The same for a non-linear projection (fisheye), with the 3D edge equation (spec 3.6):
    c_j = adjoint . (L_u - L_l) |d(x, y)/dt| / (|grad_xy alpha| P(E) p(t))."""
    cam = sc.camera
    curved = edges_mod.curved_edges(sc)
    if len(curved) == 0 or n_edge == 0:
        return torch.zeros((), dtype=dtype)
    rng = np.random.default_rng([*seed, 11])
    k, t, weight = edges_mod.sample_curved(curved, n_edge, rng)
    pa, pb = (x.detach() for x in edges_mod.endpoints(sc, curved.mesh[k], curved.v0[k],
                                                      curved.v1[k], torch.float64))
    # Screen point and curve speed |d(x, y)/dt| of each sample (exact, by autograd).
    tt = torch.as_tensor(t).requires_grad_(True)
    pc = cam.to_camera(pa + tt[:, None] * (pb - pa), torch.float64)
    xy = cam.project(pc)
    dx, = torch.autograd.grad(xy[:, 0].sum(), tt, retain_graph=True)
    dy, = torch.autograd.grad(xy[:, 1].sum(), tt)
    speed = torch.sqrt(dx * dx + dy * dy)
    xy = xy.detach()
    seen = cam.sees(xy)
    # Unit normal of the projected curve, toward alpha > 0.
    xy_var = xy.clone().requires_grad_(True)
    with torch.no_grad():
        cam_d = sc.with_tensors([x.detach().double() for x in sc.tensors()])
    alpha = edges_mod.edge_equation_3d(cam_d, xy_var, pa, pb)
    grad_xy, = torch.autograd.grad(alpha.sum(), xy_var)
    grad_norm = grad_xy.norm(dim=1)
    keep = torch.nonzero(seen & (grad_norm > 0) & (speed > 0)).flatten()
    if len(keep) == 0:
        return torch.zeros((), dtype=dtype)
    normal = (grad_xy[keep] / grad_norm[keep, None]).numpy()
    sides = _side_differences(sc, adj, xy[keep].numpy(), normal, seed, max_depth, output,
                              dtype, progress)
    coeff = sides * speed[keep] / grad_norm[keep] * torch.as_tensor(weight)[keep] / n_edge
    live = torch.nonzero(coeff != 0).flatten()
    if len(live) == 0:
        return torch.zeros((), dtype=dtype)
    sel = keep[live].numpy()
    qa, qb = edges_mod.endpoints(sc, curved.mesh[k[sel]], curved.v0[k[sel]],
                                 curved.v1[k[sel]], dtype)
    alpha = edges_mod.edge_equation_3d(sc, xy[sel].to(dtype), qa, qb)
    return (coeff[live].to(dtype) * alpha).sum()


class _Render(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scene, options, *tensors):
        ctx.scene, ctx.options = scene, options
        ctx.needs = [t.requires_grad for t in tensors]
        opts = dict(options)
        opts.pop("grad_seed")
        opts.pop("edge_samples")
        return render_image(scene, **opts)

    @staticmethod
    def backward(ctx, grad_image):
        opts = dict(ctx.options)
        opts["seed"] = opts.pop("grad_seed")
        gs = gradients(ctx.scene, grad_image, **opts)
        return (None, None, *[g if need else None for g, need in zip(gs, ctx.needs)])


def render(scene, spp=4, seed=0, max_depth=2, output="radiance", grad_seed=None,
           edge_samples=None, dtype=torch.float32, progress=True):
    """Render ``scene`` into an (H, W, C) tensor differentiable w.r.t. every scene tensor.

    The backward pass draws its own random numbers (``grad_seed``, default derived from
    ``seed``), independent of the forward pass (spec 5.3: decorrelates a non-linear loss's
    adjoint from the gradient samples)."""
    if grad_seed is None:
        grad_seed = (*np.atleast_1d(seed).tolist(), 0x9E37)
    options = {"spp": spp, "seed": seed, "max_depth": max_depth, "output": output,
               "grad_seed": grad_seed, "edge_samples": edge_samples, "dtype": dtype,
               "progress": progress}
    tensors = scene.tensors()
    return _Render.apply(scene, options, *tensors)
