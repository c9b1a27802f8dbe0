"""Code generation: the scalar-expression emitter and the backend registry.

Sibling packages that build their own loop nests (halide_ad, lsq_opt) emit core_ad
expressions with the ONE emitter here rather than writing another::

    from llvmlite import ir
    from core_ad import codegen, sym

    x, y = sym.var("x"), sym.var("y")
    f = sym.sin(x) * y
    # inside your loop body, with llvm values xv, yv (double or <4 x double>):
    fv = codegen.emit(builder, f, {x: xv, y: yv})
    fv, (gx, gy) = codegen.emit_with_grad(builder, f, [x, y], {x: xv, y: yv})
    vals = codegen.emit_program(builder, sym.cse([f, g]), env)

* ``emit(builder, exprs, env, **kw)`` -- an Expr (-> value) or a list (-> list of values);
* ``emit_program(builder, program, env, **kw)`` -- a :func:`core_ad.sym.cse` Program;
* ``emit_with_grad(builder, expr, wrt, env, hessian=False, **kw)`` -- ``(value, grads)`` or
  ``(value, grads, hessian)``, derivatives from :func:`core_ad.sym.grad` / ``hessian`` in one
  shared program;
* ``Emitter(builder, width=None, math=None, buffers=None, scatter_targets=None,
  on_bounds_error=None, bounds_check=True, atomic_scatter=False,
  c_semantics=False)`` -- the keyword arguments
  ``kw`` above; ``BufferArg(ptr, length)`` for ``sym.buffer`` leaves (gather / scatter_add),
  ``BoundsFailure(node, ordinal, lane, index)`` passed to ``on_bounds_error``;
* ``LOWERINGS`` (primitive name -> ``fn(emitter, node, args)``), ``register_lowering(name,
  fn)``, ``lowering_for(prim)``; a user primitive may also carry
  ``extra={"llvm_lowering": fn}``;
* ``llvm_type(dtype, storage=False)``; ``VecMath`` (libmvec / libm calls);
* the backends of :func:`core_ad.sym.compile`: ``backends()``, ``available_backends()``,
  ``default_backend()``, ``register_backend(...)``;
* for siblings that build whole LLVM modules of their own (loop nests around the emitter):
  ``compile_ir(ir_text, module_name, fn_name) -> (address, timings)`` (``fn_name`` a list
  of names -> a tuple of addresses from one module; the one process-wide
  MCJIT engine at O3, with the on-disk object cache (``CORE_AD_CACHE_DIR``): put a content hash in
  ``module_name``), ``host_signature()`` (CPU, features, LLVM version: part of such a hash; the target is the
  host CPU unless ``CORE_AD_LLVM_CPU`` names an x86-64 level), ``target_machine(opt=3)``,
  ``thread_pool()`` and ``num_threads(requested=None)`` (the kernels' thread pool and the
  ``CORE_AD_NUM_THREADS`` rule), ``map_ordered(fn, items, window=None)`` (``fn`` over items
  on the pool, results in order, a bounded number ahead), ``host_vector_width(dtype)`` (lanes of one SIMD register);
* **the kernel-building layer** for siblings that build whole kernels (loop nests around the
  emitter): ``KernelModule(name)`` with several entry points (``range_function(name,
  ints=False)``: ``int32 name(int64 start, int64 end, int8 **ptrs [, int64 *ints])``, or
  ``function(name, [Arg(...), ...])`` with typed pointer / scalar arguments) compiled together
  by ``KernelModule.compile() -> {name: ctypes callable}``; in a body: ``loop`` (counted;
  ``Loop`` for a body emitted across helpers), ``vector_loop`` (vector main body + scalar
  tail), ``splat``, ``hsum`` / ``hmin`` / ``hmax``,
  ``dense_load`` / ``dense_store`` / ``masked_dense_store``, ``gather`` (per-lane loads;
  bounds-checked gathers and scatters are the emitter's ``BufferArg``), ``masked_gather`` /
  ``masked_scatter`` (one ``llvm.masked.gather`` / ``scatter`` at a vector of pointers); ``parallel_for(fn, n,
  args, ...)`` splits ``[0, n)`` over the thread pool in aligned ranges, with per-thread
  arguments for private partial buffers; ``KernelModule.call_parallel(builder, fn, closure,
  ints, n)`` does the same from compiled code (a parallel loop nested in serial ones, its body
  an entry point reading the enclosing values from ``closure``). Example (a vectorised, threaded sum of squares)::

      import ctypes
      import numpy as np
      from core_ad import codegen, sym

      x = sym.var("x")
      mod = codegen.KernelModule("sumsq")
      f = mod.range_function("sumsq")            # (start, end, ptrs): ptrs = [xs, partials]
      b = f.builder
      xs, part = f.pointer(0, np.float64), f.pointer(1, np.float64)
      acc = b.alloca(codegen.llvm_type(np.float64))
      b.store(codegen.llvm_type(np.float64)(0.0), acc)
      W = codegen.host_vector_width(np.float64)

      def step(i, w):
          v = codegen.dense_load(b, xs, i, w) if w else b.load(b.gep(xs, [i]))
          sq = codegen.emit(b, x * x, {x: v})
          b.store(b.fadd(b.load(acc), codegen.hsum(b, sq)), acc)

      codegen.vector_loop(b, f.start, f.end, W, step)
      b.store(b.load(acc), b.gep(part, [f.start]))
      f.ret()
      sumsq = mod.compile()["sumsq"]
      data, partials = np.random.rand(10**6), np.zeros(10**6)
      table = (ctypes.c_void_p * 2)(data.ctypes.data, partials.ctypes.data)
      codegen.parallel_for(sumsq, data.size, (ctypes.addressof(table),), align=W)
      total = partials.sum()

* ``host_empty(n, dtype)`` / ``host_zeros(n, dtype)``: 1-D host arrays from the caching
  allocator the compiled kernels write their outputs into (large ones reuse released blocks
  whose pages are already mapped: a fresh 8 MiB array costs ~3 ms of page faults here, more
  than most kernels filling it); ``host_cache_stats()``, ``empty_host_cache()``;
* the CUDA side, for siblings that write CUDA C kernels: :class:`CudaWriter` (a kernel with
  documented parameters, ``grid_stride_loop``, ``for_range``, ``if_``, bounds-checked
  accesses recording the first failure in the error slot, ``atomic_add``; see its example),
  ``c_spell(prim, operands, arg_dtypes,
  out_dtype)`` (one lane-wise primitive over C operand expressions, numpy's promotion rules),
  ``c_spell_node(node, operands)`` (one node of a ``sym.cse`` program: ``c_spell`` with the
  exact ``x * x`` of a power by 2, as core_ad's own kernels spell it),
  ``c_type(dtype)``, ``c_literal(value, dtype)``, ``CUDA_PREAMBLE`` (the device helpers the
  spellings use), ``cuda_kernel(source, name)`` (a cached ``cupy.RawKernel``) and
  ``cuda_available()`` (CuPy with a device).
"""

from ._codegen import (
    available_backends,
    backends,
    default_backend,
    register_backend,
)
from ._codegen.cuda.launcher import available as cuda_available
from ._codegen.cuda.launcher import get_kernel as cuda_kernel
from ._codegen.cuda.source import c_literal, c_type
from ._codegen.cuda.source import spell as c_spell
from ._codegen.cuda.source import spell_node as c_spell_node
from ._codegen.cuda.writer import PREAMBLE as CUDA_PREAMBLE
from ._codegen.cuda.writer import CudaWriter
from ._codegen.host_pool import cache_stats as host_cache_stats
from ._codegen.host_pool import empty as host_empty
from ._codegen.host_pool import empty_cache as empty_host_cache
from ._codegen.host_pool import zeros as host_zeros
from ._codegen.llvm.builder import (
    Arg,
    KernelFunction,
    KernelModule,
    Loop,
    dense_load,
    dense_store,
    gather,
    hmax,
    hmin,
    hsum,
    loop,
    masked_dense_store,
    masked_gather,
    masked_scatter,
    parallel_for,
    splat,
    vector_loop,
)
from ._codegen.llvm.emitter import (
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
import llvmlite.binding as llvm_binding

from ._codegen.llvm.jit import host_signature
from ._codegen.llvm.jit import jit as _jit
from ._codegen.llvm.runtime import map_ordered, num_threads, thread_pool
from ._codegen.llvm.vecmath import VecMath


def compile_ir(ir_text: str, module_name: str, fn_name) -> tuple:
    """Optimise (O3), compile and link an LLVM module; returns (address of ``fn_name``,
    timings). ``fn_name`` may be a list of names: then the first element is the tuple of their
    addresses, all from the one module (one optimisation and code generation). ``module_name``
    must be unique per distinct module (use a content hash), and so must the symbol names
    across modules (they share one JIT engine): :class:`KernelModule` does both."""
    return _jit().compile(ir_text, module_name, fn_name)


def target_machine(opt: int = 3):
    """A new llvmlite ``TargetMachine`` for the JIT's target (the host CPU, or
    ``CORE_AD_LLVM_CPU``'s level), for siblings that inspect IR as the JIT would optimise it."""
    j = _jit()
    target = llvm_binding.Target.from_triple(llvm_binding.get_process_triple())
    return target.create_target_machine(cpu=j.cpu, features=j.features, opt=opt)


def host_vector_width(dtype) -> int:
    """Lanes of ``dtype`` in one SIMD register of this CPU (AVX2: 4 float64, 8 float32)."""
    return VecMath().width(dtype)


__all__ = [
    "CUDA_PREAMBLE",
    "CudaWriter",
    "LOWERINGS",
    "Arg",
    "BoundsFailure",
    "BufferArg",
    "Emitter",
    "KernelFunction",
    "KernelModule",
    "Loop",
    "Unsupported",
    "VecMath",
    "available_backends",
    "backends",
    "c_literal",
    "c_spell",
    "c_spell_node",
    "c_type",
    "compile_ir",
    "cuda_available",
    "cuda_kernel",
    "default_backend",
    "dense_load",
    "dense_store",
    "emit",
    "emit_program",
    "emit_with_grad",
    "empty_host_cache",
    "gather",
    "hmax",
    "hmin",
    "host_cache_stats",
    "host_empty",
    "host_signature",
    "host_vector_width",
    "target_machine",
    "host_zeros",
    "hsum",
    "llvm_type",
    "loop",
    "lowering_for",
    "masked_dense_store",
    "masked_gather",
    "masked_scatter",
    "num_threads",
    "parallel_for",
    "register_backend",
    "register_lowering",
    "splat",
    "thread_pool",
    "map_ordered",
    "vector_loop",
]
