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
  on_bounds_error=None, bounds_check=True, atomic_scatter=False)`` -- the keyword arguments
  ``kw`` above; ``BufferArg(ptr, length)`` for ``sym.buffer`` leaves (gather / scatter_add),
  ``BoundsFailure(node, ordinal, lane, index)`` passed to ``on_bounds_error``;
* ``LOWERINGS`` (primitive name -> ``fn(emitter, node, args)``), ``register_lowering(name,
  fn)``, ``lowering_for(prim)``; a user primitive may also carry
  ``extra={"llvm_lowering": fn}``;
* ``llvm_type(dtype, storage=False)``; ``VecMath`` (libmvec / libm calls);
* the backends of :func:`core_ad.sym.compile`: ``backends()``, ``available_backends()``,
  ``default_backend()``, ``register_backend(...)``.
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
from ._codegen.llvm.vecmath import VecMath

__all__ = [
    "LOWERINGS",
    "BoundsFailure",
    "BufferArg",
    "Emitter",
    "Unsupported",
    "VecMath",
    "available_backends",
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
