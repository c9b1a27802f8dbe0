"""Opt §8 (comparisons with a direct solver): lsq_opt's matrix-free GN + PCG on the linear
example energies against a sparse direct solve (scipy SuperLU) of the same normal equations,
timed in the same run. (The full side-by-side benchmark against scipy's least_squares and
Ceres is ``packages/lsq-opt/benchmarks/bench_solvers.py``.)"""

from __future__ import annotations

from .._experiment import Experiment, Outcome, fig_axes


def _case(name, size):
    from lsq_opt.examples import EXAMPLES

    r = EXAMPLES[name].run(size=size)
    err = r.get("rel_err_direct", r.get("max_abs_diff_direct"))
    return {"name": name, "size": r["size"], "unknowns": r["unknowns"],
            "solve_s": r["time_solve_s"], "direct_s": r["time_direct_s"],
            "compile_s": r["time_compile_s"], "err": float(err)}


def run(ctx, cases, repeats):
    jobs = [(n, tuple(s)) for n, s in cases for _ in range(repeats)]
    res = ctx.starmap(_case, jobs, desc="solves")
    out = Outcome()
    rows = []
    for i, (n, _) in enumerate(cases):
        mine = res[i * repeats:(i + 1) * repeats]
        solve = sorted(r["solve_s"] for r in mine)[len(mine) // 2]
        direct = sorted(r["direct_s"] for r in mine)[len(mine) // 2]
        rows.append({"name": n, "size": mine[0]["size"], "unknowns": mine[0]["unknowns"],
                     "solve_s": solve, "direct_s": direct, "ratio": direct / solve,
                     "err": max(r["err"] for r in mine)})
    ok = all(r["err"] <= 1e-6 for r in rows)
    out.check("same solution as the direct solve", "GN + PCG reaches the direct solution",
              f"max error {max(r['err'] for r in rows):.1e}", ok, "<= 1e-6")
    big = max(rows, key=lambda r: r["unknowns"])
    out.check("speed vs direct solve (largest case)", "Poisson: 50.0x Eigen (GPU, 512x512)",
              f"{big['ratio']:.2f}x SuperLU ({big['name']} {big['size']}, CPU)", None)
    out.numbers["rows"] = rows
    out.table("Median of repeats (seconds)", ["example", "size", "unknowns", "lsq_opt solve",
                                               "scipy SuperLU", "SuperLU / lsq_opt", "error"],
              [[r["name"], r["size"], r["unknowns"], f"{r['solve_s']:.3f}",
                f"{r['direct_s']:.3f}", f"{r['ratio']:.2f}", f"{r['err']:.1e}"] for r in rows])
    fig, ax = fig_axes("lsq_opt GN + PCG vs sparse direct solve", "case", "time [s]")
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["solve_s"] for r in rows], 0.4, label="lsq_opt (GN+PCG)")
    ax.bar([x + 0.2 for x in xs], [r["direct_s"] for r in rows], 0.4, label="scipy SuperLU")
    ax.set_xticks(list(xs), [f"{r['name']}\n{r['size']}" for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.legend()
    out.figure("bench", "Median solve time per case, same run, same machine.", fig)
    return out


EXPERIMENT = Experiment(
    name="opt_bench",
    title="Solver benchmark: matrix-free GN vs sparse direct solve",
    reference="Opt (DeVito et al. 2017) §8.1, App. A.1.4 (Poisson: 50.0x Eigen on a GPU)",
    paper={"Poisson 512x512": "50.0x faster than Eigen's direct solver (GPU)"},
    check="both solvers give the same solution (<= 1e-6); the speed ratio is reported",
    sizes={"tiny": dict(cases=[("poisson", (32, 32))], repeats=1),
           "quick": dict(cases=[("laplacian", (64, 48)), ("poisson", (128, 128)),
                                ("poisson", (256, 256))], repeats=3),
           "full": dict(cases=[("laplacian", (64, 48)), ("poisson", (256, 256)),
                               ("poisson", (512, 512))], repeats=5)},
    run=run,
)
