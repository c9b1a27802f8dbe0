"""Thesis Fig 6-6: HMC (leapfrog, 0.0005 x 100 steps) vs H2MC (sigma2 = 0.01): similar
acceptance, but H2MC needs one derivative evaluation per proposal instead of 101."""

from __future__ import annotations

from .._experiment import Experiment, Outcome, fig_axes, pct


def run(ctx, proposals, seed=0):
    from h2mc.examples import THESIS_FIG_6_6, ae13_economy

    out = Outcome()
    (rows,) = ctx.map(lambda p: ae13_economy("b", proposals=p, seed=seed), [proposals],
                      desc="HMC and H2MC")
    hmc_e = rows[f"HMC, {proposals} proposals"]["evals"]
    h2_e = rows[f"H2MC, {proposals} proposals"]["evals"]
    exp_hmc, exp_h2 = proposals * 101 + 1, proposals + 1
    out.check(f"function evaluations, {proposals} proposals", "12929 (HMC) vs 129 (H2MC)",
              f"{hmc_e} vs {h2_e}", (hmc_e, h2_e) == (exp_hmc, exp_h2),
              f"= {exp_hmc} and {exp_h2} (128 x 101 + 1 and 128 + 1 at paper size)")
    for k, v in rows.items():
        th = THESIS_FIG_6_6.get(k.replace(str(proposals), "128", 1)) if proposals != 128 \
            else THESIS_FIG_6_6.get(k)
        out.numbers[k] = {"acceptance": v["acceptance"], "evals": v["evals"],
                          "spread": v["spread"]}
        if th:
            out.check(f"acceptance, {k}", pct(th[0]), pct(v["acceptance"]), None)
    out.table("Proposal economy (thesis Fig 6-6 vs ours)",
              ["run", "thesis acceptance", "thesis evals", "ours acceptance", "ours evals",
               "spread (std x, y)"],
              [[k, pct(v["thesis"][0]) if v["thesis"] else "-",
                v["thesis"][1] if v["thesis"] else "-", pct(v["acceptance"]), v["evals"],
                f"{v['spread'][0]:.4f}, {v['spread'][1]:.4f}"] for k, v in rows.items()])
    fig, ax = fig_axes("Thesis Fig 6-6 analog: evaluations per run", "run",
                       "derivative evaluations (log)", figsize=(7, 3.6))
    names = list(rows)
    ax.bar(range(len(names)), [rows[k]["evals"] for k in names], label="ours")
    ax.plot(range(len(names)), [rows[k]["thesis"][1] if rows[k]["thesis"] else float("nan")
                                for k in names], "k_", ms=30, mew=2, label="thesis")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.legend()
    out.figure("economy", "Function (value + derivative) evaluations, HMC vs H2MC.", fig)
    return out


EXPERIMENT = Experiment(
    name="h2mc_economy",
    title="HMC vs H2MC proposal economy",
    reference="Thesis §6.3, Fig 6-6 (ring slice; HMC 0.0005 x 100 leapfrog steps)",
    paper={"evaluations, 128 proposals": "HMC 12929, H2MC 129",
           "acceptance, 128 proposals": "HMC 94.53%, H2MC 75.78%",
           "acceptance, 128 states": "HMC 92.97%, H2MC 94.53%"},
    check="evaluation counts are 128 x 101 + 1 vs 128 + 1; acceptances reported",
    sizes={"tiny": dict(proposals=8), "quick": dict(proposals=128),
           "full": dict(proposals=128)},
    run=run,
)
