"""Custom derivatives: nodes whose derivative rules are user code.

Every custom construct (``custom_vjp``, ``custom_jvp``, :class:`Function`, ``checkpoint``)
records a single graph node carrying a one-off :class:`~core_ad._primitives.Primitive` with
``vjp``/``jvp`` rules, so it takes part in every traversal like a built-in primitive. Several
outputs are packed into one flat node and unpacked with ``getitem``/``reshape`` nodes.

Rules receive raw numpy values in a first-order sweep and traced arrays when the sweep is
recorded (``create_graph``); recorded sweeps re-run the user's forward code on the traced
inputs so that its residuals are differentiable, which is what makes Hessians through custom
nodes correct.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _lazy
from . import _rules as R
from ._device import is_device_array, unsupported
from ._primitives import Primitive
from ._pytree import flatten, unflatten
from ._tracing import Array, _backprop, _grad_enabled, _grad_mode, _push_tangents, _toposort


def _traced(x) -> bool:
    return isinstance(x, Array) and x.requires_grad


def _raw(x):
    return x.value if isinstance(x, Array) else x


def _recording(node_args) -> bool:
    """Rules see traced arrays exactly when the sweep is being recorded."""
    return any(isinstance(a, Array) for a in node_args)


def _pack(parts, nb):
    if len(parts) == 1:
        return parts[0]
    flat = [R.reshape(p, R.shape_of(p)[:nb] + (-1,)) for p in parts]
    return R.concatenate(flat, axis=-1)


def custom_call(name, raw_outs, args, vjp_fn, jvp_fn):
    """Record one node computing ``raw_outs`` from ``args``; returns one Array per output.

    ``vjp_fn(cts, node_args)`` returns one cotangent (or None) per arg; ``jvp_fn(tangents,
    node_args, nb)`` returns one tangent (or None) per output.
    """
    if any(is_device_array(o) for o in raw_outs):
        raise unsupported(f"{name} (a node with custom derivative rules: custom_vjp, custom_jvp,"
                          " Function, checkpoint, eigh)", _lazy._user_frame())
    raw_outs = [np.asarray(o) for o in raw_outs]
    if not (_grad_enabled() and any(_traced(a) for a in args)):
        return [Array(o) for o in raw_outs]
    for i, o in enumerate(raw_outs):
        if o.dtype.kind not in "fc":
            raise TypeError(f"{name}: output {i} has dtype {o.dtype}; outputs must be floating")
    shapes = [o.shape for o in raw_outs]
    dtype = np.result_type(*raw_outs)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    bounds = np.cumsum([0] + sizes)

    def unpack(packed, nb=0):
        if len(shapes) == 1:
            return [packed]
        lead = R.shape_of(packed)[:nb]
        return [
            R.reshape(R.getitem(packed, (Ellipsis, slice(int(a), int(b)))), lead + s)
            for a, b, s in zip(bounds[:-1], bounds[1:], shapes)
        ]

    def vjp(ct, node_args, out):
        cts = vjp_fn(unpack(ct), node_args)
        if len(cts) != len(args):
            raise TypeError(
                f"{name}: the VJP returned {len(cts)} cotangents for {len(args)} arguments"
            )
        for i, (c, a) in enumerate(zip(cts, node_args)):
            if c is not None and R.shape_of(c) != R.shape_of(a):
                raise ValueError(
                    f"{name}: cotangent {i} has shape {R.shape_of(c)} but argument {i} has"
                    f" shape {R.shape_of(a)}"
                )
        return tuple(cts)

    def jvp(tangents, node_args, out, nb):
        touts = jvp_fn(tangents, node_args, nb)
        lead = next(R.shape_of(t)[:nb] for t in tangents if t is not None)
        touts = [
            np.zeros(lead + s, dtype) if t is None else t for t, s in zip(touts, shapes)
        ]
        return _pack(touts, nb)

    prim = Primitive(name, None, vjp=vjp, jvp=jvp)
    if len(raw_outs) == 1:
        value = raw_outs[0]
    else:
        value = np.concatenate([o.astype(dtype).reshape(-1) for o in raw_outs])
    node = Array._node(value, prim, tuple(args), {})
    if len(raw_outs) == 1:
        return [node]
    return unpack(node)


def jvp_through(fn, node_args, tangents, nb):
    """Tangents of ``fn``'s outputs by tracing ``fn`` on ``node_args`` and pushing tangents."""
    recording = _recording(node_args)
    seeds, call = {}, []
    with _grad_mode(True):
        for a, t in zip(node_args, tangents):
            if t is None:
                call.append(a)
                continue
            leaf = R.identity(a) if recording else Array(a, requires_grad=True)
            seeds[id(leaf)] = t
            call.append(leaf)
        outs, _ = flatten(fn(*call))
    outs = [o if isinstance(o, Array) else Array(o) for o in outs]
    return _push_tangents(outs, seeds, nb, create_graph=recording)


def _per_direction(rule, tangents, nb):
    """Apply a single-direction tangent ``rule`` to tangents with ``nb`` direction axes."""
    if nb == 0:
        return rule(tangents)
    k = next(R.shape_of(t)[0] for t in tangents if t is not None)
    per = [rule([None if t is None else R.getitem(t, j) for t in tangents]) for j in range(k)]
    stacked = []
    for outs in zip(*per):  # one output, all directions
        some = next((o for o in outs if o is not None), None)
        if some is None:
            stacked.append(None)
            continue
        zero = np.zeros(R.shape_of(some), R.dtype_of(some))
        stacked.append(R.stack([zero if o is None else o for o in outs]))
    return stacked


class custom_vjp:
    """Give ``fun`` a custom reverse-mode rule: ``f.defvjp(fwd, bwd)``.

    ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, cotangent) -> tuple`` with one
    cotangent (or None) per argument. Write ``bwd`` with :mod:`core_ad.numpy` functions to keep
    second order: in a recorded sweep (Hessians, ``create_graph``) ``fwd`` re-runs on the traced
    inputs and ``bwd`` runs on traced values. Forward mode differentiates ``fun`` itself.
    """

    def __init__(self, fun):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.fwd = None
        self.bwd = None

    def defvjp(self, fwd, bwd):
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args):
        if self.fwd is None:
            raise TypeError(f"custom_vjp function {self.__name__!r} has no rule: call defvjp")
        if not (_grad_enabled() and any(_traced(a) for a in args)):
            return self.fun(*args)
        with _grad_mode(False):
            out, res = self.fwd(*[_raw(a) for a in args])
        outs, td = flatten(out)

        def vjp_fn(cts, node_args):
            if _recording(node_args):
                with _grad_mode(True):
                    _, res2 = self.fwd(*node_args)
                r = self.bwd(res2, unflatten(td, cts))
            else:
                r = self.bwd(res, unflatten(td, cts))
            return tuple(r) if isinstance(r, (tuple, list)) else (r,)

        def jvp_fn(tangents, node_args, nb):
            return jvp_through(self.fun, node_args, tangents, nb)

        return unflatten(td, custom_call(self.__name__, [_raw(o) for o in outs], args, vjp_fn,
                                         jvp_fn))


class custom_jvp:
    """Give ``fun`` a custom forward-mode rule: ``f.defjvp(rule)``.

    ``rule(primals, tangents) -> (out, tangent_out)`` must be linear in ``tangents``. Reverse
    mode transposes it: the rule is traced with the tangents as inputs and swept backwards, so
    gradients and Hessians work without a separate VJP.
    """

    def __init__(self, fun):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.rule = None

    def defjvp(self, rule):
        self.rule = rule
        return self

    def __call__(self, *args):
        if self.rule is None:
            raise TypeError(f"custom_jvp function {self.__name__!r} has no rule: call defjvp")
        if not (_grad_enabled() and any(_traced(a) for a in args)):
            return self.fun(*args)
        with _grad_mode(False):
            out = self.fun(*[_raw(a) for a in args])
        outs, td = flatten(out)

        def tangent_rule(node_args, ts):
            full = [
                np.zeros(R.shape_of(a), R.dtype_of(a)) if t is None else t
                for a, t in zip(node_args, ts)
            ]
            _, tout = self.rule(tuple(node_args), tuple(full))
            return flatten(tout)[0]

        def jvp_fn(tangents, node_args, nb):
            with _grad_mode(_recording(node_args)):
                return _per_direction(lambda ts: tangent_rule(node_args, ts), tangents, nb)

        def vjp_fn(cts, node_args):
            recording = _recording(node_args)
            with _grad_mode(True):
                leaves = [
                    Array(np.zeros(R.shape_of(a), R.dtype_of(a)), requires_grad=True)
                    if R.dtype_of(a).kind in "fc" else None
                    for a in node_args
                ]
                touts = tangent_rule(node_args, leaves)
            touts = [t if isinstance(t, Array) else Array(t) for t in touts]
            targets = [lf for lf in leaves if lf is not None]
            found = _backprop(touts, list(cts), targets=targets, create_graph=recording,
                              retain_graph=recording, accumulate=False)
            return tuple(None if lf is None else found.get(id(lf)) for lf in leaves)

        return unflatten(td, custom_call(self.__name__, [_raw(o) for o in outs], args, vjp_fn,
                                         jvp_fn))


class FunctionCtx:
    """Per-call storage for :class:`Function` (``save_for_backward`` / ``saved_values``)."""

    def __init__(self):
        self.saved_values = ()

    def save_for_backward(self, *values):
        self.saved_values = values


class Function:
    """PyTorch-style custom function: subclass with static ``forward(ctx, *args)``,
    ``backward(ctx, *grads)`` and optionally ``jvp(ctx, *tangents)``; call ``apply``.

    ``order`` declares how far ``backward`` may be differentiated: with the default ``order =
    1`` a recorded sweep through it (Hessians, ``create_graph``) raises instead of silently
    returning a wrong second derivative. With ``order = 2`` write ``backward`` with
    :mod:`core_ad.numpy` functions; ``forward`` then re-runs on traced inputs in recorded
    sweeps so saved values are differentiable.
    """

    order = 1
    jvp = None

    @staticmethod
    def forward(ctx, *args):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args):
        ctx = FunctionCtx()
        with _grad_mode(False):
            out = cls.forward(ctx, *[_raw(a) for a in args])
        if not (_grad_enabled() and any(_traced(a) for a in args)):
            return out if not isinstance(out, np.ndarray) else Array(out)
        outs, td = flatten(out)

        def vjp_fn(cts, node_args):
            if _recording(node_args):
                if cls.order < 2:
                    raise NotImplementedError(
                        f"{cls.__name__} is first-order only (order = 1): its backward cannot be"
                        " differentiated (needed for Hessians and create_graph). Set order = 2"
                        " and write backward with core_ad.numpy functions."
                    )
                c2 = FunctionCtx()
                with _grad_mode(True):
                    cls.forward(c2, *node_args)
                r = cls.backward(c2, *cts)
            else:
                r = cls.backward(ctx, *cts)
            return tuple(r) if isinstance(r, (tuple, list)) else (r,)

        def jvp_fn(tangents, node_args, nb):
            if cls.jvp is None:
                raise NotImplementedError(
                    f"{cls.__name__} defines no jvp; forward mode through it is unavailable"
                )
            c = ctx
            if _recording(node_args):
                c = FunctionCtx()
                with _grad_mode(True):
                    cls.forward(c, *node_args)

            def one(ts):
                full = [
                    np.zeros(R.shape_of(a), R.dtype_of(a)) if t is None else t
                    for a, t in zip(node_args, ts)
                ]
                r = cls.jvp(c, *full)
                return list(r) if isinstance(r, (tuple, list)) else [r]

            with _grad_mode(_recording(node_args)):
                return _per_direction(one, tangents, nb)

        return unflatten(td, custom_call(cls.__name__, [_raw(o) for o in outs], args, vjp_fn,
                                         jvp_fn))


class CheckpointClosureError(ValueError):
    """A checkpointed function used a traced array that is not one of its arguments."""


def checkpoint(fn, *args):
    """``fn(*args)`` storing only its inputs and outputs; backward re-runs ``fn``.

    Traced arrays ``fn`` depends on must be passed as arguments (a closure over one would lose
    its gradient, which is detected and raised as :class:`CheckpointClosureError`). Works in
    recorded sweeps too (Hessians, ``create_graph``): the re-run is then itself recorded.
    """
    if not (_grad_enabled() and any(_traced(a) for a in args)):
        return fn(*args)
    with _grad_mode(False):
        out = fn(*[_raw(a) for a in args])
    outs, td = flatten(out)
    diff = [_traced(a) for a in args]

    def vjp_fn(cts, node_args):
        recording = _recording(node_args)
        with _grad_mode(True):
            call, targets = [], []
            for a, d in zip(node_args, diff):
                if d:
                    a = R.identity(a) if recording else Array(a, requires_grad=True)
                    targets.append(a)
                call.append(a)
            o = [x if isinstance(x, Array) else Array(x) for x in flatten(fn(*call))[0]]
        stop = frozenset(id(t) for t in targets)
        for n in _toposort(o, stop):
            if n.is_leaf and id(n) not in stop:
                raise CheckpointClosureError(
                    f"checkpoint: {getattr(fn, '__name__', 'fn')} uses a traced array that is not"
                    " one of its arguments; pass it as an argument so its gradient is not lost"
                )
        found = _backprop(o, list(cts), targets=targets, create_graph=recording,
                          retain_graph=recording, accumulate=False)
        it = iter(targets)
        return tuple(found.get(id(next(it))) if d else None for d in diff)

    def jvp_fn(tangents, node_args, nb):
        return jvp_through(fn, node_args, tangents, nb)

    return unflatten(td, custom_call("checkpoint", [_raw(o) for o in outs], args, vjp_fn,
                                     jvp_fn))
