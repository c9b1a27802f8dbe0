"""The solvers' vector algebra over an array module, so that one GN / LM / PCG code runs on
numpy vectors (host problems) and on CuPy vectors (the cuda backend's all-device loop).

A problem whose vectors live elsewhere than in numpy says so with an ``xp`` attribute (its
array module); its ``jtf`` / ``jtj_diag`` / ``jtjp`` / ``residuals`` take and return arrays of
that module, and ``cost`` returns a Python float. The solvers then keep every work vector in
``xp`` and bring to the host only the scalars their control flow needs, several at a time
(:meth:`VectorOps.scalars`: one transfer and one synchronisation). PCG on device vectors keeps
even its scalars on the device (:mod:`.device_pcg`: generated kernels for its updates).
"""
from __future__ import annotations

import math

import numpy as np

from ._dot import dot as host_dot

__all__ = ["VectorOps", "vector_ops"]


class VectorOps:
    """Vector updates, dots, norms and host transfers for vectors of the array module ``xp``."""

    def __init__(self, xp):
        self.xp = xp
        self.on_host = xp is np

    def axpy(self, a, x, y, tmp):
        """``y += a x`` in place (``tmp``: a scratch vector)."""
        self.xp.multiply(x, a, out=tmp)
        y += tmp

    def scale_add(self, b, p, z):
        """``p = b p + z`` in place (the PCG direction update)."""
        p *= b
        p += z

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
        """``||v||``; on the host through :func:`._dot.dot` (``np.linalg.norm`` is a BLAS dot:
        multi-threaded above 10^4 entries, 7 ms instead of ~10 us on a busy 2-core machine)."""
        return math.sqrt(float(self.dot(v, v)))

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

