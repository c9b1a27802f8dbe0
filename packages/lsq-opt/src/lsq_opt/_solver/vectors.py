"""The solvers' vector algebra over an array module, so that one GN / LM / PCG code runs on
numpy vectors (host problems) and on CuPy vectors (the cuda backend's all-device loop).

A problem whose vectors live elsewhere than in numpy says so with an ``xp`` attribute (its
array module); its ``jtf`` / ``jtj_diag`` / ``jtjp`` / ``residuals`` take and return arrays of
that module, and ``cost`` returns a Python float. The solvers then keep every work vector in
``xp`` and bring to the host only the scalars their control flow needs, several at a time
(:meth:`VectorOps.scalars`: one transfer and one synchronisation). PCG's vector updates
(:meth:`VectorOps.axpy`, :meth:`VectorOps.scale_add`) are one generated CUDA kernel each on a
device (a launch costs more than the arithmetic there) and the numpy operations of before on
the host.
"""
from __future__ import annotations

import math

import numpy as np

from ._dot import dot as host_dot

__all__ = ["VectorOps", "vector_ops"]


class VectorOps:
    """Vector updates, dots, norms and host transfers for vectors of the array module ``xp``.
    The host updates round as numpy's two-step operations did; a device may contract
    ``a * x + y`` into one fused multiply-add (a rounding-level difference)."""

    def __init__(self, xp):
        self.xp = xp
        self.on_host = xp is np

    def axpy(self, a, x, y, tmp):
        """``y += a x`` in place (``tmp``: a scratch vector for the host)."""
        if self.on_host:
            np.multiply(x, a, out=tmp)
            y += tmp
        else:
            _launch("lsq_axpy", y.dtype, y.size, y.dtype.type(a), x, y)

    def scale_add(self, b, p, z):
        """``p = b p + z`` in place (the PCG direction update)."""
        if self.on_host:
            p *= b
            p += z
        else:
            _launch("lsq_scale_add", p.dtype, p.size, p.dtype.type(b), p, z)

    def dot(self, a, b):
        """``a . b`` in the vectors' dtype: a numpy scalar on the host, a 0-d array of ``xp``
        otherwise (left on the device until :meth:`scalars` fetches it)."""
        return host_dot(a, b) if self.on_host else self.xp.dot(a, b)

    def scalars(self, *values):
        """The numpy scalars of ``values`` (results of :meth:`dot`, reductions), fetched in one
        transfer."""
        if self.on_host:
            return tuple(np.asarray(v)[()] for v in values)
        return tuple(self.xp.stack(values).get())

    def norm(self, v) -> float:
        if self.on_host:
            return float(np.linalg.norm(v))
        return math.sqrt(float(self.xp.dot(v, v)))

    def max_abs(self, v):
        """``max |v|`` (nan if v holds a nan; left on the device like :meth:`dot`)."""
        return self.xp.abs(v).max()

    def vector(self, v, dtype):
        """A flat copy of ``v`` (host data or an array of ``xp``) in ``dtype``, in ``xp``."""
        if not self.on_host and isinstance(v, self.xp.ndarray):
            return v.astype(dtype).reshape(-1)
        flat = np.array(v, dtype=dtype).reshape(-1)
        return flat if self.on_host else self.xp.asarray(flat)

    def to_host(self, v) -> np.ndarray:
        return v if self.on_host else v.get()


def vector_ops(problem) -> VectorOps:
    """The :class:`VectorOps` of ``problem``'s array module (``problem.xp``, numpy by default)."""
    return VectorOps(getattr(problem, "xp", np))


# the element-wise kernels of the device vector updates: name -> (vector parameters, body)
_UPDATES = {"lsq_axpy": (("const {T}* __restrict__ x", "{T}* __restrict__ y"), "y[i] += a * x[i];"),
            "lsq_scale_add": (("{T}* __restrict__ p", "const {T}* __restrict__ z"),
                              "p[i] = a * p[i] + z[i];")}
_UPDATE_SOURCES: dict = {}


def update_source(name: str, dtype) -> str:
    """The CUDA source of the vector update ``name`` (see ``_UPDATES``) for ``dtype``."""
    key = (name, np.dtype(dtype))
    source = _UPDATE_SOURCES.get(key)
    if source is None:
        from core_ad import codegen

        T = codegen.c_type(dtype)
        vectors, body = _UPDATES[name]
        w = codegen.CudaWriter()
        params = [("const long long n", "vector length"), (f"const {T} a", "scale")]
        with w.kernel(name, params + [(v.format(T=T), "") for v in vectors]):
            with w.grid_stride_loop("i", "n"):
                w.line(body)
        source = _UPDATE_SOURCES[key] = w.source()
    return source


def _launch(name, dtype, n, a, *vectors):
    from core_ad import codegen
    from core_ad._codegen.cuda.launcher import BLOCK, MAX_GRID

    if n:
        grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
        codegen.cuda_kernel(update_source(name, dtype), name)((grid,), (BLOCK,), (np.int64(n), a, *vectors))
