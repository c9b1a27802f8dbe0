"""Matrix-free Gauss-Newton / Levenberg-Marquardt solvers with a PCG inner loop (spec §4).

Cost convention: ``cost = 1/2 sum F^2`` (Ceres-compatible; spec §10 item 1), gradient ``J^T F``.
"""
from .gauss_newton import gauss_newton
from .levenberg_marquardt import levenberg_marquardt, lm_damping, lm_reject_radius, lm_step_accepted, lm_update_radius
from .options import SolverOptions
from .pcg import PCGResult, inverse_diagonal, pcg
from .problem import DenseProblem, LeastSquaresProblem, call_linearize
from .report import IterationLog, SolveResult
from .solve import solve

__all__ = [
    "solve", "SolverOptions", "SolveResult", "IterationLog",
    "LeastSquaresProblem", "DenseProblem", "call_linearize",
    "pcg", "PCGResult", "inverse_diagonal",
    "gauss_newton", "levenberg_marquardt", "lm_damping", "lm_reject_radius", "lm_step_accepted",
    "lm_update_radius",
]
