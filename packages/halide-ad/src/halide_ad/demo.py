"""``python -m halide_ad.demo [--out DIR] [--size W H] [--steps N]``: every application
pipeline of :mod:`halide_ad.apps` on a generated test image, under the tiled + vectorised +
parallel schedule; each result is checked against its numpy reference, timed next to it, and
written as a PNG (with the input) into ``DIR``. Then a fit by gradient descent through a
pipeline: the 5 taps of a separable blur recovered from a blurred image with Adam on
``propagate_adjoints`` gradients; its loss curve is written as ``fit_loss.png``.
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


def _separable_blur(image, taps):
    """Horizontal then vertical 5-tap blur with the same ``taps``, repeat-edge boundary."""
    x, y = hl.Var("x"), hl.Var("y")
    c = hl.BoundaryConditions.repeat_edge(image)
    bx, by = hl.Func("blur_x"), hl.Func("blur_y")
    bx[x, y] = sum(c[x + i - 2, y] * taps[hl.i32(i)] for i in range(5))
    by[x, y] = sum(bx[x, y + i - 2] * taps[hl.i32(i)] for i in range(5))
    return by


def fit_blur_taps(steps=150, lr=0.02, size=(128, 96), seed=0):
    """Recover known blur taps from (image, blurred image) by Adam on the mean squared error;
    the loss and its gradient are pipelines built once, the taps a Buffer updated in place.
    The image is white noise: it constrains every tap (smooth regions of a photograph barely
    constrain the taps' shape, only their sum). Returns (losses, fitted taps, true taps)."""
    w, h = size
    img = np.random.default_rng(seed).random((h, w))
    true_taps = np.array([0.05, 0.25, 0.4, 0.2, 0.1])
    image, truth = hl.Buffer(img, "image"), hl.Buffer(true_taps, "true_taps")
    target = hl.Buffer(np.asarray(_separable_blur(image, truth).realize([w, h])), "target")
    taps = np.full(5, 0.2)
    tb = hl.Buffer(taps, "taps")  # wraps ``taps``: updating it changes the pipeline's input
    out = _separable_blur(image, tb)
    r = hl.RDom([(0, w), (0, h)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += (out[r.x, r.y] - target[r.x, r.y]) ** 2 / float(w * h)
    grad = hl.propagate_adjoints(loss)[tb]
    m, v = np.zeros(5), np.zeros(5)
    losses = []
    for k in range(1, steps + 1):
        losses.append(float(np.asarray(loss.realize([]))))
        g = np.asarray(grad.realize([5]))
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        taps -= lr * (m / (1 - 0.9 ** k)) / (np.sqrt(v / (1 - 0.999 ** k)) + 1e-12)
    losses.append(float(np.asarray(loss.realize([]))))
    return losses, taps.copy(), true_taps


def _loss_png(path: Path, losses) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.semilogy(losses)
    ax.set_xlabel("Adam step")
    ax.set_ylabel("mean squared error")
    ax.set_title("fitting 5 blur taps through propagate_adjoints")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="outputs/halide_ad")
    ap.add_argument("--size", nargs=2, type=int, default=(768, 512), metavar=("W", "H"))
    ap.add_argument("--steps", type=int, default=150, help="Adam steps of the blur fit")
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
    t0 = time.perf_counter()
    losses, taps, truth = fit_blur_taps(steps=args.steps)
    fit_s = time.perf_counter() - t0
    _loss_png(out / "fit_loss.png", losses)
    err = float(np.max(np.abs(taps - truth)))
    print(f"blur fit: loss {losses[0]:.3e} -> {losses[-1]:.3e} in {args.steps} Adam steps"
          f" ({fit_s:.1f} s); taps {np.round(taps, 4).tolist()}, true"
          f" {truth.tolist()}, max |error| {err:.1e} -> {out}/fit_loss.png")
    fitted = losses[-1] < 1e-3 * losses[0]
    if not fitted:
        print("blur fit: FAILED to reduce the loss by 1000x")
    return 0 if ok and fitted else 1


if __name__ == "__main__":
    raise SystemExit(main())
