"""The problem protocol the solvers consume, and a small concrete implementation.

Cost convention (spec §10 item 1): ``cost(x) = 1/2 * sum(F(x)**2)`` (Ceres-compatible).  With
this scale the gradient is ``J^T F`` and the Gauss-Newton Hessian is ``J^T J``; the paper's factors
of 2 (``2 J^T J delta = -2 J^T F``) cancel in every linear system, so the iterates are identical.

A generated (compiled) problem implements :class:`LeastSquaresProblem`.  It may additionally
define ``linearize(x)``: the solvers call it exactly once each time ``x`` becomes the current
iterate (at the start and after every accepted step), *before* calling ``jtf``, ``jtj_diag`` and
``jtjp`` at that ``x``.  A problem can use the hook to pre-compute per-outer-iteration data (e.g.
materialise the entries of J, or ComputedArrays), and then serve ``jtjp(x, p)`` from that cache
during PCG.  Trial points (``x + delta`` evaluated only for the step-acceptance test) are
*never* linearised: only ``cost(x_trial)`` is requested there, so a rejected step leaves the
cached linearisation valid.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

__all__ = ["LeastSquaresProblem", "DenseProblem", "call_linearize", "jtjp_operator",
           "multigrid_preconditioner", "resolve_preconditioner", "assembled_preconditioner"]


@runtime_checkable
class LeastSquaresProblem(Protocol):
    """What the GN / LM solvers need from a problem (all vectors flat, in ``dtype``)."""

    n: int  # number of free scalar unknowns (length of the flat vector x)
    dtype: np.dtype  # float32 or float64; solvers keep every work vector in this dtype

    def residuals(self, x: np.ndarray) -> np.ndarray:
        """F(x), flat."""

    def cost(self, x: np.ndarray) -> float:
        """0.5 * sum(F(x)**2)."""

    def jtf(self, x: np.ndarray) -> np.ndarray:
        """J(x)^T F(x), the gradient of ``cost`` (length n)."""

    def jtj_diag(self, x: np.ndarray) -> np.ndarray:
        """diag(J^T J): squared column norms of J (the Jacobi preconditioner)."""

    def jtjp(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        """J(x)^T J(x) p, matrix-free."""

    def jacobian(self, x: np.ndarray) -> Any:
        """J(x) as a scipy.sparse matrix (for checks and baselines only)."""


def call_linearize(problem: Any, x: np.ndarray) -> None:
    """Call the optional ``problem.linearize(x)`` hook if the problem has one."""
    hook = getattr(problem, "linearize", None)
    if hook is not None:
        hook(x)


def resolve_preconditioner(problem: Any, opts) -> str:
    """The preconditioner ``opts.preconditioner`` names; ``"auto"``: ``"jacobi+multigrid"``
    (:mod:`.adaptive`: Jacobi, multigrid for the systems where Jacobi is slow) for an energy on
    one grid (``problem.is_grid_energy``, with ``jtj_matrix`` and ``unknown_coords``) of at
    least ``opts.multigrid_min_unknowns`` unknowns, where Jacobi-PCG can need a number of
    iterations growing with the grid diameter; Jacobi elsewhere (graphs, small problems, and
    device problems: the cuda backend's all-device loop, whose vectors multigrid cannot take).
    ``"factorization"`` (:mod:`.factorization`) is never chosen automatically: it measured
    1.6x faster on a small ARAP mesh but slower on a spring network, and no rule found tells
    the two apart in time (see that module)."""
    kind = opts.preconditioner
    if kind in ("multigrid", "jacobi+multigrid", "factorization") and getattr(problem, "xp", np) is not np:
        raise ValueError(
            f"preconditioner={kind!r} is built on the host (scipy) and cannot precondition "
            "the all-device solver loop of the cuda backend; use 'jacobi' (what 'auto' picks there), "
            "'none', 'ceres', 'modified_ceres' or 'epsilon', or solve(..., device_loop=False)")
    if kind != "auto":
        return kind
    grid = (getattr(problem, "is_grid_energy", False) and hasattr(problem, "jtj_matrix")
            and hasattr(problem, "unknown_coords"))
    return "jacobi+multigrid" if grid and problem.n >= opts.multigrid_min_unknowns else "jacobi"


def assembled_preconditioner(kind: str, problem: Any, x: np.ndarray, shift, multigrid, factors):
    """The preconditioner of ``kind`` ("multigrid" / "jacobi+multigrid" or "factorization")
    for ``J^T J (+ diag(shift))`` at x, from the solve's caches (a :class:`~.multigrid.MultigridCache`, a
    :class:`~.factorization.LaggedFactorization`)."""
    if kind.endswith("multigrid"):
        return multigrid_preconditioner(problem, x, shift, multigrid)
    if not hasattr(problem, "jtj_matrix"):
        raise TypeError(f"preconditioner={kind!r} needs a problem with jtj_matrix(x) (a compiled Plan)")
    return factors.preconditioner(problem, x, shift)


def multigrid_preconditioner(problem: Any, x: np.ndarray, shift=None, cache=None):
    """A :class:`~.multigrid.Multigrid` V-cycle for ``J^T J (+ diag(shift))`` at x; needs
    ``problem.jtj_matrix(x)`` (scipy sparse) and ``problem.unknown_coords()``. ``cache``: the
    solve's :class:`~.multigrid.MultigridCache` (its hierarchy and last ``J^T J`` reused);
    None: a fresh one."""
    from .multigrid import MultigridCache

    if not (hasattr(problem, "jtj_matrix") and hasattr(problem, "unknown_coords")):
        raise TypeError("preconditioner='multigrid' needs a problem with jtj_matrix(x) and "
                        "unknown_coords() (a compiled Plan)")
    return (MultigridCache() if cache is None else cache).preconditioner(problem, x, shift)


def jtjp_operator(problem: Any, x: np.ndarray):
    """``p -> J(x)^T J(x) p`` for the PCG loop. A problem with a ``linearize`` hook may also
    define ``jtjp_linearized(p)`` (J^T J p at the x of the last ``linearize`` call, skipping the
    per-call check that x is still the linearisation point); it is used when present. (LM also
    uses ``damped_jtjp_linearized(p, D)`` = J^T J p + D p where a problem defines it: the cuda
    device problem, which adds the damping inside its product kernel.)"""
    fast = getattr(problem, "jtjp_linearized", None)
    if fast is not None and getattr(problem, "linearize", None) is not None:
        return fast
    return lambda p: problem.jtjp(x, p)


class DenseProblem:
    """A :class:`LeastSquaresProblem` from explicit residual and Jacobian callables.

    ``fun(x) -> F`` (shape (m,)), ``jac(x) -> J`` (dense ndarray or scipy.sparse, shape (m, n)).
    Intended for tests and small problems (e.g. NIST StRD).  ``linearize(x)`` caches ``J(x)``;
    ``jtf``/``jtj_diag``/``jtjp`` reuse the cache while called at the same ``x`` (compared by
    value), otherwise they re-evaluate ``jac``.  ``n_jac_evals`` counts Jacobian evaluations.
    """

    def __init__(
        self,
        fun: Callable[[np.ndarray], Any],
        jac: Callable[[np.ndarray], Any],
        n: int,
        dtype: Any = np.float64,
    ) -> None:
        self.fun = fun
        self.jac = jac
        self.n = int(n)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self._cache_key: bytes | None = None
        self._cache_J: Any = None
        self.n_jac_evals = 0

    # -- helpers -------------------------------------------------------------------------
    def _x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype).reshape(-1)
        if x.shape[0] != self.n:
            raise ValueError(f"x has length {x.shape[0]}, expected {self.n}")
        return x

    def _J(self, x: np.ndarray) -> Any:
        x = self._x(x)
        key = x.tobytes()
        if key != self._cache_key:
            J = self.jac(x)
            self.n_jac_evals += 1
            if sp.issparse(J):
                J = sp.csr_matrix(J, dtype=self.dtype)
            else:
                J = np.asarray(J, dtype=self.dtype)
                if J.ndim == 1:
                    J = J.reshape(-1, 1) if self.n == 1 else J.reshape(1, -1)
            if J.shape[1] != self.n:
                raise ValueError(f"jacobian has shape {J.shape}, expected (m, {self.n})")
            self._cache_key, self._cache_J = key, J
        return self._cache_J

    # -- protocol ------------------------------------------------------------------------
    def linearize(self, x: np.ndarray) -> None:
        self._J(x)

    def residuals(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.fun(self._x(x)), dtype=self.dtype).reshape(-1)

    def cost(self, x: np.ndarray) -> float:
        r = self.residuals(x)
        with np.errstate(over="ignore", invalid="ignore"):
            return float(self.dtype.type(0.5) * np.dot(r, r))

    def jtf(self, x: np.ndarray) -> np.ndarray:
        J = self._J(x)
        r = self.residuals(x)
        return np.asarray(J.T @ r, dtype=self.dtype).reshape(-1)

    def jtj_diag(self, x: np.ndarray) -> np.ndarray:
        J = self._J(x)
        if sp.issparse(J):
            return np.asarray(J.multiply(J).sum(axis=0), dtype=self.dtype).reshape(-1)
        return np.einsum("ij,ij->j", J, J).astype(self.dtype, copy=False)

    def jtjp(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        J = self._J(x)
        p = np.asarray(p, dtype=self.dtype).reshape(-1)
        return np.asarray(J.T @ (J @ p), dtype=self.dtype).reshape(-1)

    def jacobian(self, x: np.ndarray) -> sp.csr_matrix:
        J = self._J(x)
        return sp.csr_matrix(J, dtype=self.dtype)
