"""Toy targets in [0, 1]^2 of spec AE-4, their quadrature, and stationary starting states.

(a) ``gaussian_ridge``: a rotated (30 deg) anisotropic Gaussian, std-devs 0.002 x 0.1;
(b) ``ring``: ``exp(-(r - 0.3)^2 / (2 * 0.005^2)) + 1e-3``, r the distance to (0.5, 0.5)
    (stands in for the Fig 6-2 caustic slice);
(c) ``cut_ring``: (b) times a half-plane indicator ``x + 0.5 y < 0.75`` (a discontinuity that
    the derivatives do not see: it is a ``support`` of the target).

All are written with :mod:`core_ad.numpy` on columns ``x[:, j]``, so both the traced and the
compiled core_ad derivatives apply.
"""

from __future__ import annotations

import numpy as np

import core_ad.numpy as anp

from ._target import Target


def gaussian_ridge(angle_deg=30.0, stds=(0.002, 0.1), center=(0.5, 0.5), *,
                   derivatives="traced") -> Target:
    """(a): ``log f = -u^2 / (2 s0^2) - v^2 / (2 s1^2)`` in coordinates rotated by ``angle``."""
    c, s = np.cos(np.radians(angle_deg)), np.sin(np.radians(angle_deg))
    s0, s1 = map(float, stds)
    cx, cy = map(float, center)

    def log_f(x):
        dx, dy = x[:, 0] - cx, x[:, 1] - cy
        u = c * dx + s * dy   # short axis (std s0)
        v = -s * dx + c * dy  # long axis (std s1)
        return -0.5 * (u * u) / (s0 * s0) - 0.5 * (v * v) / (s1 * s1)

    log_f.__name__ = "gaussian_ridge"
    return Target(log_f, 2, derivatives=derivatives, name="(a) gaussian ridge")


def ring(radius=0.3, width=0.005, floor=1e-3, center=(0.5, 0.5), *,
         derivatives="traced") -> Target:
    """(b): a thin ring of radius ``radius`` and width ``width`` on a constant ``floor``."""
    cx, cy = map(float, center)
    r0, w, fl = float(radius), float(width), float(floor)

    def log_f(x):
        dx, dy = x[:, 0] - cx, x[:, 1] - cy
        d = anp.sqrt(dx * dx + dy * dy) - r0
        return anp.log(anp.exp(-(d * d) / (2 * w * w)) + fl)

    log_f.__name__ = "ring"
    return Target(log_f, 2, derivatives=derivatives, name="(b) ring")


def half_plane(x):
    """The indicator of (c): ``x + 0.5 y < 0.75``."""
    return x[:, 0] + 0.5 * x[:, 1] < 0.75


def cut_ring(*, derivatives="traced", **kw) -> Target:
    """(c): (b) restricted to the half-plane ``x + 0.5 y < 0.75`` (discontinuous)."""
    t = ring(derivatives=derivatives, **kw)
    return Target(t.log_f_fn, 2, derivatives=derivatives, support=half_plane,
                  name="(c) cut ring")


TOY_TARGETS = {"a": gaussian_ridge, "b": ring, "c": cut_ring}


def grid_density(target: Target, grid: int = 2048) -> np.ndarray:
    """Normalised f at the ``grid x grid`` cell midpoints, indexed ``[i_x, i_y]`` (midpoint rule).

    At 2048 the cell (4.9e-4) resolves the thinnest feature (std 0.002) by 4 cells per std,
    where the midpoint rule of a Gaussian is accurate far below the tolerances used here.
    """
    t = (np.arange(grid) + 0.5) / grid
    X, Y = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], axis=1)
    lf = np.concatenate([target.log_f(pts[i:i + (1 << 20)]) for i in range(0, len(pts), 1 << 20)])
    f = np.exp(lf - lf[np.isfinite(lf)].max())
    f = f.reshape(grid, grid)
    return f / f.sum()


def reference_histogram(target: Target, bins: int = 64, grid: int = 2048) -> np.ndarray:
    """Quadrature of f over ``bins x bins`` cells (normalised), indexed ``[i_x, i_y]``."""
    d = grid_density(target, grid)
    k = grid // bins
    return d.reshape(bins, k, bins, k).sum(axis=(1, 3))


def reference_moments(target: Target, grid: int = 2048) -> dict:
    """``E[x], E[y], E[x^2]`` by quadrature."""
    d = grid_density(target, grid)
    t = (np.arange(grid) + 0.5) / grid
    px, py = d.sum(axis=1), d.sum(axis=0)
    return {"Ex": float(px @ t), "Ey": float(py @ t), "Ex2": float(px @ (t * t))}


def stationary_starts(target: Target, B: int, rng=None, grid: int = 2048) -> np.ndarray:
    """``B`` states approximately from the target: systematic resampling of grid cells by f
    (Veach's start-up, spec 1.5), uniformly jittered inside the cell; ``(B, 2)``."""
    rng = np.random.default_rng(rng)
    d = grid_density(target, grid).ravel()
    cdf = np.cumsum(d)
    u = (rng.random() + np.arange(B)) / B
    cell = np.minimum(np.searchsorted(cdf, u * cdf[-1]), d.size - 1)
    ix, iy = np.divmod(cell, grid)
    x = np.stack([ix, iy], axis=1) + rng.random((B, 2))
    x = x / grid
    x = x[rng.permutation(B)]
    lf = target.log_f(x)
    bad = ~np.isfinite(lf)  # jitter across the cut of (c): move back to the cell centre
    x[bad] = (np.stack([ix, iy], axis=1)[bad] + 0.5) / grid
    return x
