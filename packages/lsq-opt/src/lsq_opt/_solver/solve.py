"""The public entry point :func:`solve`."""
from __future__ import annotations

from typing import Any

import numpy as np

from .gauss_newton import gauss_newton
from .levenberg_marquardt import _emit, levenberg_marquardt
from .materialized import with_linear_system
from .options import SolverOptions
from .report import SolveResult

__all__ = ["solve"]


def solve(problem: Any, x0: np.ndarray, method: str = "lm", *, options: SolverOptions | None = None,
          **kwargs: Any) -> SolveResult:
    """Minimise ``cost(x) = 1/2 sum F(x)^2`` of ``problem`` from ``x0``.

    ``method``: ``"lm"`` (Levenberg-Marquardt, spec §4.2/§4.3) or ``"gn"`` (Gauss-Newton, §4.1).
    Keyword options (see :class:`SolverOptions` for defaults): ``max_iterations``,
    ``pcg_max_iterations``, ``pcg_tolerance``, ``q_tolerance``, ``residual_reset_period``,
    ``function_tolerance``, ``gradient_tolerance``, ``parameter_tolerance``,
    ``initial_trust_region_radius`` (alias ``mu``), ``min_trust_region_radius``,
    ``max_trust_region_radius``, ``radius_decrease_factor``, ``min_lm_diagonal`` /
    ``max_lm_diagonal`` (aliases ``min_diagonal`` / ``max_diagonal``), ``min_relative_decrease``,
    ``jacobi_scaling``, ``preconditioner`` ("auto" | "jacobi" | "none" | "ceres" |
    "modified_ceres" | "epsilon" | "multigrid" | "jacobi+multigrid" | "factorization"), ``verbose``, ``progress`` (callable receiving each progress line), ``callback``
    (``callback(entry, x)``; returning True stops with "user callback"), ``device_loop``,
    ``pcg_check_every``, ``linear_system`` ("auto" | "matrix_free" | "jacobian" | "jtj": per
    linearisation the cheaper of the next two by measured cost, the generated J^T J p, or J
    materialised as a sparse matrix and two products, or J^T J by SpGEMM).

    A cuda plan (``compile_problem(..., backend="cuda")``) is solved on the device: the same
    GN / LM / PCG code runs over its ``device_problem()`` with every vector in device memory
    (``device_loop=False``: over the plan's numpy protocol instead). ``x0`` may be a numpy or
    a device array; ``result.x`` and the callback's x are numpy arrays either way.

    Work vectors are kept in ``problem.dtype``.  Raises ``ValueError`` if the initial cost is not
    finite.  The returned ``x`` is always finite-cost (the last accepted iterate).
    """
    if not isinstance(method, str):
        hint = (" (options go by keyword: solve(problem, x0, options=...))"
                if isinstance(method, SolverOptions) else "")
        raise TypeError(f"method must be 'lm' or 'gn', got {type(method).__name__}{hint}")
    if options is None:
        options = SolverOptions.from_kwargs(**kwargs)
    elif kwargs:
        options = SolverOptions.from_kwargs(**{**options.__dict__, **kwargs})
    m = method.lower()
    methods = {"lm": levenberg_marquardt, "levenberg-marquardt": levenberg_marquardt,
               "levenberg_marquardt": levenberg_marquardt, "gn": gauss_newton,
               "gauss-newton": gauss_newton, "gauss_newton": gauss_newton}
    if m not in methods:
        raise ValueError(f"unknown method {method!r}; expected 'lm' or 'gn'")
    device = problem.device_problem() if options.device_loop and hasattr(problem, "device_problem") \
        else None
    if device is None:
        system = with_linear_system(problem, options.linear_system)
        result = methods[m](system, x0, options)
        describe = getattr(system, "describe", None)
        if describe is not None:  # "auto" chose per linearisation: say what and why
            result.linear_system = describe()
            _emit(options, f"linear system: {result.linear_system}")
        else:
            result.linear_system = "matrix_free" if options.linear_system == "auto" \
                else options.linear_system
        return result
    if options.linear_system not in ("matrix_free", "auto"):
        device.finish()
        raise ValueError(f"linear_system={options.linear_system!r} assembles J with scipy on the "
                         "host; the cuda device loop is matrix-free (pass device_loop=False)")
    try:
        return methods[m](device, x0, options)
    finally:
        device.finish()
