"""Spec 2.6, the memory argument: peak memory of a gradient through a long chain of simple
arithmetic, core_ad (lazy and eager) next to PyTorch.

    b = a; repeat N times: b = step(b); then d sum(b) / d a,   a: 2^20 float32 (4 MiB)

with the seed's step ``b * b`` (which core_ad's symbolic engine folds into one power in lazy
mode) and ``sin(b) * b + 0.25`` (which nothing folds).

Memory is what the array buffers take at the peak: for core_ad, numpy's allocations as
tracemalloc reports them; for PyTorch, the bytes its autograd graph saves for the backward
pass (saved-tensor hooks) plus the input, output and gradient. Wall time of one run
(lazy: the first call compiles the fused kernel; a second call hits the kernel cache) is
printed too. The seed's number: PyTorch on a GPU, 1000 iterations, 4803 MiB.

Run from the repository root:  python3 packages/core-ad/benchmarks/bench_memory.py [--iterations N]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
from core_ad import benchmark as bench

LANES = 1 << 20
EAGER_MAX_ITERATIONS = 100
MIB = float(1 << 20)


STEPS = {
    "b*b": (lambda m, b: b * b, 1.00001),
    "sin(b)*b+0.25": (lambda m, b: m.sin(b) * b + 0.25, 0.5),
}


def core_ad_run(step, iterations, lazy):
    fn, start = STEPS[step]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with ad.lazy(lazy), np.errstate(over="ignore", under="ignore"):
            a = ad.Array(np.full(LANES, start, np.float32), requires_grad=True)
            b = a
            for _ in range(iterations):
                b = fn(anp, b)
            anp.sum(b).backward()
            np.asarray(a.grad)
        return tracemalloc.get_traced_memory()[1] / MIB, time.perf_counter() - t0
    finally:
        tracemalloc.stop()


def torch_run(step, iterations):
    import torch

    fn, start = STEPS[step]
    saved = {}

    def pack(t):
        saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    t0 = time.perf_counter()
    a = torch.full((LANES,), start, dtype=torch.float32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        b = a
        for _ in range(iterations):
            b = fn(torch, b)
    peak = (sum(saved.values()) + 3 * LANES * 4) / MIB  # + input, output, gradient
    b.sum().backward()
    return peak, time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--no-eager", action="store_true",
                        help=f"skip core_ad's eager mode (always skipped above "
                             f"{EAGER_MAX_ITERATIONS} iterations)")
    bench.add_common_arguments(parser)
    args = bench.parse_arguments(parser, argv)
    notes: list[str] = []
    args.no_jax = True  # not a JAX comparison
    have_torch = bench.import_peers(args, notes)[0] is not None
    print(bench.machine_info())
    rows = []
    for step in STEPS:
        for n in args.iterations:
            lazy_first = core_ad_run(step, n, True)
            lazy = core_ad_run(step, n, True)
            row = [step, n, f"{lazy[0]:.1f} MiB", f"{lazy_first[1]:.2f} s / {lazy[1]:.2f} s"]
            # the eager tape takes 4-12 MiB per iteration: 12 GiB at 1000
            row.append("skipped" if args.no_eager or n > EAGER_MAX_ITERATIONS
                       else "{:.1f} MiB".format(core_ad_run(step, n, False)[0]))
            if have_torch:
                peak, seconds = torch_run(step, n)
                row += [f"{peak:.1f} MiB", f"{seconds:.2f} s", f"{peak / lazy[0]:.1f}x"]
            rows.append(row)
    headers = ["step", "iterations", "core_ad lazy", "lazy time (first / cached)", "core_ad eager"]
    if have_torch:
        headers += ["PyTorch", "PyTorch time", "PyTorch / core_ad lazy"]
    bench.print_table(headers, rows, title=f"peak memory, gradient through N steps b = step(b), "
                                           f"{LANES} float32 lanes")
    for note in notes:
        print("note:", note)


if __name__ == "__main__":
    main()
