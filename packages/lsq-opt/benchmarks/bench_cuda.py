"""lsq_opt's cuda backend next to the CPU paths, on the three problems of ``bench_solvers.py``
(Poisson 512^2, ARAP image 128^2, ARAP mesh 64 x 32 tube; same builders and data).

Per problem and dtype (float64, float32), alternated and median of ``--repeats``:

* products at one linearisation point: ``linearize`` (the lane kernels ``fj`` and the cache),
  ``jtf`` + ``jtj_diag``, ``jtjp_linearized`` (one PCG operator application), ``cost`` at a
  trial point -- for the fused LLVM kernels (the CPU default), the numpy lanes composition, and
  the cuda backend (the same lanes composition on CuPy arrays, core_ad's CUDA lane kernels);
* a fixed-length LM solve (``--lm-iterations``, PCG ``--pcg`` iterations, Jacobi; no early
  stop) with the fused CPU kernels and with the cuda backend: wall time and final cost.

Every product crosses the host-side ``LeastSquaresProblem`` protocol (numpy in / out), so each
cuda call includes one upload and one download of a vector and a synchronisation: the numbers
are those of the cuda backend as the solvers use it, not of the kernels alone. The ratio
column is CPU fused time / cuda time (> 1: the GPU is faster).

Without CuPy or a CUDA device the script prints why and exits 0. Run from the repository root:

    PYTHONPATH=packages/lsq-opt/src:packages/core-ad/src python packages/lsq-opt/benchmarks/bench_cuda.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np
from core_ad import benchmark as bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_solvers import arap_problem, mesh_example, poisson_problem  # noqa: E402

from lsq_opt import LsqCompileError, compile_problem, solve  # noqa: E402
from lsq_opt._compiler.cuda import require_device  # noqa: E402

BACKENDS = {"cpu fused": dict(backend="llvm", kernels="fused"),
            "cpu lanes (numpy)": dict(backend="numpy", kernels="lanes"),
            "cuda": dict(backend="cuda")}


def problems(args):
    """name -> (energy, compile_problem keyword arguments)."""
    out = {}
    if args.only in (None, "poisson"):
        energy, data = poisson_problem(args.poisson_size)
        out[f"Poisson {args.poisson_size}^2"] = (energy, dict(arrays=data))
    if args.only in (None, "arap"):
        energy, data, params = arap_problem(args.arap_size)
        out[f"ARAP image {args.arap_size}^2"] = (energy, dict(arrays=data, params=params))
    if args.only in (None, "arap_mesh"):
        _, data, params = mesh_example.arap_plan(*args.mesh_size)
        arrays = {k: data[k] for k in ("UrShape", "Constraints", "Offset", "Angle")}
        out[f"ARAP mesh {args.mesh_size[0] * args.mesh_size[1]} v"] = (
            mesh_example.arap_energy(),
            dict(arrays=arrays, params=params, graphs={"G": {"v0": data["v0"], "v1": data["v1"]}}))
    return out


def product_cases(plan, x, p):
    x_trial = x + 1e-3 * p

    def fresh_linearize():
        plan._lin_x = None  # force a new evaluation of the lane kernels (lanes / cuda)
        if plan._fused is not None:
            plan._fused._x_key = None
        plan.linearize(x)

    return {"linearize": fresh_linearize,
            "jtf + diag": lambda: (plan.jtf(x), plan.jtj_diag(x)),
            "jtjp": lambda: plan.jtjp_linearized(p),
            "cost(trial)": lambda: plan.cost(x_trial)}


def lm_solve(plan, x0, args):
    t0 = time.perf_counter()
    r = solve(plan, x0, method="lm", max_iterations=args.lm_iterations, pcg_max_iterations=args.pcg,
              function_tolerance=0.0, gradient_tolerance=0.0, parameter_tolerance=0.0)
    return time.perf_counter() - t0, r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--poisson-size", type=int, default=512)
    ap.add_argument("--arap-size", type=int, default=128)
    ap.add_argument("--mesh-size", type=int, nargs=2, default=(64, 32), metavar=("RINGS", "SEGS"))
    ap.add_argument("--only", choices=["poisson", "arap", "arap_mesh"], default=None)
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lm-iterations", type=int, default=10)
    ap.add_argument("--pcg", type=int, default=50)
    args = ap.parse_args(argv)
    try:
        cupy, _ = require_device()
    except LsqCompileError as e:
        print(f"bench_cuda: skipped: {e}")
        return 0
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]
    print(bench.machine_info(extra=f"GPU {name}; cupy {cupy.__version__}",
                             modules=("numpy", "cupy", "core_ad", "lsq_opt")))
    rows = []
    for pname, (energy, kw) in problems(args).items():
        for dt in args.dtypes:
            plans, t_compile = {}, {}
            for label, bk in BACKENDS.items():
                t0 = time.perf_counter()
                plan = compile_problem(energy, dtype=dt, **bk, **kw)
                plan.linearize(plan.x0)  # first evaluation: LLVM JIT / NVRTC compiles
                plan.jtjp_linearized(np.zeros(plan.n, plan.dtype))
                t_compile[label] = time.perf_counter() - t0
                plans[label] = plan
            ref = plans["cpu fused"]
            rng = np.random.default_rng(0)
            x = (ref.x0 + 0.01 * rng.standard_normal(ref.n)).astype(dt)
            p = rng.standard_normal(ref.n).astype(dt)
            print(f"\n{pname}, {dt}: n = {ref.n}, m = {ref.m}; compile + first evaluation: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in t_compile.items()))
            for plan in plans.values():
                plan.linearize(x)
            g = {k: pl.jtf(x) for k, pl in plans.items()}
            scale = float(np.abs(g["cpu fused"]).max())
            print("  max |jtf - cpu fused| / max|jtf|: " + ", ".join(
                f"{k} {float(np.abs(v - g['cpu fused']).max()) / scale:.1e}" for k, v in g.items()
                if k != "cpu fused"))
            med = {}
            for label, plan in plans.items():
                plan.linearize(x)
                res = bench.compare(product_cases(plan, x, p), repeats=args.repeats)
                med[label] = {k: v["median"] for k, v in res.items()}
            for op in med["cpu fused"]:
                rows.append([pname, dt, op] + [bench.fmt_time(med[b][op]) for b in BACKENDS]
                            + [f"{med['cpu fused'][op] / med['cuda'][op]:.2f}x"])
            solves = {}
            for label in ("cpu fused", "cuda"):
                lm_solve(plans[label], plans[label].x0, args)  # warm-up
                runs = [lm_solve(plans[label], plans[label].x0, args) for _ in range(3)]
                solves[label] = (sorted(t for t, _ in runs)[1], runs[0][1])
            (tc, rc), (tg, rg) = solves["cpu fused"], solves["cuda"]
            print(f"  LM {args.lm_iterations} iterations (PCG {args.pcg}): cpu fused"
                  f" {bench.fmt_time(tc)} "
                  f"(cost {rc.cost:.6e}, {rc.pcg_iterations} PCG), cuda {bench.fmt_time(tg)} "
                  f"(cost {rg.cost:.6e}, {rg.pcg_iterations} PCG)")
            rows.append([pname, dt, f"LM solve ({args.lm_iterations} it)", bench.fmt_time(tc),
                         "-", bench.fmt_time(tg), f"{tc / tg:.2f}x"])
    print()
    bench.print_table(["problem", "dtype", "operation", *BACKENDS, "cpu fused / cuda"], rows,
                      title=f"median of {args.repeats} (LM solve: median of 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
