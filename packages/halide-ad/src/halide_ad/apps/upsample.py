"""Bilinear upsampling by an integer factor, separable (x pass, then y pass).

Output pixel ``x`` samples the input at ``u = (x + 0.5) / factor - 0.5`` (pixel centres
aligned, like ``align_corners=False``), with a repeat-edge boundary:

    clamped = repeat_edge(img)
    u = (float(x) + 0.5) * (1 / factor) - 0.5;  ix = int(floor(u));  wx = u - floor(u)
    upx(x, y, c) = lerp(clamped(ix, y, c), clamped(ix + 1, y, c), wx)
    output(x, y, c) = lerp(upx(x, iy, c), upx(x, iy + 1, c), wy)     (same in y)

Input ``img``: float32 grey ``(h, w)`` or planar colour ``(c, h, w)``.
Output ``output``: ``(h * factor, w * factor)`` or ``(c, h * factor, w * factor)``.
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name


def build(hl, img, factor=2):
    img = np.ascontiguousarray(img, dtype=np.float32)
    if img.ndim not in (2, 3):
        raise ValueError("upsample expects (h, w) or (c, h, w)")
    factor = int(factor)
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    rest = () if img.ndim == 2 else (c,)
    im = hl.Buffer(img)
    clamped = hl.BoundaryConditions.repeat_edge(im)
    inv = hl.f32(1.0 / factor)
    half = hl.f32(0.5)

    def coord(v):
        u = (hl.f32(v) + half) * inv - half
        fu = hl.floor(u)
        return hl.i32(fu), u - fu

    ix, wx = coord(x)
    iy, wy = coord(y)
    upx = hl.Func("upx")
    upx[(x, y) + rest] = hl.lerp(clamped[(ix, y) + rest], clamped[(ix + 1, y) + rest], wx)
    out = hl.Func("output")
    out[(x, y) + rest] = hl.lerp(upx[(x, iy) + rest], upx[(x, iy + 1) + rest], wy)
    size = [img.shape[-1] * factor, img.shape[-2] * factor] + \
        ([img.shape[0]] if img.ndim == 3 else [])
    return App(hl, outputs={"output": out}, funcs={"clamped": clamped, "upx": upx},
               vars={"x": x, "y": y, "c": c, "xo": xo, "yo": yo, "xi": xi, "yi": yi}, sizes={"output": size},
               buffers={"img": im}, meta={"factor": factor})


def schedule(app, name, tile=(64, 32), vec=8):
    check_schedule_name(name)
    app.schedule_name = name
    v, f = app.vars, app.funcs
    out = app.outputs["output"]
    if name == "inline":
        return app
    if name == "root":
        f["clamped"].compute_root()
        f["upx"].compute_root()
        return app
    x, y, xi, yi = v["x"], v["y"], v["xi"], v["yi"]
    out.tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    f["upx"].compute_at(out, x).vectorize(x, vec)
    return app


def _axis_weights(n_out, n_in, factor):
    u = (np.arange(n_out, dtype=np.float64) + 0.5) / factor - 0.5
    i0 = np.floor(u).astype(np.int64)
    wgt = u - i0
    return np.clip(i0, 0, n_in - 1), np.clip(i0 + 1, 0, n_in - 1), wgt


def reference(img, factor=2):
    """float64: gather the two neighbours per axis with clipped indices."""
    a = np.asarray(img, dtype=np.float64)
    h, w = a.shape[-2:]
    x0, x1, wx = _axis_weights(w * factor, w, factor)
    y0, y1, wy = _axis_weights(h * factor, h, factor)
    rows = a[..., :, x0] * (1 - wx) + a[..., :, x1] * wx
    return rows[..., y0, :] * (1 - wy)[:, None] + rows[..., y1, :] * wy[:, None]
