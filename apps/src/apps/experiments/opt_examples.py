"""The Opt paper's example energies (Figs. 3, 5, 24-27, 30, 33), each solved by lsq_opt's
generated matrix-free Gauss-Newton / Levenberg-Marquardt on synthetic seeded data and checked
against an independent solution or the paper's qualitative claim. One experiment per example."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .._experiment import Experiment, Figure, Outcome

# name -> (figure, title, what the paper shows, our check as (criterion, ours, passed))
SPECS = {
    "laplacian": (
        "§3, Fig. 3", "Laplacian image smoothing (the running example)",
        "a linear energy: one GN step solves it",
        lambda r: ("max |x - spsolve(J^T J, J^T F)| <= 1e-9",
                   f"{r['max_abs_diff_direct']:.1e}", r["max_abs_diff_direct"] <= 1e-9)),
    "laplacian_mesh": (
        "§3, Fig. 5", "Laplacian smoothing on a mesh (graph energy)",
        "the same smoothing on a graph domain",
        lambda r: ("max |x - direct solve| <= 1e-9", f"{r['max_abs_diff_direct']:.1e}",
                   r["max_abs_diff_direct"] <= 1e-9)),
    "poisson": (
        "App. A.1.4, Fig. 27", "Poisson image editing",
        "GN + PCG reaches the direct solution (GPU: 50.0x Eigen)",
        lambda r: ("max |X - SuperLU| / range <= 1e-6, fixed pixels unchanged",
                   f"{r['rel_err_direct']:.1e}",
                   r["rel_err_direct"] <= 1e-6 and r["fixed_unchanged"])),
    "arap": (
        "App. A.1.1, Fig. 24", "As-rigid-as-possible image warping",
        "handles reached, shape kept rigid",
        lambda r: ("monotone LM costs, handle error <= 0.05 px",
                   f"handle err {r['handle_max_err_px']:.1e} px",
                   r["monotone_accepted_costs"] and r["finite"]
                   and r["handle_max_err_px"] <= 0.05)),
    "arap_mesh": (
        "App. A.1.2, Fig. 25", "As-rigid-as-possible mesh deformation",
        "handles reached, edges barely stretched",
        lambda r: ("monotone LM costs, handle error <= 0.1",
                   f"handle err {r['handle_max_err']:.1e}, max stretch "
                   f"{r['edge_stretch_max']:.2f}",
                   r["monotone_accepted_costs"] and r["finite"] and r["handle_max_err"] <= 0.1)),
    "shading": (
        "App. A.1.3, Fig. 26", "Shape from shading (depth refinement)",
        "refined depth closer to the truth than the noisy input",
        lambda r: ("rms depth error drops by >= 25 %, monotone costs",
                   f"{r['rms_depth_err_input']:.2e} -> {r['rms_depth_err_refined']:.2e}",
                   r["finite"] and r["monotone_accepted_costs"]
                   and r["rms_depth_err_refined"] < 0.75 * r["rms_depth_err_input"])),
    "flow": (
        "App. A.2.3, Fig. 30", "Dense optical flow (coarse-to-fine)",
        "sub-pixel flow recovered",
        lambda r: ("mean interior endpoint error < 0.1 px", f"{r['mean_epe_interior']:.3f} px",
                   r["finite"] and r["mean_epe_interior"] < 0.1)),
    "intrinsic": (
        "App. A.2.4, Figs. 20, 33", "Intrinsic images with an L_p (IRLS) prior",
        "p < 2 gives sparser reflectance gradients than p = 2",
        lambda r: ("fraction of reflectance gradients > 1e-3: p=0.8 < 0.5 x p=2",
                   f"{r['grad_frac_p']:.2f} vs {r['grad_frac_p2']:.2f}",
                   r["finite"] and r["grad_frac_p"] < 0.5 * r["grad_frac_p2"])),
}

CRITERIA = {
    "laplacian": "max |x - spsolve(J^T J, J^T F)| <= 1e-9",
    "laplacian_mesh": "max |x - direct solve| <= 1e-9",
    "poisson": "max |X - SuperLU| / range <= 1e-6, fixed pixels unchanged",
    "arap": "accepted LM costs monotone, handle error <= 0.05 px",
    "arap_mesh": "accepted LM costs monotone, handle error <= 0.1",
    "shading": "rms depth error drops by >= 25 %, accepted costs monotone",
    "flow": "mean interior endpoint error < 0.1 px",
    "intrinsic": "fraction of reflectance gradients > 1e-3: p=0.8 < 0.5 x p=2",
}

SIZES = {  # (tiny, quick, full); full = the lsq_opt examples' paper-sized runs
    "laplacian": ((16, 12), (64, 48), (64, 48)),
    "laplacian_mesh": ((8, 6), (24, 16), (64, 32)),
    "poisson": ((32, 32), (128, 128), (512, 512)),
    "arap": ((16, 12), (48, 32), (48, 32)),
    "arap_mesh": ((24, 16), (24, 16), (64, 32)),
    "shading": ((32, 24), (64, 48), (640, 480)),
    "flow": ((32, 24), (64, 48), (128, 96)),
    "intrinsic": ((24, 16), (24, 16), (96, 64)),
}


def _solve(name, size):
    """Run one lsq_opt example; its own PNG (input | result panels) comes back as bytes."""
    from lsq_opt.examples import EXAMPLES

    with tempfile.TemporaryDirectory() as tmp:
        r = EXAMPLES[name].run(size=size, out_dir=tmp)
        png = Path(r.pop("png")).read_bytes() if r.get("png") else None
    return r, png


def _make(name):
    fig_ref, title, paper_claim, check = SPECS[name]

    def run(ctx, size):
        out = Outcome()
        ((r, png),) = ctx.starmap(_solve, [(name, tuple(size))], desc="solve")
        criterion, ours, passed = check(r)
        out.check(title, paper_claim, ours, passed, criterion)
        out.numbers.update({k: v for k, v in r.items()
                            if isinstance(v, (int, float, str, bool)) and k != "png"})
        out.table("Solve", ["size", "unknowns", "method", "initial cost", "final cost",
                            "iterations", "PCG iterations", "compile s", "solve s"],
                  [[r["size"], r["unknowns"], r["method"], f"{r['initial_cost']:.4e}",
                    f"{r['cost']:.4e}", r["iterations"], r["pcg_iterations"],
                    f"{r['time_compile_s']:.2f}", f"{r['time_solve_s']:.2f}"]])
        if png:
            out.figures.append(Figure(name, f"{title}: input and result panels "
                                      "(lsq_opt example rendering).", png))
        return out

    tiny, quick, full = SIZES[name]
    return Experiment(
        name=f"opt_{name}", title=title, reference=f"Opt (DeVito et al. 2017) {fig_ref}",
        paper={"claim": paper_claim}, check=CRITERIA[name],
        sizes={"tiny": dict(size=tiny), "quick": dict(size=quick), "full": dict(size=full)},
        run=run)


EXPERIMENTS = [_make(n) for n in SPECS]
