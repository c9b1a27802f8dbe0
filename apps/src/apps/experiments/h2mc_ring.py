"""Thesis ch. 6, Fig 6-2: on a thin ring (a caustic-like slice of path space), H2MC's Gaussian
proposals follow the ring and are accepted far more often than traditional isotropic
MCMC's (Kelemen) small steps; 128 proposals from one state and 1024-state chains."""

from __future__ import annotations

import numpy as np

from .._experiment import Experiment, Outcome, pct, subplots

PAPER = {"isotropic, 128 proposals": 0.5937, "H2MC, 128 proposals": 0.7558,
         "isotropic, 1024 states": 0.5752, "H2MC, 1024 states": 0.9299}


def _kernel(kind):
    import h2mc

    # H2MC at the thesis' sigma2 = 0.01 (Fig 6-6); isotropic: the sampler's small step
    return h2mc.H2MCStep(sigma2=0.01) if kind == "H2MC" else h2mc.IsotropicStep(sigma2=1e-4)


def _proposals(kind, n, seed):
    import h2mc

    target = h2mc.toy.ring(derivatives="compiled")
    x = np.array([0.5 + 0.3 * np.cos(0.7), 0.5 + 0.3 * np.sin(0.7)])
    s = h2mc.Sampler(target, _kernel(kind))
    st = s.init(np.repeat(x[None], n, axis=0))
    before = st.x.copy()
    acc = s.step(st, np.random.default_rng(seed))
    return {"acceptance": float(acc.mean()), "accepted": ((st.x[acc] - before[acc] + 0.5) % 1
                                                            - 0.5 + x).tolist()}


def _chains(kind, chains, steps, seed):
    import h2mc

    target = h2mc.toy.ring(derivatives="compiled")
    x0 = h2mc.toy.stationary_starts(target, chains, np.random.default_rng(seed + 1000))
    s = h2mc.Sampler(target, _kernel(kind))
    res = s.run(s.init(x0), steps, np.random.default_rng(seed))
    # acceptance over all chains; the figure shows chain 0
    return {"acceptance": s.stats[s.names[0]].acceptance, "path": res.samples[:, 0, :].tolist()}


def run(ctx, proposals, chains, steps, seed=0):
    out = Outcome()
    jobs = [("prop", k) for k in ("isotropic", "H2MC")] + [("chain", k) for k in
                                                            ("isotropic", "H2MC")]

    def piece(what, kind):
        return (_proposals(kind, proposals, seed) if what == "prop"
                else _chains(kind, chains, steps, seed))

    res = dict(zip(jobs, ctx.starmap(piece, jobs, desc="runs")))
    rows = []
    for (what, kind), r in res.items():
        label = (f"{kind}, {proposals} proposals" if what == "prop"
                 else f"{kind}, {steps} states")
        paper_key = label.replace(str(steps), "1024").replace(str(proposals), "128")
        rows.append([label, pct(PAPER[paper_key]), pct(r["acceptance"])])
        out.numbers[label] = r["acceptance"]
    a_iso, a_h = res[("chain", "isotropic")]["acceptance"], res[("chain", "H2MC")]["acceptance"]
    out.check("chain acceptance, H2MC vs isotropic", "92.99% vs 57.52% (H2MC higher)",
              f"{pct(a_h)} vs {pct(a_iso)}", a_h > a_iso, "H2MC's acceptance is higher")
    p_iso, p_h = res[("prop", "isotropic")]["acceptance"], res[("prop", "H2MC")]["acceptance"]
    out.check("128 proposals, H2MC vs isotropic", "75.58% vs 59.37%",
              f"{pct(p_h)} vs {pct(p_iso)}", None)
    out.table("Acceptance (thesis Fig 6-2 vs ours on the ring target)",
              ["run", "thesis", "ours"], rows)
    fig, axs = _ring_panels([res[("prop", "isotropic")]["accepted"],
                             res[("prop", "H2MC")]["accepted"],
                             res[("chain", "isotropic")]["path"],
                             res[("chain", "H2MC")]["path"]],
                            [f"isotropic: accepted of {proposals} proposals",
                             f"H2MC: accepted of {proposals} proposals",
                             f"isotropic: {steps} states", f"H2MC: {steps} states"])
    out.figure("ring", "Accepted proposals from one state (top) and one chain (bottom) on the "
               "ring of radius 0.3, width 0.005.", fig)
    return out


def _ring_panels(point_sets, titles):
    fig, axs = subplots(2, 2, figsize=(7, 7))
    t = np.linspace(0, 2 * np.pi, 400)
    for ax, pts, title in zip(axs.ravel(), point_sets, titles):
        ax.plot(0.5 + 0.3 * np.cos(t), 0.5 + 0.3 * np.sin(t), color="0.8", lw=4,
                label="ring (target mass)")
        p = np.asarray(pts).reshape(-1, 2)
        if len(p):
            ax.plot(p[:, 0], p[:, 1], ".", ms=3, label="samples")
        ax.set(title=title, xlabel="x1", ylabel="x2", xlim=(0, 1), ylim=(0, 1), aspect="equal")
    axs[0, 0].legend(loc="lower left", fontsize=7)
    fig.suptitle("Thesis Fig 6-2 analog: ring target")
    fig.tight_layout()
    return fig, axs


EXPERIMENT = Experiment(
    name="h2mc_ring",
    title="Ring: H2MC vs isotropic MCMC acceptance",
    reference="Thesis ch. 6 introduction, Fig 6-2 (gold ring caustic slice)",
    paper={k: pct(v) for k, v in PAPER.items()},
    check="H2MC's chain acceptance is above isotropic MCMC's (the thesis' 92.99% vs 57.52%)",
    sizes={"tiny": dict(proposals=16, chains=1, steps=64),
           "quick": dict(proposals=128, chains=16, steps=1024),
           "full": dict(proposals=128, chains=256, steps=1024)},
    run=run,
)
