"""core_ad.benchmark: the harness every package's benchmarks/ scripts use."""

import argparse

import pytest
from core_ad import benchmark as bench


def test_compare_alternates_cases_and_returns_statistics():
    order = []
    cases = {name: (lambda name=name: order.append(name)) for name in "abc"}
    res = bench.compare(cases, repeats=5, warmup=1)
    assert set(res) == set("abc")
    for r in res.values():
        assert len(r["times"]) == 5 and r["min"] <= r["median"] <= r["max"]
    timed = order[3:]  # after one warm-up round
    rounds = [timed[i:i + 3] for i in range(0, 15, 3)]
    assert all(sorted(r) == list("abc") for r in rounds)
    assert len({r[0] for r in rounds}) == 3  # the order rotates: no case always runs first


def test_side_by_side_prints_ours_first_with_ratios(capsys):
    res = {"peer": bench.summarize([0.004, 0.006, 0.005]), "ours": bench.summarize([0.002]),
           "slow peer": None}
    ratios = bench.side_by_side(res, "ours", first_calls={"peer": 1.5},
                                columns={"note": {"peer": "x"}}, title="case")
    assert ratios == pytest.approx({"ours": 1.0, "peer": 2.5})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "case"
    assert [c.strip() for c in lines[1].strip("|").split("|")] == [
        "system", "median", "min .. max", "this / ours", "first call", "note"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[3:]]
    assert [r[0] for r in rows] == ["ours", "peer", "slow peer"]
    assert rows[1] == ["peer", "5.00 ms", "4.00 ms .. 6.00 ms", "2.50", "1.50 s", "x"]
    assert rows[2][1] == "did not finish"


def test_side_by_side_needs_our_result():
    with pytest.raises(ValueError, match="no result for ours"):
        bench.side_by_side({"peer": bench.summarize([1.0])}, "ours")


def test_parse_arguments_refuses_fewer_than_five_repeats():
    p = argparse.ArgumentParser()
    bench.add_common_arguments(p, repeats=7)
    assert bench.parse_arguments(p, []).repeats == 7
    with pytest.raises(SystemExit):
        bench.parse_arguments(p, ["--repeats", "3"])


def test_import_peers_skips_what_is_asked():
    p = argparse.ArgumentParser()
    bench.add_common_arguments(p)
    notes = []
    assert bench.import_peers(bench.parse_arguments(p, ["--no-torch", "--no-jax"]), notes) == (
        None, None)
    assert notes == ["PyTorch skipped (--no-torch)", "JAX skipped (--no-jax)"]


def test_max_rel_diff_and_fmt_time():
    assert bench.max_rel_diff([1.0, 2.0], [1.0, 4.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape mismatch"):
        bench.max_rel_diff([1.0], [1.0, 2.0])
    assert [bench.fmt_time(t) for t in (None, 2e-6, 2e-3, 2.0)] == ["-", "2.0 us", "2.00 ms",
                                                                     "2.00 s"]


def test_time_first_calls_times_each_case_once():
    calls = []
    first = bench.time_first_calls({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})
    assert calls == ["a", "b"] and set(first) == {"a", "b"}
    assert all(t >= 0.0 for t in first.values())


def test_to_numpy_and_report_agreement(capsys):
    import numpy as np
    import torch

    t = torch.ones(3, dtype=torch.float64, requires_grad=True) * 2
    np.testing.assert_array_equal(bench.to_numpy(t), [2.0, 2.0, 2.0])
    assert bench.report_agreement("peer", {"grad": 1e-16}, 1e-12, dtype=np.float64)
    assert not bench.report_agreement("peer", {"grad": 1e-3}, 1e-12)
    assert not bench.report_agreement("peer", {"grad": 0.0}, 1e-12, dtype=np.float32)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["peer", "grad", "rel", "diff", "1.00e-16", "dtype", "float64", "OK"]
    assert out[1].endswith("MISMATCH") and out[2].endswith("MISMATCH")
