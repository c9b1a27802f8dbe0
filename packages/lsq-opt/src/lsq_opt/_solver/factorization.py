"""A sparse factorisation of ``J^T J + D`` as a PCG preconditioner, reused across the linear
systems of a solve while it still pays (graph energies; the default's second preconditioner
there, see :mod:`.adaptive`).

On a graph energy neither a point nor a block diagonal nor an aggregation multigrid made the
systems much cheaper (measured on the 512-vertex ARAP mesh, one system at its 5th iterate
solved to 1e-6, mu 1e8 / 100: Jacobi 421 / 107 PCG iterations, its 6 x 6 vertex blocks 219 /
83, graph-aggregation multigrid, unsmoothed or smoothed, 328-513 / 136-219: the coupling of
positions and rotations defeats a scalar hierarchy), while LM there needs ~10 nearly exact
steps (43 Jacobi-preconditioned inexact ones with the forcing sequence). A factorisation of
the damped ``J^T J`` solves a system in one iteration, and it stays a good preconditioner for
the next systems (``J^T J`` moves little between LM iterates, the damping changes by
factors): on that mesh two factorisations served all 9-10 systems with 3-4 PCG iterations
each. So a :class:`LaggedFactorization` factors at most once per linearisation point and
refactors only after a solve with its factor needed more than ``REFACTOR_AFTER`` iterations.

The factorisation is SuperLU's (``scipy.sparse.linalg.splu``) in its symmetric mode (minimum
degree on A + A^T, no pivoting off the diagonal: the damped ``J^T J`` is symmetric positive
definite); its default mode took 30-40x longer on the same matrix (636 against 18 ms). The
fill of a 2-D mesh grows faster than its size (3072 unknowns: 18 ms; 12288: 285 ms), so
the default offers it only up to ``FACTOR_MAX_UNKNOWNS`` unknowns (:func:`.problem.resolve_preconditioner`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .pcg import inverse_diagonal

__all__ = ["REFACTOR_AFTER", "LaggedFactorization", "factorize"]

#: a solve with a factor that needed more PCG iterations than this makes the next call refactor
#: (ARAP mesh: 5 and 10 alike, 20 slower; spring network: 10 against 5 fewer factorisations)
REFACTOR_AFTER = 10


def factorize(A, shift=None):
    """``r -> (A + diag(shift))^-1 r`` by a sparse LU factorisation (SuperLU, symmetric mode)
    of the SPD matrix ``A + diag(shift)``; a ``numpy.linalg.LinAlgError`` naming the problem
    when it is singular."""
    A = sp.csc_matrix(A)
    if shift is not None:
        A = (A + sp.diags(np.asarray(shift, A.dtype))).tocsc()
    try:
        lu = spla.splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                       options=dict(SymmetricMode=True))
    except RuntimeError as e:  # SuperLU: "Factor is exactly singular"
        raise np.linalg.LinAlgError(f"the damped J^T J could not be factored: {e}") from None
    return lu.solve


class LaggedFactorization:
    """The factor preconditioners of one solve: :meth:`preconditioner` returns the last factor
    while the solve that used it needed at most ``refactor_after`` PCG iterations, else a new
    factorisation of ``J^T J + diag(shift)`` at ``x`` (``J^T J`` assembled once per
    linearisation point, as :class:`.multigrid.MultigridCache` does); where the matrix cannot be
    factored, its inverse diagonal (Jacobi). ``factorizations`` / ``reuses`` / ``failures``
    count what it did."""

    def __init__(self, refactor_after: int = REFACTOR_AFTER):
        self.refactor_after = refactor_after
        self._x = self._jtj = None
        self._solve = None
        self._applications = 0  # applications of the current factor since the last call
        self.factorizations = self.reuses = self.failures = 0

    def preconditioner(self, problem: Any, x: np.ndarray, shift=None):
        # PCG applies M once before its first iteration and once per iteration
        if self._solve is not None and self._applications <= self.refactor_after + 1:
            self._applications = 0
            self.reuses += 1
            return self._counted
        if self._jtj is None or not np.array_equal(x, self._x):
            self._jtj = problem.jtj_matrix(x)
            self._x = np.array(x, copy=True)
        try:
            self._solve = factorize(self._jtj, shift)
        except np.linalg.LinAlgError:  # singular (no damping, an unknown no residual reads)
            self._solve = None
            self.failures += 1
            diag = self._jtj.diagonal() + (0.0 if shift is None else np.asarray(shift))
            return inverse_diagonal(diag.astype(self._jtj.dtype, copy=False))
        self._applications = 0
        self.factorizations += 1
        return self._counted

    def _counted(self, r):
        self._applications += 1
        return self._solve(r)

