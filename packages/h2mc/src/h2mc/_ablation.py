"""AE-10 (spec 10, Fig 6-7 analog): the parameterisation ablation on the torus in a glass cube.

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
from ._png import write_png

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
                           roughness_threshold=roughness_threshold)
            errors.append(rel_mse(r.indirect, ref))
            acc.append(r.stats["small"].acceptance)
            out["images"].setdefault(name, r.indirect)
        out["relmse"][name], out["acceptance"][name] = errors, acc
    if png is not None:
        row = np.concatenate([ref, *out["images"].values()], axis=1)
        scale = np.percentile(ref, 99) or 1.0
        write_png(png, np.clip(row / scale, 0.0, 1.0) ** (1 / 2.2))
    return out
