"""Symbolic expressions: a hash-consed DAG of per-lane scalar expressions, its derivatives, and
its compilation to vectorised code. The contract used by ``halide_ad``, ``lsq_opt`` and
``h2mc``.

Building expressions::

    x, y = sym.var("x"), sym.var("y", "float32")
    e = sym.exp(x) * 2.0 + sym.where(x > 0, sym.sqrt(x), 0.0)

* ``var(name, dtype="float64")``, ``const(value, dtype=None)`` (Python scalars are *weak*, as
  in NumPy's NEP 50: ``float32 var * 2.0`` stays float32), ``leaf(kind, key, dtype)`` for a DSL
  leaf (an Opt-like stencil read ``leaf("X", (0, 1))``, a Halide buffer access ...), and
  ``call(prim, *args, out_dtype=None, **params)`` for a user-registered lane-wise
  :class:`~core_ad.Primitive` (a Halide Func call ``f(x + 1, y)``: declare ``None`` partials
  for integer index operands).
* The math of the rule table: ``add mul sub div neg pow exp log sqrt rsqrt sin cos tan arcsin
  arccos arctan arctan2 sinh cosh tanh erf abs sign floor ceil round trunc maximum minimum clamp
  lt le gt ge eq ne logical_and logical_or logical_not where (= select) astype safe_mul expm1
  log1p square reciprocal sigmoid isfinite isnan``, and the operators ``+ - * / **``, unary
  ``-``, ``abs()``, ``< <= > >=``. ``core_ad._rules.exp(e)`` on an Expr builds the same node:
  expressions are a *kind* of the primitive registry (priority 100).
* ``==`` / ``!=`` / ``hash`` are structural identity (use ``eq`` / ``ne`` for lane-wise
  comparison): structurally equal nodes are one object (``exp(x) is exp(x)``,
  ``x + y is y + x``, ``(x + y) + z is x + (y + z)``).
* Construction simplifies: constant folding, n-ary add / mul with canonical operand order and
  like-term / like-factor collection, ``x+0, x*1, x*0, x-x, x/1, pow(x,1), pow(x,0), --x``
  (see :mod:`core_ad._sym.simplify`). Structural primitives (reductions, reshape, take,
  matmul ...) raise a TypeError: expressions are per-lane scalars.

Rewrites: ``horner(exprs, numeric=True, conditions=True)`` -- Opt's greedy multivariate
Horner factoring of every float sum, ``where(c, e, 0)`` conditions counted as boolean factors
(shared bounds tests hoisted and evaluated once; see :mod:`core_ad._sym.factor`).

Queries: ``free_leaves(e, kind=None)`` (which unknowns a residual uses), ``free_vars``,
``calls(e, prim=None)``, ``toposort``, ``count_nodes``, ``tree_size``, ``to_str``,
``substitute(e, {node: replacement})``.

Derivatives (expressions in, expressions out; rules from the one rule table):

* ``diff(e, v, memo=None)`` -- OnePass forward-symbolic with a memo table (``DiffMemo``
  counts ``computed`` (node, var) partials and memo ``hits``);
* ``grad(e, vars)`` -- reverse symbolic accumulation, one sweep;
* ``jvp(outputs, vars, tangents)``, ``vjp(outputs, vars, cotangents)``,
  ``jacobian(outputs, vars)``;
* ``hessian(e, vars)`` -- n x n nested list, exactly symmetric (``H[i][j] is H[j][i]``);
  ``hvp(e, vars, v)``.

``v`` / ``vars`` may be **any** non-constant node, not only vars: custom leaves, and call
nodes, which are then treated as independent inputs (derivative 1 with respect to
themselves, their own operands held fixed, the chain rule through every other node).
``halide_ad`` (Func calls) and ``lsq_opt`` (stencil leaves) rely on this.

NaN-safety: a tangent or adjoint that may be a masked zero (it went through a ``where``) times
a local partial that is not provably finite is a ``safe_mul`` (0 where the tangent is 0);
every other product is a plain multiply, so simplification stays effective. So
``diff(where(x > 0, sqrt(x), 0), x)`` is 0 (not NaN) where ``x <= 0``. Details in
:mod:`core_ad._sym.diff`.

Code: ``cse(outputs)`` -> :class:`Program` (``assignments``: ``(name, node)`` in topological
order; ``outputs``: names). ``compile(outputs, inputs, backend=None, **options)`` ->
``fn(*arrays)`` returning a tuple of arrays, one per output:

* ``"llvm"`` (the default when llvmlite imports): vectorised (libmvec), multi-threaded
  (``CORE_AD_NUM_THREADS``), cached by graph structure; strict inputs: exact dtypes, 1-D arrays
  of lanes or 0-d scalars; programs it cannot lower fall back to numpy when no backend is named;
* ``"numpy"``: the reference evaluator (numpy broadcasting and dtype conversion);
* ``"cuda"``: CUDA C through CuPy on CuPy arrays (needs CuPy and a device).

``compile_derived(values, inputs, derive, tag)``: ``compile(derive(values), inputs)``, found in
a later process from the disk cache without deriving again (derivatives of large expressions
cost more to derive than to load; :mod:`core_ad._codegen.derived`); ``cached_only=True`` gives
None instead of deriving where the kernel is not there, and ``derived_cache_enabled(backend)``
says whether kernels built in other processes can be found at all.

Kernel buffers: ``buffer(name, dtype)``, ``gather(buf, index)``, ``scatter_add(buf, index,
value)`` (an output), bounds-checked in every backend. ``evaluate(e, env)`` for one-off
evaluation.

All traversals are iterative (chains of 10^4+ nested nodes are fine); a cyclic graph (only
constructible by force) raises :class:`SymbolicCycleError`.
"""

from ._codegen import compile, evaluate
from ._codegen.derived import compile_derived, derived_cache_enabled
from ._sym import *  # noqa: F403
from ._sym import __all__ as _sym_all

__all__ = _sym_all + ["compile", "compile_derived", "derived_cache_enabled", "evaluate"]  # noqa: PLE0605
