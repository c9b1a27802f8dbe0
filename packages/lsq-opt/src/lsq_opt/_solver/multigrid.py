"""An aggregation algebraic multigrid preconditioner (one V-cycle per PCG iteration).

Spec 4.1 leaves preconditioners other than Jacobi to future work ("More general
preconditioners could be provided as a parameter at code generation time"); on grid energies
the Jacobi-PCG iteration count grows with the image diameter (hundreds of iterations for a
512^2 Poisson problem), so this is offered as ``preconditioner="multigrid"`` for problems that
can assemble ``J^T J`` (``problem.jtj_matrix(x)``, scipy CSR) and give grid coordinates of
their unknowns (``problem.unknown_coords()``: (n, 1 + ndim) ints, a "plane" id then the grid
position).

Hierarchy: aggregates = 2 x 2 (x 2 ...) blocks of grid points within one plane (geometric
aggregation); prolongator P = the aggregate indicator (unsmoothed aggregation); Galerkin
``A_c = P^T A P``; recursively until <= ``coarse_size`` unknowns (``COARSE_SIZE``), solved
densely (Cholesky).
V(1,1) cycle with damped Jacobi, ``omega = 4 / (3 rho)``, ``rho`` the Gershgorin bound of
``D^-1 A``.

The structure of that hierarchy (aggregates, P, and each coarse operator's sparsity pattern
with the map from fine entries to coarse ones) depends only on the grid coordinates and the
fine matrix's sparsity pattern, which a plan's ``J^T J`` keeps for its lifetime; only the
values change between the linear systems of a solve. :class:`Hierarchy` holds the structure,
built once; a :class:`Multigrid` on a matching matrix then forms its coarse operators by one
scatter-add of the fine values per level (``P^T A P`` with an indicator P is a sum of fine
entries per coarse entry), where the SpGEMMs, pattern work and coarse factorisation of a
fresh setup took 4.5 ms on the 6k-unknown intrinsic-image energy (40 % of its solve, over 22
of 31 linear systems). :class:`MultigridCache` is what the solvers keep per solve: the
hierarchy, and ``J^T J`` at the last linearisation point (LM's rejected steps change only the
damping).

Unsmoothed aggregation under-corrects: its coarse space represents smooth errors by piecewise
constants, whose energy is too high, so the coarse correction comes out too small. Scaling it
by ``over_correction`` (Braess 1995; default 1.6, measured on the 512^2 Poisson benchmark: 6
PCG iterations to the target instead of 10) restores most of the convergence rate at no cost.
Any factor in (0, 2) keeps the cycle symmetric positive definite.

The V-cycle is a fixed symmetric linear operator, so it is a valid PCG preconditioner.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

__all__ = ["COARSE_SIZE", "Hierarchy", "Multigrid", "MultigridCache"]

#: the coarsest level's most unknowns (solved by a dense Cholesky factorisation per setup):
#: 150 against 400 made a setup 2.6 -> 1.2 ms on the intrinsic-image energy (a 384- against a
#: 96-unknown factorisation) for 133 against 107 PCG iterations in all, its forced-multigrid
#: solve 270-300 -> 190-225 ms; Poisson and shading unchanged (thread time, 2026-11-27)
COARSE_SIZE = 150


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


def _with_values(template, values):
    """A CSR matrix of ``template``'s pattern holding ``values`` (no copy)."""
    return sp.csr_matrix((values, template.indices, template.indptr), shape=template.shape,
                         copy=False)


class Hierarchy:
    """The value-independent part of the multigrid hierarchy for a fine matrix's sparsity
    pattern (CSR ``indptr``, ``indices``) and the grid ``coords`` ((n, 1 + ndim) ints). Per
    level: the operator's pattern (a CSR template, each entry's row, the positions of the
    diagonal entries); per coarsening: the prolongator P (aggregate indicator), its transpose
    R, and ``entry_map`` (each fine entry's position among the coarse entries)."""

    def __init__(self, A, coords, coarse_size=COARSE_SIZE, max_levels=20):
        A = sp.csr_matrix(A)
        coords = np.asarray(coords, np.int64)
        if coords.ndim != 2 or coords.shape[0] != A.shape[0]:
            raise ValueError(f"coords must be (n, 1 + ndim) with n = {A.shape[0]} rows of A, "
                             f"got shape {coords.shape}")
        coords = np.ascontiguousarray(coords.T)
        n, indptr, indices = A.shape[0], A.indptr.copy(), A.indices.copy()
        self.patterns = []  # per level: (CSR template, row of each entry, diagonal positions)
        self.steps = []  # per coarsening: (P, R, entry_map)
        while True:
            rows = np.repeat(np.arange(n), np.diff(indptr))
            at_diagonal = np.flatnonzero(indices == rows)
            template = sp.csr_matrix((np.zeros(len(indices)), indices, indptr), shape=(n, n))
            self.patterns.append((template, rows, at_diagonal if len(at_diagonal) == n else None))
            if n <= coarse_size or len(self.steps) >= max_levels:
                break
            agg, coarse_coords = _aggregates(coords)
            nc = coarse_coords.shape[1]
            if nc >= n:
                break
            # the coarse pattern (COO -> CSR sums duplicates), then each fine entry's position
            # in it, looked up in a copy numbering the coarse entries (sorting the keys instead
            # took as long as a whole setup)
            ci, cj = agg[rows], agg[indices]
            coarse = sp.csr_matrix((np.ones(len(ci)), (ci, cj)), shape=(nc, nc))
            coarse.sort_indices()
            coarse.data = np.arange(coarse.nnz, dtype=np.float64)
            entry_map = np.asarray(coarse[ci, cj]).reshape(-1).astype(np.int64)
            P = sp.csr_matrix((np.ones(n), agg, np.arange(n + 1)), shape=(n, nc))
            self.steps.append((P, P.T.tocsr(), entry_map))
            n, indptr, indices, coords = nc, coarse.indptr, coarse.indices, coarse_coords
        self.sizes = [t.shape[0] for t, _, _ in self.patterns]

    def matches(self, A) -> bool:
        """Whether ``A`` (CSR) has the sparsity pattern this hierarchy was built for."""
        fine = self.patterns[0][0]
        return (A.shape == fine.shape and A.indices.shape == fine.indices.shape
                and np.array_equal(A.indptr, fine.indptr) and np.array_equal(A.indices, fine.indices))

    def operators(self, data: np.ndarray) -> list:
        """The values of every level's operator for the fine values ``data`` (in the fine
        pattern's order): each coarse entry is the sum of the fine entries its map sends there."""
        out = [data]
        for _, _, entry_map in self.steps:
            out.append(np.bincount(entry_map, weights=out[-1]).astype(data.dtype, copy=False))
        return out


class Multigrid:
    """``Multigrid(A, coords, coarse_size=COARSE_SIZE, max_levels=20, shift=None, hierarchy=None)``;
    ``M(r)`` applies one V-cycle to ``r`` (an approximation of ``(A + diag(shift))^-1 r``).
    ``hierarchy``: a :class:`Hierarchy` built for A's sparsity pattern (and these coords),
    reused; ``None`` or another pattern: built here (``self.hierarchy``)."""

    def __init__(self, A, coords, coarse_size=COARSE_SIZE, max_levels=20, sweeps=1, over_correction=1.6,
                 shift=None, hierarchy: Hierarchy | None = None):
        if not 0.0 < over_correction < 2.0:
            raise ValueError(f"over_correction must lie in (0, 2), got {over_correction}")
        A = sp.csr_matrix(A)
        if hierarchy is None or not hierarchy.matches(A):
            hierarchy = Hierarchy(A, coords, coarse_size, max_levels)
        elif np.shape(coords)[0] != A.shape[0]:
            raise ValueError(f"coords must be (n, 1 + ndim) with n = {A.shape[0]} rows of A, "
                             f"got shape {np.shape(coords)}")
        dt = A.dtype
        data = A.data
        if shift is not None:  # A + diag(shift), A unchanged
            at_diagonal = hierarchy.patterns[0][2]
            if at_diagonal is None:  # a pattern without some diagonal entry: the sparse sum
                A = (A + sp.diags(np.asarray(shift, dt))).tocsr()
                hierarchy = Hierarchy(A, coords, coarse_size, max_levels)
                data = A.data
            else:
                data = data.copy()
                data[at_diagonal] += np.asarray(shift, dt)
        self.hierarchy = hierarchy
        values = hierarchy.operators(data)
        self.levels = []
        for (P, R, _), (template, rows, at_diagonal), v in zip(hierarchy.steps, hierarchy.patterns, values):
            Ak = _with_values(template, v)
            d = v[at_diagonal] if at_diagonal is not None else Ak.diagonal()
            d = np.where(d > 0, d, 1.0)
            dinv = (1.0 / d).astype(dt)
            # Gershgorin bound on the spectral radius of D^-1 A (cheap, safe: it only lowers
            # the Jacobi weight)
            abs_row_sums = np.bincount(rows, weights=np.abs(v), minlength=len(d))
            rho = float(np.max(dinv * abs_row_sums))
            if not (np.isfinite(rho) and rho > 0):
                rho = 1.0
            self.levels.append((Ak, dinv * dt.type(4.0 / (3.0 * rho)), P.astype(dt, copy=False),
                                R.astype(dt, copy=False)))
        self.coarse = None
        if hierarchy.sizes[-1] > 0:
            Ad = _with_values(hierarchy.patterns[-1][0], values[-1]).toarray()
            try:  # SPD (J^T J plus a damping): Cholesky; else LU
                self.coarse = ("chol", sla.cho_factor(Ad, check_finite=False))
            except np.linalg.LinAlgError:
                self.coarse = ("lu", sla.lu_factor(Ad, check_finite=False))
        self.over_correction = dt.type(over_correction)
        self.n_levels = len(self.levels) + 1
        self.sweeps = int(sweeps)
        self.sizes = list(hierarchy.sizes)

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


# hierarchies by the id of the coords array they were built on: a plan's ``unknown_coords()``
# is one read-only array for the plan's lifetime, so later solves on the plan reuse the
# hierarchy (a Poisson solve needs one multigrid system, and building the hierarchy cost as
# much as the rest of its setup); an entry goes when its coords array does
_HIERARCHIES: dict[int, tuple[weakref.ref, Hierarchy]] = {}


def _known_hierarchy(coords) -> Hierarchy | None:
    entry = _HIERARCHIES.get(id(coords))
    return entry[1] if entry is not None and entry[0]() is coords else None


def _remember_hierarchy(coords, hierarchy: Hierarchy) -> None:
    try:
        ref = weakref.ref(coords, lambda _ref, key=id(coords): _HIERARCHIES.pop(key, None))
    except TypeError:  # not weak-referenceable (a list): not remembered
        return
    _HIERARCHIES[id(coords)] = (ref, hierarchy)


class LinearisedJtJ:
    """``problem.jtj_matrix(x)`` (CSR) assembled once per linearisation point: the LM damping
    changes between rejected steps, ``J^T J`` does not. Shared by the preconditioners that
    assemble it (multigrid, the sparse factorisation); ``assemblies`` counts the builds."""

    def __init__(self):
        self._x = self._jtj = None
        self.assemblies = 0

    def at(self, problem: Any, x: np.ndarray) -> sp.csr_matrix:
        if self._jtj is None or not np.array_equal(x, self._x):
            self._jtj = sp.csr_matrix(problem.jtj_matrix(x))
            self._x = np.array(x, copy=True)
            self.assemblies += 1
        return self._jtj


class MultigridCache:
    """The multigrid preconditioners of one solve (:meth:`preconditioner`): the
    :class:`Hierarchy` reused while ``J^T J`` keeps its pattern (also across solves on the same
    plan: it is remembered by the plan's coords array), and ``J^T J`` assembled once per
    linearisation point (:class:`LinearisedJtJ`). ``setups`` / ``assemblies`` /
    ``hierarchies`` count the work done."""

    def __init__(self):
        self._jtj = LinearisedJtJ()
        self.setups = self.hierarchies = 0

    @property
    def assemblies(self) -> int:
        return self._jtj.assemblies

    def preconditioner(self, problem: Any, x: np.ndarray, shift=None) -> Multigrid:
        """A V-cycle for ``J^T J (+ diag(shift))`` at ``x`` (``problem.jtj_matrix`` and
        ``problem.unknown_coords``)."""
        jtj = self._jtj.at(problem, x)
        coords = problem.unknown_coords()
        known = _known_hierarchy(coords)
        M = Multigrid(jtj, coords, shift=shift, hierarchy=known)
        if M.hierarchy is not known:
            _remember_hierarchy(coords, M.hierarchy)
            self.hierarchies += 1
        self.setups += 1
        return M
