"""Lowering: bounds inference and loop nests.

1. ``root_regions`` -- numeric bounds at ``realize``: every realized Func gets the region its
   consumers need (and that its own updates write), outputs the requested region; every
   Buffer access is checked against the buffer (an error names the buffer, the dimension,
   and the required and available ranges).
2. ``lower_pipeline`` -- the loop nest of each definition of a root Func, with the Funcs computed
   at its loop levels nested inside (their per-iteration regions are symbolic intervals of
   the loop variables, bound with ``LetStmt``), as a small statement IR:

   * ``For(name, leaf, extent, kind, factor, body)`` -- the loop variable ``leaf`` runs over
     ``[0, extent)``; loop variables are ``sym.leaf("hl.loop", ...)``;
   * ``LetStmt(leaf, value)`` -- binds a leaf for the statements after it in its Block;
   * ``Allocate(func, body)`` -- storage of a Func computed inside a loop;
   * ``Provide(func, args, values, predicate)`` -- one store per value;
   * ``IfThen(cond, body, otherwise)`` -- the guards of loops fused over different extents.

   Stages scheduled with ``compute_with`` share their parent's outer loops: the merged nest
   runs at the parent's position, each shared iteration running the bodies in order
   (``fuse_stages`` states the rules).

Region and storage of a Func are leaves too: ``("hl.region", (fid, d, "min"|"extent"))`` is
the region computed, ``("hl.store", ...)`` the region allocated; calls index storage.
"""

from __future__ import annotations

import collections
import functools
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
    "IfThen",
    "LetStmt",
    "Provide",
    "additive_update",
    "addend",
    "atomic_addend",
    "bufdim_leaf",
    "fuse_stages",
    "lower_pipeline",
    "provide_nodes",
    "region_leaf",
    "root_regions",
    "stmt_accesses",
    "store_leaf",
]

I32 = np.int32


class BoundsError(FuncError):
    """A region cannot be inferred, or an access falls outside an input Buffer."""


def addend(value, fid, k, args):
    """``v`` when ``value`` is ``f(args) + v`` (core_ad's sums are n-ary, differences add a
    negation) for the ``k``-th value of Func ``fid`` at exactly ``args``, ``v`` not reading
    ``f``; else None."""
    if getattr(value, "prim", None) is None or value.prim.name != "add":
        return None
    for j, own in enumerate(value.args):
        if (getattr(own, "prim", None) is E.CALL and own.params["fid"] == fid
                and own.params["index"] == k and len(own.args) == len(args)
                and all(_const_value(b - a) == 0 for a, b in zip(args, own.args))):
            rest = [a for i, a in enumerate(value.args) if i != j]
            v = rest[0]
            for a in rest[1:]:
                v = v + a
            if any(c.params["fid"] == fid for c in sym.calls(v, E.CALL)):
                return None
            return v
    return None


def atomic_addend(s, k, where, loops, otherwise):
    """The addend of ``Provide`` ``s``'s ``k``-th value when its stores run concurrently under
    the reduction loops ``loops`` (For statements) as atomic additions. A ``ScheduleError``
    naming the Func and ``where`` (``otherwise``: what to do instead) when the stage is not
    marked ``atomic()`` or the update does not add."""
    name = s.func.name()
    described = (f"the {loops[0].kind.replace('_', ' ')} loop{'s' if len(loops) > 1 else ''}"
                 " over " + ", ".join(repr(loop.name) for loop in loops))
    if not all(loop.atomic for loop in loops):
        raise ScheduleError(
            f"{where}: iterations of {described} may write one point of {name} at the same"
            f" time: call atomic() on the stage first, if it adds to {name} ({otherwise})"
        )
    v = addend(s.values[k], s.func.fid, k, s.args)
    if v is None:
        raise ScheduleError(
            f"{where}: iterations of {described} may write one point of {name} at the same"
            f" time; only an update adding to {name} where it writes ({name}(e) = {name}(e) +"
            f" v) can run them concurrently, with atomic additions ({otherwise})"
        )
    return v


def additive_update(f, k) -> bool:
    """Whether update ``k`` of ``f`` adds to ``f`` where it writes (``f(e) = f(e) + v``, every
    value), so its iterations may run concurrently with atomic stores."""
    d = f._updates[k]
    return all(addend(v, f.fid, j, d.args) is not None for j, v in enumerate(d.values))


def _const_value(n):
    return n.value if getattr(n, "op", None) == "const" else None


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
    # False for a loop over a reduction dimension (an RVar or a part of one) not proven to
    # write distinct points: running its iterations concurrently needs atomics
    pure: bool = True
    atomic: bool = False  # its stage allows that (``atomic()``)


@dataclass
class Block:
    stmts: list = field(default_factory=list)


@dataclass
class LetStmt:
    leaf: object
    value: object
    # a region's min that skips what the previous iteration of this loop computed (sliding
    # window): the loop's name, for print_loop_nest
    sliding: str | None = None


@dataclass
class Allocate:
    func: object
    body: object


@dataclass
class IfThen:
    cond: object
    body: object
    otherwise: object = None


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


def lower_pipeline(graph, roots):
    """``(fid, definition index, statement)`` of every definition of the root Funcs, in
    order; the stages scheduled with ``compute_with`` are merged into their parent's loop
    nest (``fuse_stages``), which runs at the position of the group's last stage."""
    order = [(fid, d.index) for fid in roots for d in graph.defs[fid]]
    stmts = {key: _lower_def(graph, key[0], graph.defs[key[0]][key[1]]) for key in order}
    fused = fuse_stages(graph, order, stmts)
    return [(fid, k, fused.get((fid, k), stmts[(fid, k)])) for fid, k in order
            if (fid, k) not in fused or fused[(fid, k)] is not None]


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
            st = graph.stores[p]
            if what == "store":
                lets = _region_lets(graph, p, "store", loops, k, body)
                body = Block(lets + [Allocate(graph.funcs[p], body)])
                continue
            outer = {o.name for o in loops.dims[k + 1:]}
            slides = dm.kind == "serial" and (st.kind == "root" or (
                st.kind == "at" and st.var in outer))
            lets = _region_lets(graph, p, "region", loops, k, body,
                                slide=dm if slides else None)
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
                   loops.split_of.get(dm.name), dm.pure or dm.race_free, d.schedule.atomic)
    if d.schedule.gpu_single_thread:
        if any(dm.kind.startswith("gpu") for dm in loops.dims):
            raise ScheduleError(f"{loops.where}: gpu_single_thread with GPU loops")
        body = For("gpu_single", loop_leaf(fid, d.index, "gpu_single"), sym.const(1, I32),
                   "gpu_block", None, body)
    return body


def _region_lets(graph, p, kind, loops, k, consumer_body, slide=None):
    """Let statements binding the ``kind`` ("region" or "store") leaves of producer ``p`` to
    the interval its consumer reads in one iteration of loop ``k`` (loops inside ``k`` range
    over their extents, loops outside are fixed). ``slide``: loop ``k`` itself, when ``p`` is
    stored outside it and it runs in order: then the region may be a sliding window."""
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
    window = _sliding_dimension(graph, p, req, loops.leaf(slide.name)) if slide else None
    out = []
    for j, (lo, hi) in enumerate(req):
        note = None
        if j == window:
            # Halide's sliding window: the storage still holds what iterations since the
            # allocation computed, up to the previous iteration's max; compute the rest
            v = loops.leaf(slide.name)
            previous_hi = sym.substitute(hi, {v: v - 1})
            lo = sym.where(v > 0, sym.maximum(lo, previous_hi + 1), lo)
            note = slide.name
        out += [LetStmt(sym.leaf(f"hl.{kind}", (p, j, "min"), I32), lo, note),
                LetStmt(sym.leaf(f"hl.{kind}", (p, j, "extent"), I32),
                        sym.maximum(hi - lo + 1, sym.const(0, I32)))]
    return out


def _step(e, v):
    """``(least, most)``: the constants between which ``e`` grows when loop leaf ``v`` grows
    by one, or None. A min or max grows between the least and the most step of its terms
    (the interval of a stencil's reads), a sum by the sum of theirs (a strip clipped at the
    end of the image)."""
    d = const_value(sym.substitute(e, {v: v + 1}) - e)
    if d is not None:
        return d, d
    name = getattr(getattr(e, "prim", None), "name", None)
    if name not in ("minimum", "maximum", "add"):
        return None
    steps = [_step(a, v) for a in e.args]
    if any(st is None for st in steps):
        return None
    if name == "add":
        return sum(st[0] for st in steps), sum(st[1] for st in steps)
    return min(st[0] for st in steps), max(st[1] for st in steps)


def _sliding_dimension(graph, p, req, v):
    """The one dimension of region ``req`` that moves with loop leaf ``v``, both ends never
    backwards (the max forwards), so an iteration re-reads what earlier ones computed; None when there is no such dimension, when another one moves
    too, or when an update of ``p`` writes that dimension at other than its pure Var (it
    would add to the points kept from the previous iteration a second time)."""
    moving = [j for j, (lo, hi) in enumerate(req)
              if v in sym.free_leaves([lo, hi])]
    if len(moving) != 1:
        return None
    j = moving[0]

    lo, hi = req[j]
    dlo, dhi = _step(lo, v), _step(hi, v)
    if dlo is None or dhi is None or dlo[0] < 0 or dhi[0] < 0 or dhi[1] <= 0:
        return None
    name = graph.funcs[p]._pure_arg_names[j]
    for d in graph.defs[p]:
        a = d.args[j]
        if getattr(a, "kind", None) != "hl.var" or a.key != name:
            return None
    return j


def walk(stmt):
    """Every statement of ``stmt``, nested ones included (parents before their bodies)."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, Block):
            stack += s.stmts
        elif isinstance(s, (For, Allocate)):
            stack.append(s.body)
        elif isinstance(s, IfThen):
            stack += [s.body] + ([s.otherwise] if s.otherwise is not None else [])


def provide_nodes(stmt):
    """Every expression node in ``stmt`` (the consumer's body, producers nested in it)."""
    out = []
    for s in walk(stmt):
        if isinstance(s, Provide):
            out += list(s.args) + list(s.values) + ([s.predicate] if s.predicate is not None
                                                    else [])
        elif isinstance(s, For):
            out.append(s.extent)
        elif isinstance(s, LetStmt):
            out.append(s.value)
        elif isinstance(s, IfThen):
            out.append(s.cond)
    return out


# --------------------------------------------------------------------------------------------
# compute_with: fused loop nests


def _where(graph, key):
    return f"{graph.funcs[key[0]].name()}{graph.defs[key[0]][key[1]].source.stage_name()}"


def stmt_accesses(stmt):
    """(Funcs and Buffers read, Funcs written) by ``stmt``, less the Funcs it allocates."""
    reads = {c.params["fid"] for c in sym.calls(provide_nodes(stmt), E.CALL)}
    stmts = list(walk(stmt))
    writes = {s.func.fid for s in stmts if isinstance(s, Provide)}
    local = {s.func.fid for s in stmts if isinstance(s, Allocate)}
    return reads - local, writes - local


def _additive_rest(ld):
    """For an update ``f(a) = f(a) + e`` (or ``- e``) of one value: the nodes of the update
    other than that read of ``f(a)`` (``e``, ``a``, the predicate); else None."""
    if not ld.index or len(ld.values) != 1:
        return None
    v = ld.values[0]
    name = getattr(getattr(v, "prim", None), "name", None)
    if name not in ("add", "sub"):
        return None
    own = [k for k, a in enumerate(v.args)
           if E.is_call(a) and a.params["fid"] == ld.func.fid and a.params["index"] == 0
           and len(a.args) == len(ld.args) and all(x is y for x, y in zip(a.args, ld.args))]
    if not own or (name == "sub" and own[0] != 0):
        return None
    rest = [a for k, a in enumerate(v.args) if k != own[0]] + list(ld.args)
    if ld.predicate is not None:
        rest.append(ld.predicate)
    return rest + [e for _, lo, ext in ld.rvars for e in (lo, ext)]


def _commuting(graph, a, b, fid):
    """Both definitions add into ``fid`` and read it only through their own accumulation:
    running them interleaved changes only the order of the additions (rounding)."""
    for key in (a, b):
        ld = graph.defs[key[0]][key[1]]
        rest = None if key[0] != fid else _additive_rest(ld)
        if rest is None or any(c.params["fid"] == fid for c in sym.calls(rest, E.CALL)):
            return False
    return True


def _check_independent(graph, child, other, acc, moved):
    """``child`` may run interleaved with (``moved`` False: before the later iterations of)
    or after (``moved`` True) ``other``: neither writes what the other reads or writes,
    except accumulations into one Func (``_commuting``)."""
    (r1, w1), (r2, w2) = acc[child], acc[other]
    for fid in (w1 & (r2 | w2)) | (w2 & r1):
        if not moved and _commuting(graph, child, other, fid):
            continue
        name = graph.funcs[fid].name()
        if moved:
            raise ScheduleError(
                f"compute_with: {_where(graph, child)} would run after {_where(graph, other)}"
                " (the fused loops run where the last fused stage was scheduled), and both"
                f" access {name}; fuse that stage too or keep them apart")
        raise ScheduleError(
            f"{_where(graph, child)}.compute_with({_where(graph, other)}): both access {name}"
            " and fusion would reorder those accesses across iterations (only additive"
            " updates of one Func that read it only at the point they update may fuse)")


def _loop_chain(stmt, n, where):
    """The ``n`` outermost For loops of ``stmt`` (a definition's nest), outermost first."""
    out = []
    for _ in range(n):
        if not isinstance(stmt, For):
            raise ScheduleError(f"{where}.compute_with: a Func is computed or stored at one of"
                                " the fused loops; compute it at a loop inside them")
        out.append(stmt)
        stmt = stmt.body
    return out


def _subst_stmt(s, m):
    if isinstance(s, Block):
        return Block([_subst_stmt(t, m) for t in s.stmts])
    if isinstance(s, For):
        return For(s.name, s.leaf, sym.substitute(s.extent, m), s.kind, s.factor,
                   _subst_stmt(s.body, m), _subst(s.split_extent, m), s.pure, s.atomic)
    if isinstance(s, LetStmt):
        return LetStmt(s.leaf, sym.substitute(s.value, m))
    if isinstance(s, Allocate):
        return Allocate(s.func, _subst_stmt(s.body, m))
    return Provide(s.func, tuple(sym.substitute(a, m) for a in s.args),
                   tuple(sym.substitute(v, m) for v in s.values), _subst(s.predicate, m))


def _kind(loop):
    return loop.kind + (f" ({loop.factor} wide)" if loop.factor else "")


def _fuse_group(graph, members, stmts, depth):
    """One loop nest for ``members`` (keys in order, the parent first), member ``k`` sharing
    the parent's ``depth[k]`` outermost loops; returns it and each member's map of loop
    variables to the parent's. A shared loop whose members' extents are not provably equal
    (loops over different Funcs' regions) runs to the largest, and each member's body is
    guarded by its own extents (Halide's compute_with guards); the bodies of one level then
    run unguarded, sharing their common subexpressions, in the iterations all cover. Vector
    loops cannot be guarded lane by lane: where their extents are not provably equal (tiles of
    two Funcs' regions) the nest is versioned, fused where they are equal at run time and
    each member's own loops one after the other where not."""
    n_max = depth[0]
    root = _loop_chain(stmts[members[0]], n_max, _where(graph, members[0]))
    exts = [[f.extent] for f in root]
    maps, own, bodies = [{}], [[f.extent for f in root]], [root[-1].body]
    # per versioned level: the members' run-time tests of equal extents there; and each
    # member's own loops with its map to the parent's (for the unfused version)
    versioned = collections.defaultdict(list)
    chains, pairs = [root], [[]]
    for key, n in zip(members[1:], depth[1:]):
        where = _where(graph, key)
        if n > depth[len(maps) - 1]:
            raise ScheduleError(f"{where}.compute_with: an earlier stage of its group shares"
                                " fewer loops with the parent; fuse it at that loop or deeper")
        m, mine, same_region = {}, [], {}
        chains.append(_loop_chain(stmts[key], n, where))
        for k, (a, b) in enumerate(zip(chains[-1], root)):
            if (a.kind, a.factor) != (b.kind, b.factor):
                raise ScheduleError(
                    f"{where}.compute_with: its loop {a.name} is {_kind(a)}, the parent's"
                    f" {b.name} is {_kind(b)}; fused loops need one kind")
            if a.kind.startswith("gpu"):
                raise ScheduleError(f"{where}.compute_with: fusing GPU loops is not supported")
            ext = sym.substitute(a.extent, m)
            if ext is not b.extent and a.kind == "vectorized" and None in (
                    const_value(ext), const_value(b.extent)):
                versioned[k].append(sym.eq(ext, b.extent))
                ext = b.extent
                pfid, fid = members[0][0], key[0]
                if fid != pfid and graph.funcs[fid].dimensions() == \
                        graph.funcs[pfid].dimensions():
                    # where the two regions are equal, the fused body addresses the member's
                    # points as the parent's: the same coordinates (and reads) are shared
                    for d in range(graph.funcs[fid].dimensions()):
                        for w in ("min", "extent"):
                            mine_r, theirs = region_leaf(fid, d, w), region_leaf(pfid, d, w)
                            versioned[k].append(sym.eq(mine_r, theirs))
                            same_region[mine_r] = theirs
            elif ext is not b.extent and a.kind in ("vectorized", "unrolled"):
                raise ScheduleError(
                    f"{where}.compute_with: its {a.kind} loop {a.name} runs over [0,"
                    f" {sym.to_str(ext, limit=80)}), the parent's {b.name} over [0,"
                    f" {sym.to_str(b.extent, limit=80)}); fused vector or unrolled loops need"
                    " provably equal extents")
            if all(ext is not e for e in exts[k]):
                exts[k].append(ext)
            mine.append(ext)
            m[a.leaf] = b.leaf
            last = a
        pairs.append(list(m.items()))
        maps.append(m)
        own.append(mine)
        bodies.append(_subst_stmt(last.body, {**m, **same_region}))

    def guard(j, n=None):
        conds = [sym.lt(root[k].leaf, e) for k, e in enumerate(own[j][:n]) if len(exts[k]) > 1]
        return None if not conds else functools.reduce(sym.logical_and, conds)

    def level(n):
        here = [j for j, d in enumerate(depth) if d == n]
        guards = [guard(j) for j in here]
        items = [bodies[j] for j in here]
        if any(g is not None for g in guards):
            both = functools.reduce(sym.logical_and, [g for g in guards if g is not None])
            items = [IfThen(both, Block(items), Block(
                [IfThen(g, bodies[j]) if g is not None else bodies[j]
                 for j, g in zip(here, guards)]))]
        if n < n_max:
            f = root[n]
            ext = functools.reduce(sym.maximum, exts[n])
            loop = For(f.name, f.leaf, ext, f.kind, f.factor, level(n + 1),
                       f.split_extent if len(exts[n]) == 1 else None, f.pure, f.atomic)
            if versioned[n]:
                alone = []
                for j, d in enumerate(depth):
                    if d > n:  # member j's own loops from level n, run alone
                        s = _subst_stmt(chains[j][n], dict(pairs[j][:n]))
                        g = guard(j, n)
                        alone.append(s if g is None else IfThen(g, s))
                loop = IfThen(functools.reduce(sym.logical_and, versioned[n]), loop,
                              Block(alone))
            items.insert(0, loop)
        return items[0] if len(items) == 1 else Block(items)
    return level(0), maps


def _same_points(graph, group, fid):
    """Stages of ``group`` writing ``fid`` in parallel or vector lanes write the same pure
    coordinates in the same fused iteration (so distinct iterations write distinct points)."""
    vals = None
    for key, m in group:
        if key[0] != fid:
            continue
        ld = graph.defs[key[0]][key[1]]
        loops = _Loops(graph, key[0], ld)
        mine = {n: sym.substitute(v, m) for n, (_, v) in loops.values.items()
                if n in ld.source.pure_var_names()}
        if vals is not None and (mine.keys() != vals.keys()
                                 or any(mine[n] is not vals[n] for n in mine)):
            raise ScheduleError(
                f"{_where(graph, key)}.compute_with: the fused parallel or vectorized loops"
                f" of the stages writing {graph.funcs[fid].name()} cover different points of"
                " its pure dimensions (schedule their pure loops alike)")
        vals = mine


def fuse_stages(graph, order, stmts):
    """The merged nests of the ``compute_with`` groups: ``{key: statement}`` for each group's
    last stage and ``{key: None}`` for the others (``key``: (fid, index)).

    Rules (named ScheduleErrors): both stages computed at the root; the parent runs earlier;
    the parent's loops from ``var`` outward pair by position with the child's outermost loops,
    of one kind (extents that are not provably equal get guards, ``_fuse_group``; vector and
    unrolled loops need equal ones); no Func computed or stored at a fused loop; the nest
    runs at the position of the group's last stage, so no stage between a group member and
    that position may write what the member reads or access what it writes (the stages of
    one Func before its fused update stay before the nest); within the fused loops no stage
    may write what another reads or writes, except several additive updates of one Func that
    read it only at the point they update (interleaving them changes only the order of the
    additions, hence rounding); stages writing one Func through fused parallel or vectorized
    loops must cover the same pure points per iteration."""
    pos = {key: k for k, key in enumerate(order)}
    parent = {}
    for fid in graph.funcs:
        for ld in graph.defs.get(fid, []):
            cw = ld.schedule.compute_with
            if cw is None:
                continue
            key = (fid, ld.index)
            pf, pk, var = cw
            pkey = (pf.fid, pk)
            if key not in pos or pkey not in pos:
                who = graph.funcs[fid] if key not in pos else pf
                raise ScheduleError(
                    f"{graph.funcs[fid].name()}{ld.source.stage_name()}.compute_with: both"
                    f" Funcs must be computed at the root ({who.name()} is not)")
            if pos[pkey] >= pos[key]:
                raise ScheduleError(
                    f"{_where(graph, key)}.compute_with({_where(graph, pkey)}): the parent must"
                    " be computed first (fuse the later stage into the earlier one)")
            pdef = graph.defs[pkey[0]][pk]
            dims = pdef.schedule
            n = len(dims.dims) - dims.find(var, pf.name(), pdef.source.stage_name())
            parent[key] = (pkey, n)
    if not parent:
        return {}
    root = {}
    for key in sorted(parent, key=pos.get):
        p = parent[key][0]
        root[key] = root.get(p, p)
    out = {}
    acc = {key: stmt_accesses(s) for key, s in stmts.items()}
    for r in sorted(set(root.values()), key=pos.get):
        members = sorted((k for k in root if root[k] == r), key=pos.get)
        inside = {r, *members}
        for m in [r] + members[:-1]:
            for key in order[pos[m] + 1:pos[members[-1]]]:
                if key not in inside:
                    _check_independent(graph, m, key, acc, moved=True)
        for j, child in enumerate(members):
            for key in [r] + members[:j]:
                _check_independent(graph, child, key, acc, moved=False)
        depth = [parent[c][1] for c in members]
        merged, maps = _fuse_group(graph, [r] + members, stmts, [max(depth)] + depth)
        group = list(zip([r] + members, maps))
        shared = _loop_chain(stmts[r], max(depth), _where(graph, r))
        if any(f.kind in ("parallel", "vectorized") for f in shared):
            for fid in {k[0] for k, _ in group}:
                _same_points(graph, group, fid)
        out.update({key: None for key, _ in group})
        out[members[-1]] = merged
    return out
