"""PyTorch bridge: a compiled core_ad kernel as a ``torch.autograd.Function``.

The Enoki <-> PyTorch pattern of the spec (core-ad.md section 1.14): forward converts the
tensors to arrays, runs the compiled kernel and hands the results back as tensors; backward
seeds the cotangents (``grad_outputs``), runs the compiled VJP and returns one gradient per
input that requires it (``None`` otherwise).

Memory: a contiguous CPU tensor is passed to the kernel as ``t.detach().numpy()`` -- a view,
no copy -- and each result array becomes a tensor with ``torch.from_numpy`` -- again no copy.
A non-contiguous tensor is first made contiguous with ``t.contiguous()``: **one copy** of that
input (the compiled backends are only promised dense arrays). An expansion of a single value
(all strides 0, e.g. the cotangent that ``.sum()`` sends back) is passed as a 0-d scalar
instead, without materialising it. An input broadcast along some but not all lane axes (a
``(3, 1)`` against a ``(4,)``) is materialised to the lane shape (one copy): the kernels take
flat lanes (see :func:`core_ad._interop.run_lanes`).

CUDA tensors: with ``torch_function(..., backend="cuda")`` the kernel and its VJP run on the
tensors' device. Tensors and CuPy arrays exchange memory through DLPack (no copies, and DLPack
orders torch's and CuPy's streams); the lanes are flattened as on the CPU.

Torch is imported inside functions only (the ``autograd.Function`` subclass is created on first
use), so importing this module does not import torch.
"""

from __future__ import annotations

import functools

import numpy as np

from . import SymKernel, lane_shape, run_lanes

__all__ = ["TorchFunction", "from_torch", "to_torch", "torch_function"]


@functools.cache
def _torch_dtype(np_dtype):
    import torch

    return torch.from_numpy(np.empty(0, np_dtype)).dtype


def _tensor_from_array(a, avoid=()):
    """``torch.from_numpy(a)`` without a copy where torch can share ``a``'s memory; copies a
    read-only array, one with negative strides or non-native byte order, and one that may
    share memory with an array in ``avoid`` (a kernel output must be a fresh tensor)."""
    import torch

    a = np.asarray(a)
    if (
        not a.flags.writeable
        or not a.dtype.isnative
        or any(s < 0 for s in a.strides)
        or any(np.may_share_memory(a, b) for b in avoid)
    ):
        a = np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
    return torch.from_numpy(a)


def _as_numpy(t):
    """A validated CPU tensor as a numpy array: a view when contiguous, else one copy."""
    t = t.detach()
    if not t.is_contiguous() and (t.dim() == 0 or any(t.stride())):
        t = t.contiguous()  # documented copy: compiled kernels get dense arrays
    # (an all-stride-0 expansion of one value is passed as is: run_lanes makes it a scalar)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.numpy()


def _as_device_array(t):
    """A validated CUDA tensor as a CuPy array sharing its memory (DLPack); a non-contiguous
    one is first made contiguous (one copy), and a stride-0 expansion of one value stays a
    stride-0 view of that value (never materialised)."""
    import cupy

    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dim() > 0 and not any(t.stride()):
        one = cupy.from_dlpack(t.as_strided((), (), t.storage_offset()))
        return cupy.broadcast_to(one, tuple(t.shape))
    if not t.is_contiguous():
        t = t.contiguous()  # documented copy: compiled kernels get dense arrays
    return cupy.from_dlpack(t)


def _forward_on_device(tf, tensors) -> tuple:
    """The cuda backend's forward: CuPy views of the tensors, the kernel on their device,
    the outputs handed back to torch without a copy."""
    import cupy
    import torch

    arrays = [_as_device_array(t) for t in tensors]
    with cupy.cuda.Device(tensors[0].device.index):
        outs = run_lanes(tf.kernel, tf.compiled_forward, arrays, xp=cupy)
    return tuple(torch.from_dlpack(o) for o in outs)


@functools.cache
def _autograd_function_cls():
    import torch

    class SymKernelFunction(torch.autograd.Function):
        """``apply(tf, *tensors)``: ``tf`` is the :class:`TorchFunction` holding the kernel."""

        @staticmethod
        def forward(tf, *tensors):
            if tf.kernel.backend == "cuda":
                return _forward_on_device(tf, tensors)
            arrays = [_as_numpy(t) for t in tensors]
            outs = run_lanes(tf.kernel, tf.compiled_forward, arrays)
            results = []
            for o in outs:
                results.append(_tensor_from_array(o, avoid=arrays + [r.numpy() for r in results]))
            return tuple(results)

        @staticmethod
        def setup_context(ctx, inputs, output):
            tf, *tensors = inputs
            ctx.tf = tf
            ctx.save_for_backward(*tensors)
            k = tf.kernel
            nondiff = [output[i] for i in range(len(output)) if i not in k.diff_outputs]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)

        @staticmethod
        def backward(ctx, *grads):
            tf = ctx.tf
            k = tf.kernel
            tensors = ctx.saved_tensors
            need = ctx.needs_input_grad[1:]
            result = [None] * len(tensors)
            if not any(need[j] for j in k.diff_inputs):
                return (None, *result)
            cots = []
            for i in k.diff_outputs:
                g = grads[i]
                if g is None:  # only if materialize_grads were turned off
                    g = torch.zeros((), dtype=_torch_dtype(k.out_dtypes[i]),
                                    device=tensors[0].device if tensors else None)
                cots.append(g)
            # the VJP kernel is itself a TorchFunction: differentiable when create_graph=True
            lane_grads = tf.vjp_function._apply(*tensors, *cots)
            for n, j in enumerate(k.diff_inputs):
                if need[j]:
                    g = lane_grads[n]
                    shape = tensors[j].shape
                    if g.shape != shape:  # broadcast input: sum the lanes (broadcast <-> sum)
                        g = g.sum_to_size(shape)
                    result[j] = g
            return (None, *result)

        @staticmethod
        def vmap(info, in_dims, tf, *tensors):
            # torch.vmap / torch.func: put the batch axis in front of the lane axes (an
            # unbatched input broadcasts against it as usual), run the kernel once.
            k = tf.kernel
            dims = in_dims[1:]
            base = [
                t.shape if d is None else t.shape[:d] + t.shape[d + 1 :]
                for t, d in zip(tensors, dims)
            ]
            rank = len(lane_shape(k, base))
            moved = []
            for t, d, s in zip(tensors, dims, base):
                if d is not None:
                    t = t.movedim(d, 0)
                    t = t.reshape((t.shape[0],) + (1,) * (rank - len(s)) + tuple(s))
                moved.append(t)
            out = tf._apply(*moved)
            return out, (0,) * len(out)

    return SymKernelFunction


class TorchFunction:
    """A compiled core_ad kernel callable on torch tensors, differentiable by torch autograd.

    Made by :func:`core_ad.interop.torch_function`. Attributes: ``kernel``
    (:class:`~core_ad._interop.SymKernel`), ``compiled_forward`` and ``compiled_vjp`` (the
    cached ``sym.compile`` callables), ``inputs``, ``outputs``, ``backend``.
    """

    def __init__(self, kernel: SymKernel, *, eager_vjp: bool = True):
        self.kernel = kernel
        self.compiled_forward = kernel.forward
        self._vjp_function = None
        if eager_vjp and kernel.vjp is not None:
            self.compiled_vjp = kernel.vjp.forward
        else:
            self.compiled_vjp = None

    inputs = property(lambda self: self.kernel.inputs)
    outputs = property(lambda self: self.kernel.outputs)
    backend = property(lambda self: self.kernel.backend)

    @property
    def vjp_function(self) -> TorchFunction:
        """The VJP kernel as a :class:`TorchFunction` (over ``inputs + cotangents``)."""
        if self._vjp_function is None:
            vk = self.kernel.vjp
            if vk is None:
                raise RuntimeError(f"{self.kernel.where}: the kernel has no floating-point input")
            self.compiled_vjp = vk.forward
            self._vjp_function = TorchFunction(vk, eager_vjp=False)
        return self._vjp_function

    def _check(self, tensors):
        import torch

        k = self.kernel
        if len(tensors) != k.n_inputs:
            raise k.arity_error(len(tensors))
        on_device = k.backend == "cuda"
        device = None
        for j, (t, v) in enumerate(zip(tensors, k.inputs)):
            what = f"{k.where}: input {j} ({v.name!r})"
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"{what} must be a torch.Tensor, got {type(t).__name__}; wrap it, e.g."
                    f" torch.tensor(value, dtype={_torch_dtype(v.dtype)})"
                )
            if on_device:
                if t.device.type != "cuda":
                    raise ValueError(
                        f"{what} is on device {t.device}; this kernel was compiled for the"
                        " 'cuda' backend and takes CUDA tensors: move it with .cuda()"
                    )
                if device is not None and t.device != device:
                    raise ValueError(
                        f"{what} is on {t.device} but input 0 is on {device}: every input of"
                        " a 'cuda' kernel must be on the same device"
                    )
                device = t.device
            elif t.device.type != "cpu":
                raise ValueError(
                    f"{what} is on device {t.device}; this kernel runs on the CPU. CUDA"
                    " tensors need the 'cuda' backend (torch_function(..., backend='cuda')),"
                    " or move the tensor with .cpu()"
                )
            if t.layout != torch.strided:
                raise TypeError(f"{what} has layout {t.layout}; only dense (strided) tensors")
            expected = _torch_dtype(v.dtype)
            if t.dtype != expected:
                raise TypeError(
                    f"{what} has dtype {t.dtype} but the var {v.name!r} is {v.dtype}"
                    f" ({expected}); convert with .to({expected}) or declare the var with"
                    f" dtype {str(t.dtype).removeprefix('torch.')!r}"
                )
        lane_shape(k, [t.shape for t in tensors])

    def _apply(self, *tensors) -> tuple:
        self._check(tensors)
        return _autograd_function_cls().apply(self, *tensors)

    def __call__(self, *tensors):
        """Evaluate on tensors (broadcast together into the lane shape): a tensor, or a tuple
        of tensors for a list of outputs."""
        out = self._apply(*tensors)
        return out[0] if self.kernel.single else out

    def __repr__(self) -> str:
        return f"TorchFunction({self.kernel!r})"


def torch_function(outputs, inputs, *, backend=None) -> TorchFunction:
    """See :func:`core_ad.interop.torch_function`."""
    return TorchFunction(SymKernel(outputs, inputs, backend, where="torch_function"))


def to_torch(x, *, requires_grad: bool = False):
    """A ``core_ad.Array`` (or numpy array) as a CPU ``torch.Tensor`` sharing its memory.

    Zero-copy (``torch.from_numpy``) except for read-only arrays, arrays with negative strides
    or non-native byte order, which are copied. The tensor is a new torch leaf: gradients do
    not flow between the two graphs (wrap kernels with :func:`torch_function` for that).
    """
    from .._tracing import Array

    a = x.value if isinstance(x, Array) else np.asarray(x)
    t = _tensor_from_array(a)
    if requires_grad:
        t.requires_grad_(True)
    return t


def from_torch(t, *, requires_grad: bool | None = None):
    """A CPU ``torch.Tensor`` as a ``core_ad.Array`` sharing its memory (``t.detach().numpy()``,
    no copy, any strides). ``requires_grad=None`` mirrors ``t.requires_grad``; the Array is a
    new core_ad leaf (gradients do not flow between the two graphs)."""
    import torch

    from .._tracing import Array

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_torch: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"from_torch: the tensor is on device {t.device}; core_ad arrays live on the CPU"
            " (move it with .cpu())"
        )
    rg = bool(t.requires_grad) if requires_grad is None else bool(requires_grad)
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return Array(t.numpy(), requires_grad=rg)
