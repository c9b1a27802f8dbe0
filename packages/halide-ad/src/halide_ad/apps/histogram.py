"""Histogram (a scatter update), its cumulative distribution (a scan) and histogram
equalisation (a data-dependent gather).

    bin(x, y)     = clamp(int(img(x, y) * nbins), 0, nbins - 1)    float input (floor)
                  = int(img(x, y))                                 uint8 input (nbins = 256)
    hist(i)       = 0;  hist(bin(r.x, r.y)) += 1                   r = RDom over the image
    cum(i)        = hist(i);  cum(s) = cum(s - 1) + hist(s)        s = RDom(1, nbins - 1)
    cdf(i)        = float(cum(i)) / (w * h)
    equalized(x, y) = cdf(bin(x, y))

Inputs: ``img`` ``(h, w)``, float32 (values binned over [0, 1), clamped) or uint8.
Outputs: ``hist`` (int32, ``nbins``), ``cdf`` (float32, ``nbins``), ``equalized``
(float32 ``(h, w)``).

Default ("inline") placement in Halide computes a Func with updates at the innermost loop of
its consumer, so ``equalized`` under "inline" recomputes the whole histogram per pixel (and
``cdf`` recomputes it per bin): correct but quadratic. ``INLINE_OUTPUTS`` names the outputs
that are cheap under "inline".
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name

INLINE_OUTPUTS = ("hist",)


def build(hl, img, nbins=256):
    img = np.ascontiguousarray(img)
    if img.ndim != 2:
        raise ValueError("histogram expects a grey (h, w) image")
    if img.dtype == np.uint8:
        if nbins != 256:
            raise ValueError("a uint8 image uses nbins=256")
    else:
        img = img.astype(np.float32, copy=False)
    h, w = img.shape
    x, y, i = hl.Var("x"), hl.Var("y"), hl.Var("i")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    im = hl.Buffer(img)

    def bin_of(px, py):
        if img.dtype == np.uint8:
            idx = hl.cast(hl.Int(32), im[px, py])
        else:
            idx = hl.i32(hl.floor(im[px, py] * hl.f32(nbins)))
        return hl.clamp(idx, 0, nbins - 1)

    r = hl.RDom([hl.Range(0, w), hl.Range(0, h)])
    hist = hl.Func("hist")
    hist[i] = 0
    hist[bin_of(r.x, r.y)] += 1

    s = hl.RDom([hl.Range(1, nbins - 1)])
    cum = hl.Func("cum")
    cum[i] = hist[i]
    cum[s.x] = cum[s.x - 1] + hist[s.x]

    cdf = hl.Func("cdf")
    cdf[i] = hl.f32(cum[i]) / hl.f32(w * h)

    eq = hl.Func("equalized")
    eq[x, y] = cdf[bin_of(x, y)]
    return App(hl, outputs={"equalized": eq, "hist": hist, "cdf": cdf},
               funcs={"hist": hist, "cum": cum, "cdf": cdf},
               vars={"x": x, "y": y, "i": i, "xo": xo, "yo": yo, "xi": xi, "yi": yi},
               sizes={"equalized": [w, h], "hist": [nbins], "cdf": [nbins]},
               rdoms={"r": r, "s": s}, buffers={"img": im}, meta={"nbins": nbins})


def schedule(app, name, tile=(64, 32), vec=8):
    """"root"/"tiled": hist, cum and cdf compute_root (the scatter and the scan are serial
    reductions); "tiled" also vectorises cdf and tiles ``equalized``."""
    check_schedule_name(name)
    app.schedule_name = name
    v, f = app.vars, app.funcs
    if name == "inline":
        return app
    for n in ("hist", "cum", "cdf"):
        f[n].compute_root()
    if name == "root":
        return app
    i, x, y, xi, yi = v["i"], v["x"], v["y"], v["xi"], v["yi"]
    # (hist's pure step is left alone: Halide warns when a pure step is split but the update
    # is not, and the scatter update cannot be vectorised without atomics)
    f["cdf"].vectorize(i, vec)
    app.outputs["equalized"].tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    return app


def reference(img, nbins=256):
    """``(hist int64, cdf float64, equalized float64)``."""
    a = np.asarray(img)
    if a.dtype == np.uint8:
        b = a.astype(np.int64)
    else:
        # the pipeline multiplies in float32, then floors
        b = np.floor(a.astype(np.float32) * np.float32(nbins)).astype(np.int64)
        b = np.clip(b, 0, nbins - 1)
    hist = np.bincount(b.ravel(), minlength=nbins)
    cdf = np.cumsum(hist) / float(a.size)
    return hist, cdf, cdf[b]
