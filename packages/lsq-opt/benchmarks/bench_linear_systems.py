"""Spec AE-9 timings: J^T J p matrix-free (the generated kernels) vs materialised J (scipy CSR,
two sparse products) vs materialised J^T J (SpGEMM once per linearisation, one sparse product),
per example energy: time per PCG product and time per linearisation (assembling J / J^T J).
The paper (GPU) reports matrix-free faster on every example but cotangent smoothing, by
1.16-3x. The problems are the test file's (tests/test_linear_systems.py) at larger sizes.

    .venv/bin/python packages/lsq-opt/benchmarks/bench_linear_systems.py [--repeats 7]
"""
from __future__ import annotations

import argparse

import numpy as np
from core_ad import benchmark as bench

from lsq_opt import compile_problem
from lsq_opt._solver.materialized import with_linear_system
from lsq_opt._solver.problem import call_linearize, jtjp_operator
from lsq_opt.examples import arap, cotangent, embedded, laplacian, mesh, poisson, volumetric

FORMS = ("matrix_free", "jacobian", "jtj")


def problems():
    _, noisy = laplacian.make_data((256, 256))
    yield "laplacian 256^2", compile_problem(laplacian.energy(), arrays={"A": noisy},
                                             params={"w_fit": 0.1, "w_reg": 0.9})
    target, source, mask = poisson.make_data((192, 160))
    yield "poisson 192x160x4", compile_problem(poisson.energy(target.shape[-1]),
                                               arrays={"X": target, "T": source, "M": mask})
    size = (128, 128)
    ur, m, handles, targets = arap.make_data(size, bend_deg=30.0)
    yield "ARAP image 128^2", compile_problem(arap.energy(), arrays={
        "UrShape": ur, "Mask": m, "Offset": ur, "Angle": np.zeros(size),
        "Constraints": arap._constraints(size, handles, targets)},
        params={"w_fitSqrt": 3.0, "w_regSqrt": 1.0})
    yield "ARAP mesh 2048 v", mesh.arap_plan(rings=64, segs=32)[0]
    V, tris, boundary = cotangent.lattice_mesh(64, 48, seed=0)
    yield "cotangent 64x48", cotangent.make_plan(V, tris, boundary, V)
    V, tris = mesh.tube_mesh(48, 24)
    v0, v1 = mesh.directed_edges(tris)
    h = np.concatenate([np.arange(24), np.arange(47 * 24, 48 * 24)])
    yield "embedded 48x24", embedded.make_plan(V, v0, v1, h, V[h] + 0.3)
    U = volumetric.grid((12, 40, 12))
    hm = np.zeros(U.shape[:3], bool)
    hm[:, 0, :] = hm[:, -1, :] = True
    yield "volumetric 12x40x12", volumetric.make_plan(U, hm, U[hm] + 0.2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    print("| problem | unknowns | product: matrix-free | J (2 SpMV) | J^T J (SpMV) | "
          "linearise: matrix-free | J | J^T J | J 2-SpMV / matrix-free |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, plan in problems():
        x = plan.x0 + 0.01 * np.random.default_rng(0).standard_normal(plan.n)
        p = np.random.default_rng(1).standard_normal(plan.n).astype(plan.dtype)
        prod, lin = {}, {}
        for form in FORMS:
            prob = with_linear_system(plan, form)
            lin[form] = bench.time_median(lambda: call_linearize(prob, x), args.repeats, warmup=0)
            op = jtjp_operator(prob, x)
            op(p)
            prod[form] = bench.time_median(lambda: op(p), args.repeats, warmup=0)
        ms = {k: f"{v * 1e3:.2f} ms" for k, v in prod.items()}
        ls = {k: f"{v * 1e3:.1f} ms" for k, v in lin.items()}
        print(f"| {name} | {plan.n} | {ms['matrix_free']} | {ms['jacobian']} | {ms['jtj']} | "
              f"{ls['matrix_free']} | {ls['jacobian']} | {ls['jtj']} | "
              f"{prod['jacobian'] / prod['matrix_free']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
