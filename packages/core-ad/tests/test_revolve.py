"""Tests for core_ad._revolve: binomial checkpointing counts and schedules.

docs/design/core-ad.md §2.6 and CA-CKP-2 / CA-CKP-3.  Expected values are hard-coded
from the spec; the closed form t(l, s) is checked against the plain dynamic
programme (which uses neither the closed form nor convexity), and every
generated schedule is run through the reference interpreter ``simulate``.
"""

from __future__ import annotations

import dataclasses

import pytest

from core_ad._revolve import (
    ACTION_KINDS,
    ADVANCE,
    FREE,
    RESTORE,
    REVERSE,
    TAKESHOT,
    Action,
    Schedule,
    _best_split,
    _forward_steps_dp,
    binomial_capacity,
    every_k_schedule,
    optimal_forward_steps,
    recompute_all_schedule,
    repetition_number,
    revolve_schedule,
    simulate,
    store_all_schedule,
)

# (l, s, t(l, s), r) from CA-CKP-2.
SPEC_CASES = [
    (10, 1, 45, 9),
    (10, 2, 20, 3),
    (10, 3, 15, 2),
    (6, 2, 8, 2),
    (16, 4, 27, 3),
    (20, 3, 45, 3),
    (100, 5, 316, 4),
    (100, 10, 222, 3),
    (1000, 10, 3636, 4),
]


def _check_schedule(sched: Schedule, n: int, max_slots: int) -> None:
    """Common validity checks for a schedule reversing n steps with <= max_slots slots."""
    order = simulate(sched)
    assert order == list(range(n - 1, -1, -1))
    assert sched.n_steps == n
    assert sched.reverse_steps == n
    assert sched.forward_steps == sum(1 for a in sched.actions if a.kind == ADVANCE)
    assert 1 <= sched.max_live_snapshots <= max_slots
    assert sched.max_live_snapshots <= sched.n_snapshots
    # The prefix before the first reverse is a plain forward sweep.
    first_rev = next(i for i, a in enumerate(sched.actions) if a.kind == REVERSE)
    assert all(a.kind in (ADVANCE, TAKESHOT) for a in sched.actions[:first_rev])


# ---------------------------------------------------------------------------
# counting formulas
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("l, s, t, r", SPEC_CASES)
def test_closed_form_spec_values(l, s, t, r):
    assert optimal_forward_steps(l, s) == t
    assert repetition_number(l, s) == r


@pytest.mark.parametrize("l, s, t, r", SPEC_CASES)
def test_dp_spec_values(l, s, t, r):
    # Includes t(1000, 10) = 3636 by the DP, as the spec's verification does.
    assert _forward_steps_dp(l, s) == t


def test_beta_rows():
    assert [binomial_capacity(2, r) for r in range(6)] == [1, 3, 6, 10, 15, 21]
    assert [binomial_capacity(3, r) for r in range(6)] == [1, 4, 10, 20, 35, 56]


def test_beta_pascal_recurrence():
    # Independent construction: beta(s, 0) = beta(0, r) = 1 and
    # beta(s, r) = beta(s-1, r) + beta(s, r-1).
    table = {}
    for s in range(0, 9):
        for r in range(0, 9):
            table[s, r] = 1 if s == 0 or r == 0 else table[s - 1, r] + table[s, r - 1]
            assert binomial_capacity(s, r) == table[s, r], (s, r)


def test_repetition_number_brackets_capacity():
    for s in range(1, 7):
        for r in range(0, 7):
            cap = binomial_capacity(s, r)
            assert repetition_number(cap, s) == r, (s, r)
            assert repetition_number(cap + 1, s) == r + 1, (s, r)
    assert repetition_number(1, 5) == 0
    assert repetition_number(7, 1) == 6


def test_closed_form_equals_dp():
    mismatches = [
        (l, s, optimal_forward_steps(l, s), _forward_steps_dp(l, s))
        for s in range(1, 7)
        for l in range(1, 121)
        if optimal_forward_steps(l, s) != _forward_steps_dp(l, s)
    ]
    assert mismatches == []


def test_special_cases():
    for l in range(1, 60):
        assert optimal_forward_steps(l, 1) == l * (l - 1) // 2
        for s in (l, l + 1, l + 7):
            assert optimal_forward_steps(l, s) == l - 1
    for s in range(1, 12):
        assert optimal_forward_steps(1, s) == 0
    assert optimal_forward_steps(2, 1) == 1


def test_t_is_convex_and_nonincreasing_in_s():
    for s in range(1, 7):
        inc = [optimal_forward_steps(l, s) - optimal_forward_steps(l - 1, s) for l in range(2, 150)]
        assert inc == sorted(inc), s
        for l in range(1, 150):
            assert optimal_forward_steps(l, s + 1) <= optimal_forward_steps(l, s)


def test_best_split_is_a_dp_minimiser():
    # The binary search must land on an argmin of the DP objective.
    for s in range(2, 6):
        for l in range(2, 70):
            costs = {j: j + _forward_steps_dp(l - j, s - 1) + _forward_steps_dp(j, s) for j in range(1, l)}
            j = _best_split(l, s)
            assert costs[j] == min(costs.values()), (l, s, j)
            assert j == min(jj for jj, c in costs.items() if c == costs[j]), (l, s, j)


# ---------------------------------------------------------------------------
# revolve schedules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("l, s, t, r", SPEC_CASES)
def test_revolve_schedule_spec_cases(l, s, t, r):
    sched = revolve_schedule(l, s)
    _check_schedule(sched, l, s)
    assert sched.forward_steps == t
    assert sched.n_snapshots == s
    assert sched.actions[0] == Action(TAKESHOT, 0, 0)


def test_revolve_schedule_many_pairs():
    pairs = [(l, s) for l in range(1, 41) for s in range(1, 9)]
    pairs += [(l, s) for l in (1, 2, 3, 5) for s in (1, 2, 10, 50)]  # tiny l, s >= l
    pairs += [(l, 1) for l in (50, 77)] + [(l, 2) for l in (55, 120)]
    pairs += [(137, 4), (200, 6), (250, 3), (64, 64), (64, 100)]
    for l, s in pairs:
        sched = revolve_schedule(l, s)
        _check_schedule(sched, l, s)
        assert sched.forward_steps == _forward_steps_dp(l, s), (l, s)
        if s >= l:
            assert sched.forward_steps == l - 1
            assert sched.max_live_snapshots == l


def test_revolve_schedule_uses_its_slots():
    # With fewer slots than steps the optimal schedule needs all of them
    # (otherwise t(l, s) would equal t(l, s-1), which is false when s < l).
    for l, s in [(10, 3), (16, 4), (100, 5), (40, 7)]:
        assert revolve_schedule(l, s).max_live_snapshots == s


def test_revolve_schedule_small_explicit():
    # l = 3, s = 2: j = 1, advance to 1, snapshot, then the s = 1 pattern on [1, 3).
    got = [(a.kind, a.step, a.slot) for a in revolve_schedule(3, 2)]
    assert got == [
        (TAKESHOT, 0, 0),
        (ADVANCE, 0, None),
        (TAKESHOT, 1, 1),
        (ADVANCE, 1, None),
        (REVERSE, 2, None),
        (RESTORE, 1, 1),
        (REVERSE, 1, None),
        (FREE, 1, 1),
        (RESTORE, 0, 0),
        (REVERSE, 0, None),
        (FREE, 0, 0),
    ]


def test_revolve_schedule_large():
    sched = revolve_schedule(10000, 20)
    _check_schedule(sched, 10000, 20)
    assert sched.forward_steps == optimal_forward_steps(10000, 20)
    # Sanity: between the store-all and recompute-all extremes, and < 4 n.
    assert 10000 - 1 < sched.forward_steps < 4 * 10000


# ---------------------------------------------------------------------------
# simple policies
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 25])
def test_store_all(n):
    sched = store_all_schedule(n)
    _check_schedule(sched, n, n)
    assert sched.forward_steps == n - 1
    assert sched.max_live_snapshots == n


@pytest.mark.parametrize("n", [1, 2, 3, 7, 25])
def test_recompute_all(n):
    sched = recompute_all_schedule(n)
    _check_schedule(sched, n, 1)
    assert sched.n_snapshots == 1
    assert sched.forward_steps == n * (n - 1) // 2
    assert sched.forward_steps == revolve_schedule(n, 1).forward_steps


def test_every_k_hand_counted():
    # n = 10, k = 3: sweep 0 -> 9 (9 advances), segment [9,10) needs 0,
    # segments [6,9), [3,6), [0,3) need 2 each: 15.  Peak: slots 0,3,6 plus
    # x_7, x_8 while reversing [6, 9) -> 5.
    sched = every_k_schedule(10, 3)
    _check_schedule(sched, 10, 6)
    assert sched.forward_steps == 15
    assert sched.max_live_snapshots == 5


def test_every_k_formula_and_optimality_bound():
    for n in range(1, 31):
        for k in range(1, 12):
            sched = every_k_schedule(n, k)
            m = -(-n // k)
            _check_schedule(sched, n, m + min(k, n) - 1)
            assert sched.forward_steps == k * (m - 1) + (n - m), (n, k)
            # No valid schedule may beat the optimum for its peak memory.
            assert sched.forward_steps >= _forward_steps_dp(n, sched.max_live_snapshots), (n, k)
    assert every_k_schedule(12, 1).forward_steps == 11
    assert every_k_schedule(12, 50).forward_steps == 11


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: revolve_schedule(0, 3), "n_steps"),
        (lambda: revolve_schedule(5, 0), "n_snapshots"),
        (lambda: revolve_schedule(5.0, 3), "n_steps"),
        (lambda: revolve_schedule(5, "3"), "n_snapshots"),
        (lambda: revolve_schedule(True, 3), "n_steps"),
        (lambda: optimal_forward_steps(0, 2), "n_steps"),
        (lambda: optimal_forward_steps(4, 0), "n_snapshots"),
        (lambda: optimal_forward_steps(4, 2.5), "n_snapshots"),
        (lambda: repetition_number(-1, 2), "n_steps"),
        (lambda: repetition_number(3, 0), "n_snapshots"),
        (lambda: _forward_steps_dp(0, 1), "n_steps"),
        (lambda: binomial_capacity(-1, 2), "s"),
        (lambda: binomial_capacity(2, -1), "r"),
        (lambda: store_all_schedule(0), "n_steps"),
        (lambda: recompute_all_schedule(1.5), "n_steps"),
        (lambda: every_k_schedule(0, 2), "n_steps"),
        (lambda: every_k_schedule(5, 0), "k"),
        (lambda: every_k_schedule(5, 2.0), "k"),
    ],
)
def test_bad_arguments(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be an int"):
        call()


def test_action_validation():
    with pytest.raises(ValueError, match="kind"):
        Action("jump", 0, None)
    with pytest.raises(ValueError, match="slot"):
        Action(TAKESHOT, 0, None)
    with pytest.raises(ValueError, match="slot"):
        Action(ADVANCE, 0, 1)
    assert set(ACTION_KINDS) == {ADVANCE, TAKESHOT, RESTORE, REVERSE, FREE}
    with pytest.raises(dataclasses.FrozenInstanceError):
        Action(ADVANCE, 0).step = 1  # type: ignore[misc]


def _sched(actions, n, s):
    return Schedule([Action(*a) for a in actions], n, s)


def test_schedule_counts_from_actions():
    sched = _sched([(TAKESHOT, 0, 0), (ADVANCE, 0), (TAKESHOT, 1, 1), (FREE, 1, 1),
                    (TAKESHOT, 1, 1), (REVERSE, 1), (RESTORE, 0, 0), (REVERSE, 0),
                    (FREE, 1, 1), (FREE, 0, 0)], 2, 2)
    assert isinstance(sched.actions, tuple)
    assert (sched.forward_steps, sched.reverse_steps, sched.max_live_snapshots) == (1, 2, 2)
    assert simulate(sched) == [1, 0]
    assert len(sched) == 10 and list(sched)[1] == Action(ADVANCE, 0)


T0 = (TAKESHOT, 0, 0)


@pytest.mark.parametrize(
    "actions, n, s, message",
    [
        ([T0, (RESTORE, 1, 1), (REVERSE, 1)], 2, 2, "restore of empty slot 1"),
        ([T0, (REVERSE, 1)], 2, 1, "reverse from wrong state index"),
        ([T0, (REVERSE, 0)], 2, 1, "reverse out of order"),
        ([T0, (ADVANCE, 0), (REVERSE, 1), (REVERSE, 1)], 2, 1, "reverse out of order"),
        ([T0, (REVERSE, 0), (REVERSE, 0), (FREE, 0, 0)], 1, 1, "reverse out of order"),
        ([T0, (ADVANCE, 0), (REVERSE, 1), (FREE, 0, 0)], 2, 1, "only 1 of 2 steps reversed"),
        ([T0, (REVERSE, 0)], 1, 1, "slots still filled"),
        ([T0, (TAKESHOT, 0, 0)], 1, 1, "takeshot into slot 0"),
        ([T0, (TAKESHOT, 0, 1)], 1, 1, "slot outside"),
        ([T0, (ADVANCE, 1)], 3, 1, "advance from state 1 but current is 0"),
        ([T0, (ADVANCE, 0), (ADVANCE, 1)], 1, 1, "advance past the last state"),
        ([T0, (ADVANCE, 0), (RESTORE, 1, 0)], 2, 1, "holds state 0, not 1"),
        ([T0, (FREE, 0, 1)], 1, 2, "free of empty slot 1"),
        ([(ADVANCE, 0), (REVERSE, 1)], 2, 1, "action 0 must be takeshot"),
        ([(TAKESHOT, 0, 1), (REVERSE, 0)], 1, 2, "action 0 must be takeshot"),
    ],
)
def test_simulate_rejects(actions, n, s, message):
    with pytest.raises(AssertionError, match=message):
        simulate(_sched(actions, n, s))


def test_simulate_rejects_unknown_kind():
    bogus = dataclasses.make_dataclass("Bogus", ["kind", "step", "slot"], frozen=True)
    sched = Schedule((Action(TAKESHOT, 0, 0), bogus("jump", 0, None)), 1, 1)
    with pytest.raises(AssertionError, match="unknown action kind"):
        simulate(sched)


def test_simulate_catches_every_dropped_restore():
    # Dropping any single restore from a valid revolve schedule breaks it.
    actions = revolve_schedule(12, 3).actions
    restores = [i for i, a in enumerate(actions) if a.kind == RESTORE]
    assert restores
    for i in restores:
        broken = Schedule(actions[:i] + actions[i + 1:], 12, 3)
        with pytest.raises(AssertionError):
            simulate(broken)
