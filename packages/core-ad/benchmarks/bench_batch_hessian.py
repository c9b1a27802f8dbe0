"""Per-lane gradients and Hessians of a small lane-wise function: core_ad vs JAX vs PyTorch.

B lanes (default 4096) of n = 12 float64 coordinates; f maps each lane to a scalar with a
path-throughput-like expression (a product of cosines, an exponential attenuation and a
rational geometry-like term):

    f(x) = prod_i cos(a_i x_i) * exp(-sum_i x_i^2 / 4) / (1 + sum_i (x_i x_{(i+1) % n})^2)

written once (``make_f``) and instantiated for core_ad/numpy on the whole (B, n) batch with
column indexing ``x[:, i]``, and for JAX/PyTorch on one lane ``x[i]`` (then vmapped).

Timed (same process, alternating, same float64 input, median of --repeats runs after warm-up):

* core_ad: ``core_ad.batch_hessian(f, x)`` -> (grad (B, n), hessian (B, n, n)); this includes
  its randomized lane-mixing check (one extra forward pass);
* core_ad compiled: ``core_ad.compiled_batch_hessian(f, n)`` traced once (first-call time
  reported separately), then one compiled lane-wise kernel per call;
* JAX (x64), one jitted function returning both, in two forms:
  "separate": ``jit(X -> (vmap(grad(f))(X), vmap(hessian(f))(X)))`` and
  "fused": ``jit(vmap(jacfwd(x -> (grad(f)(x), grad(f)(x)), has_aux=True)))`` (the gradient
  is computed once and returned as aux);
* PyTorch eager (torch.func), the same two forms with ``torch.func.vmap/hessian/grad/jacfwd``,
  and "autograd batch": core_ad's own batch form in plain autograd (f on (B, n) with
  ``x[:, i]``, ``autograd.grad(sum f, create_graph=True)``, then one double-backward with
  n batched seeds, ``is_grads_batched=True``);
* optionally (``--torch-compile``) ``torch.compile`` of the fused torch.func form.

All outputs are checked to agree (normwise relative difference <= 1e-8) before timing.

Run from the repository root:  python3 packages/core-ad/benchmarks/bench_batch_hessian.py
"""

from __future__ import annotations

import argparse
import sys

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
from core_ad import benchmark as bench

TOL = 1e-8


def make_f(m, col, n):
    """The benchmark function over namespace ``m`` (anp / jnp / torch); ``col(x, i)`` = x_i."""
    a = [0.3 + 0.05 * i for i in range(n)]

    def f(x):
        x0 = col(x, 0)
        p = m.cos(a[0] * x0)
        s = x0 * x0
        r = (x0 * col(x, 1 % n)) ** 2
        for i in range(1, n):
            xi = col(x, i)
            p = p * m.cos(a[i] * xi)
            s = s + xi * xi
            r = r + (xi * col(x, (i + 1) % n)) ** 2
        return p * m.exp(-0.25 * s) / (1.0 + r)

    return f


def setup_core(x, n):
    f = make_f(anp, lambda x, i: x[:, i], n)

    def bh():
        g, H = ad.batch_hessian(f, x)
        return g, H

    return f, bh


def setup_jax(x, n):
    import jax
    import jax.numpy as jnp

    f = make_f(jnp, lambda x, i: x[i], n)
    xj = jax.device_put(x)

    def both(x):
        g = jax.grad(f)(x)
        return g, g

    sep = jax.jit(lambda X: (jax.vmap(jax.grad(f))(X), jax.vmap(jax.hessian(f))(X)))
    fused_h = jax.jit(jax.vmap(jax.jacfwd(both, has_aux=True)))

    def run_sep():
        g, H = sep(xj)
        return g.block_until_ready(), H.block_until_ready()

    def run_fused():
        H, g = fused_h(xj)
        return g.block_until_ready(), H.block_until_ready()

    cases = {"jax.jit separate": run_sep, "jax.jit fused": run_fused}
    return cases, bench.time_first_calls(cases)


def _torch_forms(x, n):
    import torch
    from torch.func import grad, hessian, jacfwd, vmap

    f = make_f(torch, lambda x, i: x[i], n)
    xt = torch.from_numpy(x)

    def both(x):
        g = grad(f)(x)
        return g, g

    vgrad, vhess = vmap(grad(f)), vmap(hessian(f))
    vfused = vmap(jacfwd(both, has_aux=True))

    def run_sep():
        return vgrad(xt), vhess(xt)

    def run_fused():
        H, g = vfused(xt)
        return g, H

    return xt, vfused, run_sep, run_fused


def setup_torch(x, n):
    import torch

    _, _, run_sep, run_fused = _torch_forms(x, n)
    # The same batch form as core_ad: f on the whole (B, n) batch with x[:, i]; the gradient
    # of sum(f) recorded (create_graph) and differentiated again by one batched backward with
    # n seed directions (is_grads_batched: vmap over the double-backward).
    B = x.shape[0]
    fb = make_f(torch, lambda x, i: x[:, i], n)
    xt = torch.from_numpy(x)
    seeds = torch.zeros((n, B, n), dtype=xt.dtype)
    seeds[torch.arange(n), :, torch.arange(n)] = 1

    def run_batch():
        X = xt.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fb(X).sum(), X, create_graph=True)
        (Hc,) = torch.autograd.grad(g, X, grad_outputs=seeds, is_grads_batched=True)
        return g.detach(), Hc.permute(1, 2, 0)

    return {"torch.func separate": run_sep, "torch.func fused": run_fused,
            "torch autograd batch": run_batch}


def setup_torch_compile(x, n, notes):
    import torch

    xt, vfused, _, _ = _torch_forms(x, n)
    try:
        cf = torch.compile(vfused)

        def run():
            H, g = cf(xt)
            return g, H

        t, _ = bench.time_first_call(run)
        run()
    except Exception as e:  # noqa: BLE001 - report the reason and carry on without it
        notes.append(f"torch.compile skipped: {bench.error_reason(e)}")
        return None, None
    return {"torch.compile fused": run}, {"torch.compile fused": t}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--B", type=int, default=4096, help="number of lanes (4096)")
    p.add_argument("--n", type=int, default=12, help="coordinates per lane (12)")
    p.add_argument("--torch-compile", action="store_true",
                   help="also time torch.compile of the fused torch.func form (slow to compile)")
    bench.add_common_arguments(p, repeats=9)
    args = bench.parse_arguments(p, argv)
    B, n = args.B, args.n

    notes = []
    torch, jax = bench.import_peers(args, notes)

    rng = np.random.default_rng(args.seed)
    x = rng.uniform(-1.0, 1.0, (B, n))  # float64

    print("bench_batch_hessian: f(x) = prod_i cos(a_i x_i) * exp(-sum x_i^2 / 4)"
          " / (1 + sum_i (x_i x_{i+1})^2),  a_i = 0.3 + 0.05 i")
    print(f"B = {B} lanes, n = {n}, float64 uniform(-1, 1), seed {args.seed};"
          f" median of {args.repeats} alternating runs after 1 warm-up round")
    print(bench.machine_info(f"thread count: torch {args.threads}; core_ad/numpy 1 thread"))
    print()

    f_core, core_bh = setup_core(x, n)
    cases = {"core_ad primal (numpy)": lambda: f_core(x), "core_ad batch_hessian": core_bh}
    compile_times = {}
    # The compiled path: symbolic gradient + Hessian traced once, one lane-wise kernel.
    compile_times["core_ad compiled"], hess = bench.time_first_call(
        lambda: ad.compiled_batch_hessian(f_core, n, x.dtype))
    cases["core_ad compiled"] = lambda: hess(x)
    if jax is not None:
        c, ct = setup_jax(x, n)
        cases.update(c)
        compile_times.update(ct)
    if torch is not None:
        cases.update(setup_torch(x, n))
        if args.torch_compile:
            print("compiling torch.func form with torch.compile (slow on a cold cache) ...",
                  flush=True)
            c, ct = setup_torch_compile(x, n, notes)
            if c is not None:
                cases.update(c)
                compile_times.update(ct)
        else:
            notes.append("torch.compile not timed (pass --torch-compile to try it on the fused"
                         " torch.func form)")

    # ---- correctness first: everyone against core_ad (and core_ad's Hessian symmetry)
    g0, H0 = core_bh()
    print("correctness (normwise max|a-b|/max|b| against core_ad.batch_hessian):")
    print(f"  core_ad        grad {g0.shape} {g0.dtype}, hessian {H0.shape} {H0.dtype};"
          f" max |H - H^T| = {np.max(np.abs(H0 - np.swapaxes(H0, 1, 2))):.1e};"
          f" max |grad| = {np.max(np.abs(g0)):.3g}, max |H| = {np.max(np.abs(H0)):.3g}")
    ok = True
    for name, fn in cases.items():
        if name.startswith("core_ad"):
            continue
        g, H = (bench.to_numpy(v) for v in fn())
        ok &= bench.report_agreement(
            name, {"grad": bench.max_rel_diff(g, g0), "hessian": bench.max_rel_diff(H, H0)}, TOL,
            dtype=np.result_type(g, H))
    if not ok:
        print(f"outputs disagree beyond {TOL:g}; not timing")
        return 1
    print()

    res = bench.compare_and_report(cases, args.repeats, first_calls=compile_times)
    med = {k: v["median"] for k, v in res.items()}
    for note in notes:
        print("note:", note)
    ours = med["core_ad batch_hessian"]
    print(f"core_ad batch_hessian / core_ad primal = {ours / med['core_ad primal (numpy)']:.0f}x"
          f" (n = {n} directions)")
    print()
    tthreads = args.threads if torch is not None else "no"
    bench.side_by_side({k: v for k, v in res.items() if k != "core_ad primal (numpy)"},
                       "core_ad batch_hessian", first_calls=compile_times,
                       title=f"grad + hessian: B = {B}, n = {n}, float64, {tthreads} torch"
                             f" threads, median of {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
