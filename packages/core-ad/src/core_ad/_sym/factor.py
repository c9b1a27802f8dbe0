"""Greedy multivariate Horner factoring of n-ary sums, with conditions as boolean factors.

Opt (DeVito et al. 2017, section 6) pulls common factors out of large sums before lowering
("a greedy multi-variate version of Horner's scheme") and represents a select
``where(b, e, 0)`` as the product ``b * e`` of a boolean and a float, favouring booleans during
factoring, so that the same bounds test shared by many terms is evaluated once.

Every float sum of the DAG is viewed as monomials: a constant coefficient, a map base ->
integer exponent (``x**k`` contributes ``x: k``), and a set of boolean conditions (the
conjuncts of ``where(c, e, 0)`` wrappers of the term or of its factors). Repeatedly, the
factor used by the most monomials (a condition counts ``bool_bonus`` times) is pulled out of
the monomials that hold it: ``sum = rest + f**p * (their sum with f**p divided out)``, or
``rest + where(c, (their sum without c), 0)`` for a condition, and the inner sum is factored
the same way. It stops when no factor is shared by two monomials.

Moving a factor out of a select changes the value only where the result was not finite:
``a * where(c, x, 0)`` becomes ``where(c, a * x, 0)``, which is 0 (not NaN) where ``c`` is
false and ``a`` is not finite.
"""

from __future__ import annotations

from .. import _rules as R
from .expr import Apply, Const, as_expr, is_const, order_key
from .graph import as_expr_list, toposort
from .simplify import CORE_PRIMITIVES, _split_pow, build, one, zero

__all__ = ["horner"]


def _conjuncts(c, out: dict):
    """The conjuncts of boolean ``c`` (``logical_and`` and boolean products split) into out."""
    stack = [c]
    while stack:
        e = stack.pop()
        if isinstance(e, Apply) and e.dtype.kind == "b" and e.prim in (R.logical_and_p, R.mul_p):
            stack.extend(e.args)
        elif not (isinstance(e, Const) and bool(e.value)):
            out.setdefault(id(e), e)


def _monomial(term, numeric: bool, conditions: bool):
    """``term`` as ``[coef or None, {id: [base, exponent]}, {id: condition}]``."""
    coef, factors, conds = None, {}, {}
    opaque = []
    stack = [term]
    while stack:
        e = stack.pop()
        if conditions and isinstance(e, Apply) and e.prim is R.select_p and is_const(e.args[2], 0) \
                and e.args[1].dtype == e.dtype:
            _conjuncts(e.args[0], conds)
            stack.append(e.args[1])
        elif isinstance(e, Apply) and e.prim is R.mul_p and (numeric or conditions):
            stack.extend(e.args)
        elif isinstance(e, Const):
            coef = e if coef is None else build(R.mul_p, (coef, e), {})
        elif numeric:
            base, k = _split_pow(e)
            if k is None:
                base, k = e, 1
            f = factors.get(id(base))
            if f is None:
                factors[id(base)] = [base, k]
            else:
                f[1] += k
        else:
            opaque.append(e)
    if opaque:  # numeric factoring off: the float factors stay one product
        rest = opaque[0] if len(opaque) == 1 else build(R.mul_p, tuple(opaque), {})
        factors[id(rest)] = [rest, 1]
    return [coef, factors, conds]


def _rebuild(mono, dtype):
    coef, factors, conds = mono
    parts = ([coef] if coef is not None else []) + [
        b if k == 1 else build(R.pow_p, (b, as_expr(k)), {}) for b, k in factors.values() if k != 0]
    if not parts:
        e = one(dtype)
    else:
        e = parts[0] if len(parts) == 1 else build(R.mul_p, tuple(parts), {})
    if conds:
        return _guard(sorted(conds.values(), key=order_key), e, dtype)
    return e


def _guard(conds, e, dtype):
    c = conds[0]
    for c2 in conds[1:]:
        c = build(R.logical_and_p, (c, c2), {})
    return build(R.select_p, (c, e, zero(dtype)), {})


def _best(monos, bool_bonus):
    """(kind, key, power) of the factor shared by the most monomials, or None."""
    score: dict = {}
    node: dict = {}
    for _, factors, conds in monos:
        for k, c in conds.items():
            score[("c", k)] = score.get(("c", k), 0) + 1
            node[("c", k)] = c
        for k, (b, p) in factors.items():
            if p > 0:
                score[("f", k)] = score.get(("f", k), 0) + 1
                node[("f", k)] = b
    best, best_s = None, 0
    for key, n in score.items():
        if n < 2:
            continue
        s = n * (bool_bonus if key[0] == "c" else 1)
        # ties go to the canonically first factor (order_key), not the first one the sum's
        # operand order shows: the choice depends on the structure only
        if s > best_s or (s == best_s and order_key(node[key]) < order_key(node[best])):
            best, best_s = key, s
    if best is None:
        return None
    if best[0] == "c":
        return best + (None,)
    power = min(f[best[1]][1] for _, f, _ in monos if f.get(best[1], (None, 0))[1] > 0)
    return best + (power,)


def _factor_sum(monos, dtype, bool_bonus):
    pieces = []
    while len(monos) > 1:
        pick = _best(monos, bool_bonus)
        if pick is None:
            break
        kind, key, power = pick
        inner, rest = [], []
        for m in monos:
            coef, factors, conds = m
            if kind == "c" and key in conds:
                c = conds[key]
                inner.append([coef, factors, {k: v for k, v in conds.items() if k != key}])
            elif kind == "f" and factors.get(key, (None, 0))[1] > 0:
                base = factors[key][0]
                f2 = dict(factors)
                f2[key] = [base, factors[key][1] - power]
                inner.append([coef, f2, conds])
            else:
                rest.append(m)
        body = _factor_sum(inner, dtype, bool_bonus)
        if kind == "c":
            pieces.append(_guard([c], body, dtype))
        else:
            f = base if power == 1 else build(R.pow_p, (base, as_expr(power)), {})
            pieces.append(build(R.mul_p, (f, body), {}))
        monos = rest
    pieces += [_rebuild(m, dtype) for m in monos]
    return pieces[0] if len(pieces) == 1 else build(R.add_p, tuple(pieces), {})


def horner(exprs, *, numeric: bool = True, conditions: bool = True, bool_bonus: int = 10):
    """Factor every float sum of ``exprs`` (an Expr or a list) greedily.

    ``numeric``: pull out shared float factors (with their smallest shared positive integer
    power); ``conditions``: pull out shared ``where(c, ., 0)`` conditions (conjuncts of ``c``,
    weighted ``bool_bonus`` times a float factor). Returns one Expr for one expression, else a
    list; the values are those of ``exprs`` up to rounding (and the NaN caveat of the module
    doc).
    """
    roots, single = as_expr_list(exprs, "horner")
    if not (numeric or conditions):
        return roots[0] if single else roots
    new: dict[int, object] = {}
    for n in toposort(roots):
        if not isinstance(n, Apply):
            new[id(n)] = n
            continue
        args = tuple(new[id(a)] for a in n.args)
        if n.prim is R.add_p and n.dtype.kind == "f":
            monos = [_monomial(a, numeric, conditions) for a in args]
            new[id(n)] = _factor_sum(monos, n.dtype, bool_bonus)
        elif all(a is b for a, b in zip(args, n.args)):
            new[id(n)] = n
        else:
            od = None if n.prim in CORE_PRIMITIVES else n.dtype
            new[id(n)] = build(n.prim, args, n.params, od)
    out = [new[id(r)] for r in roots]
    return out[0] if single else out
