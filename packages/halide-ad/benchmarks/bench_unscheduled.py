"""Unscheduled gradient pipelines stay linear: the adjoint of a 3x3 repeat_edge blur (image
and weights) with no schedule at all, next to every Func compute_root and the auto-scheduler,
at 256^2, 512^2 and 1024^2 float32.

Halide 21's default places a Func with update definitions at the innermost loop of its
consumer, so its unscheduled blur adjoint recomputes whole scatters per pixel and grows as N^4
(it does not finish at 1024^2). halide_ad computes such Funcs at the root and inlines only pure
Funcs, which do a bounded amount of work per point; the time per pixel should stay flat.
Halide 21 runs the same pipeline code when ``import halide`` works, with a per-run time limit.

    python packages/halide-ad/benchmarks/bench_unscheduled.py [--sizes 256 512 1024] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading

import numpy as np
from core_ad import benchmark as bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_blur_grad import halide_blur_grad  # noqa: E402 - the same pipeline code


def _case(hl, img, weights, g, how):
    blur, d_img, d_w, keep = halide_blur_grad(hl, img, weights, g)
    outs = [d_img, d_w]
    h, w = img.shape
    if how == "all compute_root":
        from halide_ad._graph import Graph

        for f in Graph(outs).funcs.values():
            if f not in outs:
                f.compute_root()
    elif how == "auto_schedule":
        hl.auto_schedule(outs, {d_img: [w, h], d_w: [3, 3]})
    p = hl.Pipeline(outs)
    arrays = [np.empty_like(img), np.empty_like(weights)]
    bufs = [hl.Buffer(a) for a in arrays]

    def run():
        p.realize(bufs)
        return arrays
    run.keep = (keep, bufs)
    return run


def _halide21_case(hl, img, weights, g):
    blur, d_img, d_w, keep = halide_blur_grad(hl, img, weights, g)
    p = hl.Pipeline([d_img, d_w])
    p.compile_jit()
    bufs = [hl.Buffer(np.empty_like(img)), hl.Buffer(np.empty_like(weights))]

    def run():
        p.realize(bufs)
    run.keep = (keep, bufs)
    return run


def _with_limit(fn, seconds):
    """fn's seconds, or None when it runs longer than ``seconds`` (left running in a daemon
    thread: Halide's JIT code cannot be interrupted)."""
    box = {}

    def target():
        box["t"] = bench.time_once(fn)
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return box.get("t")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--halide-limit", type=float, default=60.0,
                   help="seconds before a Halide 21 run counts as not finished (60)")
    args = p.parse_args(argv)
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))
    os.environ.setdefault("HL_NUM_THREADS", str(args.threads))
    import halide_ad as hl

    notes = []
    try:
        import halide
    except Exception as err:  # noqa: BLE001
        halide = None
        notes.append(f"Halide 21 not importable, its column is skipped ({bench.error_reason(err)})")
    print(f"bench_unscheduled: adjoint of a 3x3 repeat_edge blur (d img, d weights), float32,"
          f" median of {args.repeats}")
    print(bench.machine_info(f"threads : {args.threads}", modules=("numpy", "halide_ad")))
    hows = ("unscheduled", "all compute_root", "auto_schedule")
    rows, per_pixel = [], {h: [] for h in hows}
    rng = np.random.default_rng(0)
    for n in args.sizes:
        img = rng.random((n, n), dtype=np.float32)
        weights = rng.random((3, 3), dtype=np.float32)
        g = rng.standard_normal((n, n), dtype=np.float32)
        cases = {h: _case(hl, img, weights, g, h) for h in hows}
        first = bench.time_first_calls(cases)
        res = bench.compare(cases, repeats=args.repeats, warmup=0)
        row = [f"{n}^2"]
        for h in hows:
            r = res[h]
            per_pixel[h].append(r["median"] / (n * n))
            row.append(f"{bench.fmt_time(r['median'])} [{bench.fmt_time(r['min'])} .."
                       f" {bench.fmt_time(r['max'])}]")
        row.append(", ".join(f"{bench.fmt_time(first[h])}" for h in hows))
        if halide is not None:
            try:
                t = _with_limit(_halide21_case(halide, img, weights, g), args.halide_limit)
                row.append(bench.fmt_time(t) if t is not None else
                           f"> {args.halide_limit:g} s (not finished)")
            except Exception as err:  # noqa: BLE001
                row.append(f"failed ({bench.error_reason(err, 80)})")
        rows.append(row)
    headers = ["size", *(f"halide_ad {h}" for h in hows),
               "first calls (compile + run)"] + (["Halide 21 unscheduled (1 run)"]
                                                 if halide is not None else [])
    bench.print_table(headers, rows, title="median [min .. max] per realize")
    print(bench.load_note("on average during the timed runs", bench.compare.other_load))
    for h in hows:
        growth = [b / a for a, b in zip(per_pixel[h], per_pixel[h][1:])]
        print(f"time per pixel, {h}: " + ", ".join(f"{1e9 * t:.2f} ns" for t in per_pixel[h])
              + f"  (ratios between sizes {', '.join(f'{r:.2f}' for r in growth)}; 1 = linear)")
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
