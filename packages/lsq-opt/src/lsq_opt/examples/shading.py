"""Example 5 - shape from shading (spec 3.5, Fig. 26; AE-10): refine a noisy depth map with a
detailed intensity image under spherical-harmonics (SH) lighting (Wu et al. via Opt).

Unknown: the refined depth X (one per pixel). With p(i, j) the back-projection of pixel (i, j)
at depth X (equation 8), n the normal of equation 10 and B the SH shading of n:

    r_fit         = sqrt(w_p) (X - D_i)                               where D_i > 0
    r_shade_h / v = sqrt(w_g) (B_I(0,0) - B_I(1,0) | B_I(0,1)) edgeMask   InBoundsExpanded(0,0,1)
    r_reg (3 ch)  = sqrt(w_s) (4 p(0,0) - p(-1,0) - p(0,-1) - p(1,0) - p(0,1))   where valid
    B_I   = B - I (I: smoothed intensity) where the depth at (0,0), (-1,0), (0,-1) is valid
    valid = depth valid on the 5-point stencil, |X(0,0) - X(n)| < 0.01, InBoundsExpanded(0,0,1)
    Exclude pixels with invalid input depth (D_i = 0).

``B_I`` and ``valid`` are ``ComputedArray``s as in the listing (``energy(annotated=False)``
writes the same energy with the expressions inlined by hand: AE-10's comparison).

Synthetic data (nothing downloaded): a tilted plane at depth ~1 with two Gaussian bumps, fine
ripples and a raised box (a 0.05 depth step), seen by a pinhole camera; the intensity image is
the SH shading (albedo 1) of the true depth under fixed lighting L_1..L_9; the input depth is
the truth blurred, with noise and 1 mm quantisation, and a dropout region of invalid depth (0).
The edge masks are 0 where the shading stencil straddles the depth step. The run uses the
spec's [R] parameters (60 non-linear x 10 PCG iterations) with LM and with GN."""
from __future__ import annotations

import os
import time

import numpy as np

from lsq_opt import (Array, ComputedArray, Dim, Energy, Exclude, InBoundsExpanded, Index, Not,
                     Param, Select, Unknown, Vector, abs_, compile_problem, eq, greater, less,
                     solve, sqrt)

from ._image import side_by_side, to_rgb8, write_png

NAME = "shading"
DEPTH_DISCONTINUITY_THRE = 0.01
#: SH lighting L_1..L_9 (normals point towards the camera, n_z < 0: L_3 < 0 lights the front)
LIGHTING = (0.65, 0.18, -0.45, 0.25, 0.06, 0.04, -0.05, 0.03, 0.05)
#: energy weights before the square root (the listing's w_p, w_s, w_g Params) at width 64
WEIGHTS = {"w_p": 1.0, "w_s": 4.0, "w_g": 0.02}


def weights(size):
    """WEIGHTS for an image of ``size``: the scene spans the same field of view at every
    resolution, so with more pixels the depth noise varies faster than the surface (more
    smoothing, w_s ~ W) and the normals react more strongly to it (w_g ~ 1/W)."""
    s = size[0] / 64.0
    return {"w_p": WEIGHTS["w_p"], "w_s": WEIGHTS["w_s"] * s, "w_g": WEIGHTS["w_g"] / s}


def energy(annotated: bool = True, *, shift_box: bool = True) -> Energy:
    """The Fig. 26 energy. ``annotated``: B_I and valid as ComputedArrays (the listing);
    otherwise the same expressions are written inline at every use. ``shift_box=False`` (only
    meaningful inline) keeps the listing's literal ``InBoundsExpanded(0,0,1)`` inside B_I(x,y),
    which is wrong for the shifted reads B_I(1,0), B_I(0,1): the negative control of AE-10."""
    W, H = Dim("W"), Dim("H")
    w_p = sqrt(Param("w_p"))  # fitting weight
    w_s = sqrt(Param("w_s"))  # regularisation weight
    w_g = sqrt(Param("w_g"))  # shading weight
    f_x, f_y, u_x, u_y = Param("f_x"), Param("f_y"), Param("u_x"), Param("u_y")
    L = [None] + [Param(f"L_{i}") for i in range(1, 10)]  # lighting model parameters, 1-based
    X = Unknown("X", (W, H))  # refined depth
    D_i = Array("D_i", (W, H))  # depth input
    Im = Array("Im", (W, H))  # target intensity
    edgeMaskR = Array("edgeMaskR", (W, H))
    edgeMaskC = Array("edgeMaskC", (W, H))
    posX, posY = Index(0), Index(1)

    def p(offX, offY):  # equation 8
        d = X(offX, offY)
        i, j = offX + posX, offY + posY
        return Vector(((i - u_x) / f_x) * d, ((j - u_y) / f_y) * d, d)

    def normalAt(offX, offY):  # equation 10
        i, j = offX + posX, offY + posY
        n_x = X(offX, offY - 1) * (X(offX, offY) - X(offX - 1, offY)) / f_y
        n_y = X(offX - 1, offY) * (X(offX, offY) - X(offX, offY - 1)) / f_x
        n_z = (n_x * (u_x - i) / f_x) + (n_y * (u_y - j) / f_y) - (X(offX - 1, offY) * X(offX, offY - 1) / (f_x * f_y))
        sqLength = n_x * n_x + n_y * n_y + n_z * n_z
        inverseMagnitude = Select(greater(sqLength, 0.0), 1.0 / sqrt(sqLength), 1.0)
        return inverseMagnitude * Vector(n_x, n_y, n_z)

    def B(offX, offY):
        normal = normalAt(offX, offY)
        n_x, n_y, n_z = normal[0], normal[1], normal[2]
        return (L[1] + L[2] * n_y + L[3] * n_z + L[4] * n_x + L[5] * n_x * n_y + L[6] * n_y * n_z
                + L[7] * (-n_x * n_x - n_y * n_y + 2 * n_z * n_z) + L[8] * n_z * n_x
                + L[9] * (n_x * n_x - n_y * n_y))

    def I(offX, offY):
        return Im(offX, offY) * 0.5 + 0.25 * (Im(offX - 1, offY) + Im(offX, offY - 1))

    def DepthValid(x, y):
        return greater(D_i(x, y), 0)

    def B_I(x, y):  # the listing's InBoundsExpanded(0,0,1) is right there: B_I is only built at (0,0)
        bi = B(x, y) - I(x, y)
        valid = DepthValid(x - 1, y) * DepthValid(x, y) * DepthValid(x, y - 1)
        box = InBoundsExpanded(x, y, 1) if shift_box else InBoundsExpanded(0, 0, 1)
        return Select(box * valid, bi, 0)

    if annotated:
        B_I = ComputedArray("B_I", (W, H), B_I(0, 0))
    # do not include unknowns where the depth is invalid
    terms = [Exclude(Not(DepthValid(0, 0)))]
    # fitting term
    E_p = X(0, 0) - D_i(0, 0)
    terms.append(Select(DepthValid(0, 0), w_p * E_p, 0))
    # shading term
    E_g_h = (B_I(0, 0) - B_I(1, 0)) * edgeMaskR(0, 0)
    E_g_v = (B_I(0, 0) - B_I(0, 1)) * edgeMaskC(0, 0)
    terms.append(Select(InBoundsExpanded(0, 0, 1), w_g * E_g_h, 0))
    terms.append(Select(InBoundsExpanded(0, 0, 1), w_g * E_g_v, 0))

    # regularisation term
    def Continuous(x, y):
        return less(abs_(X(0, 0) - X(x, y)), DEPTH_DISCONTINUITY_THRE)

    valid = (DepthValid(0, 0) * DepthValid(0, -1) * DepthValid(0, 1) * DepthValid(-1, 0) * DepthValid(1, 0)
             * Continuous(0, -1) * Continuous(0, 1) * Continuous(-1, 0) * Continuous(1, 0)
             * InBoundsExpanded(0, 0, 1))
    if annotated:
        validArray = ComputedArray("valid", (W, H), valid)
        valid = eq(validArray(0, 0), 1)
    E_s = 4.0 * p(0, 0) - (p(-1, 0) + p(0, -1) + p(1, 0) + p(0, 1))
    terms.append(Select(valid, w_s * E_s, 0))
    return Energy(*terms)


# --------------------------------------------------------------------------- numpy reference
def _reader(A, pad_mode="constant"):
    """``read(dx, dy)``: A shifted so that ``read(dx, dy)[i, j] = A[i + dx, j + dy]``, 0 outside
    (Opt's out-of-bounds reads) or edge-replicated with ``pad_mode="edge"``."""
    P = np.pad(A, 2, mode=pad_mode)
    W, H = A.shape
    return lambda dx, dy: P[2 + dx: 2 + dx + W, 2 + dy: 2 + dy + H]


def shading_numpy(read_X, params, dx=0, dy=0):
    """SH shading B at (i + dx, j + dy) of every pixel (equation 10 normals), numpy."""
    W, H = read_X(0, 0).shape
    i, j = np.meshgrid(np.arange(W) + dx, np.arange(H) + dy, indexing="ij")
    f_x, f_y, u_x, u_y = (params[k] for k in ("f_x", "f_y", "u_x", "u_y"))
    X0, Xl, Xu = read_X(dx, dy), read_X(dx - 1, dy), read_X(dx, dy - 1)
    n_x = Xu * (X0 - Xl) / f_y
    n_y = Xl * (X0 - Xu) / f_x
    n_z = n_x * (u_x - i) / f_x + n_y * (u_y - j) / f_y - Xl * Xu / (f_x * f_y)
    sq = n_x * n_x + n_y * n_y + n_z * n_z
    with np.errstate(divide="ignore"):
        inv = np.where(sq > 0, 1.0 / np.sqrt(sq), 1.0)
    n_x, n_y, n_z = n_x * inv, n_y * inv, n_z * inv
    L = [None] + [params[f"L_{k}"] for k in range(1, 10)]
    return (L[1] + L[2] * n_y + L[3] * n_z + L[4] * n_x + L[5] * n_x * n_y + L[6] * n_y * n_z
            + L[7] * (-n_x * n_x - n_y * n_y + 2 * n_z * n_z) + L[8] * n_z * n_x + L[9] * (n_x * n_x - n_y * n_y))


def residuals_numpy(X, data, params):
    """The energy's residuals written directly in numpy (an independent transcription of spec
    3.5 for the tests): ``[r_fit, r_shade_h, r_shade_v, r_reg (3, W, H)]``, each (.., W, H)."""
    W, H = X.shape
    rX, rD, rI = _reader(X), _reader(data["D_i"]), _reader(data["Im"])
    i, j = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")

    def box(dx, dy, e):
        return (i + dx - e >= 0) & (i + dx + e < W) & (j + dy - e >= 0) & (j + dy + e < H)

    dv = lambda dx, dy: rD(dx, dy) > 0  # noqa: E731

    def B_I(dx, dy):
        I = 0.5 * rI(dx, dy) + 0.25 * (rI(dx - 1, dy) + rI(dx, dy - 1))
        ok = box(dx, dy, 1) & dv(dx - 1, dy) & dv(dx, dy) & dv(dx, dy - 1)
        with np.errstate(invalid="ignore"):
            return np.where(ok, shading_numpy(rX, params, dx, dy) - I, 0.0)

    sw = {k: np.sqrt(params[k]) for k in ("w_p", "w_s", "w_g")}
    r_fit = np.where(dv(0, 0), sw["w_p"] * (X - data["D_i"]), 0.0)
    inner = box(0, 0, 1)
    b0 = B_I(0, 0)
    r_h = np.where(inner, sw["w_g"] * (b0 - B_I(1, 0)) * data["edgeMaskR"], 0.0)
    r_v = np.where(inner, sw["w_g"] * (b0 - B_I(0, 1)) * data["edgeMaskC"], 0.0)
    nbrs = ((0, -1), (0, 1), (-1, 0), (1, 0))
    valid = inner & dv(0, 0)
    for n in nbrs:
        valid &= dv(*n) & (np.abs(X - rX(*n)) < DEPTH_DISCONTINUITY_THRE)

    def p(dx, dy):
        d = rX(dx, dy)
        return np.stack([(i + dx - params["u_x"]) / params["f_x"] * d,
                         (j + dy - params["u_y"]) / params["f_y"] * d, d])

    E_s = 4.0 * p(0, 0) - sum(p(*n) for n in nbrs)
    r_reg = np.where(valid, sw["w_s"] * E_s, 0.0)
    return [r_fit, r_h, r_v, r_reg]


# --------------------------------------------------------------------------- synthetic data
def camera(size):
    """Pinhole intrinsics (f_x, f_y, u_x, u_y) with a ~60 degree horizontal field of view."""
    W, H = size
    f = 0.85 * W
    return {"f_x": f, "f_y": f, "u_x": (W - 1) / 2.0, "u_y": (H - 1) / 2.0}


def make_data(size=(64, 48), seed=0, noise=0.002, quantum=0.001):
    """Synthetic RGB-D frame, arrays indexed [x, y]: returns (data arrays for the plan, params,
    true depth). The scene is defined over normalised image coordinates, so it is the same
    surface at every resolution."""
    W, H = size
    rng = np.random.default_rng(seed)
    params = dict(camera(size), **{f"L_{k + 1}": v for k, v in enumerate(LIGHTING)}, **weights(size))
    i, j = np.meshgrid(np.arange(W), np.arange(H), indexing="ij")
    a, b = (i - params["u_x"]) / params["f_x"], (j - params["u_y"]) / params["f_y"]
    z = 1.0 + 0.08 * a + 0.04 * b
    z -= 0.05 * np.exp(-((a + 0.18) ** 2 + (b - 0.05) ** 2) / (2 * 0.12 ** 2))
    z += 0.03 * np.exp(-((a - 0.05) ** 2 + (b + 0.18) ** 2) / (2 * 0.08 ** 2))
    z += 0.0025 * np.sin(22 * a + 1.0) * np.cos(17 * b)
    box = (a > 0.22) & (a < 0.45) & (b > -0.05) & (b < 0.25)
    truth = np.where(box, z - 0.05, z)
    # intensity: SH shading of the true depth (albedo 1), edge-replicated at the border
    Im = shading_numpy(_reader(truth, "edge"), params)
    # input depth: blurred truth + noise, quantised; a dropout blob of invalid depth
    blurred = 0.5 * truth + 0.125 * (np.roll(truth, 1, 0) + np.roll(truth, -1, 0)
                                     + np.roll(truth, 1, 1) + np.roll(truth, -1, 1))
    blurred[[0, -1], :], blurred[:, [0, -1]] = truth[[0, -1], :], truth[:, [0, -1]]
    D = np.round((blurred + rng.normal(scale=noise, size=size)) / quantum) * quantum
    hole = ((a + 0.3) / 0.12) ** 2 + ((b + 0.2) / 0.08) ** 2 < 1.0
    D[hole] = 0.0
    # edge masks: 0 where the shading stencil of B_I(0,0) - B_I(1,0) / B_I(0,1) crosses the step
    lab = np.pad(box.astype(int), 2, mode="edge")

    def same(offs):
        ref = lab[2:2 + W, 2:2 + H]
        return np.all([lab[2 + dx: 2 + dx + W, 2 + dy: 2 + dy + H] == ref for dx, dy in offs], axis=0)

    maskR = same([(-1, 0), (0, -1), (1, 0), (1, -1)]).astype(float)
    maskC = same([(-1, 0), (0, -1), (0, 1), (-1, 1)]).astype(float)
    data = {"D_i": D, "Im": Im, "edgeMaskR": maskR, "edgeMaskC": maskC, "X": D.copy()}
    return data, params, truth


def rms_error(X, truth, valid):
    return float(np.sqrt(np.mean((X - truth)[valid] ** 2)))


def _shaded(depth, params, valid):
    """Display image: the SH shading of a depth map (grey where the input depth is invalid)."""
    img = shading_numpy(_reader(depth, "edge"), params)
    return np.where(valid, img, np.nan)


def run(size=(64, 48), verbose=False, out_dir=None, *, nonlinear_iterations=60,
        pcg_max_iterations=10, methods=("lm", "gn"), dtype=np.float64, seed=0) -> dict:
    W, H = size
    data, params, truth = make_data(size, seed)
    valid = data["D_i"] > 0
    t0 = time.perf_counter()
    plan = compile_problem(energy(), arrays=data, params=params, dtype=dtype)
    plan.cost(plan.x0)  # the fused kernels are generated on first use
    t_compile = time.perf_counter() - t0
    runs = {}
    for m in methods:
        res = solve(plan, plan.x0, method=m, max_iterations=nonlinear_iterations,
                    pcg_max_iterations=pcg_max_iterations, verbose=verbose)
        X = plan.vector_to_unknowns(res.x)["X"]
        acc = res.accepted_costs
        runs[m] = {"result": res, "X": X, "cost": res.cost, "iterations": res.iterations,
                   "pcg_iterations": res.pcg_iterations, "time_solve_s": res.wall_time,
                   "rms_depth_err_refined": rms_error(X, truth, valid),
                   "monotone_accepted_costs": all(b <= a for a, b in zip(acc, acc[1:])),
                   "finite": bool(np.all(np.isfinite(X))), "termination": res.termination_reason}
    main = runs[methods[0]]
    out = {
        "example": NAME, "size": f"{W}x{H}", "unknowns": plan.n, "method": methods[0],
        "initial_cost": main["result"].initial_cost, "cost": main["cost"],
        "iterations": main["iterations"], "pcg_iterations": main["pcg_iterations"],
        "time_compile_s": t_compile, "time_solve_s": main["time_solve_s"],
        "rms_depth_err_input": rms_error(data["D_i"], truth, valid),
        "rms_depth_err_refined": main["rms_depth_err_refined"],
        "finite": all(r["finite"] for r in runs.values()),
        "monotone_accepted_costs": main["monotone_accepted_costs"],
        "methods": {m: {k: v for k, v in r.items() if k not in ("result", "X")} for m, r in runs.items()},
    }
    if verbose:
        for m, r in out["methods"].items():
            print(f"[{NAME}] {m.upper()}: cost {out['initial_cost']:.4e} -> {r['cost']:.4e}, rms depth "
                  f"error {out['rms_depth_err_input']:.2e} -> {r['rms_depth_err_refined']:.2e}")
    if out_dir is not None:
        lo, hi = float(truth.min()), float(truth.max())
        ilo, ihi = (float(v) for v in np.percentile(data["Im"], [2, 98]))  # not the step's edge lines
        Xr = main["X"]
        panels = [to_rgb8(np.where(valid, data["D_i"], np.nan).T, lo, hi), to_rgb8(np.where(valid, Xr, np.nan).T, lo, hi),
                  to_rgb8(truth.T, lo, hi), to_rgb8(data["Im"].T, ilo, ihi),
                  to_rgb8(_shaded(data["D_i"], params, valid).T, ilo, ihi),
                  to_rgb8(_shaded(Xr, params, valid).T, ilo, ihi)]
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"),
                               side_by_side(panels, upscale=max(1, 192 // H)))
    return out
