"""Thesis Fig 6-5: the prior variance sigma2 trades acceptance for step size; the thesis
picks sigma2 in the 50-70 % acceptance band. Swept on the ring target (b)."""

from __future__ import annotations

from .._experiment import Experiment, Outcome, fig_axes, pct

PAPER = {0.028: 0.2896, 0.007: 0.5402, 0.001: 0.8211}


def _one(sigma2, chains, steps, seed):
    from h2mc.examples import ae6_sigma_sweep

    return ae6_sigma_sweep("b", sigma2s=(sigma2,), chains=chains, steps=steps, seed=seed)[0]


def run(ctx, sigma2s, chains, steps, seed=0):
    out = Outcome()
    rows = ctx.starmap(_one, [(s2, chains, steps, seed) for s2 in sigma2s], desc="sigma2")
    acc = [r["acceptance"] for r in rows]
    decreasing = all(a > b for a, b in zip(acc, acc[1:]))
    in_band = [r["sigma2"] for r in rows if 0.5 <= r["acceptance"] <= 0.7]
    out.numbers["rows"] = rows
    out.check("acceptance decreases with sigma2", "28.96% (0.028) < 54.02% (0.007) < 82.11% "
              "(0.001)", " > ".join(pct(a) for a in acc), decreasing,
              "strictly decreasing over the sweep")
    out.check("a sigma2 in the 50-70 % band", "sigma2 = 0.007 -> 54.02%",
              ", ".join(f"{s:g}" for s in in_band) or "none", bool(in_band))
    fig, ax = fig_axes("Thesis Fig 6-5 analog: H2MC acceptance vs prior variance",
                       "prior variance sigma2", "acceptance")
    ax.errorbar([r["sigma2"] for r in rows], acc, yerr=[2 * r["se"] for r in rows], fmt="o-",
                label="ours (ring target, +-2 SE)")
    ax.plot(list(PAPER), list(PAPER.values()), "s", label="thesis (bathroom scene)")
    ax.axhspan(0.5, 0.7, color="0.9", label="50-70 % band")
    ax.set_xscale("log")
    ax.legend()
    out.figure("sigma_sweep", "H2MC small-step acceptance against sigma2.", fig)
    out.table("Acceptance vs sigma2", ["sigma2", "thesis", "ours", "SE"],
              [[f"{r['sigma2']:g}", pct(PAPER[r["sigma2"]]) if r["sigma2"] in PAPER else "-",
                pct(r["acceptance"]), f"{100 * r['se']:.2f}%"] for r in rows])
    return out


SWEEP = (1e-4, 1e-3, 7e-3, 2.8e-2, 1e-1)
EXPERIMENT = Experiment(
    name="h2mc_sigma",
    title="H2MC acceptance vs prior sigma2",
    reference="Thesis §6.3, Fig 6-5 (bathroom inset: sigma2 = 0.028 / 0.007 / 0.001)",
    paper={f"sigma2 = {k}": pct(v) for k, v in PAPER.items()},
    check="acceptance decreases strictly with sigma2 and one sigma2 lands in 50-70 %",
    sizes={"tiny": dict(sigma2s=(1e-3, 7e-3, 2.8e-2), chains=50, steps=10),
           "quick": dict(sigma2s=SWEEP, chains=500, steps=60),
           "full": dict(sigma2s=SWEEP, chains=1000, steps=100)},
    run=run,
)
