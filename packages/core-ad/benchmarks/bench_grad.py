"""Reverse-mode gradient of a large elementwise-then-sum function: core_ad vs PyTorch vs JAX.

    f(x) = sum(sin(x) * exp(-x*x) + x**3),   x: n float64 values (default n = 10**6)

Timed (same process, alternating, same float64 input, median of --repeats runs after warm-up):

* core_ad eager: primal (f on plain numpy through ``core_ad.numpy``) and ``value_and_grad``;
* core_ad lazy: primal (f on a traced array, fused into one kernel) and ``value_and_grad``
  (graph simplified by vertex elimination; primal and edge weight in one kernel);
* PyTorch eager: primal (under ``torch.no_grad``) and forward + ``torch.autograd.grad``;
* ``torch.compile`` (Inductor): primal and forward + backward (compile time reported apart);
* JAX: ``jax.jit(f)`` and ``jax.jit(jax.value_and_grad(f))`` with ``block_until_ready``
  (x64 enabled; compile time reported apart).

Every gradient is checked against the closed form before anything is timed. The headline is
the gradient/primal cost ratio of core_ad against PyTorch eager's (the goal: ours is no worse).

Run from the repository root:  python3 packages/core-ad/benchmarks/bench_grad.py [--n N]
"""

from __future__ import annotations

import argparse
import sys

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
from core_ad import benchmark as bench

TOL = 1e-10  # float64: all systems evaluate the same closed-form expression


# ---- the function, once per system ------------------------------------------------------------

def f_core(x):
    return anp.sum(anp.sin(x) * anp.exp(-x * x) + x**3)


def grad_exact(x):
    e = np.exp(-x * x)
    return np.cos(x) * e - 2.0 * x * np.sin(x) * e + 3.0 * x * x


def f_torch(x):
    import torch

    return torch.sum(torch.sin(x) * torch.exp(-x * x) + x**3)


def f_jax(x):
    import jax.numpy as jnp

    return jnp.sum(jnp.sin(x) * jnp.exp(-x * x) + x**3)


# ---- setup of each system ---------------------------------------------------------------------

def setup_core(x):
    """Eager mode (numpy per operation), whatever the default mode."""
    vg = ad.value_and_grad(f_core)

    def primal():
        with ad.lazy(False):
            return f_core(x)

    def value_and_grad():
        with ad.lazy(False):
            return vg(x)

    return {"core_ad primal": primal, "core_ad value_and_grad": value_and_grad}, value_and_grad


def setup_core_lazy(x):
    """The same traced code in lazy mode: the elementwise primal, its partials and the adjoint
    arithmetic fused into compiled kernels (first calls compile; timed apart)."""
    vg = ad.value_and_grad(f_core)

    xa = ad.Array(x)  # a traced array (no gradient): plain numpy inputs would run in numpy

    def primal():
        with ad.lazy():
            return float(f_core(xa))

    def value_and_grad():
        with ad.lazy():
            v, g = vg(x)
            return float(v), np.asarray(g)

    cases = {"core_ad lazy primal": primal, "core_ad lazy value_and_grad": value_and_grad}
    return cases, value_and_grad, bench.time_first_calls(cases)


def _torch_cases(xt, f_primal, f_grad):
    """Primal (no grad) and forward + ``autograd.grad`` of the torch function(s)."""
    import torch

    def primal():
        with torch.no_grad():
            return f_primal(xt)

    def fwd_bwd():
        xr = xt.detach().requires_grad_(True)
        y = f_grad(xr)
        (g,) = torch.autograd.grad(y, xr)
        return y.detach(), g

    return primal, fwd_bwd


def setup_torch_eager(x):
    import torch

    primal, fwd_bwd = _torch_cases(torch.from_numpy(x), f_torch, f_torch)
    return {"torch eager primal": primal, "torch eager fwd+bwd": fwd_bwd}, fwd_bwd


def setup_torch_compile(x, notes):
    """Compiled primal and fwd+bwd; returns (cases, check_fn, compile_times) or Nones on failure."""
    import torch

    xt = torch.from_numpy(x)
    try:
        # separate objects: the second is compiled with autograd (fwd + bwd)
        primal, fwd_bwd = _torch_cases(xt, torch.compile(f_torch), torch.compile(f_torch))
        cases = {"torch.compile primal": primal, "torch.compile fwd+bwd": fwd_bwd}
        first = bench.time_first_calls(cases)
        # A second call must not recompile (would signal a guard failure); time it as a check.
        primal()
        fwd_bwd()
    except Exception as e:  # noqa: BLE001 - report the reason and carry on without it
        notes.append(f"torch.compile skipped: {bench.error_reason(e)}")
        return None, None, None
    return cases, fwd_bwd, first


def setup_jax(x):
    import jax

    xj = jax.device_put(x)
    jf = jax.jit(f_jax)
    jvg = jax.jit(jax.value_and_grad(f_jax))

    def primal():
        return jf(xj).block_until_ready()

    def vg():
        v, g = jvg(xj)
        return v.block_until_ready(), g.block_until_ready()

    cases = {"jax.jit primal": primal, "jax.jit value_and_grad": vg}
    return cases, vg, bench.time_first_calls(cases)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10**6, help="number of float64 inputs (10**6)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    bench.add_common_arguments(p, repeats=15)
    args = bench.parse_arguments(p, argv)

    notes = []
    torch, jax = bench.import_peers(args, notes)

    rng = np.random.default_rng(args.seed)
    x = rng.uniform(-2.0, 2.0, args.n)  # float64

    print("bench_grad: f(x) = sum(sin(x) * exp(-x*x) + x**3)")
    print(f"n = {args.n} float64 values, uniform(-2, 2), seed {args.seed};"
          f" median of {args.repeats} alternating runs after 1 warm-up round")
    print(bench.machine_info(f"thread count: torch {args.threads}; core_ad/numpy 1 thread"))
    print()

    # ---- set up every system, then check that they agree before timing anything
    g_ref = grad_exact(x)
    v_ref = float(np.sum(np.sin(x) * np.exp(-x * x) + x**3))
    cases, checks, compile_times = {}, {}, {}

    c, chk = setup_core(x)
    cases.update(c)
    checks["core_ad"] = chk
    c, chk, ct = setup_core_lazy(x)
    cases.update(c)
    checks["core_ad lazy"] = chk
    compile_times.update(ct)
    if torch is not None:
        c, chk = setup_torch_eager(x)
        cases.update(c)
        checks["torch eager"] = chk
        if not args.no_compile:
            print("compiling with torch.compile (the first compile on a cold Inductor cache can"
                  " take ~20 s) ...", flush=True)
            c, chk, ct = setup_torch_compile(x, notes)
            if c is not None:
                cases.update(c)
                checks["torch.compile"] = chk
                compile_times.update(ct)
        else:
            notes.append("torch.compile skipped (--no-compile)")
    if jax is not None:
        c, chk, ct = setup_jax(x)
        cases.update(c)
        checks["jax.jit"] = chk
        compile_times.update(ct)

    print("correctness (primal and value against numpy; gradient against the closed form,"
          " normwise max|a-b|/max|b|):")
    ok = True
    primal_of = {"core_ad": "core_ad primal", "core_ad lazy": "core_ad lazy primal",
                 "torch eager": "torch eager primal",
                 "torch.compile": "torch.compile primal", "jax.jit": "jax.jit primal"}
    for name, fn in checks.items():
        vp = float(bench.to_numpy(cases[primal_of[name]]()))
        v, g = (bench.to_numpy(r) for r in fn())
        diffs = {"primal": abs(vp - v_ref) / abs(v_ref),
                 "value": abs(float(v) - v_ref) / abs(v_ref),
                 "grad": bench.max_rel_diff(g, g_ref)}
        ok &= bench.report_agreement(name, diffs, TOL, dtype=g.dtype, width=14)
    if not ok:
        print(f"gradients disagree beyond {TOL:g}; not timing")
        return 1
    print()

    res = bench.compare_and_report(cases, args.repeats, first_calls=compile_times)
    med = {k: v["median"] for k, v in res.items()}

    systems = [
        ("core_ad", "core_ad primal", "core_ad value_and_grad"),
        ("core_ad lazy", "core_ad lazy primal", "core_ad lazy value_and_grad"),
        ("torch eager", "torch eager primal", "torch eager fwd+bwd"),
        ("torch.compile", "torch.compile primal", "torch.compile fwd+bwd"),
        ("jax.jit", "jax.jit primal", "jax.jit value_and_grad"),
    ]
    systems = [s for s in systems if s[1] in med]
    ratios = {s: med[g] / med[p] for s, p, g in systems}
    for n in notes:
        print("note:", n)
    if "torch eager" in ratios:
        r_ours, r_torch = ratios["core_ad"], ratios["torch eager"]
        verdict = "no worse than" if r_ours <= r_torch else "WORSE than"
        print(f"headline: core_ad grad/primal ratio {r_ours:.2f} vs PyTorch eager grad/primal"
              f" ratio {r_torch:.2f}  -> core_ad is {verdict} PyTorch eager"
              f" ({r_ours / r_torch:.2f}x)")
    print()
    tthreads = args.threads if torch is not None else "no"
    bench.side_by_side(
        {s: res[gk] for s, _, gk in systems}, "core_ad", first_calls={
            s: compile_times[gk] for s, _, gk in systems if gk in compile_times},
        columns={"primal": {s: bench.fmt_time(med[pk]) for s, pk, _ in systems},
                 "grad/primal": {s: f"{ratios[s]:.2f}" for s, _, _ in systems}},
        title=f"value + grad: n = {args.n} float64, {tthreads} torch threads, median of"
              f" {args.repeats}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
