"""Buffers in lane-wise kernels: whole arrays read (gather) or accumulated into (scatter_add)
at per-lane integer indices.

``buffer(name, dtype)`` is a leaf of kind ``"buffer"``; compiled functions take it as a whole
1-D array (it is not broadcast into the lane shape). ``gather(buf, index)`` reads it per lane;
``scatter_add(buf, index, value)`` is an *output*: a copy of the buffer with each lane's value
added at its index. Indices are bounds-checked in every backend. ``lane_sum(value)`` is an
output too: the sum of ``value`` over all lanes (a scalar).
"""

from __future__ import annotations

from .. import _rules as R
from .expr import Apply, Expr, Leaf, as_expr, leaf

__all__ = ["buffer", "gather", "lane_sum", "scatter_add"]


def buffer(name: str, dtype="float64") -> Leaf:
    """A whole-array input of a kernel, read with :func:`gather`, written with
    :func:`scatter_add`."""
    return leaf("buffer", name, dtype)


def is_buffer(n) -> bool:
    return isinstance(n, Leaf) and n.kind == "buffer"


def is_scatter(n) -> bool:
    return isinstance(n, Apply) and n.prim.extra.get("scatter", False)


def is_reduction(n) -> bool:
    return isinstance(n, Apply) and n.prim.extra.get("reduction", False)


def _check(buf, index, op):
    if not is_buffer(buf):
        raise TypeError(f"{op}: the first operand must be a sym.buffer, got {buf!r}")
    index = as_expr(index, op)
    if index.dtype.kind not in "iu":
        raise TypeError(f"{op}: the index must be an integer expression, got dtype {index.dtype}")
    return index


def gather(buf: Leaf, index) -> Expr:
    """Per-lane ``buf[index]`` (IndexError on an out-of-range index, naming the buffer)."""
    index = _check(buf, index, "gather")
    return R.lane_gather(buf, index, name=str(buf.key))


def scatter_add(buf: Leaf, index, value) -> Expr:
    """Kernel output: a copy of ``buf`` with each lane's ``value`` added at ``index``."""
    index = _check(buf, index, "scatter_add")
    value = as_expr(value, "scatter_add")
    if value.dtype != buf.dtype:
        value = R.astype(value, buf.dtype)
    return R.lane_scatter_add(buf, index, value, name=str(buf.key))


def lane_sum(value) -> Expr:
    """Kernel output: the sum of ``value`` over all lanes (a scalar; compensated summation in
    the LLVM backend)."""
    value = as_expr(value, "lane_sum")
    if value.dtype.kind != "f":
        raise TypeError(f"lane_sum: the value must be floating point, got dtype {value.dtype}")
    return R.lane_sum(value)


def check_scatter_outputs(prog, roots) -> None:
    """A scatter_add is an effect on a buffer and a lane_sum is not a lane value: either may
    only be an output, never an operand."""
    for _, n in prog.assignments:
        if isinstance(n, Apply):
            for a in n.args:
                if is_scatter(a) or is_reduction(a):
                    what = "scatter_add" if is_scatter(a) else "lane_sum"
                    raise ValueError(
                        f"{what} can only be an output of a kernel, not an operand of"
                        f" {n.prim.name}"
                    )
