"""Expressions: a Halide-typed wrapper around core_ad's symbolic expressions.

Every :class:`Expr` holds one hash-consed ``core_ad.sym`` node (``.node``); arithmetic follows
Halide's type rules (see :func:`~halide_ad._types.common_type`), then builds the core_ad node,
so simplification, CSE and (in the AD issue) derivatives come from core_ad's one rule table.

Leaves of the node graph:

* a pure ``Var`` is ``sym.leaf("hl.var", name, int32)`` (Vars are identified by name, as in
  Halide), an ``RVar`` is ``sym.leaf("hl.rvar", (rdom id, dim), int32)``, a scalar ``Param``
  is ``sym.leaf("hl.param", unique name, dtype)``;
* a call of a Func or a Buffer ``f[x + 1, y]`` is ``sym.call(CALL, x + 1, y, fid=..., index=k)``
  with the core_ad primitive :data:`CALL` (integer operands, value of the callee's type).
"""

from __future__ import annotations

import itertools
import numbers
import weakref

import numpy as np
from core_ad import Primitive, sym

from ._types import Float, Int, Type, UInt, common_type, type_of_dtype

__all__ = [
    "CALL",
    "Expr",
    "ExprError",
    "Param",
    "RDom",
    "RVar",
    "Range",
    "Var",
    "abs",
    "as_expr",
    "cast",
    "clamp",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "is_call",
    "is_param",
    "is_rvar",
    "is_var",
    "lerp",
    "max",
    "min",
    "select",
    "u8",
    "u16",
    "u32",
    "u64",
]


class ExprError(TypeError):
    """An expression is malformed (a type mismatch, a Python bool of an Expr, ...)."""


def _call_impl(*args, **params):
    raise ExprError("halide_ad call nodes are evaluated by compiled pipelines, not by numpy")


#: The primitive of a Func / Buffer call: operands are int32 coordinates; params ``fid``
#: (the callee's unique id) and ``index`` (tuple component).
CALL = Primitive(
    "hl_call",
    _call_impl,
    partials=lambda args, out, wrt, **p: (None,) * len(args),
    elementwise=True,
    extra={"fold": False},
)

_uid = itertools.count()


def unique_name(prefix: str) -> str:
    return f"{prefix}${next(_uid)}"


def creation_index(name: str) -> int:
    """The counter of a ``unique_name``: names made earlier sort first."""
    return int(name.rsplit("$", 1)[1])


def is_call(n) -> bool:
    return getattr(n, "prim", None) is CALL


def is_var(n) -> bool:
    return getattr(n, "kind", None) == "hl.var"


def is_rvar(n) -> bool:
    return getattr(n, "kind", None) == "hl.rvar"


def is_param(n) -> bool:
    return getattr(n, "kind", None) == "hl.param"


class Expr:
    """A typed scalar expression. ``Expr(3)`` is Int(32), ``Expr(1.5)`` Float(32) (Halide's
    literal rules); ``Expr(e)`` of an Expr is ``e``'s node."""

    __slots__ = ("_node",)
    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(self, value=None, _node=None):
        if _node is None:
            _node = as_expr(value).node
        self._node = _node

    @property
    def node(self):
        return self._node

    def type(self) -> Type:
        return type_of_dtype(self.node.dtype)

    def __repr__(self):
        return f"Expr({sym.to_str(self.node, limit=200)}: {self.type()})"

    def __bool__(self):
        raise ExprError(
            "an Expr has no Python truth value (use hl.select for conditionals and &, |, ~ for"
            " logic)"
        )

    __hash__ = None  # == builds a comparison, as in Halide

    # arithmetic ----------------------------------------------------------------------------
    def __add__(self, o):
        a, b = _coerce(self, o)
        return _wrap(a + b)

    def __radd__(self, o):
        a, b = _coerce(o, self)
        return _wrap(a + b)

    def __sub__(self, o):
        a, b = _coerce(self, o)
        return _wrap(a - b)

    def __rsub__(self, o):
        a, b = _coerce(o, self)
        return _wrap(a - b)

    def __mul__(self, o):
        a, b = _coerce(self, o)
        return _wrap(a * b)

    def __rmul__(self, o):
        a, b = _coerce(o, self)
        return _wrap(a * b)

    def __truediv__(self, o):
        return _divide(*_coerce(self, o))

    def __rtruediv__(self, o):
        return _divide(*_coerce(o, self))

    def __floordiv__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.floor_divide(a, b))

    def __rfloordiv__(self, o):
        a, b = _coerce(o, self)
        return _wrap(sym.floor_divide(a, b))

    def __mod__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.mod(a, b))

    def __rmod__(self, o):
        a, b = _coerce(o, self)
        return _wrap(sym.mod(a, b))

    def __pow__(self, o):
        return pow(self, o)

    def __rpow__(self, o):
        return pow(o, self)

    def __neg__(self):
        return _wrap(-self.node)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    # comparisons and logic -----------------------------------------------------------------
    def __lt__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.lt(a, b))

    def __le__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.le(a, b))

    def __gt__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.gt(a, b))

    def __ge__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.ge(a, b))

    def __eq__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.eq(a, b))

    def __ne__(self, o):
        a, b = _coerce(self, o)
        return _wrap(sym.ne(a, b))

    def __and__(self, o):
        return _wrap(sym.logical_and(_bool(self), _bool(o)))

    __rand__ = __and__

    def __or__(self, o):
        return _wrap(sym.logical_or(_bool(self), _bool(o)))

    __ror__ = __or__

    def __invert__(self):
        return _wrap(sym.logical_not(_bool(self)))


def _wrap(node) -> Expr:
    return Expr(_node=node)


def _bool(v):
    e = as_expr(v)
    if not e.type().is_bool():
        raise ExprError(f"logical operators need boolean operands, got {e.type()}")
    return e.node


def as_expr(v) -> Expr:
    """``v`` as an Expr: an Expr (or Var, Param, Func call), a Python bool (Bool()), int
    (Int(32)), float (Float(32)), or a numpy scalar (its own type)."""
    if isinstance(v, Expr):
        return v
    conv = getattr(v, "_as_expr", None)  # Func references, Params
    if conv is not None:
        return conv()
    if isinstance(v, (bool, np.bool_)):
        return _wrap(sym.const(bool(v), np.bool_))
    if isinstance(v, np.generic):
        return _wrap(sym.const(v.item(), v.dtype))
    if isinstance(v, numbers.Integral):
        if not -(2**31) <= int(v) < 2**31:
            raise ExprError(f"integer literal {v} does not fit Int(32); use hl.i64(...)")
        return _wrap(sym.const(int(v), np.int32))
    if isinstance(v, numbers.Real):
        return _wrap(sym.const(float(v), np.float32))
    raise ExprError(f"cannot convert {type(v).__name__} to an Expr")


def _literal(v, t: Type):
    """A Python number as a constant of type ``t`` (Halide's literal coercion)."""
    if isinstance(v, (bool, np.bool_)):
        return sym.const(v, t.dtype)
    if isinstance(v, numbers.Integral):
        if t.is_float():
            return sym.const(float(v), t.dtype)
        if not t.min() <= int(v) <= t.max():
            raise ExprError(f"integer literal {v} does not fit {t}")
        return sym.const(int(v), t.dtype)
    if isinstance(v, numbers.Real):
        return sym.const(float(v), t.dtype if t.is_float() else np.float32)
    return None


def _is_literal(v) -> bool:
    return isinstance(v, (numbers.Number, np.bool_)) and not isinstance(v, np.generic)


def _coerce(a, b):
    """Two sym nodes of one common type (Halide's rules; literals take the other's type)."""
    if _is_literal(a) and not _is_literal(b):
        eb = as_expr(b)
        la = _literal(a, eb.type())
        return _coerce(_wrap(la), eb)
    if _is_literal(b) and not _is_literal(a):
        ea = as_expr(a)
        lb = _literal(b, ea.type())
        return _coerce(ea, _wrap(lb))
    ea, eb = as_expr(a), as_expr(b)
    t = common_type(ea.type(), eb.type())
    return _to(ea.node, t), _to(eb.node, t)


def _to(node, t: Type):
    return node if node.dtype == t.dtype else sym.astype(node, t.dtype)


def _divide(a, b) -> Expr:
    """Halide's ``/``: floor division on integers, true division on floats."""
    if a.dtype.kind in "iu":
        return _wrap(sym.floor_divide(a, b))
    if a.dtype.kind == "b":
        raise ExprError("division of booleans")
    return _wrap(a / b)


def _float(v) -> Expr:
    """Math functions take floats: integers are converted to Float(32), as in Halide."""
    e = as_expr(v)
    return e if e.type().is_float() else cast(Float(32), e)


# --------------------------------------------------------------------------------------------
# functions


def cast(t, v) -> Expr:
    """``hl.cast(hl.Float(32), e)``: float to int truncates toward zero (as C and Halide)."""
    if not isinstance(t, Type):
        t = type_of_dtype(t)
    if _is_literal(v) and not (isinstance(v, float) and not t.is_float()):
        return _wrap(_literal(v, t))
    e = as_expr(v)
    return _wrap(_to(e.node, t))


def _caster(t):
    def f(v):
        return cast(t, v)

    f.__name__ = f"{t.code[0] if t.code != 'uint' else 'u'}{t.bits}"
    f.__doc__ = f"cast to {t}"
    return f


f32, f64 = _caster(Float(32)), _caster(Float(64))
i8, i16, i32, i64 = (_caster(Int(b)) for b in (8, 16, 32, 64))
u8, u16, u32, u64 = (_caster(UInt(b)) for b in (8, 16, 32, 64))


def select(*args) -> Expr:
    """``select(c, a, b)``, or multi-way ``select(c0, v0, c1, v1, ..., default)``."""
    if len(args) < 3 or len(args) % 2 == 0:
        raise ExprError(
            f"select takes (cond, true_value, false_value) or (c0, v0, c1, v1, ..., default);"
            f" got {len(args)} arguments"
        )
    if len(args) > 3:
        return select(args[0], args[1], select(*args[2:]))
    c, a, b = args
    cn = _bool(c)
    an, bn = _coerce(a, b)
    return _wrap(sym.where(cn, an, bn))


def min(a, b, *more) -> Expr:
    x, y = _coerce(a, b)
    r = _wrap(sym.minimum(x, y))
    return min(r, *more) if more else r


def max(a, b, *more) -> Expr:
    x, y = _coerce(a, b)
    r = _wrap(sym.maximum(x, y))
    return max(r, *more) if more else r


def clamp(x, lo, hi) -> Expr:
    """``clamp(x, lo, hi)``: the bounds take ``x``'s type."""
    e = as_expr(x)
    t = e.type()
    lo_e = _wrap(_literal(lo, t)) if _is_literal(lo) else cast(t, lo)
    hi_e = _wrap(_literal(hi, t)) if _is_literal(hi) else cast(t, hi)
    return _wrap(sym.clamp(e.node, lo_e.node, hi_e.node))


def abs(x) -> Expr:
    """Absolute value (of the operand's type; Halide returns an unsigned type for ints)."""
    return _wrap(sym.abs(as_expr(x).node))


def lerp(a, b, w) -> Expr:
    """``a + (b - a) * w`` for float operands."""
    x, y = _coerce(a, b)
    wt = _float(w) if not _is_literal(w) else _wrap(_literal(w, type_of_dtype(x.dtype)))
    xe, ye = _wrap(x), _wrap(y)
    return xe + (ye - xe) * cast(xe.type(), wt)


def pow(a, b) -> Expr:
    x, y = _coerce(_float(a) if not _is_literal(a) else a, b if _is_literal(b) else _float(b))
    return _wrap(sym.pow(x, y))


def atan2(y, x) -> Expr:
    a, b = _coerce(_float(y), _float(x))
    return _wrap(sym.arctan2(a, b))


def _math1(name, fn):
    def f(x):
        return _wrap(fn(_float(x).node))

    f.__name__ = name
    return f


exp = _math1("exp", sym.exp)
log = _math1("log", sym.log)
sqrt = _math1("sqrt", sym.sqrt)
sin = _math1("sin", sym.sin)
cos = _math1("cos", sym.cos)
tan = _math1("tan", sym.tan)
asin = _math1("asin", sym.arcsin)
acos = _math1("acos", sym.arccos)
atan = _math1("atan", sym.arctan)
sinh = _math1("sinh", sym.sinh)
cosh = _math1("cosh", sym.cosh)
tanh = _math1("tanh", sym.tanh)
erf = _math1("erf", sym.erf)
floor = _math1("floor", sym.floor)
ceil = _math1("ceil", sym.ceil)
round = _math1("round", sym.round)
trunc = _math1("trunc", sym.trunc)
asinh = _math1("asinh", lambda x: sym.log(x + sym.sqrt(x * x + 1.0)))
acosh = _math1("acosh", lambda x: sym.log(x + sym.sqrt(x * x - 1.0)))
atanh = _math1("atanh", lambda x: 0.5 * sym.log((1.0 + x) / (1.0 - x)))
fast_exp, fast_log = exp, log


def is_nan(x) -> Expr:
    return _wrap(sym.isnan(_float(x).node))


def is_finite(x) -> Expr:
    return _wrap(sym.isfinite(_float(x).node))


# --------------------------------------------------------------------------------------------
# variables


class Var(Expr):
    """A pure variable ``hl.Var("x")``; Vars with one name are one variable."""

    __slots__ = ("_name",)

    def __init__(self, name: str | None = None):
        self._name = name if name is not None else unique_name("v")
        if not isinstance(self._name, str):
            raise ExprError(f"Var name must be a string, got {type(name).__name__}")
        super().__init__(_node=sym.leaf("hl.var", self._name, np.int32))

    def name(self) -> str:
        return self._name

    def __repr__(self):
        return f"Var({self._name!r})"

    @staticmethod
    def implicit(i: int) -> Var:
        return Var(f"_{i}")


class RVar(Expr):
    """One dimension of an :class:`RDom` (``r.x``, ``r[1]``)."""

    __slots__ = ("dim", "rdom")

    def __init__(self, rdom: RDom, dim: int):
        self.rdom, self.dim = rdom, dim
        super().__init__(_node=sym.leaf("hl.rvar", (rdom.uid, dim), np.int32))

    def name(self) -> str:
        return f"{self.rdom.name}.{'xyzw'[self.dim] if self.dim < 4 else self.dim}"

    def min(self) -> Expr:
        return self.rdom.bounds[self.dim][0]

    def extent(self) -> Expr:
        return self.rdom.bounds[self.dim][1]

    def __repr__(self):
        return f"RVar({self.name()!r})"


class Range:
    """``hl.Range(min, extent)``."""

    def __init__(self, min, extent):
        self.min, self.extent = min, extent


class RDom:
    """A reduction domain: ``hl.RDom([hl.Range(0, w), (0, h)])``, ``hl.RDom(buffer)`` (the
    buffer's extents), with ``r.x, r.y, r.z, r.w`` / ``r[i]``, and ``r.where(pred)``."""

    _ids = itertools.count()

    def __init__(self, ranges, *more, name: str | None = None):
        self.source = ranges if hasattr(ranges, "_rdom_bounds") else None  # keeps a Buffer
        bounds = _rdom_ranges(ranges, more)
        self.uid = f"r{next(RDom._ids)}"
        self.name = name or self.uid
        self.bounds = bounds
        self.predicates: list = []
        self.vars = [RVar(self, d) for d in range(len(bounds))]

    def dimensions(self) -> int:
        return len(self.vars)

    def __len__(self):
        return len(self.vars)

    def __getitem__(self, i) -> RVar:
        try:
            return self.vars[i]
        except IndexError:
            raise IndexError(f"RDom {self.name} has {len(self.vars)} dimensions, asked for {i}")\
                from None

    def __iter__(self):
        return iter(self.vars)

    @property
    def x(self):
        return self[0]

    @property
    def y(self):
        return self[1]

    @property
    def z(self):
        return self[2]

    @property
    def w(self):
        return self[3]

    def where(self, pred) -> RDom:
        """Restrict the domain to the points where ``pred`` (over the RVars) holds."""
        e = as_expr(pred)
        if not e.type().is_bool():
            raise ExprError(f"RDom.where needs a boolean predicate, got {e.type()}")
        self.predicates.append(e.node)
        return self

    def predicate(self):
        """The conjunction of the predicates (a sym node), or None."""
        p = None
        for q in self.predicates:
            p = q if p is None else sym.logical_and(p, q)
        return p

    def __repr__(self):
        return f"RDom({self.name}, {len(self.vars)} dims)"


def _int_expr(v, what):
    e = as_expr(v)
    if not e.type().is_int() and not e.type().is_uint():
        raise ExprError(f"{what} must be an integer expression, got {e.type()}")
    return cast(Int(32), e)


def _rdom_ranges(ranges, more):
    if hasattr(ranges, "_rdom_bounds"):  # a Buffer
        return ranges._rdom_bounds()
    if isinstance(ranges, Range) or (isinstance(ranges, tuple) and len(ranges) == 2
                                     and not isinstance(ranges[0], (tuple, Range))):
        ranges = [ranges, *more]
    elif more:  # RDom(min0, extent0, min1, extent1, ...)
        flat = [ranges, *more]
        if len(flat) % 2:
            raise ExprError("RDom(min, extent, ...) needs an even number of arguments")
        ranges = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    out = []
    for k, r in enumerate(ranges):
        if isinstance(r, Range):
            lo, ext = r.min, r.extent
        else:
            try:
                lo, ext = r
            except (TypeError, ValueError):
                raise ExprError(
                    f"RDom dimension {k}: expected hl.Range(min, extent) or (min, extent), got"
                    f" {r!r}"
                ) from None
        out.append((_int_expr(lo, f"RDom dimension {k} min"),
                    _int_expr(ext, f"RDom dimension {k} extent")))
    if not out:
        raise ExprError("an RDom needs at least one dimension")
    return out


PARAMS: weakref.WeakValueDictionary[str, Param] = weakref.WeakValueDictionary()


class Param(Expr):
    """A scalar runtime parameter: ``hl.Param(hl.Float(32), "gamma", 2.2)``; ``.set(v)``."""

    __slots__ = ("__weakref__", "_name", "_type", "_value")

    def __init__(self, type: Type, name: str | None = None, value=None):
        if not isinstance(type, Type):
            raise ExprError(f"Param: expected an hl type first, got {type!r}")
        self._type = type
        self._name = name or unique_name("p")
        self._value = None
        super().__init__(_node=sym.leaf("hl.param", unique_name(self._name), type.dtype))
        PARAMS[self.node.key] = self
        if value is not None:
            self.set(value)

    # hashable by identity, so Params can key {input: tangent / adjoint} dicts (a dict looks a
    # key up by identity first, so == never builds a comparison there)
    __hash__ = object.__hash__

    def name(self) -> str:
        return self._name

    def set(self, value):
        v = np.asarray(value)
        if v.ndim != 0:
            raise ExprError(f"Param {self._name}: a scalar is needed, got shape {v.shape}")
        self._value = v.astype(self._type.dtype)[()]
        return self

    def get(self):
        return self._value

    def type(self) -> Type:
        return self._type

    def __repr__(self):
        return f"Param({self._name!r}, {self._type}, {self._value})"

