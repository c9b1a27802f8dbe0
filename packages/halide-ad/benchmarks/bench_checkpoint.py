"""Checkpointing is scheduling (spec section 3.9, acceptance experiment AE-9): the paper's
example E6, a 2-D convolution plus an L2 loss, forward and backward under three schedules of
the forward Func ``convolved`` that its adjoint reads, next to the auto-scheduler.

    convolved(x, y) = sum_{i,j} in(x - i, y - j) * kernel(i, j)      in zero-padded
    loss() = sum_{x,y} (convolved(x, y) - target(x, y))^2
    d_in = propagate_adjoints(loss)[in]       a correlation of 2 (convolved - target) with kernel

``d_in`` reads ``convolved`` at every kernel tap, so the schedule decides what is kept:

* store (checkpoint): ``convolved.compute_root()``, one image-sized buffer, read kw*kh times;
* recompute (inline): ``convolved.compute_inline()``, no buffer, (kw*kh)^2 taps per pixel;
* compute_at: a tile of ``convolved`` (32 x 32 plus the halo) per 32 x 32 tile of ``d_in``.

``convolved`` is written as a pure Func (the taps summed in Python, as Halide's inline ``sum``
would) because a Func with update definitions cannot be inlined. In every manual schedule
``d_in`` is tiled 32 x 32, rows of tiles in parallel, vectorised by 8.

Forward and backward are two Pipelines, as when Halide compiles them separately (a
``compute_at`` inside ``d_in``'s tiles cannot also serve the loss): the forward realizes
``loss`` (``convolved`` inlined, each value read once; the sum rfactored into parallel,
vectorised column sums, as ``auto_schedule`` does), the backward ``d_in`` under the schedule.
Each row times both, into preallocated Buffers; "forward alone" is the shared first part.
The schedules' ``d_in`` are checked against the unscheduled pipeline (normwise, 1e-5) before
timing. The intermediates' memory is the arrays the backward pipeline allocated for its root
Funcs; a compute_at buffer lives per tile, per thread: (32 + kw - 1) * (32 + kh - 1) floats.

Paper (2560 x 1600, CPU, threads and vectors): 1 x 5 kernel: inline 5.6 ms, root 10.1 ms,
compute_at 9.7 ms; 3 x 5: inline 66.2 ms, root 18.7 ms, compute_at 12.3 ms.

Measured (1024 x 1024 float32, forward + backward, 2 cores that other processes kept 1.0-1.4
busy; ranges of the medians of 7 over three runs):

    kernel  store (root)  recompute (inline)  compute_at   auto      auto rule=paper  forward
    1 x 5   14-22 ms      17-24 ms            15-22 ms     19-32 ms  26-29 ms         5-11 ms
    3 x 5   17-32 ms      48-74 ms            17-33 ms     20-33 ms  47-84 ms         8-14 ms

recompute / store: 1.05-1.14 for 1 x 5 (paper 0.55), 2.33-2.79 for 3 x 5 (paper 3.54).
Intermediates of the backward: store 4 MiB (``convolved``), auto_schedule 8 MiB (it also
roots the adjoint of ``convolved``), recompute and rule=paper none, compute_at 4.5 / 4.8 KiB
per tile. See docs/design/halide-ad.md section 2.5.

    python packages/halide-ad/benchmarks/bench_checkpoint.py [--size 1024 [1024]]
        [--kernels 1x5 3x5] [--repeats 7] [--threads 2]
"""
from __future__ import annotations

import argparse
import os

import numpy as np
from core_ad import benchmark as bench

PAPER_MS = {(1, 5): {"inline": 5.6, "root": 10.1, "compute_at": 9.7},
            (3, 5): {"inline": 66.2, "root": 18.7, "compute_at": 12.3}}
SCHEDULES = ("store (compute_root)", "recompute (inline)", "compute_at 32x32",
             "auto_schedule", "auto_schedule rule=paper")
FORWARD = "forward alone (loss)"
PAPER_KEY = dict(zip(SCHEDULES, ("root", "inline", "compute_at")))
TILE = 32


def e6_gradient(hl, img, target, kernel):
    """E6: ``(loss, d_in, convolved, rt, keep)``; ``rt`` the loss's RDom, ``keep`` the
    Buffers (the numpy memory they wrap must stay alive)."""
    h, w = img.shape
    kh, kw = kernel.shape
    x, y = hl.Var("x"), hl.Var("y")
    im, tb, kb = (hl.Buffer(a, name=n) for a, n in ((img, "in"), (target, "target"),
                                                     (kernel, "kernel")))
    inp = hl.BoundaryConditions.constant_exterior(im, 0)
    convolved = hl.Func("convolved")
    convolved[x, y] = sum(inp[x - i, y - j] * kb[i, j] for j in range(kh) for i in range(kw))
    rt = hl.RDom([hl.Range(0, w), hl.Range(0, h)])
    loss = hl.Func("loss")
    loss[()] = hl.cast(img.dtype, 0)
    loss[()] += hl.pow(convolved[rt.x, rt.y] - tb[rt.x, rt.y], 2)
    d_in = hl.propagate_adjoints(loss)[inp]  # the padded input's adjoint: a pure gather
    return loss, d_in, convolved, rt, (im, tb, kb)


def schedule(hl, how, d_in, conv, size):
    """Apply one of SCHEDULES to the backward pipeline (``"unscheduled"``: the defaults,
    ``convolved`` inlined)."""
    if how == "unscheduled":
        return
    if how.startswith("auto_schedule"):
        opts = {"rule": "paper"} if how.endswith("paper") else {}
        hl.auto_schedule([d_in], {d_in: list(size)}, **opts)
        return
    x, y = conv.args()
    dx, dy = d_in.args()  # the adjoint's own Vars
    xo, yo, xi, yi = (hl.Var(n) for n in ("xo", "yo", "xi", "yi"))
    # rows of tiles in parallel: compute_at a fused tile index was 4-5x slower
    d_in.tile(dx, dy, xo, yo, xi, yi, TILE, TILE).parallel(yo).vectorize(xi, 8)
    if how.startswith("store"):
        conv.compute_root().parallel(y).vectorize(x, 8)
    elif how.startswith("recompute"):
        conv.compute_inline()
    else:
        conv.compute_at(d_in, xo).vectorize(x, 8)


def forward(hl, img, target, kernel):
    """The forward pass alone, a realize callable: ``loss`` with ``convolved`` inlined (each
    value is read once) and the sum rfactored into parallel, vectorised column sums."""
    loss, _, _, rt, keep = e6_gradient(hl, img, target, kernel)
    u = hl.Var("u")
    intm = loss.update(0).rfactor([(rt.x, u)])
    intm.compute_root()
    intm.update(0).split(u, u, "u.ti", 16).vectorize("u.ti", 8).parallel(u)
    p = hl.Pipeline([loss])
    out = np.zeros((), img.dtype)
    buf = hl.Buffer(out)

    def run():
        p.realize([buf])
        return out
    run.keep = (keep, buf)
    return run


def intermediate_bytes(p) -> int:
    """Bytes of the arrays the last realize of ``p`` allocated for its intermediate root Funcs."""
    pools = p._compiled.scratch.values()  # noqa: SLF001 - the pipeline's own record
    return max((sum(a.nbytes for arrs in pool.values() for a in arrs) for pool in pools),
               default=0)


def backward(hl, img, target, kernel, how):
    """``(run, memory)``: a realize callable of ``d_in`` under schedule ``how``, compiled,
    and the memory of its intermediates (text)."""
    _, d_in, conv, _, keep = e6_gradient(hl, img, target, kernel)
    schedule(hl, how, d_in, conv, img.shape[::-1])
    p = hl.Pipeline([d_in])
    out = np.empty_like(img)
    buf = hl.Buffer(out)

    def run():
        p.realize([buf])
        return out
    run.keep = (keep, buf)
    run()
    if how.startswith("compute_at"):  # one buffer per tile, per thread
        kh, kw = kernel.shape
        return run, f"{fmt_bytes((TILE + kw - 1) * (TILE + kh - 1) * img.itemsize)} per tile"
    return run, fmt_bytes(intermediate_bytes(p))


def fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n else "0"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, nargs="+", default=[1024],
                   help="image width [height] (default 1024; the paper's is 2560 1600)")
    p.add_argument("--kernels", nargs="+", default=["1x5", "3x5"],
                   help="kernel sizes, rows x columns (default 1x5 3x5, the paper's)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per schedule (7)")
    p.add_argument("--threads", type=int, default=2, help="halide_ad threads (2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if len(args.size) > 2:
        p.error("--size takes a width and at most a height")
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))  # halide_ad's pool
    import halide_ad as hl

    w, h = (args.size * 2)[:2]
    rng = np.random.default_rng(args.seed)
    img = rng.random((h, w), dtype=np.float32)
    target = rng.random((h, w), dtype=np.float32)
    print(f"bench_checkpoint: E6 conv + L2 loss, forward + d/d in, {w} x {h} float32,"
          f" median of {args.repeats}")
    print(bench.machine_info(f"threads : {args.threads} (halide_ad via CORE_AD_NUM_THREADS)",
                             modules=("numpy", "halide_ad")))
    for spec in args.kernels:
        kh, kw = (int(v) for v in spec.split("x"))
        kernel = rng.random((kh, kw), dtype=np.float32) / (kh * kw)
        print(f"\n== kernel {kh} x {kw}")
        first = {}
        fwd = forward(hl, img, target, kernel)
        first[FORWARD], _ = bench.time_first_call(fwd)
        ref = backward(hl, img, target, kernel, "unscheduled")[0]().copy()
        print("agreement of d_in with the unscheduled pipeline (normwise):")
        cases, memory, notes = {FORWARD: fwd}, {}, []
        for how in SCHEDULES:
            try:
                first[how], (bwd, memory[how]) = bench.time_first_call(
                    lambda how=how: backward(hl, img, target, kernel, how))
            except Exception as err:  # noqa: BLE001 - report, skip the row
                notes.append(f"{how} failed ({bench.error_reason(err)}); skipped")
                continue
            if bench.report_agreement(how, {"d_in": bench.max_rel_diff(bwd(), ref)},
                                      tol=1e-5, width=26):
                cases[how] = lambda bwd=bwd: (fwd(), bwd())
        res = bench.compare(cases, repeats=args.repeats, warmup=1)
        print()
        paper = PAPER_MS.get((kh, kw), {})
        ours = SCHEDULES[0] if SCHEDULES[0] in res else next(iter(res))
        bench.side_by_side(res, ours, first_calls=first,
                           title=f"kernel {kh} x {kw}, {w} x {h} float32",
                           columns={"intermediates (d_in)": memory,
                                    "paper (2560x1600)": {k: f"{paper[v]} ms" for k, v in
                                                          PAPER_KEY.items() if v in paper}})
        store, recompute = (res.get(k) for k in SCHEDULES[:2])
        if store and recompute and paper:
            print(f"recompute / store = {recompute['median'] / store['median']:.2f}"
                  f" (paper inline / root = {paper['inline'] / paper['root']:.2f})")
        print(bench.load_note("on average during the timed runs", bench.compare.other_load))
        for note in notes:
            print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
