"""AE-9, the headline experiment, at equal wall-clock: PSSMLT, MMLT and H2MC on the glossy ring
(Fig 6-2 analog), the diffuse torus in a rough-glass cube (Fig 6-7 analog) and the glossy
Cornell box; median relMSE over seeds
against a long PSSMLT reference (the thesis' references are PSSMLT renders), mutations per
pixel of each, and a PNG with the images and their error maps side by side.

The spec's sizes (128x128, paths up to 7 segments, minutes per method) are the defaults of
``--full``; the default run is smaller (64x64, up to 5 segments, 20 s per method and seed) so
that it finishes in about half an hour on two cores. Kernels are compiled before the clock.

    .venv/bin/python packages/h2mc/benchmarks/bench_equal_time.py [--scenes ring torus]
        [--size 64] [--max-length 5] [--seconds 20] [--seeds 3] [--ref-factor 20] [--out DIR]
        [--parameterization kelemen|modified] [--lens-prob 0.3] [--no-light-coordinates]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import h2mc
from edge_rt import scenes
from h2mc.render import render

SCENES = {"ring": "ring_scene", "torus": "torus_glass_cube", "glossy_cornell": "glossy_cornell"}
METHODS = ("pssmlt", "mmlt", "h2mc")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", nargs="+", choices=list(SCENES), default=list(SCENES))
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0, help="per method and seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ref-factor", type=float, default=20.0,
                    help="reference time = this x --seconds (PSSMLT)")
    ap.add_argument("--sigma2", type=float, default=1e-3, help="H2MC prior variance")
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--full", action="store_true", help="the spec's 128x128, length 7, 120 s")
    ap.add_argument("--parameterization", choices=("kelemen", "modified"), default="kelemen",
                    help="H2MC's small steps in Kelemen's coordinates or the thesis' modified "
                    "ones (MMLT and PSSMLT stay in Kelemen's)")
    ap.add_argument("--lens-prob", type=float, default=0.3,
                    help="modified: H2 lens perturbation probability (0 turns it off)")
    ap.add_argument("--no-light-coordinates", action="store_true",
                    help="modified: without the light-coordinate substitution")
    ap.add_argument("--out", default="outputs/h2mc-equal-time")
    args = ap.parse_args(argv)
    if args.full:
        args.size, args.max_length, args.seconds = 128, 7, 120.0
    os.makedirs(args.out, exist_ok=True)
    for name in args.scenes:
        scene = getattr(scenes, SCENES[name])((args.size, args.size))
        t0 = time.perf_counter()
        ref, *_ = render(scene, "pssmlt", seconds=args.seconds * args.ref_factor,
                         max_length=args.max_length, seed=10_000, chains=args.chains)
        print(f"{name}: reference (PSSMLT, {args.seconds * args.ref_factor:.0f} s) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        rows, images = [], {}
        for method in METHODS:
            errs, mpps, accs = [], [], []
            modified = {} if method != "h2mc" else dict(
                parameterization=args.parameterization, lens_perturb_prob=args.lens_prob,
                light_coordinates=not args.no_light_coordinates)
            for s in range(args.seeds):
                image, stats, mutations, _ = render(
                    scene, method, seconds=args.seconds, max_length=args.max_length, seed=s,
                    chains=args.chains, sigma2=args.sigma2, **modified)
                errs.append(h2mc.rel_mse(image, ref))
                mpps.append(mutations / (args.size * args.size))
                accs.append({k: v.acceptance for k, v in stats.items()})
                images.setdefault(method, image)
            rows.append((method, float(np.median(errs)), errs, float(np.median(mpps)), accs[0]))
            print(f"  {method}: median relMSE {np.median(errs):.3e} "
                  f"({', '.join(f'{e:.2e}' for e in errs)}), {np.median(mpps):.0f} mutations/px, "
                  f"acceptance {', '.join(f'{k} {v:.2f}' for k, v in accs[0].items())}",
                  flush=True)
        med = {m: e for m, e, *_ in rows}
        print(f"| {name} {args.size}x{args.size}, <= {args.max_length} segments, "
              f"{args.seconds:g} s | PSSMLT | MMLT | H2MC | MMLT / H2MC (goal >= 1.5) |")
        print("|---|---|---|---|---|")
        print(f"| median relMSE | {med['pssmlt']:.3e} | {med['mmlt']:.3e} | {med['h2mc']:.3e} | "
              f"{med['mmlt'] / med['h2mc']:.2f}x |")
        print("| mutations / pixel | " + " | ".join(f"{r[3]:.0f}" for r in rows) + " | |")
        _figure(os.path.join(args.out, f"{name}.png"), name, ref, images, med)


def _figure(path, name, ref, images, med):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from edge_rt.imageio import to_srgb8

    fig, axes = plt.subplots(2, 1 + len(images), figsize=(3 * (1 + len(images)), 6.2))
    axes[0, 0].imshow(to_srgb8(ref))
    axes[0, 0].set_title("reference (PSSMLT)", fontsize=9)
    axes[1, 0].axis("off")
    for k, (method, image) in enumerate(images.items(), start=1):
        axes[0, k].imshow(to_srgb8(image))
        axes[0, k].set_title(f"{method} (median relMSE {med[method]:.2e})", fontsize=9)
        err = ((image - ref) ** 2 / (ref ** 2 + 1e-2)).mean(axis=-1)
        axes[1, k].imshow(err, cmap="inferno", vmin=0, vmax=np.percentile(err, 99))
        axes[1, k].set_title("relative squared error", fontsize=9)
    for a in axes.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"AE-9 analog, {name}: equal time")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"  wrote {path}")


if __name__ == "__main__":
    main()
