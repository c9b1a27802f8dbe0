"""halide_ad pipelines vs Halide 21 (JIT), numpy and torch (CPU): a separable 3x3 blur and
the bilateral grid on a 4096 x 4096 float32 image, and gamma correction and a 2x bilinear
upsample of a 3 x 2048 x 2048 planar colour image (their "tiled" schedules run the rows in
parallel inside the channel loop), timed side by side in one run.

* halide_ad and Halide 21 run the *same* pipeline code (``halide_ad.apps.blur`` /
  ``halide_ad.apps.bilateral_grid``, ``build(hl, ...)`` with ``hl = halide_ad`` or
  ``hl = halide``) under the same "tiled" schedule (``schedule(app, "tiled", tile=...)``), each
  compiled once (``compile_jit``, timed separately as "first call") before the timed runs; every
  timed call is one ``realize`` into a freshly allocated output, like the numpy / torch calls.
* numpy: the apps' own numpy implementations (``reference(..., dtype=float32)``).
* torch (eager, CPU): the blur as ``torch.nn.functional.conv2d`` after replicate padding, both
  as one 3x3 kernel and as two separable (1x3, 3x1) passes, and as shifted-slice adds (what
  numpy does); the bilateral grid as the same algorithm written with tensor ops
  (``index_add_`` / ``bincount`` scatter into the grid, slice-add blurs, ``grid_sample``
  trilinear slicing).

Every output is checked against the numpy result before timing. Cases are alternated per
repeat (``core_ad.benchmark.compare``); the figure is the median. Goal (project issue 4): halide_ad within
1.5x of Halide 21 and faster than torch CPU.

Run from the repository root (Halide 21 is optional: its column is skipped when ``import halide``
fails; likewise torch and halide_ad):

    pip install -e "packages/halide-ad[bench]"      # or: pip install halide==21.0.0 torch numpy
    python packages/halide-ad/benchmarks/bench_pipelines.py [--size 4096] [--repeats 5]
"""
from __future__ import annotations

import argparse
import importlib
import os

import numpy as np
from core_ad import benchmark as bench


def import_or_note(name, notes):
    try:
        return importlib.import_module(name)
    except Exception as err:  # noqa: BLE001
        notes.append(f"{name} not importable, its column is skipped ({bench.error_reason(err)})")
        return None


# ----------------------------------------------------------------------------- torch
def torch_blur_3x3(torch, t):
    F = torch.nn.functional
    k = torch.tensor([1.0, 2.0, 1.0]) / 4
    w = (k[:, None] * k[None, :]).reshape(1, 1, 3, 3)
    return lambda: F.conv2d(F.pad(t[None, None], (1, 1, 1, 1), mode="replicate"), w)[0, 0]


def torch_blur_separable(torch, t):
    F = torch.nn.functional
    k = torch.tensor([1.0, 2.0, 1.0]) / 4
    wx, wy = k.reshape(1, 1, 1, 3), k.reshape(1, 1, 3, 1)
    return lambda: F.conv2d(F.conv2d(F.pad(t[None, None], (1, 1, 1, 1), mode="replicate"),
                                     wx), wy)[0, 0]


def torch_bilateral_grid(torch, t, s_sigma=8, r_sigma=0.1):
    """The bilateral_grid app's algorithm in torch ops (float32): the cells' samples are a
    crop of the replicate-padded image, ``index_add_`` / ``bincount`` scatter them into the
    grid, slice-adds blur it, and ``grid_sample`` (trilinear, align_corners=True) slices it."""
    F = torch.nn.functional
    h, w = t.shape
    s = int(s_sigma)
    inv_r = float(np.float32(1.0 / r_sigma))
    nz = int(1.0 * inv_r + 0.5) + 1
    mx, my = (w - 1) // s + 1, (h - 1) // s + 1
    ncx, ncy = mx + 5, my + 5                    # cells -2 .. m + 2
    # cell c gathers pixels c*s - s//2 .. c*s + s - 1 - s//2 (edge-clamped): pad, then crop
    left, top = 2 * s + s // 2, 2 * s + s // 2
    right, bottom = ncx * s - left - w, ncy * s - top - h
    zpad, nzt = 2, nz + 5
    size = ncy * ncx * nzt
    cell = ((torch.arange(ncy).repeat_interleave(s)[:, None] * ncx
             + torch.arange(ncx).repeat_interleave(s)[None, :]) * nzt + zpad)
    # slicing at (x / s, y / s, val / r_sigma) in the blurred grid's coordinates, normalised
    gxn = (torch.arange(w, dtype=torch.float64) / s / mx * 2 - 1).to(torch.float32)
    gyn = (torch.arange(h, dtype=torch.float64) / s / my * 2 - 1).to(torch.float32)
    zscale = inv_r / nz * 2

    def blur(a, dim):
        n = a.shape[dim] - 4
        p = [a.narrow(dim, k, n) for k in range(5)]
        return p[0] + 4 * p[1] + 6 * p[2] + 4 * p[3] + p[4]

    def run():
        v = F.pad(t[None, None], (left, right, top, bottom), mode="replicate")[0, 0]
        v = v.clamp(0, 1)                                           # (ncy*s, ncx*s)
        lin = (cell + (v * inv_r + 0.5).to(torch.int64)).reshape(-1)
        gv = torch.zeros(size).index_add_(0, lin, v.reshape(-1))
        gw = torch.bincount(lin, minlength=size).to(torch.float32)
        g = torch.stack([gv, gw]).reshape(2, ncy, ncx, nzt)
        b = blur(blur(blur(g, 3), 2), 1)                            # (2, my+1, mx+1, nz+1)
        zn = t.clamp(0, 1) * zscale - 1
        grid = torch.stack([zn, gxn.expand(h, w), gyn[:, None].expand(h, w)], -1)
        out = F.grid_sample(b[None], grid[None, :, :, None, :], mode="bilinear",
                            padding_mode="border", align_corners=True)[0, :, :, :, 0]
        return out[0] / out[1]
    return run


def torch_blur_slices(torch, t):
    F = torch.nn.functional

    def run():
        p = F.pad(t[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
        bx = (p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]) * 0.25
        return (bx[:-2] + 2 * bx[1:-1] + bx[2:]) * 0.25
    return run


# ----------------------------------------------------------------------------- driver
def halide_case(hl, mod, img, kw, tile, vec, label, first, notes):
    """(realize callable) for one Halide-like module, compiled once; None on failure."""
    try:
        app = mod.build(hl, img, **kw)
        mod.schedule(app, "tiled", tile=tile, vec=vec)
        out = app.output
        sizes = list(next(iter(app.sizes.values())))
        first[label], _ = bench.time_first_call(out.compile_jit)
        def fn():
            return out.realize(sizes)
        fn.app = app  # keep the input buffers alive
        return fn
    except Exception as err:  # noqa: BLE001 - report, skip the column
        notes.append(f"{label} failed ({bench.error_reason(err)}); skipped")
        return None


def bench_pipeline(title, cases, first, ref, repeats, tol):
    checked = {}
    for name, fn in cases.items():
        d = bench.max_rel_diff(bench.to_numpy(fn()), ref)
        checked[name] = d
        if d > tol:
            print(f"  {name}: max rel diff vs numpy {d:.2e} > {tol:g}: not timed")
    cases = {k: v for k, v in cases.items() if checked[k] <= tol}
    res = bench.compare(cases, repeats=repeats, warmup=1)
    med = {k: v["median"] for k, v in res.items()}
    ours = med.get("halide_ad")
    hal = med.get("Halide 21 (JIT)")
    columns = {"max rel diff vs numpy": {k: f"{checked[k]:.1e}" for k in med}}
    if hal:
        columns["this / Halide 21"] = {k: f"{v / hal:.2f}" for k, v in med.items()}
    if ours:
        bench.side_by_side(res, "halide_ad", first_calls=first, columns=columns, title=title)
    else:
        bench.report_runs(res)
    print(bench.load_note("on average during the timed runs", bench.compare.other_load))
    if ours:
        torch_best = min((v for k, v in med.items() if k.startswith("torch")), default=None)
        goal = []
        if hal:
            goal.append(f"halide_ad / Halide 21 = {ours / hal:.2f} (goal <= 1.5)")
        if torch_best:
            goal.append(f"halide_ad / best torch = {ours / torch_best:.2f} (goal < 1)")
        print("goal    : " + "; ".join(goal))
    print()
    return med


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="image side (default 4096)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tile", type=int, nargs=2, default=(256, 32),
                   help="tile of the 'tiled' schedule (default 256 32)")
    p.add_argument("--vec", type=int, default=8, help="vector width (default 8: AVX2 floats)")
    p.add_argument("--only", choices=("blur", "bilateral_grid", "gamma_rgb", "upsample_rgb"),
                   default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for Halide 21 / halide_ad (HL_NUM_THREADS) and torch "
                        "(set_num_threads); default: the libraries' defaults (all cores)")
    args = p.parse_args()
    notes = []
    if args.threads:
        os.environ["HL_NUM_THREADS"] = str(args.threads)   # read when the pool starts
    from halide_ad import apps

    hl_ad = import_or_note("halide_ad", notes)
    hl_21 = import_or_note("halide", notes)
    torch = import_or_note("torch", notes)
    if torch is not None and args.threads:
        torch.set_num_threads(args.threads)
    n = args.size
    square = np.random.default_rng(0).random((n, n), dtype=np.float32)
    tile, vec = tuple(args.tile), args.vec
    print(f"bench_pipelines: {n} x {n} float32, 'tiled' schedule tile={tile} vec={vec}, "
          f"median of {args.repeats}")
    try:
        from importlib.metadata import version
        hver = version("halide") if hl_21 is not None else "not imported"
    except Exception:  # noqa: BLE001
        hver = "?"
    extra = ("threads : Halide 21 / halide_ad thread pools: HL_NUM_THREADS="
             f"{os.environ.get('HL_NUM_THREADS', 'unset (all cores)')}; numpy single-threaded")
    if hl_21 is not None:
        extra = (f"halide  : {hver} (PyPI), JIT target "
                 f"{hl_21.get_jit_target_from_environment()}\n" + extra)
    print(bench.machine_info(extra, modules=("numpy", "halide_ad", "torch")))

    rgb = np.random.default_rng(1).random((3, n // 2, n // 2), dtype=np.float32)
    pipelines = [
        ("blur", apps.blur, {}, 1e-6),
        ("bilateral_grid", apps.bilateral_grid, {"s_sigma": 8, "r_sigma": 0.1}, 1e-4),
        ("gamma_rgb", apps.gamma, {"gamma": 2.2}, 1e-5),
        ("upsample_rgb", apps.upsample, {"factor": 2}, 1e-5),
    ]
    numpy_versions = {
        "gamma_rgb": lambda: np.power(np.maximum(rgb, np.float32(0)), np.float32(2.2)),
        "upsample_rgb": lambda: apps.upsample.reference(rgb, factor=2),  # float64
    }
    for name, mod, kw, tol in pipelines:
        if args.only and args.only != name:
            continue
        img = rgb if name in numpy_versions else square
        first, cases = {}, {}
        for hl, label in ((hl_ad, "halide_ad"), (hl_21, "Halide 21 (JIT)")):
            if hl is not None:
                fn = halide_case(hl, mod, img, kw, tile, vec, label, first, notes)
                if fn is not None:
                    cases[label] = fn
        cases["numpy"] = numpy_versions.get(name) or (
            lambda mod=mod, kw=kw, img=img: mod.reference(img, dtype=np.float32, **kw))
        if torch is not None:
            t = torch.from_numpy(img)
            if name == "blur":
                cases["torch conv2d 3x3"] = torch_blur_3x3(torch, t)
                cases["torch conv2d 1x3+3x1"] = torch_blur_separable(torch, t)
                cases["torch shifted slices"] = torch_blur_slices(torch, t)
            elif name == "bilateral_grid":
                cases["torch (index_add_, grid_sample)"] = torch_bilateral_grid(torch, t, **kw)
            elif name == "gamma_rgb":
                cases["torch (clamp, pow)"] = lambda t=t: t.clamp(min=0).pow(2.2)
            else:
                up = torch.nn.functional.interpolate
                cases["torch (interpolate, bilinear)"] = lambda t=t: up(
                    t[None], scale_factor=2, mode="bilinear")[0]
        ref = cases["numpy"]()
        title = (f"{name}: {' x '.join(map(str, img.shape))} float32" +
                 (" (" + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")" if kw else ""))
        bench_pipeline(title, cases, first, ref, args.repeats, tol)
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
