"""``python -m halide_ad.demo [--out DIR] [--size W H]``: every application pipeline of
:mod:`halide_ad.apps` on a generated test image, under the tiled + vectorised + parallel
schedule; each result is checked against its numpy reference, timed next to it, and written as
a PNG (with the input) into ``DIR``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import halide_ad as hl
from halide_ad import apps


def test_image(w: int, h: int, seed: int = 0) -> np.ndarray:
    """A grey float32 (h, w) image with smooth shading, hard edges, texture and noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    u, v = xx / w, yy / h
    img = 0.25 + 0.5 * u * (1 - 0.5 * v)
    for cx, cy, r, val in ((0.3, 0.4, 0.18, 0.9), (0.7, 0.6, 0.22, 0.15), (0.55, 0.25, 0.1, 0.6)):
        img = np.where((u - cx) ** 2 + ((v - cy) * h / w) ** 2 < r * r, val, img)
    img += 0.06 * np.sin(xx / 3.0) * np.sin(yy / 5.0) * (v > 0.7)
    img += 0.02 * rng.standard_normal((h, w))
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def _png(path: Path, img: np.ndarray) -> None:
    from PIL import Image

    a = np.asarray(img, np.float64)
    if a.ndim == 3 and a.shape[0] in (3, 4):  # planar (c, h, w) -> (h, w, c)
        a = np.moveaxis(a, 0, -1)
    lo, hi = float(a.min()), float(a.max())
    if lo < 0 or hi > 1:
        a = (a - lo) / max(hi - lo, 1e-12)
    Image.fromarray((np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)).save(path)


def _time(fn, repeats=3):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def cases(img):
    h, w = img.shape
    rgb = np.stack([img, img[::-1], img[:, ::-1]]).astype(np.float32)
    kernel = (np.outer([1, 4, 6, 4, 1], [1, 2, 1]) / 64.0).astype(np.float32)
    small = img[: h // 2, : w // 2].copy()
    # (name, module, inputs, parameters, output Func, position in the reference's tuple)
    return [
        ("gamma", apps.gamma, (rgb,), {"gamma": 2.2}, "gamma", 0),
        ("blur", apps.blur, (img,), {}, "blur_y", None),
        ("conv2d", apps.conv2d, (img, kernel), {}, "output", None),
        ("histogram", apps.histogram, (img,), {}, "equalized", 2),
        ("upsample", apps.upsample, (small,), {"factor": 2}, "output", None),
        ("bilateral_grid", apps.bilateral_grid, (img,), {"s_sigma": 8, "r_sigma": 0.1},
         "bilateral_grid", None),
        ("local_laplacian", apps.local_laplacian, (img,), {"levels": 6, "J": 4, "alpha": 1.0,
                                                         "beta": 1.0}, "output", None),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="outputs/halide_ad")
    ap.add_argument("--size", nargs=2, type=int, default=(768, 512), metavar=("W", "H"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    img = test_image(*args.size)
    _png(out / "input.png", img)
    print(f"halide_ad demo: {args.size[0]} x {args.size[1]} test image, 'tiled' schedule"
          f" -> {out}/")
    print(f"{'app':<16} {'compile s':>9} {'halide_ad ms':>12} {'numpy ms':>9} {'max |err|':>10}")
    worst = 0.0
    for name, mod, inputs, kw, key, pos in cases(img):
        t0 = time.perf_counter()
        app = mod.build(hl, *inputs, **kw)
        mod.schedule(app, "tiled")
        app.realize(key)
        compile_s = time.perf_counter() - t0
        got, t_hl = _time(lambda app=app, key=key: app.realize(key))
        ref, t_np = _time(lambda mod=mod, inputs=inputs, kw=kw: mod.reference(*inputs, **kw))
        ref = ref if pos is None else ref[pos]
        err = float(np.max(np.abs(got.astype(np.float64) - np.asarray(ref, np.float64))))
        scale = max(float(np.max(np.abs(ref))), 1e-12)
        worst = max(worst, err / scale)
        print(f"{name:<16} {compile_s:9.2f} {t_hl * 1e3:12.1f} {t_np * 1e3:9.1f} {err:10.2e}")
        _png(out / f"{name}.png", got)
    ok = worst < 1e-3
    print(f"largest error relative to the output range: {worst:.2e} ({'ok' if ok else 'FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
