"""Diagnostics (Enoki's ``cuda_whos`` and ``graphviz``): what the graph and the lazy scope hold.

:func:`whos` lists the live arrays that the graph keeps alive (recorded nodes, their arguments,
stored edge weights) and the pending arrays of the current lazy scope, with their sizes;
:func:`graphviz` writes the graph reachable from some outputs as DOT source.
"""

from __future__ import annotations

import numpy as np

from . import _lazy
from ._tracing import _TAPE, Array


class WhosReport(str):
    """The table printed by :func:`whos` (a ``str``), with its numbers as attributes:
    ``rows`` (dicts: name, kind, shape, dtype, state, bytes), ``evaluated_bytes``,
    ``pending_bytes``, ``n_nodes`` (recorded graph nodes listed) and ``n_ops`` (lane-wise operations
    recorded in the current lazy scope)."""

    rows: list
    evaluated_bytes: int
    pending_bytes: int
    n_nodes: int
    n_ops: int


def _state(a: Array) -> str:
    return "pending" if isinstance(a._value, _lazy.Pending) else "evaluated"


def _nbytes(a: Array) -> int:
    v = a._value
    if isinstance(v, _lazy.Pending):
        return v.size * v.dtype.itemsize
    # a broadcast view (stride 0) holds only its base's memory
    return int(v.nbytes) if all(s != 0 for s in v.strides) else int(v.itemsize)


def _kind(a: Array) -> str:
    if a._prim is not None:
        return "freed" if a._freed else a._prim.name
    if a._requires_grad:
        return "leaf"
    return "lazy" if isinstance(a._value, _lazy.Pending) else "const"


def _held_arrays(roots=None):
    """Live arrays held by the graph (all of it, or what ``roots`` reach) or the lazy scope,
    each once, in a stable order."""
    seen, out = set(), []

    def add(a, role=None):
        if isinstance(a, Array) and id(a) not in seen:
            seen.add(id(a))
            out.append((a, role))

    def held_by(node):
        if node._prim is None or node._freed:
            return
        for a in node._args or ():
            add(a)
        for w in (node._params or {}).get("weights", ()):
            for a in (w.arrays() if hasattr(w, "arrays") else (w,)):  # masked: mask, weight
                add(a, "weight")

    if roots is not None:
        for r in roots:
            add(r)
        i = 0
        while i < len(out):  # out grows while it is walked: a breadth-first traversal
            held_by(out[i][0])
            i += 1
        return out
    for node in _TAPE.live():
        if not node._freed:
            add(node)
            held_by(node)
    scope = getattr(_lazy._state, "scope", None)
    if scope is not None and not scope.closed:
        for r in scope.pending:
            a = r()
            if a is not None and isinstance(a._value, _lazy.Pending):
                add(a)
    return out


def whos(outputs=None, file=None) -> WhosReport:
    """Print and return a table of the live traced arrays: recorded graph nodes and the arrays
    they reference (leaves, constants, edge weights of simplified nodes), and the pending
    arrays of the current lazy scope; with totals of evaluated and pending bytes, the number of
    graph nodes listed and of operations recorded in the lazy scope. With ``outputs`` (an
    Array or a list) only the graph they reach is listed. ``file``: where to print (default
    stdout; ``False`` to print nothing)."""
    roots = None
    if outputs is not None:
        roots = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    rows = []
    held = _held_arrays(roots)
    for a, role in held:
        rows.append({
            "name": a.name or "",
            "kind": role or _kind(a),
            "shape": tuple(a._value.shape),
            "dtype": str(a._value.dtype),
            "state": _state(a),
            "bytes": _nbytes(a),
        })
    ev = sum(r["bytes"] for r in rows if r["state"] == "evaluated")
    pe = sum(r["bytes"] for r in rows if r["state"] == "pending")
    n_nodes = sum(1 for a, _ in held if a._prim is not None and not a._freed)
    scope = getattr(_lazy._state, "scope", None)
    n_ops = scope.n_ops if scope is not None and not scope.closed else 0
    head = f"{'#':>4}  {'name':<12} {'kind':<10} {'shape':<14} {'dtype':<8} {'state':<9} {'bytes':>10}"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows):
        lines.append(
            f"{i:>4}  {r['name'][:12]:<12} {r['kind'][:10]:<10} {str(r['shape'])[:14]:<14}"
            f" {r['dtype']:<8} {r['state']:<9} {r['bytes']:>10}"
        )
    lines += [
        "-" * len(head),
        f"evaluated: {ev} bytes, pending: {pe} bytes in {len(rows)} arrays;"
        f" {n_nodes} graph nodes, {n_ops} recorded lazy ops",
    ]
    rep = WhosReport("\n".join(lines))
    rep.rows, rep.evaluated_bytes, rep.pending_bytes = rows, ev, pe
    rep.n_nodes, rep.n_ops = n_nodes, n_ops
    if file is not False:
        print(rep, file=file)
    return rep


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graphviz(outputs, path=None) -> str:
    """DOT source of the graph reachable from ``outputs`` (an Array or a list): one node per
    array (its primitive or ``leaf``/``const``, its name, shape and dtype), edges from
    arguments to results. Pending (lazy, not yet computed) arrays are dashed and blue; an
    untracked pending array shows the lane-wise expression it will compute. Written to
    ``path`` when given (rendering needs the graphviz tools, creating the source does not)."""
    from . import sym

    roots = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for r in roots:
        if not isinstance(r, Array):
            raise TypeError(f"graphviz: expected Arrays, got {type(r).__name__}")
    ids: dict[int, str] = {}
    decl, edges = [], []

    def node_id(key) -> str:
        if key not in ids:
            ids[key] = f"n{len(ids)}"
        return ids[key]

    def expr_nodes(e) -> str:
        # the sym DAG of an untracked pending value: one graph node per expression node
        for n in sym.toposort([e]):
            if ("expr", id(n)) in ids:
                continue
            nid = ids[("expr", id(n))] = f"e{len(ids)}"
            if isinstance(n, sym.Const):
                label = f"const {n.value}"
            elif isinstance(n, sym.Leaf):
                label = f"buffer {n.name}"
            else:
                label = n.prim.name
                for c in n.args:
                    edges.append((ids[("expr", id(c))], nid))
            decl.append(f'  {nid} [label={_quote(label)}, shape=ellipse, style=dashed,'
                        ' color=blue];')
        return ids[("expr", id(e))]

    stack, seen = list(roots), set()
    while stack:
        a = stack.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        nid = node_id(id(a))
        v = a._value
        pending = isinstance(v, _lazy.Pending)
        title = _kind(a) + (f" '{a.name}'" if a.name else "")
        label = f"{title}\n{tuple(v.shape)} {v.dtype}" + ("\npending" if pending else "")
        style = ", style=dashed, color=blue" if pending else ""
        shape = "box" if a._prim is None else "ellipse"
        decl.append(f"  {nid} [label={_quote(label)}, shape={shape}{style}];")
        if a._prim is None and pending:
            edges.append((expr_nodes(v.expr), nid))
        for arg in a._args or ():
            if isinstance(arg, Array):
                edges.append((node_id(id(arg)), nid))
                stack.append(arg)
            elif isinstance(arg, np.ndarray | np.generic | bool | int | float):
                cid = node_id(("const", id(a), len(ids)))
                txt = str(arg) if np.ndim(arg) == 0 else str(np.shape(arg))
                decl.append(f"  {cid} [label={_quote('const ' + txt)}, shape=box];")
                edges.append((cid, nid))
    lines = ["digraph core_ad {", "  rankdir=TB;", *decl]
    lines += [f"  {s} -> {t};" for s, t in edges]
    lines.append("}")
    src = "\n".join(lines) + "\n"
    if path is not None:
        with open(path, "w") as fh:
            fh.write(src)
    return src
