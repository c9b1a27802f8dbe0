"""lsq_opt: an Opt-like language for non-linear least squares over images and graphs,
generating matrix-free Gauss-Newton / Levenberg-Marquardt solvers.

Cost convention: ``cost = 1/2 sum F^2`` (Ceres-compatible), gradient ``J^T F``.

* Solvers: :func:`solve` (``method="lm"`` or ``"gn"``) with a PCG inner loop and Jacobi
  preconditioning on any :class:`LeastSquaresProblem` (matrix-free ``jtf``, ``jtj_diag``,
  ``jtjp``); :class:`DenseProblem` wraps explicit residual / Jacobian callables.
"""

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
    "IterationLog",
    "LeastSquaresProblem",
    "PCGResult",
    "SolveResult",
    "SolverOptions",
    "pcg",
    "solve",
]
