"""Symbolic derivatives: OnePass forward (``diff``, ``jvp``), reverse accumulation (``grad``,
``vjp``), and the second-order builders (``hessian``, ``hvp``), all from the rule table.

Derivative rules are never written here: a lane-wise primitive's local partials come from
``prim.partials(args, out, wrt, **params)`` evaluated on the symbolic operands (giving Expr
partials, the ``ONE`` / ``NEG_ONE`` sentinels or ``None``); primitives with ``jvp`` / ``vjp``
rules (``select``, ``convert``) use those rules, called on Exprs with ``nb=0``.
Non-differentiable primitives (comparisons, floor, casts ...) have zero derivative.

**Differentiating with respect to any node.** ``diff(e, w)`` / ``grad(e, [w, ...])`` accept
vars, custom leaves (``sym.leaf``) and *any other node*, e.g. a DSL call node ``f(x + 1, y)``
made with ``sym.call``: the node is treated as an independent input -- its derivative with
respect to itself is 1, its own operands are held fixed, and every other node depends on it
through the chain rule. ``grad(e, ws)[i] is diff(e, ws[i])`` up to canonical form: the wrt
nodes do not cut each other's paths.

**NaN-safety rule** (the symbolic counterpart of the tracing engine's safe multiply). Every
product of a tangent / adjoint ``t`` with a local partial ``p`` is built as

* ``safe_mul(t, p)`` -- exactly 0 where ``t == 0``, even if ``p`` is inf or NaN -- when ``t``
  may be a *masked zero* (its DAG contains a ``select``: a ``where`` sends the adjoint only to
  the selected branch, so unselected lanes carry zeros) **and** ``p`` is not provably finite;
* plain ``mul(t, p)`` otherwise, so that products stay in the n-ary polynomial form and
  simplify (``safe_mul`` itself reduces to ``mul`` when ``t`` is a constant or ``p`` is
  provably finite).

"Provably finite" is a static flag: constants that are finite, leaves (inputs are assumed
finite), comparisons, and ``+ - * sin cos tanh erf atan atan2 abs sign floor ... select`` of
finite operands (overflow is ignored); ``div``, ``log``, ``sqrt``, ``rsqrt``, ``exp``, ``pow``
with a non-integer or negative exponent, ``sinh``, ``cosh``, ``tan``, ``asin``, ``acos`` and user
primitives (unless ``extra["finite"]``) are not. So ``d/dx where(x > 0, sqrt(x), 0)`` is 0,
not NaN, in the lanes where ``x <= 0``, exactly as in the tracing engine. Where no select is
involved a zero tangent times an infinite partial is NaN here (the tracing engine, which uses
``safe_mul`` everywhere, gives 0); both are singular points of the function.
"""

from __future__ import annotations

import numpy as np

from .. import _rules as R
from .._primitives import NEG_ONE, ONE
from .expr import F_SELECT, Apply, Const, Expr, as_expr, is_const
from .graph import SymbolicCycleError, as_expr_list, toposort
from .simplify import one, zero

__all__ = [
    "DiffMemo",
    "diff",
    "grad",
    "jvp",
    "vjp",
    "jacobian",
    "hessian",
    "hvp",
]


class DiffMemo:
    """Memo table of OnePass forward derivatives: one entry per (node, variable).

    Pass the same memo to several :func:`diff` calls to share work between them (an Opt-like
    generator differentiating many residuals, a Hessian built row by row). Counters:

    * ``computed`` -- (node, variable) partials computed (each at most once per memo);
    * ``hits`` -- times an already-computed (node, variable) entry was reused (a shared
      sub-expression reached again, or a later call).
    """

    def __init__(self):
        self._tables: dict[int, tuple[Expr, dict]] = {}
        self.computed = 0
        self.hits = 0

    def _table(self, v: Expr) -> dict:
        entry = self._tables.get(id(v))
        if entry is None:
            table = {id(v): (v, one(_seed_dtype(v)))}
            self._tables[id(v)] = (v, table)
            return table
        return entry[1]

    def __len__(self) -> int:
        """Number of (node, variable) entries (seeds included)."""
        return sum(len(t) for _, t in self._tables.values())

    def get(self, node: Expr, v: Expr):
        """The memoised derivative of ``node`` w.r.t. ``v`` (an Expr, None for zero), or raise
        KeyError if it was never computed."""
        entry = self._tables.get(id(v))
        if entry is None or id(node) not in entry[1]:
            raise KeyError(f"no memo entry for ({node!r}, {v!r})")
        return entry[1][id(node)][1]


class _Stats:
    __slots__ = ("computed", "hits")

    def __init__(self):
        self.computed = 0
        self.hits = 0


def _seed_dtype(v: Expr) -> np.dtype:
    return v.dtype if v.dtype.kind in "fc" else np.dtype(np.float64)


def _check_wrt(v, where: str) -> Expr:
    if not isinstance(v, Expr):
        raise TypeError(
            f"{where}: can only differentiate with respect to a symbolic node (a var, a leaf or"
            f" any other expression), got {type(v).__name__}"
        )
    if isinstance(v, Const):
        raise TypeError(f"{where}: cannot differentiate with respect to a constant ({v!r})")
    return v


def _wrt_list(vars_, where):
    if isinstance(vars_, Expr):
        return [_check_wrt(vars_, where)], True
    if not isinstance(vars_, list | tuple):
        raise TypeError(
            f"{where}: expected a node or a list of nodes to differentiate with respect to,"
            f" got {type(vars_).__name__}"
        )
    vs = [_check_wrt(v, where) for v in vars_]
    if len({id(v) for v in vs}) != len(vs):
        raise ValueError(f"{where}: the same node appears twice among the variables")
    return vs, False


def _times(t: Expr, p):
    """Tangent/adjoint ``t`` times local partial ``p`` (the NaN-safety rule, module doc)."""
    if p is ONE:
        return t
    if p is NEG_ONE:
        return R.neg(t)
    p = as_expr(p, "partial")
    if t.flags & F_SELECT:
        return R.safe_mul(t, p)
    return R.mul(t, p)


def _nonzero(d):
    if d is None:
        return None
    d = as_expr(d, "derivative")
    if is_const(d, 0):
        return None
    return d


def _no_rule(prim):
    return TypeError(
        f"primitive {prim.name!r} has no derivative rule (partials or jvp/vjp); differentiate"
        " with respect to its call node instead, or declare partials"
    )


def _tangent(node: Expr, table: dict):
    if not isinstance(node, Apply):
        return None
    ts = []
    for a in node.args:
        e = table.get(id(a))
        ts.append(None if e is None else e[1])
    if all(t is None for t in ts):
        return None
    prim = node.prim
    if not prim.differentiable:
        return None
    if prim.jvp is not None:
        return _nonzero(prim.jvp(ts, node.args, node, 0, **node.params))
    if prim.partials is None:
        raise _no_rule(prim)
    wrt = tuple(t is not None for t in ts)
    ps = prim.partials(node.args, node, wrt, **node.params)
    terms = [_times(t, p) for t, p in zip(ts, ps) if t is not None and p is not None]
    if not terms:
        return None
    return _nonzero(terms[0] if len(terms) == 1 else R.add(*terms))


def _forward(roots, table: dict, stats) -> None:
    """OnePass: fill ``table`` (id -> (node, tangent or None)) for every non-constant node
    reachable from ``roots``; entries already in ``table`` (seeds, memo) are reused."""
    for r in roots:
        if isinstance(r, Const):
            continue
        if id(r) in table:
            stats.hits += 1
            continue
        state = {id(r)}
        stack = [(r, iter(r.args))]
        while stack:
            node, it = stack[-1]
            for c in it:
                if isinstance(c, Const):
                    continue
                if id(c) in table:
                    stats.hits += 1
                    continue
                if id(c) in state:
                    raise SymbolicCycleError(
                        "the expression graph has a cycle: symbolic expressions must be acyclic"
                    )
                state.add(id(c))
                stack.append((c, iter(c.args)))
                break
            else:
                stack.pop()
                state.discard(id(node))
                table[id(node)] = (node, _tangent(node, table))
                stats.computed += 1


def _zero_for(e: Expr, dt: np.dtype) -> Const:
    return zero(e.dtype if e.dtype.kind in "fc" else dt)


def diff(e, v, memo: DiffMemo | None = None) -> Expr:
    """d e / d v by OnePass forward-symbolic differentiation with a memo table.

    ``v`` may be any non-constant node (see the module doc: a call node is treated as an
    independent input). Each (node, v) partial is computed once per ``memo``; pass a
    :class:`DiffMemo` to share work across calls and to read the ``computed`` / ``hits``
    counters. Always returns an Expr (a zero constant if ``e`` does not depend on ``v``).
    """
    e = as_expr(e, "diff")
    v = _check_wrt(v, "diff")
    memo = DiffMemo() if memo is None else memo
    table = memo._table(v)
    _forward([e], table, memo)
    entry = table.get(id(e))
    d = None if entry is None else entry[1]
    return d if d is not None else _zero_for(e, _seed_dtype(v))


def jvp(outputs, vars, tangents):  # noqa: A002 - JAX-like name
    """Forward-mode directional derivatives: ``sum_j d out / d vars[j] * tangents[j]``.

    ``tangents`` are expressions or scalars (one per var). Returns one Expr per output (a
    single Expr if ``outputs`` is a single expression).
    """
    outs, single = as_expr_list(outputs, "jvp")
    vs, vsingle = _wrt_list(vars, "jvp")
    ts = [tangents] if vsingle and not isinstance(tangents, list | tuple) else list(tangents)
    if len(ts) != len(vs):
        raise ValueError(f"jvp: {len(vs)} variables but {len(ts)} tangents")
    table = {}
    for v, t in zip(vs, ts):
        t = _nonzero(as_expr(t, "jvp tangent"))
        table[id(v)] = (v, t)
    _forward(outs, table, _Stats())
    dt = np.result_type(*[_seed_dtype(v) for v in vs])
    res = []
    for o in outs:
        entry = table.get(id(o))
        d = None if entry is None else entry[1]
        res.append(d if d is not None else _zero_for(o, dt))
    return res[0] if single else res


def _reverse(seeds, wrt):
    """Reverse symbolic accumulation: one sweep over the DAG in reverse topological order,
    summing adjoints. Returns {id(w): adjoint Expr} for the nodes of ``wrt`` reached."""
    order = toposort([n for n, _ in seeds])
    targets = {id(w) for w in wrt}
    rel: dict[int, bool] = {}
    for n in order:
        rel[id(n)] = id(n) in targets or any(rel[id(a)] for a in n.args)
    adj: dict[int, list] = {}
    for n, ct in seeds:
        ct = _nonzero(ct)
        if ct is not None and rel[id(n)]:
            adj.setdefault(id(n), []).append(ct)
    total = {}
    for n in reversed(order):
        cts = adj.pop(id(n), None)
        if cts is None:
            continue
        a = cts[0] if len(cts) == 1 else R.add(*cts)
        if is_const(a, 0):
            continue
        if id(n) in targets:
            total[id(n)] = a
        if not isinstance(n, Apply) or not n.prim.differentiable:
            continue
        flags = tuple(rel[id(x)] for x in n.args)
        if not any(flags):
            continue
        prim = n.prim
        if prim.vjp is not None:
            outs = prim.vjp(a, n.args, n, **n.params)
        elif prim.partials is None:
            raise _no_rule(prim)
        else:
            ps = prim.partials(n.args, n, flags, **n.params)
            outs = [
                _times(a, p) if f and p is not None else None for f, p in zip(flags, ps)
            ]
        for x, f, c in zip(n.args, flags, outs):
            if f and c is not None:
                c = _nonzero(c)
                if c is not None:
                    adj.setdefault(id(x), []).append(c)
    return total


def grad(e, vars):  # noqa: A002
    """Gradient of the scalar expression ``e`` by reverse symbolic accumulation.

    One sweep over ``e``'s DAG in reverse topological order, summing adjoints over fan-out.
    ``vars`` is a node or a list of nodes (vars, leaves, or any node -- treated as independent
    inputs); returns an Expr or a list accordingly. ``grad(e, vs)[i]`` equals
    ``diff(e, vs[i])``.
    """
    e = as_expr(e, "grad")
    vs, single = _wrt_list(vars, "grad")
    dt = e.dtype if e.dtype.kind in "fc" else np.dtype(np.float64)
    total = _reverse([(e, one(dt))], vs)
    res = [total[id(v)] if id(v) in total else _zero_for(e, dt) for v in vs]
    return res[0] if single else res


def vjp(outputs, vars, cotangents):  # noqa: A002
    """Reverse-mode vector-Jacobian products: ``sum_i cotangents[i] * d outputs[i] / d v``
    for each v in ``vars`` (one sweep). Returns an Expr or a list, following ``vars``."""
    outs, osingle = as_expr_list(outputs, "vjp")
    vs, single = _wrt_list(vars, "vjp")
    cts = [cotangents] if osingle and not isinstance(cotangents, list | tuple) else list(
        cotangents
    )
    if len(cts) != len(outs):
        raise ValueError(f"vjp: {len(outs)} outputs but {len(cts)} cotangents")
    seeds = [(o, as_expr(c, "vjp cotangent")) for o, c in zip(outs, cts)]
    total = _reverse(seeds, vs) if seeds else {}
    res = []
    for v in vs:
        # A cotangent has its input's dtype; integer and bool inputs have none (zero).
        if v.dtype.kind not in "fc":
            res.append(zero(np.dtype(np.float64)))
            continue
        g = total.get(id(v))
        if g is None:
            res.append(zero(v.dtype))
        else:
            res.append(g if g.dtype == v.dtype else R.astype(g, v.dtype))
    return res[0] if single else res


def jacobian(outputs, vars, memo: DiffMemo | None = None):  # noqa: A002
    """Nested list ``J[i][j] = d outputs[i] / d vars[j]`` (OnePass, one memo shared by all
    entries)."""
    outs, _ = as_expr_list(outputs, "jacobian")
    vs, _ = _wrt_list(vars, "jacobian")
    memo = DiffMemo() if memo is None else memo
    return [[diff(o, v, memo) for v in vs] for o in outs]


def hessian(e, vars, memo: DiffMemo | None = None):  # noqa: A002
    """Symbolic Hessian ``H[i][j] = d^2 e / d vars[i] d vars[j]`` as an n x n nested list.

    Forward-over-reverse: the gradient by reverse accumulation, then OnePass forward on each
    gradient entry (one memo shared by all rows). Exactly symmetric: ``H[j][i] is H[i][j]``.
    """
    e = as_expr(e, "hessian")
    vs, _ = _wrt_list(vars, "hessian")
    g = grad(e, list(vs))
    memo = DiffMemo() if memo is None else memo
    n = len(vs)
    H = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            H[i][j] = H[j][i] = diff(g[i], vs[j], memo)
    return H


def hvp(e, vars, v):  # noqa: A002
    """Hessian-vector product ``H v`` (forward over reverse), one Expr per var."""
    e = as_expr(e, "hvp")
    vs, _ = _wrt_list(vars, "hvp")
    return jvp(grad(e, list(vs)), list(vs), list(v) if isinstance(v, list | tuple) else [v])
