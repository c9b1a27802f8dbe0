"""Code-generation backends of ``sym.compile`` and their registry.

A backend is registered once with :func:`register_backend`: a name, an ``available()``
predicate, and ``compile(prog, roots, inputs, options, key) -> callable``. Built in:

* ``"numpy"`` -- the reference evaluator (:func:`core_ad._codegen.reference.compile_reference`):
  numpy broadcasting and dtype conversion of the inputs, any primitive with an ``impl``;
* ``"llvm"`` -- vectorised, multi-threaded LLVM kernels (:mod:`core_ad._codegen.llvm`),
  strict inputs (exact dtypes, 1-D lanes or 0-d scalars), cached by graph structure;
* ``"cuda"`` -- CUDA C from the same program, compiled with ``cupy.RawKernel``
  (:mod:`core_ad._codegen.cuda`); inputs and outputs are CuPy arrays. Needs CuPy and a CUDA
  device: asking for it without them raises.

``sym.compile(..., backend=None)`` uses :func:`default_backend`: ``CORE_AD_BACKEND`` if set,
else ``"llvm"`` when llvmlite imports, else ``"numpy"``. With the default, a program the LLVM
backend cannot lower (a user primitive without a lowering, a complex dtype) falls back to
numpy (``CORE_AD_DEBUG=1`` says so); naming ``backend="llvm"`` explicitly raises instead.

Compiled kernels are cached by graph structure (:mod:`.cache`): a second compile of the same
graph returns the same kernel object.

Layering: the IR (:mod:`core_ad._sym`: expressions, ``cse`` programs) knows no backend; the
backends consume it; :func:`compile` here (public as ``core_ad.sym.compile``) is the one place
that dispatches.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from .._sym.graph import as_expr_list
from .._sym.program import check_inputs, check_program, cse
from .cache import KERNELS, structural_key
from .reference import compile_reference

__all__ = [
    "Backend",
    "available_backends",
    "backends",
    "compile",
    "compile_program",
    "default_backend",
    "evaluate",
    "lookup",
    "register_backend",
    "resolve_backend",
]


class Backend(NamedTuple):
    name: str
    compile: Callable | None
    available: Callable[[], bool]
    cached: bool
    check_options: Callable[[dict], tuple]
    doc: str


_BACKENDS: dict[str, Backend] = {}


def _no_options(options: dict) -> tuple:
    if options:
        raise TypeError(f"compile: the numpy backend takes no options, got {sorted(options)}")
    return ()


def register_backend(name: str, compile: Callable | None, available=lambda: True, *,
                     cached: bool = True, check_options=_no_options, doc: str = "") -> Backend:
    """Register a backend (names are unique). ``compile(prog, roots, inputs, options, key)``
    gets a checked :class:`~core_ad.sym.Program` and returns the callable; ``compile=None``
    declares a backend that is not implemented yet (a placeholder the implementation then
    replaces by registering the same name, e.g. ``"cuda"``)."""
    old = _BACKENDS.get(name)
    if old is not None and old.compile is not None:
        raise ValueError(f"backend {name!r} is already registered")
    b = Backend(name, compile, available, cached, check_options, doc)
    _BACKENDS[name] = b
    return b


def backends() -> dict:
    return dict(_BACKENDS)


def available_backends() -> list[str]:
    return [n for n, b in _BACKENDS.items() if b.compile is not None and b.available()]


def default_backend() -> str:
    env = os.environ.get("CORE_AD_BACKEND")
    if env:
        if env not in _BACKENDS:
            raise ValueError(f"CORE_AD_BACKEND={env!r} is not a backend; expected one of"
                             f" {', '.join(_BACKENDS)}")
        return env
    return "llvm" if _BACKENDS["llvm"].available() else "numpy"


def resolve_backend(backend) -> tuple[str, bool]:
    """(backend name, whether it was chosen by default). Unknown names raise ValueError,
    unimplemented or unavailable ones NotImplementedError."""
    auto = backend is None
    name = default_backend() if auto else backend
    b = _BACKENDS.get(name)
    if b is None:
        raise ValueError(
            f"compile: unknown backend {name!r}; expected "
            + ", ".join(repr(n) for n in list(_BACKENDS)[:-1]) + f" or {list(_BACKENDS)[-1]!r}"
        )
    if b.compile is None:
        raise NotImplementedError(f"backend {name!r} {b.doc}")
    if not b.available():
        raise NotImplementedError(f"backend {name!r} is not available here ({b.doc})")
    return name, auto


def _debug(msg):
    if os.environ.get("CORE_AD_DEBUG", "") not in ("", "0"):
        print(f"core_ad: {msg}", file=sys.stderr)


def lookup(name: str, roots, inputs, options: dict):
    """The cached kernel for exactly these outputs / inputs, or None (microseconds)."""
    b = _BACKENDS[name]
    if not b.cached:
        return None
    try:
        opts = b.check_options(options)
    except (TypeError, ValueError):
        return None  # reported by compile_program
    return KERNELS.lookup(name, roots, inputs, opts)


def compile_program(name: str, prog, roots, inputs, options: dict, auto: bool = False,
                    fallback: Callable | None = None):
    """Compile a checked program with backend ``name`` (through the kernel cache). With
    ``auto``, a program the backend cannot lower goes to ``fallback()`` (the numpy backend)."""
    from .llvm.emitter import Unsupported

    b = _BACKENDS[name]
    opts = b.check_options(options)
    if not b.cached:
        return b.compile(prog, roots, inputs, opts, None)
    key = structural_key(prog, roots, inputs, name, opts)
    k = KERNELS.lookup_hash(key)
    if k is not None:
        KERNELS.store(name, roots, inputs, opts, key, k)
        return k
    t0 = time.perf_counter()
    try:
        k = b.compile(prog, roots, inputs, opts, key)
    except Unsupported as e:
        if auto and fallback is not None:
            _debug(f"backend {name!r} cannot compile this program ({e}); using numpy")
            return fallback()
        raise
    if getattr(k, "compile_time", None) is None:
        try:
            k.compile_time = time.perf_counter() - t0
        except AttributeError:
            pass
    KERNELS.store(name, roots, inputs, opts, key, k)
    return k


# ---- the built-in backends ------------------------------------------------------------------


def _numpy_compile(prog, roots, inputs, options, key):
    return compile_reference(prog, roots, inputs)


_LLVM_OK = None


def _llvm_available() -> bool:
    global _LLVM_OK
    if _LLVM_OK is None:
        from .llvm import available

        _LLVM_OK = available()
    return _LLVM_OK


def _llvm_compile(prog, roots, inputs, options, key):
    from .llvm import compile_program as _cp

    return _cp(prog, roots, inputs, options, key)


def _llvm_options(options):
    from .llvm import check_options

    return check_options(options)


register_backend("numpy", _numpy_compile, cached=False,
                 doc="reference evaluator over numpy arrays")
register_backend("llvm", _llvm_compile, _llvm_available, check_options=_llvm_options,
                 doc="vectorised multi-threaded LLVM kernels (llvmlite)")
def _cuda_available() -> bool:
    from .cuda import available

    return available()


def _cuda_compile(prog, roots, inputs, options, key):
    from .cuda import compile_program as _cp

    return _cp(prog, roots, inputs, options, key)


def _cuda_options(options):
    from .cuda import check_options

    return check_options(options)


register_backend("cuda", _cuda_compile, _cuda_available, check_options=_cuda_options,
                 doc="CUDA kernels through CuPy (needs CuPy and a CUDA device)")


def compile(outputs, inputs, backend: str | None = None, **options):
    """Compile ``outputs`` into ``fn(*arrays)`` evaluating them over arrays of lanes.

    ``inputs``: the vars / leaves, in the order ``fn`` takes its arrays. Every leaf the
    outputs depend on must be listed (extra inputs are allowed). ``fn`` returns a tuple with
    one numpy array per output, of the output's dtype (constant outputs are broadcast).
    ``fn.call_stacked(block)`` (llvm and numpy backends) takes the inputs as the rows of one
    ``(n_inputs, N)`` array and returns ``(n_outputs, N)``: for kernels of one dtype with many
    inputs, where the per-array checks of ``fn(*arrays)`` cost more than the lanes.

    ``backend`` (see :mod:`core_ad._codegen`): ``None`` -- the default, ``"llvm"`` when
    llvmlite imports (else ``"numpy"``; ``CORE_AD_BACKEND`` overrides), falling back to numpy
    for programs LLVM cannot lower (user primitives without a lowering);

    * ``"numpy"``: the reference evaluator. At call time the arrays are converted to their
      leaf's dtype and broadcast together into the lane shape. The callable is generated
      once, as Python source over the topologically ordered program (``fn.source``,
      ``fn.program``); floating-point warnings of masked-off lanes are silenced.
    * ``"llvm"``: a vectorised, multi-threaded kernel (:mod:`core_ad._codegen.llvm`), cached
      by graph structure (a second compile returns the same object). Strict inputs: exact
      dtypes, 1-D arrays of N lanes or 0-d scalars; ``fn.compile_time``; ``options``:
      ``vectorize``, ``libmvec``, ``scatter``.
    * ``"cuda"``: CUDA C through CuPy on CuPy arrays (needs CuPy and a device).
    """
    backend, auto = resolve_backend(backend)
    roots, _, inputs = check_inputs(outputs, inputs, "compile")
    if backend != "numpy":
        hit = lookup(backend, roots, inputs, options)
        if hit is not None:
            return hit
    prog = cse(roots)
    check_program(prog, roots, inputs, "compile")
    return compile_program(backend, prog, roots, inputs, options, auto=auto,
                           fallback=lambda: compile_reference(prog, roots, inputs))


def evaluate(outputs, env: dict):
    """Evaluate expressions for ``env = {leaf: array}`` (compiles once per call; for repeated
    evaluation keep the result of :func:`compile`). Returns an array or a list, following
    ``outputs``."""
    roots, single = as_expr_list(outputs, "evaluate")
    leaves = list(env.keys())
    fn = compile(roots, leaves, backend="numpy")  # one-off: no kernel compilation
    res = fn(*[env[k] for k in leaves])
    return res[0] if single else list(res)
