"""The user's target: log f over the unit cube [0, 1]^n, with its derivatives from core_ad.

A :class:`Target` wraps a lane-wise ``log_f(x) -> (B,)`` for ``x`` of shape ``(B, n)``, written
with :mod:`core_ad.numpy` (or plain numpy when derivatives are supplied by the user). Values come
from calling ``log_f`` on plain numpy arrays; gradients and Hessians from
:func:`core_ad.batch_hessian` (``derivatives="traced"``), from its compiled LLVM kernel
(``"compiled"``), or from a user callable ``(x) -> (grad, hess)``.

Discrete structure: ``log_f`` may branch (``core_ad.numpy.where``, comparisons): derivatives at a
state are those of the smooth piece selected at that state (the branch taken is "frozen"), so the
H2MC Gaussian stays a deterministic function of the state and MH keeps the chain exact even
where derivatives ignore a discontinuity. ``support(x) -> bool (B,)`` marks where f > 0 (a
visibility test, a half-plane); outside it log f is ``-inf`` without calling ``log_f``, and the
derivatives never see it. ``active(x) -> bool (B, n)`` optionally marks the dimensions that are
part of a state's smooth structure; the gradient and Hessian of inactive dimensions are zeroed,
so those dimensions are perturbed by the H2MC prior alone (spec 4.7 rule 1), and a dimension may
switch between active and inactive from one state to the next.

Bad values are handled, never propagated: a NaN or ``+inf`` log f is counted and turned into
``-inf`` (the proposal is rejected); a user Hessian that is not symmetric beyond rounding raises
:class:`NonSymmetricHessianError`; non-finite derivatives are left to the proposal's fallback.
"""

from __future__ import annotations

import numpy as np

import core_ad
import core_ad.numpy as anp
from core_ad import sym

DERIVATIVE_MODES = ("traced", "compiled")


class NonSymmetricHessianError(ValueError):
    """A user-supplied Hessian is not symmetric (beyond rounding)."""


class TargetShapeError(ValueError):
    """``log_f`` or a user derivative returned an array of the wrong shape."""


class _SymColumns:
    """Stand-in for a ``(B, n)`` input during symbolic tracing: ``x[:, j]`` is variable j."""

    def __init__(self, cols):
        self._cols = cols
        self.shape = (-1, len(cols))
        self.ndim = 2
        self.dtype = np.dtype(np.float64)

    def __getitem__(self, index):
        if (isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None)
                and isinstance(index[1], (int, np.integer))):
            return self._cols[int(index[1])]
        raise TypeError(f"compiled target: only column access x[:, j] can be traced, got {index!r}")


class Target:
    """A log-density on ``[0, 1]^n`` (up to a constant), evaluated lane-wise on ``(B, n)``.

    Parameters
    ----------
    log_f : callable ``(B, n) -> (B,)``, lane-wise (row b of the output depends on row b only).
    n : the dimension.
    derivatives : ``"traced"`` (core_ad.batch_hessian on tracing arrays), ``"compiled"``
        (core_ad's compiled LLVM kernel; ``log_f`` must use only columns ``x[:, j]`` and
        core_ad.numpy functions) or a callable ``x -> (grad (B, n), hess (B, n, n))`` of log f.
    gradient : optional callable ``x -> grad (B, n)`` (for MALA / HMC); by default derived from
        the same source as ``derivatives``.
    support : optional ``x -> bool (B,)``; log f is ``-inf`` where it is False.
    active : optional ``x -> bool (B, n)``; derivatives of inactive dimensions are zeroed.
    symmetry_tol : relative tolerance for user Hessians, ``max|H - H^T| <= tol (1 + max|H|)``.
    """

    def __init__(self, log_f, n: int, *, derivatives="traced", gradient=None, support=None,
                 active=None, name: str = "", symmetry_tol: float = 1e-8):
        if not callable(log_f):
            raise TypeError("Target: log_f must be callable (B, n) -> (B,)")
        self.log_f_fn = log_f
        self.n = int(n)
        if self.n < 1:
            raise ValueError(f"Target: n must be >= 1, got {n}")
        if not (callable(derivatives) or derivatives in DERIVATIVE_MODES):
            raise ValueError(f"Target: derivatives must be one of {DERIVATIVE_MODES} or a"
                             f" callable, got {derivatives!r}")
        self.derivatives_mode = derivatives
        self.gradient_fn = gradient
        self.support = support
        self.active = active
        self.name = name or getattr(log_f, "__name__", "target")
        self.symmetry_tol = float(symmetry_tol)
        self._compiled_hess = None
        self._compiled_grad = None
        self._traced_grad = None
        self.reset_counts()

    # ------------------------------------------------------------------ bookkeeping
    def reset_counts(self) -> None:
        """Zero the evaluation counters (points evaluated, per kind)."""
        self.counts = {"value": 0, "grad": 0, "hess": 0, "nonfinite_value": 0}

    def _check_x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n:
            raise TargetShapeError(f"{self.name}: x must have shape (B, {self.n}), got {x.shape}")
        return x

    # ------------------------------------------------------------------ values
    def log_f(self, x) -> np.ndarray:
        """``log f`` at each row of ``x``; NaN and ``+inf`` become ``-inf`` (and are counted)."""
        x = self._check_x(x)
        B = x.shape[0]
        out = np.full(B, -np.inf)
        self.counts["value"] += B
        if B == 0:
            return out
        inside = np.ones(B, bool)
        if self.support is not None:
            inside = np.asarray(self.support(x), dtype=bool).reshape(B)
        if inside.any():
            xs = x if inside.all() else x[inside]
            with np.errstate(all="ignore"):
                v = self.log_f_fn(xs)
            v = np.asarray(getattr(v, "value", v), dtype=np.float64)
            if v.shape != (xs.shape[0],):
                raise TargetShapeError(f"{self.name}: log_f must map (B, {self.n}) to (B,),"
                                       f" got {v.shape} for B = {xs.shape[0]}")
            bad = np.isnan(v) | (v == np.inf)
            if bad.any():
                self.counts["nonfinite_value"] += int(bad.sum())
                v = np.where(bad, -np.inf, v)
            out[inside] = v
        return out

    # ------------------------------------------------------------------ derivatives
    def _mask_inactive(self, x, g, H):
        if self.active is None:
            return g, H
        act = np.asarray(self.active(x), dtype=bool).reshape(x.shape)
        g = np.where(act, g, 0.0)
        H = np.where(act[:, :, None] & act[:, None, :], H, 0.0)
        return g, H

    def derivatives(self, x):
        """``(grad (B, n), hess (B, n, n))`` of log f at each row of ``x`` (smooth piece)."""
        x = self._check_x(x)
        B, n = x.shape
        self.counts["hess"] += B
        if B == 0:
            return np.zeros((0, n)), np.zeros((0, n, n))
        mode = self.derivatives_mode
        with np.errstate(all="ignore"):
            if callable(mode):
                g, H = mode(x)
                g, H = self._validate_user(x, g, H)
            elif mode == "compiled":
                if self._compiled_hess is None:
                    self._compiled_hess = core_ad.compiled_batch_hessian(self.log_f_fn, n)
                g, H = self._compiled_hess(np.ascontiguousarray(x))
            else:
                g, H = core_ad.batch_hessian(self.log_f_fn, x)
        return self._mask_inactive(x, np.asarray(g, np.float64), np.asarray(H, np.float64))

    def gradient(self, x) -> np.ndarray:
        """``grad (B, n)`` of log f at each row of ``x`` (for MALA and HMC)."""
        x = self._check_x(x)
        B, n = x.shape
        if B == 0:
            return np.zeros((0, n))
        mode = self.derivatives_mode
        with np.errstate(all="ignore"):
            if self.gradient_fn is not None:
                g = np.asarray(self.gradient_fn(x), dtype=np.float64)
                if g.shape != (B, n):
                    raise TargetShapeError(f"{self.name}: gradient must return ({B}, {n}),"
                                           f" got {g.shape}")
            elif callable(mode):
                self.counts["hess"] -= B  # counted as a gradient evaluation below
                g, _ = self.derivatives(x)
            elif mode == "compiled":
                g = self._compiled_gradient(x)
            else:
                if self._traced_grad is None:
                    f = self.log_f_fn
                    self._traced_grad = core_ad.grad(lambda v: anp.sum(f(v)))
                g = np.asarray(self._traced_grad(x), dtype=np.float64)
        self.counts["grad"] += B
        if self.active is not None:
            act = np.asarray(self.active(x), dtype=bool).reshape(x.shape)
            g = np.where(act, g, 0.0)
        return g

    def _compiled_gradient(self, x):
        if self._compiled_grad is None:
            xs = [sym.var(f"x{j}", np.float64) for j in range(self.n)]
            out = sym.as_expr(self.log_f_fn(_SymColumns(xs)), "h2mc gradient")
            self._compiled_grad = sym.compile(list(sym.grad(out, xs)), xs)
        res = self._compiled_grad(*[np.ascontiguousarray(x[:, j]) for j in range(self.n)])
        return np.stack([np.broadcast_to(r, x.shape[:1]) for r in res], axis=1)

    def _validate_user(self, x, g, H):
        B, n = x.shape
        g = np.asarray(g, dtype=np.float64)
        H = np.asarray(H, dtype=np.float64)
        if g.shape != (B, n) or H.shape != (B, n, n):
            raise TargetShapeError(f"{self.name}: derivatives must return grad ({B}, {n}) and"
                                   f" hess ({B}, {n}, {n}), got {g.shape} and {H.shape}")
        with np.errstate(invalid="ignore"):
            asym = np.nanmax(np.abs(H - np.swapaxes(H, 1, 2)), axis=(1, 2), initial=0.0)
            scale = 1.0 + np.nanmax(np.abs(np.where(np.isfinite(H), H, 0.0)), axis=(1, 2),
                                    initial=0.0)
        bad = asym > self.symmetry_tol * scale
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise NonSymmetricHessianError(
                f"{self.name}: the user-supplied Hessian is not symmetric at lane {b}"
                f" (x = {x[b].tolist()}): max |H - H^T| = {asym[b]:.3g} > {self.symmetry_tol:g}"
                f" * (1 + max|H|); a Hessian of log f must be symmetric -- check the derivative"
                " code (or use derivatives='traced' to get it from core_ad)")
        return g, H
