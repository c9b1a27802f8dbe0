"""Buffers: numpy arrays as pipeline inputs and outputs, without copies.

A Buffer may also wrap a CUDA device array (a CuPy array, or anything exposing
``__cuda_array_interface__``, such as a CUDA torch tensor, viewed without a copy): a GPU
pipeline then reads it, or writes its output into it, where it is, with no transfer. A CPU
pipeline refuses it by name, and ``numpy()`` / ``np.asarray`` refuse it (no implicit transfer,
as CuPy).

Dimension order follows Halide's Python bindings: Halide dimension 0 (``x``, the innermost)
is the LAST numpy axis. A numpy array of shape ``(h, w)`` is a Buffer with ``width() == w``,
``height() == h``; ``buf[x, y]`` reads ``array[y, x]``; ``np.asarray(f.realize([w, h]))`` has
shape ``(h, w)``. Arrays whose last axis is not contiguous are copied once (the compiled
loops need unit stride in x); every other layout (views, negative strides on outer axes) is
used in place.
"""

from __future__ import annotations

import numbers
import sys

import numpy as np
from core_ad import sym

from . import _expr as E
from ._func import FuncError, _coord, register_callee
from ._types import Type, type_of_dtype

__all__ = ["Buffer", "BufferDim"]


def _device_array(data):
    """``data`` as a CuPy array when it lives on a CUDA device; else None."""
    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(data, cp.ndarray):
        return data
    try:
        on_device = hasattr(data, "__cuda_array_interface__")
    except RuntimeError as err:  # e.g. a torch tensor that requires grad
        raise FuncError(f"Buffer: cannot view this device array ({err}); detach it") from None
    if not on_device:
        return None
    try:
        import cupy
    except ImportError:
        raise FuncError("Buffer: a CUDA device array needs CuPy to be wrapped") from None
    return cupy.asarray(data)


class BufferDim:
    def __init__(self, buf, d):
        self._buf, self._d = buf, d

    def min(self) -> int:
        return self._buf._mins[self._d]

    def extent(self) -> int:
        return self._buf._array.shape[self._buf._array.ndim - 1 - self._d]

    def max(self) -> int:
        return self.min() + self.extent() - 1

    def stride(self) -> int:
        a = self._buf._array
        return a.strides[a.ndim - 1 - self._d] // a.itemsize


class Buffer:
    """``hl.Buffer(ndarray)`` (wrapped, axes reversed), ``hl.Buffer(hl.Float(32), [w, h])``
    (zero-filled), with Halide's accessors and numpy interop (``np.asarray(buf)``)."""

    def __init__(self, data=None, sizes=None, name: str | None = None):
        if isinstance(data, Type):
            shape = tuple(int(s) for s in reversed(list(sizes or [])))
            arr = np.zeros(shape, data.dtype)
        elif isinstance(data, Buffer):
            arr = data._array
        elif data is None:
            raise FuncError("Buffer needs an array, or a type and sizes")
        else:
            arr = data if isinstance(data, np.ndarray) else _device_array(data)
            if arr is None:
                arr = np.asarray(data)
            if isinstance(sizes, str) and name is None:
                name = sizes
        self.on_device = not isinstance(arr, np.ndarray)
        xp = sys.modules["cupy"] if self.on_device else np
        if arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:
            raise TypeError(f"Buffer: unsupported dtype {arr.dtype}")
        if arr.ndim and arr.shape[-1] > 1 and arr.strides[-1] != arr.itemsize:
            arr = xp.ascontiguousarray(arr)
        if any(s % arr.itemsize for s in arr.strides):
            arr = xp.ascontiguousarray(arr)
        self._array = arr
        self._mins = [0] * arr.ndim
        self._name = name or E.unique_name("b").replace("$", "_")
        self.fid = E.unique_name(self._name)
        register_callee(self.fid, self)

    # ---- Halide accessors ----------------------------------------------------------------
    def name(self) -> str:
        return self._name

    def type(self) -> Type:
        return type_of_dtype(self._array.dtype)

    def dimensions(self) -> int:
        return self._array.ndim

    def dim(self, d: int) -> BufferDim:
        if not 0 <= d < self._array.ndim:
            raise IndexError(f"Buffer {self._name} has {self._array.ndim} dimensions, asked"
                             f" for dim({d})")
        return BufferDim(self, d)

    def width(self) -> int:
        return self.dim(0).extent() if self._array.ndim > 0 else 1

    def height(self) -> int:
        return self.dim(1).extent() if self._array.ndim > 1 else 1

    def channels(self) -> int:
        return self.dim(2).extent() if self._array.ndim > 2 else 1

    def set_min(self, mins):
        if len(mins) != self._array.ndim:
            raise ValueError(f"Buffer {self._name}: set_min needs {self._array.ndim} values")
        self._mins = [int(m) for m in mins]
        return self

    def copy_to_host(self):
        return self

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def numpy(self) -> np.ndarray:
        if self.on_device:
            raise FuncError(f"Buffer {self._name} lives on the GPU: array() gives the device"
                            " array (copy it with cupy.asnumpy)")
        return self._array

    def array(self):
        """The wrapped array: numpy, or the CuPy array of a device Buffer."""
        return self._array

    @property
    def shape(self):
        return self._array.shape

    def __repr__(self):
        where = "device" if self.on_device else "numpy"
        return f"Buffer({self._name}, {self.type()}, {where} shape {self._array.shape})"

    def dim_expr(self, d: int, what: str) -> E.Expr:
        """The symbolic ``"min"`` / ``"extent"`` of dimension ``d``: compiled code reads it at
        run time, so a pipeline is not recompiled for another buffer size."""
        self.dim(d)
        return E.Expr(_node=sym.leaf("hl.bufdim", (self.fid, d, what), np.int32))

    def _rdom_bounds(self):
        return [(self.dim_expr(d, "min"), self.dim_expr(d, "extent"))
                for d in range(self._array.ndim)]

    # ---- calls ---------------------------------------------------------------------------
    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if len(key) != self._array.ndim:
            raise FuncError(
                f"Buffer {self._name} has {self._array.ndim} dimension(s), accessed with"
                f" {len(key)}"
            )
        if all(isinstance(k, numbers.Integral) for k in key):
            idx = tuple(int(k) - m for k, m in zip(reversed(key), reversed(self._mins)))
            return self._array[idx]
        coords = [_coord(self._name, j, a) for j, a in enumerate(key)]
        return E.Expr(_node=sym.call(E.CALL, *coords, out_dtype=self._array.dtype,
                                     fid=self.fid, index=0))

    def __setitem__(self, key, value):
        key = key if isinstance(key, tuple) else (key,)
        idx = tuple(int(k) - m for k, m in zip(reversed(key), reversed(self._mins)))
        self._array[idx] = value

    def __call__(self, *args):
        return self[args]
