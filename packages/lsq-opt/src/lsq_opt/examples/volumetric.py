"""Volumetric ("3D LARAP") deformation (spec 3.10, Fig. 31): ARAP on a 3-D grid of nodes with a
6-neighbour stencil; a mesh embedded in the grid would follow it by trilinear interpolation.

    r_fit(p)   = sqrt(w_fit) (o_p - c_p)                        if c_p.x >= -999999.9 else 0
    r_reg(p,n) = sqrt(w_reg) [(o_p - o_{p+n}) - Rotate3D(a_p)(u_p - u_{p+n})]   n in {+-x, +-y, +-z}

Unknowns ``Offset`` (node positions, initialised to the rest grid u) and ``Angle`` (Euler angles,
zero); [R]'s grid of 6 x 21 x 6 nodes (voxelGridSize 5, 20, 5), w_fit = 1, w_reg = 0.05, GN with
20 non-linear x 60 PCG iterations. Handles: the bottom layer (y = 0) pinned, the top layer turned
about the y axis and pushed sideways. Acceptance: a rigid motion of every handle is reproduced
exactly (zero cost, Rotate3D(a_p) = its rotation at every node); the bend reaches the handles."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, InBounds, Param, Rotate3D, Select, Stencil, Unknown,
                     compile_problem, greatereq, solve)

from ._image import side_by_side, write_png
from .mesh import NONE, rot3d

NAME = "volumetric"


def energy() -> Energy:
    W, H, D = Dim("W"), Dim("H"), Dim("D")
    Offset, Angle = Unknown("Offset", (W, H, D), 3), Unknown("Angle", (W, H, D), 3)
    UrShape, Constraints = Array("UrShape", (W, H, D), 3), Array("Constraints", (W, H, D), 3)
    w_fit, w_reg = Param("w_fitSqrt"), Param("w_regSqrt")
    valid = greatereq(Constraints(0, 0, 0)[0], -999999.9)
    terms = [Select(valid, w_fit * (Offset(0, 0, 0) - Constraints(0, 0, 0)), 0)]
    for i, j, k in Stencil([(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]):
        cost = ((Offset(0, 0, 0) - Offset(i, j, k))
                - Rotate3D(Angle(0, 0, 0), UrShape(0, 0, 0) - UrShape(i, j, k)))
        terms.append(w_reg * Select(InBounds(0, 0, 0), Select(InBounds(i, j, k), cost, 0.0), 0.0))
    return Energy(*terms)


def grid(size=(6, 21, 6), spacing=0.3):
    """Rest node positions (W, H, D, 3)."""
    idx = np.stack(np.meshgrid(*[np.arange(n) for n in size], indexing="ij"), -1)
    return spacing * idx.astype(float)


def make_plan(U, handles, targets, w_fit=1.0, w_reg=0.05):
    """``handles``: a boolean (W, H, D) mask; ``targets``: (count, 3) positions in mask order."""
    C = np.full(U.shape, NONE)
    C[handles] = targets
    return compile_problem(energy(), arrays={"UrShape": U, "Constraints": C, "Offset": U,
                                             "Angle": np.zeros(U.shape)},
                           params={"w_fitSqrt": np.sqrt(w_fit), "w_regSqrt": np.sqrt(w_reg)})


def _rot_y(t):
    return np.array([[np.cos(t), 0, np.sin(t)], [0, 1, 0], [-np.sin(t), 0, np.cos(t)]])


def run(size=(6, 21, 6), verbose=False, out_dir=None, *, twist_deg=40.0, shift=1.0) -> dict:
    U = grid(size)
    handles = np.zeros(size, bool)
    handles[:, 0, :] = handles[:, -1, :] = True
    # (1) every handle moved by one rigid motion: reproduced exactly
    Rr, tr = rot3d(np.array([0.3, -0.5, 0.8])), np.array([0.5, -0.2, 1.0])
    t0 = time.perf_counter()
    plan = make_plan(U, handles, U[handles] @ Rr.T + tr)
    t_compile = time.perf_counter() - t0
    rigid = solve(plan, plan.x0, method="gn", max_iterations=20, pcg_max_iterations=60)
    u = plan.vector_to_unknowns(rigid.x)
    rigid_R_err = float(np.max(np.abs(rot3d(u["Angle"]) - Rr)))
    rigid_pos_err = float(np.max(np.abs(u["Offset"] - (U @ Rr.T + tr))))
    # (2) bend: bottom layer pinned, top layer turned about y through its centre and shifted in x
    top = U[:, -1, :]
    centre = top.reshape(-1, 3).mean(0)
    moved = (top - centre) @ _rot_y(np.deg2rad(twist_deg)).T + centre + [shift, 0, 0]
    targets = np.stack([U[:, 0, :], moved], 1)  # the mask order of handles[:, (0, -1), :]
    plan = make_plan(U, handles, targets.reshape(-1, 3))
    res = solve(plan, plan.x0, method="gn", max_iterations=20, pcg_max_iterations=60, verbose=verbose)
    P = plan.vector_to_unknowns(res.x)["Offset"]
    edge = np.linalg.norm(np.diff(P, axis=1), axis=-1) / np.linalg.norm(np.diff(U, axis=1), axis=-1)
    out = {
        "example": NAME, "size": "x".join(map(str, size)), "unknowns": plan.n, "method": "gn",
        "initial_cost": res.initial_cost, "cost": res.cost, "iterations": res.iterations,
        "pcg_iterations": res.pcg_iterations, "time_compile_s": t_compile, "time_solve_s": res.wall_time,
        "rigid_cost": rigid.cost, "rigid_initial_cost": rigid.initial_cost,
        "rigid_R_err": rigid_R_err, "rigid_pos_err": rigid_pos_err,
        "handle_max_err": float(np.max(np.linalg.norm(P[handles] - targets.reshape(-1, 3), axis=1))),
        "edge_stretch_max": float(np.max(np.abs(edge - 1))),
        "finite": bool(np.all(np.isfinite(res.x))),
    }
    if verbose:
        print(f"[{NAME}] rigid: cost {rigid.cost:.1e}, max|R - R*| {rigid_R_err:.1e}; bend: handle err "
              f"{out['handle_max_err']:.2e}, max edge stretch {out['edge_stretch_max']:.2f}")
    if out_dir is not None:
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), side_by_side([_side_view(U), _side_view(P)]))
    return out


def _side_view(P, size=240):
    """x (right) / y (up) scatter of the nodes."""
    img = np.full((size, size, 3), 255, np.uint8)
    xy = P[..., :2].reshape(-1, 2)
    lo, span = np.array([-1.5, -0.5]), 8.0
    px = ((xy - lo) / span * (size - 1)).round().astype(int)
    ok = np.all((px >= 0) & (px < size), axis=1)
    img[size - 1 - px[ok, 1], px[ok, 0]] = (40, 70, 160)
    return img
