"""Cotangent-weighted mesh smoothing (Opt paper, mesh smoothing with the cotangent Laplacian):
per-edge weights bound as graph edge attributes.

    r_fit(i) = sqrt(w_fit) (x_i - a_i)
    r_reg(e) = sqrt(w_reg) sqrt(w_e) (x_v0 - x_v1)      w_e = (cot alpha_e + cot beta_e) / 2

``w_e`` is ``G.w``, an edge attribute of the graph (``Graph(..., attrs={"w": 1})``), bound as
``graphs={"Edges": {"v0": ..., "v1": ..., "w": weights}}``. The mesh is a jittered triangular
lattice on a tilted plane (all angles acute, so every weight is positive), with a noisy copy as
input. The boundary vertices are fixed (``Exclude``): the cotangent Laplacian of a planar mesh's
linear coordinate function vanishes at interior vertices (linear precision), so smoothing the
noise-free mesh gives it back (from any start), which uniform weights do not (they pull each
vertex towards the centroid of its irregular one-ring). Linear: one GN step to PCG tolerance 1e-12 equals the sparse
direct solve of the normal equations.

:func:`wedge_energy` is Fig. 29 as listed: the weights recomputed from the current X on wedges
(a 4-slot graph: the edge and the opposite vertices of its two triangles), highly non-linear,
on a closed torus (:func:`run_wedge`, [R]'s GN 5 x 25 run)."""
from __future__ import annotations

import os
import time

import numpy as np
import scipy.sparse.linalg as spla

from lsq_opt import (Array, Dim, Dot, Energy, Exclude, Graph, Param, Select, Unknown, compile_problem,
                     eq, solve, sqrt)

from ._image import side_by_side, write_png
from .mesh import wireframe

NAME = "cotangent_mesh"


def energy() -> Energy:
    N = Dim("N")
    X, A = Unknown("X", N, 3), Array("A", N, 3)
    Boundary = Array("Boundary", N)
    G = Graph("Edges", v0=N, v1=N, attrs={"w": 1})
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    return Energy(Exclude(eq(Boundary(0), 1)), w_fit * (X(0) - A(0)),
                  w_reg * sqrt(G.w) * (X(G.v0) - X(G.v1)))


def _cot(p, q):
    """Fig. 29's cot of the angle between p and q (a guarded disc for degenerate wedges)."""
    pq = Dot(p, q)
    disc = Dot(p, p) * Dot(q, q) - pq * pq
    return pq / sqrt(Select(disc > 0, disc, 0.0001))


def _normalize(v):
    return v / sqrt(Dot(v, v))


def wedge_energy() -> Energy:
    """Fig. 29 as listed: the weights recomputed from the current X on each wedge (v0, v1 the
    edge, v2 / v3 the opposite vertices of its two triangles), so their derivatives enter J."""
    N = Dim("N")
    X, A = Unknown("X", N, 3), Array("A", N, 3)
    G = Graph("G", v0=N, v1=N, v2=N, v3=N)
    w_fit, w_reg = Param("w_fit"), Param("w_reg")
    a, b = _normalize(X(G.v0) - X(G.v2)), _normalize(X(G.v1) - X(G.v2))
    c, d = _normalize(X(G.v0) - X(G.v3)), _normalize(X(G.v1) - X(G.v3))
    w = 0.5 * (_cot(a, b) + _cot(c, d))
    w = sqrt(Select(w > 0, w, 0.0001))
    return Energy(w_fit * (X(0) - A(0)), w_reg * w * (X(G.v1) - X(G.v0)))


def torus_mesh(rings=28, segs=10, R=2.0, r=0.8):
    """A closed torus (every edge has two triangles), odd rings turned by half a segment so the
    triangles are near-equilateral (a quad split would put right angles, i.e. zero cotangent
    weights, at every diagonal): vertices (N, 3), triangles (T, 3). ``rings`` must be even."""
    if rings % 2:
        raise ValueError(f"torus_mesh: rings must be even (alternating half-segment offsets), got {rings}")
    u = np.linspace(0, 2 * np.pi, rings, endpoint=False)
    uu, jj = np.meshgrid(u, np.arange(segs), indexing="ij")
    vv = 2 * np.pi * (jj + 0.5 * (np.arange(rings)[:, None] % 2)) / segs
    V = np.stack([(R + r * np.cos(vv)) * np.cos(uu), (R + r * np.cos(vv)) * np.sin(uu), r * np.sin(vv)],
                 -1).reshape(-1, 3)
    tris = []
    for i in range(rings):
        for j in range(segs):
            a, b = i * segs + j, i * segs + (j + 1) % segs
            c, d = ((i + 1) % rings) * segs + j, ((i + 1) % rings) * segs + (j + 1) % segs
            tris += [(a, b, d), (a, d, c)] if i % 2 else [(a, b, c), (b, d, c)]
    return V, np.array(tris, np.int64)


def wedges(tris):
    """Fig. 29's graph: per directed edge (v0, v1) the opposite vertices v2, v3 of its two
    triangles (a closed mesh: every edge has two)."""
    opposite: dict[tuple[int, int], list[int]] = {}
    for t in tris:
        for k in range(3):
            i, j, o = int(t[k]), int(t[(k + 1) % 3]), int(t[(k + 2) % 3])
            opposite.setdefault((i, j), []).append(o)
            opposite.setdefault((j, i), []).append(o)
    if any(len(o) != 2 for o in opposite.values()):
        raise ValueError("wedges: the mesh is not closed (an edge without two triangles)")
    keys = sorted(opposite)
    v0, v1 = np.array(keys).T
    v2, v3 = np.array([opposite[k] for k in keys]).T
    return {"v0": v0, "v1": v1, "v2": v2, "v3": v3}


def run_wedge(size=(28, 10), verbose=False, *, noise=0.03, seed=0, w_fit=1.0, w_reg=0.5) -> dict:
    """[R]'s run: GN, 5 non-linear x 25 PCG iterations, w_fit = 1, w_reg = 0.5, on a noisy torus.
    (The membrane energy also shrinks the torus, so the result is not compared to the clean
    mesh.)"""
    V, tris = torus_mesh(*size)
    noisy = V + noise * np.random.default_rng(seed).standard_normal(V.shape)
    plan = compile_problem(wedge_energy(), arrays={"A": noisy, "X": noisy},
                           params={"w_fit": np.sqrt(w_fit), "w_reg": np.sqrt(w_reg)},
                           graphs={"G": wedges(tris)})
    res = solve(plan, plan.x0, method="gn", max_iterations=5, pcg_max_iterations=25,
                pcg_tolerance=1e-10, function_tolerance=0.0, verbose=verbose)
    return {"plan": plan, "result": res, "noisy": noisy, "clean": V,
            "X": plan.vector_to_unknowns(res.x)["X"], "finite": bool(np.all(np.isfinite(res.x)))}


def lattice_mesh(nx=24, ny=16, jitter=0.12, seed=0):
    """A jittered triangular lattice (rows offset by half a spacing) on the plane
    z = 0.3 x - 0.2 y: vertices (N, 3), triangles (T, 3), boundary mask (N,)."""
    rng = np.random.default_rng(seed)
    h = np.sqrt(3) / 2
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    x = ii + 0.5 * (jj % 2) + rng.uniform(-jitter, jitter, ii.shape)
    y = h * jj + rng.uniform(-jitter, jitter, ii.shape)
    V = np.stack([x, y, 0.3 * x - 0.2 * y], -1).reshape(-1, 3)
    idx = np.arange(nx * ny).reshape(ny, nx)
    tris = []
    for j in range(ny - 1):
        for i in range(nx - 1):
            a, b, c, d = idx[j, i], idx[j, i + 1], idx[j + 1, i], idx[j + 1, i + 1]
            tris += [(a, b, d), (a, d, c)] if j % 2 else [(a, b, c), (b, d, c)]
    boundary = np.zeros((ny, nx))
    boundary[[0, -1], :] = boundary[:, [0, -1]] = 1
    return V, np.array(tris, np.int64), boundary.ravel()


def cotangent_weights(V, tris, require_positive=True):
    """Undirected edges (v0, v1) and w_e = (cot alpha + cot beta) / 2 (one cotangent on the
    border), from the angle opposite each edge in its one or two triangles."""
    w: dict[tuple[int, int], float] = {}
    for t in tris:
        for k in range(3):
            i, j, o = t[k], t[(k + 1) % 3], t[(k + 2) % 3]
            e1, e2 = V[i] - V[o], V[j] - V[o]
            cot = float(e1 @ e2) / float(np.linalg.norm(np.cross(e1, e2)))
            key = (min(i, j), max(i, j))
            w[key] = w.get(key, 0.0) + 0.5 * cot
    keys = sorted(w)
    weights = np.array([w[k] for k in keys])
    if require_positive and np.any(weights <= 0):
        raise ValueError("cotangent_weights: a non-positive weight (an obtuse, non-Delaunay edge); "
                         "lower the jitter")
    v0, v1 = np.array(keys).T
    return v0, v1, weights


def make_plan(V, tris, boundary, target, start=None, weights=None, w_fit=0.3, w_reg=1.0):
    """The compiled smoothing plan of ``target`` (started at ``start``, default the target);
    ``weights=None``: cotangent weights, or given per-edge weights (e.g. ones: the uniform
    Laplacian) on the same edges."""
    v0, v1, w = cotangent_weights(V, tris)
    if weights is not None:
        w = np.broadcast_to(np.asarray(weights, float), w.shape)
    start = target if start is None else start
    return compile_problem(energy(), arrays={"A": target, "X": start, "Boundary": boundary},
                           params={"w_fit": w_fit, "w_reg": w_reg},
                           graphs={"Edges": {"v0": v0, "v1": v1, "w": w}})


def smooth(plan, verbose=False):
    res = solve(plan, plan.x0, method="gn", max_iterations=1, pcg_max_iterations=5000,
                pcg_tolerance=1e-12, preconditioner="jacobi", verbose=verbose)
    return res, plan.vector_to_unknowns(res.x)["X"]


def run(size=(24, 16), verbose=False, out_dir=None, *, noise=0.05, seed=0) -> dict:
    V, tris, boundary = lattice_mesh(*size, seed=seed)
    inner = boundary == 0
    noisy = V.copy()
    noisy[inner] += noise * np.random.default_rng(seed + 1).standard_normal((int(inner.sum()), 3))
    t0 = time.perf_counter()
    plan = make_plan(V, tris, boundary, noisy)
    t_compile = time.perf_counter() - t0
    res, X = smooth(plan, verbose)
    x0 = plan.x0
    J = plan.jacobian(x0).tocsc()
    x_direct = x0 + spla.spsolve((J.T @ J).tocsc(), -(J.T @ plan.residuals(x0)))
    # linear precision: smoothing the noise-free planar mesh (started from the noisy one) gives
    # the planar mesh back under cotangent weights only
    _, X_clean = smooth(make_plan(V, tris, boundary, V, start=noisy))
    _, X_uniform = smooth(make_plan(V, tris, boundary, V, start=noisy, weights=1.0))
    out = {
        "example": NAME, "size": f"{size[0]}x{size[1]}", "unknowns": plan.n, "method": "gn",
        "initial_cost": res.initial_cost, "cost": res.cost, "iterations": res.iterations,
        "pcg_iterations": res.pcg_iterations, "time_compile_s": t_compile, "time_solve_s": res.wall_time,
        "max_abs_diff_direct": float(np.max(np.abs(res.x - x_direct))),
        "planar_drift_cotangent": float(np.max(np.abs(X_clean - V))),
        "planar_drift_uniform": float(np.max(np.abs(X_uniform - V))),
        "rms_noise": float(np.sqrt(np.mean((noisy - V)[inner] ** 2))),
        "rms_result": float(np.sqrt(np.mean((X - V)[inner] ** 2))),
    }
    if verbose:
        print(f"[{NAME}] max|x - spsolve| = {out['max_abs_diff_direct']:.2e}; planar mesh drift: "
              f"cotangent {out['planar_drift_cotangent']:.1e}, uniform {out['planar_drift_uniform']:.1e}")
    if out_dir is not None:
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"),
                               side_by_side(wireframe([noisy, X], tris)))
    return out
