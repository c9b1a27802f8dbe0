"""Straight-line programs: ``cse`` turns expressions into a :class:`Program`, the IR every
backend of :mod:`core_ad._codegen` consumes, and the input checks those backends share."""

from __future__ import annotations

import keyword
import re
from typing import NamedTuple

from .. import _rules as R
from .buffers import check_scatter_outputs
from .expr import Apply, Const, Expr, Leaf
from .graph import as_expr_list, toposort

__all__ = ["Program", "check_inputs", "check_program", "cse"]


class Program(NamedTuple):
    """A straight-line program: ``assignments`` is a list of ``(name, node)`` in topological
    order (leaves, constants and operations; each distinct node once -- hash-consing makes
    the DAG the CSE'd program), ``outputs`` the names of the outputs, in order."""

    assignments: list
    outputs: list

    def names(self) -> dict:
        """``{node: name}``."""
        return {n: name for name, n in self.assignments}

    def __str__(self) -> str:
        names = self.names()
        lines = []
        for name, n in self.assignments:
            if isinstance(n, Apply):
                args = ", ".join(names[a] for a in n.args)
                extra = "".join(f", {k}={v!r}" for k, v in n.params.items())
                lines.append(f"{name} = {n.prim.name}({args}{extra})")
            elif isinstance(n, Const):
                lines.append(f"{name} = {n.value!r}")
            else:
                lines.append(f"{name} = input {n.name}")
        lines.append("return " + ", ".join(self.outputs))
        return "\n".join(lines)


_IDENT = re.compile(r"[^0-9a-zA-Z_]")


def _leaf_name(leaf: Leaf, used: set) -> str:
    base = _IDENT.sub("_", leaf.name).strip("_") or "leaf"
    if base[0].isdigit() or keyword.iskeyword(base) or re.fullmatch(r"[tc]\d+", base):
        base = "in_" + base
    name, i = base, 1
    while name in used:
        name = f"{base}_{i}"
        i += 1
    used.add(name)
    return name


def cse(outputs) -> Program:
    """The straight-line program computing ``outputs`` (an Expr or a list of Exprs)."""
    roots, _ = as_expr_list(outputs, "cse")
    used: set = set()
    names: dict[int, str] = {}
    assigns = []
    nt = nc = 0
    for n in toposort(roots):
        if isinstance(n, Leaf):
            name = _leaf_name(n, used)
        elif isinstance(n, Const):
            name = f"c{nc}"
            nc += 1
        else:
            name = f"t{nt}"
            nt += 1
        names[id(n)] = name
        assigns.append((name, n))
    return Program(assigns, [names[id(r)] for r in roots])


def _describe(x) -> str:
    if isinstance(x, Expr):
        return f"a {type(x).__name__} node {x!r}"
    return f"an object of type {type(x).__name__}"


_NARY = (R.add_p, R.mul_p)


def _nary_key(n, skip=None):
    ids = sorted(map(id, n.args))
    if skip is not None:
        ids.remove(skip)
    return (n.prim, n.dtype, tuple(ids))


def _schedule(nodes):
    """Evaluation order, and for n-ary sums/products the reuse of a shorter one.

    Flattening turns the adjoint chain of reverse mode, a_k = a_{k+1} * cos(e_k), into n-ary
    products that share all but one factor. Where the program also contains the product of
    all factors but one, the node is evaluated as (that product) op (the remaining factor): one
    operation per node instead of one per factor. The shorter product becomes an extra
    dependency of the longer one (no cycle: its operands are a subset of the longer one's).
    """
    table = {}
    for n in nodes:
        if isinstance(n, Apply) and n.prim in _NARY and not n.params:
            table.setdefault(_nary_key(n), n)
    via = {}
    for n in nodes:
        if isinstance(n, Apply) and n.prim in _NARY and not n.params and len(n.args) >= 3:
            for i, a in enumerate(n.args):
                prev = table.get(_nary_key(n, id(a)))
                if prev is not None and prev is not n:
                    via[id(n)] = (prev, i)
                    break
    if not via:
        return list(nodes), via
    order, done = [], set()
    for r in nodes:  # nodes are children-first; add the extra dependencies, iteratively
        if id(r) in done:
            continue
        stack = [r]
        while stack:
            n = stack[-1]
            if id(n) in done:
                stack.pop()
                continue
            deps = list(n.args)
            if id(n) in via:
                deps.append(via[id(n)][0])
            pending = [d for d in deps if id(d) not in done]
            if pending:
                stack.extend(pending)
            else:
                stack.pop()
                done.add(id(n))
                order.append(n)
    return order, via


def check_inputs(outputs, inputs, where: str):
    """``(roots, single, inputs)``: the outputs as a list (and whether one Expr was given) and
    the inputs as a list of distinct vars / leaves, or a TypeError / ValueError naming the
    problem. Every backend (and the interop bridges) validates this way."""
    roots, single = as_expr_list(outputs, where)
    if isinstance(inputs, Expr):
        inputs = [inputs]
    if not isinstance(inputs, list | tuple):
        raise TypeError(f"{where}: inputs must be a list of vars/leaves, got"
                        f" {type(inputs).__name__}")
    inputs = list(inputs)
    for i, v in enumerate(inputs):
        if not isinstance(v, Leaf):
            raise TypeError(f"{where}: input {i} must be a var or leaf, got {_describe(v)}")
    if len({id(v) for v in inputs}) != len(inputs):
        dup = next(v for i, v in enumerate(inputs) if any(v is w for w in inputs[:i]))
        raise ValueError(f"{where}: input {dup.name!r} is listed twice")
    return roots, single, inputs


def check_program(prog: Program, roots, inputs, where: str) -> None:
    """Scatter outputs only as outputs, and every leaf the outputs use among the inputs."""
    check_scatter_outputs(prog, roots)
    in_ids = {id(v) for v in inputs}
    missing = [n.name for _, n in prog.assignments if isinstance(n, Leaf) and id(n) not in in_ids]
    if missing:
        raise ValueError(
            f"{where}: the outputs depend on leaves that are not among the inputs: "
            + ", ".join(missing)
        )
