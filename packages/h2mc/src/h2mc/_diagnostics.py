"""Chain diagnostics: effective sample size (Geyer), histograms, total variation, batch means."""

from __future__ import annotations

import numpy as np


def autocovariance(chains) -> np.ndarray:
    """Autocovariance of a scalar over lags, averaged over chains, ``(N,)``.

    ``chains`` is ``(N, B)`` (steps x chains, or ``(N,)`` for one chain). Every chain is centred
    on the *pooled* mean, so between-chain disagreement (non-convergence) lowers the ESS.
    """
    x = np.asarray(chains, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    N = x.shape[0]
    d = x - x.mean()
    nfft = 1 << int(np.ceil(np.log2(2 * N)))
    F = np.fft.rfft(d, n=nfft, axis=0)
    ac = np.fft.irfft(F * np.conj(F), n=nfft, axis=0)[:N]
    return ac.mean(axis=1) / N


def integrated_autocorrelation_time(chains, monotone: bool = False) -> float:
    """tau = 1 + 2 sum rho_k with Geyer's initial positive sequence truncation.

    The pairs ``Gamma_m = rho_{2m} + rho_{2m+1}`` are summed while positive (Geyer's initial
    positive sequence, the spec's estimator); ``monotone=True`` also makes them non-increasing
    (Geyer's initial monotone sequence). A constant chain
    returns ``inf``.
    """
    ac = autocovariance(chains)
    if not ac[0] > 0:
        return float("inf")
    rho = ac / ac[0]
    N = rho.size
    m_max = N // 2
    gam = rho[0:2 * m_max:2] + rho[1:2 * m_max:2]
    pos = np.flatnonzero(gam <= 0)
    k = pos[0] if pos.size else gam.size
    gam = gam[:k]
    if monotone and gam.size:
        gam = np.minimum.accumulate(gam)
    tau = -1.0 + 2.0 * float(gam.sum())
    return max(tau, 1.0 / np.log10(max(N, 10)))  # Stan's cap: ESS <= N log10(N) per chain


def ess(chains, monotone: bool = False) -> float:
    """Effective sample size of a scalar from ``(N, B)`` draws (B chains, pooled)."""
    x = np.asarray(chains, dtype=np.float64)
    total = x.size
    tau = integrated_autocorrelation_time(x, monotone)
    return 0.0 if not np.isfinite(tau) else total / tau


def min_ess(samples, logf=None, monotone: bool = False) -> dict:
    """ESS of every coordinate (and of log f when given); ``"min"`` is the minimum.

    ``samples`` ``(N, B, n)``. The spec's AE convention: min over coordinates and log f.
    """
    s = np.asarray(samples)
    out = {f"x{j}": ess(s[:, :, j], monotone) for j in range(s.shape[2])}
    if logf is not None:
        lf = np.asarray(logf)
        out["logf"] = ess(np.where(np.isfinite(lf), lf, np.nanmin(lf[np.isfinite(lf)])),
                          monotone)
    out["min"] = min(out.values())
    return out


def histogram2d(samples, bins: int = 64, dims=(0, 1)) -> np.ndarray:
    """Normalised 2D histogram (sums to 1) of two coordinates over ``[0, 1)^2``.

    ``samples`` is ``(..., n)``; returns ``(bins, bins)`` indexed ``[i_x, i_y]``.
    """
    s = np.asarray(samples).reshape(-1, np.asarray(samples).shape[-1])
    ix = np.clip((s[:, dims[0]] * bins).astype(np.int64), 0, bins - 1)
    iy = np.clip((s[:, dims[1]] * bins).astype(np.int64), 0, bins - 1)
    h = np.bincount(ix * bins + iy, minlength=bins * bins).reshape(bins, bins).astype(float)
    return h / h.sum()


class HistogramAccumulator:
    """Accumulates a 2D histogram of chain states step by step (no sample storage)."""

    def __init__(self, bins: int = 64, dims=(0, 1)):
        self.bins, self.dims = int(bins), dims
        self.counts = np.zeros(self.bins * self.bins, np.int64)

    def __call__(self, step, state):
        x = state.x
        b = self.bins
        ix = np.clip((x[:, self.dims[0]] * b).astype(np.int64), 0, b - 1)
        iy = np.clip((x[:, self.dims[1]] * b).astype(np.int64), 0, b - 1)
        self.counts += np.bincount(ix * b + iy, minlength=b * b)

    @property
    def histogram(self) -> np.ndarray:
        h = self.counts.reshape(self.bins, self.bins).astype(float)
        return h / max(h.sum(), 1.0)


def total_variation(p, q) -> float:
    """``1/2 sum |p - q|`` of two normalised histograms."""
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def chain_means_se(values) -> tuple[float, float]:
    """Mean and standard error of a statistic from independent chains (batch means).

    ``values`` ``(N, B)``: each chain's time average is one batch mean; the standard error is
    ``std(batch means) / sqrt(B)``.
    """
    v = np.asarray(values, dtype=np.float64)
    bm = v.mean(axis=0)
    return float(bm.mean()), float(bm.std(ddof=1) / np.sqrt(bm.size))


def rel_mse(image, reference, floor=1e-2):
    """Spec 10's relMSE: mean over pixels and channels of ``(I - R)^2 / (R^2 + floor)``."""
    image, reference = np.asarray(image, np.float64), np.asarray(reference, np.float64)
    if image.shape != reference.shape:
        raise ValueError(f"rel_mse: shapes differ, {image.shape} vs {reference.shape}")
    return float(np.mean((image - reference) ** 2 / (reference ** 2 + floor)))
