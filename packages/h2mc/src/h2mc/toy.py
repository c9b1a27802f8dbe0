"""The spec's toy targets in [0, 1]^2 (AE-4) and their quadrature references."""

from ._toy import (  # noqa: F401
    TOY_TARGETS,
    cut_ring,
    gaussian_ridge,
    grid_density,
    half_plane,
    reference_histogram,
    reference_moments,
    ring,
    stationary_starts,
)

__all__ = [
    "TOY_TARGETS",
    "cut_ring",
    "gaussian_ridge",
    "grid_density",
    "half_plane",
    "reference_histogram",
    "reference_moments",
    "ring",
    "stationary_starts",
]
