"""Rendering entry points: ``render`` (a torch autograd Function over every scene tensor),
``render_image`` (forward only) and ``gradients`` (the backward pass: interior term through
per-chunk path differentiation + primary edge sampling)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from core_ad.codegen import map_ordered

from . import edges as edges_mod
from .geometry import Geometry
from .integrator import CHANNELS, LENS, OUTPUTS, Sampler, trace, uniforms, uniforms_at
from .scene import SceneError, check_eta, check_lens

# Paths per wavefront chunk (any size: random streams do not depend on it). The autograd
# replay records one graph per chunk; with the compiled bounce kernels it is small enough for
# full chunks (Cornell box 256^2 x 4 spp, interior term: peak RSS 452 MB vs 403 MB at 16384
# paths, 20% less CPU time).
_CHUNK = 1 << 16
_GRAD_CHUNK = 1 << 16


@contextlib.contextmanager
def torch_single_thread():
    """Torch's intra-op threads at 1 inside the block (also a decorator): a render's torch ops
    are glue between compiled kernels and Embree calls, which have their own threads (core_ad's
    pool); torch's OpenMP threads spinning beside them on few cores made the Cornell box
    forward render 5x slower (2 busy cores: 2.2-3.2 s with 2 torch threads, 0.45-0.60 s with
    1), and h2mc's path tracing of a few thousand lanes 12x slower (264 vs 21 ms)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


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
    for m in scene.meshes:
        if m.material.eta is not None:
            check_eta(m.material.eta, f"render: mesh {m.name!r} material eta")
    check_lens(scene.camera)
    if scene.moving_meshes:
        raise SceneError(f"render: mesh {scene.moving_meshes[0].name!r} moves (a velocity): "
                         "edge_rt's path tracer renders no motion blur (h2mc.render_mlt "
                         "does); set its velocity to None")


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


@torch_single_thread()
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

        def chunk(start):
            with torch.no_grad():  # grad mode is per thread
                count = min(_CHUNK, total - start)
                pix, xy = _pixel_samples(cam, spp, seed, start, count)
                return pix, trace(scene, g, torch.as_tensor(xy, dtype=dtype),
                                  Sampler(seed, start, count), max_depth, output)

        # Chunks in the pool's threads: most of a chunk's time is torch and numpy glue that
        # releases the GIL but runs on one core; the image sums them in chunk order.
        for pix, values in map_ordered(chunk, _chunks(total, progress, "edge_rt render",
                                                       _CHUNK)):
            image.index_add_(0, pix, values)
    return (image / spp).reshape(cam.height, cam.width, c)


@torch_single_thread()
def gradients(scene, grad_image, spp=4, seed=1, max_depth=2, output="radiance",
              edge_samples=None, dtype=torch.float32, interior=True, edges=True,
              progress=True, wrt=None):
    """d<grad_image, render(scene)>/d(every scene tensor), as a list following
    ``scene.tensors()`` (zeros where a tensor does not influence the image). ``wrt``: one
    bool per tensor (default all True); the others get None and are held constant, and the
    sides of edge samples that then cannot move are not traced.

    Interior: each chunk of pixel paths is re-traced with autograd recording, and
    <grad_image, contribution> is differentiated. Boundary: ``edge_samples`` (default: one
    per pixel sample) primary edge samples, both sides traced with shared random numbers."""
    _check(scene, spp, output, max_depth)
    seed = tuple(np.atleast_1d(seed).tolist())
    cam = scene.camera
    npix = cam.width * cam.height
    tensors = scene.tensors()
    wrt = [True] * len(tensors) if wrt is None else [bool(w) for w in wrt]
    if len(wrt) != len(tensors):
        raise ValueError(f"gradients: wrt has {len(wrt)} entries, the scene {len(tensors)} "
                         "tensors")
    params = [t.detach().to(dtype).requires_grad_(w) for t, w in zip(tensors, wrt)]
    sc = scene.with_tensors(params)
    adj = grad_image.detach().to(dtype).reshape(npix, -1)
    wanted = [p for p, w in zip(params, wrt) if w]
    acc = [torch.zeros_like(p) for p in wanted]

    def grads_of(objective):
        if not objective.requires_grad:
            return ()
        return torch.autograd.grad(objective, wanted, allow_unused=True)

    def accumulate(gs):
        for k, gk in enumerate(gs):
            if gk is not None:
                acc[k] += gk

    total = npix * int(spp)
    if interior:
        with torch.no_grad():
            caster = Geometry(sc, dtype)

        def chunk(start):
            count = min(_GRAD_CHUNK, total - start)
            with torch.enable_grad():  # grad mode is per thread
                g = Geometry(sc, dtype, ray_caster=caster)
                pix, xy = _pixel_samples(cam, spp, seed, start, count)
                values = trace(sc, g, torch.as_tensor(xy, dtype=dtype),
                               Sampler(seed, start, count), max_depth, output)
                return grads_of((adj[pix] * values).sum() / spp)

        # Chunks in the pool's threads, as render_image's (each records and differentiates
        # its own graph); their gradients are added in chunk order, as one after another.
        for gs in map_ordered(chunk, _chunks(total, progress, "edge_rt backward",
                                             _GRAD_CHUNK)):
            accumulate(gs)
    if edges:
        n_edge = total if edge_samples is None else int(edge_samples)
        primal = scene.with_tensors([t.detach().to(dtype) for t in scene.tensors()])
        with torch.enable_grad():
            terms = _edge_terms(sc, primal, n_edge, seed, max_depth, output, dtype, progress,
                                _moving_meshes(sc, wanted))
            if terms is not None:
                sides = ((adj[terms.pix_upper] * terms.upper).sum(1)
                         - (adj[terms.pix_lower] * terms.lower).sum(1))
                accumulate(grads_of((terms.weight * sides.to(dtype) * terms.alpha).sum()))
    grads = iter(acc)
    return [next(grads).to(t.dtype) if w else None for t, w in zip(tensors, wrt)]


@torch_single_thread()
def derivative_image(scene, tensor, direction, spp=4, seed=1, max_depth=2, output="radiance",
                     edge_samples=None, dtype=torch.float32, interior=True, edges=True,
                     progress=True):
    """The per-pixel derivative of the image along ``direction`` in the space of ``tensor``
    (one of ``scene.tensors()``): an (H, W, C) image, the thesis' Fig 5-9 gradient images.

    Forward mode: the interior term pushes the tangent through the replayed paths (torch
    forward AD; the BSDF's tangent is a core_ad compiled JVP kernel); each edge sample adds
    its weight times the tangent of its edge equation to the pixels of its two sides."""
    import torch.autograd.forward_ad as fwad

    _check(scene, spp, output, max_depth)
    tensors = scene.tensors()
    index = next((k for k, t in enumerate(tensors) if t is tensor), None)
    if index is None:
        raise ValueError("derivative_image: tensor is not one of scene.tensors()")
    direction = torch.as_tensor(direction)
    if tuple(direction.shape) != tuple(tensor.shape):
        raise ValueError(f"derivative_image: direction has shape {tuple(direction.shape)}, "
                         f"the tensor {tuple(tensor.shape)}")
    seed = tuple(np.atleast_1d(seed).tolist())
    cam = scene.camera
    npix, c = cam.width * cam.height, CHANNELS[output]
    image = torch.zeros((npix, c), dtype=torch.float64)
    primal = scene.with_tensors([t.detach().to(dtype) for t in tensors])
    with fwad.dual_level():
        params = [t.detach().to(dtype) for t in tensors]
        params[index] = fwad.make_dual(params[index], direction.to(dtype))
        sc = scene.with_tensors(params)
        total = npix * int(spp)
        if interior:
            caster = Geometry(primal, dtype)
            for start in _chunks(total, progress, "edge_rt derivative", _GRAD_CHUNK):
                count = min(_GRAD_CHUNK, total - start)
                g = Geometry(sc, dtype, ray_caster=caster)
                pix, xy = _pixel_samples(cam, spp, seed, start, count)
                values = trace(sc, g, torch.as_tensor(xy, dtype=dtype),
                               Sampler(seed, start, count), max_depth, output)
                tangent = fwad.unpack_dual(values).tangent
                if tangent is not None:
                    image.index_add_(0, pix, tangent.double() / spp)
        if edges:
            n_edge = total if edge_samples is None else int(edge_samples)
            terms = _edge_terms(sc, primal, n_edge, seed, max_depth, output, dtype, progress,
                                _moving_meshes(sc, [params[index]]))
            if terms is not None:
                rate = fwad.unpack_dual(terms.alpha).tangent
                if rate is not None:
                    w = (terms.weight * rate).double()[:, None]
                    image.index_add_(0, terms.pix_upper, w * terms.upper)
                    image.index_add_(0, terms.pix_lower, -w * terms.lower)
    return image.to(dtype).reshape(cam.height, cam.width, c)


# Rays are cast in float32 (Embree): the two sides of an edge sample are this many pixels
# apart, more than float32 rounding and far less than any feature.
SIDE_OFFSET = 1e-4


@dataclass
class EdgeTerms:
    """Edge samples whose two sides differ: the boundary term of pixel p is
    sum_j weight_j * (L_upper_j [p = pix_upper_j] - L_lower_j [p = pix_lower_j]) * dalpha_j,
    with alpha_j the edge equation at the (fixed) sample point, differentiable in the scene."""

    weight: torch.Tensor       # (K,) |E| / (P(E) p(t) |grad_xy alpha|) / N, detached
    alpha: torch.Tensor        # (K,) edge equation, carrying the scene's derivatives
    upper: torch.Tensor        # (K, C) value on the alpha > 0 side, float64
    lower: torch.Tensor        # (K, C)
    pix_upper: torch.Tensor    # (K,) pixel index of each side
    pix_lower: torch.Tensor


def _moving_meshes(sc, varying):
    """Per mesh of ``sc``: whether its edges move with one of the ``varying`` tensors. An
    edge equation depends on the camera and its mesh's vertices only, so a sample on any
    other edge has a zero derivative whatever its two sides (its sides are not traced)."""
    ids = {id(t) for t in varying}
    cam = sc.camera
    camera = any(id(t) in ids for t in (cam.cam_to_world, cam.fov, cam.aperture_radius,
                                        cam.focus_distance))
    return np.array([camera or id(m.vertices) in ids for m in sc.meshes], dtype=bool)


def _edge_terms(sc, primal, n_edge, seed, max_depth, output, dtype, progress, moving):
    make = _pinhole_edge_terms if sc.camera.kind == "pinhole" else _curved_edge_terms
    return make(sc, primal, n_edge, seed, max_depth, output, dtype, progress, moving)


def _side_values(primal, point, normal, paths, seed, max_depth, output, dtype, progress):
    """Both sides of each edge sample traced with shared random numbers on the detached
    scene: values (N, C) x 2 and pixel indices x 2; ``normal`` (unit, pixels) points to the
    upper side; ``paths`` (sorted) the samples' indices, which pick their random numbers."""
    cam = primal.camera
    n_edge = len(point)
    upper, lower = point + SIDE_OFFSET * normal, point - SIDE_OFFSET * normal
    w, h = cam.width, cam.height
    values = torch.zeros((2, n_edge, CHANNELS[output]), dtype=torch.float64)
    with torch.no_grad():
        g = Geometry(primal, dtype)

    def chunk(start):
        stop = min(start + _CHUNK // 2, n_edge)
        xy = np.concatenate([upper[start:stop], lower[start:stop]])
        with torch.no_grad():  # grad mode is per thread
            return start, stop, trace(
                primal, g, torch.as_tensor(xy, dtype=dtype),
                Sampler((*seed, 13), 0, stop - start, repeat=2, paths=paths[start:stop]),
                max_depth, output)  # seed (*seed, 13): the lens points' stream too

    for start, stop, v in map_ordered(chunk, _chunks(n_edge, progress, "edge_rt edges",
                                                     _CHUNK // 2)):
        count = stop - start
        values[0, start:stop], values[1, start:stop] = v[:count].double(), v[count:].double()
    pixels = []
    for side in (upper, lower):
        px = np.clip(np.floor(side[:, 0]).astype(np.int64), 0, w - 1)
        py = np.clip(np.floor(side[:, 1]).astype(np.int64), 0, h - 1)
        pixels.append(torch.as_tensor(py * w + px))
    return values[0], values[1], pixels[0], pixels[1]


def _live_terms(weight, alpha_of, upper, lower, pix_upper, pix_lower):
    live = torch.nonzero((upper != lower).any(1)).flatten()
    if len(live) == 0:
        return None
    return EdgeTerms(weight[live], alpha_of(live.numpy()), upper[live], lower[live],
                     pix_upper[live], pix_lower[live])


def _pinhole_edge_terms(sc, primal, n_edge, seed, max_depth, output, dtype, progress, moving):
    """Samples of the screen-space line equation (5.5) (spec 3.4, 5.4) on ``moving`` meshes'
    edges (the edge distribution is over every edge, so the kept samples do not change)."""
    prim = edges_mod.primary_edges(primal)
    if len(prim) == 0 or n_edge == 0:
        return None
    rng = np.random.default_rng([*seed, 11])
    side_seed = (*seed, 13)
    lens_u = lens = None
    if primal.camera.thin_lens:
        # the lens point of sample i is the one its side paths take (their Sampler's stream)
        lens_u = torch.as_tensor(uniforms_at(side_seed, np.arange(n_edge), 2, LENS, 0))
        with torch.no_grad():
            lens = primal.camera.lens_points(lens_u, torch.float64)
        k, point, weight = edges_mod.sample_through_lens(primal, prim, lens.numpy(), rng)
    else:
        k, point, weight = edges_mod.sample(prim, n_edge, rng)
    paths = np.nonzero(moving[prim.mesh[k]] & (weight > 0))[0]
    if len(paths) == 0:
        return None
    k, point, weight = k[paths], point[paths], weight[paths]
    # The side offset follows the normal of the near-clipped projected line.
    with torch.no_grad():
        a, b = edges_mod.clipped_endpoints(primal, prim.mesh[k], prim.v0[k], prim.v1[k],
                                           torch.float64,
                                           None if lens is None else lens[paths])
    a, b = a.numpy(), b.numpy()
    normal = np.stack([a[:, 1] - b[:, 1], b[:, 0] - a[:, 0]], 1)
    grad_norm = np.linalg.norm(normal, axis=1)
    normal /= grad_norm[:, None]
    sides = _side_values(primal, point, normal, paths, seed, max_depth, output, dtype,
                         progress)
    coeff = torch.as_tensor(weight / grad_norm / n_edge, dtype=dtype)

    def alpha_of(sel):
        # the lens points move with the aperture: differentiated through
        at = None if lens_u is None else sc.camera.lens_points(lens_u[paths[sel]], dtype)
        pa, pb = edges_mod.clipped_endpoints(sc, prim.mesh[k[sel]], prim.v0[k[sel]],
                                             prim.v1[k[sel]], dtype, at)
        return edges_mod.edge_equation(pa, pb, torch.as_tensor(point[sel], dtype=dtype))

    return _live_terms(coeff, alpha_of, *sides)


def _curved_edge_terms(sc, primal, n_edge, seed, max_depth, output, dtype, progress, moving):
    """The same for a non-linear projection (fisheye), with the 3D edge equation (spec 3.6):
    weight = |d(x, y)/dt| / (|grad_xy alpha| P(E) p(t)) / N."""
    cam = primal.camera
    curved = edges_mod.curved_edges(primal)
    if len(curved) == 0 or n_edge == 0:
        return None
    rng = np.random.default_rng([*seed, 11])
    k, t, inv_p = edges_mod.sample_curved(curved, n_edge, rng)
    paths = np.nonzero(moving[curved.mesh[k]])[0]
    if len(paths) == 0:
        return None
    k, t, inv_p = k[paths], t[paths], inv_p[paths]
    with torch.enable_grad():
        pa, pb = (x.detach() for x in edges_mod.endpoints(primal, curved.mesh[k], curved.v0[k],
                                                          curved.v1[k], torch.float64))
        # Screen point and curve speed |d(x, y)/dt| of each sample (exact, by autograd).
        tt = torch.as_tensor(t).requires_grad_(True)
        xy = cam.project(cam.to_camera(pa + tt[:, None] * (pb - pa), torch.float64))
        dx, = torch.autograd.grad(xy[:, 0].sum(), tt, retain_graph=True)
        dy, = torch.autograd.grad(xy[:, 1].sum(), tt)
        speed = torch.sqrt(dx * dx + dy * dy)
        xy = xy.detach()
        # Unit normal of the projected curve, toward alpha > 0.
        xy_var = xy.clone().requires_grad_(True)
        primal64 = primal.with_tensors([x.double() for x in primal.tensors()])
        alpha = edges_mod.edge_equation_3d(primal64, xy_var, pa, pb)
        grad_xy, = torch.autograd.grad(alpha.sum(), xy_var)
    grad_norm = grad_xy.norm(dim=1)
    keep = torch.nonzero(cam.sees(xy) & (grad_norm > 0) & (speed > 0)).flatten()
    if len(keep) == 0:
        return None
    normal = (grad_xy[keep] / grad_norm[keep, None]).numpy()
    sides = _side_values(primal, xy[keep].numpy(), normal, paths[keep.numpy()], seed, max_depth,
                         output, dtype, progress)
    coeff = (speed[keep] / grad_norm[keep] * torch.as_tensor(inv_p)[keep] / n_edge).to(dtype)
    sel_k = keep.numpy()

    def alpha_of(sel):
        rows = sel_k[sel]
        qa, qb = edges_mod.endpoints(sc, curved.mesh[k[rows]], curved.v0[k[rows]],
                                     curved.v1[k[rows]], dtype)
        return edges_mod.edge_equation_3d(sc, xy[rows].to(dtype), qa, qb)

    return _live_terms(coeff, alpha_of, *sides)


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
        return (None, None, *gradients(ctx.scene, grad_image, wrt=ctx.needs, **opts))


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
