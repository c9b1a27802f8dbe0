"""Opt App. B, Figs. 22-23: the 26 univariate NIST StRD non-linear regression problems,
solved by lsq_opt's LM (float64 and float32) and GN from NIST's start 1, next to scipy's
MINPACK LM on the same residuals."""

from __future__ import annotations

import numpy as np

from .._experiment import Experiment, Outcome, subplots

QUICK = ("Misra1a", "Chwirut2", "DanWood", "Misra1b", "Kirby2", "Lanczos3", "MGH17",
         "BoxBOD", "Eckerle4", "Thurber")


def _solve(name):
    from lsq_opt.examples import nist

    row = nist.run(names=[name])["problems"][0]
    cell = {k: {"reached": bool(row[k].reached), "digits": float(row[k].digits),
                "iterations": int(row[k].iterations), "costs": list(map(float, row[k].costs))
                if getattr(row[k], "costs", None) else []}
            for k in ("scipy", "lm64", "lm32", "gn64")}
    return {"name": row["name"], "level": row["level"], "K": row["K"], "N": row["N"],
            "certified_cost": float(row["certified_cost"]), **cell}


def run(ctx, problems):
    from lsq_opt.examples import nist

    names = list(nist.NAMES) if problems == "all" else list(problems)
    rows = ctx.map(_solve, names, desc="problems")
    out = Outcome()
    lm = sum(r["lm64"]["reached"] for r in rows)
    sp = sum(r["scipy"]["reached"] for r in rows)
    matches = all(r["lm64"]["reached"] for r in rows if r["scipy"]["reached"])
    out.check("LM f64 reaches the certified fit wherever scipy's LM does",
              "Opt's LM (double) solves the problems Ceres solves; double + LM needed on "
              "some hard ones", f"LM f64 {lm}/{len(rows)}, scipy LM {sp}/{len(rows)}", matches,
              ">= 6 significant digits or certified RSS to rel 1e-8 (NIST's criterion)")
    out.numbers.update(problems=[{k: v for k, v in r.items()} for r in rows],
                       lm64_reached=lm, scipy_reached=sp)

    def cell(c):
        return f"{'yes' if c['reached'] else 'no'} ({min(c['digits'], 99):.1f})"

    out.table("NIST StRD (reached? significant digits)",
              ["problem", "level", "K", "scipy LM", "LM f64", "LM its", "LM f32", "GN f64"],
              [[r["name"], r["level"], r["K"], cell(r["scipy"]), cell(r["lm64"]),
                r["lm64"]["iterations"], cell(r["lm32"]), cell(r["gn64"])] for r in rows])
    cols = 5
    nrows = -(-len(rows) // cols)
    fig, axs = subplots(nrows, cols, figsize=(2.6 * cols, 2.0 * nrows), squeeze=False)
    for ax, r in zip(axs.ravel(), rows):
        for key, label in (("lm64", "LM f64"), ("lm32", "LM f32"), ("gn64", "GN f64")):
            c = np.maximum(np.asarray(r[key]["costs"], float), 1e-300)
            if len(c):
                ax.semilogy(np.arange(len(c)), c, label=label)
        ax.axhline(max(r["certified_cost"], 1e-300), color="k", ls=":", label="certified")
        ax.set_title(r["name"], fontsize=9)
        ax.set_xlabel("iteration", fontsize=7)
        ax.set_ylabel("cost", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in axs.ravel()[len(rows):]:
        ax.axis("off")
    axs[0, 0].legend(fontsize=6)
    fig.suptitle("Opt Figs. 22-23 analog: cost vs iteration on the NIST problems")
    fig.tight_layout()
    out.figure("nist_costs", "Cost per non-linear iteration, LM/GN, float64/float32.", fig)
    return out


EXPERIMENT = Experiment(
    name="opt_nist",
    title="NIST StRD non-linear regression table",
    reference="Opt (DeVito et al. 2017) App. B, Figs. 22-23",
    paper={"problems": "26 univariate NIST problems",
           "claim": "no differences on easy problems; double precision + LM needed on some "
                    "hard ones"},
    check="lsq_opt LM f64 reaches the certified values on every problem where scipy's LM "
          "does",
    sizes={"tiny": dict(problems=("Misra1a", "DanWood")), "quick": dict(problems=QUICK),
           "full": dict(problems="all")},
    run=run,
)
