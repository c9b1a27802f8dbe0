"""lsq_opt solvers vs. the baselines: time to reach the baseline's final cost.

Problems (cost = 1/2 sum r^2 on every side):

(a) Poisson image editing, 512x512 single channel: free pixels inside a disc (Exclude(M != 0)),
    the rest fixed to the target image (Dirichlet boundary); guidance = gradients of a synthetic
    source image. Linear.
(b) ARAP image warping of a synthetic shape (default 128x128 grid): Offset (2 ch) + Angle
    unknowns over the shape's pixels, handle constraints move the top of the shape. Nonlinear.
(c) ARAP mesh deformation (spec 3.4, Fig. 25) on a generated tube (default 64 rings x 32 =
    2048 vertices, 6 unknowns each): bottom ring pinned, top ring twisted 60 degrees and
    shifted, in one solve. Graph energy (directed edges) + per-vertex fit. Nonlinear.

lsq_opt runs with its fused LLVM kernels (``--kernels lanes``: the numpy composition of the
previous version, for before/after) and Jacobi-PCG, in float64 and (one LM config) float32
(compared to the same float64 target); on Poisson also GN with the multigrid preconditioner
(``--multigrid-everywhere`` adds LM + multigrid on every problem).

Baselines: scipy.optimize.least_squares(method="trf", tr_solver="lsmr") with the sparse
Jacobian materialised by ``plan.jacobian`` and an independent numpy residual function; for the
linear Poisson problem also one Gauss-Newton step with a sparse direct solve of the normal
equations (scipy SuperLU; what Ceres' SPARSE_NORMAL_CHOLESKY does); and pyceres
(SPARSE_NORMAL_CHOLESKY, one Python CostFunction per residual block, analytic Jacobians) when
it imports (``pip install pyceres``; its Python callbacks dominate its time, so it is a weak
baseline on these sizes).

The target cost is (1 + 1e-3) x the scipy trf final cost. Every solver's time is the wall time
at which its cost first drops to <= the target (from a per-iteration callback / per-evaluation
record), median of ``--repeats`` runs, cases alternated. lsq_opt's compile time is reported
separately. Run from the repository root:

    PYTHONPATH=packages/lsq-opt/src:packages/core-ad/src python packages/lsq-opt/benchmarks/bench_solvers.py
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

# One BLAS/OpenMP thread for every side (set before numpy is imported): on this 2-core sandbox a
# multi-threaded OpenBLAS pool made scipy's lsmr steps vary 10-30x between identical runs.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np
import scipy
import scipy.sparse.linalg as spla
from scipy.optimize import least_squares
from core_ad import benchmark as bench

from lsq_opt.examples import arap as arap_example  # noqa: E402
from lsq_opt.examples import mesh as mesh_example  # noqa: E402
from lsq_opt import (  # noqa: E402
    Array, Dim, Energy, Exclude, InBounds, Not, Select, Unknown, compile_problem,
    eq, solve,
)

NBRS = [(1, 0), (-1, 0), (0, 1), (0, -1)]
REL = 1e-3  # target = (1 + REL) * baseline final cost


# ============================================================================ helpers
def shifted(a, off):
    """b[i, j] = a[i + dx, j + dy] where in bounds, 0 elsewhere; plus the in-bounds mask."""
    dx, dy = off
    W, H = a.shape[:2]
    b = np.zeros_like(a)
    ok = np.zeros((W, H), bool)
    xs_d = slice(max(0, -dx), W - max(0, dx))
    ys_d = slice(max(0, -dy), H - max(0, dy))
    xs_s = slice(max(0, dx), W - max(0, -dx) if dx < 0 else W)
    ys_s = slice(max(0, dy), H - max(0, -dy) if dy < 0 else H)
    b[xs_d, ys_d] = a[xs_s, ys_s]
    ok[xs_d, ys_d] = True
    return b, ok


# ============================================================================ (a) Poisson
def poisson_problem(N=512):
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H))
    T = Array("T", (W, H))
    M = Array("M", (W, H))
    terms = []
    for dx, dy in NBRS:
        e = (X(0, 0) - X(dx, dy)) - (T(0, 0) - T(dx, dy))
        terms.append(Select(InBounds(dx, dy), e, 0))
    energy = Energy(*terms, Exclude(Not(eq(M(0, 0), 0))))
    ii, jj = np.meshgrid(np.linspace(0, 1, N), np.linspace(0, 1, N), indexing="ij")
    source = (np.sin(9 * ii) * np.cos(7 * jj) + 0.5 * np.exp(-((ii - .5) ** 2 + (jj - .45) ** 2) / .02)
              + 0.2 * ((ii * 13).astype(int) % 2))
    target = 0.3 + 0.4 * ii - 0.2 * jj + 0.1 * np.sin(20 * jj)
    mask = (((ii - .5) ** 2 + (jj - .5) ** 2) > 0.38 ** 2).astype(float)  # 1 = fixed
    data = {"T": source, "M": mask, "X": target}
    return energy, data

def poisson_ref_residuals(plan, data):
    """Independent numpy residuals in the plan's residual order (terms, C-order pixels)."""
    T = data["T"]
    dTs = [(T - shifted(T, o)[0]) for o in NBRS]
    oks = [shifted(T, o)[1] for o in NBRS]

    def fun(x):
        Xf = plan.vector_to_unknowns(x)["X"]
        out = []
        for o, dT, ok in zip(NBRS, dTs, oks):
            Xs = shifted(Xf, o)[0]
            out.append(np.where(ok, (Xf - Xs) - dT, 0.0).ravel())
        return np.concatenate(out)
    return fun


# ============================================================================ (b) ARAP
def arap_problem(N=128):
    energy = arap_example.energy()
    # a thick "L"-ish bar shape; handles: bottom rows pinned, top rows pushed sideways and rotated
    ii, jj = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    ur = np.stack([ii, jj], -1).astype(float)
    inside = ((ii > N * .15) & (ii < N * .85) & (jj > N * .35) & (jj < N * .65)) | \
             ((ii > N * .65) & (ii < N * .85) & (jj > N * .15) & (jj < N * .85))
    mask = (~inside).astype(float)
    cons = -np.ones((N, N, 2))
    bottom = inside & (ii > N * .80)
    top = inside & (ii < N * .20)
    cons[bottom] = ur[bottom]
    th = 0.5
    c0 = np.array([N * .17, N * .5])
    rel = ur[top] - c0
    rot = np.stack([np.cos(th) * rel[:, 0] - np.sin(th) * rel[:, 1],
                    np.sin(th) * rel[:, 0] + np.cos(th) * rel[:, 1]], -1)
    cons[top] = c0 + rot + np.array([N * .1, N * .3])
    data = {"UrShape": ur, "Constraints": cons, "Mask": mask, "Offset": ur.copy(),
            "Angle": np.zeros((N, N))}
    params = {"w_fitSqrt": 10.0, "w_regSqrt": 1.0}
    return energy, data, params

def arap_ref_residuals(plan, data, params):
    U, C, Mk = data["UrShape"], data["Constraints"], data["Mask"]
    wf, wr = params["w_fitSqrt"], params["w_regSqrt"]
    pre = []
    for o in NBRS:
        Us, ok = shifted(U, o)
        Ms = shifted(Mk, o)[0]
        valid = ok & (Ms == 0) & (Mk == 0)
        pre.append((U - Us, valid))
    cvalid = (C[..., 0] >= 0) & (C[..., 1] >= 0)

    def fun(x):
        u = plan.vector_to_unknowns(x)
        O, A = u["Offset"], u["Angle"]
        c, s = np.cos(A), np.sin(A)
        out = []
        for o, (dU, valid) in zip(NBRS, pre):
            Os = shifted(O, o)[0]
            rx = (O[..., 0] - Os[..., 0]) - (c * dU[..., 0] - s * dU[..., 1])
            ry = (O[..., 1] - Os[..., 1]) - (s * dU[..., 0] + c * dU[..., 1])
            out += [np.where(valid, rx * wr, 0.0).ravel(), np.where(valid, ry * wr, 0.0).ravel()]
        out += [np.where(cvalid, (O[..., k] - C[..., k]) * wf, 0.0).ravel() for k in range(2)]
        return np.concatenate(out)
    return fun


# ============================================================================ (c) ARAP mesh
def arap_mesh_problem(rings=64, segs=32, kernels="fused"):
    """Spec 3.4 (Fig. 25) on a generated tube: bottom ring pinned, top ring twisted by 60
    degrees and shifted, the full move in one solve."""
    return mesh_example.arap_plan(rings, segs, kernels=kernels)


def arap_mesh_ref_residuals(plan, data, params):
    U, C = data["UrShape"], data["Constraints"]
    v0, v1 = data["v0"], data["v1"]
    wf, wr = params["w_fitSqrt"], params["w_regSqrt"]
    has = C[:, :1] >= -999999.9
    dU = U[v0] - U[v1]

    def fun(x):
        u = plan.vector_to_unknowns(x)
        O, A = u["Offset"], u["Angle"]
        fit = np.where(has, wf * (O - C), 0.0)
        reg = wr * ((O[v0] - O[v1]) - np.einsum("eij,ej->ei", mesh_example.rot3d(A[v0]), dU))
        return np.concatenate([fit.T.ravel(), reg.T.ravel()])
    return fun


def build_ceres_arap_mesh(plan, data, params):
    """One parameter block (offset xyz, angles abg) per vertex; a 3-residual block per directed
    edge (blocks v0, v1) and per handle (analytic Jacobians, Rotate3D = Rz Ry Rx)."""
    import pyceres

    wr, wf = params["w_regSqrt"], params["w_fitSqrt"]

    def rx(a):
        c, s = np.cos(a), np.sin(a)
        return np.array([[1, 0, 0], [0, c, -s], [0, s, c]]), np.array([[0, 0, 0], [0, -s, -c], [0, c, -s]])

    def ry(b):
        c, s = np.cos(b), np.sin(b)
        return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]), np.array([[-s, 0, c], [0, 0, 0], [-c, 0, -s]])

    def rz(g):
        c, s = np.cos(g), np.sin(g)
        return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]), np.array([[-s, -c, 0], [c, -s, 0], [0, 0, 0]])

    class Reg(pyceres.CostFunction):
        def __init__(self, du):
            super().__init__()
            self.du = du
            self.set_num_residuals(3)
            self.set_parameter_block_sizes([6, 6])

        def Evaluate(self, p, r, J):
            a, b = p[0], p[1]
            (X, dX), (Y, dY), (Z, dZ) = rx(a[3]), ry(a[4]), rz(a[5])
            rot = Z @ Y @ X
            r[:] = wr * ((a[:3] - b[:3]) - rot @ self.du)
            if J is not None:
                if J[0] is not None:
                    j0 = np.zeros((3, 6))
                    j0[:, :3] = wr * np.eye(3)
                    j0[:, 3] = -wr * (Z @ Y @ dX) @ self.du
                    j0[:, 4] = -wr * (Z @ dY @ X) @ self.du
                    j0[:, 5] = -wr * (dZ @ Y @ X) @ self.du
                    J[0][:] = j0.ravel()
                if J[1] is not None:
                    j1 = np.zeros((3, 6))
                    j1[:, :3] = -wr * np.eye(3)
                    J[1][:] = j1.ravel()
            return True

    class Fit(pyceres.CostFunction):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.set_num_residuals(3)
            self.set_parameter_block_sizes([6])

        def Evaluate(self, p, r, J):
            r[:] = wf * (p[0][:3] - self.c)
            if J is not None and J[0] is not None:
                j = np.zeros((3, 6))
                j[:, :3] = wf * np.eye(3)
                J[0][:] = j.ravel()
            return True

    U, C = data["UrShape"], data["Constraints"]
    blocks = np.concatenate([data["Offset"], data["Angle"]], 1).copy()
    views = [blocks[i] for i in range(len(blocks))]
    prob = pyceres.Problem()
    keep = []
    for a, b in zip(data["v0"], data["v1"]):
        cf = Reg((U[a] - U[b]).copy())
        keep.append(cf)
        prob.add_residual_block(cf, None, [views[a], views[b]])
    for i in np.flatnonzero(C[:, 0] >= -999999.9):
        cf = Fit(C[i].copy())
        keep.append(cf)
        prob.add_residual_block(cf, None, [views[i]])
    return prob, blocks, 0.0, keep


# ============================================================================ pyceres
def pyceres_available():
    try:
        import pyceres  # noqa: F401
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"


def build_ceres_poisson(plan, data):
    """One parameter block per free pixel (size 1); one residual block per (pixel, neighbour)
    touching a free pixel; fixed pixels are constant parameter blocks."""
    import pyceres

    class Diff(pyceres.CostFunction):
        def __init__(self, g):
            super().__init__()
            self.g = g
            self.set_num_residuals(1)
            self.set_parameter_block_sizes([1, 1])

        def Evaluate(self, p, r, J):
            r[0] = p[0][0] - p[1][0] - self.g
            if J is not None:
                if J[0] is not None:
                    J[0][0] = 1.0
                if J[1] is not None:
                    J[1][0] = -1.0
            return True

    X0 = data["X"]
    T, M = data["T"], data["M"]
    N1, N2 = X0.shape
    blocks = np.array(X0, dtype=np.float64).reshape(N1, N2, 1).copy()
    views = [[blocks[i, j] for j in range(N2)] for i in range(N1)]
    prob = pyceres.Problem()
    const_added = set()
    constant_cost = 0.0
    keep = []
    for dx, dy in NBRS:
        for i in range(N1):
            i2 = i + dx
            if not 0 <= i2 < N1:
                continue
            for j in range(N2):
                j2 = j + dy
                if not 0 <= j2 < N2:
                    continue
                g = T[i, j] - T[i2, j2]
                if M[i, j] != 0 and M[i2, j2] != 0:
                    r = X0[i, j] - X0[i2, j2] - g
                    constant_cost += 0.5 * r * r
                    continue
                cf = Diff(g)
                keep.append(cf)
                prob.add_residual_block(cf, None, [views[i][j], views[i2][j2]])
                for (a, b) in ((i, j), (i2, j2)):
                    if M[a, b] != 0 and (a, b) not in const_added:
                        const_added.add((a, b))
                        prob.set_parameter_block_constant(views[a][b])
    return prob, blocks, constant_cost, keep


def build_ceres_arap(plan, data, params):
    """One parameter block (ox, oy, angle) per shape pixel; residual blocks per (pixel,
    neighbour) edge (2 residuals) and per handle (2 residuals)."""
    import pyceres

    wr, wf = params["w_regSqrt"], params["w_fitSqrt"]

    class Reg(pyceres.CostFunction):
        def __init__(self, du):
            super().__init__()
            self.du = du
            self.set_num_residuals(2)
            self.set_parameter_block_sizes([3, 3])

        def Evaluate(self, p, r, J):
            a, b = p[0], p[1]
            c, s = np.cos(a[2]), np.sin(a[2])
            d0, d1 = self.du
            r[0] = wr * ((a[0] - b[0]) - (c * d0 - s * d1))
            r[1] = wr * ((a[1] - b[1]) - (s * d0 + c * d1))
            if J is not None:
                if J[0] is not None:
                    J[0][:] = [wr, 0.0, wr * (s * d0 + c * d1), 0.0, wr, -wr * (c * d0 - s * d1)]
                if J[1] is not None:
                    J[1][:] = [-wr, 0.0, 0.0, 0.0, -wr, 0.0]
            return True

    class Fit(pyceres.CostFunction):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.set_num_residuals(2)
            self.set_parameter_block_sizes([3])

        def Evaluate(self, p, r, J):
            a = p[0]
            r[0] = wf * (a[0] - self.c[0])
            r[1] = wf * (a[1] - self.c[1])
            if J is not None and J[0] is not None:
                J[0][:] = [wf, 0.0, 0.0, 0.0, wf, 0.0]
            return True

    U, C, Mk = data["UrShape"], data["Constraints"], data["Mask"]
    N1, N2 = Mk.shape
    blocks = np.zeros((N1, N2, 3))
    blocks[..., :2] = data["Offset"]
    blocks[..., 2] = data["Angle"]
    views = {}
    prob = pyceres.Problem()
    keep = []
    for i in range(N1):
        for j in range(N2):
            if Mk[i, j] == 0:
                views[(i, j)] = blocks[i, j]
    for dx, dy in NBRS:
        for (i, j), v in views.items():
            n = (i + dx, j + dy)
            if n not in views:
                continue
            cf = Reg((U[i, j] - U[n]).copy())
            keep.append(cf)
            prob.add_residual_block(cf, None, [v, views[n]])
    for (i, j), v in views.items():
        if C[i, j, 0] >= 0 and C[i, j, 1] >= 0:
            cf = Fit(C[i, j].copy())
            keep.append(cf)
            prob.add_residual_block(cf, None, [v])
    return prob, blocks, 0.0, keep


CERES_SOLVERS = {"pyceres SNC": "SPARSE_NORMAL_CHOLESKY", "pyceres CGNR": "CGNR"}


def ceres_solve(prob, target, const=0.0, max_iter=200, linear_solver="SPARSE_NORMAL_CHOLESKY"):
    """Solve with the given Ceres linear solver (CGNR: Ceres' default Jacobi preconditioner);
    returns (summary, wall time, time to target from the per-iteration cumulative time)."""
    import pyceres

    opts = pyceres.SolverOptions()
    opts.linear_solver_type = getattr(pyceres.LinearSolverType, linear_solver)
    opts.max_num_iterations = max_iter
    opts.minimizer_progress_to_stdout = False
    opts.function_tolerance = 1e-10
    opts.gradient_tolerance = 1e-14
    opts.parameter_tolerance = 1e-12
    opts.num_threads = 1
    hits = []

    class CB(pyceres.IterationCallback):
        def __call__(self, it):
            if not hits and it.cost + const <= target:
                hits.append(it.cumulative_time_in_seconds)
            return pyceres.CallbackReturnType.SOLVER_CONTINUE

    cb = CB()
    opts.callbacks = [cb]
    summary = pyceres.SolverSummary()
    t0 = time.perf_counter()
    pyceres.solve(opts, prob, summary)
    wall = time.perf_counter() - t0
    return summary, wall, (hits[0] if hits else None)


# ============================================================================ runners
class Reached(Exception):
    pass


def scipy_trf(fun, jac, x0, target=None, **kw):
    """least_squares trf/lsmr; records (time, cost) at every residual evaluation. With a
    target, stops (by exception) at the first evaluation with cost <= target."""
    rec = []
    t0 = time.perf_counter()

    def f(x):
        r = fun(x)
        c = 0.5 * float(r @ r)
        rec.append((time.perf_counter() - t0, c))
        if target is not None and c <= target:
            raise Reached
        return r

    res = None
    try:
        res = least_squares(f, x0, jac=jac, method="trf", tr_solver="lsmr", **kw)
    except Reached:
        pass
    return res, rec, time.perf_counter() - t0


def direct_gn(plan, x0, target, max_iter=20):
    """Gauss-Newton with a sparse direct solve of J^T J dx = -J^T F (SuperLU)."""
    t0 = time.perf_counter()
    x = x0.copy()
    for _ in range(max_iter):
        J = plan.jacobian(x)
        F = plan.residuals(x)
        A = (J.T @ J).tocsc()
        dx = spla.spsolve(A, -(J.T @ F))
        x = x + dx
        c = plan.cost(x)
        if c <= target:
            return time.perf_counter() - t0, c, x
    return None, c, x


F32_PLANS = {}  # id(float64 plan) -> the same problem compiled in float32


def lsq_time_to(plan, x0, method, target, budget=60.0, **kw):
    """(time to target or None, cost at stop, iterations, SolveResult). ``dtype="float32"`` in
    ``kw`` solves the float32 plan of the same problem (cost compared to the same target)."""
    if kw.pop("dtype", "float64") == "float32":
        plan = F32_PLANS[id(plan)]
        x0 = np.asarray(x0, np.float32)
    state = {"t": None}
    t0 = time.perf_counter()

    def cb(entry, x):
        el = time.perf_counter() - t0
        if entry.cost <= target:
            state["t"] = el
            return True
        return el > budget

    res = solve(plan, x0, method=method, callback=cb, **kw)
    return state["t"], res.cost, res.iterations, res


def agreement(plan, fun, rng):
    """lsq_opt residuals / cost / J^T F vs the independent numpy residuals (and J vs FD)."""
    x = plan.x0 + rng.normal(scale=0.1, size=plan.n)
    r_ref = fun(x)
    r = plan.residuals(x)
    c_ref = 0.5 * float(r_ref @ r_ref)
    J = plan.jacobian(x)
    g_ref = J.T @ r_ref
    g = plan.jtf(x)
    p = rng.normal(size=plan.n)
    h = 1e-6
    jp_fd = (fun(x + h * p) - fun(x - h * p)) / (2 * h)
    jp = J @ p
    out = {
        "max|r - r_ref|/max|r_ref|": float(np.abs(r - r_ref).max() / np.abs(r_ref).max()),
        "cost rel diff": abs(plan.cost(x) - c_ref) / c_ref,
        "jtf rel diff (vs J^T r_ref)": float(np.abs(g - g_ref).max() / np.abs(g_ref).max()),
        "J p vs FD of r_ref (rel)": float(np.abs(jp - jp_fd).max() / np.abs(jp_fd).max()),
        "jtjp vs J^T J p (rel)": float(np.abs(plan.jtjp(x, p) - J.T @ (J @ p)).max()
                                       / np.abs(J.T @ (J @ p)).max()),
    }
    ok = all(v < 1e-6 for v in out.values())
    return ok, out


def median_or_none(ts):
    ts = [t for t in ts if t is not None]
    return statistics.median(ts) if ts else None


def run_case(name, plan, fun, x0, args, rng, ceres_builder, lsq_configs):
    print(f"\n=== {name}: {plan}  (unknowns n = {plan.n}, residuals m = {plan.m})")
    ok, diffs = agreement(plan, fun, rng)
    for k, v in diffs.items():
        print(f"  check {k:32s}: {v:.2e}")
    if not ok:
        print("  AGREEMENT CHECK FAILED: not timing this case")
        return None
    # ---- baseline to convergence (untimed reference run for the target cost)
    lsq_only = args.targets is not None
    if lsq_only:  # the target of an earlier full run (--save-targets): time lsq_opt only
        import json

        with open(args.targets) as f:
            base_cost = float(json.load(f)[name])
        t_full = None
        print(f"  scipy trf final cost from {args.targets}: {base_cost:.10e} (baselines not run)")
    else:
        res, rec, t_full = scipy_trf(fun, plan.jacobian, x0, ftol=1e-12, xtol=1e-12,
                                     gtol=1e-12, max_nfev=args.max_nfev)
        base_cost = float(res.cost)
    target = (1 + REL) * base_cost
    if not lsq_only:
        print(f"  scipy trf/lsmr to convergence: cost {base_cost:.10e} (scipy res.cost; 1/2 sum r^2 "
              f"of its x = {0.5 * float(fun(res.x) @ fun(res.x)):.10e}), nfev {res.nfev}, status "
              f"{res.status} ({res.message}), {t_full:.2f} s")
    print(f"  initial cost {plan.cost(x0):.6e}; target = (1 + {REL:g}) x {base_cost:.6e} = {target:.6e}")
    if not lsq_only:
        t_trf_first = next((t for t, c in rec if c <= target), None)
        print(f"  scipy trf time to target within that run: {bench.fmt_time(t_trf_first)}")

    cases = {}
    if not lsq_only:
        cases["scipy trf/lsmr"] = lambda: scipy_trf(fun, plan.jacobian, x0, target=target,
                                                    ftol=1e-12, xtol=1e-12, gtol=1e-12,
                                                    max_nfev=args.max_nfev)[2]
    if name.startswith("Poisson") and not lsq_only:
        cases["scipy GN + SuperLU(J^T J)"] = lambda: direct_gn(plan, x0, target)[0]

    # one untimed warm-up + report of the final costs of each lsq_opt config
    finals = {}
    for label, method, kw in lsq_configs:
        t, c, it, r = lsq_time_to(plan, x0, method, target, budget=args.budget, **kw)
        finals[label] = (t, c, it, r.pcg_iterations, r.termination_reason)
        print(f"  warm-up {label:28s}: reached={t is not None} cost {c:.8e} after {it} iters "
              f"({r.pcg_iterations} PCG), stop: {r.termination_reason}, t={bench.fmt_time(t)}")
    for label, method, kw in lsq_configs:  # timed repeats only for configs that got there
        if finals[label][0] is not None:
            cases[label] = (lambda method=method, kw=kw:
                            lsq_time_to(plan, x0, method, target, budget=args.budget, **kw)[0])
        else:
            print(f"  {label}: did not reach the target within {args.budget:g} s; not repeated")
    direct = None
    if "scipy GN + SuperLU(J^T J)" in cases:
        direct = direct_gn(plan, x0, target)
        print(f"  warm-up scipy GN + SuperLU     : cost {direct[1]:.8e},"
              f" t={bench.fmt_time(direct[0])}")

    times = {k: [] for k in cases}
    names = list(cases)
    for r in range(args.repeats):
        k = r % len(names)
        for nm in names[k:] + names[:k]:
            times[nm].append(cases[nm]())
    med = {k: median_or_none(v) for k, v in times.items()}

    # ---- pyceres (each linear solver on a freshly built problem: solve moves the parameters)
    ceres_rows = {}
    if ceres_builder is not None and not args.no_ceres and not lsq_only:
        for label, linear_solver in CERES_SOLVERS.items():
            try:
                t0 = time.perf_counter()
                prob, blocks, const, keep = ceres_builder()
                t_build = time.perf_counter() - t0
                summary, wall, t_tg = ceres_solve(prob, target, const, linear_solver=linear_solver)
                ccost = summary.final_cost + const
                print(f"  {label} ({linear_solver}): build {t_build:.2f} s, solve {wall:.2f} s, "
                      f"final cost {ccost:.10e} ({summary.num_successful_steps} steps, "
                      f"termination {summary.termination_type}); "
                      f"vs scipy cost rel diff {(ccost - base_cost) / base_cost:+.2e}; "
                      f"time to target (Ceres cumulative iteration time) {bench.fmt_time(t_tg)}")
                print("  " + summary.BriefReport())
                ceres_rows[label] = (t_tg if t_tg is not None else wall, ccost, t_build,
                                     t_tg is not None)
            except Exception as e:  # noqa: BLE001
                print(f"  {label} failed: {type(e).__name__}: {e}")
    return dict(name=name, n=plan.n, base_cost=base_cost, target=target, med=med, times=times,
                finals=finals, ceres=ceres_rows, t_full=t_full)


def profile_solve(plan, x0, method, target, kw, top=25):
    pr = cProfile.Profile()
    pr.enable()
    t, c, it, r = lsq_time_to(plan, x0, method, target, budget=120, **kw)
    pr.disable()
    print(f"time to target {bench.fmt_time(t)} (under cProfile), {it} iterations,"
          f" {r.pcg_iterations} PCG")
    s = io.StringIO()
    ps = pstats.Stats(pr, stream=s).sort_stats("tottime")
    ps.print_stats(top)
    print(s.getvalue())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--poisson-size", type=int, default=512)
    ap.add_argument("--arap-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=30.0, help="lsq_opt per-solve time cap [s]")
    ap.add_argument("--max-nfev", type=int, default=500)
    ap.add_argument("--no-ceres", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one lsq_opt solve per problem")
    ap.add_argument("--mesh-size", type=int, nargs=2, default=(64, 32), metavar=("RINGS", "SEGS"),
                    help="ARAP mesh tube: rings x vertices per ring")
    ap.add_argument("--save-targets", metavar="JSON", help="write each problem's scipy final cost")
    ap.add_argument("--targets", metavar="JSON",
                    help="read the final costs of --save-targets and time lsq_opt only (e.g. "
                         "--kernels lanes for a before/after comparison)")
    ap.add_argument("--multigrid-everywhere", action="store_true",
                    help="also time LM with the multigrid preconditioner on every problem")
    ap.add_argument("--kernels", choices=["fused", "lanes"], default="fused",
                    help="lsq_opt product kernels (lanes: the numpy composition, the oracle)")
    ap.add_argument("--only", choices=["poisson", "arap", "arap_mesh"], default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    have_ceres, why = pyceres_available()
    if not have_ceres:
        print(f"pyceres: not available ({why}); skipping the Ceres baseline")
    print(bench.machine_info(extra=f"scipy {scipy.__version__}; lsq_opt backend llvm, kernels {args.kernels}, float64 (+ float32 configs); "
                             f"pyceres {'yes' if have_ceres else 'no'}",
                       modules=("numpy", "scipy", "core_ad", "lsq_opt", "pyceres")))

    def cfg(label, method, pcg, **kw):
        return (label, method, dict(max_iterations=100000, pcg_max_iterations=pcg,
                                    function_tolerance=0.0, **kw))

    # Short inner solves (PCG 10) win on ARAP mesh: about as many LM iterations as PCG 50 at a
    # fifth of the PCG work (measured: 326 vs 303 iterations to the target)
    lsq_configs = [
        cfg("lsq_opt LM (PCG 10)", "lm", 10),
        cfg("lsq_opt LM f32 (PCG 10)", "lm", 10, dtype="float32"),
        cfg("lsq_opt LM (PCG 50)", "lm", 50),
        cfg("lsq_opt LM f32 (PCG 50)", "lm", 50, dtype="float32"),
        cfg("lsq_opt GN (PCG 100)", "gn", 100),
        cfg("lsq_opt GN (PCG 1000)", "gn", 1000),
    ]
    # the multigrid preconditioner (J^T J assembled from generated stencil planes, aggregation
    # AMG V-cycle; grid energies only): one GN step on the linear Poisson problem; on ARAP image
    # warping it is rebuilt every LM iteration and a few V-cycles per step suffice (measured:
    # 63 LM iterations with PCG 3 or 5, 74 with Jacobi PCG 50)
    poisson_extra = [
        cfg("lsq_opt GN multigrid (PCG 8)", "gn", 8, preconditioner="multigrid"),
        cfg("lsq_opt GN f32 multigrid (PCG 8)", "gn", 8, preconditioner="multigrid",
            dtype="float32"),
    ]
    arap_extra = [
        cfg("lsq_opt LM multigrid (PCG 3)", "lm", 3, preconditioner="multigrid"),
        cfg("lsq_opt LM f32 multigrid (PCG 3)", "lm", 3, preconditioner="multigrid",
            dtype="float32"),
    ]
    if args.multigrid_everywhere:
        lsq_configs = lsq_configs + [
            ("lsq_opt LM multigrid (PCG 10)", "lm", dict(max_iterations=100000,
                                                         pcg_max_iterations=10,
                                                         function_tolerance=0.0,
                                                         preconditioner="multigrid"))]
    results = []
    compile_times = {}
    plans = {}
    if args.only in (None, "poisson"):
        energy, data = poisson_problem(args.poisson_size)
        t0 = time.perf_counter()
        plan = compile_problem(energy, arrays=data, kernels=args.kernels)
        F32_PLANS[id(plan)] = compile_problem(energy, arrays=data, kernels=args.kernels,
                                              dtype=np.float32)
        x0 = plan.x0.copy()
        plan.cost(x0)
        plan.jtf(x0)
        compile_times["Poisson"] = time.perf_counter() - t0
        fun = poisson_ref_residuals(plan, data)
        builder = (lambda: build_ceres_poisson(plan, data)) if have_ceres else None
        r = run_case(f"Poisson {args.poisson_size}x{args.poisson_size}", plan, fun, x0, args, rng,
                     builder, lsq_configs + poisson_extra)
        if r:
            results.append(r)
            plans["Poisson"] = (plan, x0, r["target"])
    if args.only in (None, "arap"):
        energy, data, params = arap_problem(args.arap_size)
        t0 = time.perf_counter()
        plan = compile_problem(energy, arrays=data, params=params, kernels=args.kernels)
        F32_PLANS[id(plan)] = compile_problem(energy, arrays=data, params=params,
                                              kernels=args.kernels, dtype=np.float32)
        x0 = plan.x0.copy()
        plan.cost(x0)
        plan.jtf(x0)
        compile_times["ARAP"] = time.perf_counter() - t0
        fun = arap_ref_residuals(plan, data, params)
        builder = (lambda: build_ceres_arap(plan, data, params)) if have_ceres else None
        r = run_case(f"ARAP {args.arap_size}x{args.arap_size}", plan, fun, x0, args, rng,
                     builder, lsq_configs + arap_extra)
        if r:
            results.append(r)
            plans["ARAP"] = (plan, x0, r["target"])

    if args.only in (None, "arap_mesh"):
        t0 = time.perf_counter()
        plan, data, params = arap_mesh_problem(*args.mesh_size, kernels=args.kernels)
        F32_PLANS[id(plan)] = mesh_example.arap_plan(*args.mesh_size, kernels=args.kernels,
                                                     dtype=np.float32)[0]
        x0 = plan.x0.copy()
        plan.cost(x0)
        plan.jtf(x0)
        compile_times["ARAP mesh"] = time.perf_counter() - t0
        fun = arap_mesh_ref_residuals(plan, data, params)
        builder = (lambda: build_ceres_arap_mesh(plan, data, params)) if have_ceres else None
        nv = args.mesh_size[0] * args.mesh_size[1]
        r = run_case(f"ARAP mesh {nv} vertices", plan, fun, x0, args, rng, builder, lsq_configs)
        if r:
            results.append(r)
            plans["ARAP mesh"] = (plan, x0, r["target"])

    if args.save_targets:
        import json

        with open(args.save_targets, "w") as f:
            json.dump({r["name"]: r["base_cost"] for r in results}, f, indent=1)
    print("\nlsq_opt compile + first evaluation (not in the solve times): " +
          ", ".join(f"{k} {v:.2f} s" for k, v in compile_times.items()))

    def key(name):
        return ("Poisson" if name.startswith("Poisson") else
                "ARAP mesh" if name.startswith("ARAP mesh") else "ARAP")
    results_by = {key(r["name"]): r for r in results}
    if args.profile:
        for k, (plan, x0, target) in plans.items():
            label, method, kw = min((c for c in lsq_configs if results_by[k]["med"].get(c[0])),
                                    key=lambda c: results_by[k]["med"][c[0]], default=lsq_configs[0])
            print(f"\n--- cProfile of {label} on {k} (sorted by tottime)")
            profile_solve(plan, x0, method, target, kw)

    rows = []
    for r in results:
        med = r["med"]
        base_names = [k for k in med if not k.startswith("lsq_opt")]
        best = min((k for k in base_names if med[k] is not None), key=lambda k: med[k], default=None)
        best_t = med[best] if best else None
        for label, (t_c, _, _, reached) in r["ceres"].items():
            if reached and (best_t is None or t_c < best_t):
                best, best_t = label, t_c
        lm_k = min((k for k in med if k.startswith("lsq_opt LM") and med[k] is not None),
                   key=lambda k: med[k], default=None)
        gn_k = min((k for k in med if k.startswith("lsq_opt GN") and med[k] is not None),
                   key=lambda k: med[k], default=None)
        lm = med[lm_k] if lm_k else None
        gn = med[gn_k] if gn_k else None
        ours = min((t for t in (lm, gn) if t is not None), default=None)
        ratio = f"{best_t / ours:.2f}x" if (ours and best_t) else "-"
        rows.append([r["name"], r["n"], f"{best}, {r['base_cost']:.6e}, {bench.fmt_time(best_t)}",
                     f"{bench.fmt_time(lm)} ({lm_k[8:] if lm_k else '-'})",
                     f"{bench.fmt_time(gn)} ({gn_k[8:] if gn_k else '-'})", ratio])
    print(f"\nAll times: wall time to reach cost <= (1 + {REL:g}) x scipy trf final cost, median of "
          f"{args.repeats}; lsq_opt float64 (and float32 where named), llvm backend.\n")
    for r in results:
        stats = {k: bench.summarize([t for t in ts if t is not None])
                 if any(t is not None for t in ts) else None for k, ts in r["times"].items()}
        notes = {}
        for label, (t_c, c_cost, t_build, reached) in r["ceres"].items():
            stats[label] = bench.summarize([t_c])
            notes[label] = (f"1 run; {'reached' if reached else 'target NOT reached: total'};"
                            f" build {bench.fmt_time(t_build)} excluded")
        ours = min((k for k in stats if k.startswith("lsq_opt") and stats[k] is not None),
                   key=lambda k: stats[k]["median"], default=None)
        if ours is None:
            print(f"{r['name']}: no lsq_opt configuration reached the target")
            continue
        bench.side_by_side(stats, ours, columns={"note": notes},
                           title=f"{r['name']}: time to cost <= {r['target']:.8e}")
        print()
    print()
    bench.print_table(["problem", "unknowns", "best baseline (method, final cost, time)",
                 "lsq_opt LM time-to-cost (best config)", "GN time (best config)",
                 "ratio best-baseline / best lsq_opt"], rows)


if __name__ == "__main__":
    main()
