"""Interop: core_ad kernels inside PyTorch and JAX training loops (spec core-ad.md 1.14).

A *kernel* is a lane-wise symbolic computation (:mod:`core_ad.sym`): ``outputs`` (one
expression or a list) over ``inputs`` (the sym vars they depend on, in call order). The
wrappers compile it once -- the forward with ``sym.compile(outputs, inputs, backend)`` and its
VJP (one cotangent var per floating-point output, ``sym.vjp``, compiled over the inputs and the
cotangents) -- and cache both on the returned object (``compiled_forward``,
``compiled_vjp``).

* :func:`torch_function` -> a callable on ``torch.Tensor`` s backed by a
  ``torch.autograd.Function``. CPU only; a contiguous tensor reaches the kernel without a copy
  (``t.detach().numpy()``) and results come back without a copy (``torch.from_numpy``); a
  non-contiguous tensor is copied once (``.contiguous()``). ``torch.autograd.gradcheck``
  passes in float64; double backward works (the VJP is itself such a function).
* :func:`jax_function` -> a callable on JAX arrays backed by ``jax.custom_vjp`` whose primal
  and VJP run through ``jax.pure_callback``: works eagerly and under ``jax.jit``,
  ``jax.grad`` (also reverse-over-reverse) and ``jax.vmap``; not under ``jax.jvp``.
* :func:`to_torch` / :func:`from_torch`: ``core_ad.Array`` <-> CPU tensor, sharing memory.

Inputs are broadcast together into the lane shape (numpy rules, as in ``sym.compile``); the
gradient of an input that was broadcast is the **sum** over the lanes it was broadcast to
(a 0-d parameter used by every lane gets the sum of the per-lane cotangents). Input dtypes must
equal the vars' dtypes exactly (no silent casts); integer and bool inputs and outputs carry no
derivative (``None`` gradients). Wrong arity, a wrong dtype, a non-tensor input or a tensor on
another device raise an error naming the input. ``backend=None`` uses ``sym.compile``'s
default backend.

Importing this module does not import torch or jax.

Example::

    y, x = sym.var("y"), sym.var("x")
    f = torch_function(sym.arctan2(y, x), [y, x])
    ty = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    tx = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    f(ty, tx).backward()          # 0.4636; ty.grad = 0.4, tx.grad = -0.2
"""

from __future__ import annotations

from ._interop.jax_bridge import JaxFunction
from ._interop.torch_bridge import TorchFunction

__all__ = ["JaxFunction", "TorchFunction", "from_torch", "jax_function", "to_torch",
           "torch_function"]


def torch_function(outputs, inputs, *, backend=None):
    """Wrap the kernel ``outputs(inputs)`` as a differentiable function of torch tensors.

    Returns a :class:`TorchFunction` ``f``: ``f(*tensors)`` gives a tensor (one output) or a
    tuple of tensors (a list of outputs). Each tensor must be a dense CPU tensor of exactly its
    var's dtype; the tensors broadcast together into the lane shape. In backward the compiled
    VJP runs on the saved inputs and the incoming gradients, broadcast inputs get the sum over
    their lanes, inputs that do not require grad get ``None``. With ``backend="cuda"`` the
    tensors are CUDA tensors on one device and the kernel and its VJP run there (CuPy, memory
    shared through DLPack).
    """
    from ._interop.torch_bridge import torch_function as _tf

    return _tf(outputs, inputs, backend=backend)


def jax_function(outputs, inputs, *, backend=None):
    """Wrap the kernel ``outputs(inputs)`` as a ``jax.custom_vjp`` function.

    Returns a :class:`JaxFunction` ``f``: ``f(*arrays)`` gives an array (one output) or a
    tuple. Arrays must have exactly their var's dtype (float64 vars need
    ``jax.config.update("jax_enable_x64", True)``); Python scalars are converted to the var's
    dtype. Usable under ``jax.jit`` / ``jax.grad`` / ``jax.vmap`` (host callbacks).
    """
    from ._interop.jax_bridge import jax_function as _jf

    return _jf(outputs, inputs, backend=backend)


def to_torch(x, *, requires_grad: bool = False):
    """``core_ad.Array`` (or numpy array) -> CPU ``torch.Tensor`` sharing its memory."""
    from ._interop.torch_bridge import to_torch as _to

    return _to(x, requires_grad=requires_grad)


def from_torch(t, *, requires_grad: bool | None = None):
    """CPU ``torch.Tensor`` -> ``core_ad.Array`` sharing its memory (``requires_grad=None``
    mirrors the tensor's flag)."""
    from ._interop.torch_bridge import from_torch as _from

    return _from(t, requires_grad=requires_grad)
