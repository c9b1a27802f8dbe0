"""Thesis §3.1.3 (Newton) and §2.2-2.3 (higher order by nesting modes): Hessian-vector products cost a small constant times a gradient,
independent of n; a dense Hessian (forward-over-reverse, n directions) costs n of them."""

from __future__ import annotations

import time

import numpy as np

from .._experiment import Experiment, Outcome, fig_axes


def _f(x):
    import core_ad.numpy as anp

    # quadratic-plus-tanh chain (the spec's CA-HES-8 function)
    return anp.sum(x * x) + anp.sum(anp.tanh(x[1:] * x[:-1])) + anp.sum(anp.sin(x))


def _best_time(fn, repeats):
    fn()
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _measure(n, repeats, dense_max, seed):
    import core_ad as ad

    rng = np.random.default_rng(seed + n)
    x, v = rng.uniform(-1, 1, n), rng.standard_normal(n)
    g = ad.grad(_f)
    row = {"n": n,
           "grad_s": _best_time(lambda: g(x), repeats),
           "hvp_s": _best_time(lambda: ad.hvp(_f, x, v), repeats)}
    if n <= dense_max:
        row["hessian_s"] = _best_time(lambda: ad.hessian(_f)(x), max(1, repeats // 2))
    # correctness: Hv against central differences of the exact gradient (float64)
    h = 1e-6
    fd = (g(x + h * v) - g(x - h * v)) / (2 * h)
    hv = np.asarray(ad.hvp(_f, x, v))
    row["hvp_rel_err"] = float(np.max(np.abs(hv - fd)) / max(np.max(np.abs(fd)), 1e-30))
    return row


def run(ctx, ns, repeats, dense_max, seed=0):
    out = Outcome()
    rows = ctx.starmap(_measure, [(n, repeats, dense_max, seed) for n in ns], desc="n")
    ratios = [r["hvp_s"] / r["grad_s"] for r in rows]
    err = max(r["hvp_rel_err"] for r in rows)
    out.numbers.update(rows=rows, hvp_over_grad=ratios)
    out.check("HVP cost / gradient cost, every n", "a small constant (~10, thesis §3.1.3)",
              f"{min(ratios):.1f} - {max(ratios):.1f}", max(ratios) <= 10,
              "hvp time <= 10 x gradient time at every n")
    out.check("HVP vs finite differences of the gradient", "exact (float64)",
              f"max rel. err {err:.1e}", err < 1e-6, "relative error < 1e-6 (h = 1e-6)")
    dense = [r for r in rows if "hessian_s" in r]
    if len(dense) >= 2:
        slope = float(np.polyfit(np.log([r["n"] for r in dense]),
                                 np.log([r["hessian_s"] / r["hvp_s"] for r in dense]), 1)[0])
        out.numbers["dense_over_hvp_slope"] = slope
        out.check("dense Hessian / HVP growth in n", "~n (n HVPs)", f"n^{slope:.2f}", None)
    fig, ax = fig_axes("Derivative cost vs problem size (core_ad)", "n (inputs)", "time [s]")
    for key, label in (("grad_s", "gradient (reverse)"), ("hvp_s", "Hessian-vector product"),
                       ("hessian_s", "dense Hessian (fwd-over-rev)")):
        pts = [(r["n"], r[key]) for r in rows if key in r]
        ax.loglog(*zip(*pts), "o-", label=label)
    ax.legend()
    out.figure("cost_vs_n", "Best-of-repeats time of each derivative vs n.", fig)
    out.table("Timings", ["n", "gradient ms", "HVP ms", "HVP / gradient", "dense Hessian ms"],
              [[r["n"], f"{1e3 * r['grad_s']:.2f}", f"{1e3 * r['hvp_s']:.2f}", f"{q:.2f}",
                f"{1e3 * r['hessian_s']:.1f}" if "hessian_s" in r else "-"]
               for r, q in zip(rows, ratios)])
    return out


EXPERIMENT = Experiment(
    name="core_ad_hessian",
    title="Hessian-vector product and dense Hessian cost vs n",
    reference="Thesis §3.1.3 (Newton, Hessian-vector products) and §2.2.1, §2.3.1 (forward-over-reverse)",
    paper={"HVP cost": "a small constant times the function's cost, independent of n",
           "dense Hessian": "n forward passes over the reverse graph"},
    check="HVP / gradient time <= 10 at every n; HVP equals central differences of the "
          "gradient to 1e-6",
    sizes={"tiny": dict(ns=(8, 32), repeats=2, dense_max=32),
           "quick": dict(ns=(10, 100, 1000, 10000, 100000), repeats=5, dense_max=1000),
           "full": dict(ns=(10, 100, 1000, 10000, 100000, 1000000), repeats=7,
                        dense_max=3000)},
    run=run,
)
