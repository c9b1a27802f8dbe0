"""What an experiment declares and what running it returns.

An experiment module defines one :class:`Experiment` (or a few, for a family of examples):
the thesis figure or table it reproduces, its sizes per tier, the numbers the paper reports,
and ``run(size, ctx) -> Outcome``. Outcomes hold only plain data (numbers, strings, PNG
bytes), so they travel between processes (Ray workers) and into ``results.json`` unchanged.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Callable

TIERS = ("tiny", "quick", "full")


@dataclass
class Check:
    """One paper-vs-measured comparison. ``passed`` is None for a number that is reported
    next to the paper's but not gated (hardware-dependent timings)."""

    name: str
    paper: str
    ours: str
    passed: bool | None
    criterion: str = ""

    @property
    def verdict(self) -> str:
        return {True: "reproduced", False: "FAILED", None: "reported"}[self.passed]


@dataclass
class Figure:
    name: str
    caption: str
    png: bytes


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[Any]]


@dataclass
class Outcome:
    checks: list[Check] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, name, paper, ours, passed, criterion=""):
        self.checks.append(Check(name, str(paper), str(ours),
                                 None if passed is None else bool(passed), criterion))

    def figure(self, name, caption, fig):
        """Store a matplotlib figure as PNG bytes (and close it)."""
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(Figure(name, caption, buf.getvalue()))

    def image(self, name, caption, rgb8):
        """Store an (H, W, 3) uint8 image as PNG bytes (Pillow)."""
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(rgb8).save(buf, format="PNG")
        self.figures.append(Figure(name, caption, buf.getvalue()))

    def table(self, title, header, rows):
        self.tables.append(Table(title, list(header), [list(r) for r in rows]))

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)


@dataclass
class Experiment:
    """``reference``: the thesis / paper figure, table or section; ``paper``: what it reports
    (label -> value as printed); ``check``: what counts as reproduced; ``sizes``: keyword
    arguments of ``run`` per tier ("tiny" is for the integration test only)."""

    name: str
    title: str
    reference: str
    paper: dict[str, str]
    check: str
    sizes: dict[str, dict[str, Any]]
    run: Callable[..., Outcome]
    headline: str = ""  # the check shown in the summary table (default: the first)

    def __post_init__(self):
        missing = [t for t in TIERS if t not in self.sizes]
        if missing:
            raise ValueError(f"experiment {self.name!r}: no sizes for tier(s) {missing}")


def subplots(*args, **kw):
    """``plt.subplots`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def fig_axes(title, xlabel, ylabel, figsize=(5.5, 3.6)):
    """A matplotlib figure with one titled, labelled axes."""
    fig, ax = subplots(figsize=figsize)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def pct(x) -> str:
    return f"{100 * float(x):.2f}%"
