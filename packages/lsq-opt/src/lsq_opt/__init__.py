"""lsq_opt: an Opt-like language for non-linear least squares over images and graphs,
generating matrix-free Gauss-Newton / Levenberg-Marquardt solvers.

Cost convention: ``cost = 1/2 sum F^2`` (Ceres-compatible), gradient ``J^T F``.

* Language (:mod:`lsq_opt._language`, re-exported here): ``Dim``, ``Unknown``, ``Array`` /
  ``Image``, ``Param``, ``Graph``, stencil reads ``X(dx, dy)``, ``Energy``, ``Select``,
  ``InBounds``, ``Exclude``, ``Rotate2D`` ... Residuals are core_ad symbolic expressions: their
  derivatives come from ``core_ad.sym``, the user never writes one.
* Compiler: :func:`compile_problem` binds arrays / params / graphs by name and returns a
  :class:`Plan` (matrix-free ``jtf``, ``jtj_diag``, ``jtjp``; materialised ``jacobian`` for
  checks), its per-lane kernels compiled by core_ad (LLVM by default, numpy reference).
* Solvers: :func:`solve` (``method="lm"`` or ``"gn"``) with a PCG inner loop and Jacobi
  preconditioning on any :class:`LeastSquaresProblem` (matrix-free ``jtf``, ``jtj_diag``,
  ``jtjp``); :class:`DenseProblem` wraps explicit residual / Jacobian callables.
"""

from ._compiler import LsqCompileError, Optimizations, Plan, code_statistics, compile_problem
from ._language import *  # noqa: F403
from ._language import __all__ as _language_all
from ._solver import (
    DenseProblem,
    IterationLog,
    LeastSquaresProblem,
    PCGResult,
    SolveResult,
    SolverOptions,
    pcg,
    solve,
)

__all__ = [
    "DenseProblem",
    "LsqCompileError",
    "Plan",
    "compile_problem",
    "code_statistics",
    "Optimizations",
    "IterationLog",
    "LeastSquaresProblem",
    "PCGResult",
    "SolveResult",
    "SolverOptions",
    "pcg",
    "solve",
]
__all__ += [n for n in _language_all if n not in __all__]
