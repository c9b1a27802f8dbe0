"""The pipeline graph: which Funcs are realized, inlining, and the realized order.

Default compute levels (Halide's): a Func is inlined into its callers unless it is an output,
has update definitions, or is scheduled otherwise; a Func with update definitions is computed
at the root by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from core_ad import sym

from . import _expr as E
from ._buffer import Buffer
from ._func import Func, FuncError, callee
from ._schedule import LoopLevel, ScheduleError

__all__ = ["Graph", "LDef"]


@dataclass
class LDef:
    """A definition after inlining: coordinates, values, predicate (sym nodes), its RVars
    with their (min, extent) nodes, and its Definition (for the schedule)."""

    func: Func
    index: int
    args: tuple
    values: tuple
    predicate: object
    rvars: list  # [(leaf, min node, extent node)], innermost first
    source: object

    @property
    def schedule(self):
        return self.source.schedule

    def nodes(self):
        out = list(self.args) + list(self.values)
        if self.predicate is not None:
            out.append(self.predicate)
        return out


class Graph:
    def __init__(self, outputs):
        self.outputs = list(outputs)
        for o in self.outputs:
            if not isinstance(o, Func):
                raise FuncError(f"pipeline outputs must be Funcs, got {type(o).__name__}")
            o._require_defined()
        self.funcs: dict = {}
        self.buffers: dict = {}
        self.params: dict = {}
        self._collect()
        self.inline = {fid for fid, f in self.funcs.items() if self._is_inline(f)}
        self._inline_memo: dict = {}
        self.defs = {fid: self._inline_defs(f) for fid, f in self.funcs.items()
                     if fid not in self.inline}
        self.order = self._topo()
        self.levels = {fid: self._level(self.funcs[fid]) for fid in self.order}
        self.stores = {fid: self._store(self.funcs[fid]) for fid in self.order}
        self.consumers = self._consumers()
        self._check_levels()

    # ---- discovery ---------------------------------------------------------------------
    def _collect(self):
        stack = list(self.outputs)
        while stack:
            f = stack.pop()
            if f.fid in self.funcs:
                continue
            self.funcs[f.fid] = f
            for d in f.definitions():
                nodes = list(d.args) + list(d.values)
                if d.predicate is not None:
                    nodes.append(d.predicate)
                for rd in d.rdoms:
                    nodes += [b.node for pair in rd.bounds for b in pair]
                for n in sym.free_leaves(nodes):
                    if E.is_param(n):
                        self.params[n] = None
                for c in sym.calls(nodes, E.CALL):
                    obj = callee(c.params["fid"])
                    if isinstance(obj, Buffer):
                        self.buffers[obj.fid] = obj
                    elif obj.fid not in self.funcs:
                        obj._require_defined()
                        stack.append(obj)
                for n in sym.free_leaves(nodes, "hl.bufdim"):
                    obj = callee(n.key[0])
                    self.buffers[obj.fid] = obj

    def _is_inline(self, f: Func) -> bool:
        if f in self.outputs:
            return False
        lvl = f.compute_level
        if lvl is not None and lvl.kind == "inline":
            if f.has_update_definition():
                raise ScheduleError(
                    f"Func {f.name()} has update definitions and cannot be inlined:"
                    " compute_root() or compute_at() it"
                )
            return True
        return lvl is None and not f.has_update_definition()

    # ---- inlining ----------------------------------------------------------------------
    def inline_node(self, node):
        """``node`` with every call of an inlined Func replaced by its definition."""
        while True:
            cs = [c for c in sym.calls(node, E.CALL) if c.params["fid"] in self.inline]
            if not cs:
                return node
            mapping = {}
            for c in cs:
                r = self._inline_memo.get(id(c))
                if r is None:
                    f = self.funcs[c.params["fid"]]
                    d = f._pure
                    r = sym.substitute(d.values[c.params["index"]], dict(zip(d.args, c.args)))
                    self._inline_memo[id(c)] = (c, r)
                else:
                    r = r[1]
                mapping[c] = r
            node = sym.substitute(node, mapping)

    def _inline_defs(self, f: Func):
        out = []
        for d in f.definitions():
            args = tuple(self.inline_node(a) for a in d.args)
            values = tuple(self.inline_node(v) for v in d.values)
            pred = None if d.predicate is None else self.inline_node(d.predicate)
            rvars = []
            for leaf, rv in d.rvars():
                lo, ext = rv.rdom.bounds[rv.dim]
                rvars.append((leaf, self.inline_node(lo.node), self.inline_node(ext.node)))
            out.append(LDef(f, d.stage_index, args, values, pred, rvars, d))
        return out

    # ---- order and levels --------------------------------------------------------------
    def callees_of(self, fid):
        """Realized Funcs and Buffers called by the (inlined) definitions of ``fid``, in the
        order they were created: independent producers are realized in definition order,
        whatever the operand order of the expressions that call them."""
        out = set()
        for d in self.defs[fid]:
            nodes = d.nodes() + [n for _, lo, ext in d.rvars for n in (lo, ext)]
            out.update(c.params["fid"] for c in sym.calls(nodes, E.CALL))
        return sorted(out, key=E.creation_index)

    def _topo(self):
        order, state = [], {}
        for out in self.outputs:
            stack = [(out.fid, iter(self.callees_of(out.fid)))]
            state[out.fid] = 1
            if state.get(out.fid) == 2:
                continue
            while stack:
                fid, it = stack[-1]
                for g in it:
                    if g == fid or g in self.buffers:
                        continue
                    s = state.get(g)
                    if s == 1:
                        raise FuncError(
                            f"the pipeline has a cycle through {self.funcs[g].name()}"
                        )
                    if s is None:
                        state[g] = 1
                        stack.append((g, iter(self.callees_of(g))))
                        break
                else:
                    stack.pop()
                    if state.get(fid) != 2:
                        state[fid] = 2
                        order.append(fid)
        return order

    def _level(self, f: Func) -> LoopLevel:
        lvl = f.compute_level
        if f in self.outputs or lvl is None or lvl.kind == "inline":
            return LoopLevel("root")
        return lvl

    def _store(self, f: Func) -> LoopLevel:
        lvl = self.levels[f.fid]
        if lvl.kind == "root":
            return lvl
        s = f.store_level
        return lvl if s is None else s

    def _consumers(self):
        cons = {fid: [] for fid in self.order}
        for fid in self.order:
            for k, d in enumerate(self.defs[fid]):
                for c in sym.calls(d.nodes(), E.CALL):
                    g = c.params["fid"]
                    if g in cons and g != fid and (fid, k) not in cons[g]:
                        cons[g].append((fid, k))
        return cons

    def _check_levels(self):
        for fid in self.order:
            f = self.funcs[fid]
            lvl = self.levels[fid]
            if lvl.kind != "at":
                continue
            host = lvl.func
            if host.fid not in self.defs:
                raise ScheduleError(
                    f"{f.name()}.compute_at({host.name()}, {lvl.var}): {host.name()} is not"
                    " computed in this pipeline (inlined or unused)"
                )
            users = self.consumers[fid]
            if any(g != host.fid for g, _ in users):
                others = sorted({self.funcs[g].name() for g, _ in users if g != host.fid})
                raise ScheduleError(
                    f"{f.name()} is computed at {host.name()}.{lvl.var} but also used by"
                    f" {', '.join(others)}: compute_root() it, or compute it where all its"
                    " users run"
                )
            for k in sorted({k for _, k in users}):  # computed in each definition using it
                d = self.defs[host.fid][k]
                if lvl.var not in d.schedule.names():
                    raise ScheduleError(
                        f"{f.name()}.compute_at({host.name()}, {lvl.var!r}):"
                        f" {host.name()}{d.source.stage_name()} has no loop {lvl.var!r} (its"
                        f" loops, innermost first: {', '.join(d.schedule.names())})"
                    )
            st = self.stores[fid]
            if st.kind == "at" and st.func is not host:
                raise ScheduleError(f"{f.name()}: store_at must name the compute_at Func")

    def host_defs(self, fid) -> set:
        """Indices of the definitions of the compute_at host that call ``fid`` (the producer
        is computed inside each of them)."""
        return {k for _, k in self.consumers[fid]}
