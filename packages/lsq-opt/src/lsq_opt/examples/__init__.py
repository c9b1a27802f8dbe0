"""End-to-end examples of :mod:`lsq_opt` on synthetic, seeded data (spec 3.1-3.12; AE-2, AE-3(a), AE-5, AE-12, AE-13).

Each module has ``run(size=..., verbose=False, out_dir=None) -> dict`` that builds the energy,
solves it, checks it against an independent solution where one exists, and writes
``<out_dir>/<name>.png`` (input | result). ``python -m lsq_opt.examples [--full] [--out DIR]`` runs
them all and prints a summary table."""
from . import (arap, cotangent, embedded, flow, intrinsic, laplacian, mesh, nist, poisson, robust,
               shading, volumetric)

EXAMPLES = {"laplacian": laplacian, "poisson": poisson, "arap": arap,
            "laplacian_mesh": mesh.laplacian_mesh, "arap_mesh": mesh.arap_mesh,
            "intrinsic": intrinsic, "flow": flow, "nist": nist,
            "shading": shading, "cotangent_mesh": cotangent, "embedded_deformation": embedded,
            "volumetric": volumetric, "robust_alignment": robust}
__all__ = ["EXAMPLES", "arap", "cotangent", "embedded", "flow", "intrinsic", "laplacian", "mesh", "nist", "poisson", "robust", "shading",
           "volumetric"]
