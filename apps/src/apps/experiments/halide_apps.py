"""Thesis ch. 4 (§4.2, the Halide language halide_ad copies): the test applications written
once against Halide's API, compiled by halide_ad under the tiled + vectorised + parallel
schedule, checked against independent numpy implementations."""

from __future__ import annotations

import time

import numpy as np

from .._experiment import Experiment, Outcome, subplots


def _app(name, w, h, seed):
    import halide_ad as hl
    from halide_ad.demo import cases, test_image

    img = test_image(w, h, seed)
    (case,) = [c for c in cases(img) if c[0] == name]
    _, mod, inputs, kw, key, pos = case
    t0 = time.perf_counter()
    app = mod.build(hl, *inputs, **kw)
    mod.schedule(app, "tiled")
    got = app.realize(key)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = app.realize(key)
    run_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = mod.reference(*inputs, **kw)
    numpy_s = time.perf_counter() - t0
    ref = ref if pos is None else ref[pos]
    err = float(np.max(np.abs(got.astype(np.float64) - np.asarray(ref, np.float64))))
    scale = max(float(np.max(np.abs(ref))), 1e-12)
    return {"name": name, "rel_err": err / scale, "compile_s": compile_s, "run_s": run_s,
            "numpy_s": numpy_s, "image": got}


def _show(ax, a, title):
    a = np.asarray(a, np.float64)
    if a.ndim == 3:  # planar (c, h, w)
        a = np.moveaxis(a, 0, -1)
        a = (a - a.min()) / max(np.ptp(a), 1e-12)
    ax.imshow(a, cmap="gray" if a.ndim == 2 else None)
    ax.set_title(title, fontsize=9)
    ax.axis("off")


NAMES = ("gamma", "blur", "conv2d", "histogram", "upsample", "bilateral_grid",
         "local_laplacian")


def run(ctx, w, h, seed=0):
    from halide_ad.demo import test_image

    rows = ctx.starmap(_app, [(n, w, h, seed) for n in NAMES], desc="apps")
    out = Outcome()
    worst = max(r["rel_err"] for r in rows)
    out.check("every app equals its numpy reference", "same output under every schedule",
              f"max rel. error {worst:.1e}", worst < 1e-3,
              "max |halide_ad - numpy| / max |numpy| < 1e-3 (float32)")
    out.numbers["apps"] = [{k: v for k, v in r.items() if k != "image"} for r in rows]
    out.table(f"Applications on a {w} x {h} image ('tiled' schedule)",
              ["app", "compile s", "halide_ad ms", "numpy ms", "rel. error"],
              [[r["name"], f"{r['compile_s']:.2f}", f"{1e3 * r['run_s']:.1f}",
                f"{1e3 * r['numpy_s']:.1f}", f"{r['rel_err']:.1e}"] for r in rows])
    fig, axs = subplots(2, 4, figsize=(11, 5))
    _show(axs[0, 0], test_image(w, h, seed), "input")
    for ax, r in zip(axs.ravel()[1:], rows):
        _show(ax, r["image"], r["name"])
    fig.suptitle("halide_ad application outputs")
    fig.tight_layout()
    out.figure("apps", "The generated test image and every application's output.", fig)
    return out


EXPERIMENT = Experiment(
    name="halide_apps",
    title="Halide test applications compiled by halide_ad",
    reference="Thesis §4.2 (the Halide language), Halide-AD paper §3 (forward pipelines)",
    paper={"claim": "an algorithm's output does not depend on its schedule"},
    check="every application, tiled + vectorised + parallel, equals its numpy reference "
          "(rel. 1e-3)",
    sizes={"tiny": dict(w=64, h=48), "quick": dict(w=384, h=256),
           "full": dict(w=1536, h=1024)},
    run=run,
)
