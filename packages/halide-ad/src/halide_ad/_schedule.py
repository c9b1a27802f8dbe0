"""Schedules: the loop structure of one definition (a Stage) and where a Func is computed.

A stage's loops are a list of dimensions, innermost first (Halide's order): the pure Vars of
the definition in argument order, and for an update the RVars innermost first, then the pure
Vars. ``split`` replaces a dimension by an inner and an outer one, ``fuse`` merges two
adjacent ones, ``reorder`` permutes, and each dimension has a loop kind.

Tail strategy: a split of extent ``e`` by ``f`` runs the outer loop ``ceil(e / f)`` times and the
inner loop ``min(f, e - outer * f)`` times (Halide's GuardWithIf, without a per-point branch);
a vectorized loop runs one vector iteration when its extent equals the vector width and a
scalar loop otherwise (the last, partial tile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "LOOP_KINDS",
    "Dim",
    "LoopLevel",
    "ScheduleError",
    "Split",
    "StageSchedule",
    "dim_name",
]


class ScheduleError(ValueError):
    """A scheduling directive names a dimension the stage does not have, or is illegal."""


LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "gpu_block", "gpu_thread")


@dataclass
class Dim:
    name: str
    kind: str = "serial"
    pure: bool = True  # False for RVars and dimensions split from them
    factor: int | None = None  # vector width / unroll count / gpu block size, where fixed
    race_free: bool = False  # a reduction dimension whose iterations write distinct points


@dataclass
class Split:
    kind: str  # "split" or "fuse"
    old: str  # split: the dimension split; fuse: the fused name
    outer: str
    inner: str
    factor: int | None = None


@dataclass
class StageSchedule:
    dims: list = field(default_factory=list)  # innermost first
    splits: list = field(default_factory=list)
    # compute_with: (parent Func, parent definition index (0: pure), parent loop name)
    compute_with: tuple | None = None
    gpu_single_thread: bool = False  # the whole definition as one GPU thread
    atomic: bool = False  # reduction loops may run concurrently, adding with atomics

    def names(self):
        return [d.name for d in self.dims]

    def find(self, name: str, func_name: str, stage: str) -> int:
        for k, d in enumerate(self.dims):
            if d.name == name:
                return k
        raise ScheduleError(
            f"{func_name}{stage} has no dimension {name!r} (its loop dimensions, innermost"
            f" first: {', '.join(self.names()) or 'none'})"
        )


def dim_name(v) -> str:
    """The dimension name of a Var, an RVar or a string."""
    if isinstance(v, str):
        return v
    name = getattr(v, "name", None)
    if callable(name):
        return name()
    raise ScheduleError(f"expected a Var, an RVar or a dimension name, got {type(v).__name__}")


@dataclass(frozen=True)
class LoopLevel:
    """Where a Func is computed or stored: ``"inline"``, ``"root"``, or the loop over ``var``
    of ``func`` (its first definition that calls the producer)."""

    kind: str  # "inline" | "root" | "at"
    func: object = None
    var: str | None = None

    def __str__(self):
        if self.kind != "at":
            return self.kind
        return f"{self.func.name()}.{self.var}"
