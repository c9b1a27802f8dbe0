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
        [--parameterization modified [kelemen]] [--lens-prob 0.3 0] [--lens-sigma 0.01]
        [--no-light-coordinates]
        [--baseline-steps kelemen [isotropic]] [--isotropic-sigma 0.01] [--large-step-prob 0.3]
        [--mixing-step isotropic [kelemen]] [--mixing-sigma 0.01] [--bootstrap N [N ...]]
        [--direct-spp 64] [--clock cpu|wall] [--reference-only | --wait-reference]
        [--bidirectional]

By default H2MC runs in the thesis' modified coordinates twice: with the spec's lens
perturbation probability 0.3 (its "full" H2MC) and without it (the configuration that met the
goal on both scenes); PSSMLT and MMLT run in Kelemen's coordinates, with Kelemen's
exponential small steps and / or (``--baseline-steps isotropic``) the reference renderer's
isotropic Gaussian of std-dev ``--isotropic-sigma`` (spec 1.6's perturbStdDev, 0.01), which is
what the spec's AE-9 names; "below both baselines" means below the better of each. H2MC's
uniform-mixing step (probability 0.2 within its small steps) is the same isotropic Gaussian
(``--mixing-sigma``, spec 1.6), or Kelemen's (``--mixing-step kelemen``).

``--bidirectional`` adds each row again over every BDPT technique (light subpaths, PathSpace's
``bidirectional``; rows "... bdpt"), lens perturbation and light coordinates as in the
unidirectional rows.

Equal time is equal CPU time of one thread by default (``--clock cpu``): on a machine shared
with other work, wall clock would charge each method for its neighbours' load.
The reference is kept in ``--out`` and reused by later runs of the same scene, size and length
(when it was at least as long, with a ``REFERENCE_BOOTSTRAP``-sample bootstrap).
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np

import h2mc
from core_ad import benchmark as bench
from edge_rt import scenes
from h2mc.render import _variance_or_auto, path_space_for, render

SCENES = {"ring": "ring_scene", "torus": "torus_glass_cube", "glossy_cornell": "glossy_cornell"}
# H2MC prior variance per scene, for 50-70% small-step acceptance (spec 4.5; measured at 32x32,
# paths up to 5 segments: ring 0.52 at 1e-3, torus 0.49 at 1e-4 and 0.26 at 1e-3)
SIGMA2 = {"ring": 1e-3, "torus": 1e-4, "glossy_cornell": 1e-3}
# The reference's bootstrap: its b scales the reference, the yardstick of every method's
# relMSE, so its error must be well below theirs (2^22 states: ~20 s of its 1200). A kept
# reference with a smaller one (before 2026-11-28, 2^16: b 3-7 % low) is rendered again.
REFERENCE_BOOTSTRAP = 1 << 22


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", nargs="+", choices=list(SCENES), default=list(SCENES))
    ap.add_argument("--size", type=int, help="image side (default 64; --full: 128)")
    ap.add_argument("--max-length", type=int, help="path segments (default 5; --full: 7)")
    ap.add_argument("--seconds", type=float,
                    help="per method and seed (default 20; --full: 120)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ref-factor", type=float, default=20.0,
                    help="reference time = this x --seconds (PSSMLT)")
    ap.add_argument("--sigma2", type=_variance_or_auto,
                    help="H2MC prior variance, or 'auto' (render_mlt's pilot runs; default: "
                    "SIGMA2's)")
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--bootstrap", type=int, nargs="+", default=[None],
                    help="bootstrap samples of every method's renders (default: render_mlt's; "
                    "several: one row per method and count)")
    ap.add_argument("--full", action="store_true",
                    help="the spec's 128x128, length 7, 120 s, where not given")
    ap.add_argument("--parameterization", nargs="+", choices=("kelemen", "modified"),
                    default=["modified"],
                    help="H2MC's small steps in Kelemen's coordinates and / or the thesis' "
                    "modified ones (one H2MC row each; MMLT and PSSMLT stay in Kelemen's)")
    ap.add_argument("--lens-prob", type=float, nargs="+", default=[0.3, 0.0],
                    help="modified: H2 lens perturbation probability (0 turns it off); "
                    "several: one H2MC row each")
    ap.add_argument("--lens-sigma", type=float, nargs="+", default=[0.01],
                    help="modified: the H2 lens steps' prior std-dev in screen units (spec: "
                    "0.01, the thesis' torus 0.02); several: one H2MC row each")
    ap.add_argument("--baseline-steps", nargs="+", choices=("kelemen", "isotropic"),
                    default=["kelemen"],
                    help="PSSMLT's and MMLT's small steps: Kelemen's exponential perturbation "
                    "and / or the isotropic Gaussian (one row each)")
    ap.add_argument("--isotropic-sigma", type=float, default=0.01,
                    help="std-dev of the baselines' isotropic small steps (spec: 0.01)")
    ap.add_argument("--mixing-step", nargs="+", choices=h2mc.MIXING_STEPS,
                    default=["isotropic"],
                    help="H2MC's uniform-mixing step(s), one H2MC row each (spec 1.6: isotropic)")
    ap.add_argument("--mixing-sigma", type=float, default=0.01,
                    help="std-dev of H2MC's isotropic mixing step (spec 1.6's perturbStdDev)")
    ap.add_argument("--large-step-prob", type=float, default=0.3,
                    help="every method's large-step probability (spec 1.6: 0.3; the reference "
                    "renderer's torus scene 0.5)")
    ap.add_argument("--technique-gibbs", type=float, nargs="+", default=[0.0],
                    help="MMLT's Gibbs step on the technique (render_mlt's technique_gibbs; "
                         "0: the spec's MMLT); several: one MMLT row each")
    ap.add_argument("--technique-swap", type=float, nargs="+", default=[0.0],
                    help="modified H2MC: the HIT <-> NEE technique swap's probability "
                         "(render_mlt's technique_swap; 0: none); several: one H2MC row each")
    ap.add_argument("--no-light-coordinates", action="store_true",
                    help="modified: without the light-coordinate substitution")
    ap.add_argument("--direct-spp", type=int, default=64,
                    help="path-traced direct lighting, outside the clock (the reference: "
                    "this x --ref-factor): its noise is common to the three methods")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="the budget's clock: this process's CPU time (default; equal time on a "
                    "machine shared with other work, one thread) or wall clock")
    ap.add_argument("--reference-only", action="store_true",
                    help="compute (and keep in --out) the references only")
    ap.add_argument("--wait-reference", action="store_true",
                    help="render the methods first, then wait for the reference that a "
                    "--reference-only run (started beside this one) keeps in --out")
    ap.add_argument("--bidirectional", action="store_true",
                    help="also every row over all BDPT techniques")
    ap.add_argument("--out", default="outputs/h2mc-equal-time")
    args = ap.parse_args(argv)
    # --full fills in the spec's sizes; an explicit --size / --max-length / --seconds wins
    for name, small, spec in (("size", 64, 128), ("max_length", 5, 7), ("seconds", 20.0, 120.0)):
        if getattr(args, name) is None:
            setattr(args, name, spec if args.full else small)
    os.makedirs(args.out, exist_ok=True)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.clock == "cpu":  # one thread: CPU time is then the time of a dedicated core
        import torch

        os.environ["CORE_AD_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    # the cost ratios between methods differ by CPU (the torus' H2MC / PSSMLT cost per
    # mutation: 4.1x on an Intel Xeon, 2.8-3.0x on an AMD EPYC), so every log names its machine
    print(bench.machine_info(modules=("numpy", "core_ad", "torch", "h2mc")), flush=True)
    for name in args.scenes:
        scene = getattr(scenes, SCENES[name])((args.size, args.size))
        ref_seconds = args.seconds * args.ref_factor
        cached = os.path.join(args.out, f"{name}_{args.size}_L{args.max_length}_reference.npz")
        ref = _kept_reference(cached, ref_seconds)
        if ref is None and not args.wait_reference:
            t0 = time.perf_counter()
            ref, *_ = render(scene, "pssmlt", seconds=ref_seconds, max_length=args.max_length,
                             seed=10_000, chains=args.chains, clock=clock,
                             direct_spp=int(args.direct_spp * args.ref_factor),
                             bootstrap_samples=REFERENCE_BOOTSTRAP)
            tmp = f"{cached}.{os.getpid()}.npz"  # atomic: a --wait-reference run polls for it
            np.savez(tmp, image=ref, seconds=ref_seconds, bootstrap=REFERENCE_BOOTSTRAP)
            os.replace(tmp, cached)
            print(f"{name}: reference (PSSMLT, {ref_seconds:.0f} s) in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        if args.reference_only:
            continue
        rows, images = [], {}
        runs = []
        for step in args.baseline_steps:
            kw = {} if step == "kelemen" else dict(small_step="isotropic",
                                                   sigma2=args.isotropic_sigma ** 2)
            suffix = "" if step == "kelemen" else " isotropic"
            runs.append(("pssmlt" + suffix, "pssmlt", kw))
            runs += [("mmlt" + suffix + (f" gibbs {g:g}" if args.technique_gibbs != [0.0] else ""),
                      "mmlt", {**kw, "technique_gibbs": g}) for g in args.technique_gibbs]
        for p in args.parameterization:
            for lens in args.lens_prob if p == "modified" else args.lens_prob[:1]:
                sigmas = args.lens_sigma if p == "modified" and lens > 0 else args.lens_sigma[:1]
                swaps = args.technique_swap if p == "modified" else [0.0]
                for sigma, mixing, swap in itertools.product(sigmas, args.mixing_step, swaps):
                    label = "h2mc" if p == "kelemen" else "h2mc-modified"
                    if p == "modified" and len(args.lens_prob) > 1:
                        label += f" lens {lens:g}"
                    if len(sigmas) > 1:
                        label += f" sigma {sigma:g}"
                    if len(args.mixing_step) > 1:
                        label += f" mixing {mixing}"
                    if len(swaps) > 1:
                        label += f" swap {swap:g}"
                    runs.append((label, "h2mc", dict(
                        parameterization=p, lens_perturb_prob=lens, lens_sigma2=sigma * sigma,
                        light_coordinates=not args.no_light_coordinates, mixing_step=mixing,
                        mixing_sigma2=args.mixing_sigma ** 2, technique_swap=swap)))
        runs = [(label + (f" boot {n}" if len(args.bootstrap) > 1 else ""), method,
                 {**kw, "bootstrap_samples": n})
                for n in args.bootstrap for label, method, kw in runs]
        if args.bidirectional:
            runs += [(label + " bdpt", method, {**kw, "bidirectional": True})
                     for label, method, kw in runs]
        spaces = {}  # one compiled PathSpace per parameterisation, shared by the seeds

        def space_key(kw):
            return kw.get("parameterization", "kelemen"), kw.get("bidirectional", False)

        for label, method, modified in runs:
            p, bidirectional = key = space_key(modified)
            if key not in spaces:
                spaces[key] = path_space_for(
                    scene, args.max_length, p,
                    light_coordinates=modified.get("light_coordinates", True),
                    bidirectional=bidirectional)
            t0, c0 = time.perf_counter(), time.process_time()
            spaces[key].compile_kernels(derivatives=method == "h2mc",
                                        lens=p == "modified" and modified["lens_perturb_prob"] > 0)
            print(f"  {label}: kernels ready in {time.process_time() - c0:.0f} s CPU, "
                  f"{time.perf_counter() - t0:.0f} s wall (load {os.getloadavg()[0]:.1f})",
                  flush=True)
        results = {label: ([], [], [], []) for label, *_ in runs}
        renders = []
        # seeds outside, methods inside: a change of load during the run weighs on every
        # method alike
        for s in range(args.seeds):
            for label, method, modified in runs:
                _, mpps, accs, costs = results[label]
                sigma2 = SIGMA2[name] if args.sigma2 is None or (
                    args.sigma2 == "auto" and method != "h2mc") else args.sigma2
                image, stats, mutations, seconds, sigma2 = render(
                    scene, method, seconds=args.seconds, max_length=args.max_length, seed=s,
                    chains=args.chains, direct_spp=args.direct_spp,
                    path_space=spaces[space_key(modified)],
                    clock=clock, large_step_prob=args.large_step_prob,
                    **{"sigma2": sigma2, **modified})
                mpps.append(mutations / (args.size * args.size))
                accs.append({k: v.acceptance for k, v in stats.items()})
                costs.append(seconds / mutations)
                renders.append((s, label, image))
                print(f"  seed {s} {label}: {mpps[-1]:.0f} mutations/px, "
                      f"{1e6 * costs[-1]:.2f} us/mutation (load {os.getloadavg()[0]:.1f})"
                      + (f", sigma2 {sigma2:.3g}" if method == "h2mc" else ""), flush=True)
        while ref is None:  # --wait-reference: another process is computing it
            time.sleep(30)
            ref = _kept_reference(cached, ref_seconds)
        for s, label, image in renders:
            results[label][0].append(h2mc.rel_mse(image, ref))
            images.setdefault(label, image)
            print(f"  seed {s} {label}: relMSE {results[label][0][-1]:.3e}", flush=True)
        for label, (errs, mpps, accs, costs) in results.items():
            acc = {k: float(np.median([a[k] for a in accs])) for k in accs[0]}
            rows.append((label, float(np.median(errs)), errs, float(np.median(mpps)), acc))
            print(f"  {label}: median relMSE {np.median(errs):.3e} "
                  f"({', '.join(f'{e:.2e}' for e in errs)}), {np.median(mpps):.0f} mutations/px "
                  f"({', '.join(f'{m:.0f}' for m in mpps)}), {1e6 * np.median(costs):.2f} "
                  f"us/mutation, median acceptance "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in acc.items())}", flush=True)
        med = {m: e for m, e, *_ in rows}
        h2 = [m for m in med if m.startswith("h2mc")]

        def boot(label):  # several --bootstrap counts: rows compare within one count
            return label.rsplit(" boot ", 1)[-1] if " boot " in label else ""

        # the better row of each baseline (Kelemen's or isotropic small steps) per count
        best = {m: {b: min(e for r, e in med.items()
                           if r.split()[0] == b and boot(r) == boot(m))
                    for b in ("pssmlt", "mmlt")} for m in h2}
        print(f"| {name} {args.size}x{args.size}, <= {args.max_length} segments, "
              f"{args.seconds:g} s | " + " | ".join(med) + " | "
              + " | ".join(f"MMLT / {m} (goal >= 1.5)" for m in h2) + " |")
        print("|---" * (1 + len(med) + len(h2)) + "|")
        print("| median relMSE | " + " | ".join(f"{e:.3e}" for e in med.values()) + " | "
              + " | ".join(f"{best[m]['mmlt'] / med[m]:.2f}x" for m in h2) + " |")
        print("| mutations / pixel | " + " | ".join(f"{r[3]:.0f}" for r in rows) + " |"
              + " |" * len(h2))
        for m in h2:
            print(f"  {m}: median relMSE "
                  f"{'below' if med[m] < min(best[m].values()) else 'not below'} both "
                  f"baselines' (PSSMLT {best[m]['pssmlt']:.3e}, MMLT {best[m]['mmlt']:.3e})")
        _figure(os.path.join(args.out, f"{name}_{args.size}.png"), name, ref, images, med)


def _kept_reference(path, seconds):
    """The reference image kept in ``path`` by an earlier run at least ``seconds`` long with a
    bootstrap of at least REFERENCE_BOOTSTRAP states, or None."""
    try:
        kept = np.load(path)
        ok = float(kept["seconds"]) >= seconds and int(kept["bootstrap"]) >= REFERENCE_BOOTSTRAP
        return kept["image"] if ok else None
    except (OSError, ValueError, KeyError):
        return None


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
        axes[0, k].set_title(f"{method}\nmedian relMSE {med[method]:.2e}", fontsize=9)
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
