"""apps: end-to-end reproductions of the thesis' experiments, one module each
(:mod:`apps.experiments`), and the ``reproduce`` command that runs them and writes a report.

``registry()`` maps experiment names to :class:`Experiment` records; ``run_experiment`` runs
one at a tier ("tiny", "quick", "full") and returns its :class:`Outcome`.
"""

from __future__ import annotations

from ._experiment import TIERS, Check, Experiment, Figure, Outcome, Table

__version__ = "0.1.0"

_MODULES = ("core_ad_hessian", "core_ad_checkpoint", "halide_apps", "halide_timings",
            "opt_examples", "opt_nist", "opt_bench", "edge_rt_fd", "edge_rt_inverse", "h2mc_ring", "h2mc_sigma", "h2mc_economy",
            "h2mc_transport")


def registry() -> dict[str, Experiment]:
    """Every experiment, in the report's order (thesis chapter order)."""
    import importlib

    out: dict[str, Experiment] = {}
    for m in _MODULES:
        mod = importlib.import_module(f"apps.experiments.{m}")
        for exp in getattr(mod, "EXPERIMENTS", None) or [mod.EXPERIMENT]:
            out[exp.name] = exp
    return out


def run_experiment(name: str, tier: str = "quick", progress: bool = False) -> Outcome:
    from ._executor import _run_experiment

    return _run_experiment(name, tier, False, progress)[0]


__all__ = ["TIERS", "Check", "Experiment", "Figure", "Outcome", "Table", "registry",
           "run_experiment"]
