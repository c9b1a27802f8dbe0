"""AE-10 (spec 10, Fig 6-7 analog): the parameterisation ablation on the torus in a glass cube;
AE-11 (the thesis' Balls/Cars analog): time in the H2MC Hessian on moving caustics.

Three small-step kernels at equal sample count, all on the multiplexed state with the
resampling large step (so only the small steps differ): H2MC in the modified coordinates,
the isotropic Gaussian (``sigma2``) in the modified coordinates, and the isotropic Gaussian in
Kelemen's coordinates. relMSE of the chains' image (paths of ``min_length..max_length``
segments) against edge_rt's path tracer on the same lengths.
"""

from __future__ import annotations

import numpy as np
import torch

import edge_rt
from edge_rt import scenes, torch_single_thread

from ._diagnostics import rel_mse
from ._mlt import render_mlt
from ._pathspace import PathSpace
from ._png import write_comparison_png, write_png

AE10_VARIANTS = {  # name -> (small step, parameterization)
    "modified+h2mc": ("h2mc", "modified"),
    "modified+isotropic": ("isotropic", "modified"),
    "kelemen+isotropic": ("isotropic", "kelemen"),
}


def indirect_reference(scene, spp, max_length, seed=91):
    """edge_rt's paths of 3..max_length segments: the render with max_depth = max_length - 1
    minus the one with max_depth = 1 on the same random numbers."""
    kw = dict(spp=int(spp), seed=seed, dtype=torch.float64, progress=False)
    with torch_single_thread():
        full = edge_rt.render_image(scene, max_depth=max_length - 1, **kw).numpy()
        direct = edge_rt.render_image(scene, max_depth=1, **kw).numpy()
    return full - direct


def ae10_parameterization(resolution=(16, 16), mutations_per_pixel=64, max_length=4,
                          seeds=(0, 1, 2), reference_spp=4096, chains=128, sigma2=1e-4,
                          roughness_threshold=0.01, large_step_prob=0.5,
                          bootstrap_samples=1 << 16, reference=None, backend="numpy",
                          png=None):
    """relMSE per variant (:data:`AE10_VARIANTS`) and seed against the reference, with the
    small-step acceptance: ``{"relmse": {name: [per seed]}, "acceptance": {name: [...]},
    "reference": image, "images": {name: first seed's image}}``. Defaults follow spec 1.6's
    torus column (large-step probability 0.5, threshold 0.01, sigma 0.01 for both kernels,
    128 chains); the spec's size is 128x128 at 256 samples per pixel. ``png``: a path for
    the reference and the variants' first-seed images side by side (tone-mapped alike)."""
    scene = scenes.torus_glass_cube(tuple(resolution))
    ref = (indirect_reference(scene, reference_spp, max_length) if reference is None
           else reference)
    ps = PathSpace(scene, max_length=max_length, backend=backend,
                   roughness_threshold=roughness_threshold)
    out = {"relmse": {}, "acceptance": {}, "reference": ref, "images": {}}
    for name, (step, param) in AE10_VARIANTS.items():
        errors, acc = [], []
        for s in seeds:
            r = render_mlt(scene, mutations_per_pixel, method="h2mc", small_step=step,
                           chains=chains, large_step_prob=large_step_prob, sigma2=sigma2,
                           bootstrap_samples=bootstrap_samples, direct_spp=0, seed=s,
                           path_space=ps, parameterization=param,
                           roughness_threshold=roughness_threshold,
                           lens_perturb_prob=0.0)  # the small steps alone differ
            errors.append(rel_mse(r.indirect, ref))
            acc.append(r.stats["small"].acceptance)
            out["images"].setdefault(name, r.indirect)
        out["relmse"][name], out["acceptance"][name] = errors, acc
    if png is not None:
        row = np.concatenate([ref, *out["images"].values()], axis=1)
        scale = np.percentile(ref, 99) or 1.0
        write_png(png, np.clip(row / scale, 0.0, 1.0) ** (1 / 2.2))
    return out


AE11_VARIANTS = {  # name -> render_mlt arguments
    "h2mc, time in the Hessian": dict(method="h2mc", time_mode="hessian"),
    "h2mc, time independent": dict(method="h2mc", time_mode="independent"),
    "mmlt": dict(method="mmlt"),
}


def plain_monte_carlo(path_space, samples, seed=0, batch=1 << 16):
    """The image of paths of ``min_length..max_length`` segments by plain Monte Carlo in
    primary sample space: uniform states splatted with their contribution (the sum over
    techniques), (H, W, 3). Motion-blurred where meshes move (edge_rt's path tracer is not)."""
    ps, rng = path_space, np.random.default_rng(seed)
    npix = ps.width * ps.height
    acc = np.zeros((npix, 3))
    n = batch * max(1, int(samples) // batch)
    for _ in range(n // batch):
        p = ps.trace(rng.random((batch, ps.dim)))
        for c in range(3):
            acc[:, c] += np.bincount(p.pixel, p.rgb[:, c], minlength=npix)
    return (acc * (npix / n)).reshape(ps.height, ps.width, 3)


def ae11_moving_caustics(resolution=(24, 24), mutations_per_pixel=128, max_length=4,
                         seeds=(0, 1, 2, 3, 4, 5), reference_samples=1 << 23, chains=256,
                         sigma2=1e-3, large_step_prob=0.3, bootstrap_samples=1 << 18,
                         reference=None, png=None):
    """AE-11: each variant of :data:`AE11_VARIANTS` (time in the H2MC Hessian, time perturbed
    independently by the prior's kick, MMLT) renders edge_rt's ``moving_caustics`` (paths of
    3..``max_length`` segments; the caustic is camera - floor - ball - ball - light) with
    ``mutations_per_pixel`` per seed; relMSE against plain Monte Carlo with
    ``reference_samples`` states (:func:`plain_monte_carlo`). ``sigma2`` 1e-3 gives the H2MC
    variants 60-63 % small-step acceptance (spec 11.1: 50-70 %; 1e-4 gave 75-84 %); the
    bootstrap of 2^18 states keeps b's error (shared by every variant of a seed: one seed's
    relMSE was 10x the others' at 2^16) below the chains'.

    Equal time: relMSE falls as 1/t (AE-8), so each run's relMSE is scaled by its variant's
    cost, ``relmse * c_v / median_v(c_v)`` with ``c_v`` the variant's median wall time over
    the seeds (``"equal_time"``): sizing runs to a wall-clock budget from a calibration run
    was tried and was unreliable on shared cores (runs meant to take 20 s took 10-54 s). The
    variants run interleaved (seed by seed), after one warm-up run each (lazily compiled
    code, caches), so that load drift hits them alike. Returns ``{"relmse", "equal_time",
    "seconds", "acceptance": {name: [per seed]}, "reference": image, "images": {name: first
    seed's image}}``. ``png``: the reference and the variants' first-seed images in the top
    row (tone-mapped alike), their per-pixel relMSE maps below (one colour scale)."""
    scene = scenes.moving_caustics(tuple(resolution))
    ps = PathSpace(scene, max_length=max_length)
    u = np.random.default_rng(0).random((256, ps.dim))  # compile every kernel up front
    ps.log_f_star_derivatives(u, ps.trace(u))
    ref = plain_monte_carlo(ps, reference_samples, seed=91) if reference is None else reference
    keys = ("relmse", "seconds", "acceptance")
    out = {k: {} for k in keys} | {"reference": ref, "images": {}}
    common = dict(chains=chains, sigma2=sigma2, large_step_prob=large_step_prob,
                  bootstrap_samples=bootstrap_samples, direct_spp=0, path_space=ps)
    for kw in AE11_VARIANTS.values():
        render_mlt(scene, 8, seed=1 << 20, **common, **kw)
    for s in seeds:
        for name, kw in AE11_VARIANTS.items():
            r = render_mlt(scene, mutations_per_pixel, seed=s, **common, **kw)
            for k, v in zip(keys, (rel_mse(r.indirect, ref), r.seconds,
                                   r.stats["small"].acceptance)):
                out[k].setdefault(name, []).append(v)
            out["images"].setdefault(name, r.indirect)
    cost = {name: float(np.median(ts)) for name, ts in out["seconds"].items()}
    t_common = float(np.median(list(cost.values())))
    out["equal_time"] = {name: [e * cost[name] / t_common for e in out["relmse"][name]]
                         for name in cost}
    if png is not None:
        write_comparison_png(png, ref, out["images"].values())
    return out
