"""Generated CUDA kernels run on the CPU, for tests on machines without a GPU.

The kernels are compiled with ``g++`` as plain C++ behind a small shim header standing in for
the CUDA built-ins: ``blockIdx`` / ``threadIdx`` / ``blockDim`` / ``gridDim`` are globals and a
launch runs every thread of the grid in turn (so the grid-stride loop is exercised); atomics
become plain read-modify-writes (one thread runs at a time). A stand-in ``cupy`` module
(:func:`stand_in_cupy`) launches them through ``RawKernel`` on :class:`HostDeviceArray` s,
so code written for CuPy -- :class:`~.launcher.CudaFunction` and array code over an array
module ``xp`` -- runs unchanged. This checks the generated code's semantics and the host code
around it without a device; only NVRTC and the device itself are left out.

The stand-in is deliberately *stricter* than numpy where CuPy is: a numpy array never mixes
with device arrays (no implicit transfer either way: ``np.asarray(device_array)`` raises, as in
CuPy), and only the array-module functions and array methods listed here exist, so host code
that slips a numpy array or a numpy-only routine into its device path fails here as it would on
a GPU. Uploads (``cupy.asarray``) copy, so device memory never aliases host memory.

Typical use (pytest)::

    host = HostKernels([(fn.name, fn.source) for fn in kernels], tmp_dir)
    cupy, cupyx = stand_in_cupy(host)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(launcher, "_KERNELS", {})   # forget kernels of other stand-ins
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import launcher

__all__ = ["SHIM", "HostDeviceArray", "HostKernels", "stand_in_cupy", "translation_unit"]

SHIM = r"""
#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
struct core_ad_dim3 { unsigned int x, y, z; };
static core_ad_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static core_ad_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
extern "C" void core_ad_host_thread(unsigned int b, unsigned int t, unsigned int nb,
                                    unsigned int nt) {
    blockIdx.x = b; threadIdx.x = t; gridDim.x = nb; blockDim.x = nt;
}
extern "C" void core_ad_host_thread3(const unsigned int* b, const unsigned int* t,
                                     const unsigned int* nb, const unsigned int* nt) {
    blockIdx = {b[0], b[1], b[2]}; threadIdx = {t[0], t[1], t[2]};
    gridDim = {nb[0], nb[1], nb[2]}; blockDim = {nt[0], nt[1], nt[2]};
}
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
static inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp,
                                           unsigned long long val) {
    unsigned long long old = *p; if (old == cmp) *p = val; return old;
}
template <typename T> static inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
"""


def translation_unit(kernels) -> tuple[str, dict]:
    """One source text holding every ``(name, source)`` kernel (duplicates once), and the C
    symbol of each: ``{(name, source): symbol}``. Kernels of different sources may share a
    name (e.g. one per compiled problem): each source is wrapped in ``#define name symbol`` /
    ``#undef`` so that the symbols are distinct while the source text is compiled as is
    (the preamble is include-guarded, so several sources share one unit)."""
    symbols: dict = {}
    parts = []
    for name, source in kernels:
        if (name, source) in symbols:
            continue
        sym = f"core_ad_host_k{len(symbols)}"
        symbols[(name, source)] = sym
        parts += [f"#define {name} {sym}", source, f"#undef {name}"]
    return "\n".join(parts), symbols


class HostKernels:
    """``kernels`` (``(name, source)`` pairs) compiled for the CPU in one translation unit with
    :data:`SHIM` (``g++ -O1 -ffp-contract=off``: no FMA contraction, so float arithmetic
    matches numpy's exactly). ``function(name, source)`` is the ctypes function of a kernel;
    with ``compile_missing=True`` a kernel not in the unit is compiled on first request into
    a unit of its own (for kernels generated at run time, e.g. per bound problem).
    RuntimeError if ``g++`` is missing or fails."""

    def __init__(self, kernels, directory, flags=("-O1",), compile_missing=False):
        self.gxx = shutil.which("g++")
        if self.gxx is None:
            raise RuntimeError("host emulation of CUDA kernels needs g++ on PATH")
        self.directory, self.flags, self.compile_missing = Path(directory), tuple(flags), compile_missing
        self.libs = []
        self.symbols = {}
        self._compile(kernels)

    def _compile(self, kernels):
        text, symbols = translation_unit(kernels)
        stem = f"host_kernels{len(self.libs) or ''}"
        src, lib = self.directory / f"{stem}.cpp", self.directory / f"{stem}.so"
        src.write_text(SHIM + text)
        r = subprocess.run([self.gxx, "-std=c++17", *self.flags, "-ffp-contract=off",
                            "-fno-fast-math", "-w", "-shared", "-fPIC", str(src), "-o", str(lib)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"g++ failed on the host emulation unit {src}:\n"
                               + r.stderr[-4000:])
        handle = ctypes.CDLL(str(lib))
        handle.core_ad_host_thread.restype = None
        handle.core_ad_host_thread3.restype = None
        self.libs.append(handle)
        self.symbols.update({key: (handle, sym) for key, sym in symbols.items()})

    @property
    def lib(self):
        """The library of the first unit (the kernels given to the constructor)."""
        return self.libs[0]

    def function(self, name: str, source: str):
        hit = self.symbols.get((name, source))
        if hit is None and self.compile_missing:
            self._compile([(name, source)])
            hit = self.symbols[(name, source)]
        if hit is None:
            raise KeyError(f"kernel {name!r} with this source is not in the host library"
                           " (compile every kernel the test launches into it)")
        handle, sym = hit
        f = getattr(handle, sym)
        f.restype = None
        f.core_ad_thread = handle.core_ad_host_thread  # its unit's thread-index setters
        f.core_ad_thread3 = handle.core_ad_host_thread3
        return f

    def launch(self, f, grid, block, args) -> None:
        """Every thread of a ``grid`` x ``block`` launch of ``f``, one after the other: ints
        for a 1-D launch, or tuples of up to three extents (x first, as CuPy takes them)."""
        if isinstance(grid, int) and isinstance(block, int):
            set_thread = f.core_ad_thread
            for b in range(grid):
                for t in range(block):
                    set_thread(b, t, grid, block)
                    f(*args)
            return
        dims = ctypes.c_uint * 3
        grid3, block3 = (dims(*(tuple(e) + (1, 1))[:3]) for e in (grid, block))
        for b in np.ndindex(*reversed(grid3)):  # x fastest, as the grid's linear block order
            for t in np.ndindex(*reversed(block3)):
                f.core_ad_thread3(dims(*reversed(b)), dims(*reversed(t)), grid3, block3)
                f(*args)


# --------------------------------------------------------------------------------------------
# the stand-in device array


def _to_host_operand(x, what):
    """A numpy operand for a device operation: device arrays unwrap; numpy arrays are refused
    (CuPy never transfers implicitly); scalars and everything else pass."""
    if isinstance(x, HostDeviceArray):
        return x.host
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what}: a numpy array cannot be mixed with device arrays (upload it"
                        " with cupy.asarray)")
    if isinstance(x, list | tuple):
        return type(x)(_to_host_operand(v, what) for v in x)
    return x


def _wrap(r):
    if isinstance(r, np.ndarray):
        return HostDeviceArray(r)
    if isinstance(r, np.generic):
        return HostDeviceArray(np.asarray(r))  # CuPy reductions give 0-d arrays
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


_METHODS = ("reshape", "ravel", "astype", "copy", "sum", "any", "all", "dot", "max", "min",
            "fill", "transpose", "squeeze", "nonzero", "take")


class HostDeviceArray(NDArrayOperatorsMixin):
    """A stand-in for ``cupy.ndarray`` over host memory (``.host``, a numpy array). Indexing
    returns views like CuPy's; arithmetic goes through numpy's ufuncs."""

    __slots__ = ("host",)
    device = types.SimpleNamespace(id=0)

    def __init__(self, host: np.ndarray):
        if not isinstance(host, np.ndarray):
            raise TypeError(f"HostDeviceArray wraps a numpy array, got {type(host).__name__}")
        self.host = host

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    ndim = property(lambda self: self.host.ndim)
    size = property(lambda self: self.host.size)
    strides = property(lambda self: self.host.strides)
    flags = property(lambda self: self.host.flags)
    itemsize = property(lambda self: self.host.itemsize)
    nbytes = property(lambda self: self.host.nbytes)
    T = property(lambda self: HostDeviceArray(self.host.T))
    # ``a.data.ptr``: the address kernels read through a pointer table (the host memory here)
    data = property(lambda self: types.SimpleNamespace(ptr=self.host.ctypes.data))

    def __repr__(self):
        return f"HostDeviceArray({self.host!r})"

    def __len__(self):
        return len(self.host)

    # a size-1 device array converts to a Python scalar (a synchronising copy in CuPy)
    def __float__(self):
        return float(self.host)

    def __int__(self):
        return int(self.host)

    def __bool__(self):
        return bool(self.host)

    def item(self):
        return self.host.item()

    def get(self):
        """The host copy (``cupy.ndarray.get``)."""
        return self.host.copy()

    def __array__(self, dtype=None, copy=None):
        raise TypeError("implicit conversion of a device array to a numpy array is not"
                        " allowed (use cupy.asnumpy / .get())")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method not in ("__call__", "reduce"):
            return NotImplemented
        inputs = _to_host_operand(inputs, f"numpy.{ufunc.__name__}")
        if "out" in kwargs:
            kwargs["out"] = _to_host_operand(kwargs["out"], f"numpy.{ufunc.__name__}")
        return _wrap(getattr(ufunc, method)(*inputs, **kwargs))

    def __array_function__(self, func, types_, args, kwargs):
        return NotImplemented  # numpy routines do not take device arrays: use the module's

    def __getitem__(self, key):
        return _wrap(self.host[_to_host_operand(key, "indexing")])

    def __setitem__(self, key, value):
        self.host[_to_host_operand(key, "indexing")] = _to_host_operand(value, "assignment")

    def __getattr__(self, name):
        if name not in _METHODS:
            raise AttributeError(f"HostDeviceArray (the cupy.ndarray stand-in) has no {name!r}")
        method = getattr(self.host, name)

        def call(*args, **kwargs):
            return _wrap(method(*_to_host_operand(args, name),
                                **{k: _to_host_operand(v, name) for k, v in kwargs.items()}))

        return call


# --------------------------------------------------------------------------------------------
# the stand-in modules

_FUNCTIONS = ("zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
              "arange", "indices", "stack", "concatenate", "where", "broadcast_to", "dot",
              "sqrt", "abs", "maximum", "minimum", "isfinite", "sum", "ascontiguousarray",
              "array_equal", "flatnonzero", "logical_and", "logical_or", "logical_not")
_UFUNCS = ("add", "multiply")  # with ``.at`` (``cupy.add.at``: unbuffered a[idx] += v)
_DTYPES = ("bool_", "int32", "int64", "uint64", "float32", "float64")


def _module_function(name):
    f = getattr(np, name)

    def call(*args, **kwargs):
        return _wrap(f(*_to_host_operand(args, f"cupy.{name}"),
                       **{k: _to_host_operand(v, f"cupy.{name}") for k, v in kwargs.items()}))

    call.__name__ = name
    return call


class _Ufunc:
    """A ufunc of the stand-in module: called like the module's functions, plus ``at``."""

    def __init__(self, name):
        self.__name__ = name
        self._ufunc = getattr(np, name)
        self._call = _module_function(name)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def at(self, a, indices, values=None):
        what = f"cupy.{self.__name__}.at"
        args = (_to_host_operand(a, what), _to_host_operand(indices, what))
        self._ufunc.at(*args, *(() if values is None else (_to_host_operand(values, what),)))


def _upload(a, dtype=None):
    if isinstance(a, HostDeviceArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return HostDeviceArray(np.array(a, dtype=dtype, copy=True))  # a device copy, never a view


def _download(a):
    if isinstance(a, HostDeviceArray):
        return a.host.copy()
    return np.asarray(a)


def _scatter_add(a, slices, value):
    """``cupyx.scatter_add``: unbuffered ``a[slices] += value`` (repeated indices add)."""
    np.add.at(_to_host_operand(a, "cupyx.scatter_add"),
              _to_host_operand(slices, "cupyx.scatter_add"),
              _to_host_operand(value, "cupyx.scatter_add"))


# numpy scalar kernel arguments -> their C types (CuPy passes numpy scalars by value)
_SCALAR_ARGS = {np.int64: ctypes.c_longlong, np.float32: ctypes.c_float, np.float64: ctypes.c_double}


def stand_in_cupy(host: HostKernels, block: int | None = launcher.BLOCK):
    """``(cupy, cupyx)`` stand-in modules over :class:`HostDeviceArray`, whose ``RawKernel``
    runs ``host``'s compiled kernels (every launch must be a 1-D grid of blocks of ``block``
    threads; with ``block=None``, any grid and block of up to three dimensions).
    ``cupy.built`` lists the kernel names in the order their ``RawKernel`` was created;
    ``cupy.launches`` counts launches."""
    cp = types.ModuleType("cupy")
    cp.ndarray = HostDeviceArray
    for name in _FUNCTIONS:
        setattr(cp, name, _module_function(name))
    for name in _UFUNCS:
        setattr(cp, name, _Ufunc(name))
    for name in _DTYPES:
        setattr(cp, name, getattr(np, name))
    cp.asarray = _upload
    cp.asnumpy = _download
    cp.built = []
    cp.launches = 0

    class RawKernel:
        def __init__(self, source, name, options=()):
            self.f = host.function(name, source)
            self.name, self.options = name, tuple(options)
            cp.built.append(name)

        def __call__(self, grid, block_, args):
            grid, block_ = tuple(grid), tuple(block_)
            if block is None:
                if not (1 <= len(grid) <= 3 and 1 <= len(block_) <= 3) or min(grid + block_) < 1:
                    raise ValueError(f"{self.name}: launch grid {grid} x block {block_}; expected"
                                     " 1-3 positive extents each")
            elif len(grid) != 1 or grid[0] < 1 or block_ != (block,):
                raise ValueError(f"{self.name}: launch grid {grid} x block {block_}; expected a"
                                 f" 1-D grid of blocks of {block}")
            conv = []
            for a in args:
                if isinstance(a, HostDeviceArray):
                    conv.append(ctypes.c_void_p(a.host.ctypes.data))
                elif type(a) in _SCALAR_ARGS:
                    conv.append(_SCALAR_ARGS[type(a)](a.item()))
                else:
                    raise TypeError(f"{self.name}: kernel argument of type {type(a).__name__};"
                                    " expected device arrays and numpy.int64 / float32 / float64"
                                    " scalars (passed by value, as CuPy does)")
            cp.launches += 1
            if block is None:
                host.launch(self.f, grid, block_, conv)
            else:
                host.launch(self.f, grid[0], block, conv)

    cp.RawKernel = RawKernel
    device = types.SimpleNamespace(id=0, synchronize=lambda: None)
    cp.cuda = types.SimpleNamespace(
        Device=lambda *a: device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
    )
    cpx = types.ModuleType("cupyx")
    cpx.scatter_add = _scatter_add
    return cp, cpx
