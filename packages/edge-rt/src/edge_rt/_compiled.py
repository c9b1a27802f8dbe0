"""Per-lane core_ad expressions as torch operations: one compiled kernel each for the value,
the reverse-mode product (VJP) and the forward-mode product (JVP), so a wavefront stage costs
one pass over its lanes instead of one torch operation per arithmetic step."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from core_ad import sym
from core_ad.codegen import host_empty


class CompiledOp:
    """``build(dtype) -> (input vars, output exprs)``, both flat lists of scalar lanes, grouped
    into torch tensors of shape (N, width) by ``input_widths`` / ``output_widths``.
    ``differentiable[i]`` says whether input group i gets a cotangent / tangent."""

    def __init__(self, build: Callable, input_widths: Sequence[int], output_widths: Sequence[int],
                 differentiable: Sequence[bool] | None = None):
        self.build = build
        self.input_widths, self.output_widths = tuple(input_widths), tuple(output_widths)
        self.differentiable = (tuple(differentiable) if differentiable is not None
                               else (True,) * len(self.input_widths))
        self._kernels: dict = {}
        op = self

        class _Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                ctx.save_for_backward(*inputs)
                ctx.save_for_forward(*inputs)
                return op._split(op._run("value", inputs, ()))

            @staticmethod
            def backward(ctx, *grads):
                inputs = ctx.saved_tensors
                n, dtype = inputs[0].shape[0], inputs[0].dtype
                cts = [g if g is not None else torch.zeros(n, w, dtype=dtype)
                       for g, w in zip(grads, op.output_widths)]
                flat = op._run("vjp", inputs, cts)
                out, k = [], 0
                for w, diff in zip(op.input_widths, op.differentiable):
                    out.append(flat[:, k:k + w] if diff else None)
                    k += w if diff else 0
                return tuple(out)

            @staticmethod
            def jvp(ctx, *tangents):
                inputs = ctx.saved_tensors
                ts = [t if t is not None else torch.zeros_like(x)
                      for t, x, diff in zip(tangents, inputs, op.differentiable) if diff]
                return op._split(op._run("jvp", inputs, ts))

        self._function = _Function

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._check(inputs)
        return self._function.apply(*inputs)

    def _check(self, inputs):
        """The kernel reads raw columns of one dtype: shapes and dtypes are checked here."""
        if len(inputs) != len(self.input_widths):
            raise ValueError(f"{self.build.__name__}: expected {len(self.input_widths)} inputs, "
                             f"got {len(inputs)}")
        n, dtype = inputs[0].shape[0], inputs[0].dtype
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{self.build.__name__}: inputs must be float32 or float64, got {dtype}")
        for k, (x, w) in enumerate(zip(inputs, self.input_widths)):
            if x.dim() != 2 or x.shape != (n, w) or x.dtype != dtype:
                raise ValueError(f"{self.build.__name__}: input {k} must be ({n}, {w}) {dtype}, "
                                 f"got {tuple(x.shape)} {x.dtype}")

    # -- kernels ----------------------------------------------------------------------------
    def _kernel(self, kind: str, dtype: str):
        key = (kind, dtype)
        if key not in self._kernels:
            inputs, outputs = self.build(dtype)
            diff_vars = [v for v, diff in zip(inputs, self._lane_flags()) if diff]
            if kind == "value":
                self._kernels[key] = sym.compile(outputs, inputs)
            elif kind == "vjp":
                cts = [sym.var(f"ct{k}", dtype) for k in range(len(outputs))]
                self._kernels[key] = sym.compile(sym.vjp(outputs, diff_vars, cts), inputs + cts)
            else:
                tangents = [sym.var(f"tan{k}", dtype) for k in range(len(diff_vars))]
                self._kernels[key] = sym.compile(sym.jvp(outputs, diff_vars, tangents),
                                                 inputs + tangents)
        return self._kernels[key]

    def _lane_flags(self):
        return [diff for w, diff in zip(self.input_widths, self.differentiable) for _ in range(w)]

    def _run(self, kind, inputs, extra):
        """The kernel's results as one (N, results) tensor."""
        n = inputs[0].shape[0]
        dtype = str(inputs[0].dtype).removeprefix("torch.")
        if n == 0:
            return inputs[0].new_zeros(0, self._n_results(kind))
        return run_kernel(self._kernel(kind, dtype), columns([*inputs, *extra]), n)

    def _n_results(self, kind):
        if kind == "vjp":
            return sum(w for w, diff in zip(self.input_widths, self.differentiable) if diff)
        return sum(self.output_widths)

    def _split(self, flat):
        out, k = [], 0
        for w in self.output_widths:
            out.append(flat[:, k:k + w])
            k += w
        return tuple(out)


def columns(tensors):
    """The lanes of (N, width) tensors as numpy column views, in order: no copies, the
    kernels read strided columns in place (transposing copies into contiguous columns and
    back were a quarter of a forward + backward render)."""
    cols = []
    for t in tensors:
        a = t.detach().numpy()
        cols.extend(a[:, k] for k in range(a.shape[1]))
    return cols


def run_kernel(kernel, args, n):
    """``kernel(*args)`` (N lanes) written into one row-major (N, outputs) tensor, in
    core_ad's host pool (fresh arrays of this size cost more in page faults than the kernel).
    Row-major: torch's index_select of a column-major (N, 3) tensor is ~20x slower."""
    out = host_empty(n * len(kernel.outputs), kernel.outputs[0].dtype).reshape(n, -1)
    kernel(*args, out=list(out.T))
    return torch.from_numpy(out)
