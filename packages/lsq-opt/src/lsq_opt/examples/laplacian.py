"""Example 1 - Laplacian smoothing of a noisy image (spec 3.1, Fig. 3; AE-2).

    E = sum_p  [w_fit (X_p - A_p)]^2 + [w_reg (X_p - X_{p+(1,0)})]^2 + [w_reg (X_p - X_{p+(0,1)})]^2

The energy is linear, so one Gauss-Newton iteration with PCG run to ||r||/||b|| < 1e-12 (float64)
is the exact minimiser; it is compared with ``scipy.sparse.linalg.spsolve`` of the normal
equations J^T J dx = -J^T F built from ``plan.jacobian``."""
from __future__ import annotations

import os
import time

import numpy as np
import scipy.sparse.linalg as spla

from lsq_opt import Array, Dim, Energy, Param, Unknown, compile_problem, solve

from ._image import side_by_side, to_rgb8, write_png

NAME = "laplacian"


def energy() -> Energy:
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    return Energy(w_fit * (X(0, 0) - A(0, 0)),   # fitting
                  w_reg * (X(0, 0) - X(1, 0)),   # regularisation (horizontal)
                  w_reg * (X(0, 0) - X(0, 1)))   # regularisation (vertical)


def make_data(size=(64, 48), seed=0, noise=0.15):
    """A smooth synthetic image (indexed [x, y]) plus Gaussian noise: (clean, noisy)."""
    W, H = size
    x, y = np.meshgrid(np.linspace(0, 1, W), np.linspace(0, 1, H), indexing="ij")
    clean = 0.5 + 0.3 * np.sin(2 * np.pi * x) * np.cos(3 * np.pi * y) + 0.2 * np.exp(-((x - .6) ** 2 + (y - .4) ** 2) / .02)
    rng = np.random.default_rng(seed)
    return clean, clean + noise * rng.standard_normal((W, H))


def direct_solution(plan, x0):
    """x0 + spsolve(J^T J, -J^T F) with J, F at x0 (the exact minimiser of the linear problem)."""
    J = plan.jacobian(x0).tocsc()
    F = plan.residuals(x0)
    N = (J.T @ J).tocsc()
    return x0 + spla.spsolve(N, -(J.T @ F))


def run(size=(64, 48), verbose=False, out_dir=None, *, w_fit=0.1, w_reg=0.9, seed=0,
        pcg_tolerance=1e-12, pcg_max_iterations=5000, backend="llvm") -> dict:
    W, H = size
    clean, noisy = make_data(size, seed)
    t0 = time.perf_counter()
    plan = compile_problem(energy(), arrays={"A": noisy}, params={"w_fit": w_fit, "w_reg": w_reg},
                           dtype=np.float64, backend=backend)
    t_compile = time.perf_counter() - t0
    x0 = plan.unknowns_to_vector({"X": np.zeros((W, H))})
    res = solve(plan, x0, method="gn", max_iterations=1, pcg_max_iterations=pcg_max_iterations,
                pcg_tolerance=pcg_tolerance, verbose=verbose)
    t1 = time.perf_counter()
    x_direct = direct_solution(plan, x0)
    t_direct = time.perf_counter() - t1
    X = plan.vector_to_unknowns(res.x)["X"]
    out = {
        "example": NAME, "size": f"{W}x{H}", "unknowns": plan.n, "method": "gn",
        "initial_cost": res.initial_cost, "cost": res.cost, "cost_direct": plan.cost(x_direct),
        "max_abs_diff_direct": float(np.max(np.abs(res.x - x_direct))),
        "iterations": res.iterations, "pcg_iterations": res.pcg_iterations,
        "rmse_noisy": float(np.sqrt(np.mean((noisy - clean) ** 2))),
        "rmse_result": float(np.sqrt(np.mean((X - clean) ** 2))),
        "time_compile_s": t_compile, "time_solve_s": res.wall_time, "time_direct_s": t_direct,
    }
    if verbose:
        print(f"[{NAME}] {W}x{H}: cost {res.initial_cost:.4e} -> {res.cost:.4e}, "
              f"{res.pcg_iterations} PCG its, max|x - spsolve| = {out['max_abs_diff_direct']:.2e}")
    if out_dir is not None:
        lo, hi = float(noisy.min()), float(noisy.max())
        png = side_by_side([to_rgb8(noisy.T, lo, hi), to_rgb8(X.T, lo, hi)], upscale=4)
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), png)
    return out
