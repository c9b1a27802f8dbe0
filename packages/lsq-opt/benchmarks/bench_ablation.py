"""AE-11 (Opt Fig. 19) on the CPU: the ablation ladder of the fused kernels' code optimisations.

Per problem (shape from shading, ARAP image warping, ARAP mesh) and per configuration of the
ladder none -> +polynomial -> +horner -> +bounds -> +conditional (= the default), the
generated-code statistics of applyJTJ (``jtjp``) from ``lsq_opt.code_statistics`` (static
counts in the LLVM IR as generated: float arithmetic, math calls, loads, selects, guard
branches and the loads under them; and after LLVM's O3 IR pipeline), and the CPU
time of one applyJTJ product and one evalJTF: medians over ``--repeats`` rounds, the
configurations alternated within each round so that load changes hit them alike, [min-max].
Opt's texture loads and register-minimising scheduler are GPU-side and not part of the CPU
ladder (see lsq_opt._compiler.optimize). Run from the repository root:

    PYTHONPATH=packages/lsq-opt/src:packages/core-ad/src python packages/lsq-opt/benchmarks/bench_ablation.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

from lsq_opt import Optimizations, code_statistics, compile_problem  # noqa: E402
from lsq_opt.examples import mesh as mesh_example  # noqa: E402
from lsq_opt.examples import shading  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_solvers as bs  # noqa: E402


def problems(scale):
    def sz(n):
        return max(8, int(round(n * scale)))

    def shading_(opt):
        data, params, _ = shading.make_data((sz(96), sz(72)))
        return compile_problem(shading.energy(), arrays=data, params=params, optimizations=opt)

    def arap_image(opt):
        energy, data, params = bs.arap_problem(sz(64))
        return compile_problem(energy, arrays=data, params=params, optimizations=opt)

    def arap_mesh(opt):
        plan, _, _ = mesh_example.arap_plan(sz(32), sz(16))
        plan.optimizations = opt  # read when the fused kernels are built, on first use
        return plan

    return {"shading": shading_, "arap image": arap_image, "arap mesh": arap_mesh}


def _time(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def run(name, build, repeats, inner):
    ladder = Optimizations.ladder()
    plans = [build(opt) for _, opt in ladder]
    rng = np.random.default_rng(0)
    x = np.asarray(plans[0].x0, float) + 0.01 * rng.standard_normal(plans[0].n)
    p = rng.standard_normal(plans[0].n)
    ref = plans[-1].fused.jtjp(x, p)
    tj = [[] for _ in plans]
    tg = [[] for _ in plans]
    for plan in plans:
        err = np.abs(plan.fused.jtjp(x, p) - ref).max() / np.abs(ref).max()
        assert err < 1e-12, (name, err)
    for _ in range(repeats):
        for k, plan in enumerate(plans):
            f = plan.fused
            tj[k].append(_time(lambda f=f: f.jtjp(x, p), inner))
            # grad caches its result per x: drop the cache so that every call runs the kernel
            tg[k].append(_time(lambda f=f: (setattr(f, "_grad", None), f.grad(x)), inner))
    print(f"\n## {name} ({plans[0].n} unknowns)\n")
    print("| configuration | kernel | arith | calls | loads | selects | after LLVM O3: arith / loads /"
          " selects | guards | guarded loads | applyJTJ [ms] | evalJTF [ms] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for k, ((label, _), plan) in enumerate(zip(ladder, plans)):
        st = code_statistics(plan)
        so = code_statistics(plan, optimized=True)
        kern = sorted(n for n in st if n.endswith("_jtjp"))
        mj, mg = np.median(tj[k]) * 1e3, np.median(tg[k]) * 1e3
        base = base or mj
        for n in kern:
            s = st[n]
            o = so[n]
            print(f"| {label} | {n} | {s['arith']} | {s['calls']} | {s['loads']} | {s['selects']} |"
                  f" {o['arith']} / {o['loads']} / {o['selects']} | {s['guards']} | {s['guarded_loads']} | {mj:.3f} [{min(tj[k]) * 1e3:.3f}-"
                  f"{max(tj[k]) * 1e3:.3f}] ({base / mj:.2f}x) | {mg:.3f} [{min(tg[k]) * 1e3:.3f}-"
                  f"{max(tg[k]) * 1e3:.3f}] |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=20, help="products per timed sample")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (start)")
    for name, build in problems(a.scale).items():
        if a.only and not any(s in name for s in a.only):
            continue
        run(name, build, a.repeats, a.inner)
    print(f"\nload average {os.getloadavg()[0]:.2f} (end)")


if __name__ == "__main__":
    main()
