"""Per-iteration log entries and the solve result (with a human-readable report)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["IterationLog", "SolveResult", "CONVERGED_REASONS"]

CONVERGED_REASONS = ("function tolerance", "gradient tolerance", "parameter tolerance")


@dataclass
class IterationLog:
    """One non-linear iteration (for LM: one trial step, accepted or rejected)."""

    iteration: int  # 1-based
    cost: float  # cost at the current iterate *after* this iteration (unchanged on reject)
    trial_cost: float  # cost(x + delta) (may be inf/nan for a rejected step)
    cost_change: float  # actual decrease cost(x) - cost(x + delta)
    model_cost_change: float  # predicted decrease cost(x) - m(delta), m = 1/2||F + J delta||^2
    rho: float  # cost_change / model_cost_change (nan if undefined)
    accepted: bool
    mu: float  # LM: trust-region radius used for this step (nan for GN)
    lam: float  # LM: lambda = 1/mu used for this step (0 for GN)
    step_norm: float  # ||delta||_2
    gradient_max_norm: float  # max |J^T F| at the iterate the step started from
    pcg_iterations: int
    pcg_reason: str
    wall_time: float  # seconds spent in this iteration

    def line(self) -> str:
        return (
            f"{self.iteration:5d} {self.cost:14.6e} {self.cost_change:11.3e} "
            f"{self.model_cost_change:11.3e} {self.rho:10.3e} {'yes' if self.accepted else 'no ':>3s} "
            f"{self.mu:10.3e} {self.step_norm:10.3e} {self.gradient_max_norm:10.3e} "
            f"{self.pcg_iterations:5d} {self.wall_time:9.2e}"
        )

    @staticmethod
    def header() -> str:
        return (
            f"{'iter':>5s} {'cost':>14s} {'cost_chg':>11s} {'model_chg':>11s} {'rho':>10s} "
            f"{'acc':>3s} {'mu':>10s} {'|step|':>10s} {'|grad|max':>10s} {'pcg':>5s} {'time[s]':>9s}"
        )


@dataclass
class SolveResult:
    """Result of :func:`lsq_opt._solver.solve` (cost = 1/2 sum F^2)."""

    x: np.ndarray
    cost: float  # final cost (of the returned x)
    initial_cost: float
    iterations: int  # number of non-linear iterations (LM: including rejected trial steps)
    termination_reason: str
    method: str  # "lm" | "gn"
    log: list[IterationLog] = field(default_factory=list)
    wall_time: float = 0.0
    dtype: str = "float64"
    termination_detail: str = ""  # a sentence: why the solve stopped, with the numbers
    preconditioner: str = ""  # the preconditioner used ("auto" resolved)
    linear_system: str = ""  # how PCG got J^T J p ("auto": what it chose, by which prices)

    @property
    def converged(self) -> bool:
        """True when stopped by a function/gradient/parameter tolerance test."""
        return self.termination_reason in CONVERGED_REASONS

    @property
    def pcg_iterations(self) -> int:
        return sum(e.pcg_iterations for e in self.log)

    @property
    def accepted_costs(self) -> list[float]:
        return [self.initial_cost] + [e.cost for e in self.log if e.accepted]

    def report(self) -> str:
        lines = [
            f"lsq_opt {self.method.upper()} solve ({self.dtype}), cost = 1/2 sum F^2",
            IterationLog.header(),
        ]
        lines += [e.line() for e in self.log]
        lines += [
            f"initial cost      : {self.initial_cost:.10e}",
            f"final cost        : {self.cost:.10e}",
            f"iterations        : {self.iterations} ({sum(e.accepted for e in self.log)} accepted), "
            f"PCG iterations {self.pcg_iterations}",
            f"preconditioner    : {self.preconditioner}",
            f"linear system     : {self.linear_system}",
            f"termination       : {self.termination_reason}"
            + (f" ({self.termination_detail})" if self.termination_detail else ""),
            f"wall time         : {self.wall_time:.3f} s",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()
