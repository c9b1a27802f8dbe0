"""2-D convolution with an RDom over the kernel ([P] section 4.3, example E6).

    clamped = <boundary>(img)                          any of the five BoundaryConditions
    conv(x, y) = 0
    conv(x, y) += kernel(r.x, r.y) * clamped(x - r.x + kw//2, y - r.y + kh//2)
    output(x, y) = conv(x, y)

A true convolution (the kernel is flipped), centred on tap ``(kh//2, kw//2)``. The update
sums ``r.x`` innermost, then ``r.y``, in every schedule.
Inputs: ``img`` float32 ``(h, w)``, ``kernel`` float32 ``(kh, kw)`` (numpy order; the pipeline
sees ``kernel[kx, ky]``). Output ``output``: ``(h, w)``.
"""
from __future__ import annotations

import numpy as np

from ._common import NUMPY_PAD_MODE, App, boundary, check_schedule_name

BOUNDARIES = tuple(NUMPY_PAD_MODE)


def build(hl, img, kernel, bc="constant_exterior"):
    img = np.ascontiguousarray(img, dtype=np.float32)
    kernel = np.ascontiguousarray(kernel, dtype=np.float32)
    if img.ndim != 2 or kernel.ndim != 2:
        raise ValueError("conv2d expects a grey (h, w) image and a (kh, kw) kernel")
    h, w = img.shape
    kh, kw = kernel.shape
    x, y = hl.Var("x"), hl.Var("y")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    im, kb = hl.Buffer(img), hl.Buffer(kernel)
    clamped = boundary(hl, im, bc)
    r = hl.RDom([hl.Range(0, kw), hl.Range(0, kh)])
    conv = hl.Func("conv")
    conv[x, y] = hl.f32(0)
    conv[x, y] += kb[r.x, r.y] * clamped[x - r.x + kw // 2, y - r.y + kh // 2]
    out = hl.Func("output")
    out[x, y] = conv[x, y]
    return App(hl, outputs={"output": out}, funcs={"clamped": clamped, "conv": conv},
               vars={"x": x, "y": y, "xo": xo, "yo": yo, "xi": xi, "yi": yi}, sizes={"output": [w, h]},
               rdoms={"r": r}, buffers={"img": im, "kernel": kb}, meta={"bc": bc})


def schedule(app, name, tile=(64, 32), vec=8):
    """"tiled": output tiled, vectorised and parallel; conv computed per tile with its
    update's x moved inside the reduction loops and vectorised."""
    check_schedule_name(name)
    app.schedule_name = name
    v, f = app.vars, app.funcs
    out, conv, r = app.outputs["output"], f["conv"], app.rdoms["r"]
    if name == "inline":
        return app
    if name == "root":
        f["clamped"].compute_root()
        conv.compute_root()
        return app
    x, y, xi, yi = v["x"], v["y"], v["xi"], v["yi"]
    out.tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    conv.compute_at(out, x).vectorize(x, vec)
    conv.update(0).reorder(x, r.x, r.y, y).vectorize(x, vec)
    return app


def reference(img, kernel, bc="constant_exterior"):
    """float64: pad with the matching numpy mode, then one shifted slice per tap."""
    a = np.asarray(img, dtype=np.float64)
    k = np.asarray(kernel, dtype=np.float64)
    h, w = a.shape
    kh, kw = k.shape
    # out[i, j] = sum_{u, v} k[u, v] * a[i - u + kh//2, j - v + kw//2]
    py, px = max(kh // 2, kh - 1 - kh // 2), max(kw // 2, kw - 1 - kw // 2)
    p = np.pad(a, ((py, py), (px, px)), mode=NUMPY_PAD_MODE[bc])
    out = np.zeros_like(a)
    for u in range(kh):
        for v in range(kw):
            dy, dx = kh // 2 - u + py, kw // 2 - v + px
            out += k[u, v] * p[dy:dy + h, dx:dx + w]
    return out
