"""The rule table: every primitive registered once, with its evaluation and derivatives.

The op functions defined here (``add``, ``exp``, ``where``, ``sum``, ``take`` ...) are the
public math of :mod:`core_ad.numpy` and :mod:`core_ad.sym`; the derivative rules are written
with those same functions, so they evaluate on numpy arrays, traced arrays (nesting gives higher
order) and symbolic expressions alike.

Conventions at non-differentiable points (tested in ``tests/test_conventions.py``):

* ``abs'(0) = 0``; ``sign``, ``floor``, ``ceil``, ``round``, ``trunc``, comparisons, logical ops
  and casts to integer/bool types have zero derivative (their outputs are constants).
* ``maximum``/``minimum`` (and ``max``/``min`` reductions): ties share the derivative equally
  (1/2 each for two arguments; 1/k among k tied entries of a reduction).
* ``clamp(x, lo, hi)``: derivative 1 with respect to ``x`` on the closed interval
  ``lo <= x <= hi`` (bounds included), 1 with respect to ``lo`` where ``x < lo`` and to ``hi``
  where ``x > hi``.
* ``sqrt'(0) = +inf`` and ``log'(0) = +inf`` (the true one-sided limits); ``pow(x, y)`` has
  ``d/dy = 0`` where ``x <= 0``; ``atan2`` has zero derivative at the origin; ``norm`` has zero
  derivative at the zero vector.
* ``where(c, a, b)`` sends the adjoint only to the selected branch, and every product of an
  adjoint or tangent with a local partial is a *safe multiply*: a zero adjoint times an
  infinite or NaN partial is 0, so masked-off lanes never turn into NaN gradients.
"""

from __future__ import annotations

import builtins
import math
import sys

import numpy as np
import scipy.special as _sp

from ._device import array_module, is_device_array, on_device
from ._primitives import (
    NEG_ONE,
    ONE,
    Primitive,
    bind,
    dtype_of,
    kind_of,
    register,
    shape_of,
)

# --------------------------------------------------------------------------------------------
# helpers


def _const(like, value):
    """A constant with the dtype of ``like`` (float64 for Python scalars)."""
    dt = dtype_of(like)
    if dt.kind not in "fc":
        dt = np.dtype(np.float64)
    return np.asarray(value, dtype=dt)


def _broadcast_args(args, opname):
    kinds = [kind_of(a) for a in args]
    if not builtins.any(k is not None and k.broadcasts for k in kinds):
        return args
    shapes = [shape_of(a) for a in args]
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(
            f"{opname}: operand shapes {', '.join(map(str, shapes))} do not broadcast"
        ) from None
    return tuple(
        broadcast_to(a, out) if k is not None and k.broadcasts and s != out else a
        for a, k, s in zip(args, kinds, shapes)
    )


def _lanewise(prim, *args, **params):
    return bind(prim, *_broadcast_args(args, prim.name), **params)


def _norm_axes(axis, ndim, opname):
    if axis is None:
        return tuple(range(-ndim, 0))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise ValueError(f"{opname}: axis {a} is out of range for an array of {ndim} dims")
        out.append(a - ndim if a >= 0 else a)
    if len(set(out)) != len(out):
        raise ValueError(f"{opname}: repeated axis in {axis}")
    return tuple(sorted(out))


def _float_dtype(x):
    return dtype_of(x).kind in "fc"


# --------------------------------------------------------------------------------------------
# generic derivative application, shared by the tracing engine


def apply_vjp(prim: Primitive, ct, args, out, wrt, params):
    """Cotangents of ``args`` for output cotangent ``ct`` (``None`` where ``wrt`` is false)."""
    if prim.vjp is not None:
        cts = prim.vjp(ct, args, out, **params)
        return tuple(c if w else None for c, w in zip(cts, wrt))
    ps = prim.partials(args, out, wrt, **params)
    res = []
    for p, w in zip(ps, wrt):
        if not w or p is None:
            res.append(None)
        elif p is ONE:
            res.append(ct)
        elif p is NEG_ONE:
            res.append(neg(ct))
        else:
            res.append(safe_mul(ct, p))
    return tuple(res)


def apply_jvp(prim: Primitive, tangents, args, out, nb, params):
    """Output tangent for input ``tangents`` (``None`` entries are zero)."""
    if prim.jvp is not None:
        return prim.jvp(tangents, args, out, nb, **params)
    wrt = tuple(t is not None for t in tangents)
    ps = prim.partials(args, out, wrt, **params)
    acc = None
    for t, p in zip(tangents, ps):
        if t is None or p is None:
            continue
        if p is ONE:
            term = t
        elif p is NEG_ONE:
            term = neg(t)
        else:
            term = safe_mul(t, p)
        acc = term if acc is None else add(acc, term)
    return acc


def _elementwise(name, impl, partials=None, cspell=None, doc="", variadic=False, **kw):
    return register(
        Primitive(
            name,
            impl,
            partials=partials,
            elementwise=True,
            cspell=cspell,
            doc=doc,
            variadic=variadic,
            **kw,
        )
    )


def _nondiff(name, impl, cspell=None):
    return register(
        Primitive(name, impl, differentiable=False, elementwise=True, cspell=cspell)
    )


# --------------------------------------------------------------------------------------------
# arithmetic


def _safe_mul_impl(a, p):
    r = np.multiply(a, p)
    if r.dtype.kind == "f":
        # A NaN can only appear where a non-finite partial meets a zero adjoint. One reduction
        # is the cheap test (a non-finite or overflowing sum only sends us to the exact path);
        # test the partial when it is the smaller (broadcast) operand.
        pa = np.asarray(p)
        probe = pa if pa.size < r.size else r
        with np.errstate(over="ignore", invalid="ignore"):
            suspicious = not np.isfinite(np.add.reduce(probe, axis=None))
        if suspicious:
            r = np.where(np.equal(a, 0), np.zeros((), r.dtype), r)
    return r


def _safe_mul_jvp(ts, args, out, nb, **_):
    a, p = args
    ta, tp = ts
    # where a == 0 the result is 0 whatever p is, so the p-term is safe in a (not in tp): a
    # NaN tangent of a masked partial (second order through a NaN-trap lane) stays out
    terms = ([] if ta is None else [safe_mul(ta, p)]) + ([] if tp is None else [safe_mul(a, tp)])
    return terms[0] if len(terms) == 1 else add(*terms)


def _safe_mul_vjp(ct, args, out, **_):
    a, p = args
    return (safe_mul(ct, p), safe_mul(a, ct))


safe_mul_p = _elementwise(
    "safe_mul",
    _safe_mul_impl,
    lambda args, out, wrt: (args[1], args[0]),
    cspell="(({0}) == 0 ? 0 : ({0}) * ({1}))",
    doc="a*p, but exactly 0 where a == 0 (even if p is inf or NaN); its derivative in p is 0"
    " there too",
    jvp=_safe_mul_jvp,
    vjp=_safe_mul_vjp,
)
add_p = _elementwise(
    "add",
    lambda *xs: xs[0] + xs[1] if len(xs) == 2 else builtins.sum(xs[1:], xs[0]),
    lambda args, out, wrt: (ONE,) * len(args),
    cspell="+",
    variadic=True,
)
sub_p = _elementwise("sub", np.subtract, lambda args, out, wrt: (ONE, NEG_ONE), "({0} - {1})")
neg_p = _elementwise("neg", np.negative, lambda args, out, wrt: (NEG_ONE,), "(-{0})")
identity_p = _elementwise(
    "identity", lambda x: x, lambda args, out, wrt: (ONE,), "{0}",
    doc="a distinct graph node with the same value (marks inputs of nested transforms)",
)


def _mul_impl(*xs):
    r = xs[0]
    for x in xs[1:]:
        r = r * x
    return r


def _mul_partials(args, out, wrt):
    res = []
    for i, w in enumerate(wrt):
        if not w:
            res.append(None)
            continue
        others = [a for j, a in enumerate(args) if j != i]
        res.append(others[0] if len(others) == 1 else mul(*others))
    return tuple(res)


mul_p = _elementwise("mul", _mul_impl, _mul_partials, cspell="*", variadic=True)


def _div_partials(args, out, wrt):
    x, y = args
    inv = div(_const(y, 1.0), y) if wrt[0] or wrt[1] else None
    return (inv if wrt[0] else None, neg(mul(out, inv)) if wrt[1] else None)


div_p = _elementwise("div", np.true_divide, _div_partials, "({0} / {1})")


def _pow_impl(x, y):
    # Small constant exponents by multiplication: np.power's general path is ~20x slower.
    if isinstance(y, (int, float)) and np.asarray(x).dtype.kind == "f":
        if y == 2:
            return np.square(x)
        if y == 3:
            return x * x * x
        if y == 0.5:
            return np.sqrt(x)
    return np.power(x, y)


def _pow_partials(args, out, wrt):
    x, y = args
    px = py = None
    if wrt[0]:
        if isinstance(y, (int, float)) and not kind_of(y):
            px = safe_mul(_const(x, y), pow(x, y - 1)) if y != 2 else mul(_const(x, 2.0), x)
        else:
            # safe_mul: d/dx x**0 = 0 also at x = 0, where x**(y - 1) = inf
            px = safe_mul(y, pow(x, sub(y, _const(y, 1.0))))
    if wrt[1]:
        positive = gt(x, _const(x, 0.0))
        # safe_mul: exactly 0 where x <= 0, even where out is inf or NaN (x = 0 with y < 0)
        py = safe_mul(log(where(positive, x, _const(x, 1.0))), out)
    return (px, py)


pow_p = _elementwise(
    "pow",
    _pow_impl,
    _pow_partials,
    "pow({0}, {1})",
    doc="d/dy pow(x, y) is taken as 0 where x <= 0",
)

# --------------------------------------------------------------------------------------------
# transcendental


def _unary(name, impl, partial, cspell, doc=""):
    return _elementwise(
        name, impl, lambda args, out, wrt: (partial(args[0], out),), cspell=cspell, doc=doc
    )


exp_p = _unary("exp", np.exp, lambda x, y: y, "exp({0})")
expm1_p = _unary("expm1", np.expm1, lambda x, y: add(y, _const(x, 1.0)), "expm1({0})")
log_p = _unary("log", np.log, lambda x, y: div(_const(x, 1.0), x), "log({0})", "log'(0)=+inf")
log1p_p = _unary(
    "log1p", np.log1p, lambda x, y: div(_const(x, 1.0), add(x, _const(x, 1.0))), "log1p({0})"
)
sqrt_p = _unary(
    "sqrt", np.sqrt, lambda x, y: div(_const(x, 0.5), y), "sqrt({0})", "sqrt'(0)=+inf"
)


def _rsqrt_impl(x):
    return 1.0 / np.sqrt(x)


rsqrt_p = _unary(
    "rsqrt", _rsqrt_impl, lambda x, y: mul(_const(x, -0.5), div(y, x)), "(1 / sqrt({0}))"
)
sin_p = _unary("sin", np.sin, lambda x, y: cos(x), "sin({0})")
cos_p = _unary("cos", np.cos, lambda x, y: neg(sin(x)), "cos({0})")
tan_p = _unary("tan", np.tan, lambda x, y: add(_const(x, 1.0), mul(y, y)), "tan({0})")
asin_p = _unary(
    "asin", np.arcsin, lambda x, y: rsqrt(sub(_const(x, 1.0), mul(x, x))), "asin({0})"
)
acos_p = _unary(
    "acos", np.arccos, lambda x, y: neg(rsqrt(sub(_const(x, 1.0), mul(x, x)))), "acos({0})"
)
atan_p = _unary(
    "atan",
    np.arctan,
    lambda x, y: div(_const(x, 1.0), add(_const(x, 1.0), mul(x, x))),
    "atan({0})",
)
sinh_p = _unary("sinh", np.sinh, lambda x, y: cosh(x), "sinh({0})")
cosh_p = _unary("cosh", np.cosh, lambda x, y: sinh(x), "cosh({0})")
tanh_p = _unary("tanh", np.tanh, lambda x, y: sub(_const(x, 1.0), mul(y, y)), "tanh({0})")


def _erf_impl(x):
    r = _sp.erf(x)
    dt = np.result_type(np.asarray(x).dtype, np.float32)  # Python floats are float64 here
    return r.astype(dt, copy=False) if hasattr(r, "astype") else r


erf_p = _unary(
    "erf",
    _erf_impl,
    lambda x, y: mul(_const(x, 2.0 / math.sqrt(math.pi)), exp(neg(mul(x, x)))),
    "erf({0})",
)
abs_p = _unary("abs", np.abs, lambda x, y: sign(x), "fabs({0})", "abs'(0) = 0")


def _atan2_partials(args, out, wrt):
    y, x = args
    r2 = add(mul(x, x), mul(y, y))
    safe_r2 = where(eq(r2, _const(r2, 0.0)), _const(r2, np.inf), r2)
    return (div(x, safe_r2) if wrt[0] else None, neg(div(y, safe_r2)) if wrt[1] else None)


atan2_p = _elementwise(
    "atan2", np.arctan2, _atan2_partials, "atan2({0}, {1})", "zero derivative at (0, 0)"
)


def _tie_weights(a, b, gt_op):
    one, half, zero = _const(a, 1.0), _const(a, 0.5), _const(a, 0.0)
    return where(gt_op(a, b), one, where(eq(a, b), half, zero))


def _max_partials(args, out, wrt):
    a, b = args
    return (
        _tie_weights(a, b, gt) if wrt[0] else None,
        _tie_weights(b, a, gt) if wrt[1] else None,
    )


def _min_partials(args, out, wrt):
    a, b = args
    return (
        _tie_weights(a, b, lt) if wrt[0] else None,
        _tie_weights(b, a, lt) if wrt[1] else None,
    )


maximum_p = _elementwise(
    "maximum", np.maximum, _max_partials, "fmax({0}, {1})", "ties: 1/2 to each argument"
)
minimum_p = _elementwise(
    "minimum", np.minimum, _min_partials, "fmin({0}, {1})", "ties: 1/2 to each argument"
)


def _clamp_partials(args, out, wrt):
    x, lo, hi = args
    one, zero = _const(x, 1.0), _const(x, 0.0)
    return (
        where(logical_and(ge(x, lo), le(x, hi)), one, zero) if wrt[0] else None,
        where(lt(x, lo), one, zero) if wrt[1] else None,
        where(gt(x, hi), one, zero) if wrt[2] else None,
    )


clamp_p = _elementwise(
    "clamp",
    lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    _clamp_partials,
    "fmin(fmax({0}, {1}), {2})",
    "d/dx = 1 on lo <= x <= hi (bounds included)",
)

# --------------------------------------------------------------------------------------------
# zero-derivative lane-wise ops

sign_p = _nondiff("sign", np.sign, "(({0} > 0) - ({0} < 0))")
floor_p = _nondiff("floor", np.floor, "floor({0})")
ceil_p = _nondiff("ceil", np.ceil, "ceil({0})")
round_p = _nondiff("round", np.rint, "rint({0})")
trunc_p = _nondiff("trunc", np.trunc, "trunc({0})")
lt_p = _nondiff("lt", np.less, "({0} < {1})")
le_p = _nondiff("le", np.less_equal, "({0} <= {1})")
gt_p = _nondiff("gt", np.greater, "({0} > {1})")
ge_p = _nondiff("ge", np.greater_equal, "({0} >= {1})")
eq_p = _nondiff("eq", np.equal, "({0} == {1})")
ne_p = _nondiff("ne", np.not_equal, "({0} != {1})")
logical_and_p = _nondiff("logical_and", np.logical_and, "({0} && {1})")
logical_or_p = _nondiff("logical_or", np.logical_or, "({0} || {1})")
logical_not_p = _nondiff("logical_not", np.logical_not, "(!{0})")
isfinite_p = _nondiff("isfinite", np.isfinite, "isfinite({0})")
isnan_p = _nondiff("isnan", np.isnan, "isnan({0})")
# The value passes through, the derivative is cut: a Newton step's or a fixed point's
# "treat this as a constant" (JAX's lax.stop_gradient), usable inside compiled kernels.
stop_gradient_p = _nondiff("stop_gradient", np.positive, "({0})")


# Integer division and modulo with floor semantics (numpy's, = Halide's for a positive divisor):
# the quotient rounds toward -inf and the remainder has the divisor's sign; an integer division
# or modulo by 0 gives 0 (numpy's result, Halide's rule), never a trap.
def _floor_divide_impl(a, b):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.floor_divide(a, b)


def _mod_impl(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(a, b)


floor_divide_p = _nondiff("floor_divide", _floor_divide_impl, "core_ad_floordiv({0}, {1})")
mod_p = _elementwise(
    "mod",
    _mod_impl,
    lambda args, out, wrt: (
        _const(args[0], 1.0) if wrt[0] else None,
        neg(floor_divide(args[0], args[1])) if wrt[1] else None,
    ),
    cspell="core_ad_mod({0}, {1})",
    doc="a - b*floor(a/b); d/da = 1, d/db = -floor(a/b)",
)


def _cast_impl(x, dtype):
    return np.asarray(x).astype(dtype, copy=False)


def _cast_hinted_impl(x, dtype, in_range=False):
    return _cast_impl(x, dtype)


# ``in_range``: a compiler hint (see ``astype``); the values are those of the plain cast
cast_p = _nondiff("cast", _cast_hinted_impl)

convert_p = _elementwise(
    "convert",
    _cast_impl,
    jvp=lambda ts, args, out, nb, dtype: astype(ts[0], dtype),
    vjp=lambda ct, args, out, dtype: (astype(ct, dtype_of(args[0])),),
    doc="float-to-float conversion; the cotangent converts back",
)

# --------------------------------------------------------------------------------------------
# select


def _select_impl(c, a, b):
    return np.where(c, a, b)


def _select_jvp(ts, args, out, nb, **_):
    c, a, b = args
    ta, tb = ts[1], ts[2]
    zero = _const(out, 0.0)
    return where(c, zero if ta is None else ta, zero if tb is None else tb)


def _select_vjp(ct, args, out, **_):
    c = args[0]
    zero = _const(ct, 0.0)
    return (None, where(c, ct, zero), where(c, zero, ct))


select_p = _elementwise(
    "select",
    _select_impl,
    jvp=_select_jvp,
    vjp=_select_vjp,
    cspell="({0} ? {1} : {2})",
    doc="the adjoint goes to the selected branch only; the condition gets none",
)

# --------------------------------------------------------------------------------------------
# lane-wise op functions (public math)


def add(*xs):
    if len(xs) < 2:
        raise TypeError("add needs at least two operands")
    return _lanewise(add_p, *xs)


def mul(*xs):
    if len(xs) < 2:
        raise TypeError("mul needs at least two operands")
    return _lanewise(mul_p, *xs)


def sub(a, b):
    return _lanewise(sub_p, a, b)


def neg(x):
    return bind(neg_p, x)


def identity(x):
    return bind(identity_p, x)


def stop_gradient(x):
    """``x`` with zero derivative (forward, reverse and every order); the value is unchanged."""
    return bind(stop_gradient_p, x)


def div(a, b):
    return _lanewise(div_p, a, b)


def pow(x, y):  # noqa: A001 - numpy-like name
    return _lanewise(pow_p, x, y)


def safe_mul(a, p):
    return _lanewise(safe_mul_p, a, p)


def exp(x):
    return bind(exp_p, x)


def expm1(x):
    return bind(expm1_p, x)


def log(x):
    return bind(log_p, x)


def log1p(x):
    return bind(log1p_p, x)


def sqrt(x):
    return bind(sqrt_p, x)


def rsqrt(x):
    return bind(rsqrt_p, x)


def sin(x):
    return bind(sin_p, x)


def cos(x):
    return bind(cos_p, x)


def tan(x):
    return bind(tan_p, x)


def arcsin(x):
    return bind(asin_p, x)


def arccos(x):
    return bind(acos_p, x)


def arctan(x):
    return bind(atan_p, x)


def arctan2(y, x):
    return _lanewise(atan2_p, y, x)


def sinh(x):
    return bind(sinh_p, x)


def cosh(x):
    return bind(cosh_p, x)


def tanh(x):
    return bind(tanh_p, x)


def erf(x):
    return bind(erf_p, x)


def abs(x):  # noqa: A001
    return bind(abs_p, x)


def sign(x):
    return bind(sign_p, x)


def floor(x):
    return bind(floor_p, x)


def ceil(x):
    return bind(ceil_p, x)


def round(x):  # noqa: A001
    """Round half to even (numpy's rint); zero derivative."""
    return bind(round_p, x)


def trunc(x):
    return bind(trunc_p, x)


def maximum(a, b):
    return _lanewise(maximum_p, a, b)


def minimum(a, b):
    return _lanewise(minimum_p, a, b)


def clamp(x, lo, hi):
    return _lanewise(clamp_p, x, lo, hi)


def lt(a, b):
    return _lanewise(lt_p, a, b)


def le(a, b):
    return _lanewise(le_p, a, b)


def gt(a, b):
    return _lanewise(gt_p, a, b)


def ge(a, b):
    return _lanewise(ge_p, a, b)


def eq(a, b):
    return _lanewise(eq_p, a, b)


def ne(a, b):
    return _lanewise(ne_p, a, b)


def logical_and(a, b):
    return _lanewise(logical_and_p, a, b)


def logical_or(a, b):
    return _lanewise(logical_or_p, a, b)


def logical_not(a):
    return bind(logical_not_p, a)


def floor_divide(a, b):
    """Quotient rounded toward -inf (``a // b``); 0 for an integer division by 0."""
    return _lanewise(floor_divide_p, a, b)


def mod(a, b):
    """Remainder with the sign of ``b`` (``a % b``); 0 for an integer modulo by 0."""
    return _lanewise(mod_p, a, b)


def isfinite(x):
    return bind(isfinite_p, x)


def isnan(x):
    return bind(isnan_p, x)


def where(cond, a, b):
    """Lane-wise select; NaN-safe in both derivative modes (see module docstring)."""
    return _lanewise(select_p, cond, a, b)


def astype(x, dtype, in_range=False):
    """Cast; float-to-float casts are differentiable, casts to int/bool have zero derivative.

    ``in_range=True`` promises that a float operand cast to a signed 32/64-bit int lies inside
    that int's range or is NaN (a bin index computed from a clamped value, say): the LLVM
    backend then emits a plain truncation without the saturating range checks. The values
    are the same; a broken promise gives an unspecified in-range int, never UB."""
    dtype = np.dtype(dtype)
    if _float_dtype(x) and dtype.kind in "fc":
        if dtype_of(x) == dtype and kind_of(x) is not None:
            return x
        return bind(convert_p, x, dtype=dtype)
    if in_range:
        return bind(cast_p, x, dtype=dtype, in_range=True)
    return bind(cast_p, x, dtype=dtype)


def square(x):
    return mul(x, x)


def reciprocal(x):
    return div(_const(x, 1.0), x)


def sigmoid(x):
    return div(_const(x, 1.0), add(_const(x, 1.0), exp(neg(x))))


# --------------------------------------------------------------------------------------------
# shapes


def _broadcast_to_jvp(ts, args, out, nb, shape):
    t = ts[0]
    tshape = shape_of(t)
    lead, inner = tshape[:nb], tshape[nb:]
    pad = (1,) * (len(shape) - len(inner))
    return broadcast_to(reshape(t, lead + pad + inner), lead + tuple(shape))


def _sum_to_shape(ct, shape):
    """Sum ``ct`` over the axes that broadcasting ``shape`` to ``ct.shape`` created."""
    cshape = shape_of(ct)
    lead = len(cshape) - len(shape)
    axes = list(range(lead))
    axes += [lead + i for i, (s, c) in enumerate(zip(shape, cshape[lead:])) if s == 1 and c != 1]
    r = reduce_sum(ct, axes, keepdims=True) if axes else ct
    return reshape(r, shape) if shape_of(r) != tuple(shape) else r


broadcast_to_p = register(
    Primitive(
        "broadcast_to",
        lambda x, shape: np.broadcast_to(x, shape),
        jvp=_broadcast_to_jvp,
        vjp=lambda ct, args, out, shape: (_sum_to_shape(ct, shape_of(args[0])),),
        extra={"shape_only_vjp": True},
    )
)


def broadcast_to(x, shape):
    shape = tuple(int(s) for s in shape)
    if shape_of(x) == shape and kind_of(x) is not None:
        return x
    try:
        np.broadcast_shapes(shape_of(x), shape)
    except ValueError:
        raise ValueError(f"broadcast_to: cannot broadcast shape {shape_of(x)} to {shape}") from None
    if np.broadcast_shapes(shape_of(x), shape) != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {shape_of(x)} to {shape}")
    return bind(broadcast_to_p, x, shape=shape)


reshape_p = register(
    Primitive(
        "reshape",
        lambda x, shape: np.reshape(x, shape),
        jvp=lambda ts, args, out, nb, shape: reshape(ts[0], shape_of(ts[0])[:nb] + shape),
        vjp=lambda ct, args, out, shape: (reshape(ct, shape_of(args[0])),),
        extra={"shape_only_vjp": True},
    )
)


def reshape(x, shape):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    size = int(np.prod(shape_of(x), dtype=np.int64))
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if shape.count(-1) > 1 or known == 0 or size % known:
            raise ValueError(f"reshape: cannot reshape {shape_of(x)} into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise ValueError(f"reshape: cannot reshape {shape_of(x)} (size {size}) into {shape}")
    if shape == shape_of(x) and kind_of(x) is not None:
        return x
    return bind(reshape_p, x, shape=shape)


def _transpose_jvp(ts, args, out, nb, axes):
    return transpose(ts[0], tuple(range(nb)) + tuple(a + nb for a in axes))


transpose_p = register(
    Primitive(
        "transpose",
        lambda x, axes: np.transpose(x, axes),
        jvp=_transpose_jvp,
        vjp=lambda ct, args, out, axes: (transpose(ct, tuple(np.argsort(axes))),),
    )
)


def transpose(x, axes=None):
    nd = len(shape_of(x))
    axes = tuple(range(nd))[::-1] if axes is None else tuple(int(a) % nd for a in axes)
    if sorted(axes) != list(range(nd)):
        raise ValueError(f"transpose: {axes} is not a permutation of {nd} axes")
    return bind(transpose_p, x, axes=axes)


def swapaxes(x, a, b):
    nd = len(shape_of(x))
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def expand_dims(x, axis):
    s = list(shape_of(x))
    axis = axis if axis >= 0 else len(s) + 1 + axis
    s.insert(axis, 1)
    return reshape(x, s)


def squeeze(x, axis=None):
    s = shape_of(x)
    axes = _norm_axes(axis, len(s), "squeeze") if axis is not None else None
    keep = [d for i, d in enumerate(s) if not (d == 1 and (axes is None or i - len(s) in axes))]
    return reshape(x, keep)


def _concat_impl(*xs, axis):
    return np.concatenate(xs, axis=axis)


def _concat_vjp(ct, args, out, axis):
    res, start = [], 0
    for a in args:
        n = shape_of(a)[axis]
        idx = [slice(None)] * len(shape_of(ct))
        idx[axis] = slice(start, start + n)
        res.append(getitem(ct, tuple(idx)))
        start += n
    return tuple(res)


def _concat_jvp(ts, args, out, nb, axis):
    parts = []
    for t, a in zip(ts, args):
        if t is None:
            lead = next(shape_of(u)[:nb] for u in ts if u is not None)
            t = np.zeros(lead + shape_of(a), dtype=dtype_of(out))
        parts.append(t)
    return concatenate(parts, axis=axis)


concatenate_p = register(
    Primitive(
        "concatenate", _concat_impl, jvp=_concat_jvp, vjp=_concat_vjp, variadic=True
    )
)


def concatenate(arrays, axis=0):
    arrays = tuple(arrays)
    nd = len(shape_of(arrays[0]))
    axis = _norm_axes(axis, nd, "concatenate")[0]
    for a in arrays[1:]:
        sa, s0 = shape_of(a), shape_of(arrays[0])
        if len(sa) != nd or builtins.any(
            x != y for i, (x, y) in enumerate(zip(sa, s0)) if i - nd != axis
        ):
            raise ValueError(f"concatenate: shapes {s0} and {sa} differ off axis {axis}")
    return bind(concatenate_p, *arrays, axis=axis)


def stack(arrays, axis=0):
    arrays = tuple(arrays)
    nd = len(shape_of(arrays[0])) + 1
    ax = axis if axis >= 0 else nd + axis
    return concatenate([expand_dims(a, ax) for a in arrays], axis=ax)


# --------------------------------------------------------------------------------------------
# reductions


def _keepdims_shape(shape, axes):
    nd = len(shape)
    return tuple(1 if i - nd in axes else d for i, d in enumerate(shape))


def _sum_vjp(ct, args, out, axes, keepdims):
    xs = shape_of(args[0])
    if not keepdims:
        ct = reshape(ct, _keepdims_shape(xs, axes))
    return (broadcast_to(ct, xs),)


reduce_sum_p = register(
    Primitive(
        "reduce_sum",
        lambda x, axes, keepdims: np.sum(x, axis=axes, keepdims=keepdims),
        jvp=lambda ts, args, out, nb, axes, keepdims: reduce_sum(ts[0], axes, keepdims),
        vjp=_sum_vjp,
        # the vjp reads shapes only: a lazy sweep need not compute the operand first
        extra={"shape_only_vjp": True},
    )
)


def reduce_sum(x, axes, keepdims=False):
    # negative axes, so that the rules also apply to tangents with leading direction axes
    axes = _norm_axes(tuple(axes), len(shape_of(x)), "reduce_sum") if len(axes) else ()
    return bind(reduce_sum_p, x, axes=axes, keepdims=keepdims)


def _extremum_weights(x, out, axes, keepdims):
    """Weights of each entry in a max/min reduction: ties share equally."""
    xs = shape_of(x)
    o = out if keepdims else reshape(out, _keepdims_shape(xs, axes))
    hit = astype(eq(x, o), dtype_of(x))
    count = reduce_sum(hit, axes, keepdims=True)
    return div(hit, count)


def _extremum_vjp(ct, args, out, axes, keepdims):
    w = _extremum_weights(_value(args[0]), _value(out), axes, keepdims)
    return (mul(_sum_vjp(ct, args, out, axes, keepdims)[0], w),)


def _extremum_jvp(ts, args, out, nb, axes, keepdims):
    w = _extremum_weights(_value(args[0]), _value(out), axes, keepdims)
    return reduce_sum(mul(ts[0], w), axes, keepdims)


def _value(x):
    """The concrete value behind a traced array (selection weights are constants)."""
    return getattr(x, "value", x)


reduce_max_p = register(
    Primitive(
        "reduce_max",
        lambda x, axes, keepdims: np.max(x, axis=axes, keepdims=keepdims),
        jvp=_extremum_jvp,
        vjp=_extremum_vjp,
        doc="ties share the derivative equally",
    )
)
reduce_min_p = register(
    Primitive(
        "reduce_min",
        lambda x, axes, keepdims: np.min(x, axis=axes, keepdims=keepdims),
        jvp=_extremum_jvp,
        vjp=_extremum_vjp,
        doc="ties share the derivative equally",
    )
)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    nd = len(shape_of(x))
    if kind_of(x) is None:
        return np.sum(x, axis=axis, keepdims=keepdims)
    return reduce_sum(x, _norm_axes(axis, nd, "sum"), keepdims)


def mean(x, axis=None, keepdims=False):
    s = shape_of(x)
    axes = _norm_axes(axis, len(s), "mean")
    n = int(np.prod([s[a] for a in axes], dtype=np.int64))
    return div(sum(x, axis=axes, keepdims=keepdims), _const(x, float(n)))


def max(x, axis=None, keepdims=False):  # noqa: A001
    if len(shape_of(x)) == 0 or int(np.prod(shape_of(x))) == 0:
        raise ValueError(f"max: zero-size or 0-d input of shape {shape_of(x)}")
    axes = _norm_axes(axis, len(shape_of(x)), "max")
    return bind(reduce_max_p, x, axes=axes, keepdims=keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    if len(shape_of(x)) == 0 or int(np.prod(shape_of(x))) == 0:
        raise ValueError(f"min: zero-size or 0-d input of shape {shape_of(x)}")
    axes = _norm_axes(axis, len(shape_of(x)), "min")
    return bind(reduce_min_p, x, axes=axes, keepdims=keepdims)


def prod(x, axis=None, keepdims=False):
    """Product reduction as a balanced tree of multiplies: exact derivatives, also at zeros."""
    s = shape_of(x)
    axes = _norm_axes(axis, len(s), "prod")
    nd = len(s)
    keep = [i for i in range(nd) if i - nd not in axes]
    red = [i for i in range(nd) if i - nd in axes]
    m = int(np.prod([s[i] for i in red], dtype=np.int64))
    y = reshape(transpose(x, keep + red), tuple(s[i] for i in keep) + (m,))
    n = 1
    while n < m:
        n *= 2
    if n > m:
        pad = np.ones(tuple(s[i] for i in keep) + (n - m,), dtype=dtype_of(x))
        y = concatenate([y, pad], axis=-1)
    while n > 1:
        n //= 2
        y = mul(getitem(y, (Ellipsis, slice(0, n))), getitem(y, (Ellipsis, slice(n, 2 * n))))
    y = reshape(y, tuple(s[i] for i in keep))
    if keepdims:
        y = reshape(y, _keepdims_shape(s, axes))
    return y


# --------------------------------------------------------------------------------------------
# indexing


def _canon_index(index):
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if kind_of(i) is not None:
            i = _value(i)
        if isinstance(i, list):
            i = np.asarray(i)
        if isinstance(i, np.ndarray) and i.dtype.kind not in "iub":
            raise IndexError(f"index arrays must be integer or bool, got dtype {i.dtype}")
        out.append(i)
    return tuple(out)


def _is_basic(index):
    return not builtins.any(isinstance(i, np.ndarray) for i in index)


def _prefix_ok(index):
    """Whether ``(slice(None),) * nb + index`` indexes each direction like ``index`` does.

    True unless advanced indices (arrays, and integers combined with arrays) are separated by a
    slice, ``Ellipsis`` or ``None``: numpy then moves their axes to the front, ahead of the
    direction axes.
    """
    if _is_basic(index):
        return True
    pos = [
        k for k, i in enumerate(index)
        if isinstance(i, (np.ndarray, int, np.integer)) and not isinstance(i, bool)
    ]
    return pos[-1] - pos[0] == len(pos) - 1


def _getitem_jvp(ts, args, out, nb, index):
    t = ts[0]
    if nb == 0 or _prefix_ok(index):
        return getitem(t, (slice(None),) * nb + index)
    return stack([getitem(getitem(t, k), index) for k in range(shape_of(t)[0])])


getitem_p = register(
    Primitive(
        "getitem",
        lambda x, index: x[index],
        jvp=_getitem_jvp,
        vjp=lambda ct, args, out, index: (index_add(ct, index, shape_of(args[0])),),
    )
)


def getitem(x, index):
    index = _canon_index(index)
    return bind(getitem_p, x, index=index)


def _index_add_impl(ct, index, shape):
    out = np.zeros(shape, dtype=np.result_type(ct))
    if _is_basic(index):
        out[index] += ct
    else:
        np.add.at(out, index, ct)
    return out


def _index_add_jvp(ts, args, out, nb, index, shape):
    t = ts[0]
    lead = shape_of(t)[:nb]
    if nb == 0 or _prefix_ok(index):
        return index_add(t, (slice(None),) * nb + index, lead + shape)
    return stack([index_add(getitem(t, k), index, shape) for k in range(lead[0])])


index_add_p = register(
    Primitive(
        "index_add",
        _index_add_impl,
        jvp=_index_add_jvp,
        vjp=lambda ct, args, out, index, shape: (getitem(ct, index),),
        doc="zeros(shape) with ct added at index (duplicates accumulate); getitem's transpose",
    )
)


def index_add(ct, index, shape):
    return bind(index_add_p, ct, index=_canon_index(index), shape=tuple(shape))


def _check_indices(indices, size, opname, name):
    idx = np.asarray(indices)
    if idx.size == 0 and idx.dtype.kind == "f":  # an empty list: no entries to type-check
        idx = idx.astype(np.int64)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{opname}: indices must be an integer array, got dtype {idx.dtype}")
    if idx.size:
        bad = (idx < 0) | (idx >= size)
        if bad.any():
            pos = np.unravel_index(int(np.argmax(bad)), idx.shape)
            what = f" of array {name!r}" if name else ""
            raise IndexError(
                f"{opname}: index {int(idx[pos])} at position {tuple(int(p) for p in pos)} is out"
                f" of range for axis of size {size}{what}"
            )
    return idx


def _axis_index(ndim, axis, idx):
    return (slice(None),) * (ndim + axis) + (idx,)


def _take_impl(x, indices, axis, name):
    return np.take(x, indices, axis=axis)


def _zeros_like_on(x, dtype, lead=()):
    """Zeros of shape ``lead + x.shape`` on ``x``'s device (numpy, or CuPy for device data)."""
    xp = sys.modules["cupy"] if on_device(x) else np
    return xp.zeros(tuple(lead) + shape_of(x), dtype=dtype)


take_p = register(
    Primitive(
        "take",
        _take_impl,
        jvp=lambda ts, args, out, nb, indices, axis, name: take(ts[0], indices, axis, name),
        vjp=lambda ct, args, out, indices, axis, name: (
            scatter_add(_zeros_like_on(args[0], dtype_of(ct)), indices, ct, axis, name),
        ),
        doc="gather along one axis; reverse mode is scatter_add (duplicates accumulate)",
    )
)


def take(x, indices, axis=0, name=None):
    """Gather ``x`` along ``axis`` at integer ``indices`` (bounds-checked, no wrap-around)."""
    s = shape_of(x)
    ax = _norm_axes(axis, len(s), "take")[0]
    name = name or getattr(x, "name", None)
    if on_device(x) or on_device(indices):
        return bind(take_p, x, indices=_device_indices(indices, s[ax], "take", name), axis=ax,
                    name=name)
    idx = _check_indices(_value(indices), s[ax], "take", name)
    return bind(take_p, x, indices=idx, axis=ax, name=name)


def _device_indices(indices, size, opname, name):
    """Indices of a gather / scatter on device data: a CuPy array or a traced Array over one
    (maybe pending: checked in the fused kernel, whose error names the array and the lane);
    host indices are checked here and uploaded."""
    if on_device(indices):
        if dtype_of(indices).kind not in "iu":
            raise TypeError(f"{opname}: indices must be an integer array, got dtype"
                            f" {dtype_of(indices)}")
        return indices
    return sys.modules["cupy"].asarray(_check_indices(_value(indices), size, opname, name))


gather = take


def _scatter_add_impl(target, values, indices, axis, name):
    out = np.array(target, dtype=np.result_type(target, values), copy=True)
    np.add.at(out, _axis_index(out.ndim, axis, indices), values)
    return out


def _scatter_add_jvp(ts, args, out, nb, indices, axis, name):
    tt, tv = ts
    if tt is None:
        tt = _zeros_like_on(args[0], dtype_of(out), shape_of(tv)[:nb])
    if tv is None:
        return tt
    return scatter_add(tt, indices, tv, axis, name)


scatter_add_p = register(
    Primitive(
        "scatter_add",
        _scatter_add_impl,
        jvp=_scatter_add_jvp,
        vjp=lambda ct, args, out, indices, axis, name: (ct, take(ct, indices, axis, name)),
        doc="target with values added at indices along axis; reverse mode gathers",
    )
)


def _values_shape(tshape, ax, idx_shape):
    nd = len(tshape)
    a = nd + ax
    return tshape[:a] + idx_shape + tshape[a + 1 :]


def _values_to(values, want, opname):
    """``values`` broadcast to the indexed shape ``want``; a ValueError naming both otherwise."""
    if kind_of(values) is None and not is_device_array(values):
        values = np.asarray(values)
    if shape_of(values) == want:
        return values
    try:
        return (broadcast_to(values, want) if kind_of(values)
                else array_module(values).broadcast_to(values, want))
    except ValueError:
        raise ValueError(
            f"{opname}: values of shape {shape_of(values)} do not broadcast to the indexed shape"
            f" {want}"
        ) from None


def scatter_add(target, indices, values, axis=0, name=None):
    """``target`` with ``values`` accumulated at ``indices`` along ``axis`` (new array)."""
    s = shape_of(target)
    ax = _norm_axes(axis, len(s), "scatter_add")[0]
    name = name or getattr(target, "name", None)
    if on_device(target) or on_device(indices) or on_device(values):
        idx = _device_indices(indices, s[ax], "scatter_add", name)
    else:
        idx = _check_indices(_value(indices), s[ax], "scatter_add", name)
    values = _values_to(values, _values_shape(s, ax, shape_of(idx)), "scatter_add")
    return bind(scatter_add_p, target, values, indices=idx, axis=ax, name=name)


def _last_writer_mask(idx):
    """True at the last occurrence of each index (the one whose write survives)."""
    flat = idx.reshape(-1)
    rev = flat[::-1]
    _, first_in_rev = np.unique(rev, return_index=True)
    mask = np.zeros(flat.shape, dtype=bool)
    mask[flat.size - 1 - first_in_rev] = True
    return mask.reshape(idx.shape)


def _scatter_impl(target, values, indices, axis, name):
    out = np.array(target, dtype=np.result_type(target, values), copy=True)
    win = _last_writer_mask(indices)
    sel = _axis_index(out.ndim, axis, indices[win])
    vals = np.take(np.broadcast_to(values, _values_shape(out.shape, axis, indices.shape)),
                   np.flatnonzero(win.reshape(-1)), axis=axis) if indices.ndim == 1 else None
    if vals is None:
        raise NotImplementedError("scatter: only 1-D index arrays are supported")
    out[sel] = vals
    return out


def _scatter_vjp(ct, args, out, indices, axis, name):
    target = args[0]
    zeros = np.zeros(_values_shape(shape_of(target), axis, indices.shape), dtype=dtype_of(ct))
    ct_target = scatter(ct, indices, zeros, axis, name)
    win = _last_writer_mask(indices).astype(dtype_of(ct))
    shape = [1] * len(shape_of(ct))
    shape[axis] = win.size
    ct_values = mul(take(ct, indices, axis, name), win.reshape(shape))
    return (ct_target, ct_values)


def _scatter_jvp(ts, args, out, nb, indices, axis, name):
    tt, tv = ts
    lead = shape_of(tt if tt is not None else tv)[:nb]
    if tt is None:
        tt = np.zeros(lead + shape_of(args[0]), dtype=dtype_of(out))
    if tv is None:
        tv = np.zeros(lead + shape_of(args[1]), dtype=dtype_of(out))
    return scatter(tt, indices, tv, axis, name)


scatter_p = register(
    Primitive(
        "scatter",
        _scatter_impl,
        jvp=_scatter_jvp,
        vjp=_scatter_vjp,
        doc="overwrite at indices; with duplicate indices the last writer wins, and only it"
        " receives a cotangent; overwritten target entries receive none",
    )
)


def scatter(target, indices, values, axis=0, name=None):
    """``target`` with entries at ``indices`` along ``axis`` replaced by ``values``."""
    s = shape_of(target)
    ax = _norm_axes(axis, len(s), "scatter")[0]
    name = name or getattr(target, "name", None)
    idx = _check_indices(_value(indices), s[ax], "scatter", name)
    if idx.ndim != 1:
        raise ValueError(f"scatter: indices must be 1-D, got shape {idx.shape}")
    values = _values_to(values, _values_shape(s, ax, idx.shape), "scatter")
    return bind(scatter_p, target, values, indices=idx, axis=ax, name=name)


# --------------------------------------------------------------------------------------------
# kernel indexing: per-lane reads from and accumulations into whole buffers
#
# In lane-wise kernels (core_ad.sym) a *buffer* is an input that is not a lane: an array read
# at a per-lane integer index (``lane_gather``) or accumulated into at one
# (``lane_scatter_add``). Their ``extra["buffer_args"]`` names the buffer operands so code
# generators pass them whole; indices are bounds-checked, never wrapped. Differentiate an
# expression with respect to a gather node itself (``sym.diff(e, g)``): its adjoint is an
# accumulation at the same index, which the DSL built on top schedules (Halide's
# scatter-to-gather). Derivatives with respect to the buffer operand raise.


def _buffer_derivative(*_, **__):
    raise NotImplementedError(
        "lane_gather / lane_scatter_add: no derivative with respect to a whole buffer;"
        " differentiate with respect to the gather node (sym.diff(e, gather_node)), or use"
        " core_ad.numpy.take / scatter_add on traced arrays"
    )


def _lane_gather_jvp(ts, args, out, nb, name=None):
    if ts[0] is not None:
        _buffer_derivative()
    return None


def _lane_gather_impl(buffer, index, name=None):
    b = np.asarray(buffer)
    if b.ndim != 1:
        raise ValueError(f"lane_gather: buffer must be 1-D, got shape {b.shape}")
    idx = _check_indices(index, b.shape[0], "gather", name)
    return b[idx]


lane_gather_p = _elementwise(
    "lane_gather",
    _lane_gather_impl,
    jvp=_lane_gather_jvp,
    vjp=lambda ct, args, out, name=None: _buffer_derivative(),
    doc="per-lane read buffer[index] (bounds-checked)",
    extra={"buffer_args": (0,), "out_dtype": lambda dts, **_: dts[0], "fold": False},
)


def _lane_scatter_add_impl(buffer, index, value, name=None):
    b = np.asarray(buffer)
    if b.ndim != 1:
        raise ValueError(f"lane_scatter_add: buffer must be 1-D, got shape {b.shape}")
    idx = _check_indices(index, b.shape[0], "scatter_add", name)
    out = b.copy()
    np.add.at(out, idx, np.broadcast_to(np.asarray(value, dtype=b.dtype), idx.shape))
    return out


lane_scatter_add_p = _elementwise(
    "lane_scatter_add",
    _lane_scatter_add_impl,
    jvp=lambda ts, args, out, nb, name=None: _buffer_derivative(),
    vjp=lambda ct, args, out, name=None: _buffer_derivative(),
    doc="a copy of buffer with every lane's value added at its index (duplicates accumulate)",
    extra={"buffer_args": (0,), "scatter": True, "out_dtype": lambda dts, **_: dts[0],
           "fold": False},
)


def _lane_sum_impl(value):
    v = np.asarray(value)
    return np.asarray(np.sum(v, dtype=v.dtype))


lane_sum_p = _elementwise(
    "lane_sum",
    _lane_sum_impl,
    jvp=lambda ts, args, out, nb: None if ts[0] is None else lane_sum(ts[0]),
    vjp=lambda ct, args, out: (ct,),
    doc="the sum of value over all lanes of a kernel (a kernel output, not a lane value)",
    extra={"reduction": True, "fold": False},
)


def lane_gather(buffer, index, name=None):
    """Per-lane ``buffer[index]`` in a kernel; out-of-range indices raise IndexError."""
    return bind(lane_gather_p, buffer, index, name=name)


def lane_scatter_add(buffer, index, value, name=None):
    """A copy of ``buffer`` with each lane's ``value`` added at its ``index`` (a kernel output)."""
    return bind(lane_scatter_add_p, buffer, index, value, name=name)


def lane_sum(value):
    """The sum of ``value`` over every lane of a kernel (a kernel output, a scalar)."""
    return bind(lane_sum_p, value)


# --------------------------------------------------------------------------------------------
# linear algebra


def _matmul_vjp(ct, args, out):
    a, b = args
    sa, sb = shape_of(a), shape_of(b)
    a2 = expand_dims(a, 0) if len(sa) == 1 else a
    b2 = expand_dims(b, -1) if len(sb) == 1 else b
    c2 = ct
    if len(sa) == 1:
        c2 = expand_dims(c2, -2)
    if len(sb) == 1:
        c2 = expand_dims(c2, -1)
    ga = matmul(c2, swapaxes(b2, -1, -2))
    gb = matmul(swapaxes(a2, -1, -2), c2)
    ga = _sum_to_shape(ga, shape_of(a2))
    gb = _sum_to_shape(gb, shape_of(b2))
    if len(sa) == 1:
        ga = reshape(ga, sa)
    if len(sb) == 1:
        gb = reshape(gb, sb)
    return (ga, gb)


def _matmul_jvp(ts, args, out, nb, **_):
    a, b = args
    ta, tb = ts
    if nb:
        k = shape_of(ta if ta is not None else tb)[0]
        return stack(
            [
                _matmul_jvp(
                    [None if t is None else getitem(t, j) for t in ts], args, out, 0
                )
                for j in range(k)
            ]
        )
    terms = []
    if ta is not None:
        terms.append(matmul(ta, b))
    if tb is not None:
        terms.append(matmul(a, tb))
    return terms[0] if len(terms) == 1 else add(*terms)


matmul_p = register(Primitive("matmul", np.matmul, jvp=_matmul_jvp, vjp=_matmul_vjp))


def matmul(a, b):
    sa, sb = shape_of(a), shape_of(b)
    if not sa or not sb:
        raise ValueError("matmul: operands must have at least one dimension")
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        raise ValueError(f"matmul: inner dimensions differ, shapes {sa} and {sb}")
    return bind(matmul_p, a, b)


def dot(a, b):
    if len(shape_of(a)) == 0 or len(shape_of(b)) == 0:
        return mul(a, b)
    return matmul(a, b)


def _norm_impl(x, axes, keepdims):
    return np.sqrt(np.sum(x * x, axis=axes, keepdims=keepdims))


def _norm_weights(x, out, axes, keepdims):
    o = out if keepdims else reshape(out, _keepdims_shape(shape_of(x), axes))
    safe = where(gt(o, _const(o, 0.0)), o, _const(o, np.inf))
    return div(x, safe)


def _norm_vjp(ct, args, out, axes, keepdims):
    return (mul(_sum_vjp(ct, args, out, axes, keepdims)[0], _norm_weights(args[0], out, axes,
                                                                           keepdims)),)


def _norm_jvp(ts, args, out, nb, axes, keepdims):
    return reduce_sum(mul(ts[0], _norm_weights(args[0], out, axes, keepdims)), axes, keepdims)


norm_p = register(
    Primitive(
        "norm",
        _norm_impl,
        jvp=_norm_jvp,
        vjp=_norm_vjp,
        doc="Euclidean norm; zero derivative at the zero vector",
    )
)


def norm(x, axis=None, keepdims=False):
    axes = _norm_axes(axis, len(shape_of(x)), "norm")
    return bind(norm_p, x, axes=axes, keepdims=keepdims)


def normalize(x, axis=-1):
    return div(x, norm(x, axis=axis, keepdims=True))


def cross(a, b):
    """Cross product over the last axis (size 3)."""
    if shape_of(a)[-1:] != (3,) or shape_of(b)[-1:] != (3,):
        raise ValueError(f"cross: last axis must have size 3, got {shape_of(a)}, {shape_of(b)}")

    def c(v, i):
        return getitem(v, (Ellipsis, i))

    return stack(
        [
            sub(mul(c(a, 1), c(b, 2)), mul(c(a, 2), c(b, 1))),
            sub(mul(c(a, 2), c(b, 0)), mul(c(a, 0), c(b, 2))),
            sub(mul(c(a, 0), c(b, 1)), mul(c(a, 1), c(b, 0))),
        ],
        axis=-1,
    )


