"""``hl.BoundaryConditions``: Funcs that extend a Buffer (or a bounded Func) to all integer
coordinates. Each returns an ordinary Func (inlined by default) whose reads of the source stay
inside ``bounds`` (default: the buffer's own extent), so bounds inference proves them safe."""

from __future__ import annotations

from . import _expr as E
from ._buffer import Buffer
from ._func import Func, FuncError

__all__ = [
    "constant_exterior",
    "mirror_image",
    "mirror_interior",
    "repeat_edge",
    "repeat_image",
]


def _bounds(source, bounds):
    if bounds is not None:
        out = []
        for k, b in enumerate(bounds):
            lo, ext = (b.min, b.extent) if isinstance(b, E.Range) else b
            out.append((E.as_expr(lo), E.as_expr(ext)))
        return out
    if isinstance(source, Buffer):
        return source._rdom_bounds()
    raise FuncError("BoundaryConditions on a Func need explicit bounds [(min, extent), ...]")


def _wrap(source, bounds, name, coord_map, outside=None):
    bs = _bounds(source, bounds)
    n = len(bs)
    dims = source.dimensions()
    if n != dims:
        raise FuncError(f"BoundaryConditions.{name}: {n} bounds for a {dims}-dimensional source")
    vs = [E.Var(f"_{k}") for k in range(n)]
    coords = [coord_map(v, lo, ext) for v, (lo, ext) in zip(vs, bs)]
    f = Func(f"{source.name()}_{name}")
    value = source[tuple(coords)]
    if outside is not None:
        inside = None
        for v, (lo, ext) in zip(vs, bs):
            c = (v >= lo) & (v < lo + ext)
            inside = c if inside is None else inside & c
        value = E.select(inside, value, outside(value))
    f[tuple(vs)] = value
    return f


def repeat_edge(source, bounds=None) -> Func:
    """Coordinates clamped into the bounds."""
    return _wrap(source, bounds, "repeat_edge",
                 lambda v, lo, ext: E.clamp(v, lo, lo + ext - 1))


def constant_exterior(source, value, bounds=None) -> Func:
    """``value`` outside the bounds (the read inside is clamped, so it is always safe)."""
    return _wrap(source, bounds, "constant_exterior",
                 lambda v, lo, ext: E.clamp(v, lo, lo + ext - 1),
                 outside=lambda inner: E.cast(inner.type(), value)
                 if not E._is_literal(value) else value)


def repeat_image(source, bounds=None) -> Func:
    """The image tiled periodically."""
    return _wrap(source, bounds, "repeat_image",
                 lambda v, lo, ext: (v - lo) % ext + lo)


def mirror_image(source, bounds=None) -> Func:
    """Reflected at the edges, the edge pixel repeated (period 2 * extent)."""

    def m(v, lo, ext):
        t = (v - lo) % (2 * ext)
        # the clamp changes no value; it tells bounds inference the result is in range
        return E.clamp(E.select(t < ext, t, 2 * ext - 1 - t), 0, ext - 1) + lo

    return _wrap(source, bounds, "mirror_image", m)


def mirror_interior(source, bounds=None) -> Func:
    """Reflected at the edges without repeating the edge pixel (period 2 * extent - 2)."""

    def m(v, lo, ext):
        period = E.max(2 * ext - 2, 1)
        t = (v - lo) % period
        return E.clamp(E.select(t < ext, t, 2 * ext - 2 - t), 0, ext - 1) + lo

    return _wrap(source, bounds, "mirror_interior", m)
