"""The lsq_opt language: declarations, stencil / graph reads, residual templates.

Residual expressions are :mod:`core_ad.sym` expressions. Every read of a declared array is a
``sym.leaf`` whose *kind* is the array's name and whose *key* describes the access, so that a
residual is self-describing (the compiler needs no global registry):

* stencil read ``X(dx, dy)`` channel ``c``: ``leaf("X", ("s", (dx, dy), c, decl))``
* graph read ``X(G.v0)`` channel ``c``: ``leaf("X", ("g", "G", "v0", c, decl))``
* parameter ``Param("w")``: ``leaf("w", ("param",))`` (``Param("w", index=i)``: ``("param", i)``)
* ``InBounds(dx, dy)``: ``leaf("__inbounds__", (dx, dy), "bool")``
* ``Index(d)``: ``leaf("__index__", (d,))``

where ``decl = (role, dim_names, channels)`` with role ``"unknown"`` or ``"array"`` (plus the
binding index where the declaration gives one: ``positional`` binding). Leaves are
built as float64; the compiler re-types them to the plan's dtype.

Layout convention: an array over dims ``(D0, D1, ...)`` with ``C`` channels binds to a numpy
array of shape ``(size(D0), size(D1), ...)`` (``C == 1``) or ``(..., C)``. Offset ``k`` of a
stencil read moves along axis ``k`` (``X(dx, dy)`` reads ``X[i + dx, j + dy]``).

Vector values (multi-channel reads, :class:`Vec`) are small tuples of scalar expressions with
element-wise arithmetic and scalar broadcast on either side (``w * v`` and ``v * w``: a
``Vec`` sets ``__array_ufunc__ = None``, so ``sym.Expr`` operators defer to it).
"""

from __future__ import annotations

import ast
import numbers
from dataclasses import dataclass

import numpy as np
from core_ad import sym

__all__ = [
    "All",
    "And",
    "Any",
    "Array",
    "Dim",
    "Dot",
    "Energy",
    "Exclude",
    "Graph",
    "GraphSlot",
    "Image",
    "InBounds",
    "InBoundsExpanded",
    "InBoundsRef",
    "BufferRef",
    "SizeRef",
    "Index",
    "IndexRef",
    "Not",
    "Or",
    "Param",
    "ParamRef",
    "Read",
    "ComputedArray",
    "ConstView",
    "L_p",
    "Rotate2D",
    "Rotate3D",
    "SampledImage",
    "Select",
    "Stencil",
    "Unknown",
    "Vec",
    "Vector",
    "abs",
    "abs_",
    "atan2",
    "cos",
    "decode_leaf",
    "eq",
    "exp",
    "greater",
    "greatereq",
    "less",
    "lesseq",
    "log",
    "mul",
    "ne",
    "residual_channels",
    "sin",
    "sqrt",
    "tan",
]

_F = "float64"


# --------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Dim:
    """A symbolic extent, bound by name at compile time (``sizes={"W": 17}``) or inferred from
    the shape of a bound array."""

    name: str

    def __repr__(self):
        return f"Dim({self.name!r})"


def _dims(dims) -> tuple[Dim, ...]:
    if isinstance(dims, Dim):
        dims = (dims,)
    dims = tuple(dims)
    if not dims or not all(isinstance(d, Dim) for d in dims):
        raise TypeError(f"dims must be a non-empty sequence of Dim, got {dims!r}")
    return dims


class GraphSlot:
    """``G.v0``: the vertex slot of a graph, used as the index of a graph read ``X(G.v0)``."""

    def __init__(self, graph: Graph, name: str, dims: tuple[Dim, ...]):
        self.graph, self.name, self.dims = graph, name, dims

    def __repr__(self):
        return f"{self.graph.name}.{self.name}"


#: the hidden slot through which edge attributes are read: edge e reads attribute entry e
EDGE_SLOT = "__edge"


def edge_dim_name(graph: str) -> str:
    """The name of a graph's edge index space (the dim of its edge attributes)."""
    return f"{graph}.edges"


class Graph:
    """``Graph(name, v0=dims, v1=dims, ..., attrs={"w": 1})`` (or ``Graph(name, ["v0", "v1"],
    dims)``): a set of hyperedges; each slot holds, per edge, an index into ``dims``' index
    space (bound at compile time as ``graphs={name: {slot: int_array}}``; for
    multi-dimensional index spaces either flat row-major indices of shape (E,) or coordinates
    of shape (E, ndim)).

    ``attrs`` declares per-edge data, ``{attribute: channels}``: read in a residual as ``G.w``
    (or ``G.attr("w")``; a :class:`Vec` for several channels) and bound next to the slots,
    ``graphs={name: {"v0": ..., "v1": ..., "w": values}}`` with values of shape (E,) or
    (E, channels)."""

    def __init__(self, name: str, slots=None, dims=None, *, attrs=None, **slot_dims):
        if not isinstance(name, str) or not name:
            raise TypeError("Graph: name must be a non-empty string")
        self.name = name
        spec: dict[str, tuple[Dim, ...]] = {}
        if slots is not None:
            if dims is None:
                raise TypeError("Graph: give dims with a list of slot names")
            for s in slots:
                spec[s] = _dims(dims)
        for s, d in slot_dims.items():
            spec[s] = _dims(d)
        if not spec:
            raise TypeError(f"Graph {name!r}: needs at least one vertex slot")
        self.slots = {s: GraphSlot(self, s, d) for s, d in spec.items()}
        self.attrs: dict[str, Array] = {}
        edges = Dim(edge_dim_name(name))
        self._edge_slot = GraphSlot(self, EDGE_SLOT, (edges,))
        for a, ch in dict(attrs or {}).items():
            if not isinstance(a, str) or not a.isidentifier() or a.startswith("__"):
                raise TypeError(f"Graph {name!r}: invalid edge attribute name {a!r}")
            if a in self.slots:
                raise ValueError(f"Graph {name!r}: {a!r} is both a vertex slot and an edge attribute")
            self.attrs[a] = Array(f"{name}.{a}", edges, ch)

    def attr(self, name: str):
        """The read of edge attribute ``name`` on the residual's edge (``G.w`` is the same)."""
        if name not in self.attrs:
            raise AttributeError(f"graph {self.name!r} has no edge attribute {name!r}; declared "
                                 f"attributes: {sorted(self.attrs)} (Graph(..., attrs={{name: channels}}))")
        return self.attrs[name](self._edge_slot)

    def __getattr__(self, item):
        d = self.__dict__
        if item in d.get("slots", {}):
            return d["slots"][item]
        if item in d.get("attrs", {}):
            return self.attr(item)
        raise AttributeError(f"graph {d.get('name')!r} has no vertex slot or edge attribute {item!r}; "
                             f"slots: {sorted(d.get('slots', {}))}, attributes: {sorted(d.get('attrs', {}))}")

    def __repr__(self):
        extra = f", attrs={ {a: v.channels for a, v in self.attrs.items()} }" if self.attrs else ""
        return f"Graph({self.name!r}, slots={list(self.slots)}{extra})"


def _binding_index(index, what: str):
    """Opt's binding index (``compile_problem(positional=[...])``), or None."""
    if index is None:
        return None
    if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
        raise TypeError(f"{what}: the binding index must be a non-negative integer, got {index!r}")
    return int(index)


class _ArrayDecl:
    role = "array"

    def __init__(self, name: str, dims, channels: int = 1, index: int | None = None):
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise TypeError(f"{type(self).__name__}: invalid name {name!r}")
        if not isinstance(channels, numbers.Integral) or channels < 1:
            raise ValueError(f"{type(self).__name__} {name!r}: channels must be >= 1")
        self.name, self.dims, self.channels = name, _dims(dims), int(channels)
        self.index = _binding_index(index, f"{type(self).__name__} {name!r}")

    @property
    def decl(self):
        """(role, dims, channels[, binding index]): part of every leaf key of this array."""
        d = (self.role, tuple(d.name for d in self.dims), self.channels)
        return d if self.index is None else d + (self.index,)

    @property
    def ndim(self):
        return len(self.dims)

    def _leaf(self, key):
        return sym.leaf(self.name, key + (self.decl,), _F)

    def __call__(self, *args):
        """Stencil read ``X(dx, dy)`` / ``X(dx, dy, c)`` or graph read ``X(G.v)`` / ``X(G.v, c)``.
        Multi-channel reads without a channel give a :class:`Vec`."""
        if args and isinstance(args[0], GraphSlot):
            slot = args[0]
            if tuple(slot.dims) != tuple(self.dims):
                raise ValueError(
                    f"graph read {self.name}({slot!r}): slot index space "
                    f"{[d.name for d in slot.dims]} does not match {self.name}'s dims "
                    f"{[d.name for d in self.dims]}")
            rest = args[1:]

            def mk(c):
                return self._leaf(("g", slot.graph.name, slot.name, c))
        else:
            if len(args) not in (self.ndim, self.ndim + 1):
                raise TypeError(
                    f"{self.name}: a stencil read takes {self.ndim} integer offsets (plus an "
                    f"optional channel), got {args!r}")
            for a in args:
                if not isinstance(a, numbers.Integral):
                    raise TypeError(f"{self.name}: stencil offsets must be constant integers, got {a!r}")
            off = tuple(int(a) for a in args[: self.ndim])
            rest = args[self.ndim:]

            def mk(c):
                return self._leaf(("s", off, c))
        if rest:
            c = int(rest[0])
            if not 0 <= c < self.channels:
                raise IndexError(f"{self.name}: channel {c} out of range (channels={self.channels})")
            return mk(c)
        if self.channels == 1:
            return mk(0)
        return Vec([mk(c) for c in range(self.channels)])

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, {[d.name for d in self.dims]}, channels={self.channels})"


class Unknown(_ArrayDecl):
    """``Unknown(name, dims, channels=1, index=None)``: the unknown image / per-vertex array
    (``index``: Opt's binding index, for ``compile_problem(positional=...)``)."""

    role = "unknown"

    def const(self) -> "ConstView":
        """A constant view of this unknown (Fig. 33's ``r_const``): reads give the values at the
        current linearisation point and carry no derivative; they are refreshed at every
        non-linear iteration (the IRLS weights of :func:`L_p`)."""
        return ConstView(self)


VIEW_SUFFIX = "__const"


class ConstView(_ArrayDecl):
    """See :meth:`Unknown.const`."""

    role = "view"

    def __init__(self, unknown: Unknown):
        if not isinstance(unknown, Unknown):
            raise TypeError("ConstView: expected an Unknown")
        super().__init__(unknown.name, unknown.dims, unknown.channels)
        self.name = unknown.name + VIEW_SUFFIX


class Array(_ArrayDecl):
    """``Array(name, dims, channels=1, index=None)`` (alias ``Image``): constant input data.
    In positional binding an Array sharing an Unknown's index is that unknown's constant view
    (Fig. 33's ``r_const``)."""

    role = "array"


Image = Array


def Param(name: str, index: int | None = None):
    """A scalar parameter, bound by name at compile time (``params={"w": 0.3}``) or by its
    binding ``index`` (``positional=[...]``)."""
    if not isinstance(name, str) or not name or name.startswith("__"):
        raise TypeError(f"Param: invalid name {name!r}")
    index = _binding_index(index, f"Param {name!r}")
    return sym.leaf(name, ("param",) if index is None else ("param", index), _F)


def InBounds(*offset):
    """True (a bool expression) where centre + offset lies inside the residual's index space.
    Using it in a residual turns off the default boundary mask for that residual."""
    if not offset or not all(isinstance(o, numbers.Integral) for o in offset):
        raise TypeError(f"InBounds: expected constant integer offsets, got {offset!r}")
    return sym.leaf("__inbounds__", tuple(int(o) for o in offset), "bool")


def InBoundsExpanded(*args):
    """``InBoundsExpanded(dx, dy, e)``: true where the whole box ``[c + o - e, c + o + e]`` (per
    dimension, c the centre, o the offset) lies inside the residual's index space (Fig. 26),
    i.e. ``InBounds(o - e) and InBounds(o + e)``. Turns off the default boundary mask like
    :func:`InBounds`."""
    if len(args) < 2 or not all(isinstance(a, numbers.Integral) for a in args):
        raise TypeError(f"InBoundsExpanded: expected constant integer offsets and an extent, got {args!r}")
    *offset, e = (int(a) for a in args)
    if e < 0:
        raise ValueError(f"InBoundsExpanded: the extent must be >= 0, got {e}")
    return sym.logical_and(InBounds(*(o - e for o in offset)), InBounds(*(o + e for o in offset)))


def Index(d: int):
    """The integer coordinate of the residual's centre along dimension d (as a float)."""
    return sym.leaf("__index__", (int(d),), _F)


# --------------------------------------------------------------------------- vectors
def _ex(v):
    if isinstance(v, Vec):
        raise TypeError("expected a scalar expression, got a Vec")
    return v if isinstance(v, sym.Expr) else sym.const(v)


class Vec:
    """A small vector of scalar expressions (element-wise arithmetic, scalar broadcast)."""

    __array_ufunc__ = None

    def __init__(self, items):
        items = list(items)
        if not items:
            raise ValueError("Vec: empty")
        self.items = [(_ex(i) if not isinstance(i, sym.Expr) else i) for i in items]

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __call__(self, i):
        return self.items[i]

    def _bin(self, o, f):
        if isinstance(o, Vec):
            if len(o) != len(self):
                raise ValueError(f"vector length mismatch: {len(self)} vs {len(o)}")
            return Vec([f(a, b) for a, b in zip(self.items, o.items)])
        return Vec([f(a, o) for a in self.items])

    def _rbin(self, o, f):
        return Vec([f(o, a) for a in self.items])

    def __add__(self, o):
        return self._bin(o, lambda a, b: a + b)

    def __radd__(self, o):
        return self._rbin(o, lambda a, b: _ex(a) + b)

    def __sub__(self, o):
        return self._bin(o, lambda a, b: a - b)

    def __rsub__(self, o):
        return self._rbin(o, lambda a, b: _ex(a) - b)

    def __mul__(self, o):
        return self._bin(o, lambda a, b: a * b)

    def __rmul__(self, o):
        return self._rbin(o, lambda a, b: _ex(a) * b)

    def __truediv__(self, o):
        return self._bin(o, lambda a, b: a / b)

    def __rtruediv__(self, o):
        return self._rbin(o, lambda a, b: _ex(a) / b)

    def __neg__(self):
        return Vec([-a for a in self.items])

    def __pow__(self, o):
        return self._bin(o, lambda a, b: a ** b)

    def __abs__(self):
        return Vec([abs(a) for a in self.items])

    # element-wise comparisons (bool Vecs for Select / All / Any); == and != stay eq / ne:
    # core_ad expressions keep Python's == for structural equality
    def __lt__(self, o):
        return self._bin(o, lambda a, b: a < b)

    def __le__(self, o):
        return self._bin(o, lambda a, b: a <= b)

    def __gt__(self, o):
        return self._bin(o, lambda a, b: a > b)

    def __ge__(self, o):
        return self._bin(o, lambda a, b: a >= b)

    def scale(self, s):
        return Vec([_ex(s) * a for a in self.items])

    def dot(self, o):
        return Dot(self, o)

    def sum(self):
        out = self.items[0]
        for a in self.items[1:]:
            out = out + a
        return out

    def size(self):
        return len(self.items)

    def __repr__(self):
        return f"Vec({self.items!r})"


def Vector(*items):
    return Vec(items)


def mul(a, b):
    """``a * b`` for any mix of scalars / Vecs (use for ``scalar_expr * Vec``)."""
    if isinstance(b, Vec) and not isinstance(a, Vec):
        return b.scale(a)
    return a * b


def _lift(f):
    def g(*args):
        vecs = [a for a in args if isinstance(a, Vec)]
        if vecs:
            n = len(vecs[0])
            cols = [a.items if isinstance(a, Vec) else [a] * n for a in args]
            return Vec([f(*[_ex(c) if not isinstance(c, sym.Expr) else c for c in row])
                        for row in zip(*cols)])
        return f(*[(_ex(a) if not isinstance(a, sym.Expr) else a) for a in args])
    g.__name__ = getattr(f, "__name__", "lifted")
    return g


sqrt = _lift(sym.sqrt)
exp = _lift(sym.exp)
log = _lift(sym.log)
sin = _lift(sym.sin)
cos = _lift(sym.cos)
tan = _lift(sym.tan)
atan2 = _lift(sym.arctan2)
abs_ = _lift(sym.abs)
abs = abs_  # noqa: A001 - lsq_opt.abs, the ordinary name (builtin abs() works on expressions too)


def _cmp(f):
    return _lift(lambda a, b: f(a, b))


eq = _cmp(sym.eq)
ne = _cmp(sym.ne)
greater = _cmp(sym.gt)
greatereq = _cmp(sym.ge)
less = _cmp(sym.lt)
lesseq = _cmp(sym.le)


def _as_bool(c):
    c = _ex(c) if not isinstance(c, sym.Expr) else c
    return c if c.dtype == np.bool_ else sym.ne(c, 0)


Not = _lift(lambda c: sym.logical_not(_as_bool(c)))


def And(*cs):
    out = _as_bool(cs[0])
    for c in cs[1:]:
        out = sym.logical_and(out, _as_bool(c))
    return out


def Or(*cs):
    out = _as_bool(cs[0])
    for c in cs[1:]:
        out = sym.logical_or(out, _as_bool(c))
    return out


def All(v):
    return And(*v.items) if isinstance(v, Vec) else _as_bool(v)


def Any(v):
    return Or(*v.items) if isinstance(v, Vec) else _as_bool(v)


def Select(cond, a, b):
    """Lane-wise choice; ``cond`` a bool expression or a number-valued one (non-zero = true).
    Vector conditions / values broadcast element-wise (spec 10.4)."""
    return _lift(lambda c, x, y: sym.where(_as_bool(c), x, y))(cond, a, b)


def Dot(a, b):
    return (a * b).sum()


def Rotate2D(angle, v):
    """``[[cos a, -sin a], [sin a, cos a]] . v`` for a 2-vector v."""
    if not isinstance(v, Vec) or len(v) != 2:
        raise TypeError("Rotate2D: v must be a 2-channel Vec")
    c, s = sym.cos(_ex(angle)), sym.sin(_ex(angle))
    return Vec([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def Rotate3D(angles, v):
    """``M(angles) . v`` with ``M = Rz(g) Ry(b) Rx(a)`` for Euler angles ``(a, b, g)`` (spec 2.3,
    the reference implementation's row-major matrix), ``angles`` and ``v`` 3-channel Vecs."""
    if not isinstance(angles, Vec) or len(angles) != 3:
        raise TypeError("Rotate3D: angles must be a 3-channel Vec")
    if not isinstance(v, Vec) or len(v) != 3:
        raise TypeError("Rotate3D: v must be a 3-channel Vec")
    a, b_, g = (_ex(t) for t in angles.items)
    ca, sa, cb, sb, cg, sg = (sym.cos(a), sym.sin(a), sym.cos(b_), sym.sin(b_), sym.cos(g),
                              sym.sin(g))
    m = [[cg * cb, -sg * ca + cg * sb * sa, sg * sa + cg * sb * ca],
         [sg * cb, cg * ca + sg * sb * sa, -cg * sa + sg * sb * ca],
         [-sb, cb * sa, cb * ca]]
    x = [_ex(t) for t in v.items]
    return Vec([m[r][0] * x[0] + m[r][1] * x[1] + m[r][2] * x[2] for r in range(3)])


class ComputedArray:
    """``ComputedArray(name, dims, expr)``: an array defined by a stencil expression ``expr``
    written at the centre (spec 2.7). ``CA(dx, dy)`` is ``expr`` with every stencil read,
    ``InBounds`` and ``Index`` shifted by ``(dx, dy)``, so a residual reading it is exactly the
    residual with the expression inlined: derivatives flow through reads of unknowns (the
    Gauss-Newton J equals [R]'s frozen gradient tables at the linearisation point) and the
    expression's footprint joins the reading residual's default boundary mask. (Opt's
    materialisation is a scheduling choice; here the fused kernels recompute ``expr`` per
    use.) Vector expressions give a Vec. Graph reads are not allowed (spec 8: stencil only)."""

    def __init__(self, name, dims, expr):
        if not isinstance(name, str) or not name:
            raise TypeError("ComputedArray: name must be a non-empty string")
        self.name, self.dims = name, _dims(dims)
        self.items = list(expr.items) if isinstance(expr, Vec) else [_ex(expr)]
        self.is_vec = isinstance(expr, Vec)
        for it in self.items:
            for lf in sym.free_leaves(it):
                d = decode_leaf(lf)
                if isinstance(d, Read) and d.graph is not None:
                    raise TypeError(f"ComputedArray {name!r}: graph reads are not allowed")
                if isinstance(d, Read) and len(d.offset) != len(self.dims):
                    raise TypeError(f"ComputedArray {name!r}: read of {d.name!r} has "
                                    f"{len(d.offset)} offsets, the array has {len(self.dims)} dims")

    def __call__(self, *offset):
        if len(offset) not in (len(self.dims), len(self.dims) + 1) or not all(
                isinstance(o, numbers.Integral) for o in offset):
            raise TypeError(f"ComputedArray {self.name!r}: expected {len(self.dims)} integer "
                            f"offsets (plus an optional channel), got {offset!r}")
        off = tuple(int(o) for o in offset[: len(self.dims)])
        items = [_shift_expr(it, off) for it in self.items]
        if len(offset) > len(self.dims):
            return items[int(offset[-1])]
        return Vec(items) if self.is_vec else items[0]


def _shift_expr(e, off):
    if not any(off):
        return e
    mapping = {}
    for lf in sym.free_leaves(e):
        d = decode_leaf(lf)
        if isinstance(d, Read):
            o = tuple(a + b for a, b in zip(d.offset, off))
            mapping[lf] = sym.leaf(lf.kind, ("s", o, d.channel, lf.key[3]), lf.dtype)
        elif isinstance(d, InBoundsRef):
            mapping[lf] = InBounds(*(a + b for a, b in zip(d.offset, off)))
        elif isinstance(d, IndexRef):
            mapping[lf] = Index(d.dim) + float(off[d.dim])
    return sym.substitute(e, mapping)


def L_p(val, val_const, p, dims=None):
    """IRLS helper (spec 2.3 / Fig. 33): ``sqrt((||val_const||_2 + 1e-7)^(p - 2)) * val``.
    ``val_const`` must read constant views (``X.const()``) so the weight carries no derivative
    and is refreshed at every non-linear iteration; the sum of squares then approximates
    ``sum ||val||^p`` (IRLS). ``dims`` is accepted for the paper's signature."""
    items = val_const.items if isinstance(val_const, Vec) else [_ex(val_const)]
    for it in items:
        for lf in sym.free_leaves(it):
            d = decode_leaf(lf)
            if isinstance(d, Read) and d.role == "unknown":
                raise TypeError("L_p: val_const reads the unknown "
                                f"{d.name!r}; use its constant view {d.name}.const()")
    n2 = None
    for it in items:
        n2 = it * it if n2 is None else n2 + it * it
    w = sym.sqrt((sym.sqrt(n2) + 1e-7) ** (_ex(p) - 2.0))
    return val * w


_STOP_SCALE = 2.0 ** 32


def _stop_gradient(x):
    """x rounded to 2^-32 through an integer cast: the same value (to 2.3e-10) with zero
    derivative (core_ad has no stop-gradient op; casts to integers are not differentiable)."""
    return sym.astype(sym.astype(x * _STOP_SCALE, "int64"), _F) * (1.0 / _STOP_SCALE)


class SampledImage:
    """``SampledImage(image, image_dx, image_dy)``: an image readable at continuous coordinates
    (spec 2.8). ``S(u, v)`` (``S(u, v, c)`` for channel c) is the bilinear interpolation of
    ``image`` at ``(u, v)`` (array index space; corners outside the image read as 0), and its
    partials are the user-supplied ``image_dx`` / ``image_dy``, bilinearly sampled at (u, v).
    Implemented as ``S_I(u0, v0) + (u - u0) S_dx(u0, v0) + (v - v0) S_dy(u0, v0)`` with
    ``(u0, v0)`` the coordinates under a zero-derivative rounding to 2^-32 (so the value is the
    bilinear one to ~1e-10 and the derivative is exactly the sampled derivative images); the
    corners are read with ``core_ad.sym.gather`` from the whole arrays. 2-D arrays only."""

    def __init__(self, image, image_dx, image_dy):
        arrs = (image, image_dx, image_dy)
        if not all(isinstance(a, Array) and not isinstance(a, (Unknown, ConstView)) for a in arrs):
            raise TypeError("SampledImage: image, image_dx and image_dy must be Arrays")
        if len(image.dims) != 2 or any(a.dims != image.dims or a.channels != image.channels
                                       for a in arrs):
            raise TypeError("SampledImage: three 2-D Arrays with the same dims and channels")
        self.arrays = arrs
        self.dims, self.channels = image.dims, image.channels

    def _sample(self, arr, c, u, v):
        W = sym.leaf("__size__", (self.dims[0].name,), "int64")
        H = sym.leaf("__size__", (self.dims[1].name,), "int64")
        buf = sym.buffer(f"{arr.name}#{c}#{arr.decl!r}", _F)
        fu, fv = sym.floor(u), sym.floor(v)
        x0, y0 = sym.astype(fu, "int64"), sym.astype(fv, "int64")
        ax, ay = u - fu, v - fv
        out = None
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            xc, yc = x0 + dx, y0 + dy
            inb = sym.logical_and(sym.logical_and(xc >= 0, xc < W), sym.logical_and(yc >= 0, yc < H))
            idx = sym.where(inb, xc * H + yc, sym.const(0, "int64"))
            val = sym.where(inb, sym.gather(buf, idx), 0.0)
            w = (ax if dx else 1.0 - ax) * (ay if dy else 1.0 - ay)
            out = w * val if out is None else out + w * val
        return out

    def __call__(self, u, v, c=None):
        u, v = _ex(u), _ex(v)
        u0, v0 = _stop_gradient(u), _stop_gradient(v)
        im, ix, iy = self.arrays

        def one(ch):
            return (self._sample(im, ch, u0, v0) + (u - u0) * self._sample(ix, ch, u0, v0)
                    + (v - v0) * self._sample(iy, ch, u0, v0))

        if c is not None:
            if not 0 <= int(c) < self.channels:
                raise IndexError(f"SampledImage: channel {c} out of range")
            return one(int(c))
        if self.channels == 1:
            return one(0)
        return Vec([one(ch) for ch in range(self.channels)])


def Stencil(offsets):
    """Metaprogramming iterator over offset tuples (``for x, y in Stencil([(1, 0), ...])``)."""
    return [tuple(o) for o in offsets]


# --------------------------------------------------------------------------- energy
class Exclude:
    """``Exclude(cond)``: unknowns at points where ``cond`` holds are fixed (not in x; the
    optimised energy is unchanged -- spec 2.6 [REC]). ``cond`` reads data arrays at offset 0 on
    the unknowns' index space. Pass it to :class:`Energy`."""

    def __init__(self, cond):
        if isinstance(cond, Vec):
            cond = All(cond)
        self.cond = _as_bool(cond)


def residual_channels(term) -> list:
    """The scalar residual expressions of one ``Energy`` argument (one per channel)."""
    if isinstance(term, Vec):
        return list(term.items)
    if isinstance(term, sym.Expr):
        return [term]
    if isinstance(term, numbers.Number):
        return [sym.const(term)]
    raise TypeError(f"Energy: a residual term must be a scalar or vector expression, got {type(term).__name__}")


class Energy:
    """``Energy(*terms, Exclude(...)?)``: the sum over terms, channels and domain points of
    ``r^2``; the plan's cost is ``1/2 * sum r^2`` (spec 10.1). Energies add with ``+``."""

    def __init__(self, *terms):
        self.terms: list[list] = []
        self.excludes: list[Exclude] = []
        for t in terms:
            if isinstance(t, Exclude):
                self.excludes.append(t)
            elif isinstance(t, Energy):
                self.terms += t.terms
                self.excludes += t.excludes
            else:
                chans = residual_channels(t)
                for c in chans:
                    if c.dtype == np.bool_:
                        raise TypeError("Energy: a residual must be numeric, got a bool expression")
                self.terms.append(chans)

    def __add__(self, other):
        return Energy(self, other)

    def __repr__(self):
        return f"Energy({len(self.terms)} terms, {len(self.excludes)} excludes)"


# --------------------------------------------------------------------------- leaf decoding
@dataclass(frozen=True)
class Read:
    name: str
    role: str            # "unknown" | "array" | "view" (constant view of an unknown)
    dims: tuple          # dim names
    channels: int
    channel: int
    offset: tuple | None = None   # stencil reads
    graph: str | None = None      # graph reads
    slot: str | None = None
    index: int | None = None      # Opt's binding index, where declared


@dataclass(frozen=True)
class ParamRef:
    name: str
    index: int | None = None


@dataclass(frozen=True)
class InBoundsRef:
    offset: tuple


@dataclass(frozen=True)
class IndexRef:
    dim: int


@dataclass(frozen=True)
class BufferRef:
    """A whole data array channel read by a SampledImage (gather)."""
    name: str
    channel: int
    dims: tuple
    channels: int


@dataclass(frozen=True)
class SizeRef:
    dim: str


def decode_leaf(leaf):
    """What a leaf of a residual means (a Read, ParamRef, InBoundsRef, IndexRef), or None for
    a leaf that no lsq_opt declaration made."""
    kind, key = leaf.kind, leaf.key
    if kind == "buffer" and isinstance(key, str) and key.count("#") >= 2:
        name, c, decl = key.split("#", 2)
        try:
            role, dims, ch, *_ = ast.literal_eval(decl)
        except Exception:  # noqa: BLE001
            return None
        return BufferRef(name, int(c), tuple(dims), int(ch))
    if kind == "__size__":
        return SizeRef(str(key[0]))
    if kind == "__inbounds__":
        return InBoundsRef(tuple(key))
    if kind == "__index__":
        return IndexRef(int(key[0]))
    if not isinstance(key, tuple) or not key:
        return None
    if key == ("param",):
        return ParamRef(kind)
    if len(key) == 2 and key[0] == "param" and isinstance(key[1], int):
        return ParamRef(kind, key[1])
    try:
        if key[0] == "s" and len(key) == 4:
            _, off, c, (role, dims, ch, *index) = key
            return Read(kind, role, tuple(dims), int(ch), int(c), offset=tuple(off),
                        index=index[0] if index else None)
        if key[0] == "g" and len(key) == 5:
            _, g, s, c, (role, dims, ch, *index) = key
            return Read(kind, role, tuple(dims), int(ch), int(c), graph=g, slot=s,
                        index=index[0] if index else None)
    except (TypeError, ValueError):
        return None
    return None


