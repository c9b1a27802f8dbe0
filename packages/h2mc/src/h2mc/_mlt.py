"""Primary-sample-space Metropolis light transport on an edge_rt scene (spec 1.1-1.6).

The chain state is a point ``u`` of :class:`~h2mc.PathSpace`; its target is the luminance of
the Kelemen contribution (the sum over path lengths). Mutations:

* large step: a fresh uniform ``u`` (ergodicity);
* small step ``"kelemen"``: Kelemen et al.'s symmetric exponential perturbation of every
  coordinate, offsets in ``[s1, s2]`` with density ~ 1/offset, wrapped (PSSMLT);
* small step ``"h2mc"``: the H2MC Gaussian from the gradient and Hessian of log f* at the
  state (h2mc_proposal), with probability ``uniform_mixing`` replaced by the Kelemen step
  (spec 4.7 rule 4); the Gaussian is cached with the state, so an H2MC step costs one
  value + gradient + Hessian evaluation, at the proposal.

Normalisation ``b = E[f*(u)]`` over uniform ``u`` from a bootstrap of independent samples,
which also seeds the chains by systematic resampling in proportion to f* (spec 1.5; Veach's
start-up bias fix). Splatting by expected values: every step adds the current state with
weight ``1 - a`` and the proposal with weight ``a``, each as ``rgb * b / f*`` into its pixel;
the image is scaled by ``pixels / (steps * chains)``. Paths shorter than ``min_length`` (direct
lighting, and emitters seen directly) come from edge_rt's path tracer (spec 1.5).

A non-finite contribution is a counted rejection (PathSpace voids the state; ``nonfinite``
counts it), never a NaN pixel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

import edge_rt

from ._kernels import _wrap
from ._pathspace import PathSpace
from ._proposal import h2mc_proposal

SMALL_STEPS = ("kelemen", "h2mc")


class MLTError(ValueError):
    """Bad arguments, or a scene whose paths carry no light (b = 0)."""


def kelemen_perturb(u, rng, s1=1.0 / 1024, s2=1.0 / 64):
    """Kelemen's small step on every coordinate: ``u +- s2 exp(-log(s2 / s1) r)``, wrapped
    into ``[0, 1)``. Symmetric, so it adds nothing to the acceptance ratio."""
    r = rng.random(u.shape)
    dv = s2 * np.exp(-np.log(s2 / s1) * r)
    return _wrap(u + np.where(rng.random(u.shape) < 0.5, dv, -dv))


@dataclass
class Bootstrap:
    """``b`` (mean f* over uniform states), the samples and their f*."""

    b: float
    u: np.ndarray
    f_star: np.ndarray

    def seeds(self, n, rng):
        """``n`` states by systematic resampling in proportion to f* (Veach, p. 340)."""
        cdf = np.cumsum(self.f_star)
        picks = (np.arange(n) + rng.random()) / n * cdf[-1]
        return self.u[np.minimum(np.searchsorted(cdf, picks, side="right"), len(cdf) - 1)]


def bootstrap(path_space, n, rng, batch=8192):
    """Estimate ``b`` from ``n`` independent uniform states (raises :class:`MLTError` when
    none carries light)."""
    u = rng.random((int(n), path_space.dim))
    f = np.concatenate([path_space.trace(u[s:s + batch]).f_star
                        for s in range(0, len(u), batch)])
    if not (f > 0).any():
        raise MLTError(f"bootstrap: none of {n} paths of lengths {path_space.min_length}.."
                       f"{path_space.max_length} carries light (b = 0); raise the sample "
                       "count or check the scene's lights")
    return Bootstrap(float(f.mean()), u, f)


@dataclass
class MutationStats:
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance(self):
        return self.accepted / self.proposed if self.proposed else float("nan")


@dataclass
class MLTResult:
    """``image`` = ``indirect`` (the chains) + ``direct`` (edge_rt, or zeros), (H, W, 3)
    float64; ``snapshots``: mutations per pixel -> indirect image at that point; ``seconds``:
    wall time of the bootstrap and the chains (not of the direct lighting); ``nonfinite``:
    proposals rejected because their contribution was NaN / inf."""

    image: np.ndarray
    indirect: np.ndarray
    direct: np.ndarray
    b: float
    mutations: int
    seconds: float
    stats: dict
    nonfinite: int
    snapshots: dict = field(default_factory=dict)

    @property
    def mutations_per_second(self):
        return self.mutations / self.seconds if self.seconds > 0 else float("nan")


def render_mlt(scene, mutations_per_pixel=64, *, max_length=3, min_length=3, chains=256,
               large_step_prob=0.3, small_step="kelemen", s1=1.0 / 1024, s2=1.0 / 64,
               sigma2=1e-4, uniform_mixing=0.2, bootstrap_samples=1 << 16, direct_spp=16,
               seed=0, checkpoints=(), path_space=None, progress=None):
    """Render ``scene`` (an edge_rt Scene) by PSSMLT (``small_step="kelemen"``) or with H2MC
    small steps (``"h2mc"``, prior *variance* ``sigma2``: the default is the reference
    renderer's sigma = 0.01; tune it for 50-70% small-step acceptance, 1e-3 on the Cornell
    box).

    ``mutations_per_pixel``: total mutations = this x pixels, split over ``chains``;
    ``checkpoints``: mutations-per-pixel values at which to keep a copy of the indirect image;
    ``direct_spp``: samples per pixel of edge_rt's path tracer for paths shorter than
    ``min_length`` (0: leave them out); ``path_space``: a prebuilt :class:`PathSpace` of the
    scene (its kernels are compiled once; its lengths replace ``max_length`` / ``min_length``);
    ``progress``: called with the number of mutations done so far after every step.
    """
    if small_step not in SMALL_STEPS:
        raise MLTError(f"render_mlt: small_step must be one of {SMALL_STEPS}, got "
                       f"{small_step!r}")
    if not 0.0 <= large_step_prob <= 1.0 or not 0.0 <= uniform_mixing <= 1.0:
        raise MLTError("render_mlt: large_step_prob and uniform_mixing must be in [0, 1]")
    if not 0.0 < s1 < s2 < 0.5:
        raise MLTError(f"render_mlt: need 0 < s1 < s2 < 0.5, got s1={s1}, s2={s2}")
    if int(chains) < 1 or mutations_per_pixel <= 0:
        raise MLTError("render_mlt: chains and mutations_per_pixel must be positive")
    ps = path_space or PathSpace(scene, max_length=max_length, min_length=min_length)
    if path_space is not None and path_space.scene is not scene:
        raise MLTError("render_mlt: path_space was built for another scene")
    seed = tuple(np.atleast_1d(seed).tolist())
    rng = np.random.default_rng([*seed, 0x6D6C74])
    w, h = ps.width, ps.height
    npix = w * h
    t0 = time.perf_counter()
    boot = bootstrap(ps, bootstrap_samples, rng)
    C = int(chains)
    steps = int(np.ceil(mutations_per_pixel * npix / C))
    checkpoints = {int(np.ceil(m * npix / C)): m for m in checkpoints}

    x = boot.seeds(C, rng)
    px = ps.trace(x)
    state = _Chains(x, px.rgb, px.f_star, px.pixel)
    use_h2mc = small_step == "h2mc"
    if use_h2mc:
        state.gaussian = _gaussian(ps, x, px, np.arange(C), sigma2)
    stats = {"large": MutationStats(), "small": MutationStats()}
    if use_h2mc:
        stats["isotropic"] = MutationStats()
    accum = np.zeros((npix, 3))
    nonfinite = 0
    snapshots = {}
    for step in range(1, steps + 1):
        large = rng.random(C) < large_step_prob
        iso = ~large & (rng.random(C) < uniform_mixing) if use_h2mc else ~large
        h2 = ~large & ~iso
        y = np.empty_like(state.x)
        y[large] = rng.random((int(large.sum()), ps.dim))
        y[iso] = kelemen_perturb(state.x[iso], rng, s1, s2)
        if h2.any():
            gx = state.gaussian.take(h2)
            z = gx.sample(xi=rng.standard_normal((int(h2.sum()), ps.dim)))
            y[h2] = _wrap(state.x[h2] + z)
        py = ps.trace(y)
        nonfinite += int(py.nonfinite.sum())
        fy = py.f_star
        with np.errstate(divide="ignore"):
            log_a = np.log(fy) - np.log(state.f)
        if h2.any():
            lanes = np.flatnonzero(h2)
            gy = _gaussian(ps, y, py, lanes, sigma2)
            log_a[lanes] += gy.log_density(-z) - gx.log_density(z)
        a = np.where(fy > 0, np.exp(np.minimum(log_a, 0.0)), 0.0)
        _splat(accum, state.pixel, (1.0 - a) / state.f, state.rgb)
        live = a > 0
        _splat(accum, py.pixel[live], a[live] / fy[live], py.rgb[live])
        accept = rng.random(C) < a
        for name, sel in (("large", large), ("small", h2 if use_h2mc else iso),
                          ("isotropic", iso if use_h2mc else None)):
            if sel is not None:
                stats[name].proposed += int(sel.sum())
                stats[name].accepted += int((accept & sel).sum())
        state.x[accept], state.rgb[accept] = y[accept], py.rgb[accept]
        state.f[accept], state.pixel[accept] = fy[accept], py.pixel[accept]
        if use_h2mc:
            moved = np.flatnonzero(accept & ~h2)
            if moved.size:  # large / isotropic moves: derivatives at the new state
                state.gaussian.put(moved, _gaussian(ps, y, py, moved, sigma2))
            if h2.any() and accept[h2].any():
                state.gaussian.put(lanes[accept[h2]], gy.take(accept[h2]))
        if progress is not None:
            progress(step * C)
        if step in checkpoints:
            snapshots[checkpoints[step]] = _image(accum, boot.b, npix, step * C, w, h)
    indirect = _image(accum, boot.b, npix, steps * C, w, h)
    seconds = time.perf_counter() - t0
    direct = np.zeros_like(indirect)
    if direct_spp and ps.min_length > 1:
        direct = edge_rt.render_image(scene, spp=int(direct_spp), seed=seed,
                                      max_depth=ps.min_length - 2, dtype=torch.float64,
                                      progress=False).numpy()
    return MLTResult(indirect + direct, indirect, direct, boot.b, steps * C, seconds, stats,
                     nonfinite, snapshots)


@dataclass
class _Chains:
    x: np.ndarray
    rgb: np.ndarray
    f: np.ndarray
    pixel: np.ndarray
    gaussian: object = None


def _gaussian(ps, u, paths, lanes, sigma2):
    """The H2MC Gaussians at ``u[lanes]`` (one value + gradient + Hessian evaluation each)."""
    logf, g, H = ps.log_f_star_derivatives(u, paths, lanes)
    return h2mc_proposal(g[lanes], H[lanes], sigma2, log_f=logf[lanes])


def _splat(accum, pixel, weight, rgb):
    for c in range(3):
        accum[:, c] += np.bincount(pixel, weight * rgb[:, c], minlength=len(accum))


def _image(accum, b, npix, mutations, w, h):
    return (accum * (b * npix / mutations)).reshape(h, w, 3)
