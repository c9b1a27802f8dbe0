"""Compiled lane-wise kernels: core_ad's LLVM backend vs numpy, jax.jit and torch.compile.

1. An elementwise expression with transcendentals on 10^7 float64 lanes,
   ``sin(x) * exp(-x*x) + x**3 + log1p(x*x)``: core_ad ``sym.compile(backend="llvm")`` (all
   cores), the same expression in plain numpy, core_ad's numpy backend, ``jax.jit`` and
   ``torch.compile`` (torch eager if compiling fails). Outputs are checked to agree first.
2. Compile time of a 200-node expression graph (first ``sym.compile``; the second call of the
   same graph hits the kernel cache and is timed too).

Run from the repository root:  python3 packages/core-ad/benchmarks/bench_codegen.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    from core_ad import sym
except ImportError:  # not pip-installed: use the source tree next to this script
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    from core_ad import sym

from _timing import (
    apply_thread_count,
    compare,
    error_reason,
    fmt_time,
    load_note,
    machine_info,
    max_rel_diff,
    print_table,
    time_first_call,
)


def expression(m, x):
    """The benchmark expression written against a math module ``m``."""
    return m.sin(x) * m.exp(-x * x) + x * x * x + m.log1p(x * x)


def random_graph(n_nodes: int, seed: int):
    """A random DAG of about ``n_nodes`` distinct lane-wise nodes over three variables."""
    rng = np.random.default_rng(seed)
    pool = [sym.var("a"), sym.var("b"), sym.var("c")]
    unary = [sym.sin, sym.cos, sym.tanh, sym.exp, lambda t: sym.sqrt(1.0 + t * t)]
    while sym.count_nodes(pool[-1:]) < n_nodes:
        i, j = rng.integers(0, len(pool), 2)
        k = rng.integers(0, 4)
        c = float(rng.uniform(0.1, 0.9))
        if k == 0:
            pool.append(unary[rng.integers(0, len(unary))](pool[i] * c))
        elif k == 1:
            pool.append(pool[i] * pool[j] + c)
        elif k == 2:
            pool.append(pool[i] - c * pool[j])
        else:
            pool.append(pool[i] / (1.0 + pool[j] * pool[j]))
    return pool[-1], pool[:3]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="lanes (default 10^7)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-jax", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="torch eager instead of compile")
    args = p.parse_args()
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))
    notes = []
    tnote = apply_thread_count(args.threads)

    x = np.random.default_rng(0).uniform(-2.0, 2.0, args.n)
    xs = sym.var("x")
    e = expression(sym, xs)
    t_llvm, k_llvm = time_first_call(lambda: sym.compile([e], [xs], backend="llvm"))
    k_np = sym.compile([e], [xs], backend="numpy")
    cases = {
        "core_ad llvm": lambda: k_llvm(x)[0],
        "numpy": lambda: expression(np, x),
        "core_ad numpy backend": lambda: k_np(x)[0],
    }
    first = {"core_ad llvm": t_llvm}
    if not args.no_jax:
        try:
            import jax

            jax.config.update("jax_enable_x64", True)
            import jax.numpy as jnp

            jf = jax.jit(lambda v: expression(jnp, v))
            xj = jnp.asarray(x)
            first["jax.jit"], _ = time_first_call(lambda: jf(xj).block_until_ready())
            cases["jax.jit"] = lambda: jf(xj).block_until_ready()
        except ImportError:
            notes.append("JAX not installed: skipped")
    if not args.no_torch:
        try:
            import torch

            xt = torch.from_numpy(x)
            tf = lambda v: expression(torch, v)  # noqa: E731
            name = "torch eager"
            if not args.no_compile:
                try:
                    tc = torch.compile(tf)
                    first["torch.compile"], _ = time_first_call(lambda: tc(xt))
                    tf, name = tc, "torch.compile"
                except Exception as err:  # noqa: BLE001 - report and fall back
                    notes.append(f"torch.compile failed ({error_reason(err)}); eager timed")
            cases[name] = lambda: tf(xt)
        except ImportError:
            notes.append("torch not installed: skipped")

    ref = expression(np, x)
    print(f"bench_codegen: {args.n} float64 lanes of sin(x)*exp(-x*x) + x**3 + log1p(x*x)")
    print(machine_info(tnote + f"; CORE_AD_NUM_THREADS={os.environ['CORE_AD_NUM_THREADS']}"))
    for name, fn in cases.items():
        out = fn()
        out = np.asarray(out.detach().numpy() if hasattr(out, "detach") else out)
        d = max_rel_diff(out, ref)
        print(f"  {name:22s} max rel diff vs numpy {d:.1e}")
        if d > 1e-12:
            print("outputs disagree; not timing")
            return 1
    res = compare(cases, repeats=args.repeats, warmup=1)
    med = {k: v["median"] for k, v in res.items()}
    print(load_note("on average during the timed runs", compare.other_load))
    ours = med["core_ad llvm"]
    rows = [[k, fmt_time(v), f"{v / ours:.2f}", fmt_time(first.get(k)) if k in first else "-"]
            for k, v in med.items()]
    print_table(["system", "median", "this / core_ad llvm", "first call"], rows,
                title=f"elementwise, n = {args.n}, median of {args.repeats}")

    g, leaves = random_graph(200, seed=int(time.time()))  # fresh constants: a cold cache
    n_nodes = sym.count_nodes([g])
    t0 = time.perf_counter()
    kern = sym.compile([g], leaves, backend="llvm")
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = sym.compile([g], leaves, backend="llvm")
    t_warm = time.perf_counter() - t0
    print()
    print_table(["graph", "first compile", "second compile (cache)", "same kernel"],
                [[f"{n_nodes} nodes", fmt_time(t_cold), fmt_time(t_warm), str(again is kern)]],
                title="compile time")
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
