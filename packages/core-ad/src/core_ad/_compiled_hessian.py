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


def _trace(f, n: int, dtype, who: str):
    """``(columns, output expression)`` of ``f`` traced on symbolic columns."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"compiled {who}: dtype must be floating, got {dtype}")
    xs = [sym.var(f"x{j}", dtype) for j in range(int(n))]
    try:
        out = f(_Columns(xs, -1))
    except SymbolicTraceError:
        raise
    except (TypeError, ValueError) as e:
        raise SymbolicTraceError(
            f"compiled {who}: f could not be traced symbolically ({e}); write it"
            " lane-wise with columns x[:, j] and core_ad.numpy functions, or use"
            " compiled=False"
        ) from e
    return xs, sym.as_expr(out, who)


def _columns_of(xv, n, dtype, who):
    xv = np.asarray(xv)
    if xv.ndim != 2 or xv.shape[1] != n:
        raise ValueError(f"{who}: x must have shape (B, {n}), got {xv.shape}")
    if xv.dtype != dtype:
        raise TypeError(f"{who}: x has dtype {xv.dtype}, compiled for {dtype}")
    return xv.shape[0], [np.ascontiguousarray(xv[:, j]) for j in range(n)]


def _lanes(r, B, dtype):
    """A kernel output as ``B`` lanes (a lane-independent output comes back 0-d)."""
    return np.broadcast_to(np.asarray(r, dtype), (B,))


class CompiledBatchHessian:
    """``hess(x) -> (grad (B, n), hessian (B, n, n))`` for a fixed ``n`` and dtype; with
    ``value=True``, ``(value (B,), grad, hessian)`` from the same kernel."""

    def __init__(self, f, n: int, dtype="float64", backend: str | None = None,
                 value: bool = False):
        self.n, self.dtype = int(n), np.dtype(dtype)
        self.value = bool(value)
        xs, out = _trace(f, n, dtype, "batch_hessian")
        self._tri = [(i, j) for i in range(self.n) for j in range(i + 1)]

        def derive(values):
            hess = sym.hessian(values[0], xs)
            return (values[:1] if self.value else []) + list(sym.grad(values[0], xs)) + [
                hess[i][j] for i, j in self._tri]

        # found in the disk cache without deriving the Hessian again (compile_derived)
        self.kernel = sym.compile_derived([out], xs, derive, backend=backend,
                                          tag=f"batch_hessian v1, value={self.value}")

    def __call__(self, x):
        B, cols = _columns_of(x, self.n, self.dtype, "batch_hessian")
        n = self.n
        res = list(self.kernel(*cols))
        val = _lanes(res.pop(0), B, self.dtype).copy() if self.value else None
        g = np.empty((B, n), self.dtype)
        for j in range(n):
            g[:, j] = res[j]
        H = np.empty((B, n, n), self.dtype)
        for (i, j), h in zip(self._tri, res[n:]):
            H[:, i, j] = h
            H[:, j, i] = h  # the same values: exactly symmetric
        return (val, g, H) if self.value else (g, H)


class CompiledBatchGrad:
    """``grad(x) -> grad (B, n)`` (or ``(value (B,), grad)`` with ``value=True``): the per-lane
    gradient alone, one reverse-symbolic sweep compiled into one kernel (no Hessian work)."""

    def __init__(self, f, n: int, dtype="float64", backend: str | None = None,
                 value: bool = False):
        self.n, self.dtype = int(n), np.dtype(dtype)
        self.value = bool(value)
        xs, out = _trace(f, n, dtype, "batch_grad")
        self.kernel = sym.compile_derived(
            [out], xs, lambda values: (values[:1] if self.value else []) + list(
                sym.grad(values[0], xs)), backend=backend, tag=f"batch_grad v1, value={self.value}")

    def __call__(self, x):
        B, cols = _columns_of(x, self.n, self.dtype, "batch_grad")
        res = list(self.kernel(*cols))
        val = _lanes(res.pop(0), B, self.dtype).copy() if self.value else None
        g = np.empty((B, self.n), self.dtype)
        for j, r in enumerate(res):
            g[:, j] = r
        return (val, g) if self.value else g


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_batch_hessian(f, n: int, dtype="float64", backend: str | None = None, *,
                           value: bool = False):
    """A reusable compiled ``batch_hessian`` for ``f`` on ``(B, n)`` inputs of ``dtype``;
    ``value=True`` also returns f's per-lane value (first), computed in the same kernel.

    ``f`` is traced once, like ``jax.jit``: values it closes over are baked into the kernel.
    """
    return CompiledBatchHessian(f, n, dtype, backend, value)


def compiled_batch_grad(f, n: int, dtype="float64", backend: str | None = None, *,
                        value: bool = False):
    """A reusable compiled per-lane gradient of ``f`` on ``(B, n)`` inputs (``(value, grad)``
    with ``value=True``); the gradient-only kernel for samplers that need no Hessian (MALA,
    HMC) and for optimisers."""
    return CompiledBatchGrad(f, n, dtype, backend, value)


def cached_batch_hessian(f, n: int, dtype) -> CompiledBatchHessian:
    """The compiled kernel for ``(f, n, dtype)``, built on first use."""
    per_f = _CACHE.setdefault(f, {})
    key = (int(n), np.dtype(dtype))
    if key not in per_f:
        per_f[key] = CompiledBatchHessian(f, n, dtype)
    return per_f[key]
