"""Symbolic expression nodes and hash-consing.

Every node is immutable and *interned*: building a node that is structurally equal to a live
one returns the live one, so ``==`` / ``hash`` are object identity and common subexpressions
are shared for free. The intern table is a weak-value dictionary keyed by
``(op, child ids, params, dtype)``; a node keeps its children alive, so a key's child ids stay
valid for as long as the node (and hence the entry) lives.

Node types:

* :class:`Const` -- a scalar constant. Python scalars (``2.0``, ``3``, ``True``) are *weak*:
  like numpy's NEP 50 scalars they adopt the dtype of the strong operands they meet
  (``float32 var * 2.0`` stays float32). numpy scalars, 0-d arrays and ``const(v, dtype)``
  are strong.
* :class:`Leaf` -- an independent input: ``kind`` (a string) and ``key`` (any hashable).
  :class:`Var` is the leaf of kind ``"var"`` made by :func:`var`; sibling DSLs make their own
  leaves with :func:`leaf` (a stencil read ``leaf("X", (0, 1))``, a buffer access ...).
* :class:`Apply` -- a lane-wise primitive of the rule table (or a user-registered one, see
  :func:`core_ad.sym.call`) applied to child nodes, with hashable ``params``.

Expressions are per-lane scalars: they have a ``dtype`` but no shape; compiled code evaluates
them over arrays of lanes.
"""

from __future__ import annotations

import itertools
import threading
import weakref
import zlib

import numpy as np

from .. import _rules as R
from .._primitives import Primitive

# the renderer of ``repr`` (``graph.to_str``, installed by that module: rendering needs the
# traversals, which are built on this module)
_RENDER: list = [lambda e, limit: object.__repr__(e)]

__all__ = [
    "Expr",
    "Const",
    "Leaf",
    "Var",
    "Apply",
    "const",
    "var",
    "leaf",
    "as_expr",
    "is_const",
    "F_SELECT",
    "F_FINITE",
]

# Flag bits cached on every node (computed from its children at construction).
F_SELECT = 1  # the node's DAG contains a select: its value may be a *masked* zero
F_FINITE = 2  # provably finite for finite leaf values (overflow of + and * is ignored)

_TABLE: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_SERIAL = itertools.count()


def _intern(key, make, shape, ident=0):
    """The interned node for ``key`` (made by ``make`` when new, with ``shape`` and
    ``ident``)."""
    node = _TABLE.get(key)
    if node is not None:
        return node
    with _LOCK:
        node = _TABLE.get(key)
        if node is None:
            node = make()
            object.__setattr__(node, "serial", next(_SERIAL))
            object.__setattr__(node, "shape", shape)
            object.__setattr__(node, "ident", ident)
            _TABLE[key] = node
    return node


def _name_code(name: str) -> int:
    return zlib.crc32(name.encode())


def order_key(node):
    """The canonical position of an operand of an n-ary add or mul: its ``shape`` (a hash of
    its float structure: leaves reduced to kind and dtype, non-constant integer and bool
    operands to their dtype; see ``_operand_shape``), then its ``ident``, then its creation
    serial. Float sums and products are evaluated in this order, so two expressions that
    differ only in their leaves round alike: the k scatters of a bilinear adjoint, each built
    over its own loop variables, compute the same corner from the same coordinates. (Creation
    order alone made ``8 * nx * theta`` in one scatter and ``8 * theta * nx`` in the next: one
    ulp apart, so a sample exactly at a pixel centre reached that pixel twice.)

    Vars of one dtype (one shape) go by name; ``ident`` is a hash of the whole structure, var
    names and constant values included, for nodes built from vars and constants alone (0 for
    the rest, whose ties keep the creation order above). This makes such expressions --
    h2mc's path contributions, say -- the same program whatever the process built before
    them, so they hit the disk cache of an earlier process that built in another order."""
    return (node.shape, node.ident == 0, node.key if node.__class__ is Var else "", node.ident,
            node.serial)


def intern_table_size() -> int:
    """Number of live interned nodes (for diagnostics and tests)."""
    return len(_TABLE)


def _operand(o, where):
    """``o`` as an expression, or None for a type that handles its own arithmetic (it sets
    ``__array_ufunc__ = None``, numpy's convention, like a DSL vector): the operator then
    returns NotImplemented so that type's reflected operator gets its turn. Anything else that
    is not a scalar raises a TypeError naming its type."""
    if getattr(type(o), "__array_ufunc__", 0) is None and not isinstance(o, Expr):
        return None
    return as_expr(o, where)


class Expr:
    """Base class of symbolic nodes (immutable, interned; ``==`` is identity).

    Python operators build nodes: ``+ - * / **``, unary ``-``, ``abs`` and the comparisons
    ``< <= > >=`` (which give bool expressions). ``==`` and ``!=`` stay structural identity so
    that expressions can be dict keys; use :func:`core_ad.sym.eq` / ``ne`` for the lane-wise
    comparison. ``bool(expr)`` raises: use :func:`core_ad.sym.where` for lane-wise choices.
    """

    # shape: a hash of the structure, leaves reduced to kind and dtype (ints only, so the same
    # in every process); see order_key
    __slots__ = ("dtype", "serial", "shape", "ident", "flags", "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators
    args: tuple = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"symbolic expressions are immutable (cannot set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"symbolic expressions are immutable (cannot delete {name!r})")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("symbolic expressions cannot be pickled (they are interned)")

    def __bool__(self):
        raise TypeError(
            "the truth value of a symbolic expression is undefined: it is a per-lane value."
            " Use sym.where(cond, a, b) for a lane-wise choice, and `is` for structural identity"
        )

    @property
    def op(self):
        raise NotImplementedError

    def __repr__(self) -> str:
        return _RENDER[0](self, limit=300)

    # arithmetic -------------------------------------------------------------------------
    def __add__(self, o):
        o = _operand(o, "+")
        return NotImplemented if o is None else R.add(self, o)

    def __radd__(self, o):
        o = _operand(o, "+")
        return NotImplemented if o is None else R.add(o, self)

    def __sub__(self, o):
        o = _operand(o, "-")
        return NotImplemented if o is None else R.sub(self, o)

    def __rsub__(self, o):
        o = _operand(o, "-")
        return NotImplemented if o is None else R.sub(o, self)

    def __mul__(self, o):
        o = _operand(o, "*")
        return NotImplemented if o is None else R.mul(self, o)

    def __rmul__(self, o):
        o = _operand(o, "*")
        return NotImplemented if o is None else R.mul(o, self)

    def __truediv__(self, o):
        o = _operand(o, "/")
        return NotImplemented if o is None else R.div(self, o)

    def __rtruediv__(self, o):
        o = _operand(o, "/")
        return NotImplemented if o is None else R.div(o, self)

    def __floordiv__(self, o):
        o = _operand(o, "//")
        return NotImplemented if o is None else R.floor_divide(self, o)

    def __rfloordiv__(self, o):
        o = _operand(o, "//")
        return NotImplemented if o is None else R.floor_divide(o, self)

    def __mod__(self, o):
        o = _operand(o, "%")
        return NotImplemented if o is None else R.mod(self, o)

    def __rmod__(self, o):
        o = _operand(o, "%")
        return NotImplemented if o is None else R.mod(o, self)

    def __pow__(self, o):
        o = _operand(o, "**")
        return NotImplemented if o is None else R.pow(self, o)

    def __rpow__(self, o):
        o = _operand(o, "**")
        return NotImplemented if o is None else R.pow(o, self)

    def __neg__(self):
        return R.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return R.abs(self)

    def __lt__(self, o):
        return R.lt(self, as_expr(o, "<"))

    def __le__(self, o):
        return R.le(self, as_expr(o, "<="))

    def __gt__(self, o):
        return R.gt(self, as_expr(o, ">"))

    def __ge__(self, o):
        return R.ge(self, as_expr(o, ">="))

    __hash__ = object.__hash__

    def __eq__(self, o):
        return self is o

    def __ne__(self, o):
        return self is not o


class Const(Expr):
    """A scalar constant: ``value`` (a Python scalar if ``weak``, else a numpy scalar)."""

    __slots__ = ("value", "weak")

    @property
    def op(self):
        return "const"


class Leaf(Expr):
    """An independent input node: ``kind`` (str) and ``key`` (hashable)."""

    __slots__ = ("kind", "key")

    @property
    def op(self):
        return self.kind

    @property
    def name(self) -> str:
        """Display name: the var's name, else ``kind(key...)``."""
        if self.kind == "var":
            return str(self.key)
        k = self.key
        if isinstance(k, tuple):
            return f"{self.kind}({', '.join(map(repr, k))})"
        return f"{self.kind}[{k!r}]"


class Var(Leaf):
    """A named scalar variable (a leaf of kind ``"var"``)."""

    __slots__ = ()


class Apply(Expr):
    """A lane-wise primitive ``prim`` applied to ``args`` with ``params``."""

    __slots__ = ("prim", "args", "params", "pkey")

    @property
    def op(self):
        return self.prim


def is_const(e, value=None) -> bool:
    """Whether ``e`` is a :class:`Const` (equal to ``value`` when one is given)."""
    if not isinstance(e, Const):
        return False
    if value is None:
        return True
    with np.errstate(all="ignore"):
        return bool(e.value == value)


# --------------------------------------------------------------------------------------------
# constructors

_WEAK_TYPES = (bool, int, float, complex)


def _weak_dtype(v) -> np.dtype:
    if isinstance(v, bool):
        return np.dtype(np.bool_)
    if isinstance(v, int):
        return np.asarray(v).dtype  # int64 (OverflowError for huge ints, like numpy)
    if isinstance(v, float):
        return np.dtype(np.float64)
    return np.dtype(np.complex128)


def _const_key_bytes(value, dtype):
    return np.asarray(value, dtype=dtype).tobytes()


def _make_const(value, dtype: np.dtype, weak: bool) -> Const:
    if weak:
        pyv = dtype.type(value).item()
        key = ("const", dtype, True, _const_key_bytes(pyv, dtype))
        value = pyv
    else:
        value = dtype.type(value)
        key = ("const", dtype, False, _const_key_bytes(value, dtype))

    def make():
        n = object.__new__(Const)
        object.__setattr__(n, "value", value)
        object.__setattr__(n, "weak", weak)
        object.__setattr__(n, "dtype", dtype)
        finite = dtype.kind in "biu" or bool(np.isfinite(value))
        object.__setattr__(n, "flags", F_FINITE if finite else 0)
        return n

    code = zlib.crc32(key[3])
    return _intern(key, make, hash((1, dtype.num, code)),
                   hash((1, dtype.num, code, weak)) or 1)


def const(value, dtype=None) -> Const:
    """A constant node. ``dtype=None``: Python scalars are weak, numpy scalars keep their dtype.

    A given ``dtype`` makes a strong constant of that dtype.
    """
    if isinstance(value, Expr):
        if isinstance(value, Const):
            if dtype is None:
                return value
            return _make_const(value.value, np.dtype(dtype), False)
        raise TypeError(f"const: expected a scalar, got the non-constant expression {value!r}")
    if dtype is not None:
        dt = np.dtype(dtype)
        v = _scalar_value(value, "const")
        with np.errstate(all="ignore"):
            return _make_const(np.asarray(v).astype(dt)[()], dt, False)
    if type(value) in _WEAK_TYPES:
        return _make_const(value, _weak_dtype(value), True)
    v = _scalar_value(value, "const")
    return _make_const(v, v.dtype, False)


def _scalar_value(value, where):
    if isinstance(value, np.generic):
        return value
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TypeError(
                f"{where}: symbolic expressions are per-lane scalars; got a numpy array of shape"
                f" {value.shape} (pass arrays to the compiled function instead)"
            )
        return value[()]
    if isinstance(value, _WEAK_TYPES):
        return np.asarray(value)[()]
    raise TypeError(
        f"{where}: cannot use an object of type {type(value).__name__} as a symbolic"
        " expression (expected an Expr, a Python or numpy scalar, or a 0-d array)"
    )


def as_expr(value, where: str = "sym") -> Expr:
    """Convert ``value`` to an :class:`Expr`; raise a TypeError naming its type otherwise."""
    if isinstance(value, Expr):
        return value
    if type(value) in _WEAK_TYPES:
        return _make_const(value, _weak_dtype(value), True)
    v = _scalar_value(value, where)
    if v.dtype.kind not in "biufc":
        raise TypeError(f"{where}: cannot use a constant of dtype {v.dtype} in an expression")
    return _make_const(v, v.dtype, False)


def _freeze_key(key, where):
    if isinstance(key, list):
        key = tuple(key)
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"{where}: leaf key {key!r} is not hashable") from None
    return key


def leaf(kind: str, key, dtype="float64", *, finite: bool = True) -> Leaf:
    """A custom, hash-consed leaf: an independent input of a sibling DSL.

    ``kind`` is a string naming the leaf family (``"X"`` for an Opt-like unknown image,
    ``"buf"`` for a Halide buffer ...), ``key`` any hashable identifying it within the family
    (a stencil offset ``(0, 1)``, a buffer name and coordinates ...). The same
    ``(kind, key, dtype)`` always gives the same node. Leaves can be differentiated with respect
    to (:func:`core_ad.sym.diff`, :func:`core_ad.sym.grad`) and are inputs of
    :func:`core_ad.sym.compile`. ``leaf("var", name)`` is :func:`var`.

    Leaves are taken to hold finite values (so a local partial built from them alone is
    provably finite, and NaN-safe products simplify to plain ones); ``finite=False`` makes a
    distinct leaf for values that may be infinite or NaN (a lazy array's buffer, say).
    """
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"leaf: kind must be a non-empty string, got {kind!r}")
    dt = np.dtype(dtype)
    key = _freeze_key(key, "leaf")
    cls = Var if kind == "var" else Leaf
    if cls is Var and not isinstance(key, str):
        raise TypeError(f"var: name must be a string, got {type(key).__name__}")

    def make():
        n = object.__new__(cls)
        object.__setattr__(n, "kind", kind)
        object.__setattr__(n, "key", key)
        object.__setattr__(n, "dtype", dt)
        object.__setattr__(n, "flags", F_FINITE if finite else 0)
        return n

    # only vars get an ident: other leaf families (buffers, unknowns) rely on their creation
    # order for alike rounding of expressions that differ in their leaves (see order_key)
    ident = (hash((2, _name_code(key), dt.num, finite)) or 1) if cls is Var else 0
    return _intern(("leaf", kind, key, dt) if finite else ("leaf", kind, key, dt, "nonfinite"),
                   make, hash((2, _name_code(kind), dt.num)), ident)


def var(name: str, dtype="float64") -> Var:
    """A named scalar variable; ``var("x") is var("x")``. Different dtypes are different vars."""
    return leaf("var", name, dtype)


# --------------------------------------------------------------------------------------------
# apply nodes (called by the simplifier only: it canonicalises first)


def freeze_params(params: dict, where: str) -> tuple:
    """A hashable, order-independent key for a params dict."""
    if not params:
        return ()
    items = []
    for k in sorted(params):
        items.append((k, _freeze_value(params[k], where, k)))
    return tuple(items)


def _freeze_value(v, where, k):
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, list | tuple):
        return (type(v).__name__,) + tuple(_freeze_value(x, where, k) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple((kk, _freeze_value(v[kk], where, k)) for kk in sorted(v))
    try:
        hash(v)
    except TypeError:
        raise TypeError(
            f"{where}: parameter {k}={v!r} of type {type(v).__name__} is not hashable"
        ) from None
    return v


def make_apply(prim: Primitive, args: tuple, pkey: tuple, params: dict, dtype: np.dtype,
               flags: int) -> Apply:
    key = (prim, tuple(map(id, args)), pkey, dtype)

    def make():
        n = object.__new__(Apply)
        object.__setattr__(n, "prim", prim)
        object.__setattr__(n, "args", args)
        object.__setattr__(n, "params", dict(params))
        object.__setattr__(n, "pkey", pkey)
        object.__setattr__(n, "dtype", dtype)
        object.__setattr__(n, "flags", flags)
        return n

    code = _PRIM_CODES.get(prim)
    if code is None:
        code = _PRIM_CODES[prim] = _name_code(prim.name)
    idents = [a.ident for a in args]
    ident = 0
    if all(idents):
        pcode = _name_code(repr(pkey)) if pkey else 0
        ident = hash((3, code, dtype.num, pcode, *idents)) or 1
    return _intern(key, make, hash((3, code, dtype.num, *map(_operand_shape, args))), ident)


def _operand_shape(a):
    """An operand's part of its parent's shape: an integer or bool operand (an index, a
    condition) counts by its dtype alone unless it is a constant, so a Func read's shape
    does not change when a schedule rewrites its coordinates (``y + 1`` inside a strip is
    ``8 yo + yi + 1``): the taps of a stencil keep their relative order, and every schedule
    sums them alike."""
    if a.dtype.kind in "fc" or isinstance(a, Const):
        return a.shape
    return -1 - a.dtype.num


_PRIM_CODES: dict = {}
