"""The linear systems of GN / LM with J materialised (spec AE-9, the Opt paper's comparison):
``solve(..., linear_system=...)`` picks how PCG gets ``J^T J p``:

* ``"matrix_free"`` (default): the problem's own product (the generated kernels);
* ``"jacobian"``: J assembled as a sparse matrix at each linearisation, then two sparse
  matrix-vector products ``J^T (J p)`` per PCG iteration;
* ``"jtj"``: ``J^T J`` formed once per linearisation by a sparse matrix product (SpGEMM),
  then one sparse matrix-vector product per PCG iteration.

The three give the same PCG iterates up to rounding (a test checks 20 iterations to 1e-10 on
every example energy); which is fastest depends on the energy's stencil.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .problem import call_linearize

__all__ = ["LINEAR_SYSTEMS", "MaterializedProblem", "with_linear_system"]

LINEAR_SYSTEMS = ("matrix_free", "jacobian", "jtj")
# the protocol's optional device-side products: a materialised problem runs on the host
_NOT_DELEGATED = frozenset({"damped_jtjp_linearized", "device_problem", "xp"})


class MaterializedProblem:
    """``problem`` with ``J^T J p`` from a materialised J (``form="jacobian"``) or ``J^T J``
    (``form="jtj"``), rebuilt at every ``linearize``; everything else is ``problem``'s."""

    def __init__(self, problem: Any, form: str):
        if form not in LINEAR_SYSTEMS[1:]:
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
        J = self.problem.jacobian(x).tocsr().astype(self.dtype)
        self._x = np.array(x, copy=True)
        if self.form == "jtj":
            self._A = (J.T @ J).tocsr()
        else:
            self._J, self._JT = J, J.T.tocsr()

    def jtjp_linearized(self, p: np.ndarray) -> np.ndarray:
        if self.form == "jtj":
            return self._A @ p
        return self._JT @ (self._J @ p)

    def jtjp(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self._x is None or not np.array_equal(x, self._x):
            self.linearize(x)
        return self.jtjp_linearized(p)


def with_linear_system(problem: Any, linear_system: str) -> Any:
    """``problem`` as the solvers should see it for ``linear_system`` (see the module)."""
    if linear_system not in LINEAR_SYSTEMS:
        raise ValueError(f"linear_system must be one of {LINEAR_SYSTEMS}, got {linear_system!r}")
    return problem if linear_system == "matrix_free" else MaterializedProblem(problem,
                                                                             linear_system)
