"""The kernel-building layer: the scaffolding around core_ad's scalar emitter that every tool
building its own loop nests needs (halide_ad's pipelines, lsq_opt's fused solver kernels,
edge_rt's shading kernels), written once.

A :class:`KernelModule` holds several entry points compiled together; each is a
:class:`KernelFunction` with typed arguments. The common shape is a *range function*::

    int32 name(int64 start, int64 end, int8 **ptrs [, int64 *ints])

which runs iterations ``[start, end)`` so :func:`parallel_for` can split the work over the
thread pool (ctypes releases the GIL). Compiled code can run a range function on the pool too
(:meth:`KernelModule.call_parallel`: a parallel loop nested inside a kernel's serial loops,
its body outlined into an entry point that reads the enclosing values from a closure). Inside a function: counted loops (:func:`loop`), a
vector main body with a scalar tail (:func:`vector_loop`), splats, horizontal reductions,
dense and masked vector memory access and per-lane gathers; expression values come from
:class:`~core_ad.codegen.Emitter` (whose ``BufferArg`` gathers / scatters keep their bounds
checks). ``KernelModule.compile()`` gives a ctypes callable for every entry point; equal
modules are compiled once per process (the symbol names carry a hash of the module's IR and
the host, so modules never clash in the one JIT engine).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import queue
import threading
import time
import traceback
from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from .emitter import llvm_type
from .vecmath import intrinsic
from .jit import host_signature, jit

__all__ = [
    "Arg",
    "KernelFunction",
    "KernelModule",
    "Loop",
    "dense_load",
    "dense_store",
    "gather",
    "hmax",
    "hmin",
    "hsum",
    "loop",
    "masked_dense_store",
    "parallel_for",
    "splat",
    "vector_loop",
]

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
I8P = I8.as_pointer()

# the placeholder replaced by the module's content hash in every symbol name
_TOKEN = "COREADKERNELHASH"
_COMPILED: dict = {}  # module name -> {entry name: address} (process-wide)


class Arg:
    """A typed argument: a pointer to elements of ``dtype`` (``pointer=True``), a pointer
    table (``dtype=None``: ``int8 **``), or a scalar of ``dtype``."""

    __slots__ = ("dtype", "name", "pointer")

    def __init__(self, name: str, dtype=None, pointer: bool = False):
        self.name, self.pointer = name, pointer
        self.dtype = None if dtype is None else np.dtype(dtype)

    def llvm(self):
        if self.dtype is None:
            return I8P.as_pointer()
        t = llvm_type(self.dtype, storage=True)
        return t.as_pointer() if self.pointer else t

    def ctype(self):
        if self.dtype is None or self.pointer:
            return ctypes.c_void_p
        return np.ctypeslib.as_ctypes_type(self.dtype)


class KernelFunction:
    """One entry point: ``builder`` is positioned in its entry block; arguments are
    ``arg(name)`` (or ``start`` / ``end`` / ``ptrs`` / ``ints`` of a range function)."""

    def __init__(self, module: KernelModule, name: str, args: list[Arg]):
        self.name = name
        self.signature = args
        fnty = ir.FunctionType(I32, [a.llvm() for a in args])
        self.fn = ir.Function(module.module, fnty, f"{name}_{_TOKEN}")
        self.fn.attributes.add("nounwind")
        self._args = {}
        for a, v in zip(args, self.fn.args):
            v.name = a.name
            if a.dtype is None or a.pointer:
                v.add_attribute("noalias")
            self._args[a.name] = v
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self._fail: dict = {}

    def arg(self, name: str):
        return self._args[name]

    @property
    def start(self):
        return self._args["start"]

    @property
    def end(self):
        return self._args["end"]

    def pointer(self, slot: int, dtype, table: str = "ptrs"):
        """Entry ``slot`` of the pointer table, as a pointer to ``dtype`` elements (storage
        type: bool is int8)."""
        b = self.builder
        p = b.load(b.gep(self._args[table], [ir.Constant(I64, slot)]), align=8)
        return b.bitcast(p, llvm_type(dtype, storage=True).as_pointer())

    def integer(self, slot: int, table: str = "ints"):
        """Entry ``slot`` of the int64 table."""
        b = self.builder
        return b.load(b.gep(self._args[table], [ir.Constant(I64, slot)]), align=8)

    def fail_block(self, code: int):
        """A block that returns ``code`` (a non-zero status: branch here on failure)."""
        blk = self._fail.get(code)
        if blk is None:
            blk = self._fail[code] = self.fn.append_basic_block(f"fail{code}")
            ir.IRBuilder(blk).ret(ir.Constant(I32, code))
        return blk

    def ret(self, code: int = 0):
        self.builder.ret(ir.Constant(I32, code))


class KernelModule:
    """Several entry points compiled together into one LLVM module."""

    def __init__(self, name: str):
        self.name = name
        self.module = ir.Module(name=name)
        self.functions: list[KernelFunction] = []
        self._declared: dict = {}

    def function(self, name: str, args: list[Arg]) -> KernelFunction:
        """An entry point ``int32 name(args...)`` returning a status (0: success)."""
        if any(f.name == name for f in self.functions):
            raise ValueError(f"KernelModule {self.name}: entry point {name!r} defined twice")
        f = KernelFunction(self, name, list(args))
        self.functions.append(f)
        return f

    def range_function(self, name: str, ints: bool = False) -> KernelFunction:
        """``int32 name(int64 start, int64 end, int8 **ptrs [, int64 *ints])``: iterations
        ``[start, end)`` over storage in the pointer table and sizes in the int table."""
        args = [Arg("start", np.int64), Arg("end", np.int64), Arg("ptrs")]
        if ints:
            args.append(Arg("ints", np.int64, pointer=True))
        return self.function(name, args)

    def declare(self, name: str, ret, args):
        """An external C function (``malloc``, ``free``, ...), declared once."""
        fn = self._declared.get(name)
        if fn is None:
            fn = self._declared[name] = ir.Function(self.module, ir.FunctionType(ret, args),
                                                    name)
        return fn

    def call_parallel(self, b: ir.IRBuilder, fn: KernelFunction, closure, ints, n):
        """Emit a call running the range function ``fn`` (``range_function(..., ints=True)``)
        over ``[0, n)`` on the thread pool, as :func:`parallel_for` does from Python:
        ``fn(start, end, closure, ints)`` per range. ``closure`` (``int8 **``) and ``ints``
        (``int64 *``) are passed through unchanged; ``n`` is an int64. Returns the int32
        status: the first non-zero status of the ranges, else 0 (-1 when the runtime itself
        failed; the traceback is printed)."""
        _register_parallel_runtime()
        rt = self.declare(PARALLEL_RUNTIME_SYMBOL, I32,
                          [I8P, I8P.as_pointer(), I64.as_pointer(), I64])
        return b.call(rt, [b.bitcast(fn.fn, I8P), closure, ints, n])

    def get(self, name: str) -> ir.Function:
        """The llvm function of entry point ``name`` (to call it from another entry)."""
        return next(f.fn for f in self.functions if f.name == name)

    def ir_text(self) -> tuple[str, str]:
        """(module IR with the content hash in every symbol name, the hash)."""
        text = str(self.module)
        h = hashlib.sha256((text + host_signature()).encode()).hexdigest()[:24]
        return text.replace(_TOKEN, h), h

    def compile(self) -> dict:
        """Compile (once per process for equal modules); {entry name: ctypes callable}.
        Afterwards ``ir`` is the compiled IR text and ``compile_time`` the seconds it took
        (0 when an equal module was compiled before)."""
        t0 = time.perf_counter()
        text, h = self.ir_text()
        mod_name = f"{self.name}_{h}"
        addrs = _COMPILED.get(mod_name)
        if addrs is None:
            names = [f"{f.name}_{h}" for f in self.functions]
            # an earlier process's object file (CORE_AD_CACHE_DIR): no parse, no codegen
            found = jit().load_cached(mod_name, names)
            if found is None:
                found, _ = jit().compile(text, mod_name, names)
            addrs = _COMPILED[mod_name] = dict(zip((f.name for f in self.functions), found))
        self.ir, self.compile_time = text, time.perf_counter() - t0
        out = {}
        for f in self.functions:
            proto = ctypes.CFUNCTYPE(ctypes.c_int32, *[a.ctype() for a in f.signature])
            out[f.name] = proto(addrs[f.name])
        return out


# ---------------------------------------------------------------------------- loops
class Loop:
    """``for (i = start; i < end; i += step)`` whose body spans code between construction
    and :meth:`close` (for bodies emitted across several helpers; :func:`loop` is the ``with``
    form). ``i`` is the induction variable, a phi of the type of ``start``."""

    def __init__(self, b: ir.IRBuilder, start, end, step=1, name: str = "i"):
        self.b = b
        ty = start.type
        self.step = ir.Constant(ty, step) if isinstance(step, int) else step
        fn = b.function
        pre = b.block
        self.head = fn.append_basic_block(f"{name}.head")
        self.body = fn.append_basic_block(f"{name}.body")
        self.exit = fn.append_basic_block(f"{name}.done")
        b.branch(self.head)
        b.position_at_end(self.head)
        self.i = b.phi(ty, name=name)
        self.i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", self.i, end), self.body, self.exit)
        b.position_at_end(self.body)

    def close(self):
        b = self.b
        self.i.add_incoming(b.add(self.i, self.step, flags=["nsw"]), b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)


@contextmanager
def loop(b: ir.IRBuilder, start, end, step=1, name: str = "i"):
    """``for (i = start; i < end; i += step)``: yields the induction variable (a phi of the
    type of ``start``); the body is what is emitted inside the ``with``."""
    lp = Loop(b, start, end, step, name)
    yield lp.i
    lp.close()


def vector_loop(b: ir.IRBuilder, start, end, width: int, body, name: str = "i"):
    """Iterations ``[start, end)``: a main loop over whole vectors of ``width`` lanes, then a
    scalar tail. ``body(i, w)`` emits one step at ``i``, ``w`` lanes wide (``None`` in the
    tail and when ``width`` is 1)."""
    ty = start.type
    if width > 1:
        span = b.sub(end, start)
        vend = b.add(start, b.mul(b.sdiv(span, ir.Constant(ty, width)), ir.Constant(ty, width)))
        with loop(b, start, vend, width, f"{name}.v") as i:
            body(i, width)
        start = vend
    with loop(b, start, end, 1, f"{name}.s") as i:
        body(i, None)


# ---------------------------------------------------------------------------- vectors
def splat(b: ir.IRBuilder, v, n: int):
    """``v`` broadcast to ``n`` lanes (a vector stays as it is)."""
    if isinstance(v.type, ir.VectorType):
        return v
    vt = ir.VectorType(v.type, n)
    u = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, n), [0] * n))


def _lanes(b, v):
    return [b.extract_element(v, ir.Constant(I32, k)) for k in range(v.type.count)]


def _fold(b, v, combine):
    """The lanes of ``v`` folded in lane order (the same rounding on every run) by
    ``combine(acc, lane, is_float)``; a scalar is returned as it is."""
    if not isinstance(v.type, ir.VectorType):
        return v
    lanes = _lanes(b, v)
    is_float = isinstance(lanes[0].type, (ir.FloatType, ir.DoubleType))
    acc = lanes[0]
    for x in lanes[1:]:
        acc = combine(acc, x, is_float)
    return acc


def hsum(b: ir.IRBuilder, v):
    """Sum of the lanes of ``v``, in lane order."""
    return _fold(b, v, lambda acc, x, is_float: b.fadd(acc, x) if is_float else b.add(acc, x))


def _hreduce(b, v, float_op, int_op):
    def pick(acc, x, is_float):
        c = b.fcmp_ordered(float_op, x, acc) if is_float else b.icmp_signed(int_op, x, acc)
        return b.select(c, x, acc)

    return _fold(b, v, pick)


def hmin(b: ir.IRBuilder, v):
    """Minimum over the lanes of ``v`` (NaN lanes are skipped)."""
    return _hreduce(b, v, "<", "<")


def hmax(b: ir.IRBuilder, v):
    """Maximum over the lanes of ``v`` (NaN lanes are skipped)."""
    return _hreduce(b, v, ">", ">")


def _tag(instr, alias):
    if alias is not None:
        instr.set_metadata("alias.scope", alias[0])
        instr.set_metadata("noalias", alias[1])
    return instr


def dense_load(b: ir.IRBuilder, ptr, index, width: int, alias=None, align: int = 1):
    """``width`` consecutive elements at ``ptr[index]`` as one vector load; ``alias`` is an
    optional ``(alias.scope, noalias)`` metadata pair."""
    vp = b.bitcast(b.gep(ptr, [index]), ir.VectorType(ptr.type.pointee, width).as_pointer())
    return _tag(b.load(vp, align=align), alias)


def dense_store(b: ir.IRBuilder, value, ptr, index, alias=None, align: int = 1):
    """Store the vector ``value`` at ``ptr[index]``, ``ptr[index + 1]``, ..."""
    vp = b.bitcast(b.gep(ptr, [index]), value.type.as_pointer())
    return _tag(b.store(value, vp, align=align), alias)


def masked_dense_store(b: ir.IRBuilder, value, ptr, index, mask, alias=None, align: int = 1):
    """Store the lanes of ``value`` where ``mask`` is set, keeping the others (a blend with
    the current contents: the whole vector must be in bounds)."""
    vp = b.bitcast(b.gep(ptr, [index]), value.type.as_pointer())
    value = b.select(mask, value, _tag(b.load(vp, align=align), alias))
    return _tag(b.store(value, vp, align=align), alias)


def gather(b: ir.IRBuilder, ptr, indices, offset=None, alias=None):
    """Per-lane loads ``ptr[indices[lane] + offset]``. The lane addresses ``ptr +
    indices[lane]`` do not depend on ``offset``, so gathers at several constant offsets (the
    taps of a stencil) share them."""
    n = indices.type.count
    out = ir.Constant(ir.VectorType(ptr.type.pointee, n), ir.Undefined)
    for lane in range(n):
        p = b.gep(ptr, [b.extract_element(indices, ir.Constant(I32, lane))])
        if offset is not None:
            p = b.gep(p, [offset])
        out = b.insert_element(out, _tag(b.load(p), alias), ir.Constant(I32, lane))
    return out


def masked_gather(b: ir.IRBuilder, addrs, align: int):
    """The lanes at the pointer vector ``addrs`` as one ``llvm.masked.gather``, every lane
    on (``vgatherdps`` / ``vgatherqpd`` on AVX2 and AVX-512; LLVM scalarises it elsewhere)."""
    n = addrs.type.count
    vt, mask = ir.VectorType(addrs.type.element.pointee, n), ir.VectorType(ir.IntType(1), n)
    fn = intrinsic(b.module, "llvm.masked.gather", vt, [addrs.type, I32, mask, vt],
                   overloads=[vt, addrs.type])
    return b.call(fn, [addrs, ir.Constant(I32, align), ir.Constant(mask, [1] * n),
                       ir.Constant(vt, ir.Undefined)])


def masked_scatter(b: ir.IRBuilder, value, addrs, align: int):
    """Store the lanes of ``value`` at the pointer vector ``addrs`` as one
    ``llvm.masked.scatter``, every lane on."""
    n = addrs.type.count
    mask = ir.VectorType(ir.IntType(1), n)
    fn = intrinsic(b.module, "llvm.masked.scatter", ir.VoidType(),
                   [value.type, addrs.type, I32, mask], overloads=[value.type, addrs.type])
    return b.call(fn, [value, addrs, ir.Constant(I32, align), ir.Constant(mask, [1] * n)])


# ---------------------------------------------------------------------------- threads
def parallel_for(fn, n: int, args, threads: int | None = None, chunks_per_thread: int = 1,
                 min_per_thread: int = 1, align: int = 1) -> list[int]:
    """Run ``fn(start, end, *args)`` over ``[0, n)`` split into ranges; returns every range's
    status, in range order.

    ``threads`` threads (the calling one and ``threads - 1`` pool workers, so the cores are
    never oversubscribed) take the ranges one after another from a shared queue, so a thread
    that finishes early takes more. ``args`` is a tuple, or a callable ``k -> tuple`` for
    per-range arguments (private partial buffers, say: range ``k`` of at most ``threads``
    ranges when ``chunks_per_thread`` is 1). Ranges start at multiples of ``align`` (whole
    vectors), hold at least ``min_per_thread`` iterations, and there are ``chunks_per_thread``
    of them per thread (more chunks balance uneven work)."""
    from .runtime import num_threads, thread_pool

    if n <= 0:
        return []
    t = num_threads() if threads is None else max(1, threads)
    t = max(1, min(t, n // max(1, min_per_thread)))
    chunks = min(n, t * max(1, chunks_per_thread)) if t > 1 else 1
    bounds = [0]
    for k in range(1, chunks):
        cut = n * k // chunks
        cut -= cut % align
        if cut > bounds[-1]:
            bounds.append(cut)
    bounds.append(n)
    get = args if callable(args) else (lambda k: args)
    ranges = list(itertools.pairwise(bounds))
    if len(ranges) == 1:
        return [fn(0, n, *get(0))]
    todo = queue.SimpleQueue()
    for k in range(len(ranges)):
        todo.put(k)
    rcs = [0] * len(ranges)

    def drain():
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            rcs[k] = fn(*ranges[k], *get(k))

    pool = thread_pool()
    helpers = [pool.submit(drain) for _ in range(min(t, len(ranges)) - 1)]
    drain()
    for h in helpers:  # every range is taken: a helper that has not started is not needed,
        if not h.cancel():  # nor awaited (a call from a busy pool would wait forever)
            h.result()
    return rcs


# ------------------------------------------------------------- parallel loops from compiled code
PARALLEL_RUNTIME_SYMBOL = "core_ad_parallel_for"
_RANGE_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_void_p)
_RANGE_FNS: dict = {}  # address -> ctypes callable of an outlined loop body


def _parallel_runtime(fn, closure, ints, n):
    """``core_ad_parallel_for(fn, closure, ints, n)``: the callback compiled code calls (ctypes
    takes the GIL; the ranges' calls release it again)."""
    try:
        body = _RANGE_FNS.get(fn)
        if body is None:
            body = _RANGE_FNS.setdefault(fn, _RANGE_FN(fn))
        # several chunks per thread balance uneven iterations, as for outermost loops
        rcs = parallel_for(body, n, (closure, ints), chunks_per_thread=4)
        return next((rc for rc in rcs if rc), 0)
    except BaseException:  # an exception cannot cross the compiled caller's frames
        traceback.print_exc()
        return -1


_PARALLEL_RUNTIME = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int64)(_parallel_runtime)
_REGISTER_LOCK = threading.Lock()
_registered = False


def _register_parallel_runtime():
    """Make :data:`PARALLEL_RUNTIME_SYMBOL` resolvable by the JIT (also for kernels loaded from
    the disk cache: they are linked after the IR that calls it was built in this process)."""
    global _registered
    if _registered:
        return
    with _REGISTER_LOCK:
        if not _registered:
            import llvmlite.binding as llvm

            llvm.add_symbol(PARALLEL_RUNTIME_SYMBOL,
                            ctypes.cast(_PARALLEL_RUNTIME, ctypes.c_void_p).value)
            _registered = True
