"""JAX bridge: a compiled core_ad kernel as a ``jax.custom_vjp`` function.

The primal and the VJP run on the host through ``jax.pure_callback`` (result shapes and
dtypes: the broadcast lane shape of the inputs and the outputs' dtypes), so the function works
eagerly and under ``jax.jit``, ``jax.grad`` and ``jax.vmap`` (``vmap_method="expand_dims"``:
the callback realigns the added batch axes in front of the lane axes). The backward pass calls
the VJP kernel -- itself such a function -- and sums the per-lane cotangent of every broadcast
input back to the input's shape, so reverse-over-reverse derivatives work by recursion.
(Forward mode, ``jax.jvp``, is not available for a ``custom_vjp`` function.)

JAX is imported inside functions only.
"""

from __future__ import annotations

import numpy as np

from . import SymKernel, lane_shape, reduce_axes, run_lanes

__all__ = ["JaxFunction", "jax_function"]


def _jnp_sum_to_shape(g, target):
    import jax.numpy as jnp

    target = tuple(target)
    if tuple(np.shape(g)) == target:
        return g
    axes = reduce_axes(np.shape(g), target)
    return jnp.sum(g, axis=axes, keepdims=True).reshape(target)


def _scalar_ok(a, dt: np.dtype) -> bool:
    if isinstance(a, bool):
        return True
    if isinstance(a, int):
        return dt.kind in "iuf"
    if isinstance(a, float):
        return dt.kind == "f"
    return False


class JaxFunction:
    """A compiled core_ad kernel callable on JAX arrays, differentiable by ``jax.grad``.

    Made by :func:`core_ad.interop.jax_function`. Attributes: ``kernel``, ``fun`` (the
    ``jax.custom_vjp`` function taking arrays of exactly the inputs' dtypes and returning a
    tuple), ``compiled_forward`` / ``compiled_vjp`` (the cached ``sym.compile`` callables),
    ``inputs``, ``outputs``, ``backend``.
    """

    def __init__(self, kernel: SymKernel, *, eager_vjp: bool = True):
        self.kernel = kernel
        self.compiled_forward = kernel.forward
        self.compiled_vjp = kernel.vjp.forward if eager_vjp and kernel.vjp is not None else None
        self._vjp_function = None
        self.fun = self._build()

    inputs = property(lambda self: self.kernel.inputs)
    outputs = property(lambda self: self.kernel.outputs)
    backend = property(lambda self: self.kernel.backend)

    @property
    def vjp_function(self) -> JaxFunction:
        """The VJP kernel as a :class:`JaxFunction` (over ``inputs + cotangents``)."""
        if self._vjp_function is None:
            vk = self.kernel.vjp
            if vk is None:
                raise RuntimeError(f"{self.kernel.where}: the kernel has no floating-point input")
            self.compiled_vjp = vk.forward
            self._vjp_function = JaxFunction(vk, eager_vjp=False)
        return self._vjp_function

    def _host_call(self, args):
        import jax

        k = self.kernel
        shapes = [tuple(np.shape(a)) for a in args]  # args may be TypedFloat literals
        lane = lane_shape(k, shapes)
        specs = tuple(jax.ShapeDtypeStruct(lane, dt) for dt in k.out_dtypes)
        ndims = [len(s) for s in shapes]
        rank = len(lane)

        def host(*arrays):
            arrays = [np.asarray(a) for a in arrays]
            if arrays and arrays[0].ndim > ndims[0]:
                # under vmap (expand_dims) every argument gained the same leading batch axes;
                # put them in front of the lane axes before numpy broadcasting
                extra = arrays[0].ndim - ndims[0]
                arrays = [
                    a.reshape(a.shape[:extra] + (1,) * (rank - nd) + a.shape[extra:])
                    for a, nd in zip(arrays, ndims)
                ]
            outs = run_lanes(k, self.compiled_forward, arrays)
            return tuple(np.asarray(o, dtype=dt) for o, dt in zip(outs, k.out_dtypes))

        return jax.pure_callback(host, specs, *args, vmap_method="expand_dims")

    def _build(self):
        import jax

        k = self.kernel

        def primal(*args):
            return self._host_call(args)

        fun = jax.custom_vjp(primal)

        def fwd(*args):
            # fun, not primal: an outer differentiation of fwd (reverse-over-reverse) then
            # uses this custom VJP again instead of the callback, which has no JVP rule
            return fun(*args), args

        def bwd(res, cts):
            out = [None] * len(res)  # None: zero cotangent (integer inputs)
            if k.diff_inputs:
                cots = [cts[i] for i in k.diff_outputs]
                lane_grads = self.vjp_function.fun(*res, *cots)
                for n, j in enumerate(k.diff_inputs):
                    # a broadcast input gets the sum over the lanes it was broadcast to
                    out[j] = _jnp_sum_to_shape(lane_grads[n], np.shape(res[j]))
            return tuple(out)

        fun.defvjp(fwd, bwd)
        return fun

    def _convert(self, args):
        import jax
        import jax.numpy as jnp

        k = self.kernel
        if len(args) != k.n_inputs:
            raise k.arity_error(len(args))
        for dt, what in [(v.dtype, f"var {v.name!r}") for v in k.inputs] + [
            (dt, f"output {i}") for i, dt in enumerate(k.out_dtypes)
        ]:
            if np.dtype(jax.dtypes.canonicalize_dtype(dt)) != dt:
                raise TypeError(
                    f"{k.where}: {what} is {dt} but JAX runs with 64-bit types disabled;"
                    " enable them with jax.config.update('jax_enable_x64', True) or use"
                    " 32-bit vars"
                )
        out = []
        for j, (a, v) in enumerate(zip(args, k.inputs)):
            what = f"{k.where}: input {j} ({v.name!r})"
            if isinstance(a, bool | int | float):
                if not _scalar_ok(a, v.dtype):
                    raise TypeError(f"{what}: a Python {type(a).__name__} for a {v.dtype} var")
                out.append(jnp.asarray(a, dtype=v.dtype))
                continue
            if not isinstance(a, jax.Array | np.ndarray | np.generic):
                raise TypeError(
                    f"{what} must be a JAX or numpy array, got {type(a).__name__}"
                )
            if np.dtype(a.dtype) != v.dtype:
                raise TypeError(
                    f"{what} has dtype {np.dtype(a.dtype)} but the var {v.name!r} is {v.dtype};"
                    f" convert with .astype({str(v.dtype)!r}) or declare the var with dtype"
                    f" {str(np.dtype(a.dtype))!r}"
                )
            out.append(a if isinstance(a, jax.Array) else jnp.asarray(a))
        lane_shape(k, [tuple(np.shape(a)) for a in out])
        return out

    def __call__(self, *args):
        """Evaluate (broadcasting the inputs into the lane shape): an array, or a tuple of
        arrays for a list of outputs."""
        out = self.fun(*self._convert(args))
        return out[0] if self.kernel.single else out

    def __repr__(self) -> str:
        return f"JaxFunction({self.kernel!r})"


def jax_function(outputs, inputs, *, backend=None) -> JaxFunction:
    """See :func:`core_ad.interop.jax_function`."""
    return JaxFunction(SymKernel(outputs, inputs, backend, where="jax_function"))
