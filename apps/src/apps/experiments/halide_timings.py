"""Blur and bilateral grid: halide_ad against Halide 21 (the system the thesis builds on) on
the same pipeline code and schedule, and against numpy, timed side by side in one run.
Halide 21's column is skipped, with a note, when ``import halide`` fails."""

from __future__ import annotations

import time

import numpy as np

from .._experiment import Experiment, Outcome, fig_axes

CASES = {"blur": {}, "bilateral_grid": {"s_sigma": 8, "r_sigma": 0.1}}


def _time_all(name, size, repeats, seed):
    import halide_ad
    from halide_ad import apps
    from halide_ad.demo import test_image

    mod = getattr(apps, name)
    img = test_image(size, size, seed)
    kw = CASES[name]
    modules = {"halide_ad": halide_ad}
    note = None
    try:
        import halide

        modules["Halide 21"] = halide
    except ImportError as err:
        note = f"Halide 21 not installed ({err}); its column is skipped"
    calls, first = {}, {}
    ref = mod.reference(img, **kw, dtype=np.float32)
    for label, hl in modules.items():
        app = mod.build(hl, img, **kw)
        mod.schedule(app, "tiled")
        t0 = time.perf_counter()
        got = app.realize()
        first[label] = time.perf_counter() - t0
        err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-12))
        if err > 1e-3:
            raise AssertionError(f"{name} on {label}: output differs from numpy by {err:.1e}")
        calls[label] = app.realize
    calls["numpy"] = lambda: mod.reference(img, **kw, dtype=np.float32)
    times = {k: [] for k in calls}
    for _ in range(repeats):  # alternate the cases on every repeat
        for k, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {"name": name, "size": size, "median_s": {k: float(np.median(v))
                                                     for k, v in times.items()},
            "first_call_s": first, "note": note}


def run(ctx, size, repeats, seed=0):
    rows = ctx.starmap(_time_all, [(n, size, repeats, seed) for n in CASES], desc="pipelines")
    out = Outcome()
    notes = {r["note"] for r in rows if r["note"]}
    out.notes.extend(sorted(notes))
    has_halide = not notes
    for r in rows:
        m = r["median_s"]
        if has_halide:
            ratio = m["halide_ad"] / m["Halide 21"]
            out.check(f"{r['name']}: halide_ad / Halide 21 time", "1x (same pipeline, same "
                      "schedule; project goal <= 1.5x)", f"{ratio:.2f}x", None)
        out.check(f"{r['name']}: numpy / halide_ad time", "> 1 (compiled pipeline)",
                  f"{m['numpy'] / m['halide_ad']:.1f}x", None)
    out.check("outputs agree before timing", "identical algorithm", "all within 1e-3",
              True, "every timed output equals numpy's to rel. 1e-3 (else the run fails)")
    out.numbers["rows"] = rows
    cols = list(rows[0]["median_s"])
    out.table(f"Median of {repeats} runs, {size} x {size} float32, ms (first call in "
              "parentheses: JIT compile)", ["pipeline", *cols],
              [[r["name"], *[f"{1e3 * r['median_s'][c]:.1f}"
                             + (f" ({r['first_call_s'][c]:.1f} s)" if c in r["first_call_s"]
                                else "") for c in cols]] for r in rows])
    fig, ax = fig_axes(f"Pipeline times, {size} x {size}", "pipeline", "median time [ms]")
    width = 0.8 / len(cols)
    for i, c in enumerate(cols):
        ax.bar([j + i * width for j in range(len(rows))],
               [1e3 * r["median_s"][c] for r in rows], width, label=c)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["name"] for r in rows])
    ax.legend()
    out.figure("timings", "Median time per pipeline, same run, same thread count.", fig)
    return out


EXPERIMENT = Experiment(
    name="halide_timings",
    title="Blur and bilateral grid: halide_ad vs Halide 21 and numpy",
    reference="Thesis §4.2 and Halide-AD paper §3 (Halide's schedules); the bilateral grid of "
              "Chen et al. 2007 as in thesis §4.4.1",
    paper={"claim": "halide_ad runs Halide's pipelines and schedules at Halide's speed"},
    check="outputs equal numpy's before timing; times vs Halide 21 (where installed) and "
          "numpy are reported",
    sizes={"tiny": dict(size=64, repeats=1), "quick": dict(size=1024, repeats=5),
           "full": dict(size=4096, repeats=7)},
    run=run,
    headline="bilateral_grid: halide_ad / Halide 21",
)
