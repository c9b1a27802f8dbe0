"""Bilateral grid (Chen, Paris and Durand 2007), following the bilateral_grid app in
Halide's repository: construction by scattering into intensity bins, a separable 5-tap
[1 4 6 4 1] blur in z, x and y, then trilinear slicing and normalisation.

    clamped = repeat_edge(img)
    r = RDom(0..s, 0..s)                                         s = s_sigma (int)
    val = clamp(clamped(x*s + r.x - s/2, y*s + r.y - s/2), 0, 1)
    zi  = int(val * (1 / r_sigma) + 0.5)
    grid(x, y, z, c) = 0
    grid(x, y, zi, c) += select(c == 0, val, 1)                  data-dependent z
    blurz(x, y, z, c) = grid(x, y, z-2, c) + 4 grid(.., z-1, ..) + 6 grid(..) + ...
    blurx, blury      = the same filter along x, then y
    val = clamp(clamped(x, y), 0, 1); zv = val / r_sigma; zi = int(zv); zf = zv - zi
    xi = x / s; xf = float(x % s) / s  (same for y)
    interpolated(x, y, c) = trilinear lerp of blury around (xi, yi, zi, c)
    bilateral_grid(x, y)  = interpolated(x, y, 0) / interpolated(x, y, 1)

Grid cells are centred on pixel ``x * s``; slicing uses the same convention, so no extra
half-cell shift appears. The grid is unnormalised (the blur scales both channels by 16^3).
Input ``img``: float32 ``(h, w)`` (values clamped to [0, 1]). Output: ``(h, w)``.
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name


def build(hl, img, s_sigma=8, r_sigma=0.1):
    img = np.ascontiguousarray(img, dtype=np.float32)
    if img.ndim != 2:
        raise ValueError("bilateral_grid expects a grey (h, w) image")
    h, w = img.shape
    s = int(s_sigma)
    x, y, z, c = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("c")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    im = hl.Buffer(img)
    clamped = hl.BoundaryConditions.repeat_edge(im)
    inv_r = hl.f32(1.0 / r_sigma)
    zero, one = hl.f32(0), hl.f32(1)

    # construction: every grid cell (x, y) gathers its s*s pixels and scatters them in z
    r = hl.RDom([hl.Range(0, s), hl.Range(0, s)])
    val = hl.clamp(clamped[x * s + r.x - s // 2, y * s + r.y - s // 2], zero, one)
    zi = hl.i32(val * inv_r + hl.f32(0.5))
    grid = hl.Func("grid")
    grid[x, y, z, c] = zero
    grid[x, y, zi, c] += hl.select(c == 0, val, one)

    four, six = hl.f32(4), hl.f32(6)
    blurz = hl.Func("blurz")
    blurz[x, y, z, c] = (grid[x, y, z - 2, c] + four * grid[x, y, z - 1, c]
                         + six * grid[x, y, z, c] + four * grid[x, y, z + 1, c]
                         + grid[x, y, z + 2, c])
    blurx = hl.Func("blurx")
    blurx[x, y, z, c] = (blurz[x - 2, y, z, c] + four * blurz[x - 1, y, z, c]
                         + six * blurz[x, y, z, c] + four * blurz[x + 1, y, z, c]
                         + blurz[x + 2, y, z, c])
    blury = hl.Func("blury")
    blury[x, y, z, c] = (blurx[x, y - 2, z, c] + four * blurx[x, y - 1, z, c]
                         + six * blurx[x, y, z, c] + four * blurx[x, y + 1, z, c]
                         + blurx[x, y + 2, z, c])

    # trilinear slicing
    val = hl.clamp(clamped[x, y], zero, one)
    zv = val * inv_r
    zi = hl.i32(zv)
    zf = zv - hl.f32(zi)
    inv_s = hl.f32(1.0 / s)
    xf = hl.f32(x % s) * inv_s
    yf = hl.f32(y % s) * inv_s
    gx, gy = x / s, y / s
    interpolated = hl.Func("interpolated")
    interpolated[x, y, c] = hl.lerp(
        hl.lerp(hl.lerp(blury[gx, gy, zi, c], blury[gx + 1, gy, zi, c], xf),
                hl.lerp(blury[gx, gy + 1, zi, c], blury[gx + 1, gy + 1, zi, c], xf), yf),
        hl.lerp(hl.lerp(blury[gx, gy, zi + 1, c], blury[gx + 1, gy, zi + 1, c], xf),
                hl.lerp(blury[gx, gy + 1, zi + 1, c], blury[gx + 1, gy + 1, zi + 1, c], xf),
                yf),
        zf)
    out = hl.Func("bilateral_grid")
    out[x, y] = interpolated[x, y, 0] / interpolated[x, y, 1]
    return App(hl, outputs={"bilateral_grid": out},
               funcs={"clamped": clamped, "grid": grid, "blurz": blurz, "blurx": blurx,
                      "blury": blury, "interpolated": interpolated},
               vars={"x": x, "y": y, "z": z, "c": c, "xo": xo, "yo": yo, "xi": xi, "yi": yi},
               sizes={"bilateral_grid": [w, h]}, rdoms={"r": r}, buffers={"img": im},
               meta={"s_sigma": s, "r_sigma": float(r_sigma)})


def schedule(app, name, tile=(64, 32), vec=8):
    """"tiled" is the CPU schedule of Halide's bilateral_grid app: blurz/blurx/blury
    compute_root, vectorised in x, parallel, c innermost and unrolled; the grid computed per
    row of blurz with its scatter's c loop innermost and unrolled; the output tiled."""
    check_schedule_name(name)
    app.schedule_name = name
    v, f = app.vars, app.funcs
    out, r = app.outputs["bilateral_grid"], app.rdoms["r"]
    if name == "inline":
        return app
    if name == "root":
        for n in ("clamped", "grid", "blurz", "blurx", "blury", "interpolated"):
            f[n].compute_root()
        return app
    x, y, z, c, xi, yi = v["x"], v["y"], v["z"], v["c"], v["xi"], v["yi"]
    f["blurz"].compute_root().reorder(c, z, x, y).parallel(y).vectorize(x, vec).unroll(c, 2)
    f["grid"].compute_at(f["blurz"], y)
    f["grid"].update(0).reorder(c, r.x, r.y, x, y).unroll(c, 2)
    f["blurx"].compute_root().reorder(c, x, y, z).parallel(z).vectorize(x, vec).unroll(c, 2)
    f["blury"].compute_root().reorder(c, x, y, z).parallel(z).vectorize(x, vec).unroll(c, 2)
    out.tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    return app


def reference(img, s_sigma=8, r_sigma=0.1, dtype=np.float64):
    """Plain numpy: gather each cell's pixels (edge-clipped indices), bin them with
    ``np.bincount``, blur with shifted slices, slice with fancy indexing."""
    a = np.asarray(img, dtype=np.float32)
    h, w = a.shape
    s = int(s_sigma)
    inv_r = np.float32(1.0 / r_sigma)
    nz = int(1.0 * inv_r + 0.5) + 1                   # z bins 0 .. nz-1 receive samples
    mx, my = (w - 1) // s + 1, (h - 1) // s + 1       # slicing reads cells 0 .. mx (.. my)
    cx = np.arange(-2, mx + 3)                        # cells the blurs need: -2 .. mx + 2
    cy = np.arange(-2, my + 3)
    px = np.clip(cx[:, None] * s + np.arange(s) - s // 2, 0, w - 1)     # (ncx, s)
    py = np.clip(cy[:, None] * s + np.arange(s) - s // 2, 0, h - 1)     # (ncy, s)
    v = np.clip(a[py[:, :, None, None], px[None, None, :, :]], 0, 1)    # (ncy, s, ncx, s)
    zi = (v * inv_r + np.float32(0.5)).astype(np.int64)
    ncy, ncx = len(cy), len(cx)
    zpad = 2
    nzt = nz + 2 * zpad + 1                     # z = -2 .. nz + 2 (slicing reads up to nz)
    cell = (np.arange(ncy)[:, None, None, None] * ncx + np.arange(ncx)[None, None, :, None])
    lin = ((cell * nzt) + zi + zpad).ravel()
    size = ncy * ncx * nzt
    g = np.empty((ncy, ncx, nzt, 2), dtype=dtype)
    g[..., 0] = np.bincount(lin, weights=v.ravel().astype(np.float64),
                            minlength=size).reshape(ncy, ncx, nzt)
    g[..., 1] = np.bincount(lin, minlength=size).reshape(ncy, ncx, nzt)

    def blur(arr, axis):                      # valid part of the [1 4 6 4 1] filter
        n = arr.shape[axis] - 4

        def t(k):
            idx = [slice(None)] * arr.ndim
            idx[axis] = slice(k, k + n)
            return arr[tuple(idx)]
        return t(0) + 4 * t(1) + 6 * t(2) + 4 * t(3) + t(4)

    b = blur(blur(blur(g, 2), 1), 0)     # z: -2+2 .. ; x, y: cells 0 .. m
    # b indices: [cy - 0, cx - 0, z - 0 (z from 0 to nzt-5), c]
    val = np.clip(a, 0, 1)
    zv = val * inv_r
    zi = zv.astype(np.int64)
    zf = (zv - zi.astype(np.float32)).astype(dtype)[..., None]
    xs, ys = np.arange(w), np.arange(h)
    gx, xf = xs // s, ((xs % s).astype(np.float32) * np.float32(1.0 / s)).astype(dtype)
    gy, yf = ys // s, ((ys % s).astype(np.float32) * np.float32(1.0 / s)).astype(dtype)
    X, XF = gx[None, :], xf[None, :, None]
    Y, YF = gy[:, None], yf[:, None, None]

    def at(dy, dx, dz):
        return b[Y + dy, X + dx, zi + dz]                 # (h, w, 2)

    def lerp(p, q, t):
        return p * (1 - t) + q * t

    z0 = lerp(lerp(at(0, 0, 0), at(0, 1, 0), XF), lerp(at(1, 0, 0), at(1, 1, 0), XF), YF)
    z1 = lerp(lerp(at(0, 0, 1), at(0, 1, 1), XF), lerp(at(1, 0, 1), at(1, 1, 1), XF), YF)
    interp = lerp(z0, z1, zf)
    return interp[..., 0] / interp[..., 1]
