"""Opt's positional binding (spec [D] 5, Fig. 33): ``compile_problem(positional=[...])``.

Declarations that give a binding index (``Unknown("r", (W, H), 3, index=5)``, ``Param("w",
index=0)``) take the value at that position of the ``positional`` sequence, as Opt's
``problemParams`` array does. An Array with the index of an Unknown is bound to the same buffer
in Opt: here it becomes that unknown's constant view (``r.const()``), refreshed at every
non-linear iteration and never differentiated. The result is ordinary by-name binding: a new
Energy (aliased reads substituted) and the ``arrays`` / ``params`` dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from core_ad import sym

from .._language import VIEW_SUFFIX, Energy, Exclude, ParamRef, Read, decode_leaf
from . import LsqCompileError


class PositionalBindingError(LsqCompileError):
    """A ``positional`` sequence that does not match the declarations' binding indices."""


def _declarations(energy: Energy) -> dict:
    """index -> {name: (role, dims, channels)} over every indexed declaration the energy reads."""
    exprs = [c for chans in energy.terms for c in chans] + [e.cond for e in energy.excludes]
    found: dict = {}
    where: dict = {}
    for lf in sym.free_leaves(exprs):
        d = decode_leaf(lf)
        if isinstance(d, Read) and d.role in ("unknown", "array") and d.index is not None:
            sig = (d.role, d.dims, d.channels)
        elif isinstance(d, ParamRef) and d.index is not None:
            sig = ("param", (), 1)
        else:
            continue
        prev = where.setdefault(d.name, d.index)
        if prev != d.index:
            raise PositionalBindingError(
                f"{d.name!r} is declared with two binding indices, {prev} and {d.index}")
        found.setdefault(d.index, {})[d.name] = sig
    return found


def _views(decls: dict) -> dict:
    """Array name -> unknown name for the Arrays that share an Unknown's index."""
    views = {}
    for index, entries in sorted(decls.items()):
        unknowns = [n for n, (role, *_) in entries.items() if role == "unknown"]
        others = {n: sig for n, sig in entries.items() if sig[0] != "unknown"}
        if len(unknowns) > 1:
            raise PositionalBindingError(
                f"binding index {index} is declared by two unknowns: {sorted(unknowns)}")
        if not unknowns:
            if len({sig[0] for sig in entries.values()}) > 1:
                raise PositionalBindingError(
                    f"binding index {index} is declared by a Param and an array: {sorted(entries)}")
            continue
        (u,) = unknowns
        for name, sig in others.items():
            if sig[0] != "array" or sig[1:] != entries[u][1:]:
                raise PositionalBindingError(
                    f"binding index {index}: {name!r} {sig} shares unknown {u!r}'s index but not "
                    f"its signature {entries[u]}; only an Array of the same dims and channels "
                    "can alias an unknown (its constant view)")
            views[name] = u
    return views


def _as_view_reads(energy: Energy, views: dict) -> Energy:
    """``energy`` with every read of an aliasing Array replaced by the unknown's constant view."""
    if not views:
        return energy
    exprs = [c for chans in energy.terms for c in chans] + [e.cond for e in energy.excludes]
    mapping = {}
    for lf in sym.free_leaves(exprs):
        d = decode_leaf(lf)
        if isinstance(d, Read) and d.name in views:
            # the view's decl: role "view", no index (ConstView's leaves)
            key = lf.key[:-1] + (("view", d.dims, d.channels),)
            mapping[lf] = sym.leaf(views[d.name] + VIEW_SUFFIX, key, lf.dtype)
    out = Energy()
    out.terms = [[sym.substitute(c, mapping) for c in chans] for chans in energy.terms]
    for ex in energy.excludes:
        new = Exclude.__new__(Exclude)
        new.cond = sym.substitute(ex.cond, mapping)
        out.excludes.append(new)
    return out


def bind_positional(energy: Energy, values: Sequence, arrays: dict, params: dict):
    """``(energy, arrays, params)`` with the positional values bound by name."""
    if isinstance(values, dict | str) or not isinstance(values, Sequence):
        raise TypeError("compile_problem: positional must be a list or tuple indexed by the "
                        f"declarations' binding indices, got {type(values).__name__}")
    decls = _declarations(energy)
    if not decls:
        raise PositionalBindingError(
            "compile_problem(positional=...): no declaration the energy reads has a binding "
            "index (Unknown(..., index=i), Array(..., index=i), Param(..., index=i))")
    views = _views(decls)
    arrays, params = dict(arrays), dict(params)
    for index, entries in sorted(decls.items()):
        if index >= len(values) or values[index] is None:
            raise PositionalBindingError(
                f"positional: nothing at binding index {index}, declared by {sorted(entries)} "
                f"({len(values)} values given)")
        for name, (role, *_) in entries.items():
            if name in views:
                continue
            target = params if role == "param" else arrays
            if name in target:
                raise PositionalBindingError(
                    f"{name!r} is bound twice: by name and by binding index {index}")
            target[name] = values[index]
    stray = [i for i, v in enumerate(values) if v is not None and i not in decls]
    if stray:
        raise PositionalBindingError(
            f"positional: values at indices {stray} bind nothing; the energy declares binding "
            f"indices {sorted(decls)} (pass None for unused positions)")
    return _as_view_reads(energy, views), arrays, params
