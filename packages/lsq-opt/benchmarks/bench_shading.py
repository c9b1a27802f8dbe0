"""Shape from shading (spec 3.5; AE-6 methodology): lsq_opt vs scipy trf, time to reach the
baseline's final cost.

Problem: the example's synthetic RGB-D frame (``lsq_opt.examples.shading``, default 160x120,
one depth unknown per valid pixel). lsq_opt runs its fused LLVM kernels with Jacobi-PCG, 10 PCG
iterations per non-linear iteration (the spec's [R] setting) and at most ``--iterations``
non-linear iterations, LM and GN, float64 and float32 (compared to the same float64 target).

Baseline: ``scipy.optimize.least_squares(method="trf", tr_solver="lsmr")`` on the independent
numpy transcription of the energy (``shading.residuals_numpy``) with the sparse Jacobian
materialised by ``plan.jacobian`` (its sparsity is the 9-point stencil). Target = (1 + 1e-3) x
scipy's final cost; each solver's time is the wall time at which its cost first drops to the
target (median of ``--repeats``). lsq_opt's compile time is reported separately.

    python packages/lsq-opt/benchmarks/bench_shading.py [--size 160 120] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_solvers import F32_PLANS, lsq_time_to, scipy_trf  # noqa: E402

import numpy as np  # noqa: E402
from core_ad import benchmark as bench  # noqa: E402

from lsq_opt import compile_problem  # noqa: E402
from lsq_opt.examples import shading  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, nargs=2, default=(160, 120))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60, help="lsq_opt non-linear iterations (max)")
    a = ap.parse_args()
    size = tuple(a.size)
    print(bench.machine_info(modules=("numpy", "scipy", "core_ad")))
    data, params, truth = shading.make_data(size)
    t0 = time.perf_counter()
    plan = compile_problem(shading.energy(), arrays=data, params=params)
    plan.cost(plan.x0), plan.jtjp(plan.x0, plan.x0)
    t_compile = time.perf_counter() - t0
    plan32 = compile_problem(shading.energy(), arrays=data, params=params, dtype=np.float32)
    x32 = plan.x0.astype(np.float32)
    plan32.cost(x32), plan32.jtjp(x32, x32)
    F32_PLANS[id(plan)] = plan32
    print(f"shape from shading {size[0]}x{size[1]}: {plan.n} unknowns, {plan.m} residuals, "
          f"compile {t_compile:.1f} s (float64, incl. kernel generation)")

    def fun(x):
        return np.concatenate([r.ravel() for r in shading.residuals_numpy(
            plan.vector_to_unknowns(x)["X"], data, params)])

    r0 = fun(plan.x0)
    assert abs(0.5 * r0 @ r0 - plan.cost(plan.x0)) <= 1e-10 * plan.cost(plan.x0), "numpy transcription differs"
    ref, rec, t_ref = scipy_trf(fun, plan.jacobian, plan.x0.copy())
    target = (1 + 1e-3) * ref.cost
    t_scipy = next(t for t, c in rec if c <= target)
    print(f"scipy trf: final cost {ref.cost:.6e} after {ref.nfev} evaluations, {t_ref:.2f} s; "
          f"target {target:.6e}")
    valid = data["D_i"] > 0
    depth_err = shading.rms_error(plan.vector_to_unknowns(ref.x)["X"], truth, valid)
    stats = {"scipy trf (lsmr)": bench.summarize([t_scipy])}
    cost_at_stop = {"scipy trf (lsmr)": f"{ref.cost:.6e}"}
    iterations = {"scipy trf (lsmr)": ref.nfev}
    rms = {"scipy trf (lsmr)": f"{depth_err:.2e}"}
    for method in ("lm", "gn"):
        for dt in ("float64", "float32"):
            name = f"lsq_opt {method.upper()} {dt}"
            ts, last = [], None
            for _ in range(a.repeats):
                t, cost, its, res = lsq_time_to(plan, plan.x0, method, target, dtype=dt,
                                                max_iterations=a.iterations, pcg_max_iterations=10)
                ts.append(t)
                last = (cost, its, res)
            X = (plan32 if dt == "float32" else plan).vector_to_unknowns(last[2].x)["X"]
            reached = [t for t in ts if t is not None]
            stats[name] = bench.summarize(reached) if reached else None
            cost_at_stop[name], iterations[name] = f"{last[0]:.6e}", last[1]
            rms[name] = f"{shading.rms_error(X, truth, valid):.2e}"
    ours = min((k for k, v in stats.items() if k.startswith("lsq_opt") and v is not None),
               key=lambda k: stats[k]["median"])
    bench.side_by_side(
        stats, ours,
        columns={"cost at stop": cost_at_stop, "its": iterations, "rms depth err": rms},
        title=f"\ntime to (1+1e-3) x scipy's final cost (input rms depth error "
              f"{shading.rms_error(data['D_i'], truth, valid):.2e}; median of {a.repeats})")

if __name__ == "__main__":
    main()
