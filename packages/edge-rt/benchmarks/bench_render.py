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

Mitsuba needs ``pip install mitsuba`` and, on this Debian image, ``apt-get install libllvm19``
(Dr.Jit rejects LLVM 14 and aborts on LLVM 15's first path-traced kernel; 19 works, found
without ``DRJIT_LIBLLVM_PATH``); without it the Mitsuba rows are
skipped with a note. redner 0.4.28 has wheels for Python <= 3.8 only and is not run here.
Run from the repository root:

    .venv/bin/python packages/edge-rt/benchmarks/bench_render.py [--size 256] [--spp 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from core_ad import benchmark as bench

import edge_rt
from edge_rt import scenes


def edge_rt_cases(size, spp):
    scene = scenes.cornell_box(resolution=(size, size))
    box = next(m for m in scene.meshes if m.name == "short_box")
    light = next(m for m in scene.meshes if m.name == "light")
    box.vertices.requires_grad_(True)
    light.emission.requires_grad_(True)
    target = edge_rt.render_image(scene, spp=spp, seed=99, progress=False)

    def forward():
        return edge_rt.render_image(scene, spp=spp, seed=1, progress=False)

    def forward_backward():
        box.vertices.grad = light.emission.grad = None
        image = edge_rt.render(scene, spp=spp, seed=1, progress=False)
        ((image - target) ** 2).mean().backward()
        return box.vertices.grad

    return {"edge_rt forward": forward, "edge_rt fwd+bwd": forward_backward}


def mitsuba_cases(size, spp, notes):
    try:
        import drjit as dr
        import mitsuba as mi

        mi.set_variant("llvm_ad_rgb")
    except Exception as e:  # ImportError, or the variant failing without libLLVM >= 16
        notes.append(f"Mitsuba 3 skipped: {type(e).__name__}: {e}")
        return {}

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--spp", type=int, default=4)
    bench.add_common_arguments(parser, repeats=5)
    args = bench.parse_arguments(parser, argv)
    torch.set_num_threads(args.threads)
    notes: list[str] = []
    cases = edge_rt_cases(args.size, args.spp)
    cases.update(mitsuba_cases(args.size, args.spp, notes))
    print(bench.machine_info(modules=("numpy", "core_ad", "torch", "edge_rt", "mitsuba")))
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
    bench.side_by_side(backward, "edge_rt fwd+bwd",
                       title=f"forward + backward, Cornell box {args.size}^2, {args.spp} spp")
    ratio = results["edge_rt fwd+bwd"]["median"] / results["edge_rt forward"]["median"]
    print(f"edge_rt gradient-to-render cost ratio: {ratio:.1f}x (thesis, redner: 10-20x)")


if __name__ == "__main__":
    main()
