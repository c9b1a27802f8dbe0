"""The H2MC proposal: a Gaussian over the offset ``z = y - x`` built from G and H of log f.

Thesis section 6.3 and App. 6.A, with the spec's errata and robustness rules (spec sections
4.3-4.7). Everything is batched over a leading lane axis: ``grad`` is ``(B, n)`` and ``hess``
``(B, n, n)``; one call handles every chain of a batch with core_ad's compiled per-lane
eigen-solver (cyclic Jacobi, n <= 16; 3-4x faster than numpy's batched ``eigh`` at n = 8..16,
which it falls back on for larger n).

Per lane, with ``H = E diag(lam) E^T`` (symmetrised first) and ``g = E^T G``:

* inverse mass ``A = sum_i a_i e_i e_i^T`` with ``a_i = 1/|lam_i|`` (0 when ``|lam_i| <= eps``),
  so ``A H`` has eigenvalues ``alpha_i = sign(lam_i)`` (0 when flat) and ``beta_i = a_i g_i``;
* closed-form dynamics to ``T`` (default pi/2): ``x(T) = s_i p_hat_i + o_i`` per direction, so
  ``x(T)`` is Gaussian with mean ``o`` and variance ``v_i = s_i^2 a_i`` (eq. 6.19);
* the isotropic prior ``N(0, sigma2 I)`` multiplies it (eq. 6.20): precision
  ``pi_i = 1/v_i + 1/sigma2``, mean ``(1/v_i) / pi_i * o_i``; ``sigma2`` is a *variance*;
* rule 4.7.1: ``v_i <= 1e-10`` (flat directions included) gets ``1/v_i := 0``, i.e. the prior
  alone, not a frozen coordinate;
* rule 4.7.2: ``f(x) <= 1e-15`` or ``||H||_F < 0.5 / sigma2`` gives ``N(0, sigma2 I)``;
* rule 4.7.3: non-finite G or H are replaced by zeros (hence the isotropic fallback).

The result is a deterministic function of (G, H, log f, parameters), so evaluating it at ``x``
and at ``y`` gives the forward and reverse densities of one fixed MH kernel (eqs. 6.21-6.22).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import core_ad
import numpy as np

from ._dynamics import T_DEFAULT, _check_variant, dynamics_coefficients

LOG_2PI = float(np.log(2 * np.pi))


class ImproperProposalError(ValueError):
    """A direction got zero precision: no curvature information and no prior (sigma2=inf)."""


@dataclass
class GaussianProposal:
    """``N(mean, basis diag(1/precision) basis^T)`` per lane, for the offset ``z = y - x``.

    ``basis`` ``(B, n, n)`` holds orthonormal eigenvectors as columns, ``precision`` ``(B, n)``
    the per-direction precisions ``pi_i``, ``mean`` ``(B, n)`` the mean offset ``mu*`` in the
    original coordinates. ``isotropic`` marks lanes that took the isotropic fallback and
    ``nonfinite`` lanes whose derivatives were not finite.
    """

    basis: np.ndarray
    precision: np.ndarray
    mean: np.ndarray
    isotropic: np.ndarray
    nonfinite: np.ndarray

    @property
    def n(self) -> int:
        return self.mean.shape[-1]

    def __len__(self) -> int:
        return self.mean.shape[0]

    def take(self, idx) -> "GaussianProposal":
        return GaussianProposal(self.basis[idx], self.precision[idx], self.mean[idx],
                                self.isotropic[idx], self.nonfinite[idx])

    def put(self, idx, other: "GaussianProposal") -> None:
        """Overwrite lanes ``idx`` with ``other`` (in place)."""
        self.basis[idx] = other.basis
        self.precision[idx] = other.precision
        self.mean[idx] = other.mean
        self.isotropic[idx] = other.isotropic
        self.nonfinite[idx] = other.nonfinite

    def log_normalizer(self) -> np.ndarray:
        """``log((2 pi)^{-n/2} |Sigma*|^{-1/2})`` per lane (erratum D5: exponent -1/2)."""
        return -0.5 * self.n * LOG_2PI + 0.5 * np.sum(np.log(self.precision), axis=-1)

    def log_density(self, z) -> np.ndarray:
        """``log Phi(z)`` (eq. 6.22) for offsets ``z`` of shape ``(B, n)``."""
        d = np.asarray(z, dtype=np.float64) - self.mean
        w = np.einsum("bji,bj->bi", self.basis, d)
        return self.log_normalizer() - 0.5 * np.sum(self.precision * w * w, axis=-1)

    def sample(self, rng=None, xi=None) -> np.ndarray:
        """Offsets ``z = mean + basis diag(pi^-1/2) xi`` with ``xi ~ N(0, I)`` (or the given)."""
        if xi is None:
            xi = np.random.default_rng(rng).standard_normal(self.mean.shape)
        w = np.asarray(xi, dtype=np.float64) / np.sqrt(self.precision)
        return self.mean + np.einsum("bij,bj->bi", self.basis, w)

    def covariance(self) -> np.ndarray:
        """``Sigma* = basis diag(1/pi) basis^T`` per lane, ``(B, n, n)``."""
        return np.einsum("bik,bk,bjk->bij", self.basis, 1.0 / self.precision, self.basis)

    def variances(self) -> np.ndarray:
        """Per-direction variances ``1/pi_i`` (eigenvalues of ``Sigma*``), ``(B, n)``."""
        return 1.0 / self.precision


def _inv_sigma2(sigma2) -> float:
    sigma2 = float(sigma2)
    if not sigma2 > 0:
        raise ValueError(f"sigma2 (the prior variance) must be > 0, got {sigma2}")
    return 0.0 if np.isinf(sigma2) else 1.0 / sigma2


def isotropic_proposal(batch: int, n: int, sigma2) -> GaussianProposal:
    """``N(0, sigma2 I)`` for ``batch`` lanes (the fallback and the Kelemen small step)."""
    inv = _inv_sigma2(sigma2)
    if inv == 0.0:
        raise ImproperProposalError("isotropic proposal needs a finite sigma2")
    return GaussianProposal(
        np.broadcast_to(np.eye(n), (batch, n, n)).copy(),
        np.full((batch, n), inv),
        np.zeros((batch, n)),
        np.ones(batch, bool),
        np.zeros(batch, bool),
    )


@functools.cache
def _unit_coefficients(T, offset_variant):
    """:func:`dynamics_coefficients` at ``alpha = -1, 0, 1`` and ``beta = 1`` (read-only)."""
    s3, o3 = dynamics_coefficients(np.array([-1.0, 0.0, 1.0]), 1.0, T, offset_variant)
    s3.flags.writeable = o3.flags.writeable = False
    return s3, o3


def h2mc_proposal(grad, hess, sigma2, *, log_f=None, T=T_DEFAULT, eps=1e-10,
                  offset_variant: str = "exact", min_variance=1e-10, min_f=1e-15,
                  fallback_hessian_norm=0.5) -> GaussianProposal:
    """The H2MC Gaussian over the offset at each lane (spec 4.4-4.7).

    ``grad`` ``(B, n)`` and ``hess`` ``(B, n, n)`` are the gradient and Hessian of **log f** at
    the lanes' states (a single ``(n,)``/``(n, n)`` pair is accepted too and gives ``B = 1``).
    ``sigma2`` is the prior *variance* (``np.inf`` disables the prior and the fallbacks of
    rule 4.7.2: used to check that Gaussian targets are reproduced exactly). ``log_f``
    ``(B,)``, when given, enables the ``f <= min_f`` isotropic fallback. ``T`` is the
    simulation time, ``eps`` the eigenvalue cutoff, ``offset_variant`` ``"exact"`` (default)
    or ``"thesis"`` (erratum D1).
    """
    _check_variant(offset_variant)
    inv_s2 = _inv_sigma2(sigma2)
    G = np.array(grad, dtype=np.float64)
    H = np.array(hess, dtype=np.float64)
    if G.ndim == 1:
        G, H = G[None], H[None]
    if G.ndim != 2 or H.shape != G.shape + (G.shape[1],):
        raise ValueError(f"h2mc_proposal: need grad (B, n) and hess (B, n, n), got {G.shape}"
                         f" and {H.shape}")
    B, n = G.shape
    nonfinite = ~(np.isfinite(G).all(axis=1) & np.isfinite(H).all(axis=(1, 2)))
    G[nonfinite] = 0.0  # rule 4.7.3
    H[nonfinite] = 0.0
    H = 0.5 * (H + np.swapaxes(H, 1, 2))  # rule 4.7.6
    lam, E = core_ad.eigh(H)
    g = np.einsum("bji,bj->bi", E, G)
    flat = np.abs(lam) <= eps
    a = np.where(flat, 0.0, 1.0 / np.where(flat, 1.0, np.abs(lam)))
    alpha = np.where(flat, 0.0, np.sign(lam))
    if np.ndim(T) == 0:
        # alpha is -1, 0 or +1: the closed forms at those three (o is linear in beta)
        s3, o3 = _unit_coefficients(float(T), offset_variant)
        k = (alpha + 1).astype(np.int64)
        s, o = s3[k], o3[k] * (a * g)
    else:
        s, o = dynamics_coefficients(alpha, a * g, T, offset_variant)
    v = s * s * a
    small = v <= min_variance  # rule 4.7.1
    inv_v = np.where(small, 0.0, 1.0 / np.where(small, 1.0, v))
    prec = inv_v + inv_s2
    m = np.where(prec > 0, inv_v / np.where(prec > 0, prec, 1.0) * o, 0.0)

    iso = nonfinite | (np.sqrt(np.sum(H * H, axis=(1, 2))) < fallback_hessian_norm * inv_s2)
    if log_f is not None and inv_s2 > 0:  # without a prior there is nothing to fall back on
        lf = np.asarray(log_f, dtype=np.float64).reshape(B)
        iso |= ~(lf > np.log(min_f))  # rule 4.7.2 (NaN log f counts as 0)
    if iso.any():
        if inv_s2 == 0.0:
            raise ImproperProposalError(
                "h2mc_proposal: the isotropic fallback needs a finite sigma2 (prior variance)")
        E[iso] = np.eye(n)
        prec[iso] = inv_s2
        m[iso] = 0.0
    if not (prec > 0).all():
        raise ImproperProposalError(
            "h2mc_proposal: a direction without curvature information has zero precision;"
            " use a finite sigma2 (the prior variance) so that it falls back on the prior")
    mean = np.einsum("bij,bj->bi", E, m)
    return GaussianProposal(E, prec, mean, iso, nonfinite)


def h2mc_log_acceptance(log_f_x, log_f_y, prop_x: GaussianProposal, prop_y: GaussianProposal,
                        z) -> np.ndarray:
    """``log a(x -> y)`` before clamping (eq. 6.21), with the unwrapped offset ``z = y - x``.

    ``log f(y) - log f(x) + log Phi_y(-z) - log Phi_x(z)``; a proposal with ``f(y) = 0`` (or a
    NaN) gets ``-inf``.
    """
    z = np.asarray(z, dtype=np.float64)
    lx = np.asarray(log_f_x, dtype=np.float64)
    ly = np.asarray(log_f_y, dtype=np.float64)
    out = ly - lx + prop_y.log_density(-z) - prop_x.log_density(z)
    bad = ~np.isfinite(ly) | np.isnan(out)
    return np.where(bad, -np.inf, out)
