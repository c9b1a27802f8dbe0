"""Example 2 - Poisson image editing (spec 3.6, Fig. 27; AE-3(a)).

The gradients of a synthetic RGBA source T (a textured blob) are pasted into a target image inside
a mask; pixels outside the mask are Exclude'd (they keep the target's values and act as Dirichlet
data):

    Exclude(M != 0)
    for n in 4-neighbourhood:  r(p, n) = (X_p - X_{p+n}) - (T_p - T_{p+n})   if InBounds(n) else 0

The energy is linear: one Gauss-Newton iteration with PCG to ||r||/||b|| < 1e-10 (float64) is
compared with a direct sparse solve (SuperLU via ``scipy.sparse.linalg.spsolve``) of the Dirichlet
4-neighbour Poisson system on the free pixels, assembled independently of the compiler."""
from __future__ import annotations

import os
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from lsq_opt import (Array, Dim, Energy, Exclude, InBounds, Not, Select, Unknown, compile_problem,
                     eq, solve)

from ._image import side_by_side, to_rgb8, write_png

NAME = "poisson"
NBRS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def energy(channels=4) -> Energy:
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H), channels)  # initialised to the target (base) image
    T = Array("T", (W, H), channels)    # the inserted (source) image
    M = Array("M", (W, H))              # mask: 0 = free (pasted region), else fixed
    terms = [Exclude(Not(eq(M(0, 0), 0)))]
    for x, y in NBRS:
        e = (X(0, 0) - X(x, y)) - (T(0, 0) - T(x, y))
        terms.append(Select(InBounds(x, y), e, 0))
    return Energy(*terms)


def make_data(size=(96, 80), seed=0):
    """(target, source, mask) indexed [x, y]; target/source RGBA in [0, 1]; mask 0 inside an ellipse."""
    W, H = size
    rng = np.random.default_rng(seed)
    u, v = np.meshgrid(np.linspace(0, 1, W), np.linspace(0, 1, H), indexing="ij")
    # target: a sky-to-ground gradient with soft stripes, alpha varying slowly
    target = np.stack([0.2 + 0.5 * v, 0.4 + 0.3 * np.sin(6 * u) * 0.5, 0.9 - 0.6 * v,
                       0.8 + 0.2 * u], -1)
    target[..., :3] += 0.05 * np.sin(40 * u + 10 * v)[..., None]
    # source: a bright blob with a random-phase texture
    ph = rng.uniform(0, 2 * np.pi, 3)
    r2 = ((u - 0.5) / 0.3) ** 2 + ((v - 0.5) / 0.25) ** 2
    blob = np.exp(-r2)
    tex = np.stack([np.sin(25 * u + ph[0]) * np.cos(19 * v + ph[1]),
                    np.sin(31 * v + ph[2]),
                    np.cos(17 * (u + v))], -1)
    source = np.concatenate([0.45 * blob[..., None] * np.array([1.0, 0.6, 0.2]) + 0.1 * tex * blob[..., None],
                             (0.5 + 0.5 * blob)[..., None]], -1)
    mask = np.where(((u - 0.5) / 0.32) ** 2 + ((v - 0.5) / 0.3) ** 2 < 1.0, 0.0, 1.0)
    return target, source, mask


def direct_solve(target, source, mask):
    """Dirichlet 4-neighbour Poisson system on the free pixels (mask == 0), border neighbours
    dropped: deg_p X_p - sum_{q free} X_q = sum_q (T_p - T_q) + sum_{q fixed} X_q. Returns X."""
    W, H = mask.shape
    free = mask == 0
    idx = np.full((W, H), -1, np.int64)
    idx[free] = np.arange(int(free.sum()))
    n = int(free.sum())
    rows, cols, vals = [], [], []
    deg = np.zeros(n)
    rhs = np.zeros((n, target.shape[-1]))
    fi, fj = np.nonzero(free)
    p = idx[fi, fj]
    for dx, dy in NBRS:
        qi, qj = fi + dx, fj + dy
        ok = (qi >= 0) & (qi < W) & (qj >= 0) & (qj < H)
        pp, qi, qj = p[ok], qi[ok], qj[ok]
        fi_ok, fj_ok = fi[ok], fj[ok]
        deg[pp] += 1
        rhs[pp] += source[fi_ok, fj_ok] - source[qi, qj]
        qfree = free[qi, qj]
        rows.append(pp[qfree]); cols.append(idx[qi[qfree], qj[qfree]]); vals.append(-np.ones(qfree.sum()))
        rhs[pp[~qfree]] += target[qi[~qfree], qj[~qfree]]
    A = sp.csc_matrix((np.concatenate([deg] + vals), (np.concatenate([np.arange(n)] + rows),
                                                      np.concatenate([np.arange(n)] + cols))), shape=(n, n))
    lu = spla.splu(A)
    X = target.copy()
    X[free] = lu.solve(rhs)
    return X


def run(size=(96, 80), verbose=False, out_dir=None, *, seed=0, pcg_tolerance=1e-10,
        pcg_max_iterations=20000, backend="llvm") -> dict:
    W, H = size
    target, source, mask = make_data(size, seed)
    t0 = time.perf_counter()
    plan = compile_problem(energy(target.shape[-1]), arrays={"X": target, "T": source, "M": mask},
                           dtype=np.float64, backend=backend)
    t_compile = time.perf_counter() - t0
    res = solve(plan, plan.x0, method="gn", max_iterations=1, pcg_max_iterations=pcg_max_iterations,
                pcg_tolerance=pcg_tolerance, verbose=verbose)
    X = plan.vector_to_unknowns(res.x)["X"]
    t1 = time.perf_counter()
    Xd = direct_solve(target, source, mask)
    t_direct = time.perf_counter() - t1
    rng_int = float(max(np.ptp(Xd), np.ptp(target)))
    err = float(np.max(np.abs(X - Xd)))
    out = {
        "example": NAME, "size": f"{W}x{H}", "unknowns": plan.n, "method": "gn",
        "initial_cost": res.initial_cost, "cost": res.cost,
        "max_abs_diff_direct": err, "intensity_range": rng_int, "rel_err_direct": err / rng_int,
        "fixed_unchanged": bool(np.array_equal(X[mask != 0], target[mask != 0])),
        "iterations": res.iterations, "pcg_iterations": res.pcg_iterations,
        "time_compile_s": t_compile, "time_solve_s": res.wall_time, "time_direct_s": t_direct,
    }
    if verbose:
        print(f"[{NAME}] {W}x{H}x{target.shape[-1]}: {plan.n} unknowns, cost {res.initial_cost:.4e} -> "
              f"{res.cost:.4e}, {res.pcg_iterations} PCG its, max|X - direct| = {err:.2e} "
              f"({err / rng_int:.2e} x range)")
    if out_dir is not None:
        naive = np.where((mask == 0)[..., None], source, target)  # plain copy-paste, for contrast
        panels = [to_rgb8(a.transpose(1, 0, 2), 0.0, 1.0) for a in (target, source, naive, X)]
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"),
                               side_by_side(panels, upscale=max(1, 256 // max(W, H))))
    return out
