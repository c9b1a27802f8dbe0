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
The V-cycle is a fixed symmetric linear operator, so it is a valid PCG preconditioner.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.linalg as sla

__all__ = ["Multigrid"]


def _rho(A, dinv, iters=8, seed=0):
    v = np.random.default_rng(seed).random(A.shape[0])
    lam = 1.0
    for _ in range(iters):
        w = dinv * (A @ v)
        lam = float(np.linalg.norm(w))
        if lam == 0 or not np.isfinite(lam):
            return 1.0
        v = w / lam
    return lam


class Multigrid:
    """``Multigrid(A, coords, coarse_size=400, max_levels=20)``; ``M(r)`` applies one
    V-cycle to ``r`` (an approximation of ``A^-1 r``)."""

    def __init__(self, A, coords, coarse_size=400, max_levels=20, smooth=False, sweeps=1):
        A = sp.csr_matrix(A)
        A.eliminate_zeros()
        coords = np.asarray(coords, np.int64)
        if coords.shape[0] != A.shape[0]:
            raise ValueError(f"coords has {coords.shape[0]} rows, A has {A.shape[0]}")
        self.levels = []
        dt = A.dtype
        while A.shape[0] > coarse_size and len(self.levels) < max_levels:
            d = A.diagonal().copy()
            d[d <= 0] = 1.0
            dinv = (1.0 / d).astype(dt)
            # Gershgorin bound on the spectral radius of D^-1 A (cheap, safe: it only lowers
            # the Jacobi weight)
            rho = float(np.max(dinv * np.asarray(abs(A).sum(1)).ravel()))
            rho = rho if np.isfinite(rho) and rho > 0 else _rho(A, dinv)
            cc = coords.copy()
            cc[:, 1:] //= 2
            cc -= cc.min(0)
            ext = cc.max(0) + 1
            key = np.ravel_multi_index(tuple(cc.T), tuple(ext))  # 1-D keys: a fast unique
            ukey, agg = np.unique(key, return_inverse=True)
            agg = agg.ravel()
            uniq = np.stack(np.unravel_index(ukey, tuple(ext)), 1)
            nc = len(uniq)
            if nc >= A.shape[0]:
                break
            om = 4.0 / (3.0 * rho)
            if smooth:
                P0 = sp.csr_matrix((np.ones(A.shape[0], dt), (np.arange(A.shape[0]), agg)),
                                   shape=(A.shape[0], nc))
                P = (P0 - sp.diags(om * dinv) @ (A @ P0)).tocsr()
                R = P.T.tocsr()
                self.levels.append((A, dinv * dt.type(om), P, R))
                A = (R @ A @ P).tocsr()
            else:
                # P = aggregate indicator: P e = e[agg], R r = bincount(agg, r), and the
                # Galerkin product sums A's entries by (row aggregate, column aggregate)
                self.levels.append((A, dinv * dt.type(om), agg, nc))
                rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
                Ac = sp.coo_matrix((A.data, (agg[rows], agg[A.indices])), shape=(nc, nc))
                A = Ac.tocsr()
                A.sum_duplicates()
            coords = uniq
        self.coarse = None
        if A.shape[0] > 0:
            Ad = A.toarray()
            try:  # SPD (J^T J plus a damping): Cholesky; else LU
                self.coarse = ("chol", sla.cho_factor(Ad))
            except np.linalg.LinAlgError:
                self.coarse = ("lu", sla.lu_factor(Ad))
        self.n_levels = len(self.levels) + 1
        self.sweeps = int(sweeps)
        self.sizes = [lv[0].shape[0] for lv in self.levels] + [A.shape[0]]

    def _cycle(self, k, b):
        if k == len(self.levels):
            if self.coarse is None:
                return b
            kind, f = self.coarse
            return sla.cho_solve(f, b) if kind == "chol" else sla.lu_solve(f, b)
        A, wd, P, R = self.levels[k]
        x = wd * b
        for _ in range(self.sweeps - 1):
            x += wd * (b - A @ x)
        r = b - A @ x
        if isinstance(P, np.ndarray):  # unsmoothed aggregation: P = indicator of agg
            x += self._cycle(k + 1, np.bincount(P, weights=r, minlength=R).astype(r.dtype))[P]
        else:
            x += P @ self._cycle(k + 1, R @ r)
        for _ in range(self.sweeps):
            x += wd * (b - A @ x)
        return x

    def __call__(self, r):
        return self._cycle(0, np.asarray(r))
