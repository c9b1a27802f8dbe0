"""A smoothed-aggregation algebraic multigrid preconditioner (one V-cycle per PCG iteration).

Spec 4.1 leaves preconditioners other than Jacobi to future work ("More general
preconditioners could be provided as a parameter at code generation time"); on grid energies
the Jacobi-PCG iteration count grows with the image diameter (hundreds of iterations for a
512^2 Poisson problem), so this is offered as ``preconditioner="multigrid"`` for problems that
can assemble ``J^T J`` (``problem.jtj_matrix(x)``, scipy CSR) and give grid coordinates of
their unknowns (``problem.unknown_coords()``: (n, 1 + ndim) ints, a "plane" id then the grid
position).

Hierarchy (setup per linear system): aggregates = 2 x 2 (x 2 ...) blocks of grid points within
one plane (geometric aggregation); prolongator P = the aggregate indicator (unsmoothed
aggregation: cheap setup; ``smooth=True`` gives smoothed aggregation ``P = (I - omega D^-1 A)
P0``, fewer PCG iterations but a setup several times dearer in scipy); Galerkin ``A_c = P^T A
P``; recursively until <= ``coarse_size`` unknowns, solved densely (Cholesky). V(1,1) cycle
with damped Jacobi, ``omega = 4 / (3 rho)``, ``rho`` the Gershgorin bound of ``D^-1 A``.

Unsmoothed aggregation under-corrects: its coarse space represents smooth errors by piecewise
constants, whose energy is too high, so the coarse correction comes out too small. Scaling it
by ``over_correction`` (Braess 1995; default 1.6, measured on the 512^2 Poisson benchmark: 6
PCG iterations to the target instead of 10) restores most of the convergence rate at no cost.
Any factor in (0, 2) keeps the cycle symmetric positive definite.

The V-cycle is a fixed symmetric linear operator, so it is a valid PCG preconditioner.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

__all__ = ["Multigrid"]


def _aggregates(coords):
    """Aggregate id of every point (2 x 2 ... blocks within a plane) and the coarse coords.

    ``coords`` is (1 + ndim, n): one contiguous row per axis. Keys index a dense box of the
    coarse grid: marking the occupied cells and numbering them by a running count is O(n),
    where ``np.unique`` would sort."""
    cc = coords.copy()
    cc[1:] //= 2
    cc -= cc.min(1, keepdims=True)
    ext = tuple(int(e) + 1 for e in cc.max(1))
    key = np.ravel_multi_index(tuple(cc), ext)
    occupied = np.zeros(int(np.prod(ext)), bool)
    occupied[key] = True
    number = np.cumsum(occupied) - 1
    coarse = np.array(np.unravel_index(np.flatnonzero(occupied), ext))
    return number[key], coarse


class Multigrid:
    """``Multigrid(A, coords, coarse_size=400, max_levels=20)``; ``M(r)`` applies one
    V-cycle to ``r`` (an approximation of ``A^-1 r``)."""

    def __init__(self, A, coords, coarse_size=400, max_levels=20, smooth=False, sweeps=1,
                 over_correction=None):
        A = sp.csr_matrix(A)
        A.eliminate_zeros()
        coords = np.asarray(coords, np.int64)
        if coords.ndim != 2 or coords.shape[0] != A.shape[0]:
            raise ValueError(f"coords must be (n, 1 + ndim) with n = {A.shape[0]} rows of A, "
                             f"got shape {coords.shape}")
        coords = np.ascontiguousarray(coords.T)
        if over_correction is None:
            over_correction = 1.0 if smooth else 1.6
        if not 0.0 < over_correction < 2.0:
            raise ValueError(f"over_correction must lie in (0, 2), got {over_correction}")
        self.levels = []
        dt = A.dtype
        while A.shape[0] > coarse_size and len(self.levels) < max_levels:
            d = A.diagonal().copy()
            d[d <= 0] = 1.0
            dinv = (1.0 / d).astype(dt)
            # Gershgorin bound on the spectral radius of D^-1 A (cheap, safe: it only lowers
            # the Jacobi weight)
            abs_row_sums = sp.csr_matrix((np.abs(A.data), A.indices, A.indptr), shape=A.shape) \
                @ np.ones(A.shape[1], dt)
            rho = float(np.max(dinv * abs_row_sums))
            if not (np.isfinite(rho) and rho > 0):
                rho = 1.0
            agg, coarse_coords = _aggregates(coords)
            nc = coarse_coords.shape[1]
            if nc >= A.shape[0]:
                break
            om = 4.0 / (3.0 * rho)
            n = A.shape[0]
            P = sp.csr_matrix((np.ones(n, dt), agg, np.arange(n + 1)), shape=(n, nc))
            if smooth:
                P = (P - sp.diags(om * dinv) @ (A @ P)).tocsr()
            R = P.T.tocsr()
            self.levels.append((A, dinv * dt.type(om), P, R))
            A = (R @ (A @ P)).tocsr()
            coords = coarse_coords
        self.coarse = None
        if A.shape[0] > 0:
            Ad = A.toarray()
            try:  # SPD (J^T J plus a damping): Cholesky; else LU
                self.coarse = ("chol", sla.cho_factor(Ad))
            except np.linalg.LinAlgError:
                self.coarse = ("lu", sla.lu_factor(Ad))
        self.over_correction = dt.type(over_correction)
        self.n_levels = len(self.levels) + 1
        self.sweeps = int(sweeps)
        self.sizes = [lv[0].shape[0] for lv in self.levels] + [A.shape[0]]

    def _cycle(self, k, b):
        if k == len(self.levels):
            if self.coarse is None:
                return b
            kind, f = self.coarse
            if kind == "chol":
                return sla.cho_solve(f, b, check_finite=False)
            return sla.lu_solve(f, b, check_finite=False)
        A, wd, P, R = self.levels[k]
        x = wd * b
        for _ in range(self.sweeps - 1):
            x += wd * (b - A @ x)
        e = self._cycle(k + 1, R @ (b - A @ x))
        e *= self.over_correction
        x += P @ e
        for _ in range(self.sweeps):
            x += wd * (b - A @ x)
        return x

    def __call__(self, r):
        return self._cycle(0, np.asarray(r))
