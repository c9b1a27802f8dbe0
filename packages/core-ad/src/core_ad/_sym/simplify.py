"""Construction of apply nodes: constant folding, dtype rules, canonical forms, identities.

Every symbolic op goes through :func:`build` (the handler of the symbolic *kind* registered
with :func:`core_ad._primitives.register_kind`, priority 100), so ``core_ad._rules.exp(e)`` on an
:class:`~core_ad._sym.expr.Expr` builds a node here.

Rules, applied on construction:

* **Folding**: all operands constant -> the primitive's ``impl`` on the numpy values (a
  user primitive can opt out with ``extra={"fold": False}``).
* **dtypes**: the result dtype is what ``impl`` gives on numpy values of the operands' dtypes,
  Python-scalar constants being weak (NEP 50): ``float32 var * 2.0`` is float32, comparisons
  are bool. Weak constants meeting strong operands of an arithmetic primitive are converted to
  the operation's common dtype, so ``x * 2.0`` and ``x * float32(2)`` are one node.
* **n-ary add / mul** (the rule table's ``add_p`` / ``mul_p`` are variadic): nested adds
  (muls) of the same dtype are flattened, constants folded into one leading constant, operands
  sorted canonically, like terms collected (``2x + 3x -> 5x``, ``x - x -> 0``) and like
  factors with integer exponents combined (``x * x -> x**2``, ``x * x**-1 -> 1``).
  ``x + 0 -> x``, ``x * 1 -> x``, ``x * 0 -> 0`` (IEEE inf/NaN subtleties are ignored, as in
  any computer-algebra system).
* ``neg(x) -> (-1) * x``; ``sub(a, b) -> a + (-1) * b`` (so ``--x is x`` and derivatives of
  linear functions fold to constants).
* ``x / 1 -> x``, ``0 / x -> 0``; ``pow(x, 0) -> 1``, ``pow(x, 1) -> x``,
  ``pow(pow(x, a), b) -> pow(x, a*b)`` for integers a, b; ``pow(1, y) -> 1``.
* ``where(const, a, b)`` picks a branch; ``where(c, a, a) -> a``; ``identity(x) -> x``;
  casts to the operand's own dtype vanish.
* ``safe_mul(a, p) -> a * p`` when ``a`` is a constant or ``p`` is provably finite.

A simplified result whose dtype differs from the operation's (``x32 * float64(1)`` is
float64, ``x32`` is not) is wrapped in a cast, so the dtype contract always holds.
"""

from __future__ import annotations

import numpy as np

from .. import _rules as R
from .._primitives import Primitive, register_kind
from .expr import (
    F_FINITE,
    F_SELECT,
    Apply,
    Const,
    Expr,
    _make_const,
    as_expr,
    freeze_params,
    is_const,
    make_apply,
    order_key,
)

__all__ = ["build", "process", "call", "CORE_PRIMITIVES", "impl_of"]

CORE_PRIMITIVES = frozenset(v for v in vars(R).values() if isinstance(v, Primitive))


# per-primitive overrides of ``impl`` for folding, dtype inference and compiled code (none
# needed at present; the hook stays so that a backend-specific evaluation can be slotted in)
_IMPLS: dict = {}


def impl_of(prim: Primitive):
    return _IMPLS.get(prim, prim.impl)


# --------------------------------------------------------------------------------------------
# flags

def _prims(names: str) -> frozenset:
    return frozenset(getattr(R, n) for n in names.split() if hasattr(R, n))


# always finite (bool results)
_ALWAYS_FINITE = _prims(
    "lt_p le_p gt_p ge_p eq_p ne_p logical_and_p logical_or_p logical_not_p isfinite_p isnan_p"
)
# finite for finite operands (overflow of + and * ignored)
_PRESERVING = _prims(
    "add_p sub_p neg_p mul_p safe_mul_p identity_p sin_p cos_p tanh_p erf_p atan_p atan2_p"
    " sign_p floor_p ceil_p round_p trunc_p abs_p maximum_p minimum_p clamp_p convert_p cast_p"
)


def _int_exponent(e):
    """The integer value of a constant exponent, or None."""
    if not isinstance(e, Const) or e.dtype.kind not in "biuf":
        return None
    v = e.value
    try:
        fv = float(v)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(fv) or fv != int(fv) or abs(fv) > 2**31:
        return None
    return int(fv)


def _flags(prim: Primitive, args: tuple) -> int:
    f = 0
    if prim is R.select_p or any(a.flags & F_SELECT for a in args):
        f |= F_SELECT
    if prim in _ALWAYS_FINITE:
        f |= F_FINITE
    elif prim is R.select_p:
        if args[1].flags & args[2].flags & F_FINITE:
            f |= F_FINITE
    elif prim is R.pow_p:
        k = _int_exponent(args[1])
        if k is not None and k >= 0 and args[0].flags & F_FINITE:
            f |= F_FINITE
    elif prim in _PRESERVING or prim.extra.get("finite", False):
        if all(a.flags & F_FINITE for a in args):
            f |= F_FINITE
    return f


# --------------------------------------------------------------------------------------------
# dtypes

_DTYPE_CACHE: dict = {}


def _sample(a: Expr):
    if isinstance(a, Const) and a.weak:
        return a.value
    return np.ones(1, dtype=a.dtype)


def infer_dtype(prim: Primitive, args: tuple, params: dict, pkey: tuple) -> np.dtype:
    od = prim.extra.get("out_dtype")
    if od is not None:
        if callable(od) and not isinstance(od, type):
            return np.dtype(od(tuple(a.dtype for a in args), **params))
        return np.dtype(od)
    sig = tuple((a.dtype, isinstance(a, Const) and a.weak) for a in args)
    key = (prim, sig, pkey)
    dt = _DTYPE_CACHE.get(key)
    if dt is None:
        try:
            with np.errstate(all="ignore"):
                r = impl_of(prim)(*[_sample(a) for a in args], **params)
            dt = np.asarray(r).dtype
        except Exception as e:  # noqa: BLE001 - re-raised with context
            dts = ", ".join(str(a.dtype) for a in args)
            raise TypeError(
                f"{prim.name}: cannot apply to operands of dtype ({dts}): {e}."
                " (A user primitive whose impl cannot run on sample values must declare its"
                " result dtype: sym.call(prim, ..., out_dtype=...) or extra['out_dtype'].)"
            ) from None
        _DTYPE_CACHE[key] = dt
    return dt


# primitives whose operands are promoted to one common dtype (select: its two branches)
_PROMOTING_ALL = _prims(
    "add_p mul_p sub_p div_p pow_p maximum_p minimum_p clamp_p atan2_p safe_mul_p lt_p le_p"
    " gt_p ge_p eq_p ne_p"
)


def _normalise_weak(prim, args):
    if prim in _PROMOTING_ALL:
        pos = range(len(args))
    elif prim is R.select_p:
        pos = (1, 2)
    else:
        return args
    if not any(isinstance(args[i], Const) and args[i].weak for i in pos):
        return args
    try:
        common = np.result_type(
            *[args[i].value if isinstance(args[i], Const) and args[i].weak else args[i].dtype
              for i in pos]
        )
    except (TypeError, ValueError, OverflowError):
        return args
    out = list(args)
    for i in pos:
        a = args[i]
        if isinstance(a, Const) and a.weak:
            try:
                with np.errstate(all="ignore"):
                    out[i] = _make_const(np.asarray(a.value).astype(common)[()], common, False)
            except (TypeError, ValueError, OverflowError):
                return args
    return tuple(out)


def _strong(value, dtype) -> Const:
    dtype = np.dtype(dtype)
    with np.errstate(all="ignore"):
        return _make_const(np.asarray(value).astype(dtype)[()], dtype, False)


def zero(dtype) -> Const:
    return _strong(0, dtype)


def one(dtype) -> Const:
    return _strong(1, dtype)


def coerce(node: Expr, dtype: np.dtype) -> Expr:
    """``node`` with exactly ``dtype`` (strong), adding a cast if the dtypes differ."""
    if isinstance(node, Const):
        if node.dtype == dtype and not node.weak:
            return node
        return _strong(node.value, dtype)
    if node.dtype == dtype:
        return node
    if node.dtype.kind in "fc" and dtype.kind in "fc":
        return build(R.convert_p, (node,), {"dtype": dtype})
    return build(R.cast_p, (node,), {"dtype": dtype})


# --------------------------------------------------------------------------------------------
# construction


def _fold(prim, args, params):
    weak = all(a.weak for a in args)
    vals = [np.asarray(a.value) if weak else a.value for a in args]
    try:
        with np.errstate(all="ignore"):
            r = impl_of(prim)(*vals, **params)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{prim.name}: constant folding failed: {e}") from None
    r = np.asarray(r)
    if r.shape != ():
        raise ValueError(f"{prim.name}: constant folding gave shape {r.shape}, not a scalar")
    return _make_const(r[()], r.dtype, weak)


def _node(prim, args, pkey=(), params=None, dtype=None) -> Apply:
    params = params or {}
    if dtype is None:
        dtype = infer_dtype(prim, args, params, pkey)
    return make_apply(prim, args, pkey, params, dtype, _flags(prim, args))


# Recent constructions, (prim, operand ids, params, dtype) -> (operands, node): nodes are
# interned weakly, so a loop that rebuilds the same expressions every iteration (lazy
# evaluation, transforms) would redo the rewrites each time. An entry holds its operands, so
# their ids are not reused while it lives; the memo is emptied when it reaches
# BUILD_MEMO_SIZE entries (clearing is atomic; evicting one entry would race with threads).
BUILD_MEMO_SIZE = 16384
_BUILD_MEMO: dict = {}


def build(prim: Primitive, args: tuple, params: dict, out_dtype=None) -> Expr:
    """The canonical, interned node for ``prim(*args, **params)`` (args are Exprs)."""
    pkey = freeze_params(params, prim.name)
    key = (prim, tuple(map(id, args)), pkey, None if out_dtype is None else np.dtype(out_dtype))
    hit = _BUILD_MEMO.get(key)
    if hit is not None:
        return hit[1]
    node = _build(prim, args, params, pkey, out_dtype)
    if len(_BUILD_MEMO) >= BUILD_MEMO_SIZE:
        _BUILD_MEMO.clear()
    _BUILD_MEMO[key] = (args, node)
    return node


def clear_build_cache() -> None:
    """Forget the memo of recent constructions (it keeps up to BUILD_MEMO_SIZE nodes, and the
    expressions below them, alive)."""
    _BUILD_MEMO.clear()


def _build(prim, args, params, pkey, out_dtype):
    if args and all(isinstance(a, Const) for a in args) and prim.extra.get("fold", True):
        r = _fold(prim, args, params)
        return r if out_dtype is None else coerce(r, np.dtype(out_dtype))
    if out_dtype is not None:
        dtype = np.dtype(out_dtype)
    else:
        dtype = infer_dtype(prim, args, params, pkey)
    args = _normalise_weak(prim, args)
    rw = _REWRITES.get(prim)
    if rw is not None:
        r = rw(args, params, dtype)
        if r is not None:
            return coerce(r, dtype)
    return _node(prim, args, pkey, params, dtype)


def _const_key(c: Const):
    return (c.dtype.str, c.weak, np.asarray(c.value, dtype=c.dtype).tobytes())


def _fold_consts(prim, consts):
    """Fold a multiset of constants in a canonical order (so the result is order-independent)."""
    if len(consts) == 1:
        return consts[0]
    return _fold(prim, tuple(sorted(consts, key=_const_key)), {})


# Nested adds (muls) are flattened into their parent only up to this many operands: long
# chains (the adjoint products of reverse mode through a deep composition) then cost linear,
# not quadratic, construction; canonical operand order holds for sums/products this size.
FLATTEN_MAX = 8


def _weak(v):
    return as_expr(v)


def _split_coef(t):
    """``t`` as (constant coefficient or None, base)."""
    if isinstance(t, Apply) and t.prim is R.mul_p and isinstance(t.args[0], Const):
        rest = t.args[1:]
        return t.args[0], rest[0] if len(rest) == 1 else _node(R.mul_p, rest)
    return None, t


def _flattenable(a, prim, dtype):
    return (
        isinstance(a, Apply) and a.prim is prim and a.dtype == dtype
        and len(a.args) <= FLATTEN_MAX
    )


def _rw_add(args, params, dtype):
    if dtype.kind not in "iufc":
        return None
    nonzero = [a for a in args if not is_const(a, 0)]
    if len(nonzero) == 1 and not isinstance(nonzero[0], Const):
        return nonzero[0]  # x + 0 -> x, whatever x is
    # an add node is a linear combination of non-add bases: nested sums are flattened, and a
    # constant multiple of a (small) sum is expanded into it, so (x+y) - (y+x) -> 0
    consts = []
    groups: dict[int, list] = {}

    def put(c, base):
        g = groups.get(id(base))
        if g is None:
            groups[id(base)] = [base, [c]]
        else:
            g[1].append(c)

    for a in nonzero:
        if isinstance(a, Const):
            consts.append(a)
            continue
        c, base = _split_coef(a)
        if _flattenable(base, R.add_p, dtype):
            for t in base.args:
                if isinstance(t, Const):
                    consts.append(t if c is None else _fold_consts(R.mul_p, [c, t]))
                    continue
                c2, b2 = _split_coef(t)
                if c is not None:
                    c2 = c if c2 is None else _fold_consts(R.mul_p, [c, c2])
                put(c2, b2)
        else:
            put(c, base)
    terms = []
    for base, coefs in groups.values():
        if len(coefs) == 1 and coefs[0] is None:
            terms.append(base)
            continue
        total = _fold_consts(R.add_p, [_weak(1) if c is None else c for c in coefs])
        if is_const(total, 0):
            continue
        terms.append(build(R.mul_p, (total, base), {}))
    k = _fold_consts(R.add_p, consts) if consts else None
    if k is not None and is_const(k, 0):
        k = None
    if not terms:
        return k if k is not None else zero(dtype)
    terms.sort(key=order_key)
    if k is None and len(terms) == 1:
        return terms[0]
    return _node(R.add_p, ((k,) if k is not None else ()) + tuple(terms))


def _split_pow(f):
    """``f`` as (base, integer exponent) when it is a float power with an integer exponent."""
    if f.dtype.kind not in "fc":
        return f, None
    if isinstance(f, Apply) and f.prim is R.pow_p and not isinstance(f.args[0], Const):
        k = _int_exponent(f.args[1])
        if k is not None and f.args[0].dtype == f.dtype:
            return f.args[0], k
    return f, 1


def _rw_mul(args, params, dtype):
    if dtype.kind not in "iufc":
        return None
    flat = []
    for a in args:
        if _flattenable(a, R.mul_p, dtype):
            flat.extend(a.args)
        else:
            flat.append(a)
    consts = [a for a in flat if isinstance(a, Const)]
    coef = _fold_consts(R.mul_p, consts) if consts else None
    if coef is not None:
        if is_const(coef, 0):
            return zero(dtype)
        if is_const(coef, 1):
            coef = None
    groups: dict[int, list] = {}
    order = []
    for f in flat:
        if isinstance(f, Const):
            continue
        base, k = _split_pow(f)
        if k is None:  # not combinable: keep each occurrence
            order.append([f, None])
            continue
        g = groups.get(id(base))
        if g is None:
            g = groups[id(base)] = [base, 0]
            order.append(g)
        g[1] += k
    factors = []
    for base, k in order:
        if k is None:
            factors.append(base)
        elif k == 1:
            factors.append(base)
        elif k != 0:
            factors.append(build(R.pow_p, (base, _weak(k)), {}))
    if not factors:
        return coef if coef is not None else one(dtype)
    factors.sort(key=order_key)
    if coef is None and len(factors) == 1:
        return factors[0]
    return _node(R.mul_p, ((coef,) if coef is not None else ()) + tuple(factors))


def _rw_neg(args, params, dtype):
    if dtype.kind not in "ifc":
        return None
    return build(R.mul_p, (_weak(-1), args[0]), {})


def _rw_sub(args, params, dtype):
    if dtype.kind not in "ifc":
        return None
    a, b = args
    return build(R.add_p, (a, build(R.mul_p, (_weak(-1), b), {})), {})


def _rw_div(args, params, dtype):
    a, b = args
    if is_const(b, 1):
        return a
    if is_const(a, 0) and dtype.kind in "fc":
        return zero(dtype)
    return None


def _rw_pow(args, params, dtype):
    x, y = args
    if isinstance(y, Const):
        if is_const(y, 0):
            return one(dtype)
        if is_const(y, 1):
            return x
        k2 = _int_exponent(y)
        if k2 is not None and isinstance(x, Apply) and x.prim is R.pow_p:
            k1 = _int_exponent(x.args[1])
            if k1 is not None and x.args[0].dtype == dtype:
                return build(R.pow_p, (x.args[0], _weak(k1 * k2)), {})
    if is_const(x, 1):
        return one(dtype)
    return None


def _rw_safe_mul(args, params, dtype):
    a, p = args
    if isinstance(a, Const):
        if is_const(a, 0):
            return zero(dtype)
        return build(R.mul_p, (a, p), {})
    if p.flags & F_FINITE:
        return build(R.mul_p, (a, p), {})
    return None


def _rw_select(args, params, dtype):
    c, a, b = args
    if isinstance(c, Const):
        return a if bool(c.value) else b
    if a is b:
        return a
    return None


def _rw_identity(args, params, dtype):
    return args[0]


def _rw_cast(args, params, dtype):
    if args[0].dtype == np.dtype(params["dtype"]):
        return args[0]
    return None


_REWRITES = {
    R.add_p: _rw_add,
    R.mul_p: _rw_mul,
    R.neg_p: _rw_neg,
    R.sub_p: _rw_sub,
    R.div_p: _rw_div,
    R.pow_p: _rw_pow,
    R.safe_mul_p: _rw_safe_mul,
    R.select_p: _rw_select,
    R.convert_p: _rw_cast,
    R.cast_p: _rw_cast,
}
if hasattr(R, "identity_p"):
    _REWRITES[R.identity_p] = _rw_identity


# --------------------------------------------------------------------------------------------
# the symbolic kind


def _not_lanewise(prim):
    return TypeError(
        f"primitive {prim.name!r} is not lane-wise; symbolic expressions are per-lane scalars"
        " (reductions, shape ops, indexing and linear algebra need the tracing arrays)"
    )


def process(prim: Primitive, args: tuple, params: dict) -> Expr:
    """Handler of the symbolic kind: ``bind(prim, *args)`` with an Expr among ``args``."""
    if not prim.elementwise:
        raise _not_lanewise(prim)
    return build(prim, tuple(as_expr(a, prim.name) for a in args), params)


def call(prim: Primitive, *args, out_dtype=None, **params) -> Expr:
    """Apply a (typically user-registered) lane-wise primitive to symbolic operands.

    This is the hook for DSL call nodes, e.g. a Halide-like Func call ``f(x + 1, y)``: make a
    :class:`~core_ad.Primitive` with ``elementwise=True``, an ``impl`` that evaluates it on
    numpy lanes and ``partials(args, out, wrt, **params)`` returning ``None`` for integer index
    operands (and expressions for differentiable operands), then ``sym.call(prim, x + 1, y,
    func="f")``. The node is hash-consed like any other. ``out_dtype`` (or
    ``prim.extra["out_dtype"]``: a dtype or ``callable(arg_dtypes, **params)``) gives the
    result dtype when ``impl`` cannot be run on sample values; ``extra={"fold": False}`` keeps
    calls with constant operands as nodes; ``extra={"finite": True}`` declares that finite
    operands give a finite result (see the NaN-safety rule in :mod:`core_ad.sym`).

    :func:`core_ad.sym.diff` / :func:`core_ad.sym.grad` accept a call node as the variable:
    it is then treated as an independent input (its own operands are held fixed).
    """
    if not isinstance(prim, Primitive):
        raise TypeError(f"call: expected a Primitive, got {type(prim).__name__}")
    if not prim.elementwise:
        raise _not_lanewise(prim)
    xs = tuple(as_expr(a, prim.name) for a in args)
    return build(prim, xs, params, out_dtype)


register_kind(Expr, 100, process, broadcasts=False)
