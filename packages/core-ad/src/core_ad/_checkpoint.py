"""Checkpointed loops: reverse a long recurrence with bounded memory.

``checkpointed_loop`` runs ``state = step(state, *params)`` ``n_steps`` times and records one
graph node. Its reverse rule executes a schedule from :mod:`core_ad._revolve` (store-all,
recompute-all, every-k or Griewank's binomial "revolve"): snapshots of the state are kept in at
most ``snapshots`` slots, missing states are recomputed by advancing from the nearest
snapshot, and each step is taped only while its adjoint is being computed. The schedule's
initial sweep (advances and snapshots before the first reversal) runs in the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _lazy
from . import _revolve as rv
from ._custom import custom_call, jvp_through
from ._device import on_device, unsupported
from ._pytree import flatten, unflatten
from ._tracing import Array, _backprop, _grad_enabled, _grad_mode
from . import _rules as R


@dataclass
class LoopStats:
    """What a checkpointed loop did, for tests and memory planning.

    ``forward_steps`` counts untaped advances made by the schedule (for revolve this is
    Griewank's t(n, s)); ``primal_steps`` the extra advances of the forward pass past the
    schedule's initial sweep; ``taped_steps`` the steps evaluated with a tape (one per step);
    ``peak_snapshots`` the most states stored at once (initial state included) and
    ``peak_snapshot_bytes`` their size.
    """

    policy: str = ""
    n_steps: int = 0
    forward_steps: int = 0
    primal_steps: int = 0
    taped_steps: int = 0
    peak_snapshots: int = 0
    peak_snapshot_bytes: int = 0

    def _track(self, snaps: dict):
        if len(snaps) > self.peak_snapshots:
            self.peak_snapshots = len(snaps)
        nbytes = sum(sum(v.nbytes for v in s) for s in snaps.values())
        self.peak_snapshot_bytes = max(self.peak_snapshot_bytes, nbytes)


def _schedule(policy, n, snapshots, every):
    if policy == "revolve":
        if snapshots is None:
            raise ValueError("checkpointed_loop: policy 'revolve' needs snapshots=<slots>")
        return rv.revolve_schedule(n, snapshots)
    if policy == "store_all":
        return rv.store_all_schedule(n)
    if policy == "recompute_all":
        return rv.recompute_all_schedule(n)
    if policy == "every_k":
        if every is None:
            raise ValueError("checkpointed_loop: policy 'every_k' needs every=<k>")
        return rv.every_k_schedule(n, every)
    raise ValueError(
        f"checkpointed_loop: unknown policy {policy!r}; use 'revolve', 'store_all',"
        " 'recompute_all' or 'every_k'"
    )


def checkpointed_loop(step, state, n_steps: int, params=(), *, policy: str = "revolve",
                      snapshots: int | None = None, every: int | None = None,
                      stats: LoopStats | None = None):
    """``n_steps`` applications of ``state = step(state, *params)`` with checkpointed reverse.

    ``state`` is an array or a pytree of float arrays; traced arrays ``step`` depends on must be
    passed in ``params`` (they receive the summed gradient over all steps). ``stats``, if given,
    is filled with the counts of :class:`LoopStats`. In recorded sweeps (Hessians,
    ``create_graph``) the loop is re-run with a full tape.
    """
    if not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"checkpointed_loop: n_steps must be a positive int, got {n_steps!r}")
    schedule = _schedule(policy, int(n_steps), snapshots, every)
    stats = stats if stats is not None else LoopStats()
    stats.policy, stats.n_steps = policy, int(n_steps)
    leaves, td = flatten(state)
    params = tuple(params)
    if any(on_device(a) for a in (*leaves, *params)):
        raise unsupported("checkpointed_loop", _lazy._user_frame())
    nl = len(leaves)
    args = tuple(leaves) + params
    raw_params = [p.value if isinstance(p, Array) else p for p in params]

    def advance(cur, prm=raw_params):
        with _grad_mode(False):
            out = flatten(step(unflatten(td, cur), *prm))[0]
        return [np.asarray(o.value if isinstance(o, Array) else o) for o in out]

    cur = [np.asarray(x.value if isinstance(x, Array) else x) for x in leaves]
    traced = _grad_enabled() and any(isinstance(a, Array) and a.requires_grad for a in args)
    if not traced:
        for _ in range(n_steps):
            cur = advance(cur)
        return unflatten(td, [Array(c) for c in cur])

    snaps: dict[int, list] = {}
    pos = 0
    for pos, a in enumerate(schedule.actions):
        if a.kind == rv.REVERSE:
            break
        if a.kind == rv.ADVANCE:
            cur = advance(cur)
            stats.forward_steps += 1
        elif a.kind == rv.TAKESHOT:
            snaps[a.slot] = cur
            stats._track(snaps)
    prefix_state, prefix_end = cur, pos
    reached = sum(1 for a in schedule.actions[:pos] if a.kind == rv.ADVANCE)
    final = cur
    for _ in range(reached, n_steps):
        final = advance(final)
        stats.primal_steps += 1
    diff = [isinstance(a, Array) and a.requires_grad for a in args]

    def traced_run(call):
        cur = call[:nl]
        for _ in range(n_steps):
            cur = flatten(step(unflatten(td, cur), *call[nl:]))[0]
        return [c if isinstance(c, Array) else Array(c) for c in cur]

    def vjp_fn(cts, node_args):
        if any(isinstance(a, Array) for a in node_args):
            with _grad_mode(True):
                call = [R.identity(a) if d else a for a, d in zip(node_args, diff)]
                outs = traced_run(call)
            targets = [c for c, d in zip(call, diff) if d]
            found = _backprop(outs, list(cts), targets=targets, create_graph=True,
                              retain_graph=True, accumulate=False)
            return tuple(found.get(id(c)) if d else None for c, d in zip(call, diff))
        local = dict(snaps)
        state_now = prefix_state
        ct_state = [np.asarray(c) for c in cts]
        ct_params = [None] * len(params)
        for a in schedule.actions[prefix_end:]:
            if a.kind == rv.ADVANCE:
                state_now = advance(state_now, node_args[nl:])
                stats.forward_steps += 1
            elif a.kind == rv.TAKESHOT:
                local[a.slot] = state_now
                stats._track(local)
            elif a.kind == rv.RESTORE:
                state_now = local[a.slot]
            elif a.kind == rv.FREE:
                del local[a.slot]
            else:
                with _grad_mode(True):
                    sl = [Array(v, requires_grad=True) for v in state_now]
                    pl = [Array(p, requires_grad=True) if d else p
                          for p, d in zip(node_args[nl:], diff[nl:])]
                    outs = flatten(step(unflatten(td, sl), *pl))[0]
                outs = [o if isinstance(o, Array) else Array(o) for o in outs]
                targets = sl + [p for p, d in zip(pl, diff[nl:]) if d]
                found = _backprop(outs, ct_state, targets=targets, accumulate=False)
                stats.taped_steps += 1
                ct_state = [np.asarray(found.get(id(s), np.zeros_like(s.value))) for s in sl]
                for i, (p, d) in enumerate(zip(pl, diff[nl:])):
                    g = found.get(id(p)) if d else None
                    if g is not None:
                        ct_params[i] = g if ct_params[i] is None else ct_params[i] + g
        return tuple(c if d else None for c, d in zip(ct_state, diff[:nl])) + tuple(ct_params)

    def jvp_fn(tangents, node_args, nb):
        return jvp_through(lambda *a: traced_run(list(a)), node_args, tangents, nb)

    outs = custom_call("checkpointed_loop", final, args, vjp_fn, jvp_fn)
    return unflatten(td, outs)
