"""Kernels of derived programs (derivatives) found without deriving them again.

``sym.compile(sym.hessian(f, x), ...)`` in a new process derives the Hessian before the disk
cache can be asked for its machine code: the cache is keyed by the derived program. For large
expressions the derivation is most of the time (an h2mc path of 7 segments: 67 % of the
80-200 s it took to load its kernels from a warm cache, the rest mostly hashing the derived
programs). :func:`compile_derived` keys an index entry by the *value* program, the input list
and a caller's tag naming the derivation; the entry names the derived kernel's machine code,
which the LLVM backend then links from the disk cache without the derived program (built only
if another variant of the kernel is asked for).

The index key also holds a fingerprint of core_ad's symbolic engine (:mod:`core_ad._sym`, the
rule table) and of the code generators, so an edit to a derivative rule or to the emitter
names new entries; the tag must name everything ``derive`` computes from the values besides
the inputs (which variables it differentiates by, which outputs it returns, in what order).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from importlib.metadata import PackageNotFoundError, version

from .._sym.program import check_inputs, check_program, cse
from . import _debug, resolve_backend
from . import compile as compile_expressions
from .cache import CODEGEN_VERSION, _digest, serialize

__all__ = ["compile_derived", "derived_cache_enabled"]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # core_ad's package
_LOADED: dict = {}  # index key -> kernel (one object per derivation in a process)
_LOCK = threading.Lock()


def _engine_fingerprint(here: str = _HERE) -> str:
    """A hash of the sources below ``here`` (core_ad's package) that decide what a derivation
    computes: the symbolic engine (``_sym``), the rule table and the primitives."""
    h = hashlib.sha256()
    try:
        names = sorted(f"_sym/{f}" for f in os.listdir(os.path.join(here, "_sym"))
                       if f.endswith(".py")) + ["_rules.py", "_primitives.py"]
        for rel in names:
            with open(os.path.join(here, rel), "rb") as f:
                h.update(f.read())
    except OSError:  # sources not shipped: the package version stands in
        try:
            h.update(version("difvis-core-ad").encode())
        except PackageNotFoundError:
            return "unknown"
    return h.hexdigest()[:16]


ENGINE_VERSION = "core_ad-sym-" + _engine_fingerprint()


def _index_path(index_key: str) -> str | None:
    from .llvm.jit import Jit

    d = Jit.cache_dir()
    return None if d is None else os.path.join(d, f"derived_{index_key[:40]}.json")


def _read(path):
    try:
        with open(path) as f:
            entry = json.load(f)
        return entry if {"code", "dtypes", "min_lanes", "key"} <= entry.keys() else None
    except (OSError, ValueError, AttributeError):
        return None


def _write(path, entry) -> None:
    try:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
    except OSError:
        pass  # a read-only or full cache directory only costs the cache


def derived_cache_enabled(backend: str | None = None) -> bool:
    """Whether :func:`compile_derived` finds kernels that other processes built: the LLVM
    backend (``backend``, None: the default one) with the disk cache on."""
    from .llvm.jit import Jit

    return resolve_backend(backend)[0] == "llvm" and Jit.cache_dir() is not None


def compile_derived(values, inputs, derive, tag: str, backend: str | None = None, *,
                    cached_only: bool = False, **options):
    """``sym.compile(derive(values), inputs, backend, **options)``, found in a later process
    without calling ``derive`` (LLVM backend with the disk cache on; otherwise it compiles).
    ``cached_only``: None instead of deriving and compiling when the kernel is neither in
    this process nor in the disk cache (always None without them: see
    :func:`derived_cache_enabled`), for a caller that builds missing kernels elsewhere (other
    processes, which share the disk cache).

    ``values``: the expressions ``derive`` starts from (a list); ``derive(values)`` returns
    the list of output expressions (e.g. a value, its gradient and Hessian entries);
    ``tag``: a string naming the derivation: two ``derive`` functions that compute different
    outputs from the same values must have different tags (the index entry is keyed by the
    value program, the input list, the tag, the backend options and the versions of the
    symbolic engine and code generators).
    """
    name, _ = resolve_backend(backend)
    roots, _, inputs = check_inputs(values, inputs, "compile_derived")
    if name != "llvm":
        return None if cached_only else compile_expressions(derive(list(roots)), inputs,
                                                            backend, **options)
    from .llvm import check_options, code_name, load_derived
    from .llvm.jit import host_signature

    opts = check_options(options)
    prog = cse(roots)
    check_program(prog, roots, inputs, "compile_derived")
    index_key = _digest(serialize(prog, roots, inputs, True), ENGINE_VERSION, CODEGEN_VERSION,
                        host_signature(), opts, str(tag))
    with _LOCK:
        kernel = _LOADED.get(index_key)
    if kernel is not None:
        return kernel
    path = _index_path(index_key)
    entry = None if path is None else _read(path)
    if entry is not None:

        def rebuild():  # the derived program, for the variants not in the cache
            outs, _, ins = check_inputs(derive(list(roots)), inputs, "compile_derived")
            derived = cse(outs)
            check_program(derived, outs, ins, "compile_derived")
            return derived, outs

        kernel = load_derived(entry["code"], entry["dtypes"], entry["min_lanes"], inputs,
                              dict(opts), entry["key"], rebuild)
        if kernel is None:
            _debug(f"compile_derived: {entry['code']} is not in the disk cache: deriving")
    elif path is not None:
        _debug(f"compile_derived: no entry {os.path.basename(path)} ({tag}): deriving")
    if kernel is None and cached_only:
        return None
    if kernel is None:
        kernel = compile_expressions(derive(list(roots)), inputs, backend, **options)
        # indexed: LLVM kernels of lane inputs and lane outputs only (a loaded kernel's
        # outputs are dtype stand-ins: no scatter or lane_sum semantics)
        if path is not None and getattr(kernel, "backend", None) == "llvm" and not (
                any(kernel.scatter_out) or kernel.sum_out or any(kernel.is_buf)):
            _write(path, {"code": code_name(kernel), "key": kernel.key,
                          "dtypes": [str(o.dtype) for o in kernel.outputs],
                          "min_lanes": kernel.min_lanes})
    with _LOCK:
        return _LOADED.setdefault(index_key, kernel)
