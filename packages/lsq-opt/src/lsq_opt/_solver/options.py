"""Solver options (defaults from spec §4.3, the Ceres-derived [R] strategy)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

__all__ = ["SolverOptions"]


@dataclass
class SolverOptions:
    max_iterations: int = 10  # nIterations (spec §4.3 default 10)
    pcg_max_iterations: int = 10  # lIterations (spec §4.3 default 10)
    pcg_tolerance: float = 1e-10  # relative PCG residual ||r||/||b|| stop (0 disables)
    q_tolerance: float | None = 1e-4  # LM inner early exit (spec §4.3); None disables. GN never uses it.
    residual_reset_period: int = 10  # LM PCG explicit residual reset period (spec §4.3); GN never resets.
    function_tolerance: float = 1e-6  # LM: stop on accept if dc <= ftol*cost; GN: |dc| <= ftol*cost
    gradient_tolerance: float = 0.0  # stop if max|J^T F| <= gtol (0: only an exactly zero gradient)
    parameter_tolerance: float = 0.0  # stop if ||delta|| <= ptol*(||x|| + ptol) (Ceres form)
    initial_trust_region_radius: float = 1e4  # mu_0 (lambda = 1/mu)
    min_trust_region_radius: float = 1e-32
    max_trust_region_radius: float = 1e16
    radius_decrease_factor: float = 2.0  # initial nu
    min_lm_diagonal: float = 1e-6
    max_lm_diagonal: float = 1e32
    min_relative_decrease: float = 1e-3
    jacobi_scaling: bool = True  # Ceres ONCE_PER_SOLVE scaling s_i = (1+sqrt(diag_i))^2 in the D clamp
    preconditioner: str = "jacobi"  # "jacobi" | "none" | "ceres" | "modified_ceres" | "epsilon" | "multigrid"
    verbose: bool = False  # print one flushed line per iteration
    progress: Callable[[str], Any] | None = None  # receives each formatted progress line
    callback: Callable[..., Any] | None = None  # callback(entry, x) -> True to stop ("user callback")

    @classmethod
    def from_kwargs(cls, **kw: Any) -> "SolverOptions":
        names = {f.name for f in fields(cls)}
        # convenient aliases
        aliases = {"mu": "initial_trust_region_radius", "trust_region_radius": "initial_trust_region_radius",
                   "min_diagonal": "min_lm_diagonal", "max_diagonal": "max_lm_diagonal"}
        out = {}
        for k, v in kw.items():
            k = aliases.get(k, k)
            if k not in names:
                raise TypeError(f"unknown solver option {k!r}")
            out[k] = v
        return cls(**out)
