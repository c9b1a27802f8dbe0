"""Time to a given relMSE: h2mc's MLT renderers next to LuxCore's Metropolis sampler, on the
same scene (spec: "the same scene's time to a given relMSE with LuxCore's Metropolis sampler").

LuxCore (``pip install --no-deps pyluxcore``; it runs in a subprocess, see
``_luxcore_worker.py``) renders edge_rt's Cornell box (matte materials, the same meshes,
emission and camera), which both renderers agree on: LuxCore's ``path.pathdepth.total = d``
is edge_rt's ``max_depth = d - 1`` (paths of up to ``d`` segments); the mean RGB of the two
agree within 0.1% at 1024 spp. The reference is LuxCore's path tracer (``SOBOL`` sampler) at
``--ref-spp``; the relMSE floor of each of our renderers against it (its bias plus the
reference's own noise) is printed.

Timed, each on ``--threads`` threads, wall clock:

* LuxCore ``METROPOLIS`` (Kelemen-style PSSMLT in C++) and ``SOBOL`` path tracing: one render
  session, snapshots of the film at 1, 2, 4, ... spp;
* h2mc ``render_mlt`` with PSSMLT (Kelemen small steps) and H2MC small steps: one run per
  mutations-per-pixel value (2, 4, 8, ...), paths of 3 or more segments by MLT plus direct
  lighting from edge_rt's path tracer at half as many samples per pixel; kernels are compiled
  before the clock starts (a warm-up run).

For each: the time at which the relMSE falls to ``--target`` (log-log interpolation of the
series), and its ratio to LuxCore METROPOLIS's.

    .venv/bin/python packages/h2mc/benchmarks/bench_luxcore.py [--size 64] [--max-length 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import h2mc
from edge_rt import scenes

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_luxcore_worker.py")


def export_scene(scene, path, max_length, threads):
    """The npz ``_luxcore_worker.py`` reads (constant matte materials only)."""
    d, kd, emission = {}, [], []
    for i, m in enumerate(scene.meshes):
        d[f"v{i}"] = m.vertices.detach().double().numpy()
        d[f"f{i}"] = m.faces.numpy()
        mat = m.material
        if mat is not None and (not mat.diffuse.is_constant or mat.specular.values.abs().sum() > 0):
            raise SystemExit(f"bench_luxcore: mesh {m.name!r} is not a constant matte material")
        kd.append(np.zeros(3) if mat is None else mat.diffuse.values.detach().double().numpy())
        emission.append(np.zeros(3) if m.emission is None
                        else m.emission.detach().double().numpy())
    cam = scene.camera
    M = cam.cam_to_world.detach().double().numpy()
    np.savez(path, **d, kd=np.array(kd), emission=np.array(emission), origin=M[:3, 3],
             target=M[:3, 3] + M[:3, 2], up=M[:3, 1], fov=float(cam.fov),
             size=np.array([cam.width, cam.height]), max_depth=max_length, threads=threads)


def luxcore(scene_npz, sampler, spps, workdir):
    """``(spp, seconds, images)`` of one LuxCore session, on edge_rt's pixel grid: LuxCore's
    film rows run bottom-up and sit one row off edge_rt's (measured: its row ``h - 2 - y`` is
    edge_rt's row ``y``; aligned, a 64 spp edge_rt image is within relMSE 0.006 of LuxCore's
    1024 spp), so its images are flipped and lose their first row, ours their last
    (:func:`crop`)."""
    out = os.path.join(workdir, f"{sampler}.npz")
    run = subprocess.run([sys.executable, WORKER, scene_npz, sampler, *map(str, spps), out],
                         capture_output=True, text=True)
    if run.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"LuxCore {sampler} failed (exit {run.returncode}): "
                           f"{run.stderr.strip().splitlines()[-1:]}")
    d = np.load(out)
    return d["spp"], d["seconds"], d["images"][:, ::-1][:, 1:].astype(np.float64)


def crop(image):
    """Our image on the rows LuxCore's aligned images cover."""
    return image[:-1]


def ours(scene, path_space, small_step, mpps, sigma2, seed):
    """``(mpp, seconds, images)``: one h2mc render per mutations-per-pixel value."""
    seconds, images = [], []
    for k, mpp in enumerate(mpps):
        t0 = time.perf_counter()
        r = h2mc.render_mlt(scene, mpp, small_step=small_step, path_space=path_space,
                            sigma2=sigma2, direct_spp=max(1, mpp // 2), seed=(seed, k))
        seconds.append(time.perf_counter() - t0)
        images.append(crop(r.image))
    return np.array(mpps), np.array(seconds), np.array(images)


def time_to(target, seconds, errors):
    """Log-log interpolated time at which ``errors`` reaches ``target`` (None if never)."""
    below = np.flatnonzero(errors <= target)
    if below.size == 0:
        return None
    i = below[0]
    if i == 0:
        return float(seconds[0])
    t = np.log(target / errors[i - 1]) / np.log(errors[i] / errors[i - 1])
    return float(np.exp(np.log(seconds[i - 1]) + t * np.log(seconds[i] / seconds[i - 1])))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64, help="image width = height (64)")
    p.add_argument("--max-length", type=int, default=5, help="path segments (5)")
    p.add_argument("--ref-spp", type=int, default=4096, help="LuxCore SOBOL reference (4096)")
    p.add_argument("--target", type=float, default=0.01, help="relMSE to reach (0.01)")
    p.add_argument("--max-mpp", type=int, default=64, help="our largest mutations/pixel (64)")
    p.add_argument("--lux-max-spp", type=int, default=256, help="LuxCore's largest spp (256)")
    p.add_argument("--sigma2", type=float, default=1e-3, help="H2MC prior variance (1e-3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import importlib.util

        if importlib.util.find_spec("pyluxcore") is None:
            raise ImportError
    except ImportError:
        raise SystemExit("bench_luxcore: pyluxcore is not installed "
                         "(pip install --no-deps pyluxcore)") from None
    os.environ.setdefault("CORE_AD_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    scene = scenes.cornell_box((args.size, args.size))
    with tempfile.TemporaryDirectory() as work:
        npz = os.path.join(work, "scene.npz")
        export_scene(scene, npz, args.max_length, args.threads)
        t0 = time.perf_counter()
        ref = luxcore(npz, "SOBOL", [args.ref_spp], work)[2][0]
        print(f"reference: LuxCore SOBOL {args.ref_spp} spp in {time.perf_counter() - t0:.1f} s")
        lux_spps = [2 ** k for k in range(int(np.log2(args.lux_max_spp)) + 1)]
        series = {f"LuxCore {s}": luxcore(npz, s, lux_spps, work) for s in ("METROPOLIS", "SOBOL")}
    ps = h2mc.PathSpace(scene, max_length=args.max_length, min_length=3)
    mpps = [2 ** k for k in range(1, int(np.log2(args.max_mpp)) + 1)]
    for name, step in (("h2mc PSSMLT", "kelemen"), ("h2mc H2MC", "h2mc")):
        t0 = time.perf_counter()
        ours(scene, ps, step, [1], args.sigma2, args.seed + 99)  # compile outside the clock
        print(f"{name}: kernels compiled in {time.perf_counter() - t0:.1f} s")
        series[name] = ours(scene, ps, step, mpps, args.sigma2, args.seed)
    rows, base = [], None
    for name, (counts, seconds, images) in series.items():
        errs = np.array([h2mc.rel_mse(im, ref) for im in images])
        t = time_to(args.target, seconds, errs)
        base = t if name == "LuxCore METROPOLIS" else base
        unit = "spp" if name.startswith("LuxCore") else "mpp"
        rows.append((name, t, f"{errs[-1]:.2e} at {counts[-1]} {unit}, {seconds[-1]:.1f} s",
                     " ".join(f"{e:.1e}" for e in errs)))
    print(f"\nCornell box {args.size}x{args.size}, paths up to {args.max_length} segments, "
          f"{args.threads} threads; time to relMSE {args.target:g} against LuxCore SOBOL "
          f"{args.ref_spp} spp")
    print(f"| system | time to relMSE {args.target:g} | / LuxCore METROPOLIS | last point | "
          "relMSE series |")
    print("|---|---|---|---|---|")
    for name, t, last, errs in rows:
        ratio = f"{t / base:.1f}x" if t is not None and base else "-"
        print(f"| {name} | {f'{t:.2f} s' if t is not None else 'not reached'} | {ratio} | "
              f"{last} | {errs} |")


if __name__ == "__main__":
    main()
