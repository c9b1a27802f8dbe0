"""A local-Laplacian-like filter (after the local_laplacian app in Halide's repository,
grey-scale): ``levels`` remapped copies of the image, a Gaussian and a Laplacian pyramid of
each, a Gaussian pyramid of the input that picks (by a data-dependent gather along k) which
two copies to blend at every pyramid pixel, and the collapse of the blended Laplacian
pyramid.

    clamped = repeat_edge(img);  gray(x, y) = clamped(x, y)
    remap(i) = alpha / (levels - 1) * f * exp(-f^2 / 2),  f = i / 256          (a LUT)
    level(k) = k / (levels - 1)
    idx = clamp(int(gray * (levels - 1) * 256), 0, (levels - 1) * 256)
    gP0(x, y, k) = beta * (gray - level(k)) + level(k) + remap(idx - 256 k)
    gP_j = down(gP_{j-1});  lP_j = gP_j - up(gP_{j+1});  lP_{J-1} = gP_{J-1}
    inG_0 = gray;  inG_j = down(inG_{j-1})
    outL_j(x, y) = lerp over k of lP_j at li = clamp(int(inG_j * (levels-1)), 0, levels-2)
    outG_{J-1} = outL_{J-1};  outG_j = up(outG_{j+1}) + outL_j;  output = outG_0
    down(f)(x) = (f(2x-1) + 3 (f(2x) + f(2x+1)) + f(2x+2)) / 8       (x, then y)
    up(f)(x)   = lerp(f((x+1)/2), f((x-1)/2), ((x % 2) * 2 + 1) / 4)  (x, then y)

Input ``img``: float32 ``(h, w)`` in [0, 1]. Output ``output``: ``(h, w)``.
Params: ``alpha`` (detail gain), ``beta`` (tone gain), both ``hl.Param(Float(32))``.
"""
from __future__ import annotations

import numpy as np

from ._common import App, check_schedule_name


def build(hl, img, levels=8, J=4, alpha=1.0, beta=1.0):
    img = np.ascontiguousarray(img, dtype=np.float32)
    if img.ndim != 2:
        raise ValueError("local_laplacian expects a grey (h, w) image")
    if levels < 2 or J < 1:
        raise ValueError("need levels >= 2 and J >= 1")
    h, w = img.shape
    x, y, k, i = hl.Var("x"), hl.Var("y"), hl.Var("k"), hl.Var("i")
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    im = hl.Buffer(img)
    a_p = hl.Param(hl.Float(32), "alpha", float(alpha))
    b_p = hl.Param(hl.Float(32), "beta", float(beta))
    funcs = {}

    def func(name):
        f = hl.Func(name)
        funcs[name] = f
        return f

    clamped = hl.BoundaryConditions.repeat_edge(im)
    funcs["clamped"] = clamped
    gray = func("gray")
    gray[x, y] = clamped[x, y]

    remap = func("remap")
    fi = hl.f32(i) * hl.f32(1.0 / 256.0)
    remap[i] = a_p * hl.f32(1.0 / (levels - 1)) * fi * hl.exp(-(fi * fi) * hl.f32(0.5))

    def down(f, name, rest):
        dx = func(name + "_dx")
        dx[(x, y) + rest] = (f[(2 * x - 1, y) + rest]
                             + hl.f32(3) * (f[(2 * x, y) + rest] + f[(2 * x + 1, y) + rest])
                             + f[(2 * x + 2, y) + rest]) * hl.f32(0.125)
        dy = func(name)
        dy[(x, y) + rest] = (dx[(x, 2 * y - 1) + rest]
                             + hl.f32(3) * (dx[(x, 2 * y) + rest] + dx[(x, 2 * y + 1) + rest])
                             + dx[(x, 2 * y + 2) + rest]) * hl.f32(0.125)
        return dy

    def up(f, name, rest):
        ux = func(name + "_ux")
        ux[(x, y) + rest] = hl.lerp(f[((x + 1) / 2, y) + rest], f[((x - 1) / 2, y) + rest],
                                    hl.f32((x % 2) * 2 + 1) * hl.f32(0.25))
        uy = func(name + "_uy")
        uy[(x, y) + rest] = hl.lerp(ux[(x, (y + 1) / 2) + rest], ux[(x, (y - 1) / 2) + rest],
                                    hl.f32((y % 2) * 2 + 1) * hl.f32(0.25))
        return uy

    kk = (k,)
    level = hl.f32(k) * hl.f32(1.0 / (levels - 1))
    idx = hl.clamp(hl.i32(gray[x, y] * hl.f32((levels - 1) * 256)), 0, (levels - 1) * 256)
    gP = [func("gP0")]
    gP[0][x, y, k] = b_p * (gray[x, y] - level) + level + remap[idx - 256 * k]
    for j in range(1, J):
        gP.append(down(gP[j - 1], f"gP{j}", kk))
    lP = [None] * J
    lP[J - 1] = gP[J - 1]
    for j in range(J - 2, -1, -1):
        upg = up(gP[j + 1], f"up_gP{j + 1}", kk)
        lP[j] = func(f"lP{j}")
        lP[j][x, y, k] = gP[j][x, y, k] - upg[x, y, k]
    inG = [gray]
    for j in range(1, J):
        inG.append(down(inG[j - 1], f"inG{j}", ()))
    outL = []
    for j in range(J):
        lv = inG[j][x, y] * hl.f32(levels - 1)
        li = hl.clamp(hl.i32(lv), 0, levels - 2)
        lf = lv - hl.f32(li)
        o = func(f"outL{j}")
        o[x, y] = (hl.f32(1) - lf) * lP[j][x, y, li] + lf * lP[j][x, y, li + 1]
        outL.append(o)
    outG = [None] * J
    outG[J - 1] = outL[J - 1]
    for j in range(J - 2, -1, -1):
        upo = up(outG[j + 1], f"up_outG{j + 1}", ())
        outG[j] = func(f"outG{j}")
        outG[j][x, y] = upo[x, y] + outL[j][x, y]
    out = hl.Func("output")
    out[x, y] = outG[0][x, y]
    return App(hl, outputs={"output": out}, funcs=funcs,
               vars={"x": x, "y": y, "k": k, "i": i, "xo": xo, "yo": yo, "xi": xi, "yi": yi},
               sizes={"output": [w, h]}, params={"alpha": a_p, "beta": b_p},
               buffers={"img": im},
               meta={"levels": levels, "J": J, "gP": gP, "lP": lP, "inG": inG, "outL": outL, "outG": outG})


def schedule(app, name, tile=(64, 32), vec=8):
    """"tiled" follows the CPU schedule of Halide's app: gray, the remap LUT and every
    level of the Gaussian pyramids (gP, inG) and of the output pyramid (outG) compute_root,
    vectorised in x and parallel in y (the 3-D gP levels loop x, k, y); the Laplacian
    levels and the up/down passes inlined; the output tiled."""
    check_schedule_name(name)
    app.schedule_name = name
    v, f, m = app.vars, app.funcs, app.meta
    out = app.outputs["output"]
    if name == "inline":
        return app
    if name == "root":
        for fn in f.values():
            fn.compute_root()
        return app
    x, y, k, i, xi, yi = v["x"], v["y"], v["k"], v["i"], v["xi"], v["yi"]
    f["gray"].compute_root().parallel(y).vectorize(x, vec)
    f["remap"].compute_root().vectorize(i, vec)
    J = m["J"]
    for j in range(J):
        if j > 0:
            m["inG"][j].compute_root().parallel(y).vectorize(x, vec)
        m["gP"][j].compute_root().reorder(x, k, y).parallel(y).vectorize(x, vec)
        if j < J - 1:
            m["outG"][j].compute_root().parallel(y).vectorize(x, vec)
    m["outG"][J - 1].compute_root().parallel(y).vectorize(x, vec)
    out.tile(x, y, xi, yi, tile[0], tile[1]).vectorize(xi, vec).parallel(y)
    return app


# ----------------------------------------------------------------------- numpy reference
class _Plane:
    """Values of an infinite-domain stage on the window ``[ox, ox+nx) x [oy, oy+ny)``;
    ``arr`` has shape ``(..., ny, nx)``."""

    def __init__(self, arr, ox, oy):
        self.arr, self.ox, self.oy = arr, ox, oy

    def window(self, x0, x1, y0, y1):
        assert x0 >= self.ox and y0 >= self.oy
        assert x1 <= self.ox + self.arr.shape[-1] and y1 <= self.oy + self.arr.shape[-2]
        return self.arr[..., y0 - self.oy:y1 - self.oy, x0 - self.ox:x1 - self.ox]


def _bounds(*planes):
    x0 = max(p.ox for p in planes)
    y0 = max(p.oy for p in planes)
    x1 = min(p.ox + p.arr.shape[-1] for p in planes)
    y1 = min(p.oy + p.arr.shape[-2] for p in planes)
    return x0, x1, y0, y1


def _combine(a, b, op):
    x0, x1, y0, y1 = _bounds(a, b)
    return _Plane(op(a.window(x0, x1, y0, y1), b.window(x0, x1, y0, y1)), x0, y0)


def _down_axis(arr, o, axis):
    n = arr.shape[axis]
    lo, hi = -((-(o + 1)) // 2), (o + n - 3) // 2      # 2x-1 >= o and 2x+2 <= o+n-1
    xs = np.arange(lo, hi + 1)

    def t(off):
        return np.take(arr, 2 * xs + off - o, axis=axis)
    return (t(-1) + 3 * (t(0) + t(1)) + t(2)) / 8, lo


def _up_axis(arr, o, axis):
    n = arr.shape[axis]
    lo, hi = 2 * o + 1, 2 * (o + n - 1)                 # (x-1)//2 >= o, (x+1)//2 <= o+n-1
    xs = np.arange(lo, hi + 1)
    wgt = ((xs % 2) * 2 + 1) / 4.0
    shape = [1] * arr.ndim
    shape[axis] = len(xs)
    wgt = wgt.reshape(shape)
    a = np.take(arr, (xs + 1) // 2 - o, axis=axis)
    b = np.take(arr, (xs - 1) // 2 - o, axis=axis)
    return a * (1 - wgt) + b * wgt, lo


def _down(p):
    arr, ox = _down_axis(p.arr, p.ox, p.arr.ndim - 1)
    arr, oy = _down_axis(arr, p.oy, p.arr.ndim - 2)
    return _Plane(arr, ox, oy)


def _up(p):
    arr, ox = _up_axis(p.arr, p.ox, p.arr.ndim - 1)
    arr, oy = _up_axis(arr, p.oy, p.arr.ndim - 2)
    return _Plane(arr, ox, oy)


def reference(img, levels=8, J=4, alpha=1.0, beta=1.0):
    """float64, on an edge-padded window wide enough that the output needs no boundary."""
    a32 = np.asarray(img, dtype=np.float32)
    h, w = a32.shape
    L = levels
    alpha, beta = float(np.float32(alpha)), float(np.float32(beta))
    P = 4 * 2 ** J + 8
    g32 = np.pad(a32, P, mode="edge")
    g = g32.astype(np.float64)
    ks = np.arange(L, dtype=np.float64)[:, None, None]
    lev = ks / (L - 1)
    idx = np.clip(np.trunc(g32 * np.float32((L - 1) * 256)), 0, (L - 1) * 256)
    f = (idx[None] - 256 * ks) / 256.0
    remap = alpha / (L - 1) * f * np.exp(-f * f / 2)
    gP = [_Plane(beta * (g[None] - lev) + lev + remap, -P, -P)]
    for _ in range(1, J):
        gP.append(_down(gP[-1]))
    lP = [None] * J
    lP[J - 1] = gP[J - 1]
    for j in range(J - 2, -1, -1):
        lP[j] = _combine(gP[j], _up(gP[j + 1]), np.subtract)
    inG = [_Plane(g, -P, -P)]
    for _ in range(1, J):
        inG.append(_down(inG[-1]))
    outL = []
    for j in range(J):
        x0, x1, y0, y1 = _bounds(lP[j], inG[j])
        gin = inG[j].window(x0, x1, y0, y1)
        lp = lP[j].window(x0, x1, y0, y1)
        lv = gin * (L - 1)
        li = np.clip(np.trunc(lv).astype(np.int64), 0, L - 2)
        lf = lv - li
        lo = np.take_along_axis(lp, li[None], axis=0)[0]
        hi = np.take_along_axis(lp, li[None] + 1, axis=0)[0]
        outL.append(_Plane((1 - lf) * lo + lf * hi, x0, y0))
    outG = outL[J - 1]
    for j in range(J - 2, -1, -1):
        outG = _combine(_up(outG), outL[j], np.add)
    return outG.window(0, w, 0, h)
