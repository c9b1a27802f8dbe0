"""Embedded deformation (Sumner et al. 2007; an Opt paper example): a deformation graph whose
nodes carry an affine map (3x3 matrix R_j, row-major in 9 channels, and a translation t_j),
kept near-rigid and consistent with its neighbours, moved by handle nodes.

    r_rot(j)  = sqrt(w_rot) [c1.c2, c1.c3, c2.c3, c1.c1 - 1, c2.c2 - 1, c3.c3 - 1]   (c_k: columns of R_j)
    r_reg(e)  = sqrt(w_reg) (R_v0 (g_v1 - g_v0) + g_v0 + t_v0 - (g_v1 + t_v1))      (both directions)
    r_fit(j)  = sqrt(w_fit) (g_j + t_j - c_j)                                        where node j is a handle

The graph is the ``mesh.tube_mesh`` vertex graph (rest positions g). Acceptance: when every
handle moves by one rigid motion, that motion (R_j = its rotation everywhere) is the exact
minimiser with zero cost; bending the tube (the top ring turned and shifted, the bottom pinned)
keeps every R_j close to a rotation and reaches the handles."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, Graph, Param, Select, Unknown, Vector, compile_problem,
                     greatereq, solve)

from ._image import side_by_side, write_png
from .mesh import NONE, directed_edges, tube_mesh, wireframe

NAME = "embedded_deformation"


def matvec(R, v):
    """R (a 9-channel row-major Vec) times the 3-vector v."""
    return Vector(*[R[3 * i] * v[0] + R[3 * i + 1] * v[1] + R[3 * i + 2] * v[2] for i in range(3)])


def energy() -> Energy:
    N = Dim("N")
    R, T = Unknown("R", N, 9), Unknown("T", N, 3)
    G0, C = Array("G0", N, 3), Array("Constraints", N, 3)
    G = Graph("G", v0=N, v1=N)
    w_rot, w_reg, w_fit = Param("w_rotSqrt"), Param("w_regSqrt"), Param("w_fitSqrt")
    Rj = R(0)
    c = [Vector(Rj[k], Rj[3 + k], Rj[6 + k]) for k in range(3)]
    rot = Vector(c[0].dot(c[1]), c[0].dot(c[2]), c[1].dot(c[2]),
                 c[0].dot(c[0]) - 1, c[1].dot(c[1]) - 1, c[2].dot(c[2]) - 1)
    reg = matvec(R(G.v0), G0(G.v1) - G0(G.v0)) + G0(G.v0) + T(G.v0) - (G0(G.v1) + T(G.v1))
    fit = Select(greatereq(C(0, 0), -999999.9), w_fit * (G0(0) + T(0) - C(0)), 0)
    return Energy(w_rot * rot, w_reg * reg, fit)


def make_plan(V, v0, v1, handles, targets, w_rot=1.0, w_reg=1.0, w_fit=10.0):
    n = len(V)
    C = np.full((n, 3), NONE)
    C[handles] = targets
    identity = np.tile(np.eye(3).ravel(), (n, 1))
    return compile_problem(energy(), arrays={"G0": V, "Constraints": C, "R": identity,
                                             "T": np.zeros((n, 3))},
                           params={"w_rotSqrt": w_rot, "w_regSqrt": w_reg, "w_fitSqrt": w_fit},
                           graphs={"G": {"v0": v0, "v1": v1}})


def rotation(axis, angle):
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


def run(size=(12, 8), verbose=False, out_dir=None, *, twist_deg=50.0, shift=1.5) -> dict:
    rings, segs = size
    V, tris = tube_mesh(rings, segs)
    v0, v1 = directed_edges(tris)
    bottom, top = np.arange(segs), np.arange((rings - 1) * segs, rings * segs)
    handles = np.concatenate([bottom, top])
    # (1) one rigid motion of every handle: reproduced exactly
    Rr, tr = rotation([1.0, 2.0, 0.5], 0.7), np.array([0.3, -1.0, 2.0])
    t0 = time.perf_counter()
    plan = make_plan(V, v0, v1, handles, V[handles] @ Rr.T + tr)
    t_compile = time.perf_counter() - t0
    rigid = solve(plan, plan.x0)
    u = plan.vector_to_unknowns(rigid.x)
    rigid_R_err = float(np.max(np.abs(u["R"].reshape(-1, 3, 3) - Rr)))
    rigid_pos_err = float(np.max(np.abs(V + u["T"] - (V @ Rr.T + tr))))
    # (2) bend: bottom pinned, top ring turned about the axis and pushed sideways
    Rz = rotation([0, 0, 1], np.deg2rad(twist_deg))
    centre = V[top].mean(0)
    targets = np.concatenate([V[bottom], (V[top] - centre) @ Rz.T + centre + [shift, 0, 0]])
    plan = make_plan(V, v0, v1, handles, targets)
    res = solve(plan, plan.x0, verbose=verbose)
    u = plan.vector_to_unknowns(res.x)
    Rs = u["R"].reshape(-1, 3, 3)
    P = V + u["T"]
    acc = res.accepted_costs
    out = {
        "example": NAME, "size": f"{rings}x{segs}", "unknowns": plan.n, "method": "lm",
        "initial_cost": res.initial_cost, "cost": res.cost, "iterations": res.iterations,
        "pcg_iterations": res.pcg_iterations, "time_compile_s": t_compile, "time_solve_s": res.wall_time,
        "rigid_cost": rigid.cost, "rigid_initial_cost": rigid.initial_cost,
        "rigid_R_err": rigid_R_err, "rigid_pos_err": rigid_pos_err,
        "converged": res.converged, "monotone_accepted_costs": all(b <= a for a, b in zip(acc, acc[1:])),
        "orthonormality_err": float(np.max(np.abs(np.einsum("nki,nkj->nij", Rs, Rs) - np.eye(3)))),
        "handle_max_err": float(np.max(np.linalg.norm(P[handles] - targets, axis=1))),
        "finite": bool(np.all(np.isfinite(res.x))),
    }
    if verbose:
        print(f"[{NAME}] rigid: cost {rigid.cost:.1e}, max|R - R*| {rigid_R_err:.1e}; bend: handle err "
              f"{out['handle_max_err']:.2e}, max|R^T R - I| {out['orthonormality_err']:.2e}")
    if out_dir is not None:
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"),
                               side_by_side(wireframe([V, P], tris, colours=[(120, 120, 120), (40, 70, 160)])))
    return out
