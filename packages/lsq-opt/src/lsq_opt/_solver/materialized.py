"""The linear systems of GN / LM with J materialised (spec AE-9, the Opt paper's comparison):
``solve(..., linear_system=...)`` picks how PCG gets ``J^T J p``:

* ``"matrix_free"`` (default): the problem's own product (the generated kernels);
* ``"jacobian"``: J assembled as a sparse matrix at each linearisation, then two sparse
  matrix-vector products ``J^T (J p)`` per PCG iteration;
* ``"jtj"``: ``J^T J`` formed once per linearisation (the problem's ``jtj_matrix`` where it
  has one: a plan's stencil assembly on grids; else a sparse matrix product, SpGEMM, of the
  assembled J), then one sparse matrix-vector product per PCG iteration;
* ``"auto"`` (the default): per linearisation, ``"jtj"`` where forming it pays, else
  ``"matrix_free"`` (:class:`AutoLinearSystem`; host numpy problems with a ``jacobian``).

The three give the same PCG iterates up to rounding (a test checks 20 iterations to 1e-10 on
every example energy); which is fastest depends on the energy's stencil.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Any

import numpy as np
import scipy.sparse as sp

from .problem import call_linearize

__all__ = ["LINEAR_SYSTEMS", "AutoLinearSystem", "MaterializedProblem", "gram_matrix", "jtj_pays",
           "with_linear_system"]

LINEAR_SYSTEMS = ("matrix_free", "jacobian", "jtj", "auto")
# "auto", before its first J^T J build: the build is assumed to cost this many matrix-free
# products (measured per problem, build / product: shading 14, TV 7, spring network 11, ARAP
# mesh 56, Poisson 535); every build after that is priced at its measured time
BUILD_PRIOR_PRODUCTS = 10
# "auto" prices each kind (matrix-free product, J^T J product, build) by the median of its last
# this many wall-clock measurements, not their mean: on a machine shared with other work a
# measurement that spans a preemption is 10-1000x a product's time (a spring network's
# products: median 0.075 ms, mean 0.3-0.4 ms, the largest 1 % of them half the sum), and mean
# prices that high built J^T J on up to 242 of 246 linearisations that ran ~8 products each
PRICE_WINDOW = 31
# ... in wall time: process CPU time (robust to preemption) made every solve slower, as a
# product is timed twice: ARAP image 174 -> 205 ms thread time (in-process A/B, 8 rounds,
# load 10-12; ~20 us per process_time call there)
PRICE_CLOCK = time.perf_counter
# the protocol's optional device-side products: a materialised problem runs on the host
_NOT_DELEGATED = frozenset({"damped_jtjp_linearized", "device_problem", "xp"})


class MaterializedProblem:
    """``problem`` with ``J^T J p`` from a materialised J (``form="jacobian"``) or ``J^T J``
    (``form="jtj"``), rebuilt at every ``linearize``; everything else is ``problem``'s."""

    def __init__(self, problem: Any, form: str):
        if form not in ("jacobian", "jtj"):
            raise ValueError(f"MaterializedProblem: form must be 'jacobian' or 'jtj', got {form!r}")
        if getattr(problem, "xp", np) is not np:
            raise ValueError("linear_system='jacobian' / 'jtj' assembles J with scipy on the "
                             "host; a cuda plan solves matrix-free (or pass device_loop=False)")
        self.problem, self.form = problem, form
        self.n, self.dtype = problem.n, np.dtype(problem.dtype)
        self._x = None
        self._J = self._JT = self._A = None

    def __getattr__(self, name):
        if name in _NOT_DELEGATED or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.problem, name)

    def linearize(self, x: np.ndarray) -> None:
        call_linearize(self.problem, x)
        self.assemble(x)

    def assemble(self, x: np.ndarray) -> None:
        """Build J (or J^T J) at x, where the problem is already linearised."""
        self._x = np.array(x, copy=True)
        if self.form == "jtj":
            self._A = self._jtj(x)
        else:
            J = self.problem.jacobian(x).tocsr().astype(self.dtype)
            self._J, self._JT = J, J.T.tocsr()

    def _jtj(self, x: np.ndarray):
        """J^T J at x: the problem's own assembly where it has one (a compiled plan on one grid
        assembles it from generated stencil planes into a cached pattern: 0.3 ms where J plus
        SpGEMM took 4-13 ms on the intrinsic-image and Poisson energies), else SpGEMM."""
        own = getattr(self.problem, "jtj_matrix", None)
        if own is not None:
            return own(x).tocsr().astype(self.dtype, copy=False)
        return gram_matrix(self.problem.jacobian(x).tocsr().astype(self.dtype))

    def jtjp_linearized(self, p: np.ndarray) -> np.ndarray:
        if self.form == "jtj":
            return self._A @ p
        return self._JT @ (self._J @ p)

    def jtjp(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self._x is None or not np.array_equal(x, self._x):
            self.linearize(x)
        return self.jtjp_linearized(p)


def gram_matrix(J) -> sp.csr_matrix:
    """``J^T J`` (CSR) of a sparse J: the transpose made CSR first. ``J.T @ J`` multiplies a
    CSC view by a CSR matrix, which scipy converts on the way: 6.5 ms against 2.2 ms (both
    transposes included) on an ARAP mesh's J (86k entries), where "auto" prices the build
    against its matrix-free products."""
    J = sp.csr_matrix(J)
    return J.T.tocsr() @ J


def jtj_pays(products: int, t_free: float | None, t_build: float | None,
             t_jtj: float | None) -> bool:
    """The "auto" rule: would ``products`` J^T J products (those of the previous linearisation)
    have been cheaper by forming J^T J (``t_build``) and multiplying by it (``t_jtj`` each) than
    by the matrix-free product (``t_free`` each)? ``None``: not measured yet (before the first
    build it is priced at ``BUILD_PRIOR_PRODUCTS`` matrix-free products, its products free)."""
    if t_free is None or products == 0:
        return False
    if t_build is None:
        t_build, t_jtj = BUILD_PRIOR_PRODUCTS * t_free, 0.0
    return products * t_free > t_build + products * (t_jtj or 0.0)


class AutoLinearSystem:
    """``linear_system="auto"``: at each linearisation, ``J^T J`` (the ``"jtj"`` form) when the
    matrix-free products spent at the previous linearisation (its PCG solves, rejected LM steps
    included) would have cost more than forming ``J^T J`` plus as many sparse products, else
    the generated matrix-free product. Every cost is measured during the solve: the mean time
    of a matrix-free product, of a ``J^T J`` product and of a build; before the first build,
    the build is priced at ``BUILD_PRIOR_PRODUCTS`` matrix-free products and its products as
    free (one probe: if the measured prices say no, later linearisations stay matrix-free).
    Within a linearisation that started matrix-free, the matrix-free products spent there
    are a ski rental: once the part of them a ``J^T J`` product would have saved costs as
    much as a build (measured prices, or the prior), ``J^T J`` is built and serves the rest
    of that linearisation's products (the same operator: PCG goes on unchanged); only where
    that break-even lies within ``BUILD_PRIOR_PRODUCTS`` products (a build of a few
    products: shading's stencil assembly, not an ARAP mesh's SpGEMM at 61). So a linearisation the previous one mispredicted costs at most about
    twice the cheaper path: on the shading energy the product counts per linearisation jump
    (4, 15, 59, 1, 4, 12, 52, ...) and 15 generated products at 1.6 ms had been spent where a
    2.7 ms build and 0.1 ms products would do.
    So long PCG solves over an expensive generated product (many residual terms per unknown,
    e.g. the shading energy: 1.3 ms vs 0.06 ms per product) switch, and short solves or
    cheap products (Poisson, a spring network) keep the matrix-free path. Known limits: the
    probe is wasted where the sparse product is no faster, and on a plan that assembles
    through J (graph energies) whose J was never assembled the probe's price includes
    compiling J's kernels (0.5 s on a small ARAP mesh), so "auto" then stays matrix-free (a
    grid plan's stencil kernel is compiled before the timing: ``prepare_jtj_matrix``)."""

    def __init__(self, problem: Any):
        self.problem = problem
        self.n, self.dtype = problem.n, np.dtype(problem.dtype)
        self._jtj = MaterializedProblem(problem, "jtj")
        self._x = None
        self._use_jtj = False
        self._products = 0  # products since the last linearisation
        self._next_check = 0  # product count at which the ski rental is priced again
        self.switched = 0  # linearisations that switched to J^T J part-way
        self._seconds = {what: deque(maxlen=PRICE_WINDOW) for what in ("free", "jtj", "build")}
        self.linearisations = {"matrix_free": 0, "jtj": 0}

    def __getattr__(self, name):
        if name in _NOT_DELEGATED or name.startswith("_"):
            raise AttributeError(name)
        if name == "jtj_matrix" and hasattr(self.problem, name):  # only where the problem has one
            return self._jtj_matrix
        return getattr(self.problem, name)

    def _price(self, what: str) -> float | None:
        """The median of the last measurements of ``what`` (None: not measured yet)."""
        samples = self._seconds[what]
        return statistics.median(samples) if samples else None

    def linearize(self, x: np.ndarray) -> None:
        self._use_jtj = jtj_pays(self._products, self._price("free"), self._price("build"),
                                 self._price("jtj"))
        self._products = 0
        self._next_check = 0
        self._x = np.array(x, copy=True)
        call_linearize(self.problem, x)
        if self._use_jtj:
            self._build()
        self.linearisations["jtj" if self._use_jtj else "matrix_free"] += 1

    def _build(self) -> None:
        """Assemble J^T J at the linearised x, timed; the first time, the problem compiles what
        the assembly runs beforehand (``prepare_jtj_matrix``), outside the timing: a price
        that included the compile (0.3 s for a grid plan's stencil kernel, against a 0.3-3 ms
        assembly) kept "auto" matrix-free for the rest of a solve."""
        if not self._seconds["build"]:
            prepare = getattr(self.problem, "prepare_jtj_matrix", None)
            if prepare is not None:
                prepare()
        t0 = PRICE_CLOCK()
        self._jtj.assemble(self._x)
        self._add("build", PRICE_CLOCK() - t0)

    def _add(self, what: str, seconds: float) -> None:
        self._seconds[what].append(seconds)

    def _switch_at(self) -> float:
        """The ski rental's break-even: the product count of this linearisation at which the
        part of its matrix-free products that a ``J^T J`` product would have saved has cost as
        much as a build (at the current prices; ``inf``: never)."""
        free, jtj, build = self._price("free"), self._price("jtj"), self._price("build")
        if free is None:
            return self._products + 1  # priced after the first product
        if build is None:
            build, jtj = BUILD_PRIOR_PRODUCTS * free, 0.0
        saved = free - (jtj or 0.0)
        # a break-even further than BUILD_PRIOR_PRODUCTS products rarely pays back within the
        # linearisation (an ARAP mesh: 61 products for a 4.4 ms SpGEMM build, 6 % slower)
        if not (saved > 0 and build <= BUILD_PRIOR_PRODUCTS * saved):
            return math.inf
        return max(1, math.ceil(build / saved))

    def jtjp_linearized(self, p: np.ndarray) -> np.ndarray:
        if not self._use_jtj and self._products >= self._next_check:  # priced once per check
            self._next_check = self._switch_at()
            if self._products >= self._next_check:
                self._build()  # the ski rental within a linearisation (class doc)
                self._use_jtj = True
                self.switched += 1
                self.linearisations["matrix_free"] -= 1
                self.linearisations["jtj"] += 1
        t0 = PRICE_CLOCK()
        out = self._jtj.jtjp_linearized(p) if self._use_jtj else self.problem.jtjp_linearized(p)
        self._add("jtj" if self._use_jtj else "free", PRICE_CLOCK() - t0)
        self._products += 1
        return out

    def jtjp(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self._x is None or not np.array_equal(x, self._x):
            self.linearize(x)
        return self.jtjp_linearized(p)

    def _jtj_matrix(self, x: np.ndarray):
        """J^T J at x: the one this linearisation built where it built one at x (the multigrid
        preconditioner's setup then skips its own assembly), else the problem's."""
        if self._use_jtj and self._x is not None and np.array_equal(x, self._x):
            return self._jtj._A
        return self.problem.jtj_matrix(x)

    def describe(self) -> str:
        """What "auto" chose and the measured prices it chose by (for the report)."""
        def ms(what):
            t = self._price(what)
            return "-" if t is None else f"{t * 1e3:.3f} ms"
        used = self.linearisations
        return (f"auto: J^T J on {used['jtj']} of {sum(used.values())} linearisations "
                f"({self.switched} switched part-way; product "
                f"matrix-free {ms('free')}, J^T J {ms('jtj')}; build {ms('build')})")


def with_linear_system(problem: Any, linear_system: str) -> Any:
    """``problem`` as the solvers should see it for ``linear_system`` (see the module).
    ``"auto"`` stays matrix-free for problems it cannot materialise (no ``jacobian``, device
    arrays, or no ``linearize`` hook to serve products from)."""
    if linear_system not in LINEAR_SYSTEMS:
        raise ValueError(f"linear_system must be one of {LINEAR_SYSTEMS}, got {linear_system!r}")
    if linear_system == "auto":
        materialisable = (hasattr(problem, "jacobian") and hasattr(problem, "jtjp_linearized")
                          and getattr(problem, "linearize", None) is not None
                          and getattr(problem, "xp", np) is np)
        return AutoLinearSystem(problem) if materialisable else problem
    return problem if linear_system == "matrix_free" else MaterializedProblem(problem,
                                                                             linear_system)
