"""Minimal pytrees: nested tuples, lists and dicts with array (or scalar) leaves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeDef:
    kind: str  # "leaf", "none", "tuple", "list", "dict"
    children: tuple = ()
    keys: tuple = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)


def flatten(tree):
    """``(leaves, treedef)``; dict keys are sorted so structures compare equal."""
    leaves: list = []

    def go(t):
        if t is None:
            return TreeDef("none")
        if isinstance(t, (tuple, list)):
            return TreeDef(type(t).__name__, tuple(go(c) for c in t))
        if isinstance(t, dict):
            keys = tuple(sorted(t))
            return TreeDef("dict", tuple(go(t[k]) for k in keys), keys)
        leaves.append(t)
        return TreeDef("leaf")

    td = go(tree)
    return leaves, td


def unflatten(td: TreeDef, leaves):
    it = iter(leaves)

    def go(d: TreeDef):
        if d.kind == "leaf":
            return next(it)
        if d.kind == "none":
            return None
        kids = [go(c) for c in d.children]
        if d.kind == "tuple":
            return tuple(kids)
        if d.kind == "list":
            return kids
        return dict(zip(d.keys, kids))

    return go(td)


def tree_map(fn, tree):
    leaves, td = flatten(tree)
    return unflatten(td, [fn(x) for x in leaves])
