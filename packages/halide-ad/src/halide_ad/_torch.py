"""PyTorch integration: ``torch_op`` turns a pipeline into a differentiable torch function
(spec section 6.1; CPU only).

The forward realises the pipeline; the backward realises the adjoint pipeline that
``propagate_adjoints(output, d_output)`` generates, recomputing forward intermediates from the
saved inputs (the paper's checkpoint-the-inputs strategy). Both pipelines are built once per
input signature (dtypes, shapes) and reused: each call points the pipeline's Buffers at the
new tensors' memory (numpy views of contiguous CPU tensors: no copies) and writes results
straight into tensors allocated by torch.

Axes: a torch tensor of shape ``(n, c, h, w)`` is a Buffer with ``x`` over ``w`` (Halide's
dimension 0 is the last axis, as for numpy arrays): ``buf[x, y, c, n]``.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from . import _expr as E
from ._buffer import Buffer
from ._derivative import propagate_adjoints
from ._func import Func, FuncError
from ._pipeline import Pipeline
from ._types import type_of_dtype

__all__ = ["TorchOp", "torch_op"]


def _torch():
    try:
        import torch
    except ImportError as e:  # an optional dependency
        raise ImportError("halide_ad.torch_op needs PyTorch (pip install torch)") from e
    return torch


_FUNCTION = None


def _function_class():
    """The one ``torch.autograd.Function`` all ops share (defined once torch is imported)."""
    global _FUNCTION
    if _FUNCTION is None:
        torch = _torch()
        from torch.autograd.function import once_differentiable

        class HalideFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, op, *tensors):
                ctx.op = op
                ctx.save_for_backward(*tensors)
                return op._forward(tensors)

            @staticmethod
            @once_differentiable  # the adjoint pipeline is not itself a torch graph
            def backward(ctx, grad):
                return (None, *ctx.op._backward(ctx.saved_tensors, grad,
                                                ctx.needs_input_grad[1:]))

        _FUNCTION = HalideFunction
    return _FUNCTION


def _array(t):
    """The numpy view of tensor ``t`` (a copy only if its rows are not contiguous: compiled
    loops need unit stride in x)."""
    a = t.detach().numpy()
    if a.ndim and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        a = np.ascontiguousarray(a)
    return a


class _ArgBuffer(Buffer):
    """The Buffer a build function receives for a tensor argument. Its data change with every
    call, so integer indices read symbolically too (``k[0]`` is ``k[hl.i32(0)]``; a plain
    Buffer would return the element's value at build time, a constant in the pipeline)."""

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        return super().__getitem__(tuple(E.i32(k) if isinstance(k, numbers.Integral) else k
                                         for k in key))


class _Signature:
    """One input signature's pipelines: the output Func, the Buffers / Params it reads from
    the tensors, its output shape, and the adjoint pipelines built so far."""

    def __init__(self, out, inputs, shape):
        self.out, self.inputs, self.shape = out, inputs, tuple(shape)
        self.forward = Pipeline(out)
        self.backward: dict = {}  # needs_input_grad -> (Pipeline, seed Buffer, [input index])

    def bind(self, arrays):
        for obj, a in zip(self.inputs, arrays):
            if isinstance(obj, E.Param):
                obj.set(a[()])
            else:
                obj._array = a  # the compiled pipeline reads a Buffer's memory at realize

    def adjoint(self, needs):
        entry = self.backward.get(needs)
        if entry is None:
            which = [i for i, (obj, n) in enumerate(zip(self.inputs, needs))
                     if n and obj.type().is_float()]
            if not which:
                return None
            t = self.out.type()
            seed = Buffer(np.zeros(self.shape, t.dtype), name=f"{self.out.name()}_dout")
            d = propagate_adjoints(self.out, seed)
            entry = self.backward[needs] = (Pipeline([d[self.inputs[i]] for i in which]), seed,
                                            which)
        return entry


class TorchOp:
    """A pipeline as a differentiable torch function: ``op(*tensors) -> tensor``. Made by
    :func:`torch_op`."""

    def __init__(self, build, out, inputs, output_shape, name):
        self._build, self._fixed_out, self._fixed_inputs = build, out, inputs
        self._output_shape = output_shape
        self.name = name
        self._signatures: dict = {}

    def __repr__(self):
        return f"TorchOp({self.name})"

    def __call__(self, *tensors):
        return _function_class().apply(self, *tensors)

    # ---- checks --------------------------------------------------------------------------
    def _check(self, tensors):
        torch = _torch()
        arrays = []
        n = len(self._fixed_inputs) if self._build is None else None
        if n is not None and len(tensors) != n:
            raise FuncError(f"torch_op {self.name}: expected {n} tensor(s), got {len(tensors)}")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise FuncError(
                    f"torch_op {self.name}: argument {i} is a {type(t).__name__}, not a tensor"
                )
            if t.device.type != "cpu":
                raise FuncError(
                    f"torch_op {self.name}: argument {i} is on device {t.device}; halide_ad's"
                    " torch ops run on CPU tensors (move it with .cpu())"
                )
            supported = _torch_dtypes().values()
            if t.dtype not in supported:
                raise FuncError(
                    f"torch_op {self.name}: argument {i} has dtype {t.dtype}; supported:"
                    f" {', '.join(str(d) for d in supported)}"
                )
            arrays.append(_array(t))
        return arrays

    def _signature(self, arrays):
        # integer Params (sizes, offsets) change bounds: part of the signature
        key = tuple((a.dtype.str, a.shape, a.item() if a.ndim == 0 and a.dtype.kind != "f"
                     else None) for a in arrays)
        sig = self._signatures.get(key)
        if sig is not None:
            return sig
        if self._build is None:
            inputs = self._fixed_inputs
            for i, (obj, a) in enumerate(zip(inputs, arrays)):
                want = obj.type().dtype
                dims = 0 if isinstance(obj, E.Param) else obj.dimensions()
                if a.dtype != want:
                    raise FuncError(
                        f"torch_op {self.name}: argument {i} ({obj.name()}) has dtype"
                        f" {a.dtype}, the pipeline reads {want}"
                    )
                if a.ndim != dims:
                    raise FuncError(
                        f"torch_op {self.name}: argument {i} ({obj.name()}) has"
                        f" {a.ndim} dimension(s), the pipeline reads {dims}"
                    )
            out = self._fixed_out
        else:
            inputs = [E.Param(type_of_dtype(a.dtype), f"{self.name}_in{i}", a[()]) if a.ndim == 0
                      else _ArgBuffer(a, name=f"{self.name}_in{i}") for i, a in enumerate(arrays)]
            out = self._build(*inputs)
            if not isinstance(out, Func):
                raise FuncError(
                    f"torch_op {self.name}: the build function must return a Func, got"
                    f" {type(out).__name__}"
                )
        out._require_defined()
        if len(out.types()) != 1 or not out.type().is_float():
            raise FuncError(
                f"torch_op {self.name}: the output {out.name()} must have one float value, it"
                f" has {', '.join(str(t) for t in out.types())}"
            )
        shape = self._shape([a.shape for a in arrays])
        if len(shape) != out.dimensions():
            raise FuncError(
                f"torch_op {self.name}: output shape {shape} has {len(shape)} dimension(s),"
                f" {out.name()} has {out.dimensions()}"
            )
        sig = self._signatures[key] = _Signature(out, list(inputs), shape)
        return sig

    def _shape(self, shapes):
        s = self._output_shape
        if s is None:
            nd = [sh for sh in shapes if len(sh)]
            if not nd:
                raise FuncError(f"torch_op {self.name}: no n-d input: give output_shape")
            return tuple(nd[0])
        if callable(s):
            s = s(*shapes)
        return tuple(int(v) for v in s)

    # ---- forward and backward -------------------------------------------------------------
    def _forward(self, tensors):
        torch = _torch()
        arrays = self._check(tensors)
        sig = self._signature(arrays)
        sig.bind(arrays)
        t = sig.out.type()
        out = torch.empty(sig.shape, dtype=_torch_dtypes()[np.dtype(t.dtype)])
        sig.forward.realize(Buffer(out.numpy()))  # written in place
        return out

    def _backward(self, tensors, grad, needs):
        torch = _torch()
        arrays = self._check(tensors)
        sig = self._signature(arrays)
        entry = sig.adjoint(tuple(bool(n) for n in needs))
        if entry is None:
            return [None] * len(tensors)
        pipe, seed, which = entry
        sig.bind(arrays)
        seed._array = _array(grad.contiguous())
        grads = [torch.empty(tensors[i].shape, dtype=tensors[i].dtype) for i in which]
        pipe.realize([Buffer(g.numpy()) for g in grads])
        res = [None] * len(tensors)
        for i, g in zip(which, grads):
            res[i] = g
        return res


@functools.cache
def _torch_dtypes():
    """numpy dtype -> torch dtype, for the dtypes a Buffer holds."""
    torch = _torch()
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
            np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
            np.dtype(np.int16): torch.int16, np.dtype(np.int8): torch.int8,
            np.dtype(np.uint8): torch.uint8}


def torch_op(pipeline, inputs=None, output_shape=None, name=None) -> TorchOp:
    """A differentiable torch function running ``pipeline`` on CPU tensors.

    ``pipeline`` is either a function ``build(*inputs) -> Func``, called once per input
    signature (dtypes and shapes) with an ``hl.Buffer`` for each n-d tensor and an ``hl.Param``
    for each 0-d one, or an output Func together with ``inputs``, the Buffers and Params it
    reads, in argument order (tensors must then match their dtypes and dimensions).
    ``output_shape``: the output's torch shape; a tuple, a function of the input shapes, or
    None (the first n-d input's shape). Gradients flow to every float input; integer inputs
    get None. One op runs one call at a time (calls share its Buffers)."""
    _torch()
    if isinstance(pipeline, Func):
        if inputs is None:
            raise FuncError(
                f"torch_op({pipeline.name()}): name the Buffers and Params it reads, in"
                " argument order (inputs=[...])"
            )
        inputs = list(inputs)
        for obj in inputs:
            if not isinstance(obj, (Buffer, E.Param)):
                raise FuncError(
                    f"torch_op({pipeline.name()}): inputs are Buffers and Params, got"
                    f" {type(obj).__name__}"
                )
        return TorchOp(None, pipeline, inputs, output_shape, name or pipeline.name())
    if not callable(pipeline):
        raise FuncError(
            f"torch_op: expected a Func or a function building one, got {type(pipeline).__name__}"
        )
    if inputs is not None:
        raise FuncError("torch_op: inputs are only given with an output Func; a build function"
                        " receives them")
    return TorchOp(pipeline, None, None, output_shape,
                   name or getattr(pipeline, "__name__", "op"))
