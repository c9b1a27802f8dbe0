"""Private implementation of :mod:`core_ad.interop`.

:class:`SymKernel` is the framework-independent part: a lane-wise symbolic kernel (outputs
over input leaves), its compiled forward, and -- built on demand -- its VJP, which is itself a
:class:`SymKernel` (over the inputs and one cotangent var per floating-point output), so a
bridge that differentiates through the VJP gets higher-order derivatives by recursion.

The bridges (:mod:`.torch_bridge`, :mod:`.jax_bridge`) import their framework inside
functions only: importing :mod:`core_ad` never imports torch or jax.
"""

from __future__ import annotations

import numpy as np

from .. import sym
from .._sym.buffers import is_buffer, is_scatter
from .._sym.program import check_inputs
from .._sym.graph import free_leaves

__all__ = ["SymKernel", "lane_shape", "reduce_axes", "run_lanes"]


def _compile(outputs, inputs, backend):
    # backend=None: whatever sym.compile defaults to (llvm or numpy): do not name one.
    if backend is None:
        return sym.compile(outputs, inputs)
    return sym.compile(outputs, inputs, backend=backend)


def _is_float(dt) -> bool:
    return np.dtype(dt).kind == "f"


class SymKernel:
    """A lane-wise kernel: compiled ``outputs`` over ``inputs`` and its (lazy) VJP kernel.

    * ``forward``: ``sym.compile(outputs, inputs, backend)``, ``fn(*arrays) -> tuple``.
    * ``diff_inputs`` / ``diff_outputs``: indices of the floating-point inputs / outputs (the
      only ones that carry derivatives; integer and bool ones are non-differentiable).
    * ``vjp``: ``None`` when no input is floating point, else a :class:`SymKernel` whose
      inputs are ``inputs + cotangent_vars`` (one var per differentiable output, of its dtype)
      and whose outputs are, per differentiable input, ``sum_i ct_i * d out_i / d in`` cast to
      that input's dtype, *per lane* (the caller reduces broadcast inputs).
    """

    def __init__(self, outputs, inputs, backend=None, *, where="interop", level=0):
        roots, single, inputs = check_inputs(outputs, inputs, where)
        for v in inputs:
            if is_buffer(v):
                raise NotImplementedError(
                    f"{where}: input {v.name!r} is a sym.buffer; the interop bridges wrap"
                    " lane-wise kernels only (every input broadcast to the lane shape)"
                )
            if v.dtype.kind == "c":
                raise NotImplementedError(
                    f"{where}: input {v.name!r} is complex ({v.dtype}); the interop bridges"
                    " support real dtypes only"
                )
        for i, r in enumerate(roots):
            if r.dtype.kind == "c":
                raise NotImplementedError(
                    f"{where}: output {i} is complex ({r.dtype}); the interop bridges support"
                    " real dtypes only"
                )
            if is_scatter(r):
                raise NotImplementedError(
                    f"{where}: output {i} is a scatter_add (a whole buffer); the interop"
                    " bridges wrap lane-wise kernels only"
                )
        self.where = where
        self.level = level
        self.outputs = roots
        self.single = single
        self.inputs = inputs
        self.backend = backend
        self.in_dtypes = [v.dtype for v in inputs]
        self.out_dtypes = [r.dtype for r in roots]
        self.names = [v.name for v in inputs]
        self.diff_inputs = [j for j, dt in enumerate(self.in_dtypes) if _is_float(dt)]
        self.diff_outputs = [i for i, dt in enumerate(self.out_dtypes) if _is_float(dt)]
        self.forward = _compile(roots, inputs, backend)
        self._vjp = None
        self._vjp_built = False

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def _cotangent_vars(self) -> list:
        taken = {id(v) for v in self.inputs} | {id(v) for v in free_leaves(self.outputs)}
        cots = []
        for i in self.diff_outputs:
            name = f"cotangent{self.level}_{i}"
            v = sym.var(name, self.out_dtypes[i])
            while id(v) in taken:
                name += "_"
                v = sym.var(name, self.out_dtypes[i])
            taken.add(id(v))
            cots.append(v)
        return cots

    @property
    def vjp(self) -> SymKernel | None:
        """The VJP kernel (built and compiled on first access, then cached)."""
        if not self._vjp_built:
            if self.diff_inputs:
                cots = self._cotangent_vars()
                wrt = [self.inputs[j] for j in self.diff_inputs]
                if self.diff_outputs:
                    grads = sym.vjp([self.outputs[i] for i in self.diff_outputs], wrt, cots)
                else:
                    grads = [sym.const(0.0, v.dtype) for v in wrt]
                grads = [
                    g if g.dtype == v.dtype else sym.astype(g, v.dtype)
                    for g, v in zip(grads, wrt)
                ]
                self._vjp = SymKernel(
                    grads,
                    self.inputs + cots,
                    self.backend,
                    where=self.where,
                    level=self.level + 1,
                )
            self._vjp_built = True
        return self._vjp

    def signature(self) -> str:
        return ", ".join(f"{n}: {dt}" for n, dt in zip(self.names, self.in_dtypes))

    def arity_error(self, got: int) -> TypeError:
        n = self.n_inputs
        return TypeError(
            f"{self.where}: the kernel takes {n} input{'s' if n != 1 else ''}"
            f" ({self.signature()}), got {got}"
        )

    def __repr__(self) -> str:
        outs = ", ".join(str(dt) for dt in self.out_dtypes)
        return f"SymKernel(({self.signature()}) -> ({outs}))"


def lane_shape(kernel: SymKernel, shapes) -> tuple:
    """The broadcast lane shape of the inputs (a ValueError naming the inputs otherwise)."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        desc = ", ".join(f"{n}: {tuple(s)}" for n, s in zip(kernel.names, shapes))
        raise ValueError(
            f"{kernel.where}: input shapes do not broadcast to one lane shape ({desc})"
        ) from None


def run_lanes(kernel: SymKernel, fn, arrays, xp=np) -> tuple:
    """``fn(*arrays)`` for a compiled kernel ``fn``, whatever its backend.

    The bridges accept inputs of any shapes that broadcast together (numpy rules); the
    backends differ (numpy broadcasts, LLVM and CUDA take 1-D arrays of N lanes or 0-d
    scalars, exact dtypes, contiguous). So the lanes are flattened here: an input of the full
    lane shape is passed as a 1-D view (no copy when it is contiguous), a one-element input or
    a stride-0 expansion of one value as a 0-d scalar, and only an input that is broadcast
    along some but not all axes (a ``(3, 1)`` against a ``(4,)``) is materialised (a copy).
    Each output is reshaped (a view) to the lane shape. ``xp``: the array module of
    ``arrays`` (numpy, or CuPy for the cuda backend).
    """
    lane = lane_shape(kernel, [a.shape for a in arrays])
    flat = []
    for a in arrays:
        a = xp.asarray(a)
        if a.ndim == 0:
            pass
        elif a.size > 1 and not any(a.strides):  # an expanded scalar (e.g. d(sum)/d(out))
            a = xp.asarray(a[(0,) * a.ndim], dtype=a.dtype)
        elif a.shape == lane:
            a = xp.ascontiguousarray(a).reshape(-1)
        elif a.size == 1:
            a = a.reshape(())
        else:
            a = xp.ascontiguousarray(xp.broadcast_to(a, lane)).reshape(-1)
        flat.append(a)
    return tuple(xp.asarray(o).reshape(lane) for o in fn(*flat))


def reduce_axes(shape, target) -> tuple:
    """Axes of an array of ``shape`` to sum (keepdims) so that it reshapes to ``target``:
    the leading axes ``target`` lacks, and the axes where ``target`` has size 1 (the
    transpose of numpy broadcasting)."""
    shape, target = tuple(shape), tuple(target)
    lead = len(shape) - len(target)
    if lead < 0:
        raise ValueError(f"cannot reduce shape {shape} to {target}")
    return tuple(range(lead)) + tuple(
        lead + k for k, s in enumerate(target) if s == 1 and shape[lead + k] != 1
    )
