"""lsq_opt with DEFAULT settings (``solve(plan, plan.x0)``) against scipy and pyceres, side by side.

Problems: every example energy (Poisson, ARAP image, ARAP mesh, shading, flow, intrinsic; the
intrinsic energy with its IRLS weight inside the residual, see ``intrinsic_smooth_plan``) plus
two non-linear energies of this benchmark's own:

* TV denoising with a Charbonnier-type robust regulariser on a grid,
  ``r_reg = sqrt(w) d (d^2 + eps^2)^(-1/4)`` on forward differences d (``r_reg^2 = w d^2 /
  sqrt(d^2 + eps^2)``, ~ w |d| for |d| >> eps: a non-quadratic, edge-preserving penalty),
  ``r_fit = X - noisy``;
* a spring network (a jittered 2-D lattice graph with diagonals, both ends of the network
  pinned and pulled apart) with a robust edge loss ``r = e (1 + (e/s)^2)^(-1/4)`` on the strain
  ``e = |p_v0 - p_v1| - |q_v0 - q_v1|`` (q: the rest positions).

Rule for "the same final cost": scipy.optimize.least_squares (trf, lsmr, the plan's sparse
Jacobian, x_scale 1 and 'jac') is first run to convergence (ftol = xtol = gtol = 1e-12); its
best final cost is c_S. The common target is T = max((1 + 1e-6) c_S, c_L), where c_L is the
final cost of lsq_opt's default solve: T is the baseline's final cost within 1e-6 relative, or
lsq's own final cost when lsq stops above that (the row is then flagged, and the baseline is
timed only to lsq's cost). Times:

* lsq_opt defaults: the wall time of the whole ``solve(plan, plan.x0)`` (its own stopping rule,
  not stopped at T; the time at which it first reaches T is printed too);
* baselines: time until the first residual evaluation (scipy) or iteration (pyceres, Ceres'
  cumulative iteration time, the Python problem build excluded) at cost <= T;
* hand-tuned lsq_opt: the configurations of bench_solvers.py (LM with PCG 10 / 50, GN with PCG
  100 / 1000, multigrid on grid energies, LM with the lagged sparse factorisation on graph
  energies; fixed PCG caps, no function tolerance), each stopped by a callback at T; the best
  of them is "hand-tuned".

Sizes: ``--scale ci`` (the default: the sizes below, 30-150x smaller than the paper's, so
that a run takes minutes), ``--scale paper`` (every problem at the size the Opt paper reports
for it, :data:`PAPER_SIZES`, with the reason for each; scipy then takes minutes per problem:
use ``--only`` and ``--repeats 1``), or a factor on every side of the ci sizes.

Medians of ``--repeats`` runs, cases alternated; all float64, one BLAS thread. pyceres (per
residual-block Python cost functions, as in bench_solvers.py) runs where it imports and
bench_solvers.py has cost functions for the energy (Poisson, ARAP image, ARAP mesh); elsewhere
the skip and its reason are printed. Run from the repository root:

    PYTHONPATH=packages/lsq-opt/src:packages/core-ad/src python packages/lsq-opt/benchmarks/bench_defaults.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
import scipy  # noqa: E402
from core_ad import benchmark as bench  # noqa: E402

from lsq_opt import (Array, Dim, Dot, Energy, InBounds, Param, Select, Unknown, compile_problem,  # noqa: E402
                     solve)
from lsq_opt.examples import flow, intrinsic, shading  # noqa: E402
from lsq_opt.testing import spring_network  # noqa: E402
from lsq_opt.examples import mesh as mesh_example  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_solvers as bs  # noqa: E402

#: what every timed case is measured with: wall time, or (``--clock thread``) the thread's
#: CPU time, which a machine shared with other jobs does not inflate by preemption; valid
#: with one thread for everything (``CORE_AD_NUM_THREADS=1``, one BLAS thread)
clock = time.perf_counter
HAND_BUDGET_MIN = 2.0  # s; a hand-tuned config gets max(this, 3 x the defaults' time) to reach T
HAND_BUDGET = "max(2 s, 3 x defaults)"
REL = 1e-6  # target = (1 + REL) x scipy's converged cost (or lsq's final cost if higher)


# ============================================================================ own energies
def tv_problem(N=128, seed=0):
    """Charbonnier-type TV denoising of a noisy piecewise-smooth image (non-quadratic)."""
    W, H = Dim("W"), Dim("H")
    X, F = Unknown("X", (W, H)), Array("F", (W, H))
    w, eps = Param("w_regSqrt"), Param("eps")
    terms = [X(0, 0) - F(0, 0)]
    for off in ((1, 0), (0, 1)):
        d = X(0, 0) - X(*off)
        terms.append(Select(InBounds(*off), w * d * (d * d + eps * eps) ** -0.25, 0))
    rng = np.random.default_rng(seed)
    ii, jj = np.meshgrid(np.linspace(0, 1, N), np.linspace(0, 1, N), indexing="ij")
    clean = (0.5 * (ii > 0.3) + 0.3 * (((ii - .6) ** 2 + (jj - .5) ** 2) < .05)
             + 0.2 * np.sin(4 * jj))
    noisy = clean + rng.normal(scale=0.1, size=clean.shape)
    plan = compile_problem(Energy(*terms), arrays={"F": noisy, "X": noisy.copy()},
                           params={"w_regSqrt": np.sqrt(0.15), "eps": 0.02})
    return plan


def intrinsic_smooth_plan(img, p_norm=0.8, eps=1e-2):
    """The intrinsic example's energy and data (lsq_opt.examples.intrinsic) with the IRLS
    weight made part of the residual, ``L_p(d) = d (||d||^2 + eps^2)^((p - 2)/4)``: its
    constant views (``r.const()``) make the example's cost depend on the last linearisation,
    which an outside solver never performs, so the two sides would minimise different things."""
    W, H = Dim("W"), Dim("H")
    r, s, i = Unknown("r", (W, H), 3), Unknown("s", (W, H)), Array("i", (W, H), 3)
    w_fit, w_alb, w_shd = Param("w_fitSqrt"), Param("w_regSqrtAlbedo"), Param("w_regSqrtShading")
    terms = [w_fit * (r(0, 0) + s(0, 0) - i(0, 0))]
    for off in intrinsic.NBRS:
        d = r(0, 0) - r(*off)
        weight = (Dot(d, d) + eps * eps) ** ((p_norm - 2.0) / 4.0)
        terms.append(Select(InBounds(*off), w_alb * d * weight, 0))
        terms.append(Select(InBounds(*off), w_shd * (s(0, 0) - s(*off)), 0))
    W_, H_ = img.shape[:2]
    return compile_problem(Energy(*terms), arrays={"i": img, "r": img.copy(), "s": np.zeros((W_, H_))},
                           params=intrinsic.PARAMS)


# ============================================================================ example plans
#: ``--scale paper``: each problem at the size the Opt paper reports for it (its Fig. 21 /
#: appendix numbers, as in the lsq_opt design doc); for this benchmark's own energies, the size
#: of the nearest paper problem. (dims, why)
PAPER_SIZES = {
    "poisson": ((1693,), "1.3M unknowns (Fig. 21): the free disc of a 1693^2 image, one channel "
                         "(the paper's 4 RGBA channels are 4 independent systems of 325k)"),
    "arap image": ((787,), "539k unknowns (Fig. 21, 3 per pixel): the shape covers 29 % of 787^2"),
    "arap mesh": ((346, 173), "360k unknowns (Fig. 21): 60k vertices x 6, AE-5's largest mesh"),
    "shading": ((514, 385), "192k unknowns (Fig. 21, 1 per pixel; the paper's 640 x 480 frame "
                            "less its invalid depth)"),
    "flow": ((640, 480), "614k unknowns = 640 x 480 x 2 (Fig. 21)"),
    "intrinsic": ((640, 360), "the paper's 640 x 360 frame (A.2 prints 461k unknowns; 4 per "
                              "pixel here: 922k)"),
    "tv charbonnier": ((554,), "own energy; 1 unknown per pixel and a 5-point stencil like "
                               "optical flow's: its 640 x 480 frame's 307k pixels (554^2)"),
    "spring network": ((300, 200), "own graph energy; the ARAP mesh's 60k vertices (2 unknowns "
                                   "each: 120k)"),
}


def example_problems(scale=1.0):
    """name -> (plan builder, grid energy?); ``scale``: a factor on every side of the default
    ("ci") sizes, or "paper" (:data:`PAPER_SIZES`). A builder returns (plan, pyceres builder or
    None)."""
    def dims(name, *ci):
        if scale == "paper":
            return PAPER_SIZES[name][0]
        return tuple(max(8, int(round(n * scale))) for n in ci)

    def poisson():
        energy, data = bs.poisson_problem(*dims("poisson", 256))
        plan = compile_problem(energy, arrays=data)
        return plan, (lambda: bs.build_ceres_poisson(plan, data))

    def arap():
        energy, data, params = bs.arap_problem(*dims("arap image", 64))
        plan = compile_problem(energy, arrays=data, params=params)
        return plan, (lambda: bs.build_ceres_arap(plan, data, params))

    def arap_mesh():
        plan, data, params = mesh_example.arap_plan(*dims("arap mesh", 32, 16))
        return plan, (lambda: bs.build_ceres_arap_mesh(plan, data, params))

    def shading_():
        data, params, _ = shading.make_data(dims("shading", 96, 72))
        return compile_problem(shading.energy(), arrays=data, params=params), None

    def flow_():
        I, I_hat, dx, dy = flow.make_pair(dims("flow", 96, 72))
        plan = compile_problem(flow.energy(), arrays={"I": I, "I_hat": I_hat, "I_hat_dx": dx,
                                                      "I_hat_dy": dy, "X": np.zeros(I.shape + (2,))},
                               params={"w_fit": np.sqrt(50.0), "w_reg": np.sqrt(0.1)})
        return plan, None

    def intrinsic_():
        img, _, _ = intrinsic.make_data(dims("intrinsic", 48, 32))
        return intrinsic_smooth_plan(img), None

    return {
        "poisson": (poisson, True), "arap image": (arap, True), "arap mesh": (arap_mesh, False),
        "shading": (shading_, True), "flow": (flow_, True), "intrinsic": (intrinsic_, True),
        "tv charbonnier": (lambda: (tv_problem(*dims("tv charbonnier", 128)), None), True),
        "spring network": (lambda: (spring_network(*dims("spring network", 40, 25)), None), False),
    }


# ============================================================================ runners
def scipy_run(plan, x0, x_scale, target=None, max_nfev=1000, tol=1e-12):
    """(time to target or None, final cost, evaluations, wall time)."""
    res, rec, wall = bs.scipy_trf(plan.residuals, plan.jacobian, x0, target=target, x_scale=x_scale,
                                  ftol=tol, xtol=tol, gtol=tol, max_nfev=max_nfev)
    reached = next((t for t, c in rec if target is not None and c <= target), None)
    final = min(c for _, c in rec)
    return reached, final, len(rec), wall


def defaults_run(plan, target=None):
    """solve(plan, plan.x0) with every default; a non-stopping callback records when it first
    reaches the target."""
    hit = {}
    t0 = clock()

    def cb(entry, x):
        if target is not None and "t" not in hit and entry.cost <= target:
            hit["t"] = clock() - t0

    res = solve(plan, plan.x0, callback=cb)
    return clock() - t0, res, hit.get("t")


def hand_configs(grid):
    """bench_solvers.py's float64 configurations (fixed PCG caps, no function tolerance)."""
    def cfg(label, method, pcg, **kw):
        return label, method, dict(max_iterations=100000, pcg_max_iterations=pcg, function_tolerance=0.0,
                                   preconditioner=kw.pop("preconditioner", "jacobi"), **kw)
    out = [cfg("LM PCG 10", "lm", 10), cfg("LM PCG 50", "lm", 50), cfg("GN PCG 100", "gn", 100),
           cfg("GN PCG 1000", "gn", 1000)]
    if grid:
        out += [cfg("LM multigrid PCG 3", "lm", 3, preconditioner="multigrid"),
                cfg("GN multigrid PCG 8", "gn", 8, preconditioner="multigrid")]
    else:  # graphs: the sparse factorisation, reused across systems (not a default)
        out += [cfg("LM factorization", "lm", 10, preconditioner="factorization")]
    return out


def run_problem(name, builder, grid, args, have_ceres, why_ceres):
    t0 = time.perf_counter()
    plan, ceres_builder = builder()
    x0 = plan.x0.copy()
    plan.cost(x0)
    plan.jtf(x0)
    plan.jtjp(x0, x0)
    t_compile = time.perf_counter() - t0
    print(f"\n=== {name}: n = {plan.n} unknowns, m = {plan.m} residuals (compile {t_compile:.2f} s)"
          + (f"; paper size: {PAPER_SIZES[name][1]}" if args.scale == "paper" else ""))
    # --- reference runs: scipy to convergence (both x_scale), lsq defaults (also the warm-up)
    scales = {"scipy trf x_scale=1": 1.0, "scipy trf x_scale=jac": "jac"}
    c_s, ref = np.inf, {}
    for label, xs in scales.items():
        _, final, nfev, wall = scipy_run(plan, x0, xs, max_nfev=args.max_nfev, tol=1e-10)
        ref[label] = final
        c_s = min(c_s, final)
        print(f"  {label:24s} to convergence: cost {final:.10e}, {nfev} evaluations, {wall:.2f} s")
    t_def, res, _ = defaults_run(plan)
    c_l = res.cost
    target = max((1 + REL) * c_s, c_l)
    flagged = c_l > (1 + REL) * c_s
    print(f"  lsq defaults: cost {c_l:.10e} ({(c_l - c_s) / c_s:+.2e} vs scipy), {res.iterations} its, "
          f"{res.pcg_iterations} PCG, preconditioner {res.preconditioner}, linear system {res.linear_system}, "
          f"stop: {res.termination_reason} ({res.termination_detail}), {t_def:.3f} s")
    print(f"  target T = {target:.10e}" + ("  [lsq defaults stop ABOVE (1+1e-6) x scipy: timed to lsq's cost]"
                                           if flagged else ""))

    cases = {"lsq defaults": lambda: defaults_run(plan, target)}
    for label, xs in scales.items():
        cases[label] = (lambda xs=xs: scipy_run(plan, x0, xs, target=target, max_nfev=args.max_nfev)[0])
    budget = max(HAND_BUDGET_MIN, 3.0 * t_def)
    for label, method, kw in hand_configs(grid):
        t, c, it, r = bs.lsq_time_to(plan, x0, method, target, budget=budget, **kw)
        print(f"  hand-tuned warm-up {label:20s}: {'reached' if t is not None else 'NOT reached'} "
              f"(cost {c:.8e}, {it} its, {r.pcg_iterations} PCG) t={bench.fmt_time(t)}")
        if t is not None:
            cases["lsq " + label] = (lambda method=method, kw=kw:
                                     bs.lsq_time_to(plan, x0, method, target, budget=budget, **kw)[0])
    times = {k: [] for k in cases}
    reach = []
    names = list(cases)
    for r in range(args.repeats):
        k = r % len(names)
        for nm in names[k:] + names[:k]:
            out = cases[nm]()
            if nm == "lsq defaults":
                times[nm].append(out[0])
                reach.append(out[2])
            else:
                times[nm].append(out)
    ceres = {}
    if ceres_builder is None:
        print("  pyceres: skipped (no pyceres cost functions for this energy in bench_solvers.py)")
    elif not have_ceres:
        print(f"  pyceres: skipped ({why_ceres})")
    elif not args.no_ceres:
        prob, _, const, _keep = ceres_builder()
        summary, wall, t_tg = bs.ceres_solve(prob, target, const, max_iter=200)
        ceres["pyceres SNC"] = t_tg
        print(f"  pyceres SNC: final cost {summary.final_cost + const:.10e}, time to T "
              f"{bench.fmt_time(t_tg)} (1 run; solve {wall:.2f} s)")
    return dict(name=name, n=plan.n, times=times, reach=reach, ceres=ceres, flagged=flagged,
                c_s=c_s, c_l=c_l, res=res)


def summarize_row(r):
    """Medians and (min, max) per case; the best baseline and the best hand-tuned config."""
    def stats(ts):
        ts = [t for t in ts if t is not None]
        return (float(np.median(ts)), min(ts), max(ts)) if ts else None
    t = {k: stats(v) for k, v in r["times"].items()}
    t.update({k: (v, v, v) for k, v in r["ceres"].items() if v is not None})
    t["lsq defaults to T"] = stats(r["reach"])
    base = {k: v for k, v in t.items() if not k.startswith("lsq") and v is not None}
    hand = {k: v for k, v in t.items() if k.startswith("lsq ") and not k.startswith("lsq defaults")
            and v is not None}
    bk = min(base, key=lambda k: base[k][0]) if base else None
    hk = min(hand, key=lambda k: hand[k][0]) if hand else None
    return t, bk, hk


def table_row(r):
    """One problem's row of the final table."""
    t, bk, hk = summarize_row(r)
    full, to_t = t["lsq defaults"], t["lsq defaults to T"]
    base, hand = (t[bk] if bk else None), (t[hk] if hk else None)
    return [r["name"], r["n"], fmt_range(full) + (" (*)" if r["flagged"] else ""), fmt_range(to_t),
            f"{bk}: {fmt_range(base)}" if bk else "-",
            f"{base[0] / full[0]:.1f}x" if base else "-",
            f"{hk[4:]}: {fmt_range(hand)}" if hk else f"none within {HAND_BUDGET}",
            f"{hand[0] / full[0]:.2f} / {hand[0] / to_t[0]:.2f}" if hand and to_t else "-"]


def fmt_range(st):
    return "-" if st is None else f"{bench.fmt_time(st[0])} [{bench.fmt_time(st[1])}-{bench.fmt_time(st[2])}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", default="ci", help="problem sizes: 'ci' (the defaults), 'paper' (the "
                    "sizes the Opt paper reports, see PAPER_SIZES), or a factor on every side of "
                    "the ci sizes")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="time with perf_counter (wall) or thread_time (CPU time of the one "
                    "thread; needs CORE_AD_NUM_THREADS=1)")
    ap.add_argument("--max-nfev", type=int, default=1000)
    ap.add_argument("--no-ceres", action="store_true")
    ap.add_argument("--only", nargs="*", help="problem names (substrings)")
    args = ap.parse_args()
    if args.clock == "thread":
        if os.environ.get("CORE_AD_NUM_THREADS") != "1":
            ap.error("--clock thread counts one thread's CPU time: set CORE_AD_NUM_THREADS=1")
        global clock
        clock = time.thread_time
        bs.time = types.SimpleNamespace(perf_counter=time.thread_time)  # scipy and hand-tuned runs
        print("clock: thread CPU time (time.thread_time), one thread")
    have_ceres, why = bs.pyceres_available()
    print(bench.machine_info(extra=f"scipy {scipy.__version__}; lsq_opt llvm, float64; pyceres "
                             f"{'yes' if have_ceres else 'no (' + why + ')'}",
                             modules=("numpy", "scipy", "core_ad", "lsq_opt", "pyceres")))
    scale = {"ci": 1.0, "paper": "paper"}.get(args.scale) or float(args.scale)
    print(f"scale: {args.scale}")
    rows = []
    for name, (builder, grid) in example_problems(scale).items():
        if args.only and not any(o in name for o in args.only):
            continue
        rows.append(table_row(run_problem(name, builder, grid, args, have_ceres, why)))
        print("  row: " + " | ".join(str(c) for c in rows[-1]), flush=True)  # kept if a later problem fails
    print(f"\nMedians [min-max] of {args.repeats} runs. 'lsq defaults' = the whole solve(plan, plan.x0) "
          "(its own stopping rule); 'to T' = when that run first reached T; baselines and hand-tuned = time "
          f"to T = max((1 + {REL:g}) x scipy's converged cost, lsq defaults' final cost).\n"
          "(*) lsq defaults stopped above (1 + 1e-6) x scipy's cost: everything is timed to lsq's cost.\n"
          "speed-up = best baseline / lsq defaults (whole solve); hand-tuned ratio = best hand-tuned "
          "time to T / lsq defaults (whole solve / to T); >= 0.67 means defaults within 1.5x.\n")
    bench.print_table(["problem", "unknowns", "lsq defaults", "defaults to T", "best baseline",
                       "speed-up", "best hand-tuned lsq (to T)", "hand-tuned / defaults"], rows)


if __name__ == "__main__":
    main()
