"""Toy-target experiments of the H2MC spec, quickly: ``python -m h2mc.examples --out DIR``.

Prints the numbers of AE-1 (closed form vs RK4), AE-2 (Gaussian exactness), AE-4
(stationarity on the three toy targets, with histogram PNGs next to their quadrature), AE-5
(ESS per target evaluation vs RWM / MALA / HMC), AE-6 (acceptance vs sigma2, next to Fig 6-5)
and AE-13 (HMC vs H2MC proposal economy, next to Fig 6-6). ``--full`` uses the spec's sizes
(2e6 AE-4 steps per target, longer AE-5 chains; minutes).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

from . import _experiments as E
# the experiment drivers, public here for the apps package (thesis reproductions)
from ._experiments import (  # noqa: F401
    THESIS_FIG_6_5,
    THESIS_FIG_6_6,
    TUNED_SIGMA2,
    ae4_stationarity,
    ae5_mixing,
    ae6_sigma_sweep,
    ae13_economy,
)
from ._dynamics import dynamics_coefficients
from ._png import histogram_png
from ._proposal import h2mc_log_acceptance, h2mc_proposal


def _ae1(n_steps=20000):
    alphas = [-4.0, -1.0, -0.25, 0.0, 0.25, 1.0, 4.0]
    combos = np.array(list(itertools.product(alphas, [-1.0, 0.0, 2.0], [0.3, np.pi / 2, 2.0],
                                             [-1.0, 0.5])))
    a, b, T, p = combos.T
    dt = T / n_steps
    x, v = np.zeros_like(a), p.copy()
    for _ in range(n_steps):
        k1x, k1v = v, a * x + b
        k2x, k2v = v + 0.5 * dt * k1v, a * (x + 0.5 * dt * k1x) + b
        k3x, k3v = v + 0.5 * dt * k2v, a * (x + 0.5 * dt * k2x) + b
        k4x, k4v = v + dt * k3v, a * (x + dt * k3x) + b
        x = x + dt / 6 * (k1x + 2 * k2x + 2 * k3x + k4x)
        v = v + dt / 6 * (k1v + 2 * k2v + 2 * k3v + k4v)
    s, o = dynamics_coefficients(a, b, T)
    _, ot = dynamics_coefficients(a, b, T, "thesis")
    return float(np.max(np.abs(x - (s * p + o)))), float(np.max(np.abs(x - (s * p + ot))))


def _ae2(n=15, cond=1e6, draws=10000, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    C = (Q * (np.logspace(0, -np.log10(cond), n) * 0.01)) @ Q.T
    P = np.linalg.inv(C)
    P = 0.5 * (P + P.T)
    m = rng.random(n)
    x = m + rng.multivariate_normal(np.zeros(n), C, size=draws)

    def d(x):
        dd = x - m
        return (-0.5 * np.einsum("bi,ij,bj->b", dd, P, dd), -dd @ P,
                np.broadcast_to(-P, (len(x), n, n)))

    lx, gx_, hx_ = d(x)
    gx = h2mc_proposal(gx_, hx_, np.inf)
    z = gx.sample(rng)
    ly, gy_, hy_ = d(x + z)
    gy = h2mc_proposal(gy_, hy_, np.inf)
    la = np.minimum(h2mc_log_acceptance(lx, ly, gx, gy, z), 0)
    rel_mu = np.max(np.abs(gx.mean - (m - x))) / np.max(np.abs(m - x))
    rel_c = np.max(np.abs(gx.covariance()[:100] - C)) / np.max(np.abs(C))
    return float(1 - np.exp(la.min())), float(rel_mu), float(rel_c)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m h2mc.examples", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="outputs/h2mc", help="directory for the PNGs")
    ap.add_argument("--full", action="store_true", help="the spec's sizes (minutes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    full = args.full

    e_exact, e_thesis = _ae1()
    print("AE-1 closed-form dynamics vs RK4 (126 cases: alpha x beta x T x p_hat):")
    print(f"  max |x_RK4(T) - (s p + o)|: exact offsets {e_exact:.2e} (< 1e-6),"
          f" thesis-printed offsets {e_thesis:.2e} (erratum D1)")
    one_minus_a, rel_mu, rel_c = _ae2()
    print("AE-2 Gaussian target N(m, C), n = 15, cond(C) = 1e6, no prior:")
    print(f"  max relative error of mu* vs m - x: {rel_mu:.1e}, of Sigma* vs C: {rel_c:.1e};"
          f" 1 - min acceptance over 1e4 proposals: {one_minus_a:.1e}")

    print("AE-4 stationarity (mixture: large 0.1, isotropic 0.2, H2MC 0.7; stationary seeds):")
    chains, steps = (16000, 250) if full else (8000, 250)  # >= the spec's 2e6 steps
    for key in "abc":
        r = E.ae4_stationarity(key, chains=chains, steps=steps, seed=args.seed,
                               progress=full and f"AE-4 {key}")
        acc = ", ".join(f"{k} {v:.3f}" for k, v in r["acceptance"].items())
        zs = ", ".join(f"{k} {r[k]['z']:+.2f}" for k in ("Ex", "Ey", "Ex2"))
        print(f"  {r['target']:<20} {r['steps']:>8} states: TV {r['tv']:.4f} (< 0.02);"
              f" moments in SE: {zs}; acceptance {acc}")
        histogram_png(out / f"ae4_{key}_samples_vs_quadrature.png", [r["hist"], r["ref"]])

    print("AE-5 ESS per target evaluation (1 / (tau_max * evaluations per step)):")
    for key in "ab":
        r = E.ae5_mixing(key, chains=64 if not full else 32,
                         steps=1000 if not full else 20000,
                         hmc_steps=60 if not full else 400, seed=args.seed,
                         with_mixture=True)
        for k in ("h2mc", "h2mc_mixture", "rwm", "mala", "hmc"):
            v = r[k]
            flag = "" if v["reliable"] else " (run < 20 tau: ESS over-estimated)"
            kern = v["kernel"] if k != "h2mc_mixture" else "AE-4 mixture (large, iso, H2MC)"
            print(f"  {r['target']:<20} {k:<12} {kern[:46]:<46} acc {v['acceptance']:.3f}"
                  f" tau {v['tau']:8.1f}  ESS/eval {v['ess_per_eval']:.2e}{flag}")
        mix = r["h2mc_mixture"]["ess_per_eval"] / r["rwm"]["ess_per_eval"]
        print(f"  {r['target']:<20} H2MC / best RWM = {r['ratio_rwm']:.1f}x (spec: >= 5;"
              f" mixture / best RWM = {mix:.1f}x),"
              f" H2MC / HMC = {r['ratio_hmc']:.0f}x (spec: > 1)")
    g = E.ae5_ring_global_moves(steps=8000 if not full else 20000, seed=args.seed,
                                with_h2mc=full)
    print("  on the ring, min-ESS/eval rewards global jumps (README, AE-5):"
          + ";".join(f" {k} {v['ratio_rwm']:.1f}x RWM" for k, v in g.items() if k != "rwm"))

    print("AE-6 H2MC acceptance vs sigma2 on target (b) (thesis Fig 6-5, bathroom scene):")
    for row in E.ae6_sigma_sweep("b", seed=args.seed):
        th = f"thesis {row['thesis']:.2%}" if row["thesis"] is not None else ""
        print(f"  sigma2 {row['sigma2']:<8g} acceptance {row['acceptance']:.4f}"
              f" +- {row['se']:.4f}   {th}")

    print("AE-13 proposal economy on target (b), HMC 0.0005 x 100 steps vs H2MC sigma2 = 0.01:")
    for k, v in E.ae13_economy("b", seed=args.seed).items():
        th = (f"thesis {v['thesis'][0]:.2%}, {v['thesis'][1]} evals" if v["thesis"] else "")
        print(f"  {k:<22} acceptance {v['acceptance']:.4f}  evaluations {v['evals']:>6}"
              f"  spread (std x, y) {v['spread'][0]:.4f}, {v['spread'][1]:.4f}   {th}")
    print(f"PNGs in {out}/ ; total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
