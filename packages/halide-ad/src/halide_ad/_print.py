"""``print_loop_nest``: the lowered loops of a pipeline as indented text, so a user can see
what a schedule did (loop kinds, extents, where each Func is computed and stored)."""

from __future__ import annotations

from core_ad import sym

from ._lower import Allocate, Block, For, IfThen, LetStmt, Provide

__all__ = ["loop_nest_text"]

_KIND = {"serial": "for", "parallel": "parallel", "vectorized": "vectorized",
         "unrolled": "unrolled", "gpu_block": "gpu_block", "gpu_thread": "gpu_thread"}


def _expr(n):
    return sym.to_str(n, limit=80)


def loop_nest_text(graph, roots, kernels) -> str:
    lines = []
    for fid in roots:
        f = graph.funcs[fid]
        lines.append(f"produce {f.name()}:")
        for kfid, k, stmt in kernels:
            if kfid == fid:
                _stmt(stmt, 1, lines)
    return "\n".join(lines)


def _stmt(s, depth, lines):
    pad = "  " * depth
    if isinstance(s, Block):
        for t in s.stmts:
            _stmt(t, depth, lines)
    elif isinstance(s, For):
        w = f" (width {s.factor})" if s.kind in ("vectorized", "unrolled") and s.factor else ""
        lines.append(f"{pad}{_KIND[s.kind]} {s.name} in [0, {_expr(s.extent)}){w}:")
        _stmt(s.body, depth + 1, lines)
    elif isinstance(s, Allocate):
        lines.append(f"{pad}allocate {s.func.name()}:")
        _stmt(s.body, depth + 1, lines)
    elif isinstance(s, IfThen):
        lines.append(f"{pad}if {_expr(s.cond)}:")
        _stmt(s.body, depth + 1, lines)
        if s.otherwise is not None:
            lines.append(f"{pad}else:")
            _stmt(s.otherwise, depth + 1, lines)
    elif isinstance(s, LetStmt):
        kind, (fid, d, w) = s.leaf.kind, s.leaf.key
        if kind == "hl.region" and d == 0 and w == "min":
            lines.append(f"{pad}produce {fid.split('$')[0]} (bounds from its consumer):")
        if s.sliding is not None:
            lines.append(f"{pad}  (sliding window over {s.sliding}: dimension {d} computes"
                         " only what the previous iteration did not)")
    elif isinstance(s, Provide):
        args = ", ".join(_expr(a) for a in s.args)
        pred = f" if {_expr(s.predicate)}" if s.predicate is not None else ""
        lines.append(f"{pad}{s.func.name()}({args}) = ...{pred}")
