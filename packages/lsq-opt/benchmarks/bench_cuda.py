"""lsq_opt's cuda backend next to the CPU default, on the three problems of ``bench_solvers.py``
(Poisson 512^2, ARAP image 128^2, ARAP mesh 64 x 32 tube; same builders and data).

Per problem and dtype (float64, float32), alternated, median of ``--repeats``:

* products at one linearisation point -- ``linearize`` (F and the J entries of every term,
  cached), ``jtf + diag``, ``jtjp`` (one PCG operator application), ``cost`` at a trial point:

  - ``cpu fused``: the fused LLVM kernels (the CPU default);
  - ``cuda host``: the cuda plan's numpy protocol (upload x / p, the lanes composition on
    CuPy arrays, download the result: what ``solve(..., device_loop=False)`` pays per call);
  - ``cuda device``: the all-device problem (``plan.device_problem()``: device vectors in and
    out, one fused kernel each for ``linearize``, ``jtjp`` and ``jtf + diag``, and for ``cost``
    one kernel plus a device sum), synchronised after each call so that the time is the
    device's;

* a fixed-length LM solve (``--lm-iterations``, PCG ``--pcg`` iterations at most, Jacobi; no
  early stop of LM): CPU fused and the cuda all-device loop (the default for a cuda plan), once
  per PCG check period of ``--check-every`` (``pcg_check_every``: the host fetches PCG's
  device-side stopping state every that many iterations; default: the solver's default, then
  1), warm-up then median of ``--solve-repeats``; the cuda host protocol (``device_loop=False``, 0.3-1.1 s per solve on an H100
  at the default sizes) once, to keep the run short -- its kernels are warm from the product
  timings. Wall time, final cost, and the relative difference of the final costs to the CPU's
  (the same iterates up to rounding: float64 about 1e-12).

Ratio columns: CPU fused time / cuda device time (> 1: the GPU is faster), and cuda host /
cuda device (what the all-device loop saves over the host protocol).

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
from lsq_opt._solver.options import PCG_CHECK_EVERY  # noqa: E402

COLUMNS = ("cpu fused", "cuda host", "cuda device")


def solve_variants(check_every):
    """label -> (plan, solve options, warm-up and --solve-repeats runs; False: one cold run);
    one all-device solve per PCG check period."""
    out = {"cpu fused": ("cpu fused", {}, True)}
    for k in check_every:
        out[f"cuda device, check every {k}"] = ("cuda", {"pcg_check_every": k}, True)
    out["cuda host"] = ("cuda", {"device_loop": False}, False)
    return out


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


def host_cases(plan, x, p):
    """The products through the plan's numpy protocol (cpu fused, or cuda host)."""
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


def device_cases(cupy, plan, x, p):
    """The products of the all-device problem, each followed by a device synchronisation."""
    prob = plan.device_problem()
    xd, pd = cupy.asarray(x), cupy.asarray(p)
    xd_trial = xd + 1e-3 * pd
    prob.linearize(xd)
    sync = cupy.cuda.Device().synchronize

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    return {"linearize": timed(lambda: prob.linearize(xd)),
            "jtf + diag": timed(lambda: prob.kernels.grad(prob.linearization)),
            "jtjp": timed(lambda: prob.jtjp_linearized(pd)),
            "cost(trial)": timed(lambda: prob.cost(xd_trial))}, prob


def lm_solve(plan, x0, args, **kw):
    t0 = time.perf_counter()
    r = solve(plan, x0, method="lm", max_iterations=args.lm_iterations, pcg_max_iterations=args.pcg,
              function_tolerance=0.0, gradient_tolerance=0.0, parameter_tolerance=0.0,
              preconditioner="jacobi", **kw)
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
    ap.add_argument("--solve-repeats", type=int, default=5)
    ap.add_argument("--check-every", type=int, nargs="+", default=[PCG_CHECK_EVERY, 1],
                    help="PCG check periods of the all-device LM solves (pcg_check_every)")
    args = ap.parse_args(argv)
    try:
        cupy = require_device()
    except LsqCompileError as e:
        print(f"bench_cuda: skipped: {e}")
        return 0
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]
    print(bench.machine_info(extra=f"GPU {name}; cupy {cupy.__version__}",
                             modules=("numpy", "cupy", "core_ad", "lsq_opt")))
    t_run = time.perf_counter()
    rows = []
    for pname, (energy, kw) in problems(args).items():
        for dt in args.dtypes:
            plans, t_compile = {}, {}
            for label, bk in (("cpu fused", dict(backend="llvm", kernels="fused")),
                              ("cuda", dict(backend="cuda"))):
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
            t0 = time.perf_counter()
            cases = {"cpu fused": host_cases(ref, x, p), "cuda host": host_cases(plans["cuda"], x, p)}
            cases["cuda device"], prob = device_cases(cupy, plans["cuda"], x, p)
            cases["cuda device"]["jtjp"]()  # NVRTC compiles the fused kernels
            cases["cuda device"]["jtf + diag"]()
            cases["cuda device"]["cost(trial)"]()
            t_compile["cuda fused products"] = time.perf_counter() - t0
            print(f"\n{pname}, {dt}: n = {ref.n}, m = {ref.m}; compile + first evaluation: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in t_compile.items()))
            for plan in plans.values():
                plan.linearize(x)
            for what, want, host, device in (
                    ("jtf", ref.jtf(x), plans["cuda"].jtf(x), prob.kernels.grad(prob.linearization)[0]),
                    ("jtjp", ref.jtjp_linearized(p), plans["cuda"].jtjp_linearized(p),
                     prob.jtjp_linearized(cupy.asarray(p)))):
                scale = float(np.abs(want).max())
                print(f"  max |{what} - cpu fused| / max|{what}|: cuda host "
                      f"{float(np.abs(host - want).max()) / scale:.1e}, cuda device "
                      f"{float(np.abs(device.get() - want).max()) / scale:.1e}")
            med = {}
            for label in COLUMNS:
                if label != "cuda device":
                    (ref if label == "cpu fused" else plans["cuda"]).linearize(x)
                res = bench.compare(cases[label], repeats=args.repeats)
                med[label] = {k: v["median"] for k, v in res.items()}
            for op in med["cpu fused"]:
                m = {c: med[c][op] for c in COLUMNS}
                rows.append([pname, dt, op] + [bench.fmt_time(m[c]) for c in COLUMNS]
                            + [f"{m['cpu fused'] / m['cuda device']:.2f}x",
                               f"{m['cuda host'] / m['cuda device']:.2f}x"])
            solves = {}
            for label, (plan_key, kw_solve, repeated) in solve_variants(args.check_every).items():
                plan = plans[plan_key]
                n_runs = args.solve_repeats if repeated else 1
                if repeated:
                    lm_solve(plan, plan.x0, args, **kw_solve)  # warm-up
                runs = [lm_solve(plan, plan.x0, args, **kw_solve) for _ in range(n_runs)]
                solves[label] = (sorted(t for t, _ in runs)[n_runs // 2], runs[0][1])
            cost_scale = max(abs(solves["cpu fused"][1].cost), 1e-300)
            print(f"  LM {args.lm_iterations} iterations (PCG {args.pcg}): " + ", ".join(
                f"{label} {bench.fmt_time(t)} (cost {r.cost:.6e}, rel. diff "
                f"{abs(r.cost - solves['cpu fused'][1].cost) / cost_scale:.1e}, {r.pcg_iterations} PCG)"
                for label, (t, r) in solves.items()))
            t = {label: v[0] for label, v in solves.items()}
            for k in args.check_every:
                t["cuda device"] = t[f"cuda device, check every {k}"]
                rows.append([pname, dt, f"LM solve ({args.lm_iterations} it), check every {k}"]
                            + [bench.fmt_time(t[c]) for c in COLUMNS]
                            + [f"{t['cpu fused'] / t['cuda device']:.2f}x",
                               f"{t['cuda host'] / t['cuda device']:.2f}x"])
    print()
    bench.print_table(["problem", "dtype", "operation", *COLUMNS, "cpu fused / device",
                       "host / device"], rows,
                      title=f"median of {args.repeats} (LM solve: median of {args.solve_repeats}; "
                            "cuda host: one run)")
    print(f"\ntotal {time.perf_counter() - t_run:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
