"""The 26 univariate NIST StRD non-linear regression problems (spec 3.13, AE-8; Figs. 22/23).

Data: ``nist_data/<Name>.dat`` (the NIST sheets are US-Government public-domain data; each file
names where its numbers were transcribed from), one header of ``# Key: value`` lines (model,
level, start 1, certified parameters, certified residual sum of squares) and ``y x`` rows.

Encoding in the DSL (spec 3.13 [R]): one Unknown ``funcParams`` with K channels on a 1-element
index space ``U``, one Array ``data`` of (x, y) on ``{N}``, a Graph with slot ``d`` over ``N`` and
slot ``b`` over ``U`` (one hyperedge per data point, every ``b`` pointing at element 0), and the
residual ``y - f(x; b1..bK)``. All K unknowns are read by every hyperedge, so the J^T F / J^T J p
scatters pile N contributions onto K entries. (Opt also needed a zero dummy stencil energy;
this compiler takes graph-only energies.) Derivatives come from ``core_ad.sym``.

Solver settings (spec 3.13 / 7.10 [R]): LM with at most 10000 non-linear iterations, K + 3 PCG
iterations, the Ceres NIST configuration (initial trust region 1e4, function tolerance 1e-20,
gradient tolerance 1e-30), i.e. a solve stops when the trust region collapses. GN runs as many
iterations as LM f64 took (spec: min(#Ceres, #LM) iterations; Ceres is not run here).

A problem is *reached* when every parameter agrees with its certified value to >= 6
significant digits, or the residual sum of squares matches the certified one to rel 1e-8
(AE-8). :func:`scipy_reference` is scipy's MINPACK LM on the same compiled residuals and J.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from core_ad import sym

from lsq_opt import Array, Dim, Energy, Graph, Unknown, compile_problem, solve

from ._image import write_png

NAME = "nist"
DATA_DIR = os.path.join(os.path.dirname(__file__), "nist_data")

# Fig. 22 shows the first 15, Fig. 23 the last 11 (spec 7.11 [D]: [R]'s alphabetical order).
NAMES = ("Bennett5", "BoxBOD", "Chwirut1", "Chwirut2", "DanWood", "Eckerle4", "ENSO", "Gauss1",
         "Gauss2", "Gauss3", "Hahn1", "Kirby2", "Lanczos1", "Lanczos2", "Lanczos3", "MGH09",
         "MGH10", "MGH17", "Misra1a", "Misra1b", "Misra1c", "Misra1d", "Rat42", "Rat43",
         "Roszman1", "Thurber")

SIGNIFICANT_DIGITS = 6.0  # AE-8: parameters to >= 6 significant digits ...
RSS_RTOL = 1e-8           # ... or the certified RSS to rel 1e-8
# Ceres' NIST configuration (spec 7.10), which Opt's LM defaults match
CERES_NIST = dict(initial_trust_region_radius=1e4, max_trust_region_radius=1e16,
                  min_trust_region_radius=1e-32, min_relative_decrease=1e-3, min_lm_diagonal=1e-6,
                  max_lm_diagonal=1e32, jacobi_scaling=True, function_tolerance=1e-20,
                  gradient_tolerance=1e-30, parameter_tolerance=0.0, pcg_tolerance=1e-10,
                  q_tolerance=1e-4, preconditioner="jacobi")
MAX_ITERATIONS = 10000

NUMPY_MATH = SimpleNamespace(exp=np.exp, cos=np.cos, sin=np.sin, arctan=np.arctan)
DSL_MATH = SimpleNamespace(exp=sym.exp, cos=sym.cos, sin=sym.sin, arctan=sym.arctan)
_TWO_PI = 2.0 * math.pi


def _gauss(x, b, m):
    return (b[0] * m.exp(-b[1] * x) + b[2] * m.exp(-(x - b[3]) ** 2 / b[4] ** 2)
            + b[5] * m.exp(-(x - b[6]) ** 2 / b[7] ** 2))


def _lanczos(x, b, m):
    return b[0] * m.exp(-b[1] * x) + b[2] * m.exp(-b[3] * x) + b[4] * m.exp(-b[5] * x)


def _cubic_over_cubic(x, b, m):
    return (b[0] + b[1] * x + b[2] * x ** 2 + b[3] * x ** 3) / (1 + b[4] * x + b[5] * x ** 2 + b[6] * x ** 3)


def _chwirut(x, b, m):
    return m.exp(-b[0] * x) / (b[1] + b[2] * x)


def _enso(x, b, m):
    return (b[0] + b[1] * m.cos(_TWO_PI * x / 12) + b[2] * m.sin(_TWO_PI * x / 12)
            + b[4] * m.cos(_TWO_PI * x / b[3]) + b[5] * m.sin(_TWO_PI * x / b[3])
            + b[7] * m.cos(_TWO_PI * x / b[6]) + b[8] * m.sin(_TWO_PI * x / b[6]))


# f(x; b, m): one text per model, evaluated on numpy arrays (m = NUMPY_MATH) or built as a DSL
# residual (m = DSL_MATH, x a graph read of the data, b the K channels of the unknown).
MODELS = {
    "Bennett5": lambda x, b, m: b[0] * (b[1] + x) ** (-1.0 / b[2]),
    "BoxBOD": lambda x, b, m: b[0] * (1 - m.exp(-b[1] * x)),
    "Chwirut1": _chwirut,
    "Chwirut2": _chwirut,
    "DanWood": lambda x, b, m: b[0] * x ** b[1],
    "Eckerle4": lambda x, b, m: (b[0] / b[1]) * m.exp(-0.5 * ((x - b[2]) / b[1]) ** 2),
    "ENSO": _enso,
    "Gauss1": _gauss,
    "Gauss2": _gauss,
    "Gauss3": _gauss,
    "Hahn1": _cubic_over_cubic,
    "Kirby2": lambda x, b, m: (b[0] + b[1] * x + b[2] * x ** 2) / (1 + b[3] * x + b[4] * x ** 2),
    "Lanczos1": _lanczos,
    "Lanczos2": _lanczos,
    "Lanczos3": _lanczos,
    "MGH09": lambda x, b, m: b[0] * (x ** 2 + x * b[1]) / (x ** 2 + x * b[2] + b[3]),
    "MGH10": lambda x, b, m: b[0] * m.exp(b[1] / (x + b[2])),
    "MGH17": lambda x, b, m: b[0] + b[1] * m.exp(-x * b[3]) + b[2] * m.exp(-x * b[4]),
    "Misra1a": lambda x, b, m: b[0] * (1 - m.exp(-b[1] * x)),
    "Misra1b": lambda x, b, m: b[0] * (1 - (1 + b[1] * x / 2) ** -2.0),
    "Misra1c": lambda x, b, m: b[0] * (1 - (1 + 2 * b[1] * x) ** -0.5),
    "Misra1d": lambda x, b, m: b[0] * b[1] * x / (1 + b[1] * x),
    "Rat42": lambda x, b, m: b[0] / (1 + m.exp(b[1] - b[2] * x)),
    "Rat43": lambda x, b, m: b[0] / (1 + m.exp(b[1] - b[2] * x)) ** (1 / b[3]),
    "Roszman1": lambda x, b, m: b[0] - b[1] * x - m.arctan(b[2] / (x - b[3])) / math.pi,
    "Thurber": _cubic_over_cubic,
}


class NistDataError(ValueError):
    """An unknown problem name or a malformed ``nist_data`` file."""


@dataclass
class NistData:
    name: str
    level: str            # NIST difficulty: lower / average / higher
    model: str            # the model as the sheet writes it
    x: np.ndarray
    y: np.ndarray
    start: np.ndarray     # NIST start 1
    certified: np.ndarray
    certified_rss: float | None   # None where no stored source had it
    source: str

    @property
    def n_params(self) -> int:
        return len(self.certified)

    def residuals(self, b) -> np.ndarray:
        """y - f(x; b) in numpy float64 (the reference the compiled plan is checked against)."""
        with np.errstate(all="ignore"):
            return self.y - MODELS[self.name](self.x, np.asarray(b, np.float64), NUMPY_MATH)


def canonical_name(name: str) -> str:
    for n in NAMES:
        if n.lower() == str(name).lower():
            return n
    raise NistDataError(f"unknown NIST problem {name!r}; expected one of {', '.join(NAMES)}")


def load(name: str) -> NistData:
    """Parse ``nist_data/<Name>.dat`` (header checked against its rows)."""
    name = canonical_name(name)
    path = os.path.join(DATA_DIR, f"{name}.dat")
    head, rows = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                key, sep, value = line[1:].partition(":")
                if sep:
                    head[key.strip()] = value.strip()
            elif line.strip():
                rows.append([float(v) for v in line.split()])
    try:
        rows = np.array(rows, np.float64).reshape(-1, 2)
        start = np.array(head["Start1"].split(), np.float64)
        cert = np.array(head["Certified"].split(), np.float64)
        rss = None if head["CertifiedRSS"] == "unknown" else float(head["CertifiedRSS"])
        n_obs, k = int(head["Observations"]), int(head["Parameters"])
        data = NistData(name, head["Level"], head["Model"], rows[:, 1].copy(), rows[:, 0].copy(),
                        start, cert, rss, head["Data source"])
    except (KeyError, ValueError) as e:
        raise NistDataError(f"{path}: malformed NIST data file ({e})") from e
    if len(rows) != n_obs or len(start) != k or len(cert) != k:
        raise NistDataError(f"{path}: {len(rows)} rows, {len(start)} start / {len(cert)} certified "
                            f"values; the header says {n_obs} observations, {k} parameters")
    return data


# ----------------------------------------------------------------------------- the DSL problem
def nist_energy(name: str, n_params: int) -> Energy:
    """Spec 3.13's encoding: y - f(x; b) per hyperedge, b the K channels of funcParams(G.b)."""
    U, N = Dim("U"), Dim("N")
    params = Unknown("funcParams", U, n_params)
    data = Array("data", N, 2)
    G = Graph("G", d=N, b=U)
    b = [params(G.b, k) for k in range(n_params)]
    return Energy(data(G.d, 1) - MODELS[canonical_name(name)](data(G.d, 0), b, DSL_MATH))


@dataclass
class NistProblem:
    data: NistData
    energy: Energy
    arrays: dict
    graphs: dict

    def compile(self, dtype=np.float64, kernels=None):
        return compile_problem(self.energy, arrays=self.arrays, graphs=self.graphs, dtype=dtype,
                               kernels=kernels)


def problem(name: str, start=None) -> NistProblem:
    """The energy and its bound data (start 1 unless ``start`` is given)."""
    d = load(name)
    x0 = d.start if start is None else np.asarray(start, np.float64)
    if x0.shape != (d.n_params,):
        raise NistDataError(f"{d.name}: start must have {d.n_params} values, got shape {x0.shape}")
    n = len(d.x)
    arrays = {"data": np.stack([d.x, d.y], axis=1), "funcParams": x0.reshape(1, -1)}
    graphs = {"G": {"d": np.arange(n), "b": np.zeros(n, np.int64)}}
    return NistProblem(d, nist_energy(d.name, d.n_params), arrays, graphs)


# ----------------------------------------------------------------------------- accuracy
def significant_digits(b, certified) -> float:
    """Min over parameters of -log10(|b - c| / |c|) (the LRE); inf for an exact match."""
    b, c = np.asarray(b, np.float64), np.asarray(certified, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(b - c) / np.abs(c)
    worst = float(np.max(rel)) if np.all(np.isfinite(rel)) else math.inf
    return math.inf if worst == 0.0 else -math.log10(worst)


def reached(data: NistData, b) -> tuple[bool, float, float]:
    """(AE-8 reached?, significant digits, RSS of b in float64)."""
    rss = float(np.sum(data.residuals(b) ** 2))
    digits = significant_digits(b, data.certified)
    ok = digits >= SIGNIFICANT_DIGITS
    if data.certified_rss is not None and math.isfinite(rss):
        ok |= abs(rss - data.certified_rss) <= RSS_RTOL * data.certified_rss
    return bool(ok), digits, rss


@dataclass
class NistResult:
    name: str
    method: str
    dtype: str
    x: np.ndarray          # float64 copy of the final parameters
    rss: float             # sum r^2 at x, in float64
    digits: float
    reached: bool
    iterations: int
    pcg_iterations: int
    termination: str
    wall_time: float
    costs: list = field(default_factory=list)   # cost after every iteration (index 0: start)


def solve_nist(name: str, method: str = "lm", dtype=np.float64, *, start=None,
               max_iterations: int = MAX_ITERATIONS, pcg_max_iterations: int | None = None,
               plan=None, **options) -> NistResult:
    """Solve one problem with lsq_opt's LM or GN (settings of the module docstring; ``options``
    override them). ``plan``: a compiled plan of :func:`problem` to reuse (its dtype wins)."""
    d = load(name)
    if plan is None:
        plan = problem(d.name, start).compile(dtype=dtype)
    x0 = plan.x0 if start is None else np.asarray(start, plan.dtype)
    k = d.n_params
    opts = dict(CERES_NIST, max_iterations=max_iterations,
                pcg_max_iterations=k + 3 if pcg_max_iterations is None else pcg_max_iterations)
    opts.update(options)
    # float32 runs overflow the 1e32 diagonal clamp (no upper bound then) and huge trial steps
    # (rejected) to inf; both are handled, so the overflow warnings are noise here
    with np.errstate(over="ignore", invalid="ignore"):
        res = solve(plan, x0, method, **opts)
    xb = np.asarray(res.x, np.float64)
    ok, digits, rss = reached(d, xb)
    costs = [res.initial_cost] + [e.cost for e in res.log]
    return NistResult(d.name, method, np.dtype(plan.dtype).name, xb, rss, digits, ok,
                      res.iterations, res.pcg_iterations, res.termination_reason, res.wall_time,
                      costs)


def scipy_reference(name: str, plan=None) -> NistResult:
    """scipy.optimize.least_squares(method="lm") (MINPACK) from start 1 on the compiled float64
    residuals and materialised J, tolerances at 1e-15."""
    from scipy.optimize import least_squares

    d = load(name)
    if plan is None:
        plan = problem(d.name).compile()
    t0 = time.perf_counter()
    r = least_squares(lambda b: plan.residuals(b), d.start, jac=lambda b: plan.jacobian(b).toarray(),
                      method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=20000)
    ok, digits, rss = reached(d, r.x)
    return NistResult(d.name, "scipy-lm", "float64", r.x.copy(), rss, digits, ok, int(r.nfev), 0,
                      r.message, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- run + figure
def run(size=None, verbose=False, out_dir=None, *, names=None) -> dict:
    """All problems (or ``names`` / ``size``: a sequence of names): scipy LM, lsq_opt LM float64
    and float32 and GN float64 from start 1; ``<out_dir>/nist.png`` has the cost curves."""
    names = [canonical_name(n) for n in (names or size or NAMES)]
    rows, t_compile, t_solve = [], 0.0, 0.0
    for name in names:
        t0 = time.perf_counter()
        prob = problem(name)
        plan64, plan32 = prob.compile(np.float64), prob.compile(np.float32)
        t_compile += time.perf_counter() - t0
        ref = scipy_reference(name, plan64)
        lm64 = solve_nist(name, "lm", plan=plan64)
        lm32 = solve_nist(name, "lm", plan=plan32)
        gn64 = solve_nist(name, "gn", plan=plan64, max_iterations=max(lm64.iterations, 1))
        t_solve += lm64.wall_time + lm32.wall_time + gn64.wall_time
        row = {"name": name, "level": prob.data.level, "K": prob.data.n_params, "N": len(prob.data.x),
               "scipy": ref, "lm64": lm64, "lm32": lm32, "gn64": gn64,
               "initial_cost": lm64.costs[0],
               "certified_cost": (0.5 * prob.data.certified_rss if prob.data.certified_rss is not None
                                  else 0.5 * float(np.sum(prob.data.residuals(prob.data.certified) ** 2)))}
        rows.append(row)
        if verbose:
            print(table_line(row), flush=True)
    out = {
        "example": NAME, "size": f"{len(rows)} problems", "method": "lm",
        "unknowns": sum(r["K"] for r in rows),
        "initial_cost": sum(r["initial_cost"] for r in rows),
        "cost": sum(0.5 * r["lm64"].rss for r in rows),
        "iterations": sum(r["lm64"].iterations for r in rows),
        "pcg_iterations": sum(r["lm64"].pcg_iterations for r in rows),
        "time_compile_s": t_compile, "time_solve_s": t_solve, "problems": rows,
        "lm_reached": sum(r["lm64"].reached for r in rows),
        "scipy_reached": sum(r["scipy"].reached for r in rows),
        # AE-8: wherever scipy's LM reaches the certified values, lsq_opt's LM f64 does too
        "lm_matches_scipy": all(r["lm64"].reached for r in rows if r["scipy"].reached),
        "finite": all(np.all(np.isfinite(r["lm64"].x)) for r in rows),
    }
    if out_dir is not None:
        out["png"] = write_png(os.path.join(out_dir, f"{NAME}.png"), cost_curves_figure(rows))
    return out


TABLE_HEADER = (f"{'problem':<9} {'level':<7} {'K':>2} {'scipy-lm':>10} {'LM f64':>10} {'its':>5} "
                f"{'LM f32':>10} {'GN f64':>10}  (reached? significant digits)")


def nist_table(result) -> str:
    """The per-problem table of a :func:`run` result."""
    return "\n".join([TABLE_HEADER] + [table_line(row) for row in result["problems"]])


def table_line(row) -> str:
    def cell(r):
        return f"{'yes' if r.reached else 'no':>3} {max(min(r.digits, 99.0), -99.0):5.1f}"
    return (f"{row['name']:<9} {row['level']:<7} {row['K']:>2} {cell(row['scipy']):>10} "
            f"{cell(row['lm64']):>10} {row['lm64'].iterations:>5} {cell(row['lm32']):>10} "
            f"{cell(row['gn64']):>10}")


# Plain numpy rasterisation (lines and a 3x5 digit font): the figure needs no plotting library.
_COLOURS = {"gn64": (40, 150, 60), "lm32": (230, 120, 20), "lm64": (31, 90, 180)}  # drawn in this order
_DIGITS = {c: rows for c, rows in zip(
    "0123456789e-.", [
        ("111", "101", "101", "101", "111"), ("010", "110", "010", "010", "111"),
        ("111", "001", "111", "100", "111"), ("111", "001", "111", "001", "111"),
        ("101", "101", "111", "001", "001"), ("111", "100", "111", "001", "111"),
        ("111", "100", "111", "101", "111"), ("111", "001", "010", "010", "010"),
        ("111", "101", "111", "101", "111"), ("111", "101", "111", "001", "111"),
        ("000", "111", "101", "110", "011"), ("000", "000", "111", "000", "000"),
        ("000", "000", "000", "000", "010")])}


def _text(img, r, c, s, rgb=(0, 0, 0)):
    """Digits, 'e', '-', '.' in a 3x5 font (other characters leave a gap)."""
    for ch in s:
        glyph = _DIGITS.get(ch)
        if glyph is not None:
            for i, row in enumerate(glyph):
                for j, bit in enumerate(row):
                    if bit == "1" and 0 <= r + i < img.shape[0] and 0 <= c + j < img.shape[1]:
                        img[r + i, c + j] = rgb
        c += 4


def _polyline(img, pts, rgb):
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        xs = np.linspace(x0, x1, n).round().astype(int)
        ys = np.linspace(y0, y1, n).round().astype(int)
        ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
        img[ys[ok], xs[ok]] = rgb


def cost_curves_figure(rows, cols=6, w=180, h=120) -> np.ndarray:
    """One panel per problem: log10(cost) against log10(1 + iteration) for LM f64 (blue), LM f32
    (orange), GN f64 (green); dotted grey: the certified cost RSS/2. Top left: the panel's
    1-based index (and the name, with Pillow); right edge: the panel's log10 cost range."""
    nrows = -(-len(rows) // cols)
    img = np.full((nrows * (h + 8) + 4, cols * (w + 8) + 4, 3), 255, np.uint8)
    for p, row in enumerate(rows):
        r0, c0 = 4 + (p // cols) * (h + 8), 4 + (p % cols) * (w + 8)
        img[r0, c0:c0 + w] = img[r0 + h - 1, c0:c0 + w] = 160
        img[r0:r0 + h, c0] = img[r0:r0 + h, c0 + w - 1] = 160
        curves = {k: np.log10(np.maximum(np.asarray(row[k].costs, np.float64), 1e-300))
                  for k in _COLOURS}
        target = math.log10(max(row["certified_cost"], 1e-300))
        finite = np.concatenate([v[np.isfinite(v)] for v in curves.values()] + [np.array([target])])
        lo, hi = float(finite.min()), float(finite.max())
        hi = hi if hi > lo else lo + 1.0
        n_max = max(len(v) for v in curves.values())
        sx = (w - 16) / max(math.log10(n_max), 1e-9)

        def to_px(i, v, lo=lo, hi=hi, sx=sx, r0=r0, c0=c0):
            return c0 + 14 + math.log10(1 + i) * sx, r0 + 10 + (hi - v) / (hi - lo) * (h - 20)

        ty = to_px(0, target)[1]
        for x in range(c0 + 14, c0 + w - 2, 4):
            _polyline(img, [(x, ty), (x + 1, ty)], (150, 150, 150))
        for key, rgb in _COLOURS.items():
            v = curves[key]
            pts = [to_px(i, val) for i, val in enumerate(v) if np.isfinite(val)]
            _polyline(img, pts, rgb)
        _text(img, r0 + 3, c0 + 3, str(p + 1))
        _text(img, r0 + 3, c0 + w - 44, f"{hi:.1f}")
        _text(img, r0 + h - 8, c0 + w - 44, f"{lo:.1f}")
    return _label_names(img, [r["name"] for r in rows], cols, w, h)


def _label_names(img, names, cols, w, h):
    """Problem names next to the indices where Pillow is importable (the figure stays readable
    by index and NAMES order without it)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return img
    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    for p, name in enumerate(names):
        draw.text((4 + (p % cols) * (w + 8) + 16, 4 + (p // cols) * (h + 8) + 1), name, fill=(0, 0, 0))
    return np.asarray(pil).copy()
