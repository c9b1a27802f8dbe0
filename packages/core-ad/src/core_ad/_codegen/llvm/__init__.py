"""The LLVM backend of ``sym.compile``: vectorised, multi-threaded lane-wise kernels.

Modules (one concept each):

* :mod:`.emitter` -- the scalar-expression emitter (one per project: the kernel builder,
  halide_ad and lsq_opt all call it) and the per-primitive lowering table;
* :mod:`.vecmath` -- transcendentals: libmvec vector variants, libm scalars, accuracy table;
* :mod:`.kernel` -- a cse Program to one LLVM function over a lane range (vector main loop,
  scalar remainder, bounds checks, scatter targets);
* :mod:`.jit` -- target machine (host CPU, O3), the MCJIT engine, the on-disk object cache;
* :mod:`.runtime` -- the callable: argument checks, thread pool, error slots.

Options of ``sym.compile(..., backend="llvm", **options)``:

* ``vectorize=True`` -- ``False`` emits the scalar loop only (libm everywhere);
* ``libmvec=None`` -- ``False`` scalarises vector calls to libm even where libmvec exists
  (default: use it when available and ``CORE_AD_LIBMVEC`` is not ``0``);
* ``scatter="auto"`` -- ``"partials"`` or ``"atomic"``: how threads share scatter_add outputs.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from .emitter import (
    LOWERINGS,
    BoundsFailure,
    BufferArg,
    Emitter,
    Unsupported,
    emit,
    emit_program,
    emit_with_grad,
    llvm_type,
    lowering_for,
    register_lowering,
)
from .vecmath import VecMath

__all__ = [
    "LOWERINGS",
    "BoundsFailure",
    "BufferArg",
    "Emitter",
    "Unsupported",
    "VecMath",
    "compile_program",
    "check_options",
    "emit",
    "emit_program",
    "emit_with_grad",
    "llvm_type",
    "lowering_for",
    "register_lowering",
    "available",
]

_OPTIONS = {"vectorize": (True, False), "libmvec": (None, True, False),
            "scatter": ("auto", "partials", "atomic")}


def available() -> bool:
    try:
        import llvmlite.binding  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: not available
        return False
    return True


def check_options(options: dict) -> tuple:
    """Validated options as a hashable, sorted tuple (defaults filled in)."""
    out = {k: v[0] for k, v in _OPTIONS.items()}
    for k, v in options.items():
        if k not in _OPTIONS:
            raise TypeError(
                f"compile: unknown option {k!r} for backend 'llvm'; expected one of"
                f" {', '.join(sorted(_OPTIONS))}"
            )
        if not any(v is x or (isinstance(x, str) and v == x) for x in _OPTIONS[k]):
            raise ValueError(
                f"compile: option {k}={v!r} is invalid; expected one of"
                f" {', '.join(map(repr, _OPTIONS[k]))}"
            )
        out[k] = v
    return tuple(sorted(out.items()))


_CODE: dict = {}  # code key -> (address, KernelIR, compile seconds); machine code is never freed
LANEWISE_SPEED_LEVEL = 2  # the IR pipeline of lane-wise kernels (builder loop nests: O3)
_CODE_LOCK = threading.RLock()  # one compile per code key, even from concurrent threads


def compile_program(prog, roots, inputs, options: tuple, key: str):
    """Build the :class:`~.runtime.LLVMKernel` of a checked program (raises
    :class:`~.emitter.Unsupported` when a primitive or dtype cannot be lowered)."""
    from .kernel import check_supported
    from .runtime import LLVMKernel

    check_supported(prog, roots, inputs)
    return LLVMKernel(prog, roots, inputs, dict(options), key,
                      _builder(prog, roots, inputs, dict(options), key))


def code_name(kernel) -> str:
    """The name of ``kernel``'s all-array variant's machine code (its object file in the disk
    cache), for :func:`load_derived`."""
    return kernel._builder.name((False,) * kernel.n_in, False)


def load_derived(name, dtypes, min_lanes, inputs, options: dict, key, derive):
    """The :class:`~.runtime.LLVMKernel` of a derived program without the program: its
    all-array variant's machine code ``name`` (:func:`code_name`) from this process or the
    disk cache, its outputs lane outputs of ``dtypes``; None when that code is gone. The
    other variants (0-d inputs, strided arrays) and :attr:`~.runtime.LLVMKernel.program` call
    ``derive() -> (prog, roots)`` on first use."""
    from .runtime import LLVMKernel, OutputSpec

    with _CODE_LOCK:  # this process' machine code of that name, else the disk cache's
        hit = next(((addr, kir) for ckey, (addr, kir, _) in _CODE.items()
                    if f"core_ad_k{ckey[:24]}" == name), None)
        if hit is None:
            VecMath(libmvec=options["libmvec"])  # loads libmvec, whose symbols the code calls
            hit = _load_cached(name)
        if hit is None:
            return None
    derived = {}

    def full():  # the derived program and its own builder, on first need
        if not derived:
            prog, roots = derive()
            derived.update(prog=prog, builder=_builder(prog, roots, inputs, options, key))
        return derived

    def builder(mask, atomic, strided=False):
        if not (any(mask) or atomic or strided):
            return hit[0], hit[1], 0.0
        return full()["builder"](mask, atomic, strided)

    builder.ir_text = lambda mask, atomic, strided=False: full()["builder"].ir_text(
        mask, atomic, strided)
    return LLVMKernel(lambda: full()["prog"], [OutputSpec(np.dtype(d)) for d in dtypes],
                      inputs, options, key, builder, min_lanes=min_lanes)


def _builder(prog, roots, inputs, opts: dict, key: str):
    """``builder(mask, atomic, strided) -> (address, KernelIR, seconds)`` of a program's
    variants (compiled, or loaded from the disk cache, once per process)."""
    from ..cache import code_key
    from .jit import host_signature, jit
    from .kernel import build_kernel
    from .runtime import report_compile

    math = VecMath(libmvec=opts["libmvec"])
    host = host_signature()
    n_nodes = len(prog.assignments)

    def builder(mask, atomic, strided=False):
        with _CODE_LOCK:
            return _build(mask, atomic, strided)

    def _name(mask, atomic, strided):
        # the strided variant adds to the key: the other variants keep their cached code
        variant = (mask, atomic, "strided") if strided else (mask, atomic)
        ckey = code_key(prog, roots, inputs, *variant, opts["vectorize"], math.key, host)
        return ckey, f"core_ad_k{ckey[:24]}"

    def _ir(mask, atomic, strided):
        return build_kernel(prog, roots, inputs, name=_name(mask, atomic, strided)[1],
                            math=math, scalar_mask=mask, vectorize=opts["vectorize"],
                            atomic=atomic, strided=strided)

    def _build(mask, atomic, strided):
        t0 = time.perf_counter()
        ckey, name = _name(mask, atomic, strided)
        hit = _CODE.get(ckey)
        if hit is not None:
            return hit[0], hit[1], time.perf_counter() - t0
        variant = (f"scalar inputs {[j for j, m in enumerate(mask) if m]}"
                   f"{', atomic' if atomic else ''}{', strided' if strided else ''}")
        cached = _load_cached(name)
        if cached is not None:
            addr, kir = cached
            secs = time.perf_counter() - t0
            _CODE[ckey] = (addr, kir, secs)
            report_compile(key, n_nodes, kir.width, secs, {"disk_hit": True}, variant)
            return addr, kir, secs
        kir = _ir(mask, atomic, strided)
        t1 = time.perf_counter()
        # straight-line vector code that sym has already CSE'd: the O2 pipeline without the SLP
        # vectoriser gives the same machine code speed as O3, whose loop unswitching copies
        # the whole body on the staged tail's condition (a 1432-node Hessian kernel: 0.44 s
        # instead of 2.35 s), and SLP finds nothing to vectorise in it (an 846-node h2mc
        # value kernel: the same output, 0.56 s of its 0.66 s optimisation). A program split
        # into parts skips the IR pipeline: on h2mc's 31.8k-operation Hessian kernel it took
        # 2.8 s for the same run time
        addr, times = jit().compile(
            kir.text, name, name, slp=False,
            speed_level=LANEWISE_SPEED_LEVEL if kir.parts == 1 else 0)
        _save_meta(name, kir)
        secs = time.perf_counter() - t0
        times["ir"] = t1 - t0
        _CODE[ckey] = (addr, kir, secs)
        report_compile(key, n_nodes, kir.width, secs, times, variant)
        return addr, kir, secs

    builder.ir_text = lambda mask, atomic, strided=False: _ir(mask, atomic, strided).text
    builder.name = lambda mask, atomic, strided=False: _name(mask, atomic, strided)[1]
    return builder


def _meta_path(name: str) -> str | None:
    from .jit import Jit

    d = Jit.cache_dir()
    return None if d is None else os.path.join(d, name + ".json")


def _save_meta(name: str, kir) -> None:
    """What the runtime needs of a kernel besides its machine code (vector width, bounds
    checks), next to the object file, so that a later process need not build the IR."""
    path = _meta_path(name)
    if path is None:
        return
    try:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"width": kir.width, "checks": kir.checks}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache directory only costs the cache


_LINKED: dict = {}  # code name -> (address, KernelIR) of the object files linked so far


def _load_cached(name: str):
    """(address, KernelIR without its text) from the disk cache, or None. An object file is
    linked once per process (a derived kernel loaded by name and the same program compiled
    later share it)."""
    from .jit import jit
    from .kernel import KernelIR

    if name in _LINKED:
        return _LINKED[name]
    path = _meta_path(name)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
        kir = KernelIR(None, name, int(meta["width"]), [tuple(c) for c in meta["checks"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    addrs = jit().load_cached(name, [name])
    if addrs is None:
        return None
    _LINKED[name] = (addrs[0], kir)
    return _LINKED[name]
