"""Cost of log f* derivatives of light paths, and MLT mutations per second (h2mc alone).

No peer here: the quantity of interest is the ratio the spec asks for (AE-7: wall time of
value + gradient + Hessian <= c * n * (time of value), c recorded), measured on edge_rt's
Cornell box with h2mc's PathSpace (core_ad LLVM kernels), and the mutation rates of
``render_mlt``'s PSSMLT, MMLT and H2MC side by side (with the ratio to PSSMLT). Per technique
(k, s) (path length k closed by a light sample NEE or an emitter hit HIT; n = its
coordinates):

* ``value kernel``: the compiled RGB contribution of ``B`` paths with known structure;
* ``v+g+H kernel``: the compiled log f*, gradient and Hessian of the same paths;
* ``trace``: a full evaluation of ``B`` states (Embree casts, BSDF and light sampling through
  edge_rt, then the value kernels of every technique), the cost of one MLT proposal;
* ``trace + v+g+H``: what an H2MC proposal costs.

Kernel compile times are printed separately (first call). Median of ``--repeats`` runs. Run
from the repository root::

    .venv/bin/python packages/h2mc/benchmarks/bench_pathspace.py
    .venv/bin/python packages/h2mc/benchmarks/bench_pathspace.py --B 4096 --max-length 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from core_ad import benchmark as bench

import h2mc
from edge_rt import scenes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=4096, help="paths per call")
    ap.add_argument("--max-length", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mpp", type=float, default=16, help="mutations per pixel for MLT rates")
    args = ap.parse_args()

    scene = scenes.cornell_box((32, 32))
    ps = h2mc.PathSpace(scene, max_length=args.max_length)
    u = np.random.default_rng(0).random((args.B, ps.dim))
    t0 = time.perf_counter()
    paths = ps.trace(u)
    print(f"value kernels, lengths 3..{args.max_length}, both techniques: compiled in "
          f"{time.perf_counter() - t0:.1f} s")
    t_trace = bench.time_median(lambda: ps.trace(u), args.repeats, warmup=0)
    rows = []
    for k, s in ps.techniques:
        if (k, s) not in paths.structure:  # no state of this batch closes a path this way
            print(f"  {k},{'NEE' if s else 'HIT'}: no path among the {args.B} states; skipped")
            continue
        lanes, params = paths.structure[k, s]
        block = ps._kernel_inputs(u, (k, s), lanes, params)  # as PathSpace calls them
        value = ps._value_kernel(k, s)
        t0 = time.perf_counter()
        hess = ps._kernel("hessian", k, s)
        compile_s = time.perf_counter() - t0
        # the two kernels agree on the value
        lf = hess.call_stacked(block)[0]
        rgb = value.call_stacked(block).T
        with np.errstate(divide="ignore"):  # paths gated to f* = 0 by the BSDF: -inf in both
            assert np.allclose(lf, np.log(h2mc.luminance(rgb)), rtol=1e-12, equal_nan=True)
        t_v = bench.time_median(lambda: value.call_stacked(block), args.repeats, warmup=0)
        t_h = bench.time_median(lambda: hess.call_stacked(block), args.repeats, warmup=0)
        t_full = bench.time_median(lambda: ps.log_f_derivatives(u, k, s, paths=paths),
                                   args.repeats, warmup=0)
        n = len(ps.dims(k, s))
        rows.append((f"{k},{'NEE' if s else 'HIT'}", n, len(lanes), compile_s, t_v, t_h, t_h / t_v, t_h / (n * t_v),
                     (t_trace + t_full) / t_trace))
    print(f"\ntrace of {args.B} states (all lengths): {t_trace * 1e3:.1f} ms "
          f"({args.B / t_trace:.0f} states/s)")
    print(f"{'k,s':>6} {'n':>3} {'paths':>6} {'compile s':>10} {'value ms':>9} {'v+g+H ms':>9}"
          f" {'ratio':>7} {'c=ratio/n':>10} {'(trace+vgH)/trace':>18}")
    for k, n, m, cs, tv, th, r, c, full in rows:
        print(f"{k:>6} {n:>3} {m:>6} {cs:>10.1f} {tv * 1e3:>9.2f} {th * 1e3:>9.2f} {r:>7.1f}"
              f" {c:>10.2f} {full:>18.2f}")

    print("\nMLT mutation rates (32x32, chains 1024, after compilation; ratio to PSSMLT):")
    base = None
    for method in ("pssmlt", "mmlt", "h2mc"):
        r = h2mc.render_mlt(scene, args.mpp, method=method, chains=1024,
                            bootstrap_samples=1 << 14, direct_spp=0, seed=1, path_space=ps,
                            sigma2=1e-3)
        rate = r.mutations_per_second
        base = base or rate
        acc = {k: round(v.acceptance, 3) for k, v in r.stats.items()}
        print(f"  {method:<7} {rate:8.0f} mutations/s  {rate / base:6.3f}x  acceptance {acc}")


if __name__ == "__main__":
    main()
