"""Examples 2 and 4 - energies on a mesh (graph domains): Laplacian mesh smoothing (spec 3.2,
Fig. 5; AE-2) and as-rigid-as-possible mesh deformation (spec 3.4, Fig. 25; AE-5).

The mesh is generated: a closed tube (``rings`` x ``segs`` vertices on a cylinder, quads split
into triangles, caps left open), so sizes scale freely (``size=(rings, segs)``). The graph holds
both directions of every mesh edge ([R]: v0 = centre vertex, v1 = one-ring neighbour).

ARAP (Fig. 25): unknowns Offset (3) and Angle (3 Euler angles) per vertex,

    r_fit(i) = sqrt(w_fit) (o_i - c_i)                             if c_i.x >= -999999.9 else 0
    r_reg(e) = sqrt(w_reg) [(o_v0 - o_v1) - Rotate3D(a_v0)(u_v0 - u_v1)]

with the bottom ring pinned and the top ring rotated about the tube axis and pushed sideways,
the constraints interpolated over ``outer_steps`` LM solves (as in [R]'s run).

Laplacian (Fig. 5): ``w_fit (X(0) - A(0))`` per vertex and ``w_reg (X(v0) - X(v1))`` per edge on
a noisy tube; linear, one GN step to PCG tolerance 1e-12 equals ``spsolve`` of the normal
equations."""
from __future__ import annotations

import os
import time

import numpy as np
import scipy.sparse.linalg as spla

from lsq_opt import (Array, Dim, Energy, Graph, Param, Rotate3D, Select, Unknown, compile_problem,
                     greatereq, solve)

from ._image import side_by_side, write_png

NAME_ARAP = "arap_mesh"
NAME_LAPLACIAN = "laplacian_mesh"
NONE = -1e6  # "no constraint" marker (< -999999.9)


# ----------------------------------------------------------------------------- the mesh
def tube_mesh(rings=24, segs=16, radius=1.0, length=6.0):
    """Vertices (rings*segs, 3) on a cylinder along z and triangles (T, 3)."""
    z = np.linspace(0.0, length, rings)
    t = np.linspace(0.0, 2 * np.pi, segs, endpoint=False)
    zz, tt = np.meshgrid(z, t, indexing="ij")
    V = np.stack([radius * np.cos(tt), radius * np.sin(tt), zz], -1).reshape(-1, 3)
    tris = []
    for i in range(rings - 1):
        for j in range(segs):
            a, b = i * segs + j, i * segs + (j + 1) % segs
            c, d = a + segs, b + segs
            tris += [(a, b, d), (a, d, c)]
    return V, np.array(tris, np.int64)


def directed_edges(tris):
    """Both directions of every undirected mesh edge: (v0, v1) int arrays."""
    e = np.concatenate([tris[:, [0, 1]], tris[:, [1, 2]], tris[:, [2, 0]]])
    e = np.unique(np.sort(e, 1), axis=0)
    return np.concatenate([e[:, 0], e[:, 1]]), np.concatenate([e[:, 1], e[:, 0]])


# ----------------------------------------------------------------------------- energies
def arap_energy() -> Energy:
    """Spec 3.4 / Fig. 25."""
    N = Dim("N")
    w_fit, w_reg = Param("w_fitSqrt"), Param("w_regSqrt")
    Offset = Unknown("Offset", N, 3)
    Angle = Unknown("Angle", N, 3)
    UrShape = Array("UrShape", N, 3)
    Constraints = Array("Constraints", N, 3)
    G = Graph("G", ["v0", "v1"], N)
    e_fit = Offset(0) - Constraints(0)
    valid = greatereq(Constraints(0, 0), -999999.9)
    cost = (Offset(G.v0) - Offset(G.v1)) - Rotate3D(Angle(G.v0), UrShape(G.v0) - UrShape(G.v1))
    return Energy(Select(valid, w_fit * e_fit, 0), w_reg * cost)


def laplacian_energy() -> Energy:
    """Spec 3.2 / Fig. 5 (float3 unknowns)."""
    N = Dim("N")
    X = Unknown("X", N, 3)
    A = Array("A", N, 3)
    G = Graph("Edges", ["vertex0", "vertex1"], N)
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    return Energy(w_fit * (X(0) - A(0)), w_reg * (X(G.vertex0) - X(G.vertex1)))


def rot3d(a):
    """numpy Rotate3D matrices (..., 3, 3) of Euler angles (..., 3) (the same matrix)."""
    ca, sa = np.cos(a[..., 0]), np.sin(a[..., 0])
    cb, sb = np.cos(a[..., 1]), np.sin(a[..., 1])
    cg, sg = np.cos(a[..., 2]), np.sin(a[..., 2])
    return np.stack([
        np.stack([cg * cb, -sg * ca + cg * sb * sa, sg * sa + cg * sb * ca], -1),
        np.stack([sg * cb, cg * ca + sg * sb * sa, -cg * sa + sg * sb * ca], -1),
        np.stack([-sb, cb * sa, cb * ca], -1)], -2)


def arap_setup(rings=24, segs=16, twist_deg=60.0, shift=2.0):
    """Mesh, graph, handles (bottom and top rings) and their final targets."""
    V, tris = tube_mesh(rings, segs)
    v0, v1 = directed_edges(tris)
    bottom = np.arange(segs)
    top = np.arange((rings - 1) * segs, rings * segs)
    th = np.deg2rad(twist_deg)
    Rz = np.array([[np.cos(th), -np.sin(th), 0], [np.sin(th), np.cos(th), 0], [0, 0, 1]])
    centre = V[top].mean(0)
    tgt_top = (V[top] - centre) @ Rz.T + centre + np.array([shift, 0.0, -0.5 * shift])
    handles = np.concatenate([bottom, top])
    targets = np.concatenate([V[bottom], tgt_top])
    return V, tris, (v0, v1), handles, targets


def constraints(n, handles, pos):
    c = np.full((n, 3), NONE)
    c[handles] = pos
    return c


def arap_plan(rings=24, segs=16, w_fit=4.0, w_reg=1.0, dtype=np.float64, kernels=None,
              steps_done=1, outer_steps=1):
    """A compiled ARAP mesh plan with the constraints at ``steps_done / outer_steps`` of the
    way (the benchmark uses the full move in one solve); returns (plan, data, params)."""
    V, tris, (v0, v1), handles, targets = arap_setup(rings, segs)
    pos = V[handles] + (targets - V[handles]) * (steps_done / outer_steps)
    data = {"UrShape": V, "Constraints": constraints(len(V), handles, pos), "Offset": V.copy(),
            "Angle": np.zeros_like(V)}
    params = {"w_fitSqrt": np.sqrt(w_fit), "w_regSqrt": np.sqrt(w_reg)}
    plan = compile_problem(arap_energy(), arrays=data, params=params, graphs={"G": {"v0": v0, "v1": v1}},
                           dtype=dtype, kernels=kernels)
    return plan, dict(data, v0=v0, v1=v1, tris=tris), params


# ----------------------------------------------------------------------------- rendering
def _line(img, p, q, rgb):
    n = int(max(abs(q[0] - p[0]), abs(q[1] - p[1]))) + 1
    xs = np.linspace(p[0], q[0], n).round().astype(int)
    ys = np.linspace(p[1], q[1], n).round().astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[ok], xs[ok]] = rgb


def wireframe(meshes, tris, size=320, colours=None):
    """Side views (x right, z up) of several vertex arrays of one mesh, in one common frame."""
    pts = np.concatenate(meshes)
    lo, hi = pts[:, [0, 2]].min(0), pts[:, [0, 2]].max(0)
    scale = (size - 20) / max(hi - lo)
    out = []
    e = np.unique(np.sort(np.concatenate([tris[:, [0, 1]], tris[:, [1, 2]], tris[:, [2, 0]]]), 1),
                  axis=0)
    for k, Vk in enumerate(meshes):
        img = np.full((size, size, 3), 255, np.uint8)
        P = np.stack([(Vk[:, 0] - lo[0]) * scale + 10, size - 10 - (Vk[:, 2] - lo[1]) * scale], -1)
        rgb = (colours or [(40, 70, 160)] * len(meshes))[k]
        for a, b in e:
            _line(img, P[a], P[b], rgb)
        out.append(img)
    return out


# ----------------------------------------------------------------------------- runs
def run_arap(size=(24, 16), verbose=False, out_dir=None, *, outer_steps=5, lm_iterations=20,
             pcg_max_iterations=100, w_fit=4.0, w_reg=1.0) -> dict:
    rings, segs = size
    V, tris, (v0, v1), handles, targets = arap_setup(rings, segs)
    t0 = time.perf_counter()
    plan, data, params = arap_plan(rings, segs, w_fit, w_reg, steps_done=0, outer_steps=outer_steps)
    t_compile = time.perf_counter() - t0
    x = plan.x0.copy()
    starts = V[handles]
    monotone, its, pcg_its, t_solve, logs = True, 0, 0, 0.0, []
    for k in range(1, outer_steps + 1):
        plan.set_array("Constraints", constraints(len(V), handles,
                                                  starts + (targets - starts) * k / outer_steps))
        res = solve(plan, x, method="lm", max_iterations=lm_iterations,
                    pcg_max_iterations=pcg_max_iterations, verbose=verbose)
        acc = res.accepted_costs
        monotone &= all(b <= a for a, b in zip(acc, acc[1:]))
        its += res.iterations
        pcg_its += res.pcg_iterations
        t_solve += res.wall_time
        logs.append(res)
        x = res.x
    u = plan.vector_to_unknowns(x)
    off = u["Offset"]
    handle_err = float(np.max(np.linalg.norm(off[handles] - targets, axis=1)))
    rest = np.linalg.norm(V[v0] - V[v1], axis=1)
    new = np.linalg.norm(off[v0] - off[v1], axis=1)
    out = {
        "example": NAME_ARAP, "size": f"{rings}x{segs}", "unknowns": plan.n, "method": "lm",
        "initial_cost": logs[0].initial_cost, "cost": logs[-1].cost,
        "handle_max_err": handle_err, "monotone_accepted_costs": bool(monotone),
        "finite": bool(np.all(np.isfinite(x))),
        "edge_stretch_max": float(np.max(np.abs(new / rest - 1))),
        "iterations": its, "pcg_iterations": pcg_its, "time_compile_s": t_compile,
        "time_solve_s": t_solve, "results": logs,
    }
    if verbose:
        print(f"[{NAME_ARAP}] {rings}x{segs}: handle error {handle_err:.2e}, max edge stretch "
              f"{out['edge_stretch_max']:.3f}")
    if out_dir is not None:
        imgs = wireframe([V, off], tris, colours=[(120, 120, 120), (40, 70, 160)])
        out["png"] = write_png(os.path.join(out_dir, f"{NAME_ARAP}.png"), side_by_side(imgs))
    return out


def run_laplacian(size=(24, 16), verbose=False, out_dir=None, *, w_fit=0.1, w_reg=0.9, noise=0.05,
                  seed=0) -> dict:
    rings, segs = size
    V, tris = tube_mesh(rings, segs)
    v0, v1 = directed_edges(tris)
    noisy = V + noise * np.random.default_rng(seed).standard_normal(V.shape)
    t0 = time.perf_counter()
    plan = compile_problem(laplacian_energy(), arrays={"A": noisy, "X": np.zeros_like(V)},
                           params={"w_fit": w_fit, "w_reg": w_reg},
                           graphs={"Edges": {"vertex0": v0, "vertex1": v1}})
    t_compile = time.perf_counter() - t0
    x0 = plan.x0.copy()
    res = solve(plan, x0, method="gn", max_iterations=1, pcg_max_iterations=5000,
                pcg_tolerance=1e-12, verbose=verbose)
    J = plan.jacobian(x0).tocsc()
    F = plan.residuals(x0)
    x_direct = x0 + spla.spsolve((J.T @ J).tocsc(), -(J.T @ F))
    X = plan.vector_to_unknowns(res.x)["X"]
    out = {
        "example": NAME_LAPLACIAN, "size": f"{rings}x{segs}", "unknowns": plan.n, "method": "gn",
        "initial_cost": res.initial_cost, "cost": res.cost,
        "max_abs_diff_direct": float(np.max(np.abs(res.x - x_direct))),
        "iterations": res.iterations, "pcg_iterations": res.pcg_iterations,
        "rms_noise": float(np.sqrt(np.mean((noisy - V) ** 2))),
        "rms_result": float(np.sqrt(np.mean((X - V) ** 2))),
        "time_compile_s": t_compile, "time_solve_s": res.wall_time,
    }
    if verbose:
        print(f"[{NAME_LAPLACIAN}] max|x - spsolve| = {out['max_abs_diff_direct']:.2e}")
    if out_dir is not None:
        imgs = wireframe([noisy, X], tris)
        out["png"] = write_png(os.path.join(out_dir, f"{NAME_LAPLACIAN}.png"), side_by_side(imgs))
    return out


class _Example:
    def __init__(self, fn):
        self.run = fn


arap_mesh = _Example(run_arap)
laplacian_mesh = _Example(run_laplacian)
