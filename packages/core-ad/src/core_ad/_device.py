"""Where an array's data live: on the host (numpy) or on a CUDA device (CuPy).

A traced :class:`core_ad.Array` may hold a CuPy array. In lazy mode its lane-wise arithmetic,
whole-array sums and derivative sweeps are fused into CUDA kernels (``sym.compile(...,
backend="cuda")``) and the results stay CuPy arrays (see :mod:`core_ad._lazy`). CuPy is never
imported here: an array is on the device when CuPy is already imported (by whoever made the
array) and the array is a ``cupy.ndarray``.

Host values that are scalars by construction -- Python numbers, 0-d numpy arrays and numpy
scalars, broadcast views of one number (zero strides: a reduction's seed) -- mix with device
arrays (they are uploaded as 0-d device arrays); any other numpy array in a device graph is a
:class:`DeviceMismatchError`.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = [
    "DeviceMismatchError",
    "DeviceUnsupportedError",
    "array_module",
    "describe",
    "is_device_array",
    "is_host_scalar",
    "on_device",
    "to_host",
    "unsupported",
]


class DeviceMismatchError(TypeError):
    """One computation mixes numpy arrays (host) and CuPy arrays (device)."""


class DeviceUnsupportedError(NotImplementedError):
    """An operation on CuPy data that core_ad does not run on the device (yet)."""


def is_device_array(x) -> bool:
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(x, cp.ndarray)


def on_device(x) -> bool:
    """Whether ``x`` -- a CuPy array, or a traced Array whose value is one or, pending, will be
    computed on the device -- is device data."""
    from ._lazy import Pending

    v = getattr(x, "_value", x)
    if isinstance(v, Pending):
        return v.device == "cuda"
    return is_device_array(v)


def array_module(x):
    """``cupy`` for a device array, else ``numpy``."""
    return sys.modules["cupy"] if is_device_array(x) else np


def is_host_scalar(x) -> bool:
    """A host value that holds one number by construction (it may join a device graph)."""
    if isinstance(x, bool | int | float | np.generic):
        return True
    return isinstance(x, np.ndarray) and (x.ndim == 0 or not any(x.strides))


def to_host(x):
    """A numpy copy of a device array (``x`` itself otherwise)."""
    return sys.modules["cupy"].asnumpy(x) if is_device_array(x) else x


def describe(x) -> str:
    """``a CuPy array (float64, shape (5,), 'name')``: an operand in error messages."""
    from ._tracing import Array

    name = f", {x.name!r}" if isinstance(x, Array) and x.name else ""
    v = x._value if isinstance(x, Array) else x
    where = "CuPy" if on_device(x) else "numpy"
    return f"a {where} array ({np.dtype(v.dtype)}, shape {tuple(v.shape)}{name})"


def unsupported(what: str, where: str, lazy: bool = True) -> DeviceUnsupportedError:
    if not lazy:
        return DeviceUnsupportedError(
            f"{what} on CuPy arrays at {where}: device data are computed by fused CUDA kernels"
            " in lazy mode only (core_ad.set_lazy(True) or 'auto'); eager mode is numpy's")
    return DeviceUnsupportedError(
        f"{what} on CuPy arrays is not run on the device by core_ad (at {where}); lane-wise"
        " arithmetic, whole-array sums, reshapes, broadcasts of one element, 1-D take /"
        " scatter_add and reverse / forward mode of these are. Move the data to the host"
        " (cupy.asnumpy) for this computation"
    )
