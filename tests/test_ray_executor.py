"""Seeded results are identical whichever executor ran them: the same experiments through
the in-process executor and a local Ray instance of 2 workers (pieces as nested tasks)."""

from __future__ import annotations

import json

import pytest

from apps.cli import main

# experiments whose pieces go through ctx.map and whose numbers hold no timings
SEEDED = ["h2mc_ring", "h2mc_sigma", "core_ad_checkpoint", "opt_nist"]


def _numbers(out):
    exps = json.loads((out / "results.json").read_text())["experiments"]
    return {name: (e["passed"], e["numbers"]) for name, e in exps.items()}


@pytest.mark.slow
def test_ray_and_local_executors_give_identical_seeded_results(tmp_path):
    pytest.importorskip("ray")
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    args = ["--tier", "tiny", "--no-progress", "--only", *SEEDED]
    assert main([*args, "--out", str(local)]) == 0
    assert main([*args, "--out", str(on_ray), "--executor", "ray", "--num-cpus", "2"]) == 0
    ours, theirs = _numbers(local), _numbers(on_ray)
    assert sorted(ours) == sorted(SEEDED) and all(nums for _, nums in ours.values())
    assert ours == theirs
