"""The default preconditioner on grid energies: Jacobi-PCG, and a multigrid V-cycle only for the
linear systems where Jacobi is slow.

A multigrid setup costs as much as tens of Jacobi-PCG iterations (J^T J assembly and the
hierarchy, per non-linear iteration), so it pays only on hard systems: the first steps of a
Poisson problem, most steps of an intrinsic-image decomposition; on the easy systems of optical
flow and of a Charbonnier TV denoising it lost 8x and 1.9x to plain Jacobi (measured, see
benchmarks/RESULTS.md). Each solve is a ski rental: Jacobi-PCG runs for as many
iterations as the last multigrid solve cost in time (``FIRST_BUDGET`` before any); only if that
does not reach the tolerance is the hierarchy built and the system solved with it (from zero),
so a solve costs at most about twice the cheaper of the two. After a solve that needed
multigrid the next ``k`` go to multigrid directly, ``k`` doubling while the Jacobi probes keep
failing, so a hard problem wastes a vanishing share on probes.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from .pcg import PCGResult, pcg

__all__ = ["JacobiThenMultigrid", "FIRST_BUDGET"]

#: Jacobi-PCG iterations tried before the first multigrid setup
FIRST_BUDGET = 30
#: the shortest later probe: a few Jacobi steps cost next to nothing and catch easy systems
MIN_BUDGET = 5


class JacobiThenMultigrid:
    """State of the adaptive choice across the linear solves of one non-linear solve."""

    def __init__(self):
        self.budget = FIRST_BUDGET
        self.skip = 0  # solves to send straight to multigrid
        self.backoff = 1
        self.multigrid_solves = 0
        self.solves = 0

    def solve(self, apply_A: Callable, b: np.ndarray, jacobi: np.ndarray, multigrid: Callable[[], Any],
              *, max_iterations: int, **pcg_kw) -> PCGResult:
        """``pcg(apply_A, b)`` preconditioned by ``jacobi`` (an inverse diagonal) or, when that is
        not done within the budget, by ``multigrid()`` (built only then)."""
        self.solves += 1
        probe = None
        if self.skip > 0:
            self.skip -= 1
        else:
            t0 = time.perf_counter()
            probe = pcg(apply_A, b, jacobi, max_iterations=min(self.budget, max_iterations), **pcg_kw)
            if probe.reason != "max iterations" or self.budget >= max_iterations:
                self.backoff = 1
                return probe
            per_iteration = (time.perf_counter() - t0) / max(probe.iterations, 1)
            self.skip, self.backoff = self.backoff, 2 * self.backoff
        t0 = time.perf_counter()
        res = pcg(apply_A, b, multigrid(), max_iterations=max_iterations, **pcg_kw)
        self.multigrid_solves += 1
        if probe is None:
            return res
        # Jacobi iterations that cost what this multigrid solve (setup included) did
        self.budget = max(MIN_BUDGET, int((time.perf_counter() - t0) / per_iteration))
        return dataclasses.replace(res, iterations=res.iterations + probe.iterations,
                                   n_apply=res.n_apply + probe.n_apply)

    def describe(self) -> str:
        return f"jacobi+multigrid (multigrid on {self.multigrid_solves} of {self.solves} systems)"
