"""Compiled per-lane gradients and Hessians: the symbolic engine plus a compiled kernel.

``compiled_batch_hessian(f, n)`` traces ``f`` once on symbolic columns (``x[:, j]`` is the
variable ``x_j``), derives the gradient and the lower triangle of the Hessian symbolically
(hash-consing shares every common subexpression between them), and compiles all of it into
one lane-wise kernel (LLVM on the CPU by default). Evaluating it costs one pass over the lanes,
with no graph and no Python per operation.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import sym


class SymbolicTraceError(TypeError):
    """``f`` did something the symbolic columns cannot represent (use the traced path)."""


class _Columns:
    """Stand-in for the ``(B, n)`` input: ``x[:, j]`` is the symbolic variable of column j."""

    def __init__(self, cols, batch):
        self._cols = cols
        self.shape = (batch, len(cols))
        self.dtype = cols[0].dtype
        self.ndim = 2

    def __getitem__(self, index):
        if (
            isinstance(index, tuple)
            and len(index) == 2
            and index[0] == slice(None)
            and isinstance(index[1], (int, np.integer))
        ):
            return self._cols[int(index[1])]
        raise SymbolicTraceError(
            f"compiled batch_hessian: f indexed its input with {index!r}; only column access"
            " x[:, j] can be traced symbolically (use compiled=False for anything else)"
        )

    def __array__(self, *_, **__):
        raise SymbolicTraceError(
            "compiled batch_hessian: f used its input as a whole array; write it with columns"
            " x[:, j] and core_ad.numpy functions (or use compiled=False)"
        )


class CompiledBatchHessian:
    """``hess(x) -> (grad (B, n), hessian (B, n, n))`` for a fixed ``n`` and dtype."""

    def __init__(self, f, n: int, dtype="float64", backend: str | None = None):
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise TypeError(f"compiled batch_hessian: dtype must be floating, got {dtype}")
        self.n, self.dtype = int(n), dtype
        xs = [sym.var(f"x{j}", dtype) for j in range(self.n)]
        try:
            out = f(_Columns(xs, -1))
        except SymbolicTraceError:
            raise
        except (TypeError, ValueError) as e:
            raise SymbolicTraceError(
                f"compiled batch_hessian: f could not be traced symbolically ({e}); write it"
                " lane-wise with columns x[:, j] and core_ad.numpy functions, or use"
                " compiled=False"
            ) from e
        out = sym.as_expr(out, "batch_hessian")
        grad = sym.grad(out, xs)
        hess = sym.hessian(out, xs)
        self._tri = [(i, j) for i in range(self.n) for j in range(i + 1)]
        outputs = list(grad) + [hess[i][j] for i, j in self._tri]
        kw = {} if backend is None else {"backend": backend}
        self.kernel = sym.compile(outputs, xs, **kw)

    def __call__(self, x):
        xv = np.asarray(x)
        if xv.ndim != 2 or xv.shape[1] != self.n:
            raise ValueError(f"batch_hessian: x must have shape (B, {self.n}), got {xv.shape}")
        if xv.dtype != self.dtype:
            raise TypeError(f"batch_hessian: x has dtype {xv.dtype}, compiled for {self.dtype}")
        B, n = xv.shape
        cols = [np.ascontiguousarray(xv[:, j]) for j in range(n)]
        res = self.kernel(*cols)
        g = np.empty((B, n), self.dtype)
        for j in range(n):
            g[:, j] = res[j]
        H = np.empty((B, n, n), self.dtype)
        for (i, j), h in zip(self._tri, res[n:]):
            H[:, i, j] = h
            H[:, j, i] = h  # the same values: exactly symmetric
        return g, H


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def compiled_batch_hessian(f, n: int, dtype="float64", backend: str | None = None):
    """A reusable compiled ``batch_hessian`` for ``f`` on ``(B, n)`` inputs of ``dtype``.

    ``f`` is traced once, like ``jax.jit``: values it closes over are baked into the kernel.
    """
    return CompiledBatchHessian(f, n, dtype, backend)


def cached_batch_hessian(f, n: int, dtype) -> CompiledBatchHessian:
    """The compiled kernel for ``(f, n, dtype)``, built on first use."""
    per_f = _CACHE.setdefault(f, {})
    key = (int(n), np.dtype(dtype))
    if key not in per_f:
        per_f[key] = CompiledBatchHessian(f, n, dtype)
    return per_f[key]
