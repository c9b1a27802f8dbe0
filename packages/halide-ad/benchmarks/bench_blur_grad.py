"""3x3 blur gradient: forward plus the backward pass for the image and the weights, on a
1024 x 1024 float32 image with a repeat_edge boundary. Auto-scheduled halide_ad
(``hl.auto_schedule``, both inlining rules) side by side with PyTorch eager (``conv2d`` after
replicate padding, ``torch.autograd.grad``), ``torch.compile`` of the same forward (its
backward compiled by AOTAutograd) and JAX ``jit`` of ``jax.vjp``, in one run.

Every case computes ``out = blur(img, w)`` and the vector-Jacobian products of a fixed random
cotangent ``g`` with respect to ``img`` and ``w``; all three are checked against a float64
numpy reference before timing. halide_ad realizes the three outputs of one Pipeline into
preallocated Buffers (compiled once, timed separately as "first call"). Cases are alternated
per repeat (``core_ad.benchmark.compare``); the figure is the median. Goal (issue 15): the
auto-scheduled halide_ad no slower than torch.compile.

    python packages/halide-ad/benchmarks/bench_blur_grad.py [--size 1024] [--repeats 7] [--threads 2]
"""
from __future__ import annotations

import argparse
import os

import numpy as np
from core_ad import benchmark as bench


def halide_blur_grad(hl, img, weights, g):
    """The 3x3 blur of ``img`` by ``weights`` (repeat_edge) and the adjoints of ``g``:
    ``(blur, d_img, d_weights, buffers)``; written against the Halide Python API."""
    x, y = hl.Var("x"), hl.Var("y")
    im, wt = hl.Buffer(img, name="img"), hl.Buffer(weights, name="w")
    clamped = hl.BoundaryConditions.repeat_edge(im)
    r = hl.RDom([hl.Range(0, 3), hl.Range(0, 3)])
    blur = hl.Func("blur")
    blur[x, y] = hl.f32(0)
    blur[x, y] += clamped[x + r.x - 1, y + r.y - 1] * wt[r.x, r.y]
    seed = hl.Buffer(g, name="g")
    d = hl.propagate_adjoints(blur, seed)
    return blur, d[im], d[wt], (im, wt, seed)


def reference(img, weights, g):
    """float64 numpy: edge padding, the 9 shifted products, and their adjoints (the padding's
    adjoint folds the border rows and columns back onto the edge)."""
    a, w, g = (np.asarray(v, np.float64) for v in (img, weights, g))
    h, wd = a.shape
    p = np.pad(a, 1, mode="edge")
    out = sum(w[i, j] * p[i:i + h, j:j + wd] for i in range(3) for j in range(3))
    dw = np.array([[np.sum(g * p[i:i + h, j:j + wd]) for j in range(3)] for i in range(3)])
    dp = np.zeros_like(p)
    for i in range(3):
        for j in range(3):
            dp[i:i + h, j:j + wd] += w[i, j] * g
    dp[1] += dp[0]
    dp[-2] += dp[-1]
    dp[:, 1] += dp[:, 0]
    dp[:, -2] += dp[:, -1]
    return out, dp[1:-1, 1:-1], dw


def halide_case(hl, img, weights, g, label, first, notes, **options):
    """A realize callable for the auto-scheduled (or, with ``options=None``, unscheduled)
    pipeline, compiled once; None (with a note) on failure."""
    try:
        blur, d_img, d_w, keep = halide_blur_grad(hl, img, weights, g)
        outs = [blur, d_img, d_w]
        h, w = img.shape
        if options.pop("schedule", True):
            hl.auto_schedule(outs, {blur: [w, h], d_img: [w, h], d_w: [3, 3]}, **options)
        p = hl.Pipeline(outs)
        arrays = [np.empty_like(img), np.empty_like(img), np.empty_like(weights)]
        bufs = [hl.Buffer(a) for a in arrays]
        first[label], _ = bench.time_first_call(lambda: p.realize(bufs))

        def run():
            p.realize(bufs)
            return arrays
        run.keep = (keep, bufs)  # the numpy memory the Buffers wrap stays alive
        return run
    except Exception as err:  # noqa: BLE001 - report, skip the column
        notes.append(f"{label} failed ({bench.error_reason(err)}); skipped")
        return None


def torch_cases(torch, img, weights, g, first, notes):
    F = torch.nn.functional
    x = torch.from_numpy(img).requires_grad_(True)
    w = torch.from_numpy(weights).requires_grad_(True)
    gt = torch.from_numpy(g)

    def fwd(x, w):
        return F.conv2d(F.pad(x[None, None], (1, 1, 1, 1), mode="replicate"),
                        w[None, None])[0, 0]

    def make(f):
        def run():
            out = f(x, w)
            dx, dw = torch.autograd.grad(out, (x, w), gt)
            return out.detach(), dx, dw
        return run

    cases = {"torch eager": make(fwd)}
    try:
        compiled = make(torch.compile(fwd))
        first["torch.compile"], _ = bench.time_first_call(compiled)
        cases["torch.compile"] = compiled
    except Exception as err:  # noqa: BLE001 - e.g. no C compiler for inductor
        notes.append(f"torch.compile failed ({bench.error_reason(err)}); skipped")
    return cases


def jax_case(jax, img, weights, g, first, notes):
    import jax.numpy as jnp

    def fwd(x, w):
        p = jnp.pad(x, 1, mode="edge")[None, None]
        return jax.lax.conv_general_dilated(p, w[None, None], (1, 1), "VALID")[0, 0]

    @jax.jit
    def step(x, w, g):
        out, vjp = jax.vjp(fwd, x, w)
        return (out, *vjp(g))

    args = [jnp.asarray(a) for a in (img, weights, g)]  # float32 (x64 only widens defaults)
    try:
        first["JAX jit"], _ = bench.time_first_call(
            lambda: jax.block_until_ready(step(*args)))
    except Exception as err:  # noqa: BLE001
        notes.append(f"JAX jit failed ({bench.error_reason(err)}); skipped")
        return None
    return lambda: jax.block_until_ready(step(*args))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024, help="image side (default 1024)")
    bench.add_common_arguments(p, repeats=7, threads=2)
    args = bench.parse_arguments(p, argv)
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))  # halide_ad's pool
    notes: list[str] = []
    torch, jax = bench.import_peers(args, notes)
    import halide_ad as hl

    rng = np.random.default_rng(args.seed)
    n = args.size
    img = rng.random((n, n), dtype=np.float32)
    weights = rng.random((3, 3), dtype=np.float32)
    g = rng.standard_normal((n, n), dtype=np.float32)
    print(f"bench_blur_grad: 3x3 blur (repeat_edge) forward + d/d img + d/d weights, {n} x {n}"
          f" float32, median of {args.repeats}")
    print(bench.machine_info(f"threads : {args.threads} (torch, JAX, halide_ad via"
                             " CORE_AD_NUM_THREADS)", modules=("numpy", "halide_ad", "torch",
                                                                "jax")))
    first: dict = {}
    cases = {}
    for label, opts in (("halide_ad auto", {}), ("halide_ad auto rule=paper", {"rule": "paper"}),
                        ("halide_ad unscheduled", {"schedule": False})):
        fn = halide_case(hl, img, weights, g, label, first, notes, **opts)
        if fn is not None:
            cases[label] = fn
    if torch is not None:
        cases.update(torch_cases(torch, img, weights, g, first, notes))
    if jax is not None:
        fn = jax_case(jax, img, weights, g, first, notes)
        if fn is not None:
            cases["JAX jit"] = fn
    ref = reference(img, weights, g)
    print("agreement with the float64 numpy reference (normwise, out / d_img / d_w):")
    ok = {}
    for name, fn in cases.items():
        got = [bench.to_numpy(v) for v in fn()]
        diffs = dict(zip(("out", "d_img", "d_w"), (bench.max_rel_diff(a, b)
                                                   for a, b in zip(got, ref))))
        ok[name] = bench.report_agreement(name, diffs, tol=1e-4, width=26)
    timed = {k: v for k, v in cases.items() if ok[k]}
    res = bench.compare(timed, repeats=args.repeats, warmup=1)
    print()
    if "halide_ad auto" in res:
        ratios = bench.side_by_side(res, "halide_ad auto", first_calls=first,
                                    title=f"blur grad {n} x {n} float32")
        print(bench.load_note("on average during the timed runs", bench.compare.other_load))
        if "torch.compile" in ratios:
            print(f"goal    : torch.compile / halide_ad auto = {ratios['torch.compile']:.2f}"
                  " (goal >= 1)")
    else:
        bench.report_runs(res)
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
