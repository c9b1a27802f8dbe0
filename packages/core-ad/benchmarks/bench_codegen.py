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
import time

import numpy as np
from core_ad import benchmark as bench
from core_ad import sym


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
    p.add_argument("--no-compile", action="store_true", help="torch eager instead of compile")
    bench.add_common_arguments(p, repeats=7)
    args = bench.parse_arguments(p)
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))
    notes = []
    torch, jax = bench.import_peers(args, notes)

    x = np.random.default_rng(args.seed).uniform(-2.0, 2.0, args.n)
    xs = sym.var("x")
    e = expression(sym, xs)
    t_llvm, k_llvm = bench.time_first_call(lambda: sym.compile([e], [xs], backend="llvm"))
    k_np = sym.compile([e], [xs], backend="numpy")
    cases = {
        "core_ad llvm": lambda: k_llvm(x)[0],
        "numpy": lambda: expression(np, x),
        "core_ad numpy backend": lambda: k_np(x)[0],
    }
    first = {"core_ad llvm": t_llvm}
    if jax is not None:
        import jax.numpy as jnp

        jf = jax.jit(lambda v: expression(jnp, v))
        xj = jnp.asarray(x)
        first["jax.jit"], _ = bench.time_first_call(lambda: jf(xj).block_until_ready())
        cases["jax.jit"] = lambda: jf(xj).block_until_ready()
    if torch is not None:
        xt = torch.from_numpy(x)
        tf = lambda v: expression(torch, v)  # noqa: E731
        name = "torch eager"
        if not args.no_compile:
            try:
                tc = torch.compile(tf)
                first["torch.compile"], _ = bench.time_first_call(lambda: tc(xt))
                tf, name = tc, "torch.compile"
            except Exception as err:  # noqa: BLE001 - report and fall back
                notes.append(f"torch.compile failed ({bench.error_reason(err)}); eager timed")
        cases[name] = lambda: tf(xt)

    ref = expression(np, x)
    print(f"bench_codegen: {args.n} float64 lanes of sin(x)*exp(-x*x) + x**3 + log1p(x*x)")
    print(bench.machine_info(f"CORE_AD_NUM_THREADS={os.environ['CORE_AD_NUM_THREADS']}"))
    for name, fn in cases.items():
        out = fn()
        out = np.asarray(out.detach().numpy() if hasattr(out, "detach") else out)
        d = bench.max_rel_diff(out, ref)
        print(f"  {name:22s} max rel diff vs numpy {d:.1e}")
        if d > 1e-12:
            print("outputs disagree; not timing")
            return 1
    res = bench.compare_and_report(cases, args.repeats, first_calls=first)
    bench.side_by_side(res, "core_ad llvm", first_calls=first,
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
    bench.print_table(["graph", "first compile", "second compile (cache)", "same kernel"],
                      [[f"{n_nodes} nodes", bench.fmt_time(t_cold), bench.fmt_time(t_warm),
                        str(again is kern)]],
                      title="compile time")
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
