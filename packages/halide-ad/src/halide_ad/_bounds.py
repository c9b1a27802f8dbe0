"""Interval arithmetic over core_ad expressions: the bounds-inference engine.

``interval(node, env)`` returns ``(lo, hi)`` -- two sym expressions with ``lo <= node <= hi``
for every assignment of the leaves within their intervals -- or ``None`` when no bound can be
proven (a float read from a buffer, a division by a range that may contain 0).

``env`` maps leaves to ``(lo, hi)`` pairs or ``None``; any other leaf is a single unknown value
(a Param, a buffer extent, a loop variable fixed by an outer loop) and stands for itself. With
constants in ``env`` every result folds to constants: the same code does the numeric bounds of
``realize`` and the symbolic per-tile bounds of ``compute_at`` inside generated loops.

The rules are conservative: where they give up they return ``None``, and the caller turns
that into an error naming the access, never into an unchecked read.
"""

from __future__ import annotations

import numpy as np
from core_ad import sym

from . import _expr as E

__all__ = ["Unbounded", "const_int", "const_value", "interval", "union"]

Unbounded = None

_MONOTONE_UP = {"exp", "expm1", "log", "log1p", "sqrt", "atan", "asin", "sinh", "tanh", "erf",
                "floor", "ceil", "round", "trunc", "identity"}
_UNIT = {"sin", "cos"}


def const_int(n):
    """The node's value as an int when it is a constant, else None."""
    v = const_value(n)
    return None if v is None else int(v)


def const_value(n):
    """The Python value of a constant node, or None."""
    if isinstance(n, type(sym.const(1))) or getattr(n, "op", None) == "const":
        v = n.value
        return v.item() if isinstance(v, np.generic) else v
    return None


def union(a, b):
    if a is None or b is None:
        return None
    return (_min(a[0], b[0]), _max(a[1], b[1]))


def _min(a, b):
    return a if a is b else sym.minimum(a, b)


def _max(a, b):
    return a if a is b else sym.maximum(a, b)


def _point(n):
    return (n, n)


def _mul(a, b):
    (alo, ahi), (blo, bhi) = a, b
    for (xlo, xhi), (clo, chi) in ((a, b), (b, a)):
        if clo is chi:
            c = const_value(clo)
            if c is not None:
                return (xlo * clo, xhi * clo) if c >= 0 else (xhi * clo, xlo * clo)
            if xlo is xhi:
                return (xlo * clo, xlo * clo)
            p, q = xlo * clo, xhi * clo
            return (_min(p, q), _max(p, q))
    cs = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
    return (_min(_min(cs[0], cs[1]), _min(cs[2], cs[3])),
            _max(_max(cs[0], cs[1]), _max(cs[2], cs[3])))


def _divide(node, a, b, floor: bool):
    (alo, ahi), (blo, bhi) = a, b
    if blo is not bhi:
        return None  # a divisor range may contain 0
    op = sym.floor_divide if floor else (lambda x, y: x / y)
    c = const_value(blo)
    if c is not None:
        if c == 0:
            return None
        return (op(alo, blo), op(ahi, blo)) if c > 0 else (op(ahi, blo), op(alo, blo))
    p, q = op(alo, blo), op(ahi, blo)
    return (_min(p, q), _max(p, q))


def _mod(node, a, b):
    blo, bhi = b
    if node.dtype.kind == "f":
        if blo is bhi:
            c = const_value(blo)
            if c is not None and c > 0:
                return (sym.const(0.0, node.dtype), blo)
        return None
    if blo is bhi:
        c = const_value(blo)
        if c is not None:
            if c == 0:
                return (sym.const(0, node.dtype), sym.const(0, node.dtype))
            m = abs(int(c)) - 1
            return (sym.const(0, node.dtype), sym.const(m, node.dtype)) if c > 0 else \
                (sym.const(-m, node.dtype), sym.const(0, node.dtype))
        zero = sym.const(0, node.dtype)
        # the divisor is a run-time value (a buffer extent): assumed positive, as extents are
        return (zero, sym.maximum(blo - 1, zero))
    return None


def _type_range(dt):
    dt = np.dtype(dt)
    if dt.kind == "b":
        return (sym.const(False, dt), sym.const(True, dt))
    if dt.kind in "iu" and dt.itemsize <= 2:
        info = np.iinfo(dt)
        return (sym.const(int(info.min), dt), sym.const(int(info.max), dt))
    return None


def _cast(node, a):
    dt, src = node.dtype, node.args[0].dtype
    if dt.kind == "b":
        return _type_range(dt)
    if dt.kind in "iu":
        narrow = _type_range(dt)
        if narrow is not None:
            return narrow
        if a is None:
            return None
        lo, hi = a
        if src.kind == "f":
            lo, hi = sym.floor(lo), sym.ceil(hi)
        return (sym.astype(lo, dt), sym.astype(hi, dt))
    if a is None:
        return None
    return (sym.astype(a[0], dt), sym.astype(a[1], dt))


def _select(node, ivs):
    _, a, b = ivs
    return union(a, b)


def _clamp(node, ivs):
    x, lo, hi = ivs
    if lo is None or hi is None:
        return x
    if x is None:
        return (lo[0], hi[1])
    return (_min(_max(x[0], lo[0]), hi[0]), _min(_max(x[1], lo[1]), hi[1]))


def _abs(node, ivs):
    (a,) = ivs
    if a is None:
        return None
    lo, hi = a
    zero = sym.const(0, node.dtype)
    return (sym.where(lo >= 0, lo, sym.where(hi <= 0, -hi, zero)), _max(-lo, hi))


def _apply(node, ivs):
    name = node.prim.name
    dt = node.dtype
    if dt.kind == "b":
        return (sym.const(False, dt), sym.const(True, dt))
    if node.prim is E.CALL:
        return _type_range(dt)
    if name == "clamp":
        return _clamp(node, ivs)
    if name == "select":
        return _select(node, ivs)
    if name in ("cast", "convert"):
        return _cast(node, ivs[0])
    if any(i is None for i in ivs):
        return None
    if name == "add":
        lo, hi = ivs[0]
        for a in ivs[1:]:
            lo, hi = lo + a[0], hi + a[1]
        return (lo, hi)
    if name == "sub":
        a, b = ivs
        return (a[0] - b[1], a[1] - b[0])
    if name == "neg":
        (a,) = ivs
        return (-a[1], -a[0])
    if name == "mul":
        r = ivs[0]
        for a in ivs[1:]:
            r = _mul(r, a)
        return r
    if name == "div":
        return _divide(node, ivs[0], ivs[1], floor=False)
    if name == "floor_divide":
        return _divide(node, ivs[0], ivs[1], floor=True)
    if name == "mod":
        return _mod(node, ivs[0], ivs[1])
    if name == "maximum":
        return (_max(ivs[0][0], ivs[1][0]), _max(ivs[0][1], ivs[1][1]))
    if name == "minimum":
        return (_min(ivs[0][0], ivs[1][0]), _min(ivs[0][1], ivs[1][1]))
    if name == "abs":
        return _abs(node, ivs)
    if name in _MONOTONE_UP:
        return (_same(node, ivs[0][0]), _same(node, ivs[0][1]))
    if name in _UNIT:
        return (sym.const(-1.0, dt), sym.const(1.0, dt))
    if name == "cosh":
        a = ivs[0]
        big = _max(sym.cosh(a[0]), sym.cosh(a[1]))
        return (sym.const(1.0, dt), big)
    if name == "acos":
        a = ivs[0]
        return (sym.arccos(a[1]), sym.arccos(a[0]))
    if name == "pow":
        a, b = ivs
        c = const_value(b[0]) if b[0] is b[1] else None
        if c is None or c <= 0:
            return None
        if c == 2:
            return _square(a)
        if float(c).is_integer() and int(c) % 2 == 1:  # odd powers are monotone
            return (sym.pow(a[0], b[0]), sym.pow(a[1], b[0]))
        # other positive powers: monotone on x >= 0 (negative x gives NaN or |x|^c)
        return None
    return None


def _square(a):
    lo, hi = a
    zero = sym.const(0, lo.dtype)
    mn = sym.where(lo >= 0, lo * lo, sym.where(hi <= 0, hi * hi, zero))
    return (mn, _max(lo * lo, hi * hi))


_SYM_NAME = {"asin": "arcsin", "atan": "arctan"}


def _same(node, x):
    """``node``'s monotone-increasing primitive applied to ``x``."""
    name = node.prim.name
    if name == "identity":
        return x
    return getattr(sym, _SYM_NAME.get(name, name))(x)


def interval(node, env: dict, memo: dict | None = None):
    """Bounds ``(lo, hi)`` of ``node`` (see the module docstring), or None."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    for n in sym.toposort([node]):
        if id(n) in memo:
            continue
        if hasattr(n, "kind") and n in env:
            r = env[n]
        elif not hasattr(n, "prim"):  # a constant, or a leaf standing for itself
            r = _point(n)
        else:
            r = _apply(n, [memo[id(a)] for a in n.args])
        memo[id(n)] = r
    return memo[id(node)]

