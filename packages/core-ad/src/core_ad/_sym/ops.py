"""The rule table's public math, lifted to symbolic expressions.

Each function converts its operands to :class:`~core_ad._sym.expr.Expr` first (a TypeError
naming the type for anything that is not an Expr, a scalar or a 0-d array) and then calls the
``core_ad._rules`` function of the same name, so the result is always an Expr (constant
operands fold to a :class:`Const`).
"""

from __future__ import annotations

import functools

from .. import _rules as R
from .expr import Expr, as_expr

_NAMES = (
    "add mul sub div neg pow exp log sqrt rsqrt sin cos tan arcsin arccos arctan arctan2 sinh"
    " cosh tanh erf abs sign floor ceil round trunc maximum minimum clamp lt le gt ge eq ne"
    " logical_and logical_or logical_not where safe_mul expm1 log1p square reciprocal sigmoid"
    " isfinite isnan floor_divide mod stop_gradient"
).split()

__all__ = list(_NAMES) + ["astype", "select"]


def _lift(name):
    fn = getattr(R, name)

    @functools.wraps(fn)
    def op(*args):
        return fn(*[as_expr(a, f"sym.{name}") for a in args])

    op.__module__ = "core_ad.sym"
    return op


for _n in _NAMES:
    globals()[_n] = _lift(_n)
del _n

select = globals()["where"]


def astype(x, dtype, in_range=False) -> Expr:
    """Cast; float-to-float casts are differentiable, casts to int/bool have zero derivative.
    ``in_range=True``: see :func:`core_ad.astype` (a float operand known to fit the int)."""
    return R.astype(as_expr(x, "sym.astype"), dtype, in_range)
