"""core_ad's CUDA backend on a GPU, next to PyTorch (CUDA) and JAX (GPU) in the same run.

1. Value and gradient of ``f(x) = sin(x) exp(-x^2) + x^3 + log1p(x^2)`` on ``--n`` lanes
   (float64 and float32): core_ad ``sym.compile([f, df/dx], backend="cuda")`` (one fused
   kernel), PyTorch eager autograd on CUDA tensors (``f(x).sum().backward()``) and
   ``jax.jit(jax.vmap(jax.value_and_grad(f)))``. Outputs are checked to agree first.
2. bench_grad.py's function ``f(x) = sum(sin(x) exp(-x^2) + x^3)`` on ``--n`` float64 lanes,
   value and gradient from traced arrays: core_ad lazy mode on a CuPy array
   (``core_ad.value_and_grad(f)(x_cupy)``: the primal, the reverse sweep and the sum fused into
   CUDA kernels, cached across calls) next to PyTorch eager autograd on a CUDA tensor and
   ``jax.jit(jax.value_and_grad(f))`` on the GPU.
3. Batched symmetric eigendecomposition (``--eigh-batch`` float64 matrices of each of
   ``--eigh-sizes``): core_ad's Jacobi kernel (``core_ad.eigh`` on CuPy arrays, the layout it
   picks, and each of its two layouts forced), ``torch.linalg.eigh`` on CUDA (in chunks of
   ``--torch-eigh-chunk`` matrices: on the whole batch it failed with
   CUSOLVER_STATUS_INTERNAL_ERROR at n = 4 and asked for 58 GiB at n = 16, H100, torch 2.11)
   and ``cupy.linalg.eigh``.

Every timed call ends with a device synchronisation, so the times are those a caller sees;
results stay on the device (their copy to numpy for the checks is not timed: on the H100
machine it took longer than the computations).
Medians of ``--repeats`` alternated runs; the first call (compile) is reported apart.
Without CuPy or a CUDA device the script prints why and exits 0. From the repository root:

    PYTHONPATH=packages/core-ad/src python packages/core-ad/benchmarks/bench_cuda.py
"""

from __future__ import annotations

import argparse
import os

# JAX would otherwise take 75% of the GPU's memory at import, starving CuPy and torch.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np
from core_ad import benchmark as bench
from core_ad import codegen, sym


def expression(m, x):
    return m.sin(x) * m.exp(-x * x) + x * x * x + m.log1p(x * x)


def value_and_grad_cases(cp, torch, jax, n, dtype, seed, notes):
    """Callables returning ``(value, grad)`` as numpy arrays after a device sync."""
    rng = np.random.default_rng(seed)
    x_host = rng.uniform(-2.0, 2.0, n).astype(dtype)
    xs = sym.var("x", dtype)
    f = expression(sym, xs)
    (df,) = sym.grad(f, [xs])
    kern = sym.compile([f, df], [xs], backend="cuda")
    x_cp = cp.asarray(x_host)
    sync = cp.cuda.Device().synchronize

    def ours():
        out = kern(x_cp)
        sync()
        return out

    cases = {"core_ad cuda": ours}
    fetch = {"core_ad cuda": lambda out: [cp.asnumpy(o) for o in out]}
    if torch is not None and torch.cuda.is_available():
        x_t = torch.tensor(x_host, device="cuda")

        def torch_eager():
            x = x_t.detach().requires_grad_()
            y = expression(torch, x)
            y.sum().backward()
            torch.cuda.synchronize()
            return y.detach(), x.grad

        cases["torch cuda eager"] = torch_eager
        fetch["torch cuda eager"] = lambda out: [o.cpu().numpy() for o in out]
    elif torch is not None:
        notes.append("torch sees no CUDA device; skipped")
    if jax is not None and any(d.platform == "gpu" for d in jax.devices()):
        import jax.numpy as jnp

        vg = jax.jit(jax.vmap(jax.value_and_grad(lambda v: expression(jnp, v))))
        x_j = jax.device_put(jnp.asarray(x_host), jax.devices("gpu")[0])

        def jax_jit():
            out = vg(x_j)
            jax.block_until_ready(out)
            return out

        cases["jax.jit gpu"] = jax_jit
        fetch["jax.jit gpu"] = lambda out: [np.asarray(o) for o in out]
    elif jax is not None:
        notes.append("JAX sees no GPU; skipped")
    return x_host, cases, fetch


def grad_of_sum_cases(cp, torch, jax, n, seed, notes):
    """Callables returning ``(value as a float, grad on the device)`` after a device sync:
    bench_grad's function on traced arrays (core_ad lazy on CuPy), torch CUDA eager and
    jax.jit; and per case the function that copies its gradient to numpy (outside the timed
    call: the copy of 8n bytes over PCIe would otherwise dominate every row)."""
    import core_ad as ad
    import core_ad.numpy as anp

    def f(m, x):
        return m.sum(m.sin(x) * m.exp(-x * x) + x**3)

    x_host = np.random.default_rng(seed).uniform(-2.0, 2.0, n)
    x_cp = cp.asarray(x_host)
    vg = ad.value_and_grad(lambda v: f(anp, v))
    sync = cp.cuda.Device().synchronize

    def ours():
        with ad.lazy():
            v, g = vg(x_cp)
        sync()
        return float(v), g

    cases = {"core_ad lazy cuda": ours}
    to_host = {"core_ad lazy cuda": cp.asnumpy}
    if torch is not None and torch.cuda.is_available():
        x_t = torch.tensor(x_host, device="cuda")

        def torch_eager():
            x = x_t.detach().requires_grad_()
            y = f(torch, x)
            (g,) = torch.autograd.grad(y, x)
            torch.cuda.synchronize()
            return float(y.detach()), g

        cases["torch cuda eager"] = torch_eager
        to_host["torch cuda eager"] = lambda g: g.cpu().numpy()
    if jax is not None and any(d.platform == "gpu" for d in jax.devices()):
        import jax.numpy as jnp

        jvg = jax.jit(jax.value_and_grad(lambda v: f(jnp, v)))
        x_j = jax.device_put(jnp.asarray(x_host), jax.devices("gpu")[0])

        def jax_jit():
            v, g = jvg(x_j)
            jax.block_until_ready(g)
            return float(v), g

        cases["jax.jit gpu"] = jax_jit
        to_host["jax.jit gpu"] = np.asarray
    e = np.exp(-x_host * x_host)
    terms = np.sin(x_host) * e + x_host**3
    grad = np.cos(x_host) * e - 2.0 * x_host * np.sin(x_host) * e + 3.0 * x_host * x_host
    return (float(np.sum(terms)), grad, float(np.abs(terms).sum())), cases, to_host


def eigh_cases(cp, torch, batch, size, seed, torch_chunk):
    """numpy's eigenvalues, callables returning the eigenvalues on the device after a sync,
    and per case the copy to numpy (outside the timed call)."""
    import core_ad as ad
    from core_ad._codegen import eigh as eigh_kernels

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((batch, size, size))
    H = (A + np.swapaxes(A, 1, 2)) / 2
    H_cp = cp.asarray(H)
    sync = cp.cuda.Device().synchronize

    def ours():
        lam, _ = ad.eigh(H_cp)
        sync()
        return lam

    def cupy_eigh():
        lam, _ = cp.linalg.eigh(H_cp)
        sync()
        return lam

    def forced(variant):
        def run():
            lam, _ = eigh_kernels.eigh_cuda(H_cp, variant)
            sync()
            return lam
        return run

    cases = {"core_ad jacobi": ours}
    cases.update({f"core_ad jacobi, {v} layout": forced(v) for v in eigh_kernels.CUDA_VARIANTS})
    cases["cupy.linalg.eigh"] = cupy_eigh
    to_host = dict.fromkeys(cases, cp.asnumpy)
    if torch is not None and torch.cuda.is_available():
        H_t = torch.tensor(H, device="cuda")

        def torch_eigh():
            lam = torch.cat([torch.linalg.eigh(H_t[i:i + torch_chunk])[0]
                             for i in range(0, batch, torch_chunk)])
            torch.cuda.synchronize()
            return lam

        cases["torch.linalg.eigh"] = torch_eigh
        to_host["torch.linalg.eigh"] = lambda lam: lam.cpu().numpy()
    return np.linalg.eigh(H)[0], cases, to_host


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="lanes (default 10^7)")
    p.add_argument("--eigh-batch", type=int, default=100_000)
    p.add_argument("--eigh-sizes", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--torch-eigh-chunk", type=int, default=10_000)
    bench.add_common_arguments(p, repeats=11)
    args = bench.parse_arguments(p)
    from core_ad._codegen.eigh import MAX_N

    if not all(1 <= k <= MAX_N for k in args.eigh_sizes) or args.torch_eigh_chunk < 1:
        p.error(f"--eigh-sizes must lie in [1, {MAX_N}] and --torch-eigh-chunk be >= 1, got "
                f"{args.eigh_sizes} and {args.torch_eigh_chunk}")
    if not codegen.cuda_available():
        print("bench_cuda: no CuPy with a usable CUDA device; nothing to time")
        return 0
    import cupy as cp

    notes: list[str] = []
    torch, jax = bench.import_peers(args, notes)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"bench_cuda: {name}, CuPy {cp.__version__}")
    print(bench.machine_info("GPU timings; every call synchronises"))

    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        ref_x, cases, fetch = value_and_grad_cases(cp, torch, jax, args.n, dtype, args.seed,
                                                   notes)
        x64 = ref_x.astype(np.float64)
        want = [expression(np, x64),
                np.cos(x64) * np.exp(-x64 * x64) - 2 * x64 * np.sin(x64) * np.exp(-x64 * x64)
                + 3 * x64 * x64 + 2 * x64 / (1 + x64 * x64)]
        first = {}
        print(f"\nvalue and gradient, {args.n} {dtype} lanes")
        for case, fn in cases.items():
            t, out = bench.time_first_call(fn)
            first[case] = t
            got = fetch[case](out)
            d = max(bench.max_rel_diff(g.astype(np.float64), w) for g, w in zip(got, want))
            print(f"  {case:18s} max rel diff vs numpy float64 {d:.1e}")
            if d > tol:
                print(f"outputs disagree beyond {tol:g}; not timing")
                return 1
        res = bench.compare_and_report(cases, args.repeats, first_calls=first)
        bench.side_by_side(res, "core_ad cuda", first_calls=first,
                           title=f"value+grad, n = {args.n}, {dtype}, median of {args.repeats}")

    want, cases, to_host = grad_of_sum_cases(cp, torch, jax, args.n, args.seed, notes)
    first = {}
    print(f"\nbench_grad's function, value and gradient on traced arrays, {args.n} float64 lanes")
    for case, fn in cases.items():
        t, (v, g) = bench.time_first_call(fn)
        first[case] = t
        d = max(abs(v - want[0]) / want[2], bench.max_rel_diff(to_host[case](g), want[1]))
        print(f"  {case:18s} rel diff vs numpy float64 {d:.1e}")
        if d > 1e-12:
            print("outputs disagree beyond 1e-12; not timing")
            return 1
    res = bench.compare_and_report(cases, args.repeats, first_calls=first)
    bench.side_by_side(res, "core_ad lazy cuda", first_calls=first,
                       title=f"value_and_grad of a sum, n = {args.n}, float64, median of"
                             f" {args.repeats}")

    for size in args.eigh_sizes:
        want, cases, to_host = eigh_cases(cp, torch, args.eigh_batch, size, args.seed,
                                          args.torch_eigh_chunk)
        first = {}
        print(f"\nbatched eigh, {args.eigh_batch} float64 matrices of size {size}")
        for case, fn in list(cases.items()):
            try:
                t, got = bench.time_first_call(fn)
            except RuntimeError as err:  # a peer's failure (seen: torch's batched cuSOLVER
                if case.startswith("core_ad"):  # syevj, CUSOLVER_STATUS_INTERNAL_ERROR) is noted
                    raise
                notes.append(f"{case} failed at {args.eigh_batch} x {size}^2"
                             f" ({bench.error_reason(err)}); not timed")
                del cases[case]
                continue
            first[case] = t
            d = float(np.max(np.abs(to_host[case](got) - want)))
            print(f"  {case:28s} max abs diff of eigenvalues vs numpy {d:.1e}")
            if d > 1e-9:
                print("eigenvalues disagree; not timing")
                return 1
        res = bench.compare_and_report(cases, args.repeats, first_calls=first)
        bench.side_by_side(res, "core_ad jacobi", first_calls=first,
                           title=f"eigh {args.eigh_batch} x {size}^2, median of {args.repeats}")
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
