"""Example 3 - as-rigid-as-possible image warping (spec 3.3, Fig. 24).

Unknowns per pixel: Offset o_p (new position, 2 channels) and Angle theta_p, solved jointly.
A synthetic bar-shaped mask (Mask == 0 inside) is bent by moving handle pixels:

    Exclude(Mask != 0)
    r_reg(p, n) = w_regSqrt [(o_p - o_{p+n}) - R(theta_p)(u_p - u_{p+n})]   if InBounds(n), Mask_{p+n} = Mask_p = 0
    r_fit(p)    = w_fitSqrt (o_p - c_p)                                     if c_p >= 0 (a handle)

As in the paper's run the handle targets are interpolated over a few outer solves, each a
float64 Levenberg-Marquardt solve warm-started from the previous one."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, Dim, Energy, Exclude, InBounds, Not, Param, Rotate2D, Select, Unknown,
                     compile_problem, eq, solve)

from ._image import side_by_side, write_png

NAME = "arap"
NBRS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def energy(exclude: bool = True) -> Energy:
    """Spec 3.3 ARAP image warping (Fig. 24): Offset (2 channels) and Angle unknowns; pixels
    outside the mask are fixed with ``Exclude`` unless ``exclude=False``."""
    W, H = Dim("W"), Dim("H")
    Offset = Unknown("Offset", (W, H), 2)
    Angle = Unknown("Angle", (W, H))
    UrShape = Array("UrShape", (W, H), 2)
    Constraints = Array("Constraints", (W, H), 2)
    Mask = Array("Mask", (W, H))
    w_fit, w_reg = Param("w_fitSqrt"), Param("w_regSqrt")
    terms = [Exclude(Not(eq(Mask(0, 0), 0)))] if exclude else []
    for x, y in NBRS:
        e_reg = w_reg * ((Offset(0, 0) - Offset(x, y))
                         - Rotate2D(Angle(0, 0), UrShape(0, 0) - UrShape(x, y)))
        valid = InBounds(x, y) * eq(Mask(x, y), 0) * eq(Mask(0, 0), 0)
        terms.append(Select(valid, e_reg, 0))
    e_fit = Offset(0, 0) - Constraints(0, 0)
    valid = (Constraints(0, 0)[0] >= 0) * (Constraints(0, 0)[1] >= 0)
    terms.append(Select(valid, e_fit, 0.0) * w_fit)
    return Energy(*terms)


def make_data(size=(48, 32), bend_deg=40.0):
    """Bar mask, pixel coordinates, handles and their final targets (indexed [x, y]).

    Left end: two handles pinned. Right end: two handles rotated by ``bend_deg`` about the left
    end's centre, so the bar has to bend (the pinned pair fixes the left end's orientation)."""
    W, H = size
    ii, jj = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")
    ur = np.stack([ii, jj], -1).astype(float)
    x0, x1 = W // 8, W - W // 8 - 1
    yc = H // 3
    half = max(2, H // 8)
    mask = np.where((ii >= x0) & (ii <= x1) & (np.abs(jj - yc) <= half), 0.0, 1.0)
    handles = [(x0, yc - half), (x0, yc + half), (x1, yc - half), (x1, yc + half)]
    th = np.deg2rad(bend_deg)
    R = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    centre = np.array([x0, yc], float)
    targets = []
    for k, (hx, hy) in enumerate(handles):
        p = np.array([hx, hy], float)
        targets.append(p if k < 2 else centre + R @ (p - centre))
    return ur, mask, handles, np.array(targets)


def _constraints(shape, handles, targets):
    c = -np.ones(shape + (2,))
    for (hx, hy), t in zip(handles, targets):
        c[hx, hy] = t
    return c


def render(pos, colour, valid, bbox, scale=4, sub=None):
    """Forward-splat the textured quads between valid pixels at their (deformed) positions into
    an RGB8 canvas covering ``bbox = (xmin, ymin, xmax, ymax)``; pixels outside stay white."""
    xmin, ymin, xmax, ymax = bbox
    cw, ch = int(np.ceil((xmax - xmin) * scale)) + 1, int(np.ceil((ymax - ymin) * scale)) + 1
    img = np.full((ch, cw, 3), 255, np.uint8)
    quad = valid[:-1, :-1] & valid[1:, :-1] & valid[:-1, 1:] & valid[1:, 1:]
    qi, qj = np.nonzero(quad)
    if sub is None:
        stretch = np.max(np.linalg.norm(pos[1:, :] - pos[:-1, :], axis=-1), initial=1.0)
        sub = int(np.clip(np.ceil(2 * scale * max(1.0, stretch)), 2, 32))
    s = (np.arange(sub) + 0.5) / sub
    a, b = [g.ravel() for g in np.meshgrid(s, s, indexing="ij")]
    def lerp(f):
        f00, f10, f01, f11 = f[qi, qj], f[qi + 1, qj], f[qi, qj + 1], f[qi + 1, qj + 1]
        A, B = a[None, :, None], b[None, :, None]
        return (f00[:, None] * (1 - A) * (1 - B) + f10[:, None] * A * (1 - B)
                + f01[:, None] * (1 - A) * B + f11[:, None] * A * B)
    P, C = lerp(pos).reshape(-1, 2), lerp(colour).reshape(-1, 3)
    cx = np.clip(((P[:, 0] - xmin) * scale).astype(int), 0, cw - 1)
    cy = np.clip(((P[:, 1] - ymin) * scale).astype(int), 0, ch - 1)
    img[cy, cx] = (np.clip(C, 0, 1) * 255 + 0.5).astype(np.uint8)
    return img


def _mark(img, pts, bbox, scale, rgb, r=2):
    for x, y in pts:
        cx, cy = int((x - bbox[0]) * scale), int((y - bbox[1]) * scale)
        img[max(cy - r, 0): cy + r + 1, max(cx - r, 0): cx + r + 1] = rgb


def run(size=(48, 32), verbose=False, out_dir=None, *, bend_deg=40.0, outer_steps=4,
        lm_iterations=10, pcg_max_iterations=100, w_fit=100.0, w_reg=0.01, backend="llvm") -> dict:
    W, H = size
    ur, mask, handles, targets = make_data(size, bend_deg)
    starts = np.array(handles, float)
    t0 = time.perf_counter()
    plan = compile_problem(
        energy(),
        arrays={"UrShape": ur, "Mask": mask, "Constraints": _constraints((W, H), handles, starts),
                "Offset": ur, "Angle": np.zeros((W, H))},
        params={"w_fitSqrt": np.sqrt(w_fit), "w_regSqrt": np.sqrt(w_reg)}, dtype=np.float64, backend=backend)
    t_compile = time.perf_counter() - t0
    x = plan.x0.copy()
    initial_cost = None
    monotone, total_its, total_pcg, t_solve, logs = True, 0, 0, 0.0, []
    for k in range(1, outer_steps + 1):
        tk = starts + (targets - starts) * (k / outer_steps)
        plan.set_array("Constraints", _constraints((W, H), handles, tk))
        res = solve(plan, x, method="lm", max_iterations=lm_iterations,
                    pcg_max_iterations=pcg_max_iterations, verbose=verbose)
        if initial_cost is None:
            initial_cost = res.initial_cost
        acc = res.accepted_costs
        monotone &= all(b <= a for a, b in zip(acc, acc[1:]))
        total_its += res.iterations
        total_pcg += res.pcg_iterations
        t_solve += res.wall_time
        logs.append(res)
        x = res.x
        if verbose:
            print(f"[{NAME}] outer step {k}/{outer_steps}: cost {res.initial_cost:.4e} -> {res.cost:.4e} "
                  f"({res.iterations} LM its, {res.termination_reason})")
    u = plan.vector_to_unknowns(x)
    off, ang = u["Offset"], u["Angle"]
    inside = mask == 0
    handle_err = float(max(np.linalg.norm(off[hx, hy] - t) for (hx, hy), t in zip(handles, targets)))
    # local rigidity of the result: edge lengths vs rest length 1 inside the shape
    hor = inside[:-1] & inside[1:]
    stretch = np.linalg.norm(off[1:] - off[:-1], axis=-1)[hor]
    out = {
        "example": NAME, "size": f"{W}x{H}", "unknowns": plan.n, "method": "lm",
        "initial_cost": initial_cost, "cost": logs[-1].cost,
        "final_step_initial_cost": logs[-1].initial_cost,
        "handle_max_err_px": handle_err, "monotone_accepted_costs": bool(monotone),
        "finite": bool(np.all(np.isfinite(off)) and np.all(np.isfinite(ang))),
        "edge_len_min": float(stretch.min()), "edge_len_max": float(stretch.max()),
        "angle_range_deg": float(np.rad2deg(np.ptp(ang[inside]))),
        "iterations": total_its, "pcg_iterations": total_pcg,
        "time_compile_s": t_compile, "time_solve_s": t_solve,
        "results": logs,
    }
    if verbose:
        print(f"[{NAME}] {W}x{H}: handle error {handle_err:.3e} px, edge lengths "
              f"[{out['edge_len_min']:.3f}, {out['edge_len_max']:.3f}]")
    if out_dir is not None:
        ii, jj = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")
        chk = ((ii // 4 + jj // 4) % 2).astype(float)
        colour = np.stack([0.3 + 0.6 * ii / W, 0.3 + 0.4 * chk, 0.9 - 0.6 * ii / W], -1)
        pts = np.concatenate([ur[inside], off[inside], targets])
        lo, hi = pts.min(0) - 2, pts.max(0) + 2
        bbox = (lo[0], lo[1], hi[0], hi[1])
        scale = max(2, 256 // max(W, H))
        a = render(ur, colour, inside, bbox, scale)
        _mark(a, starts, bbox, scale, (255, 0, 0))
        _mark(a, targets, bbox, scale, (0, 0, 255))
        b = render(off, colour, inside, bbox, scale)
        _mark(b, targets, bbox, scale, (0, 0, 255))
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), side_by_side([a, b]))
    return out
