"""Render an edge_rt scene by MLT from the command line::

    python -m h2mc.render cornell_box --method h2mc --time 60 --size 64 64 --out out/

SCENE is a built-in scene name or a JSON scene dict (``edge_rt.from_dict``). ``--time``
runs the chains until the wall-clock budget (after compiling the kernels) is spent;
``--mutations`` runs them for that many mutations per pixel. Writes ``<scene>_<method>.exr``
(linear) and ``.png`` (clamped to [0, 1], gamma 2.2) and prints acceptance per mutation type,
mutations per second and mutations per pixel. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import edge_rt
from edge_rt import SceneError, scenes

from ._mlt import (BOOTSTRAP_MIN, BOOTSTRAP_SAMPLES, BOOTSTRAP_SHARE, METHODS, TIME_MODES,
                   MLTError, render_mlt)
from ._pathspace import PathSpace, PathSpaceError
from ._png import write_png

BUILTIN = {"cornell_box": scenes.cornell_box, "glossy_cornell": scenes.glossy_cornell,
           "ring_scene": scenes.ring_scene, "torus_glass_cube": scenes.torus_glass_cube,
           "textured_sphere": scenes.textured_sphere,
           "closed_cube": scenes.closed_cube, "teapot_scene": scenes.teapot_scene}


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage + error
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser():
    intro, example = __doc__.split("\n\n")[:2]  # "... command line::" and its example
    p = _Parser(prog="h2mc-render", description=intro.rstrip(":") + ".",
                epilog=f"example:\n{example}", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scene", help=f"built-in ({', '.join(BUILTIN)}) or a JSON scene file")
    p.add_argument("--method", required=True,
                   help="h2mc (H2MC small steps, resampling large step), mmlt (Kelemen small "
                   "steps, MMLT large step) or pssmlt (Kelemen small steps and state)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--time", type=float, help="wall-clock budget in seconds")
    budget.add_argument("--mutations", type=float,
                        help="mutations per pixel (default 64 unless --time)")
    p.add_argument("--size", type=int, nargs=2, metavar=("W", "H"),
                   help="image size (default: the scene's camera)")
    p.add_argument("--max-length", type=int, default=3,
                   help="longest path in segments (>= 3; default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chains", type=int, default=1024)
    p.add_argument("--sigma2", type=_variance_or_auto, default=1e-3,
                   help="H2MC prior variance (tune for 50-70%% small-step acceptance), or "
                   "'auto': chosen by short pilot runs (h2mc)")
    p.add_argument("--bootstrap", type=int,
                   help="independent samples estimating b and seeding the chains (default: "
                   f"as many as the mutations, {BOOTSTRAP_MIN}-{BOOTSTRAP_SAMPLES}; with "
                   f"--time up to {BOOTSTRAP_SAMPLES} while they take < "
                   f"{BOOTSTRAP_SHARE * 100:g}%% of it)")
    p.add_argument("--direct-spp", type=int, default=16,
                   help="edge_rt path-tracer samples per pixel for direct lighting")
    p.add_argument("--time-mode", choices=TIME_MODES, default="hessian",
                   help="moving scenes: hessian (time in the H2MC Gaussian, the thesis) or "
                   "independent (time perturbed by the prior's kick alone)")
    p.add_argument("--parameterization", choices=("kelemen", "modified"), default="kelemen",
                   help="h2mc / mmlt small steps in Kelemen's primary samples (default) or in "
                   "the thesis' modified coordinates (absolute directions on rough vertices, "
                   "light coordinates, the H2 lens perturbation)")
    p.add_argument("--roughness-threshold", type=float, default=0.03,
                   help="modified coordinates: vertices rougher than this are absolute")
    p.add_argument("--no-light-coordinates", action="store_true",
                   help="modified coordinates without the light-coordinate substitution")
    p.add_argument("--lens-prob", type=float, default=0.3,
                   help="modified coordinates, h2mc: probability of an H2 lens perturbation "
                   "within a small step (0 disables; default 0.3)")
    p.add_argument("--bidirectional", action="store_true",
                   help="every bidirectional technique (light subpaths connected to camera "
                   "subpaths, MIS over all; rough glass included) instead of "
                   "the unidirectional two (BSDF hit, light sample)")
    p.add_argument("--out", default=".", help="output folder (default: .)")
    return p


def _variance_or_auto(text):
    """``--sigma2``: ``"auto"`` or a positive finite variance."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = None
    if not (value is not None and 0.0 < value < np.inf):
        raise argparse.ArgumentTypeError(f"need 'auto' or a positive variance, got {text!r}")
    return value


def load_scene(name, size):
    """``(scene, stem)`` for a built-in name or a JSON file; ``size``: (W, H) or None."""
    if size is not None and (size[0] < 1 or size[1] < 1):
        raise UsageError(f"bad --size {size[0]} {size[1]}: width and height must be positive")
    if name in BUILTIN:
        return BUILTIN[name](*([tuple(size)] if size else [])), name
    path = Path(name)
    if path.suffix.lower() != ".json" or not path.is_file():
        raise UsageError(f"unknown scene {name!r}: not a built-in ({', '.join(BUILTIN)}) "
                         "nor an existing .json file")
    try:
        d = json.loads(path.read_text())
        if size is not None:
            d.setdefault("camera", {})["resolution"] = list(size)
        for m in d.get("meshes", []):  # mesh files relative to the JSON file
            if "file" in m:
                m["file"] = str(path.parent / m["file"])
        return edge_rt.from_dict(d), path.stem
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SceneError) as e:
        raise UsageError(f"bad scene file {name}: {e}") from e


def path_space_for(scene, max_length=3, parameterization="kelemen",
                   roughness_threshold=0.03, light_coordinates=True, bidirectional=False):
    """The PathSpace that :func:`render` builds for these settings: pass it back as
    ``render(..., path_space=)`` to render one scene several times (an equal-time
    comparison's seeds) with its kernels compiled once."""
    modified = parameterization == "modified"
    return PathSpace(scene, max_length=max_length,
                     roughness_threshold=roughness_threshold if modified else None,
                     light_coordinates=modified and light_coordinates,
                     bidirectional=bidirectional)


def render(scene, method, *, seconds=None, mutations_per_pixel=None, max_length=3,
           seed=0, chains=1024, sigma2=1e-3, direct_spp=16, time_mode="hessian",
           parameterization="kelemen", roughness_threshold=0.03, light_coordinates=True,
           lens_perturb_prob=0.3, lens_sigma2=1e-4, path_space=None, clock=time.perf_counter,
           small_step=None, large_step_prob=0.3, mixing_step="isotropic", mixing_sigma2=None,
           bootstrap_samples=None, technique_gibbs=0.0, technique_swap=0.0,
           bidirectional=None):
    """``(image, stats, mutations, chain_seconds, sigma2)`` of ``method`` (a render_mlt method:
    pssmlt, mmlt, h2mc): ``mutations_per_pixel``, or chains run until ``seconds`` of wall
    clock (after compiling the kernels) are spent; ``small_step``: render_mlt's override of
    the method's (``"isotropic"``: the reference renderer's Gaussian of variance ``sigma2``);
    ``large_step_prob``: render_mlt's (spec 1.6: 0.3, the thesis' torus 0.5);
    ``mixing_step``, ``mixing_sigma2``: render_mlt's (H2MC's uniform mixing);
    ``bootstrap_samples``: render_mlt's (b and the chains' seeds);
    ``technique_gibbs``: render_mlt's (MMLT in Kelemen's coordinates);
    ``technique_swap``: render_mlt's (modified coordinates with light coordinates);
    ``bidirectional``: render_mlt's (every BDPT technique; None: the
    given path_space's choice, or False);
    ``time_mode``,
    ``parameterization``, ``roughness_threshold``, ``light_coordinates``,
    ``lens_perturb_prob`` and ``lens_sigma2`` as render_mlt's (the last four only in the
    modified one);
    ``path_space``: one from :func:`path_space_for` with the same settings, reused;
    ``clock``: the budget's (render_mlt's)."""
    modified = parameterization == "modified"
    ps = path_space or path_space_for(scene, max_length, parameterization, roughness_threshold,
                                      light_coordinates, bool(bidirectional))
    # compile every technique's kernels now, outside the budget and the mutations-per-second
    # figure
    h2 = (small_step or METHODS[method][0]) == "h2mc"
    ps.compile_kernels(derivatives=h2, lens=modified and h2 and lens_perturb_prob > 0,
                       progress=True)
    npix = ps.width * ps.height
    kw = dict(chains=chains, method=method, sigma2=sigma2, path_space=ps, time_mode=time_mode,
              parameterization=parameterization, lens_perturb_prob=lens_perturb_prob,
              clock=clock, small_step=small_step, large_step_prob=large_step_prob,
              mixing_step=mixing_step, mixing_sigma2=mixing_sigma2,
              bootstrap_samples=bootstrap_samples, technique_gibbs=technique_gibbs,
              technique_swap=technique_swap, bidirectional=bidirectional)
    if modified:
        kw.update(roughness_threshold=roughness_threshold, light_coordinates=light_coordinates,
                  lens_sigma2=lens_sigma2)
    t0 = clock()
    if seconds is None:
        bar = tqdm(total=int(np.ceil(mutations_per_pixel * npix / chains)) * chains,
                   unit="mut", unit_scale=True)
    else:
        bar = tqdm(total=seconds, unit="s", bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s")

    def tick(done):  # after each step (tqdm limits the redraws)
        bar.update((done if seconds is None else min(clock() - t0, seconds))
                   - bar.n)

    with bar:
        # a time budget is one run of chains until it is spent: restarted short rounds are
        # dominated by start-up error on caustic scenes (render_mlt's ``seconds``)
        r = render_mlt(scene, np.inf if seconds is not None else mutations_per_pixel,
                       seconds=seconds, seed=seed, progress=tick, direct_spp=direct_spp, **kw)
    return r.image, r.stats, r.mutations, r.seconds, r.sigma2


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.method not in METHODS:
            raise UsageError(f"unknown --method {args.method!r}: use h2mc, mmlt or pssmlt")
        if args.time is not None and not args.time > 0:
            raise UsageError(f"--time must be positive, got {args.time}")
        if args.mutations is not None and not args.mutations > 0:
            raise UsageError(f"--mutations must be positive, got {args.mutations}")
        if (args.chains < 1 or args.direct_spp < 0
                or (args.bootstrap is not None and args.bootstrap < 1)):
            raise UsageError("need --chains >= 1, --bootstrap >= 1 and --direct-spp >= 0")
        if args.parameterization == "modified" and args.method == "pssmlt":
            raise UsageError("--parameterization modified needs --method h2mc or mmlt (a "
                             "PSSMLT state is one path over every technique)")
        if not 0.0 <= args.lens_prob <= 1.0 or not args.roughness_threshold >= 0.0:
            raise UsageError(f"need 0 <= --lens-prob <= 1 and --roughness-threshold >= 0, got "
                             f"{args.lens_prob} and {args.roughness_threshold}")
        scene, stem = load_scene(args.scene, args.size)
        mpp = None if args.time is not None else (args.mutations or 64.0)
        image, stats, mutations, secs, sigma2 = render(
            scene, args.method, seconds=args.time, mutations_per_pixel=mpp,
            max_length=args.max_length, seed=args.seed, chains=args.chains,
            sigma2=args.sigma2, direct_spp=args.direct_spp, time_mode=args.time_mode,
            parameterization=args.parameterization,
            roughness_threshold=args.roughness_threshold,
            light_coordinates=not args.no_light_coordinates,
            lens_perturb_prob=args.lens_prob,
            bootstrap_samples=args.bootstrap, bidirectional=args.bidirectional)
    except (UsageError, MLTError, PathSpaceError) as e:
        print(f"h2mc-render: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exr, png = out / f"{stem}_{args.method}.exr", out / f"{stem}_{args.method}.png"
    edge_rt.write_exr(exr, image)
    write_png(png, np.clip(image, 0.0, 1.0) ** (1 / 2.2))
    h, w = image.shape[:2]
    small, large = METHODS[args.method]
    labels = {"large": f"large ({large})", "small": small,
              "isotropic": "kelemen (uniform mixing)", "lens": "h2 lens"}
    print(f"{stem} {w}x{h}, {args.method}, paths of 3..{args.max_length} segments")
    for name, s in stats.items():
        print(f"acceptance {labels[name]}: {s.acceptance:.3f} ({s.accepted}/{s.proposed})")
    if small == "h2mc":
        print(f"H2MC prior variance sigma2: {sigma2:.3g}"
              + (" (auto: pilot runs)" if args.sigma2 == "auto" else ""))
    print(f"mutations per second: {mutations / secs:.0f}")
    print(f"mutations per pixel: {mutations / (w * h):.2f}")
    print(f"wrote {exr} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
