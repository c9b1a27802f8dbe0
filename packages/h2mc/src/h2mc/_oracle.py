"""An "oracle" Gaussian proposal for the ring target (b): the bound of AE-5 on the ring.

H2MC's proposal is a Gaussian over the offset whose mean and covariance come from a quadratic
model of log f at the current state. On the ring the best any such *local* Gaussian can do is
to know the ring exactly: :class:`RingOracleStep` proposes, near the ring,

    z = (-d - s_t^2 / (2 R) + s_r xi_r) n + s_t xi_t t,

with ``n``/``t`` the radial/tangential unit vectors at ``x`` and ``d = r - R`` its distance to the
ring: the radial part jumps back onto the ring and pre-compensates the average outward drift
``t^2 / (2 R)`` of a straight tangential step of std ``s_t`` (so the proposal lands on the ring
on average, to second order along the osculating circle, which no quadratic model of log f can
express). Far from the ring (``|d| > near``, the flat floor) it is an isotropic ``N(0, s_far^2 I)``
step, as H2MC's own isotropic fallback. Both densities are exact and evaluated from each end
(``y = x + z`` and the reverse offset ``-z``, the single-term convention of the package), so the
kernel is an exact MH kernel; it costs one target evaluation per step, like H2MC's.
"""

from __future__ import annotations

import numpy as np

from ._kernels import Kernel, _wrap


class RingOracleStep(Kernel):
    """The ring-aware Gaussian above (see the module docstring); ``needs`` no derivatives."""

    name = "oracle"

    def __init__(self, s_t: float, s_r: float, *, radius=0.3, width=0.005, center=(0.5, 0.5),
                 s_far=0.1, near_widths=4.0):
        self.s_t, self.s_r, self.s_far = float(s_t), float(s_r), float(s_far)
        if not (self.s_t > 0 and self.s_r > 0 and self.s_far > 0):
            raise ValueError(f"RingOracleStep: stds must be > 0, got {s_t}, {s_r}, {s_far}")
        self.radius, self.center = float(radius), np.asarray(center, dtype=np.float64)
        self.near = float(near_widths) * float(width)
        self.shift = self.s_t ** 2 / (2 * self.radius)

    def describe(self):
        return f"s_t={self.s_t:g}, s_r={self.s_r:g}"

    def _frame(self, x):
        c = x - self.center
        r = np.hypot(c[:, 0], c[:, 1])
        n = c / np.where(r > 0, r, 1.0)[:, None]
        t = np.stack([-n[:, 1], n[:, 0]], axis=1)
        return n, t, r - self.radius

    def log_density(self, x, z):
        """``log q_x(z)`` of the offset ``z`` from states ``x`` (both ``(B, 2)``)."""
        n, t, d = self._frame(x)
        zr = np.sum(z * n, axis=1) + d + self.shift
        zt = np.sum(z * t, axis=1)
        near = -0.5 * ((zr / self.s_r) ** 2 + (zt / self.s_t) ** 2) - np.log(self.s_r * self.s_t)
        far = -0.5 * np.sum(z * z, axis=1) / self.s_far ** 2 - 2 * np.log(self.s_far)
        return np.where(np.abs(d) <= self.near, near, far) - np.log(2 * np.pi)

    def propose(self, sampler, state, idx, rng):
        x = state.x[idx]
        n, t, d = self._frame(x)
        xi = rng.standard_normal((len(idx), 2))
        z = ((-d - self.shift + self.s_r * xi[:, 0])[:, None] * n
             + (self.s_t * xi[:, 1])[:, None] * t)
        far = np.abs(d) > self.near
        z[far] = self.s_far * xi[far]
        return z, None, x

    def log_q_ratio(self, state, idx, z, prop, ctx):
        return self.log_density(_wrap(ctx + z), -z) - self.log_density(ctx, z)
