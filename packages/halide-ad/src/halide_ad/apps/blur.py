"""Separable 3x3 blur (binomial [1 2 1]/4 in x, then in y) with a repeat-edge boundary.

    clamped = repeat_edge(img)
    blur_x(x, y) = (clamped(x-1, y) + 2 clamped(x, y) + clamped(x+1, y)) * 0.25
    blur_y(x, y) = (blur_x(x, y-1) + 2 blur_x(x, y) + blur_x(x, y+1)) * 0.25

The weights are powers of two, so every schedule does bit-for-bit the same arithmetic.
Input ``img``: float32 ``(h, w)``. Output ``blur_y``: ``(h, w)``.
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name


def build(hl, img):
    img = np.ascontiguousarray(img, dtype=np.float32)
    if img.ndim != 2:
        raise ValueError("blur expects a grey (h, w) image")
    h, w = img.shape
    x, y = hl.Var("x"), hl.Var("y")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    im = hl.Buffer(img)
    clamped = hl.BoundaryConditions.repeat_edge(im)
    quarter, two = hl.f32(0.25), hl.f32(2)
    blur_x = hl.Func("blur_x")
    blur_x[x, y] = (clamped[x - 1, y] + two * clamped[x, y] + clamped[x + 1, y]) * quarter
    blur_y = hl.Func("blur_y")
    blur_y[x, y] = (blur_x[x, y - 1] + two * blur_x[x, y] + blur_x[x, y + 1]) * quarter
    return App(hl, outputs={"blur_y": blur_y}, funcs={"clamped": clamped, "blur_x": blur_x},
               vars={"x": x, "y": y, "xo": xo, "yo": yo, "xi": xi, "yi": yi}, sizes={"blur_y": [w, h]},
               buffers={"img": im})


def schedule(app, name, tile=(64, 32), vec=8):
    """"tiled" is Halide's classic blur schedule: blur_y in tiles (vectorised, parallel over
    tile rows), blur_x computed per tile and vectorised, the boundary Func inlined."""
    check_schedule_name(name)
    app.schedule_name = name
    v, f = app.vars, app.funcs
    out = app.outputs["blur_y"]
    if name == "inline":
        return app
    if name == "root":
        f["clamped"].compute_root()
        f["blur_x"].compute_root()
        return app
    x, y, xi, yi = v["x"], v["y"], v["xi"], v["yi"]
    out.tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    f["blur_x"].compute_at(out, x).vectorize(x, vec)
    return app


def reference(img, dtype=np.float64):
    """numpy: edge padding, then the two 3-tap passes on slices."""
    a = np.asarray(img, dtype=dtype)
    p = np.pad(a, 1, mode="edge")
    bx = (p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]) * 0.25
    return (bx[:-2] + 2 * bx[1:-1] + bx[2:]) * 0.25
