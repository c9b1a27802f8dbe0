"""Private implementation of :mod:`core_ad.sym` (one concept per module):

* :mod:`.expr` -- node types, hash-consing, constants / vars / leaves;
* :mod:`.simplify` -- construction: folding, dtypes, canonical n-ary add/mul, identities, and
  the symbolic kind registered with the primitive registry;
* :mod:`.graph` -- iterative traversals and queries;
* :mod:`.ops` -- the public math lifted to expressions;
* :mod:`.factor` -- greedy multivariate Horner factoring (conditions as boolean factors);
* :mod:`.diff` -- OnePass forward and reverse symbolic derivatives, Hessians;
* :mod:`.program` -- ``cse`` programs (the IR the backends of :mod:`core_ad._codegen` consume;
  ``core_ad.sym.compile`` dispatches to them).
"""

# first: the simplifier registers the symbolic kind with the primitive registry
from . import simplify as _simplify  # noqa: F401, I001
from .buffers import buffer, gather, lane_sum, scatter_add
from .program import Program, cse
from .factor import horner
from .diff import DiffMemo, diff, grad, hessian, hvp, jacobian, jvp, vjp
from .expr import (
    Apply,
    Const,
    Expr,
    Leaf,
    Var,
    as_expr,
    const,
    intern_table_size,
    is_const,
    leaf,
    var,
)
from .graph import (
    SymbolicCycleError,
    calls,
    count_nodes,
    free_leaves,
    free_vars,
    substitute,
    to_str,
    toposort,
    tree_size,
)
from .ops import *  # noqa: F403
from .ops import __all__ as _ops_all
from .simplify import call, clear_build_cache

__all__ = [
    "Apply",
    "Const",
    "DiffMemo",
    "Expr",
    "Leaf",
    "Program",
    "SymbolicCycleError",
    "Var",
    "as_expr",
    "buffer",
    "call",
    "calls",
    "clear_build_cache",
    "const",
    "count_nodes",
    "cse",
    "diff",
    "free_leaves",
    "free_vars",
    "gather",
    "grad",
    "hessian",
    "horner",
    "hvp",
    "intern_table_size",
    "is_const",
    "jacobian",
    "jvp",
    "lane_sum",
    "leaf",
    "scatter_add",
    "substitute",
    "to_str",
    "toposort",
    "tree_size",
    "var",
    "vjp",
] + list(_ops_all)
