"""Closed-form Hamiltonian dynamics on a quadratic landscape, one eigen-direction at a time.

On the local model log f(x) ~ 1/2 x^T H x + G^T x the equations of motion (thesis eq. 6.12) are
``x'' = alpha x + beta`` per eigen-direction, with ``alpha = (A H)_i`` and ``beta = (A G)_i``.
From ``x(0) = 0`` and ``x'(0) = p_hat`` the position at time ``T`` is ``s p_hat + o`` (eq. 6.16):

=============  =========================  ==========================================
case           s                          o (exact solution of eq. 6.12)
=============  =========================  ==========================================
alpha > 0      sinh(sqrt(a) T) / sqrt(a)  beta / alpha (cosh(sqrt(a) T) - 1)
alpha < 0      sin(sqrt(-a) T) / sqrt(-a) beta / alpha (cos(sqrt(-a) T) - 1)
alpha = 0      T                          beta T^2 / 2
=============  =========================  ==========================================

Erratum D1 of the spec: the thesis (eq. 6.16 and App. 6.A) and the reference implementation
print the alpha > 0 offset as ``beta / (2 alpha) (e^+ + e^- - 1)``, i.e. ``cosh - 1/2`` instead
of ``cosh - 1``. ``offset_variant="thesis"`` reproduces the print; the default ``"exact"`` is the
true solution. Both give valid MH kernels (the proposal density is evaluated consistently); only
efficiency differs.
"""

from __future__ import annotations

import numpy as np

T_DEFAULT = np.pi / 2
OFFSET_VARIANTS = ("exact", "thesis")


def _check_variant(offset_variant: str) -> None:
    if offset_variant not in OFFSET_VARIANTS:
        raise ValueError(
            f"offset_variant must be one of {OFFSET_VARIANTS}, got {offset_variant!r}"
        )


def dynamics_coefficients(alpha, beta, T=T_DEFAULT, offset_variant: str = "exact"):
    """``(s, o)`` with ``x(T) = s * p_hat + o`` for ``x'' = alpha x + beta``, ``x(0) = 0``.

    ``alpha`` and ``beta`` broadcast (any shape); ``T`` is a scalar or broadcasts too. The
    ``alpha = 0`` case is selected exactly (``alpha == 0``); tiny non-zero ``alpha`` use the
    hyperbolic/trigonometric forms, which are continuous there.
    """
    _check_variant(offset_variant)
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    alpha, beta, T = np.broadcast_arrays(alpha, beta, T)
    pos, neg = alpha > 0, alpha < 0
    safe = np.where(alpha == 0, 1.0, alpha)
    r = np.sqrt(np.abs(safe))
    rt = r * T
    s = np.where(pos, np.sinh(rt) / r, np.where(neg, np.sin(rt) / r, T))
    c_pos = np.cosh(rt) - (0.5 if offset_variant == "thesis" else 1.0)
    o = np.where(
        pos,
        beta / safe * c_pos,
        np.where(neg, beta / safe * (np.cos(rt) - 1.0), 0.5 * beta * T * T),
    )
    return s, o


def dynamics_position(alpha, beta, p_hat, t):
    """The exact trajectory ``x(t)`` of ``x'' = alpha x + beta`` (eqs. 6.13-6.14), for checks."""
    s, o = dynamics_coefficients(alpha, beta, t, "exact")
    return s * np.asarray(p_hat, dtype=np.float64) + o
