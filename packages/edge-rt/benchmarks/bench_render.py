"""Forward and forward+backward render times on the Cornell box, edge_rt side by side with
Mitsuba 3 (LLVM backend) in one run; prints the ratios and edge_rt's gradient-to-render cost
ratio (the thesis reports 10-20x for redner, thesis §5.4; docs/design/edge-rt.md, A-PERF-1).

Cases (256 x 256, 4 spp, direct light plus one indirect bounce: edge_rt max_depth=2 is
Mitsuba's max_depth=3):

* ``edge_rt forward``: ``edge_rt.render_image`` in float32.
* ``edge_rt fwd+bwd``: ``edge_rt.render`` and ``backward`` of an L2 loss w.r.t. the short
  box's vertices and the light's intensity: interior derivatives and primary edge sampling
  (one edge sample per pixel sample).
* ``mitsuba forward``: ``mi.render`` with the ``path`` integrator.
* ``mitsuba prb fwd+bwd``: a material gradient (no visibility term).
* ``mitsuba prb_projective fwd+bwd`` / ``direct_projective fwd+bwd``: the short box's
  translation, with Mitsuba's projective boundary sampling (what edge_rt's edges do).
* ``redner forward`` / ``redner fwd+bwd``: redner 0.4.28 on edge_rt's Cornell box exported to
  an npz (``redner_peer``, ``redner_driver.py`` in a Python 3.8 subprocess), max_bounces 2,
  the same L2 loss w.r.t. the short box's vertices, with primary and secondary edge sampling
  (redner's default); ``redner fwd+bwd primary edges``: secondary edges off (what edge_rt
  samples). Each redner run rebuilds its scene (Embree BVH, edge tables), as pyredner does.

After the timings, an agreement check at ``--agree-size`` / ``--agree-spp``: edge_rt's and
redner's images (rel-L2, against the noise floor of two edge_rt seeds) and their gradients of
a linear loss (a horizontal ramp times the image) w.r.t. the short box's vertices: whole, with
redner's edge sampling as edge_rt's (primary only), and interior-only (no edges in either).

Mitsuba needs ``pip install mitsuba`` and, on this Debian image, ``apt-get install libllvm19``
(Dr.Jit rejects LLVM 14 and aborts on LLVM 15's first path-traced kernel; 19 works, found
without ``DRJIT_LIBLLVM_PATH``); without it the Mitsuba rows are
skipped with a note. redner 0.4.28 has wheels for Python <= 3.8 only: the redner rows need
``$EDGE_RT_REDNER_PYTHON`` (a Python 3.8 with redner==0.4.28 and numpy, see redner_peer.py),
else they are skipped with a note.
Run from the repository root:

    .venv/bin/python packages/edge-rt/benchmarks/bench_render.py [--size 256] [--spp 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from core_ad import benchmark as bench

import edge_rt
import redner_peer
from edge_rt import scenes

MAX_DEPTH = 2  # edge_rt's default: direct light plus one indirect bounce


def edge_rt_cases(size, spp):
    scene = scenes.cornell_box(resolution=(size, size))
    box = next(m for m in scene.meshes if m.name == "short_box")
    light = next(m for m in scene.meshes if m.name == "light")
    box.vertices.requires_grad_(True)
    light.emission.requires_grad_(True)
    target = edge_rt.render_image(scene, spp=spp, seed=99, max_depth=MAX_DEPTH, progress=False)

    def forward():
        return edge_rt.render_image(scene, spp=spp, seed=1, max_depth=MAX_DEPTH, progress=False)

    def forward_backward():
        box.vertices.grad = light.emission.grad = None
        image = edge_rt.render(scene, spp=spp, seed=1, max_depth=MAX_DEPTH, progress=False)
        ((image - target) ** 2).mean().backward()
        return box.vertices.grad

    return {"edge_rt forward": forward, "edge_rt fwd+bwd": forward_backward}


def mitsuba_cases(size, spp, threads, notes):
    try:
        import drjit as dr
        import mitsuba as mi

        mi.set_variant("llvm_ad_rgb")
    except Exception as e:  # ImportError, or the variant failing without libLLVM >= 16
        notes.append(f"Mitsuba 3 skipped: {type(e).__name__}: {e}")
        return {}
    dr.set_thread_count(threads)
    notes.append(f"Mitsuba 3: Dr.Jit's LLVM backend on {dr.thread_count()} threads")

    def load(integrator):
        d = mi.cornell_box()
        d["sensor"]["film"]["width"] = d["sensor"]["film"]["height"] = size
        d["integrator"] = {"type": integrator, "max_depth": 3}
        if integrator.endswith("projective"):
            # No octree guiding: on 2 cores its first call alone takes minutes (peers notes);
            # sample_border so that moving shapes at the image border are handled.
            d["integrator"]["guiding"] = "none"
            d["sensor"]["film"]["sample_border"] = True
        return mi.load_dict(d, optimize=False)

    def forward_case():
        scene = load("path")

        def run():
            img = mi.render(scene, spp=spp, seed=1)
            return np.asarray(img)
        return run

    def material_case():
        scene = load("prb")
        params = mi.traverse(scene)
        key = "red.reflectance.value"
        dr.enable_grad(params[key])
        params.update()
        ref = mi.render(scene, params, spp=spp, seed=99)
        dr.eval(ref)

        def run():
            img = mi.render(scene, params, spp=spp, seed=1)
            dr.backward(dr.mean(dr.square(img - ref), axis=None))
            return np.asarray(dr.grad(params[key]))
        return run

    def geometry_case(integrator):
        scene = load(integrator)
        params = mi.traverse(scene)
        key = "small-box.vertex_positions"
        v0 = dr.unravel(mi.Point3f, params[key])
        ref = mi.render(scene, params, spp=spp, seed=99)
        dr.eval(ref)

        def run():
            theta = mi.Float(0.0)
            dr.enable_grad(theta)
            params[key] = dr.ravel(mi.Transform4f().translate(mi.Point3f(theta, 0, 0)) @ v0)
            params.update()
            img = mi.render(scene, params, spp=spp, seed=1)
            dr.backward(dr.mean(dr.square(img - ref), axis=None))
            return np.asarray(dr.grad(theta))
        return run

    cases = {"mitsuba forward": forward_case(), "mitsuba prb fwd+bwd": material_case()}
    for integrator in ("prb_projective", "direct_projective"):
        cases[f"mitsuba {integrator} fwd+bwd"] = geometry_case(integrator)
    return cases


def redner_cases(python, size, spp, threads, workdir, notes):
    """The redner rows, served by one driver process (closed by the caller)."""
    npz = redner_peer.export_scene(scenes.cornell_box(resolution=(size, size)),
                                   workdir / "cornell.npz")
    proc = redner_peer.RednerProcess(python, npz, threads=threads, spp=spp,
                                     max_bounces=MAX_DEPTH)
    notes.append(f"redner 0.4.28 ({python}) on {proc.cores} core(s) ({threads} asked; it starts "
                 "one thread per machine core, pinned to fewer cores when fewer are asked), "
                 f"Sobol sampler, max_bounces {MAX_DEPTH}")

    def case(op, **options):
        return lambda: proc.request(op, seed=1, **options)
    cases = {"redner forward": case("forward"), "redner fwd+bwd": case("fwd_bwd"),
             "redner fwd+bwd primary edges": case("fwd_bwd", edges="primary")}
    return cases, proc


def redner_agreement(python, size, spp, threads, workdir):
    """edge_rt vs redner at equal spp on the Cornell box: images, and the gradient of
    ``mean(ramp * image)`` (ramp: -0.5 at the left edge to 0.5 at the right, so moving the
    box sideways changes it) w.r.t. the short box's vertices, whole and interior-only."""
    scene = scenes.cornell_box(resolution=(size, size))
    box = next(m for m in scene.meshes if m.name == "short_box")
    ramp = ((torch.arange(size, dtype=torch.float32) + 0.5) / size - 0.5)
    weights = ramp.expand(size, size)[..., None].expand(size, size, 3).contiguous()
    npz = redner_peer.export_scene(scene, workdir / "agree.npz", weights=weights)
    wrt = [t is box.vertices for t in scene.tensors()]

    def ours(seed, edges=True):
        image = edge_rt.render_image(scene, spp=spp, seed=seed, max_depth=MAX_DEPTH,
                                     progress=False)
        grads = edge_rt.gradients(scene, weights / weights.numel(), spp=spp, seed=seed,
                                  max_depth=MAX_DEPTH, edges=edges, progress=False, wrt=wrt)
        return image.numpy(), grads[wrt.index(True)].numpy()

    (img1, g1), (img2, g2), (_, g_interior) = ours(1), ours(2), ours(1, edges=False)
    theirs = {}
    with redner_peer.RednerProcess(python, npz, threads=threads, spp=spp,
                                   max_bounces=MAX_DEPTH) as proc:
        for edges in ("primary+secondary", "primary", "none"):
            theirs[edges] = redner_peer.report_arrays(proc.request("result", seed=1, edges=edges))

    def rel_l2(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    def cosine(a, b):
        return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))

    def compare(label, g, ours_g):
        print(f"  redner {label}: cosine with edge_rt {cosine(ours_g, g):.3f}, |redner|/|edge_rt|"
              f" {np.linalg.norm(g) / np.linalg.norm(ours_g):.3f}; translation "
              f"{np.round(g.sum(0), 6)} vs edge_rt {np.round(ours_g.sum(0), 6)}")

    print(f"agreement with redner, Cornell box {size}^2, {spp} spp each, max_depth {MAX_DEPTH}:")
    img_r = theirs["primary"][0]
    print(f"  image rel-L2 edge_rt vs redner {rel_l2(img1, img_r):.4f} (noise floor, edge_rt seed "
          f"1 vs 2: {rel_l2(img1, img2):.4f}); channel means edge_rt "
          f"{np.round(img1.reshape(-1, 3).mean(0), 4)}, redner "
          f"{np.round(img_r.reshape(-1, 3).mean(0), 4)}")
    print(f"  d mean(ramp * image) / d short-box vertices (8x3, translation = their sum). edge_rt "
          f"(interior + primary edges) seed 1 vs 2: cosine {cosine(g1, g2):.3f}, |g2|/|g1| "
          f"{np.linalg.norm(g2) / np.linalg.norm(g1):.3f}")
    compare("primary+secondary edges (its default; edge_rt has no secondary edges)",
            theirs["primary+secondary"][1], g1)
    compare("primary edges", theirs["primary"][1], g1)
    compare("interior only", theirs["none"][1], g_interior)
    print("  (redner's interior drops the first hit's motion along the scattered ray: "
          "path_contribution.cpp, 'XXX HACK' for min_roughness <= 0.01; it matters from "
          "max_depth 2 on)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--spp", type=int, default=4)
    parser.add_argument("--agree-size", type=int, default=64,
                        help="image size of the redner agreement check (64)")
    parser.add_argument("--agree-spp", type=int, default=256,
                        help="spp of the redner agreement check (256; 0 skips it)")
    bench.add_common_arguments(parser, repeats=5)
    args = bench.parse_arguments(parser, argv)
    torch.set_num_threads(args.threads)
    notes: list[str] = []
    cases = edge_rt_cases(args.size, args.spp)
    cases.update(mitsuba_cases(args.size, args.spp, args.threads, notes))
    redner_python, note = redner_peer.find_python()
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        if redner_python is None:
            notes.append(note)
        else:
            redner, proc = redner_cases(redner_python, args.size, args.spp, args.threads,
                                        Path(tmp), notes)
            cases.update(redner)
        try:
            run_cases(cases, args, notes)
        finally:
            if proc is not None:
                proc.close()
        if redner_python is not None and args.agree_spp > 0:
            redner_agreement(redner_python, args.agree_size, args.agree_spp, args.threads,
                             Path(tmp))


def run_cases(cases, args, notes):
    print(bench.machine_info(modules=("numpy", "core_ad", "torch", "edge_rt", "mitsuba")))
    print(f"threads: edge_rt (torch) {args.threads}")
    for n in notes:
        print("note:", n)
    first = {}
    for name, fn in cases.items():
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
    results = bench.compare_and_report(cases, args.repeats, first_calls=first)
    forward = {k: v for k, v in results.items() if "forward" in k}
    backward = {k: v for k, v in results.items() if "fwd+bwd" in k}
    bench.side_by_side(forward, "edge_rt forward",
                       title=f"forward render, Cornell box {args.size}^2, {args.spp} spp")
    ratios = bench.side_by_side(backward, "edge_rt fwd+bwd",
                                title=f"forward + backward, Cornell box {args.size}^2, "
                                      f"{args.spp} spp")
    ours = results["edge_rt fwd+bwd"]["median"]
    ratio = ours / results["edge_rt forward"]["median"]
    print(f"edge_rt gradient-to-render cost ratio: {ratio:.1f}x (thesis, redner: 10-20x)")
    if "redner fwd+bwd" in results:
        r = results["redner fwd+bwd"]["median"] / results["redner forward"]["median"]
        print(f"redner gradient-to-render cost ratio: {r:.1f}x")
    for name, goal, holds in (
            ("redner fwd+bwd", "faster than redner", lambda x: x > 1.0),
            ("mitsuba prb_projective fwd+bwd", "within 2x of Mitsuba prb_projective",
             lambda x: x >= 0.5)):
        if name in ratios:
            print(f"goal fwd+bwd {goal}: {name} / edge_rt = {ratios[name]:.2f} -> "
                  f"{'holds' if holds(ratios[name]) else 'does not hold'}")


if __name__ == "__main__":
    main()
