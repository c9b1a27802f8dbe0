"""Compile, cache and launch generated CUDA kernels through ``cupy.RawKernel``.

CuPy is imported only inside functions: importing :mod:`core_ad` never needs it. The
argument checks, output allocation, kernel-argument layout and error decoding are written
over an array module ``xp`` (numpy or cupy) so that they can be exercised without a device;
:meth:`CudaFunction.__call__` adds the device launch.
"""

from __future__ import annotations

import hashlib
import math
import threading

import numpy as np

from .source import (
    BUFFER,
    DEFAULT_NAME,
    SCATTER,
    SUM,
    KernelSpec,
    _check_name,
    kernel_spec,
    program_spec,
)

__all__ = [
    "CudaFunction",
    "available",
    "check_options",
    "clear_cache",
    "compile_cuda",
    "compile_program",
    "get_kernel",
]

BLOCK = 256
MAX_GRID = 1 << 20  # the grid-stride loop covers whatever does not fit

_KERNELS: dict = {}
_LOCK = threading.Lock()


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            "the cuda backend needs CuPy and a CUDA device (pip install 'difvis-core-ad[cuda]');"
            f" importing cupy failed: {e}"
        ) from None
    return cupy


def get_kernel(source: str, name: str):
    """The ``cupy.RawKernel`` for ``source`` (compiled by CuPy on first launch), cached by a
    hash of the source text and kernel name."""
    key = hashlib.sha256(f"{name}\0{source}".encode()).hexdigest()
    k = _KERNELS.get(key)
    if k is None:
        cp = _import_cupy()
        with _LOCK:
            k = _KERNELS.get(key)
            if k is None:
                k = cp.RawKernel(source, name, options=("-std=c++17",))
                _KERNELS[key] = k
    return k


def clear_cache() -> None:
    """Forget the compiled kernels (CuPy's own on-disk cache is left alone)."""
    with _LOCK:
        _KERNELS.clear()


# --------------------------------------------------------------------------------------------
# device-independent pieces of a call


def _input_name(spec: KernelSpec, k: int) -> str:
    return f"input {k} ({spec.inputs[k].name!r})"


def check_count(spec: KernelSpec, arrays) -> None:
    n_in = len(spec.inputs)
    if len(arrays) != n_in:
        names = ", ".join(v.name for v in spec.inputs)
        raise TypeError(
            f"compiled cuda function takes {n_in} array{'s' if n_in != 1 else ''} ({names}),"
            f" got {len(arrays)}"
        )


def reject_host(spec: KernelSpec, arrays) -> None:
    """TypeError for numpy arrays and Python / numpy scalars (before CuPy is imported)."""
    for k, a in enumerate(arrays):
        if isinstance(a, np.ndarray | np.generic):
            raise TypeError(
                f"compiled cuda function: {_input_name(spec, k)} is a numpy"
                f" {'array' if isinstance(a, np.ndarray) else 'scalar'}; the cuda backend takes"
                " CuPy arrays on the device (cupy.asarray(x)), or use backend='numpy'"
            )
        if isinstance(a, bool | int | float | complex):
            raise TypeError(
                f"compiled cuda function: {_input_name(spec, k)} is a Python"
                f" {type(a).__name__}; the cuda backend takes CuPy arrays (a 0-d"
                " cupy.asarray(value, dtype) for a scalar)"
            )


def plan(spec: KernelSpec, arrays, array_type):
    """Check the arrays against the kernel: ``(lane shape, lane count, aux)`` where ``aux[k]``
    is input k's stride (1, or 0 for a 0-d array) or its buffer length.

    TypeError: not an ``array_type``, or the wrong dtype (no conversion is done). ValueError:
    per-lane inputs of different shapes (each is the lane shape or 0-d), a buffer that is not
    1-D, a non-contiguous array.
    """
    shape = None
    first = None
    aux = []
    for k, (v, a, kind) in enumerate(zip(spec.inputs, arrays, spec.input_kinds)):
        what = _input_name(spec, k)
        if not isinstance(a, array_type):
            raise TypeError(
                f"compiled cuda function: {what} must be a {array_type.__module__.split('.')[0]}"
                f" array, got {type(a).__name__}"
            )
        if a.dtype != v.dtype:
            raise TypeError(
                f"compiled cuda function: {what} must have dtype {v.dtype}, got {a.dtype}"
                f" (the cuda backend does not convert: use .astype({str(v.dtype)!r}))"
            )
        if kind == BUFFER:
            if a.ndim != 1:
                raise ValueError(
                    f"compiled cuda function: buffer {what} must be 1-D, got shape {a.shape}"
                )
            aux.append(int(a.shape[0]))
        elif a.ndim == 0:
            aux.append(0)
        else:
            if shape is None:
                shape, first = tuple(a.shape), k
            elif tuple(a.shape) != shape:
                raise ValueError(
                    "compiled cuda function: lane-count mismatch: per-lane inputs must all have"
                    f" one shape (or be 0-d); {_input_name(spec, first)} has shape {shape},"
                    f" {what} has shape {tuple(a.shape)}"
                )
            aux.append(1)
        if not a.flags.c_contiguous:
            raise ValueError(
                f"compiled cuda function: {what} is not C-contiguous (strides {a.strides});"
                " pass a contiguous copy (ascontiguousarray)"
            )
    shape = shape if shape is not None else ()
    return shape, math.prod(shape), aux


def allocate_outputs(xp, spec: KernelSpec, arrays, shape) -> list:
    outs = []
    for r, (kind, k) in zip(spec.roots, spec.output_kinds):
        if kind == SCATTER:
            outs.append(arrays[k].copy())
        elif kind == SUM:
            outs.append(xp.zeros((), dtype=r.dtype))
        else:
            outs.append(xp.empty(shape, dtype=r.dtype))
    return outs


def kernel_args(spec: KernelSpec, n: int, arrays, aux, outs, err) -> list:
    """The kernel's arguments in signature order (64-bit integers as ``np.int64``)."""
    args = [np.int64(n)]
    for a, x in zip(arrays, aux):
        args += [a, np.int64(x)]
    args += list(outs)
    args.append(err)
    return args


def raise_for_error(spec: KernelSpec, err, shape, aux) -> None:
    """IndexError naming the buffer, index and lane if the kernel recorded one (``err``: the
    3-word error slot copied to the host)."""
    site = int(err[0])
    if site == 0:
        return
    if not 1 <= site <= len(spec.sites):
        raise RuntimeError(f"cuda kernel {spec.name}: corrupt error slot {list(map(int, err))}")
    op, buf, k = spec.sites[site - 1]
    lane = int(err[1])
    index = int(err[2])
    if index >= 2**63:
        index -= 2**64
    pos = tuple(int(p) for p in np.unravel_index(lane, shape)) if shape else ()
    raise IndexError(
        f"{op}: index {index} at position {pos} (lane {lane}) is out of range for axis of size"
        f" {aux[k]} of array {buf!r}"
    )


def execute(spec: KernelSpec, arrays, xp, array_type, launch, to_host):
    """One call: check, allocate, ``launch(n, args)``, decode errors; a tuple of outputs."""
    check_count(spec, arrays)
    shape, n, aux = plan(spec, arrays, array_type)
    outs = allocate_outputs(xp, spec, arrays, shape)
    if n > 0 and outs:
        err = xp.zeros(3, dtype=np.uint64)
        launch(n, kernel_args(spec, n, arrays, aux, outs, err))
        if spec.sites:
            raise_for_error(spec, to_host(err), shape, aux)
    return tuple(outs)


# --------------------------------------------------------------------------------------------
# the device callable


class CudaFunction:
    """``fn(*cupy_arrays) -> tuple of cupy arrays``, one per output (the numpy backend's call
    contract on the device). Per-lane inputs are arrays of the lane shape or 0-d arrays;
    buffers are whole 1-D arrays; dtypes must match the leaves exactly. Outputs have the lane
    shape (scatter_add outputs: the buffer's). An out-of-range gather / scatter index raises
    IndexError naming the buffer, the index and the lane.

    Attributes: ``source`` (the CUDA C), ``name`` (the kernel), ``program``, ``inputs``,
    ``outputs``, ``backend == "cuda"``, ``spec``. The kernel is compiled on the first call.
    """

    backend = "cuda"

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.source = spec.source
        self.name = spec.name
        self.program = spec.program
        self.inputs = list(spec.inputs)
        self.outputs = list(spec.roots)

    @property
    def kernel(self):
        return get_kernel(self.source, self.name)

    def __repr__(self) -> str:
        return (f"<core_ad cuda kernel {self.name}: {len(self.inputs)} inputs,"
                f" {len(self.outputs)} outputs>")

    def __call__(self, *arrays):
        spec = self.spec
        check_count(spec, arrays)
        reject_host(spec, arrays)
        cp = _import_cupy()
        dev = cp.cuda.Device().id
        for k, a in enumerate(arrays):
            if isinstance(a, cp.ndarray) and a.device.id != dev:
                raise ValueError(
                    f"compiled cuda function: {_input_name(spec, k)} is on device {a.device.id},"
                    f" the current device is {dev}"
                )
        kernel = self.kernel

        def launch(n, args):
            grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
            kernel((grid,), (BLOCK,), tuple(args))

        return execute(spec, arrays, cp, cp.ndarray, launch, cp.asnumpy)


def available() -> bool:
    """Whether CuPy imports and sees a CUDA device (imports CuPy: call it only when the cuda
    backend is asked for)."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any CUDA runtime failure means no usable device
        return False


_OPTIONS = {"name": DEFAULT_NAME}


def check_options(options: dict) -> tuple:
    """``sym.compile(..., backend="cuda", **options)``: only ``name`` (the kernel's C name).
    Returns the validated options as a hashable, sorted tuple."""
    out = dict(_OPTIONS)
    for k, v in options.items():
        if k not in _OPTIONS:
            raise TypeError(
                f"compile: unknown option {k!r} for backend 'cuda'; expected one of"
                f" {', '.join(sorted(_OPTIONS))}"
            )
        out[k] = v
    _check_name(out["name"])
    return tuple(sorted(out.items()))


def compile_program(prog, roots, inputs, options=(), key=None) -> CudaFunction:
    """The registry hook: a :class:`CudaFunction` for a program ``sym.compile`` has already
    checked (``options``: the tuple of :func:`check_options`; ``key`` is unused: kernels are
    cached by their source text)."""
    opts = dict(options)
    return CudaFunction(program_spec(prog, roots, inputs, opts.get("name", DEFAULT_NAME)))


def compile_cuda(outputs, inputs, name: str = DEFAULT_NAME) -> CudaFunction:
    """Compile ``outputs`` (Exprs) over ``inputs`` (vars / leaves / buffers) to a CUDA kernel.

    The source is generated now (so unsupported primitives and dtypes fail here, without a
    GPU); CuPy compiles it on the first call. See :class:`CudaFunction` for the call contract.
    """
    return CudaFunction(kernel_spec(outputs, inputs, name))
