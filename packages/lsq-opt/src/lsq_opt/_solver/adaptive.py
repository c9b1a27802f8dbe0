"""The default preconditioner on grid energies: Jacobi-PCG, and a multigrid V-cycle only for the
linear systems where Jacobi is slow.

A multigrid setup costs as much as tens of Jacobi-PCG iterations (J^T J assembly and the
hierarchy, per non-linear iteration), so it pays only on hard systems: the first steps of a
Poisson problem, most steps of an intrinsic-image decomposition; on the easy systems of optical
flow and of a Charbonnier TV denoising it lost 8x and 1.9x to plain Jacobi (measured, see
benchmarks/RESULTS.md). Each solve is a ski rental: Jacobi-PCG runs for as many
iterations as the last multigrid solve cost in time (``FIRST_BUDGET`` before any); only if that
does not reach the tolerance is the hierarchy built and the system solved with it (from zero),
so a solve costs at most about twice the cheaper of the two.

That time is priced, not measured once: a Jacobi-PCG iteration, a multigrid setup and a
multigrid-PCG iteration each cost the median (the lower one of an even count) of their last
``PRICE_WINDOW`` timings, and a multigrid solve is priced as a setup plus its iteration count
times an iteration. A single wall-clock timing that spans a preemption is 10-1000x the work
on a machine shared with other jobs, and budgets from single timings made the choices flip
from run to run (an intrinsic-image solve: 397-1568 PCG iterations in all over five runs).
The timings are the process's CPU time (``time.process_time``: all its threads, not the time
it waited for a core; a few readings per linear system, so its cost, ~20 us a reading under
load, does not matter here as it did for "auto"'s per-product prices).

After a solve that needed multigrid the next ``k`` go to multigrid directly, ``k`` doubling
while the Jacobi probes keep failing, so a hard problem wastes a vanishing share on probes.

A probe is also skipped when the last Jacobi solve's rate (iterations per decade of residual
reduction) says this system's tolerance needs more iterations than the budget: a Poisson
problem's first system (forcing term 0.1) took 9 Jacobi iterations for one decade, and the
second, at the forcing floor 1e-8, would have spent its 30-iteration probe (a fifth of the
solve) only to fail. A wrong prediction costs one multigrid solve where Jacobi would have
done, which the budget prices at most the same; a predicted failure backs off like a failed
probe, and the probe after it is run whatever the prediction, so the rate stays current. The
same rate extends a probe that failed close to its tolerance (:meth:`JacobiThenMultigrid._extend`):
a solve then costs at most about three times the cheaper method.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from .pcg import PCGResult, pcg

__all__ = ["JacobiThenMultigrid", "FIRST_BUDGET", "PRICE_WINDOW"]

#: Jacobi-PCG iterations tried before the first multigrid setup
FIRST_BUDGET = 30
#: the shortest later probe: a few Jacobi steps cost next to nothing and catch easy systems
MIN_BUDGET = 5
#: timings per price (see the module docstring)
PRICE_WINDOW = 15


class JacobiThenMultigrid:
    """State of the adaptive choice across the linear solves of one non-linear solve."""

    def __init__(self, clock: Callable[[], float] = time.process_time):
        self.clock = clock
        self._seconds = {what: deque(maxlen=PRICE_WINDOW) for what in ("jacobi", "setup", "multigrid")}
        self.budget = FIRST_BUDGET
        self.skip = 0  # solves to send straight to multigrid
        self.backoff = 1
        self.multigrid_solves = 0
        self.solves = 0
        self.predicted = 0  # probes skipped on the rate's prediction
        self.extended = 0  # failed probes finished with Jacobi on the rate's prediction
        self.probe_next = False  # after predicted skips: measure the rate again
        self.rate = None  # Jacobi-PCG iterations per decade of residual reduction, last probe

    def _price(self, what: str) -> float | None:
        """Seconds per ``what`` (a Jacobi-PCG iteration, a multigrid setup, a multigrid-PCG
        iteration): the low median of its last timings; None before any."""
        samples = self._seconds[what]
        return statistics.median_low(samples) if samples else None

    def _reprice_budget(self, multigrid_iterations: int) -> None:
        """The probe budget: Jacobi iterations that cost what a multigrid solve of
        ``multigrid_iterations`` iterations (setup included) does, at the current prices."""
        jacobi, setup, iteration = self._price("jacobi"), self._price("setup"), self._price("multigrid")
        if jacobi and setup is not None and iteration is not None:
            self.budget = max(MIN_BUDGET, int((setup + multigrid_iterations * iteration) / jacobi))

    def _predicted_to_fail(self, tolerance: float) -> bool:
        if self.rate is None or not 0.0 < tolerance < 1.0:
            return False
        return self.rate * math.log10(1.0 / tolerance) > self.budget

    def _measure_rate(self, probe: PCGResult) -> None:
        if probe.iterations and probe.rhs_norm > 0:
            decades = math.log10(probe.rhs_norm / probe.residual_norm) if probe.residual_norm > 0 \
                else math.inf
            self.rate = probe.iterations / decades if decades > 1e-3 else math.inf

    def _extend(self, apply_A: Callable, probe: PCGResult, jacobi, max_iterations: int,
                pcg_kw: dict) -> PCGResult:
        """A failed probe whose rate says the tolerance is at most another budget away goes on
        with Jacobi (restarted from its iterate, on its residual) for up to one more budget; the
        combined result, or the probe as it was. On the shading energy a 30-iteration probe
        that ended at 0.078 against a tolerance 0.032 (11 iterations more at its rate) had
        switched to a multigrid solve that cost 3x the Jacobi one (29 V-cycle iterations: an
        aggregation hierarchy suits its fourth-order stencil poorly)."""
        tolerance = pcg_kw.get("tolerance", 0.0)
        if not (tolerance > 0 and self.rate and probe.residual is not None and probe.residual_norm > 0):
            return probe
        needed = self.rate * math.log10(probe.residual_norm / (tolerance * probe.rhs_norm))
        room = min(self.budget, max_iterations - probe.iterations)
        if not needed <= room:
            return probe
        kw = dict(pcg_kw, tolerance=tolerance * probe.rhs_norm / probe.residual_norm)
        more = pcg(apply_A, probe.residual, jacobi, max_iterations=room, **kw)
        return dataclasses.replace(more, x=probe.x + more.x, iterations=probe.iterations + more.iterations,
                                   n_apply=probe.n_apply + more.n_apply, rhs_norm=probe.rhs_norm)

    def solve(self, apply_A: Callable, b: np.ndarray, jacobi: np.ndarray, multigrid: Callable[[], Any],
              *, max_iterations: int, **pcg_kw) -> PCGResult:
        """``pcg(apply_A, b)`` preconditioned by ``jacobi`` (an inverse diagonal) or, when that is
        not done within the budget, by ``multigrid()`` (built only then)."""
        self.solves += 1
        probe = None
        if self.skip > 0:
            self.skip -= 1
        elif not self.probe_next and self._predicted_to_fail(pcg_kw.get("tolerance", 0.0)):
            # counts like a failed probe, and the probe after the skips is not skipped: the
            # rate is re-measured, so a system that became easy goes back to Jacobi
            self.predicted += 1
            self.skip, self.backoff, self.probe_next = self.backoff - 1, 2 * self.backoff, True
        else:
            self.probe_next = False
            t0 = self.clock()
            probe = pcg(apply_A, b, jacobi, max_iterations=min(self.budget, max_iterations), **pcg_kw)
            if probe.iterations:
                self._seconds["jacobi"].append((self.clock() - t0) / probe.iterations)
            self._measure_rate(probe)
            if probe.reason != "max iterations" or self.budget >= max_iterations:
                self.backoff = 1
                return probe
            probe = self._extend(apply_A, probe, jacobi, max_iterations, pcg_kw)
            if probe.reason != "max iterations":
                self.extended += 1
                self.backoff = 1
                return probe
            self.skip, self.backoff = self.backoff, 2 * self.backoff
        t0 = self.clock()
        preconditioner = multigrid()
        t1 = self.clock()
        res = pcg(apply_A, b, preconditioner, max_iterations=max_iterations, **pcg_kw)
        self._seconds["setup"].append(t1 - t0)
        if res.iterations:
            self._seconds["multigrid"].append((self.clock() - t1) / res.iterations)
        self.multigrid_solves += 1
        self._reprice_budget(res.iterations)
        if probe is None:
            return res
        return dataclasses.replace(res, iterations=res.iterations + probe.iterations,
                                   n_apply=res.n_apply + probe.n_apply)

    def describe(self) -> str:
        return (f"jacobi+multigrid (multigrid on {self.multigrid_solves} of {self.solves} systems, "
                f"{self.predicted} without a Jacobi probe and {self.extended} probes extended by "
                "the predicted rate)")
