"""Robust non-rigid alignment (spec 3.11, Fig. 32): ARAP mesh deformation with a point-to-plane
data term whose correspondences each carry an unknown confidence w_i (robust optimisation by
auxiliary unknowns), so spurious far-off correspondences lose their weight.

    r_fit(i)  = sqrt(w_fit) w_i n_i.(o_i - c_i)     if c_i is valid else 0
    r_conf(i) = 0.1 (1 - w_i^2)                     if c_i is valid else 0
    r_reg(e)  = sqrt(w_reg) [(o_v0 - o_v1) - Rotate3D(a_v0)(u_v0 - u_v1)]

Synthetic data: the ``mesh.tube_mesh`` tube (source) and the same tube twisted about its axis
(target, twisted from bottom to top, with its surface normals); every vertex corresponds to its
twisted copy, except 10 % of the correspondences, replaced by points 2-3 units off. The twist
(20 degrees) is tangential to the tube, which point-to-plane terms do not see, so the fit is
measured as the inliers' plane distance |n.(o - c)|. Acceptance: the outliers' confidences fall
to 0, the inliers' stay near 1, and the inliers fit much better than with every confidence fixed
at 1 (``energy(robust=False)``: the outliers drag the surface)."""
from __future__ import annotations

import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, Graph, Param, Rotate3D, Select, Unknown, compile_problem,
                     greatereq, solve)

from .mesh import directed_edges, tube_mesh

NAME = "robust_alignment"


def energy(robust: bool = True) -> Energy:
    """Fig. 32; ``robust=False``: the confidences are data (all 1), the plain ARAP + ICP energy."""
    N = Dim("N")
    Offset, Angle = Unknown("Offset", N, 3), Unknown("Angle", N, 3)
    RobustWeights = (Unknown if robust else Array)("RobustWeights", N)
    UrShape, Constraints = Array("UrShape", N, 3), Array("Constraints", N, 3)
    ConstraintNormals = Array("ConstraintNormals", N, 3)
    G = Graph("G", v0=N, v1=N)
    w_fit, w_reg = Param("w_fitSqrt"), Param("w_regSqrt")
    w = RobustWeights(0)
    valid = greatereq(Constraints(0)[0], -999999.9)
    terms = [w_fit * Select(valid, w * ConstraintNormals(0).dot(Offset(0) - Constraints(0)), 0.0)]
    if robust:
        terms.append(0.1 * Select(valid, 1 - w * w, 0.0))
    terms.append(w_reg * ((Offset(G.v0) - Offset(G.v1))
                          - Rotate3D(Angle(G.v0), UrShape(G.v0) - UrShape(G.v1))))
    return Energy(*terms)


def make_data(rings=16, segs=12, twist_deg=20.0, outlier_fraction=0.1, seed=0):
    """Source vertices, graph, correspondences, their normals and the outlier mask."""
    V, tris = tube_mesh(rings, segs)
    theta = np.deg2rad(twist_deg) * V[:, 2] / V[:, 2].max()
    c, s = np.cos(theta), np.sin(theta)
    target = np.stack([c * V[:, 0] - s * V[:, 1], s * V[:, 0] + c * V[:, 1], V[:, 2]], -1)
    normals = target * [1, 1, 0]
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    outliers = rng.random(len(V)) < outlier_fraction
    direction = rng.normal(size=(len(V), 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    constraints = np.where(outliers[:, None], target + rng.uniform(2, 3, (len(V), 1)) * direction, target)
    return V, directed_edges(tris), constraints, normals, target, outliers


def make_plan(V, edges, constraints, normals, robust=True, w_fit=1.0, w_reg=1.0):
    """w_fit = 1 against the listing's fixed confidence weight 0.1: a correspondence keeps its
    confidence while w_fit (n.(o - c))^2 stays below about 0.02 (the minimiser of
    s w_fit d^2 + 0.01 (1 - s)^2 over s = w^2 is 1 - 50 w_fit d^2), so the inliers' initial
    plane distances (<= 0.06 for this twist) keep w near 1 and the outliers' (~1) drop it."""
    arrays = {"UrShape": V, "Constraints": constraints, "ConstraintNormals": normals, "Offset": V,
              "Angle": np.zeros_like(V), "RobustWeights": np.ones(len(V))}
    return compile_problem(energy(robust), arrays=arrays,
                           params={"w_fitSqrt": np.sqrt(w_fit), "w_regSqrt": np.sqrt(w_reg)},
                           graphs={"G": {"v0": edges[0], "v1": edges[1]}})


def plane_rms(P, C, n):
    return float(np.sqrt(np.mean(np.sum(n * (P - C), 1) ** 2)))


def run(size=(16, 12), verbose=False, out_dir=None) -> dict:
    V, edges, constraints, normals, target, outliers = make_data(*size)
    t0 = time.perf_counter()
    plan = make_plan(V, edges, constraints, normals)
    t_compile = time.perf_counter() - t0
    res = solve(plan, plan.x0, verbose=verbose)
    u = plan.vector_to_unknowns(res.x)
    plain = make_plan(V, edges, constraints, normals, robust=False)
    ref = solve(plain, plain.x0)
    P_plain = plain.vector_to_unknowns(ref.x)["Offset"]
    w = u["RobustWeights"]
    inl = ~outliers
    out = {
        "example": NAME, "size": f"{size[0]}x{size[1]}", "unknowns": plan.n, "method": "lm",
        "initial_cost": res.initial_cost, "cost": res.cost, "iterations": res.iterations,
        "pcg_iterations": res.pcg_iterations, "time_compile_s": t_compile, "time_solve_s": res.wall_time,
        "outliers": int(outliers.sum()), "converged": res.converged,
        "outlier_weight_max": float(np.max(np.abs(w[outliers]))),
        "inlier_weight_min": float(np.min(np.abs(w[inl]))),
        "inlier_err_robust": plane_rms(u["Offset"][inl], target[inl], normals[inl]),
        "inlier_err_plain": plane_rms(P_plain[inl], target[inl], normals[inl]),
        "finite": bool(np.all(np.isfinite(res.x))),
    }
    if verbose:
        print(f"[{NAME}] |w| on outliers <= {out['outlier_weight_max']:.2f}, on inliers >= "
              f"{out['inlier_weight_min']:.2f}; inlier rms plane distance robust {out['inlier_err_robust']:.3f} vs "
              f"fixed weights {out['inlier_err_plain']:.3f}")
    return out
