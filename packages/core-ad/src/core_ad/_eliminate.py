"""Vertex elimination on the traced graph (Enoki's graph simplification; spec 1.7, 2.5).

Eliminating an interior lane-wise node ``v`` with parents ``p_i`` (edge weights
``dv/dp_i``) and successors ``s_j`` (``ds_j/dv``) gives every ``s_j`` direct edges to the
``p_i`` with weights ``ds_j/dv * dv/dp_i``, summed with parallel edges. A rewritten successor
becomes a :data:`LINEAR` node: its value is unchanged, its arguments are the parents and its
partials are the stored weights. ``v`` is then held by nothing and is freed; in lazy mode its
value is never stored, only computed inside the kernel that evaluates the weights.

Greedy, cheapest first: the cost of a node is ``in-degree x out-degree`` (the number of edges
its collapse creates); nodes are collapsed while the cost is below ``threshold`` (10, Enoki's
value). Only nodes that nothing outside the graph references, of lane-wise primitives whose
differentiable operands and successors all have the node's shape and dtype, are collapsed;
reductions, gathers and scatters are never crossed. A ``where`` is: its adjoint is a mask, not
a product, so its edges carry a mask (:class:`_Masked`) that drops the cotangent in the lanes
the other branch selected, even an infinite one (a plain 0 weight would make it NaN); masks
compose by ``and`` and parallel edges by ``or``.

The weights are values, not recorded functions of the inputs, so a simplified graph supports
first-order sweeps only: a recorded sweep (``create_graph``, Hessians) through a LINEAR node
raises :class:`GraphSimplifiedError`. Automatic elimination is therefore off inside the
functional transforms and in derivative sweeps (:func:`core_ad._lazy.no_elimination`).
"""

from __future__ import annotations

import heapq
import sys

import numpy as np

from . import _lazy
from . import _rules as R
from ._primitives import NEG_ONE, ONE, Primitive
from ._tracing import _TAPE, Array, _grad_enabled, _grad_mode

THRESHOLD = 10


class GraphSimplifiedError(RuntimeError):
    """A recorded (higher-order) sweep reached a node simplified by vertex elimination."""


def _first_order_only():
    if _grad_enabled():
        raise GraphSimplifiedError(
            "this graph was simplified by vertex elimination, which keeps first-order edge"
            " weights only; it cannot be differentiated again (create_graph, Hessians). Call"
            " core_ad.set_vertex_elimination(False) before recording it"
        )


class _Masked:
    """An edge weight ``w`` that is exactly zero where ``mask`` is false (the lanes where a
    ``where`` took the other branch), whatever the cotangent there."""

    __slots__ = ("mask", "w", "dtype")

    def __init__(self, mask, w, dtype):
        self.mask, self.w, self.dtype = mask, w, dtype

    def arrays(self):
        """The Arrays this weight holds (for ``whos``)."""
        return (self.mask,) + ((self.w,) if isinstance(self.w, Array) else ())


def _unmask(w):
    """``(mask or None, plain weight)``."""
    return (w.mask, w.w) if isinstance(w, _Masked) else (None, w)


def _dtype(*ws):
    return next(w.dtype for w in ws if isinstance(w, _Masked))


def _times(c, w, fused):
    """``c * w`` for a cotangent or tangent ``c`` and an edge weight ``w``."""
    if isinstance(w, _Masked):
        t = _times(c, w.w, fused)
        return R.where(w.mask if fused else w.mask.value, t, R._const(t, 0.0))
    if isinstance(w, float):
        return c if w == 1.0 else R.mul(c, w)
    # a fused (lazy) sweep passes Array operands and records; an eager one passes numpy values
    return R.safe_mul(c, w if fused else w.value)


def _fused(args) -> bool:
    return any(isinstance(a, Array) for a in args)


def _linear_vjp(ct, args, out, weights):
    _first_order_only()
    return tuple(_times(ct, w, _fused(args)) for w in weights)


def _linear_jvp(tangents, args, out, nb, weights):
    _first_order_only()
    acc = None
    for t, w in zip(tangents, weights):
        if t is not None:
            term = _times(t, w, _fused(args))
            acc = term if acc is None else R.add(acc, term)
    return acc


def _no_impl(*args, **params):
    raise TypeError("the linear node of vertex elimination is not applied to values")


# Not in the registry: only elimination creates such nodes. "lanewise" lets the lazy backward
# fuse its adjoint arithmetic like that of the primitives it replaced.
LINEAR = Primitive(
    "linear",
    _no_impl,
    vjp=_linear_vjp,
    jvp=_linear_jvp,
    doc="a node simplified by vertex elimination: partials are the stored edge weights",
    extra={"lanewise": True},
)


def _convertible(n: Array) -> bool:
    """Whether ``n`` is a lane-wise node whose edges can be written as weights."""
    from ._codegen.llvm.emitter import LOWERINGS

    prim = n._prim
    if prim is LINEAR:
        return True
    if prim is None or n._freed or prim.name not in LOWERINGS or (
            prim.partials is None and prim is not R.select_p):
        return False
    return all(
        a.shape == n.shape and a.dtype == n.dtype
        for a in n._args
        if isinstance(a, Array) and a._requires_grad
    )


def _parents(n: Array) -> dict:
    return {id(a): a for a in n._args if isinstance(a, Array) and a._requires_grad}


def _hold(w):
    """An edge weight to store: a Python float, or an untracked Array (pending ones are
    tracked by their scope so that they are evaluated with it)."""
    if not isinstance(w, Array):
        return float(w) if np.ndim(w) == 0 else Array(np.asarray(w))
    h = Array._view(w)
    if h.is_pending:
        _lazy.track(h, h._value.scope)
    return h


def _plus(a, b):
    if isinstance(a, _Masked) or isinstance(b, _Masked):
        (ma, wa), (mb, wb) = _unmask(a), _unmask(b)
        dt = _dtype(a, b)
        mask = None if ma is None or mb is None else R.logical_or(ma, mb)
        total = _plus(_zero_outside(ma, wa, dt), _zero_outside(mb, wb, dt))
        return total if mask is None else _Masked(mask, total, dt)
    if isinstance(a, float) and isinstance(b, float):
        return a + b
    return R.add(a, b)


def _zero_outside(mask, w, dtype):
    """The plain weight ``w`` where ``mask`` holds, 0 elsewhere (an Array of ``dtype``)."""
    if mask is None:
        return w
    one = np.asarray(w if isinstance(w, float) else 1.0, dtype)
    return R.where(mask, one if isinstance(w, float) else w, np.zeros((), dtype))


def _compose(w_sv, w_vp):
    if isinstance(w_sv, _Masked) or isinstance(w_vp, _Masked):
        (m1, w1), (m2, w2) = _unmask(w_sv), _unmask(w_vp)
        mask = m1 if m2 is None else m2 if m1 is None else R.logical_and(m1, m2)
        return _Masked(mask, _compose(w1, w2), _dtype(w_sv, w_vp))
    for f, other in ((w_sv, w_vp), (w_vp, w_sv)):
        if isinstance(f, float):
            if f == 0.0:
                return 0.0
            return other if f == 1.0 else (f * other if isinstance(other, float)
                                           else R.mul(other, f))
    # zero where the outer weight is zero, as the step-by-step sweep's safe multiplies
    return R.safe_mul(w_sv, w_vp)


def _edges(n: Array) -> dict:
    """id(parent) -> [parent, weight] for a convertible node."""
    if n._prim is LINEAR:
        return {id(a): [a, w] for a, w in zip(n._args, n._params["weights"])}
    args = n._args
    if n._prim is R.select_p:
        return _select_edges(n, *args)
    wrt = tuple(isinstance(a, Array) and a._requires_grad for a in args)
    views = tuple(Array._view(a) if isinstance(a, Array) else a for a in args)
    ps = n._prim.partials(views, Array._view(n), wrt, **n._params)
    edges: dict = {}
    for a, p, w in zip(args, ps, wrt):
        if not w or p is None:
            continue
        p = 1.0 if p is ONE else -1.0 if p is NEG_ONE else _hold(p)
        if id(a) in edges:
            edges[id(a)][1] = _plus(edges[id(a)][1], p)
        else:
            edges[id(a)] = [a, p]
    return edges


def _select_edges(n, cond, a, b) -> dict:
    """Edges of ``n = where(cond, a, b)``: weight 1 to each branch, masked to its lanes."""
    mask = _hold(cond if isinstance(cond, Array) else Array(np.asarray(cond, bool)))
    edges: dict = {}
    for arg, m in ((a, mask), (b, None)):
        if not (isinstance(arg, Array) and arg._requires_grad):
            continue
        w = _Masked(m if m is not None else _hold(R.logical_not(mask)), 1.0, n.dtype)
        if id(arg) in edges:
            edges[id(arg)][1] = _plus(edges[id(arg)][1], w)
        else:
            edges[id(arg)] = [arg, w]
    return edges


def simplify_graph(threshold: int = THRESHOLD) -> int:
    """Collapse interior lane-wise nodes of the live graph, cheapest first, while the cost
    ``in-degree x out-degree`` is below ``threshold``; returns the number collapsed. Runs
    before every lazy evaluation unless ``set_vertex_elimination(False)``; call it to simplify
    now (in eager mode too). Gradients are unchanged; the graph holds fewer arrays."""
    with _grad_mode(False), np.errstate(divide="ignore", invalid="ignore"):
        prev = getattr(_lazy._state, "simplifying", False)
        _lazy._state.simplifying = True  # the weights it records must not flush the scope
        try:
            return _eliminate(threshold)
        finally:
            _lazy._state.simplifying = prev


def _eliminate(threshold: int) -> int:
    nodes = [n for n in _TAPE.live() if n._prim is not None and not n._freed]
    if not nodes:
        return 0
    # References from outside the graph (user variables, closures) keep a node: count them as
    # Enoki's external reference counts. A probe nothing else holds calibrates our own.
    nodes.append(Array.__new__(Array))
    refs = {id(n): sys.getrefcount(n) for n in nodes}
    base = refs[id(nodes.pop())]
    internal: dict[int, int] = {}
    for n in nodes:
        for a in n._args:
            if isinstance(a, Array):
                internal[id(a)] = internal.get(id(a), 0) + 1
    external = {k for k, c in refs.items() if c - base - internal.get(k, 0) > 0}

    by_id = {id(n): n for n in nodes}
    order = {id(n): i for i, n in enumerate(nodes)}
    succ: dict[int, dict] = {}
    for n in nodes:
        for k in _parents(n):
            succ.setdefault(k, {})[id(n)] = n

    def cost(n):
        out = succ.get(id(n))
        if (id(n) in external or n._retain or not out or not _convertible(n)
                or not all(_convertible(s) for s in out.values())):
            return None
        return len(_parents(n)) * len(out)

    heap = []
    for k, n in by_id.items():
        c = cost(n)
        if c is not None and c < threshold:
            heap.append((c, order[k], k))
    heapq.heapify(heap)
    done = 0
    while heap:
        c, i, k = heapq.heappop(heap)
        v = by_id.get(k)
        if v is None:
            continue
        now = cost(v)
        if now is None or now >= threshold:
            continue
        if now != c:  # stale entry: its degrees changed since it was queued
            heapq.heappush(heap, (now, i, k))
            continue
        ev = _edges(v)
        touched = set(ev)
        for s in succ.pop(k).values():
            es = _edges(s)
            edge = es.pop(k, None)  # None: no derivative flows from v into s
            for pk, (p, w_vp) in ev.items() if edge is not None else ():
                w = _compose(edge[1], w_vp)
                if pk in es:
                    es[pk][1] = _plus(es[pk][1], w)
                else:
                    es[pk] = [p, w]
                succ.setdefault(pk, {})[id(s)] = s
            s._prim, s._params = LINEAR, {"weights": tuple(w for _, w in es.values())}
            s._args = tuple(p for p, _ in es.values())
            touched.add(id(s))
        for pk in ev:
            succ.get(pk, {}).pop(k, None)
        del by_id[k]
        done += 1
        for t in touched:
            n = by_id.get(t)
            c2 = None if n is None else cost(n)
            if c2 is not None and c2 < threshold:
                heapq.heappush(heap, (c2, order[t], t))
    return done


_lazy.SIMPLIFY = simplify_graph
