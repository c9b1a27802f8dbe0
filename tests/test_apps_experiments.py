"""What every experiment declares, and the parts of the runs that can be checked alone."""

from __future__ import annotations

import math

import pytest

import apps
from apps._experiment import TIERS, Experiment
from apps.experiments.core_ad_checkpoint import PAPER_T, revolve_bound


def test_every_experiment_declares_reference_paper_check_and_tiers():
    exps = apps.registry()
    assert len(exps) >= 15
    for name, e in exps.items():
        assert e.name == name
        assert any(w in e.reference for w in ("Thesis", "Opt", "Halide")), e.reference
        assert "shared/" not in e.reference and ".md" not in e.reference
        assert e.paper and e.check and e.title
        assert set(TIERS) <= set(e.sizes)


def test_missing_tier_is_rejected():
    with pytest.raises(ValueError, match="full"):
        Experiment("x", "t", "Thesis", {"a": "1"}, "c", {"tiny": {}, "quick": {}},
                   run=lambda ctx: None)


def _t_dp(l, s, memo={}):  # noqa: B006 (memo across calls on purpose)
    """Griewank's recurrence t(1,s)=0, t(l,1)=l(l-1)/2, min over the first split."""
    if (l, s) in memo:
        return memo[(l, s)]
    if l == 1:
        v = 0
    elif s == 1:
        v = l * (l - 1) // 2
    else:
        v = min(j + _t_dp(l - j, s - 1) + _t_dp(j, s) for j in range(1, l))
    memo[(l, s)] = v
    return v


def test_revolve_bound_closed_form_matches_dp_and_the_table():
    for (l, s), t in PAPER_T.items():
        assert revolve_bound(l, s) == t
    for l in range(1, 60):
        for s in range(1, 6):
            assert revolve_bound(l, s) == _t_dp(l, s), (l, s)
    assert revolve_bound(10, 10) == 9 and math.comb(5, 2) == 10
