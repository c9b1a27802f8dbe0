"""Lowering: bounds inference and loop nests.

1. ``root_regions`` -- numeric bounds at ``realize``: every realized Func gets the region its
   consumers need (and that its own updates write), outputs the requested region; every
   Buffer access is checked against the buffer (an error names the buffer, the dimension,
   and the required and available ranges).
2. ``lower_root`` -- the loop nest of each definition of a root Func, with the Funcs computed
   at its loop levels nested inside (their per-iteration regions are symbolic intervals of
   the loop variables, bound with ``LetStmt``), as a small statement IR:

   * ``For(name, leaf, extent, kind, factor, body)`` -- the loop variable ``leaf`` runs over
     ``[0, extent)``; loop variables are ``sym.leaf("hl.loop", ...)``;
   * ``LetStmt(leaf, value)`` -- binds a leaf for the statements after it in its Block;
   * ``Allocate(func, body)`` -- storage of a Func computed inside a loop;
   * ``Provide(func, args, values, predicate)`` -- one store per value.

Region and storage of a Func are leaves too: ``("hl.region", (fid, d, "min"|"extent"))`` is
the region computed, ``("hl.store", ...)`` the region allocated; calls index storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from core_ad import sym

from . import _expr as E
from ._bounds import const_value, interval, union
from ._func import FuncError
from ._schedule import ScheduleError

__all__ = [
    "Allocate",
    "Block",
    "BoundsError",
    "For",
    "LetStmt",
    "Provide",
    "bufdim_leaf",
    "lower_root",
    "provide_nodes",
    "region_leaf",
    "root_regions",
    "store_leaf",
]

I32 = np.int32


class BoundsError(FuncError):
    """A region cannot be inferred, or an access falls outside an input Buffer."""


def region_leaf(fid, d, what):
    return sym.leaf("hl.region", (fid, d, what), I32)


def store_leaf(fid, d, what):
    return sym.leaf("hl.store", (fid, d, what), I32)


def bufdim_leaf(fid, d, what):
    return sym.leaf("hl.bufdim", (fid, d, what), I32)


def loop_leaf(fid, stage, name):
    return sym.leaf("hl.loop", (fid, stage, name), I32)


@dataclass
class For:
    name: str
    leaf: object
    extent: object
    kind: str
    factor: int | None
    body: object
    # for the outer loop of a split: the extent of the dimension that was split; code
    # generation runs full inner tiles without per-tile extent checks up to extent // factor
    split_extent: object = None


@dataclass
class Block:
    stmts: list = field(default_factory=list)


@dataclass
class LetStmt:
    leaf: object
    value: object


@dataclass
class Allocate:
    func: object
    body: object


@dataclass
class Provide:
    func: object
    args: tuple
    values: tuple
    predicate: object


# --------------------------------------------------------------------------------------------
# numeric bounds at realize time


def _as_int(node, what):
    v = const_value(node)
    if v is None:
        raise BoundsError(f"{what}: not a constant after substituting sizes ({sym.to_str(node)})")
    return int(v)


def _point_env(values: dict):
    return {leaf: (sym.const(v, leaf.dtype), sym.const(v, leaf.dtype))
            for leaf, v in values.items()}


def _rdom_env(d, env, where):
    out = {}
    for leaf, lo, ext in d.rvars:
        ilo, iext = interval(lo, env), interval(ext, env)
        if ilo is None or iext is None:
            raise BoundsError(f"{where}: the RDom bounds are not computable")
        mn = _as_int(ilo[0], f"{where}: RDom min")
        ex = _as_int(iext[0], f"{where}: RDom extent")
        out[leaf] = (sym.const(mn, I32), sym.const(mn + ex - 1, I32))
    return out


def _def_env(graph, fid, d, region, values):
    """Interval env of one definition over the (numeric) region of its Func."""
    env = _point_env(values)
    f = graph.funcs[fid]
    for k, name in enumerate(f._pure_arg_names):
        lo, ext = region[k]
        env[sym.leaf("hl.var", name, I32)] = (sym.const(lo, I32), sym.const(lo + ext - 1, I32))
    env.update(_rdom_env(d, env, f"{f.name()}{d.source.stage_name()}"))
    return env


def _describe(obj):
    return f"{'Buffer' if not hasattr(obj, 'definitions') else 'Func'} {obj.name()}"


def _coord_intervals(args, env, memo, what):
    """Intervals of coordinate expressions; an unbounded one raises a BoundsError
    ``what(k, node)``."""
    out = []
    for k, a in enumerate(args):
        iv = interval(a, env, memo)
        if iv is None:
            raise BoundsError(what(k, a))
        out.append(iv)
    return out


def _call_intervals(graph, caller, d, env, req, memo):
    """Union the coordinate intervals of every call in ``d`` into ``req[callee fid]``."""
    for c in sym.calls(d.nodes(), E.CALL):
        g = c.params["fid"]
        callee = graph.buffers.get(g) or graph.funcs[g]
        ivs = _coord_intervals(c.args, env, memo, lambda k, a, callee=callee: (
            f"cannot bound coordinate {k} of {_describe(callee)} read by"
            f" {caller.name()}{d.source.stage_name()}: {sym.to_str(a, limit=120)} has no"
            " provable range (clamp it with hl.clamp, or read through a BoundaryConditions"
            " wrapper)"))
        prev = req.get(g)
        req[g] = ivs if prev is None else [union(p, q) for p, q in zip(prev, ivs)]


def _numeric(ivs, what):
    return [(_as_int(lo, what), _as_int(hi, what)) for lo, hi in ivs]


def _outside(need, have):
    """The first dimension ``(k, need_k, have_k)`` where the closed range ``need_k`` is not
    inside ``have_k``, or None."""
    for k, (a, b) in enumerate(zip(need, have)):
        if a[0] < b[0] or a[1] > b[1]:
            return k, a, b
    return None


def root_regions(graph, out_regions: dict, values: dict):
    """Numeric regions ``{fid: [(min, extent), ...]}`` of every realized Func, and the
    required ranges of every Buffer (checked against it)."""
    regions = dict(out_regions)
    req: dict = {}
    for fid in reversed(graph.order):
        f = graph.funcs[fid]
        if fid not in regions:
            if fid not in req:
                raise BoundsError(f"Func {f.name()} is not used by the pipeline")
            iv = _numeric(req[fid], f"region of {f.name()}")
            regions[fid] = [(lo, max(hi - lo + 1, 0)) for lo, hi in iv]
        # updates may write (scatter) and read the Func itself beyond what consumers need
        for d in graph.defs[fid][1:]:
            for _ in range(2):
                env = _def_env(graph, fid, d, regions[fid], values)
                memo: dict = {}
                lhs = _coord_intervals(d.args, env, memo, lambda k, a, f=f, d=d: (
                    f"cannot bound coordinate {k} written by {f.name()}"
                    f"{d.source.stage_name()}: {sym.to_str(a, limit=120)} (clamp it)"))
                own = {}
                _call_intervals(graph, f, d, env, own, memo)
                want = _numeric(lhs, f"writes of {f.name()}")
                if fid in own:
                    want = [(min(a[0], b[0]), max(a[1], b[1]))
                            for a, b in zip(want, _numeric(own[fid], f"{f.name()}"))]
                have = [(lo, lo + ext - 1) for lo, ext in regions[fid]]
                grown = [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(want, have)]
                if grown == have:
                    break
                bad = _outside(want, have)
                if fid in out_regions and bad:
                    k, a, b = bad
                    raise BoundsError(
                        f"{f.name()}{d.source.stage_name()} accesses {f.name()} at coordinate"
                        f" {k} in [{a[0]}, {a[1]}], outside the realized range [{b[0]}, {b[1]}]"
                    )
                regions[fid] = [(lo, hi - lo + 1) for lo, hi in grown]
        for d in graph.defs[fid]:
            env = _def_env(graph, fid, d, regions[fid], values)
            own: dict = {}
            _call_intervals(graph, f, d, env, own, {})
            for g, ivs in own.items():
                if g == fid:
                    continue
                if g in out_regions and g in graph.funcs:
                    need = _numeric(ivs, f"region of {graph.funcs[g].name()}")
                    bad = _outside(need, [(lo, lo + ext - 1) for lo, ext in out_regions[g]])
                    if bad:
                        k, a, b = bad
                        raise BoundsError(
                            f"pipeline output {graph.funcs[g].name()} is needed by {f.name()}"
                            f" over [{a[0]}, {a[1]}] in dimension {k}, beyond its realized"
                            f" range [{b[0]}, {b[1]}]"
                        )
                    continue
                prev = req.get(g)
                req[g] = ivs if prev is None else [union(p, q) for p, q in zip(prev, ivs)]
    for g, buf in graph.buffers.items():
        if g not in req:
            continue
        need = _numeric(req[g], f"reads of Buffer {buf.name()}")
        for k, (lo, hi) in enumerate(need):
            bmin, bext = buf.dim(k).min(), buf.dim(k).extent()
            if lo < bmin or hi > bmin + bext - 1:
                axis = "xyzw"[k] if k < 4 else str(k)
                raise BoundsError(
                    f"Input buffer {buf.name()} is accessed at {axis} (dimension {k}) in"
                    f" [{lo}, {hi}], but the buffer only has [{bmin}, {bmin + bext - 1}] (min"
                    f" {bmin}, extent {bext}); use a BoundaryConditions wrapper, clamp the"
                    " coordinates, or realize a smaller output"
                )
    return regions


# --------------------------------------------------------------------------------------------
# loop nests


class _Loops:
    """The loops of one definition after splits and fuses: per dimension (innermost first)
    its leaf and extent; per original variable its value in loop leaves."""

    def __init__(self, graph, fid, d):
        f = graph.funcs[fid]
        s = d.schedule
        self.fid, self.stage = fid, d.index
        where = f"{f.name()}{d.source.stage_name()}"
        extents, values = {}, {}
        for k, name in enumerate(f._pure_arg_names):
            if name not in [dm.name for dm in _original_dims(d)]:
                continue
            leaf = loop_leaf(fid, d.index, name)
            extents[name] = region_leaf(fid, k, "extent")
            values[name] = (sym.leaf("hl.var", name, I32), region_leaf(fid, k, "min") + leaf)
        for leaf, lo, ext in d.rvars:
            name = _rvar_name(d, leaf)
            extents[name] = ext
            values[name] = (leaf, lo + loop_leaf(fid, d.index, name))
        split_of = {}  # outer loop name -> extent of the dimension it was split from
        for sp in s.splits:
            if sp.kind == "split":
                old = loop_leaf(fid, d.index, sp.old)
                li = loop_leaf(fid, d.index, sp.inner)
                # the outer loop may reuse the old name: go through a fresh leaf
                tmp = loop_leaf(fid, d.index, sp.outer + "#split")
                e = extents.pop(sp.old)
                split_of.pop(sp.old, None)
                f_ = sym.const(sp.factor, I32)
                self._substitute(extents, values, {old: tmp * f_ + li}, split_of)
                extents[sp.outer] = sym.floor_divide(e + (sp.factor - 1), f_)
                extents[sp.inner] = sym.minimum(f_, e - tmp * f_)
                split_of[sp.outer] = e
                self._substitute(extents, values, {tmp: loop_leaf(fid, d.index, sp.outer)},
                                 split_of)
                continue
            else:  # fuse
                inner, outer = loop_leaf(fid, d.index, sp.inner), loop_leaf(fid, d.index,
                                                                          sp.outer)
                fl = loop_leaf(fid, d.index, sp.old)
                ei, eo = extents.pop(sp.inner), extents.pop(sp.outer)
                extents[sp.old] = ei * eo
                subs_f = {inner: sym.mod(fl, ei), outer: sym.floor_divide(fl, ei)}
                split_of.pop(sp.inner, None)
                split_of.pop(sp.outer, None)
                self._substitute(extents, values, subs_f, split_of)
        self.extents = extents
        self.values = values  # name -> (original leaf, value)
        self.factors = {sp.inner: sp.factor for sp in s.splits if sp.kind == "split"}
        self.split_of = split_of
        self.dims = list(s.dims)
        self.where = where
        names = [dm.name for dm in self.dims]
        # an extent may only use loop variables of loops outside it
        for k, dm in enumerate(self.dims):
            inner_leaves = {loop_leaf(fid, d.index, n) for n in names[:k + 1]}
            for leaf in sym.free_leaves(self.extents[dm.name], "hl.loop"):
                if leaf in inner_leaves:
                    raise ScheduleError(
                        f"{where}: the loop {dm.name!r} is outside a loop its extent depends on"
                        " (reorder puts a split's inner loop outside its outer loop)"
                    )

    @staticmethod
    def _substitute(extents, values, mapping, split_of):
        for d in (extents, split_of):
            for n, e in list(d.items()):
                d[n] = sym.substitute(e, mapping)
        for n, (orig, v) in list(values.items()):
            values[n] = (orig, sym.substitute(v, mapping))

    def leaf(self, name):
        return loop_leaf(self.fid, self.stage, name)

    def var_map(self):
        return {orig: v for orig, v in self.values.values()}


def _original_dims(d):
    return d.source._initial_dims()


def _rvar_name(d, leaf):
    for lf, rv in d.source.rvars():
        if lf is leaf:
            return rv.name()
    raise AssertionError(leaf)


def _subst(node, mapping):
    return node if node is None else sym.substitute(node, mapping)


def lower_root(graph, fid):
    """One statement per definition of the root Func ``fid`` (its outermost loop first)."""
    return [_lower_def(graph, fid, d) for d in graph.defs[fid]]


def lower_func(graph, fid):
    return Block([_lower_def(graph, fid, d) for d in graph.defs[fid]])


def _lower_def(graph, fid, d):
    loops = _Loops(graph, fid, d)
    vm = loops.var_map()
    args = tuple(_subst(a, vm) for a in d.args)
    values = tuple(_subst(v, vm) for v in d.values)
    pred = _subst(d.predicate, vm)
    body = Provide(graph.funcs[fid], args, values, pred)
    # producers computed / stored at this definition's loops
    at = {}
    for p in graph.order:
        lvl, st = graph.levels[p], graph.stores[p]
        if lvl.kind == "at" and lvl.func.fid == fid and d.index in graph.host_defs(p):
            at.setdefault(lvl.var, []).append(("compute", p))
            if st.kind == "at" and st.var != lvl.var:
                at.setdefault(st.var, []).append(("store", p))
    for k, dm in enumerate(loops.dims):  # innermost first
        for what, p in at.get(dm.name, []):
            if what == "store":
                lets = _region_lets(graph, p, "store", loops, k, body)
                body = Block(lets + [Allocate(graph.funcs[p], body)])
                continue
            lets = _region_lets(graph, p, "region", loops, k, body)
            produce = lower_func(graph, p)
            if graph.stores[p] == graph.levels[p]:
                lets += [LetStmt(store_leaf(p, j, w), region_leaf(p, j, w))
                         for j in range(len(lets) // 2) for w in ("min", "extent")]
                body = Block(lets + [Allocate(graph.funcs[p], Block([produce, body]))])
            else:
                body = Block(lets + [produce, body])
        factor = dm.factor if dm.factor is not None else (
            loops.factors.get(dm.name) if dm.kind == "gpu_thread" else None)
        body = For(dm.name, loops.leaf(dm.name), loops.extents[dm.name], dm.kind, factor, body,
                   loops.split_of.get(dm.name))
    return body


def _region_lets(graph, p, kind, loops, k, consumer_body):
    """Let statements binding the ``kind`` ("region" or "store") leaves of producer ``p`` to
    the interval its consumer reads in one iteration of loop ``k`` (loops inside ``k`` range
    over their extents, loops outside are fixed)."""
    f = graph.funcs[p]
    env = {}
    for dm in reversed(loops.dims[:k]):  # loops inside this one, outermost first
        iv = interval(loops.extents[dm.name], env)
        if iv is None:
            raise BoundsError(f"{loops.where}: cannot bound the extent of loop {dm.name}")
        env[loops.leaf(dm.name)] = (sym.const(0, I32), iv[1] - 1)
    req = None
    memo: dict = {}
    for c in sym.calls(provide_nodes(consumer_body), E.CALL):
        if c.params["fid"] != p:
            continue
        ivs = _coord_intervals(c.args, env, memo, lambda j, a: (
            f"cannot bound coordinate {j} of Func {f.name()} read by {loops.where}:"
            f" {sym.to_str(a, limit=120)} (clamp it)"))
        req = ivs if req is None else [union(x, y) for x, y in zip(req, ivs)]
    if req is None:
        raise BoundsError(f"{f.name()} is computed at {loops.where} but not read there")
    out = []
    for j, (lo, hi) in enumerate(req):
        out += [LetStmt(sym.leaf(f"hl.{kind}", (p, j, "min"), I32), lo),
                LetStmt(sym.leaf(f"hl.{kind}", (p, j, "extent"), I32),
                        sym.maximum(hi - lo + 1, sym.const(0, I32)))]
    return out


def provide_nodes(stmt):
    """Every expression node in ``stmt`` (the consumer's body, producers nested in it)."""
    out = []
    stack = [stmt]
    while stack:
        s = stack.pop()
        if isinstance(s, Provide):
            out += list(s.args) + list(s.values) + ([s.predicate] if s.predicate is not None
                                                    else [])
        elif isinstance(s, Block):
            stack += s.stmts
        elif isinstance(s, For):
            out.append(s.extent)
            stack.append(s.body)
        elif isinstance(s, Allocate):
            stack.append(s.body)
        elif isinstance(s, LetStmt):
            out.append(s.value)
    return out
