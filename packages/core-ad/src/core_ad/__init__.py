"""core_ad: the shared automatic-differentiation engine.

* :class:`Array` and :mod:`core_ad.numpy`: Enoki-style tracing arrays over numpy; in lazy
  mode over CuPy arrays too (fused CUDA kernels, see :mod:`core_ad._device`).
* ``grad``, ``value_and_grad``, ``jvp``, ``vjp``, ``jacobian``, ``hessian``, ``hvp``,
  ``batch_hessian``: functional transforms (JAX conventions) on numpy inputs and pytrees.
* ``custom_vjp``, ``custom_jvp``, :class:`Function`: custom derivatives.
* ``checkpoint``, ``checkpointed_loop``, ``revolve_schedule``: recompute instead of store.
* ``check_grads``: finite-difference checks.
* ``eigh``: batched small symmetric eigen-decomposition (compiled Jacobi kernel, n <= 16),
  differentiable on traced arrays.
* :mod:`core_ad.sym`: the symbolic expression engine (hash-consed DAG, symbolic derivatives,
  ``compile``).

All of it derives from one rule table of primitives (:func:`primitives`).
"""

from . import numpy, sym  # noqa: F401
from ._check import check_grads
from ._checkpoint import LoopStats, checkpointed_loop
from ._compiled_hessian import (
    CompiledBatchGrad,
    CompiledBatchHessian,
    SymbolicTraceError,
    compiled_batch_grad,
    compiled_batch_hessian,
)
from ._device import DeviceMismatchError, DeviceUnsupportedError
from ._diagnostics import WhosReport, graphviz, whos
from ._eliminate import GraphSimplifiedError, simplify_graph
from ._custom import (
    CheckpointClosureError,
    Function,
    FunctionCtx,
    checkpoint,
    custom_jvp,
    custom_vjp,
)
from ._functional import (
    LaneMixingError,
    batch_hessian,
    grad,
    hessian,
    hvp,
    jacobian,
    jvp,
    value_and_grad,
    vjp,
)
from ._primitives import Primitive, get_primitive, primitives, register
from ._lazy import (
    evaluate_scope as _evaluate_scope,
    is_lazy,
    lazy,
    lazy_mode,
    set_lazy,
    set_vertex_elimination,
)
from ._linalg import eigh
from ._revolve import revolve_schedule
from ._tracing import (
    Array,
    GraphFreedError,
    backward,
    clear_grads,
    detach,
    enable_grad,
    forward,
    label,
    no_grad,
)



def eval(*arrays):  # noqa: A001 - Enoki's / Dr.Jit's name
    """Compute pending lazy arithmetic now (all of it: every live pending array of the
    scope is evaluated in one fused kernel per shape); returns the arrays."""
    _evaluate_scope()
    return arrays[0] if len(arrays) == 1 else arrays


__version__ = "0.1.0"

__all__ = [
    "Array",
    "CheckpointClosureError",
    "CompiledBatchGrad",
    "CompiledBatchHessian",
    "DeviceMismatchError",
    "DeviceUnsupportedError",
    "Function",
    "FunctionCtx",
    "GraphFreedError",
    "GraphSimplifiedError",
    "LaneMixingError",
    "LoopStats",
    "Primitive",
    "WhosReport",
    "SymbolicTraceError",
    "backward",
    "batch_hessian",
    "check_grads",
    "checkpoint",
    "checkpointed_loop",
    "clear_grads",
    "compiled_batch_grad",
    "compiled_batch_hessian",
    "custom_jvp",
    "custom_vjp",
    "detach",
    "eigh",
    "eval",
    "is_lazy",
    "lazy",
    "lazy_mode",
    "set_lazy",
    "set_vertex_elimination",
    "simplify_graph",
    "enable_grad",
    "forward",
    "get_primitive",
    "grad",
    "graphviz",
    "hessian",
    "hvp",
    "jacobian",
    "jvp",
    "label",
    "no_grad",
    "numpy",
    "primitives",
    "register",
    "revolve_schedule",
    "sym",
    "value_and_grad",
    "vjp",
    "whos",
]
