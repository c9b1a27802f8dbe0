"""``python -m lsq_opt.examples [--full] [--out DIR] [--verbose] [--only NAME ...]``"""
from __future__ import annotations

import argparse
import sys
import time

from . import EXAMPLES
from .nist import nist_table

SIZES = {"laplacian": (64, 48), "poisson": (128, 128), "arap": (48, 32),
         "laplacian_mesh": (24, 16), "arap_mesh": (24, 16), "intrinsic": (24, 16),
         "flow": (64, 48), "nist": None, "shading": (64, 48), "cotangent_mesh": (24, 16),
         "embedded_deformation": (12, 8), "volumetric": (6, 21, 6),
         "robust_alignment": (16, 12)}
FULL_SIZES = {"laplacian": (64, 48), "poisson": (512, 512), "arap": (48, 32),
              "laplacian_mesh": (64, 32), "arap_mesh": (64, 32), "intrinsic": (96, 64),
              "flow": (128, 96), "nist": None, "shading": (640, 480), "cotangent_mesh": (64, 48),
         "embedded_deformation": (24, 16), "volumetric": (11, 41, 11),
         "robust_alignment": (32, 24)}


def _check(name, r):
    """The example's own pass/fail criterion (same thresholds as tests/test_examples.py)."""
    if name == "laplacian":
        return r["max_abs_diff_direct"] <= 1e-9
    if name == "poisson":
        return r["rel_err_direct"] <= 1e-6 and r["fixed_unchanged"]
    if name == "arap":
        return r["monotone_accepted_costs"] and r["finite"] and r["handle_max_err_px"] <= 0.05
    if name == "laplacian_mesh":
        return r["max_abs_diff_direct"] <= 1e-9
    if name == "arap_mesh":
        return r["monotone_accepted_costs"] and r["finite"] and r["handle_max_err"] <= 0.1
    if name == "intrinsic":
        return r["finite"] and r["grad_frac_p"] < 0.5 * r["grad_frac_p2"]
    if name == "flow":
        return r["finite"] and r["mean_epe_interior"] < 0.1
    if name == "shading":
        return (r["finite"] and r["monotone_accepted_costs"]
                and r["rms_depth_err_refined"] < 0.75 * r["rms_depth_err_input"])
    if name == "nist":
        return r["finite"] and r["lm_matches_scipy"]
    if name == "robust_alignment":
        return (r["converged"] and r["outlier_weight_max"] <= 0.05 and r["inlier_weight_min"] >= 0.9
                and r["inlier_err_robust"] < 0.2 * r["inlier_err_plain"])
    if name == "volumetric":
        return (r["rigid_cost"] <= 1e-12 * r["rigid_initial_cost"] and r["rigid_R_err"] <= 1e-6
                and r["finite"] and r["handle_max_err"] <= 0.05)
    if name == "cotangent_mesh":
        return (r["max_abs_diff_direct"] <= 1e-9 and r["planar_drift_cotangent"] <= 1e-9
                and r["rms_result"] < 0.5 * r["rms_noise"])
    if name == "embedded_deformation":
        return (r["rigid_cost"] <= 1e-12 * r["rigid_initial_cost"] and r["rigid_R_err"] <= 1e-6
                and r["converged"] and r["handle_max_err"] <= 0.05 and r["orthonormality_err"] <= 0.25)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lsq_opt.examples", description=__doc__)
    ap.add_argument("--out", default="outputs/lsq_opt", help="folder for the PNGs (default outputs/lsq_opt)")
    ap.add_argument("--full", action="store_true", help="paper-sized Poisson (512x512 RGBA; slow)")
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("--only", nargs="*", choices=sorted(EXAMPLES), help="run only these examples")
    a = ap.parse_args(argv)
    sizes = FULL_SIZES if a.full else SIZES
    print(f"lsq_opt examples -> {a.out}")
    rows, ok_all, t0 = [], True, time.perf_counter()
    for name, mod in EXAMPLES.items():
        if a.only and name not in a.only:
            continue
        r = mod.run(size=sizes[name], verbose=a.verbose, out_dir=a.out)
        ok = _check(name, r)
        ok_all &= ok
        if name in ("laplacian", "laplacian_mesh"):
            check = f"max|x-spsolve(JtJ)| = {r['max_abs_diff_direct']:.1e}"
        elif name == "flow":
            check = f"mean endpoint error {r['mean_epe_interior']:.3f} px (interior)"
        elif name == "intrinsic":
            check = (f"refl. gradients > 1e-3: p=0.8 {r['grad_frac_p']:.2f} vs p=2 "
                     f"{r['grad_frac_p2']:.2f} (truth {r['grad_frac_true']:.2f})")
        elif name == "arap_mesh":
            check = (f"handle err {r['handle_max_err']:.1e}, monotone={r['monotone_accepted_costs']}, "
                     f"max edge stretch {r['edge_stretch_max']:.2f}")
        elif name == "nist":
            print(nist_table(r))
            check = (f"LM f64 reaches {r['lm_reached']}/{len(r['problems'])} certified fits, "
                     f"scipy LM {r['scipy_reached']}; LM where scipy: {r['lm_matches_scipy']}")
        elif name == "shading":
            check = (f"rms depth error {r['rms_depth_err_input']:.2e} -> {r['rms_depth_err_refined']:.2e} "
                     f"(LM; GN {r['methods'].get('gn', {}).get('rms_depth_err_refined', float('nan')):.2e})")
        elif name == "cotangent_mesh":
            check = (f"max|x-spsolve| = {r['max_abs_diff_direct']:.1e}, planar drift cotangent "
                     f"{r['planar_drift_cotangent']:.1e} vs uniform {r['planar_drift_uniform']:.1e}")
        elif name == "robust_alignment":
            check = (f"|w| outliers <= {r['outlier_weight_max']:.1e}, inliers >= {r['inlier_weight_min']:.2f}; "
                     f"inlier plane dist {r['inlier_err_robust']:.1e} vs {r['inlier_err_plain']:.1e} fixed w")
        elif name == "volumetric":
            check = (f"rigid: max|R-R*| {r['rigid_R_err']:.1e}; bend: handle err {r['handle_max_err']:.1e}, "
                     f"max edge stretch {r['edge_stretch_max']:.2f}")
        elif name == "embedded_deformation":
            check = (f"rigid: max|R-R*| {r['rigid_R_err']:.1e}; bend: handle err {r['handle_max_err']:.1e}, "
                     f"max|R^T R - I| {r['orthonormality_err']:.2f}")
        elif name == "poisson":
            check = f"max|X-SuperLU|/range = {r['rel_err_direct']:.1e}"
        else:
            check = (f"handle err {r['handle_max_err_px']:.1e} px, monotone={r['monotone_accepted_costs']}, "
                     f"edge len [{r['edge_len_min']:.2f},{r['edge_len_max']:.2f}]")
        rows.append((name, r["size"], r["unknowns"], r["method"], r["initial_cost"], r["cost"], r["iterations"],
                     r["pcg_iterations"], r["time_compile_s"], r["time_solve_s"], "PASS" if ok else "FAIL", check,
                     r.get("png", "-")))
    hdr = ("example", "size", "unknowns", "meth", "cost0", "cost", "its", "pcg", "compile s", "solve s", "check")
    print(f"{hdr[0]:<14} {hdr[1]:>8} {hdr[2]:>8} {hdr[3]:>4} {hdr[4]:>11} {hdr[5]:>11} {hdr[6]:>4} {hdr[7]:>6} "
          f"{hdr[8]:>9} {hdr[9]:>8} {hdr[10]:>5}  detail")
    for (n, s, u, m, c0, c, it, pcg, tc, ts, ok, det, png) in rows:
        print(f"{n:<14} {s:>8} {u:>8} {m:>4} {c0:>11.4e} {c:>11.4e} {it:>4} {pcg:>6} {tc:>9.2f} {ts:>8.2f} {ok:>5}  {det}")
    for r in rows:
        print(f"  wrote {r[-1]}")
    print(f"total {time.perf_counter() - t0:.1f} s: {'all checks passed' if ok_all else 'SOME CHECKS FAILED'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
