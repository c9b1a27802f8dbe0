"""Gamma correction with an L2 loss against a target ([P] section 3, example E1).

    lin(x, y, c)   = max(img(x, y, c), 0)
    gamma(x, y, c) = pow(lin(x, y, c), g)                 g: hl.Param(Float(32))
    loss()         = 0;  loss() += (gamma(r) - target(r))^2   over r = RDom(target)

Inputs: ``img`` and ``target`` float32, grey ``(h, w)`` or planar colour ``(c, h, w)``.
Outputs: ``gamma`` (same shape as ``img``) and the zero-dimensional ``loss``.
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name


def build(hl, img, target=None, gamma=2.2):
    img = np.ascontiguousarray(img, dtype=np.float32)
    target = np.zeros_like(img) if target is None else np.ascontiguousarray(target, np.float32)
    if img.shape != target.shape or img.ndim not in (2, 3):
        raise ValueError("img and target must have the same (h, w) or (c, h, w) shape")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    args = (x, y) if img.ndim == 2 else (x, y, c)
    im, tgt = hl.Buffer(img), hl.Buffer(target)
    g = hl.Param(hl.Float(32), "g", float(gamma))

    lin = hl.Func("lin")
    lin[args] = hl.max(im[args], hl.f32(0))
    out = hl.Func("gamma")
    out[args] = hl.pow(lin[args], g)

    shape_hl = img.shape[::-1]                 # (w, h[, c])
    r = hl.RDom([hl.Range(0, n) for n in shape_hl])
    rargs = (r.x, r.y) if img.ndim == 2 else (r.x, r.y, r.z)
    loss = hl.Func("loss")
    loss[()] = hl.f32(0)
    diff = out[rargs] - tgt[rargs]
    loss[()] += diff * diff

    return App(hl, outputs={"gamma": out, "loss": loss}, funcs={"lin": lin},
               vars={"x": x, "y": y, "c": c, "xo": xo, "yo": yo, "xi": xi, "yi": yi},
               sizes={"gamma": list(shape_hl), "loss": []}, rdoms={"r": r},
               params={"g": g}, buffers={"img": im, "target": tgt},
               meta={"ndim": img.ndim, "gamma": float(gamma)})


def schedule(app, name, tile=(64, 32), vec=8):
    check_schedule_name(name)
    app.schedule_name = name
    v = app.vars
    out, lin = app.outputs["gamma"], app.funcs["lin"]
    if name == "inline":
        return app
    if name == "root":
        # `gamma` is an intermediate of `loss`
        lin.compute_root()
        out.compute_root()
        return app
    x, y, xi, yi = v["x"], v["y"], v["xi"], v["yi"]
    out.compute_root().tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    lin.compute_at(out, x).vectorize(x, vec)
    return app


def reference(img, target=None, gamma=2.2):
    """``(gamma_image, loss)`` in float64."""
    a = np.asarray(img, dtype=np.float64)
    t = np.zeros_like(a) if target is None else np.asarray(target, dtype=np.float64)
    g = float(np.float32(gamma))      # the Param is a float32
    out = np.power(np.maximum(a, 0.0), g)
    return out, float(np.sum((out - t) ** 2))
