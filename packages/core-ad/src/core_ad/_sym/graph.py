"""DAG traversals and queries (all iterative: deep chains never hit Python's recursion limit)."""

from __future__ import annotations

from .. import _rules as R
from .._primitives import Primitive
from . import expr as _expr
from .expr import Apply, Const, Expr, Leaf, as_expr

__all__ = [
    "SymbolicCycleError",
    "as_expr_list",
    "toposort",
    "free_leaves",
    "free_vars",
    "calls",
    "count_nodes",
    "tree_size",
    "to_str",
    "substitute",
]


class SymbolicCycleError(ValueError):
    """An expression graph that is not a DAG (only constructible by force)."""


def as_expr_list(exprs, where: str) -> tuple[list[Expr], bool]:
    """(list of Exprs, whether a single expression was given)."""
    if isinstance(exprs, Expr):
        return [exprs], True
    if isinstance(exprs, list | tuple):
        return [as_expr(e, where) for e in exprs], False
    return [as_expr(exprs, where)], True


def toposort(exprs, stop=None) -> list[Expr]:
    """Distinct nodes reachable from ``exprs``, children before parents (post-order).

    Nodes in ``stop`` (a set of ids) are included but not expanded. Raises
    :class:`SymbolicCycleError` if the graph has a cycle.
    """
    roots, _ = as_expr_list(exprs, "toposort")
    order: list[Expr] = []
    state: dict[int, int] = {}  # 1: on the stack, 2: done
    stop = stop or ()
    for r in roots:
        if id(r) in state:
            continue
        state[id(r)] = 1
        stack = [(r, iter(() if id(r) in stop else r.args))]
        while stack:
            node, it = stack[-1]
            for c in it:
                s = state.get(id(c))
                if s is None:
                    state[id(c)] = 1
                    stack.append((c, iter(() if id(c) in stop else c.args)))
                    break
                if s == 1:
                    raise SymbolicCycleError(
                        f"the expression graph has a cycle through a {_opname(c)} node: symbolic"
                        " expressions must be acyclic (was a node mutated by force?)"
                    )
            else:
                stack.pop()
                state[id(node)] = 2
                order.append(node)
    return order


def _opname(n) -> str:
    if isinstance(n, Apply):
        return repr(n.prim.name)
    if isinstance(n, Leaf):
        return f"leaf {n.name!r}"
    return "constant"


def free_leaves(exprs, kind: str | None = None) -> list[Leaf]:
    """The leaves (vars and custom leaves) that ``exprs`` depend on, in first-use order.

    With ``kind``, only leaves of that kind (``"var"`` for vars). This is the sparsity query
    of an Opt-like generator: which unknowns a residual uses.
    """
    return [
        n
        for n in toposort(exprs)
        if isinstance(n, Leaf) and (kind is None or n.kind == kind)
    ]


def free_vars(exprs) -> list[Leaf]:
    """The vars (leaves of kind ``"var"``) that ``exprs`` depend on."""
    return free_leaves(exprs, "var")


def calls(exprs, prim=None) -> list[Apply]:
    """The application nodes of ``prim`` (a Primitive or its name) in ``exprs``, in
    children-first order. With ``prim=None``: the nodes of every primitive that is not one of
    core_ad's own (i.e. the user primitives applied with :func:`core_ad.sym.call`)."""
    from .simplify import CORE_PRIMITIVES

    out = []
    for n in toposort(exprs):
        if not isinstance(n, Apply):
            continue
        if prim is None:
            if n.prim not in CORE_PRIMITIVES:
                out.append(n)
        elif isinstance(prim, Primitive):
            if n.prim is prim:
                out.append(n)
        elif n.prim.name == prim:
            out.append(n)
    return out


def count_nodes(exprs, op=None) -> int:
    """Number of distinct nodes (the DAG size); with ``op`` (a Primitive or name), only the
    nodes of that primitive."""
    nodes = toposort(exprs)
    if op is None:
        return len(nodes)
    name = op.name if isinstance(op, Primitive) else op
    return sum(1 for n in nodes if isinstance(n, Apply) and n.prim.name == name)


def tree_size(exprs) -> int:
    """Size of the expression *tree* (every shared node counted with multiplicity), computed
    on the DAG without expanding it -- the size a tree-based symbolic engine would build."""
    roots, _ = as_expr_list(exprs, "tree_size")
    size: dict[int, int] = {}
    for n in toposort(roots):
        size[id(n)] = 1 + sum(size[id(a)] for a in n.args)
    return sum(size[id(r)] for r in roots)


_INFIX = {R.add_p: " + ", R.mul_p: " * "}


def _const_str(c: Const) -> str:
    v = c.value
    s = repr(v.item() if hasattr(v, "item") else v)
    return s


def to_str(expr, limit: int = 1000) -> str:
    """A readable rendering of ``expr`` (sub-strings longer than ``limit`` are cut)."""
    memo: dict[int, str] = {}
    for n in toposort([as_expr(expr, "to_str")]):
        if isinstance(n, Const):
            s = _const_str(n)
        elif isinstance(n, Leaf):
            s = n.name
        else:
            parts = [memo[id(a)] for a in n.args]
            if n.prim in _INFIX:
                s = "(" + _INFIX[n.prim].join(parts) + ")"
            elif n.prim is R.pow_p:
                s = f"{parts[0]}**{parts[1]}"
            else:
                extra = [f"{k}={v!r}" for k, v in n.params.items()]
                s = f"{n.prim.name}({', '.join(parts + extra)})"
        if len(s) > limit:
            s = s[:limit] + "..."
        memo[id(n)] = s
    return memo[id(as_expr(expr))]



_expr._RENDER[0] = to_str

def substitute(exprs, mapping: dict):
    """Replace nodes by other expressions (``{old_node: new_expr}``) and rebuild (simplifying).

    Returns one Expr for one expression, else a list.
    """
    from .simplify import CORE_PRIMITIVES, build

    roots, single = as_expr_list(exprs, "substitute")
    repl = {}
    for k, v in mapping.items():
        if not isinstance(k, Expr):
            raise TypeError(f"substitute: keys must be expressions, got {type(k).__name__}")
        repl[id(k)] = as_expr(v, "substitute")
    new: dict[int, Expr] = {}
    for n in toposort(roots, stop=repl):
        if id(n) in repl:
            new[id(n)] = repl[id(n)]
        elif isinstance(n, Apply):
            args = tuple(new[id(a)] for a in n.args)
            if all(a is b for a, b in zip(args, n.args)):
                new[id(n)] = n
            else:
                od = None if n.prim in CORE_PRIMITIVES else n.dtype
                new[id(n)] = build(n.prim, args, n.params, od)
        else:
            new[id(n)] = n
    out = [new[id(r)] for r in roots]
    return out[0] if single else out
