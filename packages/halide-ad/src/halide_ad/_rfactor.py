"""``rfactor``: split an associative reduction into parallel partial reductions.

For the update ``f[x] = f[x] op g(x, r.x, r.y)`` (``op`` one of ``+ * min max``, which are
associative and commutative), ``f.update(0).rfactor([(r.y, v)])`` returns a new Func::

    intm[x, v] = identity(op)
    intm[x, v] = intm[x, v] op g(x, r.x, v)        # over r.x only: v is now a pure Var
    f[x]       = f[x] op intm[x, r'.y]            # over r' = the range of r.y

so ``intm`` can be vectorised and parallelised over ``v`` (Suriana et al. 2017; Li et al. 2018, §4.4).
The value must have the form ``f[args] op e`` with ``f`` not in ``e``; anything else raises
a ScheduleError naming the update.
"""

from __future__ import annotations

import numpy as np
from core_ad import sym

from . import _expr as E
from ._schedule import ScheduleError, dim_name

__all__ = ["check_rfactor", "rfactor"]

_OPS = {"add": "+", "mul": "*", "minimum": "min", "maximum": "max"}


def _identity(op, dtype):
    dt = np.dtype(dtype)
    if op == "+":
        return sym.const(0, dt)
    if op == "*":
        return sym.const(1, dt)
    big = np.inf if dt.kind == "f" else np.iinfo(dt).max
    return sym.const(big if op == "min" else -big, dt)


def _combine(op, a, b):
    return {"+": lambda: a + b, "*": lambda: a * b, "min": lambda: sym.minimum(a, b),
            "max": lambda: sym.maximum(a, b)}[op]()


def _split_value(f, d):
    """(op, the other operand) of ``value = f[lhs] op other``."""
    where = f"{f.name()}.update({d.stage_index - 1})"
    if len(d.values) != 1:
        raise ScheduleError(f"rfactor of {where}: Tuple-valued updates are not supported")
    v = d.values[0]
    name = getattr(getattr(v, "prim", None), "name", None)
    op = _OPS.get(name)
    self_call = sym.call(E.CALL, *d.args, out_dtype=v.dtype, fid=f.fid, index=0)
    if op is None or self_call not in v.args:
        raise ScheduleError(
            f"rfactor of {where}: the value must be {f.name()}[...] combined with +, *, min or"
            " max (an associative, commutative reduction)"
        )
    rest = [a for a in v.args if a is not self_call]
    if len(rest) + 1 != len(v.args):
        raise ScheduleError(f"rfactor of {where}: {f.name()} appears twice in the value")
    other = rest[0]
    for a in rest[1:]:
        other = _combine(op, other, a)
    if any(c.params["fid"] == f.fid for c in sym.calls(other, E.CALL)):
        raise ScheduleError(f"rfactor of {where}: the reduced value reads {f.name()} itself")
    return op, other


def check_rfactor(f, index: int):
    """``(rdom, pure Vars, op, reduced value)`` of ``f.update(index)``, or a ScheduleError
    saying why it is not an associative reduction over one RDom rfactor can split."""
    d = f._updates[index]
    where = f"{f.name()}.update({index})"
    if len(d.rdoms) != 1:
        raise ScheduleError(f"rfactor of {where}: the update must use exactly one RDom")
    pure = [a for a in d.args if E.is_var(a)]
    if len(pure) != len(d.args):
        raise ScheduleError(f"rfactor of {where}: the left-hand side must be pure Vars")
    op, other = _split_value(f, d)
    return d.rdoms[0], pure, op, other


def rfactor(f, index: int, preserved, *more, new_dims_first=False):
    """Rewrite ``f.update(index)`` in place and return the intermediate Func: ``intm[pure...,
    new...]`` as Halide's, or ``intm[new..., pure...]`` with ``new_dims_first`` (the
    auto-scheduler vectorises a new dimension: innermost in storage, its lanes are
    consecutive)."""
    d = f._updates[index]
    where = f"{f.name()}.update({index})"
    if not isinstance(preserved, list):
        preserved = [(preserved, more[0])] if more else preserved
    pairs = [(p[0], p[1]) for p in preserved]
    rdom, pure, op, other = check_rfactor(f, index)
    kept = {}  # rvar dim -> new pure Var
    for rv, v in pairs:
        if not isinstance(rv, E.RVar) or rv.rdom is not rdom:
            raise ScheduleError(f"rfactor of {where}: {dim_name(rv)!r} is not an RVar of its"
                                " RDom")
        if not isinstance(v, E.Var) or isinstance(v, E.RVar):
            raise ScheduleError(f"rfactor of {where}: the new dimension must be a Var")
        kept[rv.dim] = v
    rest_dims = [k for k in range(len(rdom.vars)) if k not in kept]
    pure_vars = [E.Var(a.key) for a in pure]
    new_vars = [kept[k] for k in sorted(kept)]
    # type(f) and type(d): this transform sits below _func, which calls it
    intm = type(f)(f"{f.name()}_intm")

    def at(news):
        return tuple(list(news) + pure_vars if new_dims_first else pure_vars + list(news))

    intm[at(new_vars)] = E.Expr(_node=_identity(op, other.dtype))
    # intm's update: the preserved RVars become its pure Vars; the rest stay a reduction
    mapping = {rdom.vars[k].node: kept[k].node for k in kept}
    if rest_dims:
        inner = E.RDom([rdom.bounds[k] for k in rest_dims], name=f"{rdom.name}_inner")
        mapping.update({rdom.vars[k].node: inner.vars[j].node for j, k in enumerate(rest_dims)})
    pred = rdom.predicate()
    if pred is not None and rest_dims:
        inner.where(E.Expr(_node=sym.substitute(pred, mapping)))
    elif pred is not None:
        raise ScheduleError(f"rfactor of {where}: a predicate over only preserved RVars")
    cur = intm[at(new_vars)]
    intm[at(new_vars)] = E.Expr(
        _node=_combine(op, cur.node, sym.substitute(other, mapping)))
    # f's update now reduces intm over the preserved dimensions
    outer = E.RDom([rdom.bounds[k] for k in sorted(kept)], name=f"{rdom.name}_outer")
    call = intm[at(outer.vars)]
    self_call = f[tuple(pure_vars)]
    new_value = _combine(op, self_call.node, call.node)
    f._updates[index] = type(d)(f, d.args, (new_value,), d.stage_index)
    f._touch()
    return intm
