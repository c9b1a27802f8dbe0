"""The primitive registry: one entry per primitive, from which every transform is derived.

A :class:`Primitive` carries

* ``impl``: evaluation on numpy arrays (the reference semantics);
* ``partials``: for lane-wise (elementwise) primitives, the local partial derivatives as
  expressions written with the public op functions, so the same rule evaluates on numpy
  arrays, on traced :class:`~core_ad.Array` values (giving higher order) and on symbolic
  expressions (giving the symbolic engine its derivatives);
* ``jvp`` / ``vjp``: for structural primitives (reductions, shapes, indexing, linear algebra),
  rules written the same way;
* ``cspell``: the C spelling of a lane-wise primitive, used by the code generators.

:func:`bind` applies a primitive to arguments. Each argument *kind* (plain numpy values, traced
arrays, symbolic expressions) registers a handler with :func:`register_kind`; the handler of the
highest-priority kind among the arguments processes the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class _Sentinel:
    """A partial derivative known to be a constant +1 or -1, so that no multiply is emitted."""

    __slots__ = ("name", "sign")

    def __init__(self, name: str, sign: int):
        self.name = name
        self.sign = sign

    def __repr__(self) -> str:
        return self.name


ONE = _Sentinel("ONE", 1)
NEG_ONE = _Sentinel("NEG_ONE", -1)


@dataclass(eq=False)
class Primitive:
    """A registered primitive operation.

    Attributes:
        name: unique name.
        impl: ``impl(*values, **params)`` on numpy arrays / Python scalars.
        partials: lane-wise primitives only. ``partials(args, out, wrt, **params)`` returns one
            entry per argument: an expression for the local partial, ``ONE``/``NEG_ONE``, or
            ``None`` when the argument receives no derivative (or ``wrt`` is false for it).
        jvp: structural primitives: ``jvp(tangents, args, out, nb, **params)``; ``tangents``
            holds ``None`` for zero tangents; ``nb`` is the number of leading direction axes
            the tangents carry (vector forward mode).
        vjp: structural primitives: ``vjp(ct, args, out, **params)`` returning one cotangent
            (or ``None``) per argument.
        differentiable: ``False`` for primitives whose output has zero derivative everywhere
            (comparisons, floor, casts to integers): their outputs are constants.
        elementwise: lane-wise (usable in the symbolic engine and in generated kernels).
        cspell: C spelling of a lane-wise primitive, a ``str.format`` template over the
            operand spellings ``{0}, {1}, ...``.
        doc: the convention at non-differentiable points, if any.
    """

    name: str
    impl: Callable[..., Any]
    partials: Callable[..., tuple] | None = None
    jvp: Callable[..., Any] | None = None
    vjp: Callable[..., tuple] | None = None
    differentiable: bool = True
    elementwise: bool = False
    cspell: str | None = None
    doc: str = ""
    variadic: bool = False
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Primitive({self.name})"

    def __call__(self, *args, **params):
        return bind(self, *args, **params)


_REGISTRY: dict[str, Primitive] = {}


def register(prim: Primitive) -> Primitive:
    """Add ``prim`` to the registry; names are unique."""
    if prim.name in _REGISTRY:
        raise ValueError(f"primitive {prim.name!r} is already registered")
    if prim.differentiable and prim.partials is None and prim.vjp is None:
        raise ValueError(f"differentiable primitive {prim.name!r} needs partials or a vjp rule")
    _REGISTRY[prim.name] = prim
    return prim


def get_primitive(name: str) -> Primitive:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown primitive {name!r}") from None


def primitives() -> dict[str, Primitive]:
    """A copy of the registry, name -> Primitive."""
    return dict(_REGISTRY)


@dataclass(frozen=True)
class _Kind:
    cls: type
    priority: int
    process: Callable[[Primitive, tuple, dict], Any]
    broadcasts: bool


_KINDS: dict[type, _Kind] = {}


def register_kind(
    cls: type,
    priority: int,
    process: Callable[[Primitive, tuple, dict], Any],
    broadcasts: bool = True,
):
    """Declare that values of type ``cls`` are processed by ``process(prim, args, params)``.

    Plain numpy values have no kind and are evaluated with ``prim.impl``; traced arrays and
    symbolic expressions register kinds with higher priorities. ``broadcasts`` says whether
    values of this kind have shapes that lane-wise ops must broadcast explicitly (traced arrays)
    or are lane-wise scalars (symbolic expressions). Subclasses of ``cls`` inherit the kind.
    """
    _KINDS[cls] = _Kind(cls, priority, process, broadcasts)


def kind_of(value) -> _Kind | None:
    kind = _KINDS.get(type(value))
    if kind is not None:
        return kind
    for cls, kind in _KINDS.items():
        if isinstance(value, cls):
            _KINDS[type(value)] = kind
            return kind
    return None


def bind(prim: Primitive, *args, **params):
    """Apply ``prim`` to ``args``, dispatching on the highest-priority argument kind."""
    best = None
    for a in args:
        kind = kind_of(a)
        if kind is not None:
            if best is None or kind.priority > best.priority:
                best = kind
            elif kind.priority == best.priority and kind is not best:
                raise TypeError(
                    f"{prim.name}: cannot mix {best.cls.__name__} and {kind.cls.__name__} operands"
                )
    if best is None:
        return prim.impl(*args, **params)
    return best.process(prim, args, params)


def is_sentinel(p) -> bool:
    return isinstance(p, _Sentinel)


def shape_of(x) -> tuple:
    """Shape of a numpy value, Python scalar or traced array (symbolic values are scalars)."""
    s = getattr(x, "shape", None)
    if s is None:
        return ()
    return tuple(s)


def dtype_of(x) -> np.dtype:
    d = getattr(x, "dtype", None)
    if d is not None:
        return np.dtype(d)
    return np.asarray(x).dtype
