"""``preconditioner="factorization"``: a sparse factorisation of ``J^T J + D``, reused across
the linear systems of a solve while it still serves. Not a default (see below).

What it buys on a graph energy is better steps, not cheaper systems. Neither a point nor a
block diagonal nor an aggregation multigrid made the systems of the 512-vertex ARAP mesh much
cheaper (one system at its 5th iterate solved to 1e-6, mu 1e8 / 100: Jacobi 421 / 107 PCG
iterations, its 6 x 6 vertex blocks 219 / 83, a multigrid aggregating the vertex graph,
unsmoothed or smoothed, 328-513 / 136-219: a scalar hierarchy misses the coupling of
positions and rotations), and at the forcing sequence's loose tolerances a Jacobi-PCG step
misses smooth components that carry much of the model decrease (a median 34 % of it
left, by :meth:`.pcg.PCGResult.remaining_decrease`): LM took 43 iterations there, and 10 with
this factorisation, whose PCG solves take 1-4 iterations. ``J^T J`` moves little between LM
iterates and the damping changes by factors, so a factor stays a good preconditioner for the
next systems: :class:`LaggedFactorization` factors at most once per linearisation point and
refactors only after a solve with its factor needed more than ``REFACTOR_AFTER`` iterations
(two factorisations served that mesh's 10 systems).

Why not a default: on the spring network (``lsq_opt.testing.spring_network``) LM's iteration
count is the non-linearity's (a crawl at rho ~1/2), Jacobi's steps already leave only 1 % of
their model decrease, and a factorisation only makes each iteration dearer (at 8000 unknowns
4.5x the time for the same 500 iterations); on the 2048-vertex ARAP mesh a factorisation
costs 1900 products and an application 25. No rule found tells these apart in time: the
price of a factorisation in products (ARAP mesh 230, spring network 81 and 137 at 2000 and
8000 unknowns) does not; switching to it once Jacobi's steps were seen to leave > 10 % of
their model decrease switched on both (the first steps of a spring solve leave more), and the
mesh then took 35 iterations instead of 10 (2.2x Jacobi's time); a per-system ski rental as
:mod:`.adaptive` runs for multigrid keeps Jacobi wherever a loose solve is cheap (1.7x
Jacobi's time on the mesh); factoring only the weakly damped systems (mu >= 1e4, where the
damping no longer bounds the Jacobi-preconditioned condition number) kept the mesh's gain
(10 iterations) but sent the 8000-unknown spring network, after 3 factored systems, to a cost
1.7x higher after its 500 iterations, and the 2048-vertex ARAP mesh to a minimum 16 % higher
(0.976 against 0.842) in the same time. Measurements: ``benchmarks/RESULTS.md`` (session 13).

The factorisation is SuperLU's (``scipy.sparse.linalg.splu``) in its symmetric mode (minimum
degree on A + A^T, no pivoting off the diagonal: the damped ``J^T J`` is symmetric positive
definite); its default mode took 35x longer on the ARAP mesh's matrix (636 against 18 ms).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .multigrid import LinearisedJtJ
from .pcg import inverse_diagonal

__all__ = ["REFACTOR_AFTER", "LaggedFactorization", "factorize"]

#: a solve with a factor that needed more PCG iterations than this makes the next call refactor
#: (ARAP mesh: 5 and 10 alike, 20 slower; spring network: 4 factorisations with 10, 18 with 5)
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
    linearisation point, :class:`.multigrid.LinearisedJtJ`); where the matrix cannot be
    factored, its inverse diagonal (Jacobi). ``factorizations`` / ``reuses`` / ``failures``
    count what it did."""

    def __init__(self, refactor_after: int = REFACTOR_AFTER):
        self.refactor_after = refactor_after
        self._jtj = LinearisedJtJ()
        self._solve = None
        self._applications = 0  # applications of the current factor since the last call
        self.factorizations = self.reuses = self.failures = 0

    def preconditioner(self, problem: Any, x: np.ndarray, shift=None):
        # PCG applies M once before its first iteration and once per iteration
        if self._solve is not None and self._applications <= self.refactor_after + 1:
            self._applications = 0
            self.reuses += 1
            return self._counted
        jtj = self._jtj.at(problem, x)
        try:
            self._solve = factorize(jtj, shift)
        except np.linalg.LinAlgError:  # singular (no damping, an unknown no residual reads)
            self._solve = None
            self.failures += 1
            diag = jtj.diagonal() + (0.0 if shift is None else np.asarray(shift))
            return inverse_diagonal(diag.astype(jtj.dtype, copy=False))
        self._applications = 0
        self.factorizations += 1
        return self._counted

    def _counted(self, r):
        self._applications += 1
        return self._solve(r)

