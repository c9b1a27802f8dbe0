"""Checkpointing schedules for reversing a chain of steps (docs/design/core-ad.md §2.6).

A *chain* is ``x_0 -> x_1 -> ... -> x_n`` with ``x_{i+1} = F_i(x_i)``.  Reverse
mode needs the adjoints of the steps in the order ``n-1, n-2, ..., 0`` while the
states are produced in the order ``0, 1, ..., n``.  A *schedule* says which
states to store, which to recompute, and when to reverse each step, under a
bound on the number of stored states.

Counting convention (Griewank 1992; Griewank & Walther 2000; Li 2019, §2.3.1):

- ``s`` (``n_snapshots``) is the number of checkpoint slots *including* the
  one that holds the initial state ``x_0``;
- ``r`` is the repetition number, the largest number of times a single step is
  advanced (re-evaluated without taping);
- ``beta(s, r) = C(s + r, s)`` is the longest chain reversible with ``s``
  slots and ``r`` repetitions;
- ``t(l, s) = r*l - beta(s + 1, r - 1)`` with ``beta(s, r-1) < l <= beta(s, r)``
  is the minimal number of "advance" actions needed to reverse ``l`` steps;
  it excludes the ``l`` taped evaluations done by the "reverse" actions.

Action vocabulary (:class:`Action`, ``kind``/``step``/``slot``).  An
interpreter keeps a *current state* (initially ``x_0``), a set of snapshot
slots, and the adjoint of the last reversed state (initially the seed adjoint
of ``x_n``):

``"advance"``  (step=i, slot=None)
    current state must be ``x_i``; replace it by ``x_{i+1} = F_i(x_i)``,
    *without* taping.  Counted by :attr:`Schedule.forward_steps`.
``"takeshot"`` (step=i, slot=k)
    current state must be ``x_i``; store a copy of it in slot ``k``, which must
    be empty.
``"restore"``  (step=i, slot=k)
    slot ``k`` must hold ``x_i``; make it the current state (the slot keeps it).
``"reverse"``  (step=i, slot=None)
    current state must be ``x_i`` and the adjoint of ``x_{i+1}`` must be known
    (reverses run ``n-1, n-2, ..., 0``); evaluate ``F_i`` *with* taping from
    ``x_i``, back-propagate the adjoint of ``x_{i+1}`` to get the adjoint of
    ``x_i``, and drop the tape.  The current state stays ``x_i``.
``"free"``     (step=i, slot=k)
    slot ``k`` must hold ``x_i``; release it.

Every schedule built here starts with ``takeshot(0, slot 0)``, ends with
``free`` of slot 0, frees every slot it fills, and only uses slots
``0 .. n_snapshots-1``.  The prefix before the first "reverse" is a plain
forward sweep (only "advance" and "takeshot", monotone in the step index), so
an engine can run it during its forward pass.  :func:`simulate` is the
reference interpreter; it checks all of the above on integer states.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property

__all__ = [
    "ADVANCE",
    "TAKESHOT",
    "RESTORE",
    "REVERSE",
    "FREE",
    "ACTION_KINDS",
    "Action",
    "Schedule",
    "binomial_capacity",
    "repetition_number",
    "optimal_forward_steps",
    "revolve_schedule",
    "store_all_schedule",
    "recompute_all_schedule",
    "every_k_schedule",
    "simulate",
]

ADVANCE = "advance"
TAKESHOT = "takeshot"
RESTORE = "restore"
REVERSE = "reverse"
FREE = "free"
#: All valid values of :attr:`Action.kind`.
ACTION_KINDS = (ADVANCE, TAKESHOT, RESTORE, REVERSE, FREE)
_SLOTLESS = (ADVANCE, REVERSE)


# ---------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int (not bool) >= ``minimum``, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{name} must be an int >= {minimum}, got {value!r} of type {type(value).__name__}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


# ---------------------------------------------------------------------------
# counting: beta, r, t
# ---------------------------------------------------------------------------


def _beta(s: int, r: int) -> int:
    """beta(s, r) = C(s+r, s), extended with beta(s, -1) = 0 (for s >= 1)."""
    if r < 0:
        return 0
    return math.comb(s + r, s)


# _BETA_ROWS[s] = [beta(s, 0), beta(s, 1), ...], grown on demand (strictly
# increasing for s >= 1, so bisect gives the repetition number).
_BETA_ROWS: dict[int, list[int]] = {}


def _repetition_number(l: int, s: int) -> int:
    """Unchecked :func:`repetition_number`: least r >= 0 with beta(s, r) >= l."""
    if s == 1:
        return l - 1  # beta(1, r) = r + 1
    row = _BETA_ROWS.get(s)
    if row is None:
        row = _BETA_ROWS[s] = [1]
    while row[-1] < l:
        r = len(row)
        row.append(row[-1] * (s + r) // r)  # C(s+r, r) = C(s+r-1, r-1) * (s+r) / r
    return bisect_left(row, l)


def _t(l: int, s: int) -> int:
    """Unchecked closed form t(l, s) = r*l - beta(s+1, r-1)."""
    r = _repetition_number(l, s)
    return r * l - _beta(s + 1, r - 1)


def binomial_capacity(s: int, r: int) -> int:
    """beta(s, r) = C(s + r, s): longest chain reversible with ``s`` slots and ``r`` repetitions.

    ``s`` counts the slot holding the initial state.  ``s >= 0`` and ``r >= 0``
    are required (ints); for example ``beta(2, r) = 1, 3, 6, 10, 15, 21`` for
    ``r = 0..5``.
    """
    _check_int("s", s, 0)
    _check_int("r", r, 0)
    return _beta(s, r)


def repetition_number(n_steps: int, n_snapshots: int) -> int:
    """The repetition number r of reversing ``n_steps`` steps with ``n_snapshots`` slots.

    r is the unique value with ``beta(s, r-1) < l <= beta(s, r)`` (``l =
    n_steps``, ``s = n_snapshots``, ``beta(s, -1) = 0``), i.e. the least
    ``r >= 0`` with ``beta(s, r) >= l``.  ``r = 0`` iff ``l = 1``; ``r = l - 1``
    for ``s = 1``; ``r = 1`` whenever ``2 <= l <= s + 1``.
    """
    _check_int("n_steps", n_steps, 1)
    _check_int("n_snapshots", n_snapshots, 1)
    return _repetition_number(n_steps, n_snapshots)


def optimal_forward_steps(n_steps: int, n_snapshots: int) -> int:
    """Minimal number of "advance" actions t(l, s) to reverse ``l = n_steps`` steps.

    Closed form ``t(l, s) = r*l - beta(s+1, r-1)`` with ``r`` the
    :func:`repetition_number`.  Excludes the ``l`` taped evaluations of the
    reverse sweep.  Special cases: ``t(1, s) = 0``, ``t(l, 1) = l(l-1)/2``,
    ``t(l, s) = l - 1`` for ``s >= l``.  O(log r) after the first call for a
    given ``s`` (the beta row is cached).
    """
    _check_int("n_steps", n_steps, 1)
    _check_int("n_snapshots", n_snapshots, 1)
    return _t(n_steps, n_snapshots)


# Plain DP table: _DP_ROWS[s][l] = t(l, s) by the recurrence (index 0 unused).
_DP_ROWS: dict[int, list[int]] = {}


def _dp_row(s: int, l_max: int) -> list[int]:
    row = _DP_ROWS.get(s)
    if row is None:
        # row[0] is a placeholder, row[1] = t(1, s) = 0; aux[j] = j + t(j, s).
        row = _DP_ROWS[s] = [0, 0]
        _DP_AUX[s] = [0, 1]
    if len(row) > l_max:
        return row
    if s == 1:
        row.extend(l * (l - 1) // 2 for l in range(len(row), l_max + 1))
        return row
    prev = _dp_row(s - 1, l_max)
    aux = _DP_AUX[s]
    for l in range(len(row), l_max + 1):
        # min over 1 <= j < l of (j + t(j, s)) + t(l - j, s - 1); prev[l-1:0:-1]
        # lists t(l-j, s-1) for j = 1, 2, ..., l-1.
        best = min(map(operator.add, aux[1:l], prev[l - 1 : 0 : -1]))
        row.append(best)
        aux.append(l + best)
    return row


_DP_AUX: dict[int, list[int]] = {}


def _forward_steps_dp(n_steps: int, n_snapshots: int) -> int:
    """t(l, s) by the plain dynamic programme (for tests; O(s * l^2) the first time).

    ``t(1, s) = 0``, ``t(l, 1) = l(l-1)/2``,
    ``t(l, s) = min_{1 <= j < l} [ j + t(l-j, s-1) + t(j, s) ]``.
    The table is memoised across calls (rows grow on demand).  It does not use
    the closed form or any convexity argument, so it is an independent check.
    """
    _check_int("n_steps", n_steps, 1)
    _check_int("n_snapshots", n_snapshots, 1)
    return _dp_row(n_snapshots, n_steps)[n_steps]


# ---------------------------------------------------------------------------
# schedule types
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    """One schedule action; see the module docstring for the exact semantics.

    ``kind`` is one of :data:`ACTION_KINDS`; ``step`` is the index of the state
    the action works on (``advance``: from ``step`` to ``step+1``); ``slot`` is
    the snapshot slot for ``takeshot``/``restore``/``free`` and ``None`` for
    ``advance``/``reverse``.
    """

    kind: str
    step: int
    slot: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"kind must be one of {ACTION_KINDS}, got {self.kind!r}")
        if (self.slot is None) != (self.kind in _SLOTLESS):
            raise ValueError(
                f"slot must be None for {_SLOTLESS} and an int otherwise; "
                f"got kind={self.kind!r}, slot={self.slot!r}"
            )


@dataclass(frozen=True)
class Schedule:
    """An action sequence reversing ``n_steps`` steps with at most ``n_snapshots`` slots.

    ``policy`` names the generator ("revolve", "store_all", ...), for
    diagnostics only.  The counting properties are computed from ``actions``.
    """

    actions: tuple[Action, ...]
    n_steps: int
    n_snapshots: int
    policy: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.actions, tuple):
            object.__setattr__(self, "actions", tuple(self.actions))

    def __iter__(self):
        return iter(self.actions)

    def __len__(self) -> int:
        return len(self.actions)

    @cached_property
    def forward_steps(self) -> int:
        """Number of "advance" actions (untaped step evaluations)."""
        return sum(1 for a in self.actions if a.kind == ADVANCE)

    @cached_property
    def reverse_steps(self) -> int:
        """Number of "reverse" actions (taped evaluation + back-propagation)."""
        return sum(1 for a in self.actions if a.kind == REVERSE)

    @cached_property
    def max_live_snapshots(self) -> int:
        """Peak number of simultaneously filled slots (the initial-state slot included)."""
        live = peak = 0
        for a in self.actions:
            if a.kind == TAKESHOT:
                live += 1
                peak = max(peak, live)
            elif a.kind == FREE:
                live -= 1
        return peak


# ---------------------------------------------------------------------------
# revolve
# ---------------------------------------------------------------------------


def _best_split(l: int, s: int) -> int:
    """Smallest j in [1, l-1] minimising f(j) = j + t(l-j, s-1) + t(j, s); needs l >= 2, s >= 2.

    Why a binary search is exact: the closed form gives
    ``t(m, s) - t(m-1, s) = r_s(m)`` (the repetition number of ``m``; at a
    range boundary ``m - 1 = beta(s, r-1)`` the beta terms cancel by Pascal's
    rule), which is non-decreasing in ``m``, so ``t(., s)`` is convex.  Hence
    ``f(j+1) - f(j) = 1 - r_{s-1}(l-j) + r_s(j+1)`` (for ``1 <= j <= l-2``) is
    non-decreasing in ``j``: ``f`` is convex, and its smallest minimiser is the
    first ``j`` with ``f(j+1) - f(j) >= 0`` (or ``l-1`` if there is none).
    Each probe costs two repetition numbers (a bisect on a cached beta row), so
    a split costs O(log l * log r) instead of the O(l) of a plain scan.
    """
    lo, hi = 1, l - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if 1 - _repetition_number(l - mid, s - 1) + _repetition_number(mid + 1, s) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def revolve_schedule(n_steps: int, n_snapshots: int) -> Schedule:
    """Optimal binomial-checkpointing ("revolve") schedule.

    Reverses ``l = n_steps`` steps with at most ``s = n_snapshots`` filled slots
    (slot 0 holds ``x_0``) using exactly ``t(l, s)`` "advance" actions
    (:func:`optimal_forward_steps`), which is minimal.

    Construction (the DP recurrence made explicit): to reverse ``[lo, hi)``
    with the current state ``x_lo`` stored in slot ``b`` and slots
    ``b+1 .. b+s-1`` free:

    - ``hi - lo == 1``: reverse ``lo``;
    - ``s == 1``: for ``i = hi-1 .. lo``: (restore ``b``), advance to ``x_i``,
      reverse ``i``: ``l(l-1)/2`` advances;
    - otherwise pick the optimal split ``j`` (:func:`_best_split`, a binary
      search on the convex cost ``j + t(l-j, s-1) + t(j, s)``), advance ``j``
      steps, takeshot ``x_{lo+j}`` into slot ``b+1``, reverse ``[lo+j, hi)``
      with ``s-1`` slots, free slot ``b+1``, restore slot ``b`` and reverse
      ``[lo, lo+j)`` with ``s`` slots.

    The recursion runs on an explicit stack (no Python recursion limit).  More
    slots than steps are never useful, so ``s`` is clipped to ``l`` internally;
    the returned ``n_snapshots`` is the requested value.  Timing (this
    machine): ``(1000, 10)`` about 10 ms, ``(10000, 20)`` about 0.1 s.
    """
    _check_int("n_steps", n_steps, 1)
    _check_int("n_snapshots", n_snapshots, 1)
    n = n_steps
    actions: list[Action] = [Action(TAKESHOT, 0, 0)]
    emit = actions.append
    # Stack items: ("solve", lo, hi, s, base_slot) or ("restore"/"free", step, slot).
    stack: list[tuple] = [(FREE, 0, 0), ("solve", 0, n, min(n_snapshots, n), 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        tag = item[0]
        if tag != "solve":
            emit(Action(tag, item[1], item[2]))
            continue
        _, lo, hi, s, base = item
        l = hi - lo
        if l == 1:
            emit(Action(REVERSE, lo))
        elif s == 1:
            for i in range(hi - 1, lo - 1, -1):
                if i != hi - 1:
                    emit(Action(RESTORE, lo, base))
                for k in range(lo, i):
                    emit(Action(ADVANCE, k))
                emit(Action(REVERSE, i))
        else:
            j = _best_split(l, s)
            mid = lo + j
            for k in range(lo, mid):
                emit(Action(ADVANCE, k))
            emit(Action(TAKESHOT, mid, base + 1))
            # Executed in reverse push order: right part, free, restore, left part.
            push(("solve", lo, mid, s, base))
            push((RESTORE, lo, base))
            push((FREE, mid, base + 1))
            push(("solve", mid, hi, s - 1, base + 1))
    return Schedule(tuple(actions), n, n_snapshots, "revolve")


# ---------------------------------------------------------------------------
# simple policies
# ---------------------------------------------------------------------------


def store_all_schedule(n_steps: int) -> Schedule:
    """Store every state ``x_0 .. x_{n-1}`` (slot i holds x_i), then reverse.

    ``n_snapshots = n``; ``forward_steps = n - 1`` (= t(n, n)).
    """
    n = _check_int("n_steps", n_steps, 1)
    acts = [Action(TAKESHOT, 0, 0)]
    for i in range(1, n):
        acts.append(Action(ADVANCE, i - 1))
        acts.append(Action(TAKESHOT, i, i))
    for i in range(n - 1, -1, -1):
        if i != n - 1:
            acts.append(Action(RESTORE, i, i))
        acts.append(Action(REVERSE, i))
        acts.append(Action(FREE, i, i))
    return Schedule(tuple(acts), n, n, "store_all")


def recompute_all_schedule(n_steps: int) -> Schedule:
    """Keep only ``x_0`` and recompute each state from it when it is needed.

    ``n_snapshots = 1``; ``forward_steps = n(n-1)/2`` (= t(n, 1)).
    """
    n = _check_int("n_steps", n_steps, 1)
    acts = [Action(TAKESHOT, 0, 0)]
    for i in range(n - 1, -1, -1):
        if i != n - 1:
            acts.append(Action(RESTORE, 0, 0))
        acts.extend(Action(ADVANCE, k) for k in range(i))
        acts.append(Action(REVERSE, i))
    acts.append(Action(FREE, 0, 0))
    return Schedule(tuple(acts), n, 1, "recompute_all")


def every_k_schedule(n_steps: int, k: int) -> Schedule:
    """Snapshot every ``k``-th state in a first sweep, then reverse segment by segment.

    With ``m = ceil(n/k)`` segments ``[i*k, min((i+1)*k, n))``: the first sweep
    advances ``x_0 -> x_{(m-1)k}`` storing ``x_{ik}`` in slot ``i``.  Segments
    are then reversed last to first; each is recomputed once from its snapshot
    with a store-all inner tape (its interior states go to slots ``m, m+1,
    ...``, counted as snapshots), reversed, and its slots freed.

    ``forward_steps = k*(m-1) + (n - m)`` (first sweep, plus ``len - 1`` per
    segment); ``n_snapshots = m + min(k, n) - 1`` bounds the peak.  ``k = 1``
    and ``k >= n`` both give ``n - 1`` (store-all).
    """
    n = _check_int("n_steps", n_steps, 1)
    k = _check_int("k", k, 1)
    m = -(-n // k)
    acts = [Action(TAKESHOT, 0, 0)]
    for i in range(1, m):
        acts.extend(Action(ADVANCE, q) for q in range((i - 1) * k, i * k))
        acts.append(Action(TAKESHOT, i * k, i))
    for i in range(m - 1, -1, -1):
        a, b = i * k, min((i + 1) * k, n)
        if i != m - 1:
            acts.append(Action(RESTORE, a, i))
        for q in range(a + 1, b):  # inner store-all sweep of the segment
            acts.append(Action(ADVANCE, q - 1))
            acts.append(Action(TAKESHOT, q, m + q - a - 1))
        for q in range(b - 1, a - 1, -1):
            slot = i if q == a else m + q - a - 1
            if q != b - 1:
                acts.append(Action(RESTORE, q, slot))
            acts.append(Action(REVERSE, q))
            acts.append(Action(FREE, q, slot))
    return Schedule(tuple(acts), n, m + min(k, n) - 1, "every_k")


# ---------------------------------------------------------------------------
# reference interpreter
# ---------------------------------------------------------------------------


def simulate(schedule: Schedule) -> list[int]:
    """Run ``schedule`` on integer states (state i is the int i) and return the reversed steps.

    Raises AssertionError, with the action position in the message, when the
    schedule is invalid: the first action is not ``takeshot(0, slot 0)``; an
    unknown kind; a slot outside ``0 .. n_snapshots-1``; takeshot into a
    filled slot or of a state that is not current; restore or free of an
    empty slot or with a ``step`` that does not match the stored state;
    advance from a state that is not current or past ``n``; reverse from a
    wrong current state or out of order (reverses must be ``n-1, ..., 0``);
    and, at the end, a missing reverse or a slot left filled.
    """
    n, cap = schedule.n_steps, schedule.n_snapshots
    acts = schedule.actions
    assert acts, "empty schedule"
    first = acts[0]
    assert (first.kind, first.step, first.slot) == (TAKESHOT, 0, 0), (
        f"action 0 must be takeshot of state 0 into slot 0, got {first}"
    )
    current = 0
    slots: dict[int, int] = {}
    reversed_steps: list[int] = []
    for pos, a in enumerate(acts):
        where = f"action {pos} ({a.kind} step={a.step} slot={a.slot})"
        kind = a.kind
        if kind in (TAKESHOT, RESTORE, FREE):
            assert isinstance(a.slot, int) and 0 <= a.slot < cap, (
                f"{where}: slot outside 0..{cap - 1}"
            )
        if kind == ADVANCE:
            assert a.step == current, f"{where}: advance from state {a.step} but current is {current}"
            assert 0 <= a.step < n, f"{where}: advance past the last state {n}"
            current += 1
        elif kind == TAKESHOT:
            assert a.slot not in slots, (
                f"{where}: takeshot into slot {a.slot}, which holds state {slots.get(a.slot)}"
            )
            assert a.step == current, f"{where}: takeshot of state {a.step} but current is {current}"
            slots[a.slot] = current
        elif kind == RESTORE:
            assert a.slot in slots, f"{where}: restore of empty slot {a.slot}"
            assert slots[a.slot] == a.step, (
                f"{where}: slot {a.slot} holds state {slots[a.slot]}, not {a.step}"
            )
            current = slots[a.slot]
        elif kind == FREE:
            assert a.slot in slots, f"{where}: free of empty slot {a.slot}"
            assert slots[a.slot] == a.step, (
                f"{where}: slot {a.slot} holds state {slots[a.slot]}, not {a.step}"
            )
            del slots[a.slot]
        elif kind == REVERSE:
            expected = n - 1 - len(reversed_steps)
            assert a.step == expected, (
                f"{where}: reverse out of order, expected step {expected}"
                + (" (all steps already reversed)" if expected < 0 else "")
            )
            assert current == a.step, (
                f"{where}: reverse from wrong state index: current is {current}, need {a.step}"
            )
            reversed_steps.append(a.step)
        else:
            raise AssertionError(f"{where}: unknown action kind {kind!r}")
    assert len(reversed_steps) == n, (
        f"only {len(reversed_steps)} of {n} steps reversed; next missing is {n - 1 - len(reversed_steps)}"
    )
    assert not slots, f"slots still filled at the end: {dict(sorted(slots.items()))}"
    return reversed_steps
