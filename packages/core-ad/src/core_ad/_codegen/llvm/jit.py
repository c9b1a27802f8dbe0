"""The JIT: two MCJIT engines per process (host target machines at O3 and, for very large
kernels, O0), an optional on-disk object cache.

* ``llvm.initialize()`` is deprecated in llvmlite 0.50 and not called; the native target and
  asm printer are initialised once.
* The target machine is the host CPU with its features (``znver4``: AVX-512 here; see
  ``CORE_AD_LLVM_CPU`` below), ``-O3``;
  modules are optimised with the new pass manager's O3 pipeline (``speed_level=3``; O2 without
  the SLP vectoriser for core_ad's lane-wise kernels, see ``LANEWISE_SPEED_LEVEL``; the loop
  vectoriser is off because kernels are emitted in vector form already, SLP is on) before
  code generation, except large ones (a function over ``LARGE_KERNEL_LINES``), which go straight to code
  generation; very large ones (``FAST_CODEGEN_LINES``) also get -O0 code generation (fast
  instruction selection and register allocation), whose cost grows about linearly where
  -O3's greedy allocator and schedulers grow faster on one huge basic block. core_ad's
  lane-wise kernels rarely get that far: a large program is split into functions of
  ``kernel.PART_OPS`` operations, which compile at -O3 in about linear time (7x faster code
  than one block at -O0; the IR pipeline is skipped for them).
* Every kernel module is added to the engine of its level (names are unique: they carry the
  code key).
* On-disk object cache, on by default (``CORE_AD_CACHE_DIR``, read at each compile; see
  :meth:`Jit.cache_dir` for the default place and the off switch): the engine's
  object cache hooks store each module's object code as ``<dir>/<code key>.o`` and load it
  back instead of optimising and compiling again (in a later process); callers that can
  name a module before building its IR (core_ad's lane-wise kernels) skip the IR too and
  link the object file directly (:meth:`Jit.load_cached`). The code key hashes
  the kernel's IR inputs *and* the host CPU name, features and LLVM version, so an object is
  only reused on a matching host.
* ``CORE_AD_LLVM_CPU`` (read once per process, see :func:`target_cpu`) compiles for an x86-64
  micro-architecture level instead of the host CPU (``x86-64-v3``: AVX2 + FMA, no AVX-512), the
  libmvec ISA and vector widths following it: the tests can then run with the code (vector
  widths, reduction orders, libmvec variants, so the last bits) of a machine such as CI's.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import llvmlite
import llvmlite.binding as llvm

__all__ = ["jit", "Jit", "host_signature", "target_cpu", "X86_LEVELS", "TargetCPUError"]

_INIT_LOCK = threading.RLock()
_JIT = None


_BASE = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_V2 = _BASE + ("cx16", "crc32", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
# The x86-64 psABI micro-architecture levels (LLVM CPUs of the same names) and the features
# each guarantees: the targets CORE_AD_LLVM_CPU may name.
X86_LEVELS = {
    "x86-64": _BASE,
    "x86-64-v2": _V2,
    "x86-64-v3": _V3,
    "x86-64-v4": _V3 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"),
}


class TargetCPUError(ValueError):
    """``CORE_AD_LLVM_CPU`` names no known level, or one this host cannot run."""


def target_cpu(name: str | None = None) -> tuple[str, dict]:
    """(LLVM CPU name, {feature: enabled}) that kernels are compiled for: the host CPU and its
    features, or with ``name`` (default: ``CORE_AD_LLVM_CPU``; unset or empty = the host) one
    of :data:`X86_LEVELS`, with exactly that level's features (the host's others, AVX-512
    above v3 included, turned off). Raises :class:`TargetCPUError` for another name or a level
    that needs a feature the host lacks (its code could not run here)."""
    _init_llvm()
    if name is None:
        name = os.environ.get("CORE_AD_LLVM_CPU", "")
    name = name.strip()
    host = dict(llvm.get_host_cpu_features())
    if not name:
        return llvm.get_host_cpu_name(), host
    if name not in X86_LEVELS:
        raise TargetCPUError(f"CORE_AD_LLVM_CPU={name!r}: expected one of"
                             f" {', '.join(X86_LEVELS)} (or unset for the host CPU)")
    level = X86_LEVELS[name]
    missing = [f for f in level if not host.get(f)]
    if missing:
        raise TargetCPUError(f"CORE_AD_LLVM_CPU={name!r}: this host"
                             f" ({llvm.get_host_cpu_name()}) lacks {', '.join(missing)}")
    return name, {f: f in level for f in host}


_TARGET = None


def _target() -> tuple[str, dict]:
    """:func:`target_cpu` of the environment, resolved once: every kernel of a process and its
    code keys share one target."""
    global _TARGET
    if _TARGET is None:
        with _INIT_LOCK:
            if _TARGET is None:
                _TARGET = target_cpu()
    return _TARGET


def _flatten(features: dict) -> str:
    return ",".join(("+" if on else "-") + f for f, on in sorted(features.items()))


def host_signature() -> str:
    """Target CPU name, features (the host's unless ``CORE_AD_LLVM_CPU``) and LLVM / llvmlite
    versions: part of every code key."""
    cpu, features = _target()
    return "|".join([
        llvm.get_process_triple(),
        cpu,
        _flatten(features),
        ".".join(map(str, llvm.llvm_version_info)),
        llvmlite.__version__,
    ])


_INITIALISED = False


def _init_llvm():
    global _INITIALISED
    if _INITIALISED:
        return
    with _INIT_LOCK:
        if not _INITIALISED:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _INITIALISED = True


class Jit:
    """The process-wide engine (use :func:`jit`)."""

    def __init__(self):
        _init_llvm()
        target = llvm.Target.from_triple(llvm.get_process_triple())
        self.cpu, features = _target()
        self.features = _flatten(features)
        self.tm = target.create_target_machine(
            cpu=self.cpu, features=self.features, opt=3, jit=True
        )
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        self.engine.set_object_cache(self._notify, self._getbuffer)
        self.fast_tm = target.create_target_machine(
            cpu=self.cpu, features=self.features, opt=0, jit=True
        )
        self.fast_engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.fast_tm)
        self.fast_engine.set_object_cache(self._notify, self._getbuffer)
        self.lock = threading.RLock()
        self.modules = []  # keep the ModuleRefs alive
        self._pending_dir = None
        self.stats = {"compiled": 0, "disk_hits": 0}

    # ---- object cache hooks ------------------------------------------------------------
    @staticmethod
    def cache_dir() -> str | None:
        """``CORE_AD_CACHE_DIR``, by default ``$XDG_CACHE_HOME/core_ad/kernels`` (else
        ``~/.cache/...``), as Dr.Jit keeps its kernels in ``~/.drjit``; ``off`` (or ``0``,
        empty) turns the disk cache off."""
        d = os.environ.get("CORE_AD_CACHE_DIR")
        if d is None:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                      ".cache")
            return os.path.join(base, "core_ad", "kernels")
        return None if d.strip().lower() in ("", "0", "off", "false", "no") else d

    def _path(self, module) -> str | None:
        d = self._pending_dir
        if d is None or module.name == "<string>":  # the engines' own empty modules
            return None
        return os.path.join(d, module.name + ".o")

    def load_cached(self, module_name: str, fn_names) -> tuple | None:
        """The addresses of ``fn_names`` linked from ``<CORE_AD_CACHE_DIR>/<module_name>.o``
        when an earlier process compiled that module, else None (nothing linked then). The
        caller builds no IR at all on a hit (1 s of the 1.1 s an h2mc Hessian kernel took
        from the cache through the IR)."""
        d = self.cache_dir()
        path = None if d is None else os.path.join(d, module_name + ".o")
        if path is None or not os.path.exists(path):
            return None
        with self.lock:
            try:
                obj = llvm.ObjectFileRef.from_path(path)
            except (OSError, RuntimeError):
                return None  # unreadable: compile again (and overwrite it)
            self.engine.add_object_file(obj)
            addrs = tuple(self.engine.get_function_address(n) for n in fn_names)
            self.modules.append(obj)
        if not all(addrs):
            raise RuntimeError(f"LLVM backend: cached object {path} lacks function(s)"
                               f" {[n for n, a in zip(fn_names, addrs) if not a]!r}; delete it")
        self.stats["disk_hits"] += 1
        return addrs

    def _notify(self, module, buf: bytes):
        path = self._path(module)
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "wb") as f:
                f.write(buf)
            os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
        except OSError:
            pass  # a read-only or full cache directory only costs the cache

    def _getbuffer(self, module):
        path = self._path(module)
        if path is None or not os.path.exists(path):
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        self.stats["disk_hits"] += 1
        return data

    # ---- compile -----------------------------------------------------------------------
    def compile(self, ir_text: str, module_name: str, fn_name, speed_level: int = 3,
                slp: bool = True) -> tuple:
        """Parse, optimise, compile and link ``ir_text`` (levels by size: see the module
        docstring; ``speed_level`` is the IR pipeline's below that size, ``slp`` whether it
        runs the SLP vectoriser); returns (address of
        ``fn_name``, {"parse", "opt", "codegen"} in seconds, "disk_hit", "codegen_level"}).
        With a list or tuple of names, the first element is the tuple of their addresses (one
        module, one optimisation and code generation for all)."""
        names = [fn_name] if isinstance(fn_name, str) else list(fn_name)
        if not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"LLVM backend: fn_name must be a name or a list of names, got"
                            f" {fn_name!r}")
        times = {}
        lines = _longest_function_lines(ir_text)
        fast = lines >= FAST_CODEGEN_LINES
        tm, engine = (self.fast_tm, self.fast_engine) if fast else (self.tm, self.engine)
        with self.lock:
            t0 = time.perf_counter()
            mod = llvm.parse_assembly(ir_text)
            mod.name = module_name
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
            t1 = time.perf_counter()
            d = self.cache_dir()
            self._pending_dir = d
            hit = d is not None and os.path.exists(os.path.join(d, module_name + ".o"))
            if not hit:  # the object cache supplies the machine code: no need to optimise
                pto = llvm.create_pipeline_tuning_options(
                    speed_level=speed_level if lines < LARGE_KERNEL_LINES else 0)
                # the main loop is already in vector form and the remainder runs < W times:
                # the loop vectoriser has nothing to gain (and costs compile time); SLP stays
                # unless the caller's code is vector code throughout
                pto.loop_vectorization = False
                pto.slp_vectorization = slp
                pb = llvm.create_pass_builder(tm, pto)
                pb.getModulePassManager().run(mod, pb)
            t2 = time.perf_counter()
            try:
                engine.add_module(mod)
                engine.finalize_object()
            finally:
                self._pending_dir = None
            addrs = [engine.get_function_address(n) for n in names]
            t3 = time.perf_counter()
            self.modules.append(mod)
            self.stats["compiled"] += 1
        missing = [n for n, a in zip(names, addrs) if not a]
        if missing:
            raise RuntimeError(f"LLVM backend: function(s) {missing!r} not found after linking"
                               f" module {module_name!r}")
        times.update(parse=t1 - t0, opt=t2 - t1, codegen=t3 - t2, disk_hit=hit,
                     codegen_level=0 if fast else 3)
        return (addrs[0] if isinstance(fn_name, str) else tuple(addrs)), times

    def assembly(self, ir_text: str) -> str:
        """Optimised assembly of ``ir_text`` (for inspection and tests; not linked)."""
        with self.lock:
            mod = llvm.parse_assembly(ir_text)
            mod.triple = self.tm.triple
            mod.data_layout = str(self.tm.target_data)
            pto = llvm.create_pipeline_tuning_options(speed_level=3)
            pb = llvm.create_pass_builder(self.tm, pto)
            pb.getModulePassManager().run(mod, pb)
            return self.tm.emit_assembly(mod)


# Kernels of more IR lines than this skip LLVM's IR optimisation (the O0 pipeline; machine
# code generation is still -O3): the symbolic engine has already CSE'd and constant-folded them.
# Measured on h2mc's length-3 value + gradient + Hessian kernel (~40k lines): compile 7.1 s
# instead of 10.4-11.3 s, the kernel as fast (2.6 ms vs 2.5-3.7 ms on 1639 paths, same bits).
# Memory-bound loop kernels do need it: halide_ad's spatial-transformer adjoint (functions up
# to 9k lines, where compute_with fuses four scatters) ran 2-4x faster optimised, compiling
# in 2.6 s instead of 1 s; hence the bound sits between the two.
LARGE_KERNEL_LINES = 16000
# Functions of more IR lines than this are also compiled to machine code at -O0. Measured on
# the h2mc kernel above (39k lines, 2 busy cores): the whole compile (symbolic Hessian, IR,
# machine code) 3.4 s instead of 8.5 s; the kernel 1.7x slower (27 vs 16 ms on 3269 paths,
# same bits), a few percent of an H2MC step, where the longer paths' kernels took minutes to
# compile at -O3.
FAST_CODEGEN_LINES = 20000


def _longest_function_lines(ir_text: str) -> int:
    """IR lines of the module's largest function: the size measures decide by it, so that a
    module of many small kernels (a halide_ad pipeline's definitions, 5k-20k lines in all)
    still gets the optimisation and code generation each kernel needs."""
    return max((f.count("\n") + 1 for f in ir_text.split("\ndefine ")[1:]), default=0)


def jit() -> Jit:
    """The process-wide :class:`Jit` (created on first use)."""
    global _JIT
    if _JIT is None:
        with _INIT_LOCK:
            if _JIT is None:
                _JIT = Jit()
    return _JIT


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()
