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
  MCJIT engine at O3, with the ``CORE_AD_CACHE_DIR`` object cache: put a content hash in
  ``module_name``), ``host_signature()`` (CPU, features, LLVM version: part of such a hash),
  ``thread_pool()`` and ``num_threads(requested=None)`` (the kernels' thread pool and the
  ``CORE_AD_NUM_THREADS`` rule), ``host_vector_width(dtype)`` (lanes of one SIMD register);
* for siblings that write CUDA C loop nests: ``c_spell(prim, operands, arg_dtypes,
  out_dtype)`` (one lane-wise primitive over C operand expressions, numpy's promotion rules),
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
from ._codegen.cuda.launcher import available as cuda_available, get_kernel as cuda_kernel
from ._codegen.cuda.source import PREAMBLE as CUDA_PREAMBLE, c_literal, c_type, spell as c_spell
from ._codegen.llvm.jit import host_signature, jit as _jit
from ._codegen.llvm.runtime import num_threads, thread_pool
from ._codegen.llvm.vecmath import VecMath


def compile_ir(ir_text: str, module_name: str, fn_name) -> tuple:
    """Optimise (O3), compile and link an LLVM module; returns (address of ``fn_name``,
    timings). ``fn_name`` may be a list of names: then the first element is the tuple of their
    addresses, all from the one module (one optimisation and code generation). ``module_name``
    must be unique per distinct module (use a content hash)."""
    return _jit().compile(ir_text, module_name, fn_name)


def host_vector_width(dtype) -> int:
    """Lanes of ``dtype`` in one SIMD register of this CPU (AVX2: 4 float64, 8 float32)."""
    return VecMath().width(dtype)


__all__ = [
    "LOWERINGS",
    "BoundsFailure",
    "BufferArg",
    "Emitter",
    "Unsupported",
    "VecMath",
    "available_backends",
    "CUDA_PREAMBLE",
    "c_literal",
    "c_spell",
    "c_type",
    "cuda_available",
    "cuda_kernel",
    "compile_ir",
    "host_signature",
    "host_vector_width",
    "num_threads",
    "thread_pool",
    "backends",
    "default_backend",
    "emit",
    "emit_program",
    "emit_with_grad",
    "llvm_type",
    "lowering_for",
    "register_backend",
    "register_lowering",
]
