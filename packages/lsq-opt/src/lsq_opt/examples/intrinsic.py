"""Example 12 - intrinsic image decomposition by IRLS (spec 3.12, Fig. 33; AE-12).

Log-domain image ``i = r + s`` (RGB reflectance r, scalar shading s). Energy per Fig. 33:

    r_alb(p, n) = sqrt(w_regAlbedo) * L_p(r_p - r_{p+n}, r_const,p - r_const,p+n, p)   (InBounds)
    r_shd(p, n) = sqrt(w_regShading) * (s_p - s_{p+n})                                   (InBounds)
    r_fit(p)    = sqrt(w_fit) * (r_p + s_p - i_p)

``r_const`` is the constant view ``r.const()``: the IRLS weight ``(||r_p - r_{p+n}|| + 1e-7)^(p-2)``
is frozen at the current iterate and refreshed at every Gauss-Newton iteration, so each GN
iteration is one IRLS step. Synthetic data: piecewise-constant reflectance (coloured blocks) plus
smooth shading. The shading scale is not identifiable from one image (r + c, s - c fit equally);
the energy's regularisers pick one solution, so the check is on structure: with p = 0.8 the
recovered reflectance gradients are sparser than with p = 2 (Fig. 20's direction)."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, InBounds, L_p, Param, Select, Unknown, compile_problem,
                     solve)

from ._image import side_by_side, to_rgb8, write_png

NAME = "intrinsic"
NBRS = ((1, 0), (-1, 0), (0, 1), (0, -1))


# Fig. 33's binding indices as printed (r_const shares r's index 5: the same buffer)
FIG33_INDICES = {"w_fitSqrt": 0, "w_regSqrtAlbedo": 1, "w_regSqrtShading": 2, "pNorm": 4,
                 "r": 5, "r_const": 5, "i": 6, "s": 8}


def energy(indices=None) -> Energy:
    """Fig. 33's energy, bound by name; with ``indices`` (e.g. :data:`FIG33_INDICES`) each
    declaration carries its binding index for ``compile_problem(positional=...)`` and
    ``r_const`` is an Array sharing ``r``'s index, as printed, instead of ``r.const()``."""
    ix = indices or {}
    W, H = Dim("W"), Dim("H")
    w_fit, w_alb, w_shd, p_norm = (Param(n, index=ix.get(n)) for n in (
        "w_fitSqrt", "w_regSqrtAlbedo", "w_regSqrtShading", "pNorm"))
    r = Unknown("r", (W, H), 3, index=ix.get("r"))
    # a constant view of the unknown (Fig. 33)
    r_const = r.const() if indices is None else Array("r_const", (W, H), 3,
                                                        index=ix["r_const"])
    i = Array("i", (W, H), 3, index=ix.get("i"))
    s = Unknown("s", (W, H), index=ix.get("s"))
    terms = []
    for x, y in NBRS:
        diff = r(0, 0) - r(x, y)
        diff_const = r_const(0, 0) - r_const(x, y)
        cost = L_p(diff, diff_const, p_norm, (W, H))
        terms.append(w_alb * Select(InBounds(0, 0), Select(InBounds(x, y), cost, 0), 0))
    for x, y in NBRS:
        diff = s(0, 0) - s(x, y)
        terms.append(w_shd * Select(InBounds(0, 0), Select(InBounds(x, y), diff, 0), 0))
    terms.append(w_fit * (r(0, 0) + s(0, 0) - i(0, 0)))
    return Energy(*terms)


def make_data(size=(48, 32), seed=0):
    """(log image, reflectance, shading), indexed [x, y]."""
    W, H = size
    rng = np.random.default_rng(seed)
    bx, by = max(2, W // 6), max(2, H // 4)
    cols = rng.uniform(-1.0, 0.0, (W // bx + 1, H // by + 1, 3))
    ii, jj = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")
    refl = cols[ii // bx, jj // by]
    shade = 0.4 * np.sin(2.0 * ii / W + 0.5) * np.cos(1.5 * jj / H) - 0.2
    return refl + shade[..., None], refl, shade


PARAMS = {"w_fitSqrt": np.sqrt(500.0), "w_regSqrtAlbedo": np.sqrt(1000.0),
          "w_regSqrtShading": np.sqrt(10000.0)}


def plan_for(img, p_norm, **kw):
    W, H = img.shape[:2]
    return compile_problem(energy(), arrays={"i": img, "r": img.copy(), "s": np.zeros((W, H))},
                           params=dict(PARAMS, pNorm=p_norm), **kw)


def grad_sparsity(r, thresh=1e-3):
    """Fraction of neighbour pairs whose reflectance differs by more than ``thresh``."""
    dx = np.linalg.norm(r[1:] - r[:-1], axis=-1)
    dy = np.linalg.norm(r[:, 1:] - r[:, :-1], axis=-1)
    return float((np.sum(dx > thresh) + np.sum(dy > thresh)) / (dx.size + dy.size))


def run(size=(48, 32), verbose=False, out_dir=None, *, p_norm=0.8, iterations=7,
        pcg_max_iterations=200) -> dict:
    img, refl, shade = make_data(size)
    out = {"example": NAME, "size": f"{size[0]}x{size[1]}", "method": "gn"}
    t0 = time.perf_counter()
    res_by_p = {}
    for p in (p_norm, 2.0):
        plan = plan_for(img, p)
        if p == p_norm:
            out["time_compile_s"] = time.perf_counter() - t0
        res = solve(plan, plan.x0, method="gn", max_iterations=iterations,
                    pcg_max_iterations=pcg_max_iterations, pcg_tolerance=1e-10,
                    function_tolerance=0.0, verbose=verbose)
        res_by_p[p] = (plan, res)
    plan, res = res_by_p[p_norm]
    u = plan.vector_to_unknowns(res.x)
    u2 = res_by_p[2.0][0].vector_to_unknowns(res_by_p[2.0][1].x)
    out.update({
        "unknowns": plan.n, "initial_cost": res.initial_cost, "cost": res.cost,
        "iterations": res.iterations, "pcg_iterations": res.pcg_iterations,
        "time_solve_s": res.wall_time,
        "grad_frac_p": grad_sparsity(u["r"]), "grad_frac_p2": grad_sparsity(u2["r"]),
        "grad_frac_true": grad_sparsity(refl),
        "fit_rms": float(np.sqrt(np.mean((u["r"] + u["s"][..., None] - img) ** 2))),
        "finite": bool(np.all(np.isfinite(res.x))),
    })
    if verbose:
        print(f"[{NAME}] reflectance gradients > 1e-3: p={p_norm}: {out['grad_frac_p']:.3f}, "
              f"p=2: {out['grad_frac_p2']:.3f}, truth {out['grad_frac_true']:.3f}")
    if out_dir is not None:
        # log-domain panels, each on its own range: input | r (p) | s (p) | r (p = 2)
        tiles = [to_rgb8(np.transpose(img, (1, 0, 2))), to_rgb8(np.transpose(u["r"], (1, 0, 2))),
                 to_rgb8(u["s"].T), to_rgb8(np.transpose(u2["r"], (1, 0, 2)))]
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), side_by_side(tiles, upscale=4))
    return out
