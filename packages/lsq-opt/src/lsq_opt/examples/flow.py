"""Example 9 - dense optical flow (spec 3.9, Fig. 30; AE-13): Horn-Schunck with a
``SampledImage``, coarse-to-fine.

    r_fit(p)    = sqrt(w_fit) (I(p) - I_hat(i + u_p, j + v_p))        I_hat = SampledImage(I_hat, dx, dy)
    r_reg(p, n) = sqrt(w_reg) (X_p - X_{p+n})   if InBounds(n)

Synthetic pair: a smooth texture ``f`` and its copy moved by a known sub-pixel flow
(default (1.3, -0.7) px): ``I = f(x, y)``, ``I_hat = f(x - 1.3, y + 0.7)``; the derivative images
are central differences of ``I_hat`` (as in [R]). Two pyramid levels (the coarse flow, doubled,
initialises the fine level), GN with 3 outer passes per level, 1 non-linear iteration and 50
PCG iterations each, w_reg = 0.1 and w_fit ramped from 10 towards 50 ([R]'s relaxation)."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, InBounds, Index, Param, SampledImage, Select, Unknown,
                     compile_problem, solve)

from ._image import side_by_side, to_rgb8, write_png

NAME = "flow"
NBRS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def energy() -> Energy:
    W, H = Dim("W"), Dim("H")
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    X = Unknown("X", (W, H), 2)
    I = Array("I", (W, H))
    I_hat = SampledImage(Array("I_hat", (W, H)), Array("I_hat_dx", (W, H)),
                         Array("I_hat_dy", (W, H)))
    i, j = Index(0), Index(1)
    terms = [w_fit * (I(0, 0) - I_hat(i + X(0, 0, 0), j + X(0, 0, 1)))]
    for nx, ny in NBRS:
        terms.append(Select(InBounds(nx, ny), w_reg * (X(0, 0) - X(nx, ny)), 0))
    return Energy(*terms)


def texture(x, y, seed=0):
    """A smooth random texture (sum of sinusoids with periods of 6-20 px)."""
    rng = np.random.default_rng(seed)
    out = np.zeros(np.broadcast(x, y).shape)
    for _ in range(12):
        k = rng.uniform(2 * np.pi / 20, 2 * np.pi / 6)
        th = rng.uniform(0, np.pi)
        out += rng.uniform(0.3, 1.0) * np.sin(k * (np.cos(th) * x + np.sin(th) * y)
                                              + rng.uniform(0, 2 * np.pi))
    return out / 6


def make_pair(size=(64, 48), flow=(1.3, -0.7), scale=1.0, seed=0):
    """(I, I_hat, dx, dy) at pixel spacing ``scale`` (2 for the coarse level)."""
    W, H = size
    x, y = np.meshgrid(np.arange(W) * scale, np.arange(H) * scale, indexing="ij")
    I = texture(x, y, seed)
    I_hat = texture(x - flow[0], y - flow[1], seed)
    dx, dy = np.gradient(I_hat)
    return I, I_hat, dx, dy


def solve_level(I, I_hat, dx, dy, X0, w_fits, w_reg, pcg_its, verbose=False):
    plan = compile_problem(energy(), arrays={"I": I, "I_hat": I_hat, "I_hat_dx": dx,
                                             "I_hat_dy": dy, "X": X0},
                           params={"w_fit": np.sqrt(w_fits[0]), "w_reg": np.sqrt(w_reg)})
    x = plan.x0.copy()
    its = pcg = 0
    t = 0.0
    first = None
    for wf in w_fits:
        plan.set_param("w_fit", np.sqrt(wf))
        res = solve(plan, x, method="gn", max_iterations=1, pcg_max_iterations=pcg_its,
                    preconditioner="none", verbose=verbose)
        first = res.initial_cost if first is None else first
        x = res.x
        its += res.iterations
        pcg += res.pcg_iterations
        t += res.wall_time
    return plan.vector_to_unknowns(x)["X"], dict(iterations=its, pcg_iterations=pcg, time=t,
                                                 initial_cost=first, cost=res.cost, n=plan.n)


def run(size=(64, 48), verbose=False, out_dir=None, *, flow=(1.3, -0.7), levels=2, num_iter=3,
        pcg_max_iterations=50, w_reg=0.1, w_fit0=10.0, w_fit1=50.0) -> dict:
    W, H = size
    t0 = time.perf_counter()
    X = None
    stats = []
    step = (w_fit1 - w_fit0) / (num_iter * levels)
    wf = w_fit0
    for lev in reversed(range(levels)):
        s = 2 ** lev
        sz = (-(-W // s), -(-H // s))
        I, I_hat, dx, dy = make_pair(sz, flow, scale=s)
        # the flow is in pixels of this level
        if X is None:
            X0 = np.zeros(sz + (2,))
        else:
            X0 = 2.0 * np.repeat(np.repeat(X, 2, 0), 2, 1)[: sz[0], : sz[1]]
        w_fits = [wf + step * k for k in range(num_iter)]
        wf += step * num_iter
        X, st = solve_level(I, I_hat, dx, dy, X0, w_fits, w_reg, pcg_max_iterations, verbose)
        stats.append(st)
    b = 4
    err = np.linalg.norm(X - np.array(flow), axis=-1)[b:-b, b:-b]
    out = {
        "example": NAME, "size": f"{W}x{H}", "unknowns": stats[-1]["n"], "method": "gn",
        "initial_cost": stats[0]["initial_cost"], "cost": stats[-1]["cost"],
        "iterations": sum(s["iterations"] for s in stats),
        "pcg_iterations": sum(s["pcg_iterations"] for s in stats),
        "time_compile_s": time.perf_counter() - t0 - sum(s["time"] for s in stats),
        "time_solve_s": sum(s["time"] for s in stats),
        "mean_epe_interior": float(err.mean()), "max_epe_interior": float(err.max()),
        "finite": bool(np.all(np.isfinite(X))),
    }
    if verbose:
        print(f"[{NAME}] mean endpoint error (interior) {out['mean_epe_interior']:.4f} px")
    if out_dir is not None:
        I, I_hat, _, _ = make_pair(size, flow)
        mag = np.linalg.norm(X, axis=-1)
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), side_by_side(
            [to_rgb8(I.T), to_rgb8(I_hat.T), to_rgb8(X[..., 0].T, 0, 2), to_rgb8(X[..., 1].T, -1.5, 0.5),
             to_rgb8(mag.T, 0, 2)], upscale=3))
    return out
