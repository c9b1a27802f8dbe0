"""Reverse-mode automatic differentiation of pipelines: ``propagate_adjoints`` (Halide-AD,
docs/design/halide-ad.md §2).

The adjoint of every Func, Buffer and Param is an ordinary Func built with the language
itself, so it can be scheduled, realised and differentiated again. Scalar partial derivatives
of each definition's value come from core_ad's rule table (``sym.grad`` with respect to the
call nodes and Param leaves). Each call ``g(e_0, ..., e_k)`` in a definition of ``f`` turns
into a contribution to ``d_g``:

* every argument that can be solved for one of the definition's variables (``x + c``,
  ``c - x``, ``k * x`` (masked ``u % k == 0``), ``x / k`` (a new RDom of extent ``k``), an
  RVar alone) becomes the adjoint's pure variable: a **gather**, race-free over it;
* variables left unsolved become reduction dimensions over ``f``'s inferred region (pure
  Vars) or their own RDom (RVars);
* an argument that cannot be solved (clamped or data-dependent) keeps its expression on the
  left-hand side: a **scatter** ``d_g[e(r)] += ...``; with no argument solved it is general,
  over the whole domain, else a partial gather, pure (race-free) in the solved dimensions,
  whose scattered arguments may read them (``d_grid[x, y, fz(x.., y..), c] += ...``,
  Listing 1).

Solved variables are replaced by ``clamp(solution, lo, hi)`` and the contribution is masked
by ``lo <= solution <= hi``, so every forward read stays where the forward pipeline read
(bounds inference proves it) and nothing outside ``f``'s region contributes. Adjoints are read
through ``constant_exterior(0)`` over their Func's inferred region (the paper's zero padding).
"""

from __future__ import annotations

import itertools

import numpy as np
from core_ad import sym

from . import _boundary
from . import _expr as E
from ._buffer import Buffer
from ._func import Func, FuncError, require_float_func, zero_func
from ._graph import Graph
from ._bounds import const_int, interval
from ._lower import _point_env, root_regions
from ._schedule import LoopLevel
from ._types import type_of_dtype

__all__ = ["Derivative", "propagate_adjoints"]

I32 = np.int32


class _AllRootGraph(Graph):
    """The forward graph with every Func realised: bounds inference then gives a region for
    every Func, including the ones a schedule would inline."""

    def _is_inline(self, f):
        return False

    def _level(self, f):
        return LoopLevel("root")

    def _store(self, f):
        return LoopLevel("root")

    def _check_levels(self):
        pass


def _values(graph):
    values = {}
    for p in graph.params:
        obj = E.PARAMS.get(p.key)
        if obj is not None and obj.get() is not None:
            values[p] = obj.get()
    for fid, buf in graph.buffers.items():
        for d in range(buf.dimensions()):
            values[sym.leaf("hl.bufdim", (fid, d, "min"), I32)] = buf.dim(d).min()
            values[sym.leaf("hl.bufdim", (fid, d, "extent"), I32)] = buf.dim(d).extent()
    return values


def _is_float(t) -> bool:
    return t.is_float()


def _unit_rvar(arg):
    """``(r, s)`` when ``arg`` is ``s * r + c`` for an RVar ``r``, ``s = +-1`` and a constant
    ``c``, else None."""
    rvs = [n for n in sym.free_leaves(arg) if E.is_rvar(n)]
    if len(rvs) == 1:
        if _const_int(arg - rvs[0]) is not None:
            return rvs[0], 1
        if _const_int(arg + rvs[0]) is not None:
            return rvs[0], -1
    return None


def _writes_each_point_once(d) -> bool:
    """Whether update ``d`` writes each point at most once: its left-hand side is pure Vars,
    constants and RVars plus constants, every RVar of its RDoms appearing there exactly once
    (so distinct iterations write distinct points)."""
    rvars = [leaf for leaf, _ in d.rvars()]
    seen = []
    for a in d.args:
        unit = _unit_rvar(a)
        if unit is not None:
            if unit[0] in seen:
                return False
            seen.append(unit[0])
        elif not (E.is_var(a) or _const_int(a) is not None):
            return False
    return len(seen) == len(rvars) and all(r in seen for r in rvars)


def _reads_only_finished_points(d, read_args) -> bool:
    """Whether update ``d`` (writing each point once) reads ``read_args`` only where it never
    writes or where an earlier iteration already wrote: the read is the written point moved by
    a constant step of the RVars that is lexicographically negative (outermost RDom dimension
    first), or a constant coordinate it never writes. The value read is then the value after
    the update: a non-overwriting scan (spec 3.7.3), such as ``f(x, r + 1) = g(f(x, r))``."""
    shift = {}
    for a, b in zip(d.args, read_args):
        step = _const_int(b - a)
        if step is None:
            return False
        unit = _unit_rvar(a)
        if unit is not None:
            shift[unit[0]] = step * unit[1]  # in iterations: r moves by step / s
        elif _const_int(a) is not None:
            if step:
                return True  # a coordinate this update never writes
        elif step:
            return False  # a pure Var read at another point
    for leaf, _ in reversed(d.rvars()):  # innermost first: the outermost decides
        if shift.get(leaf, 0):
            return shift[leaf] < 0
    return False


def _const_int(n):
    if getattr(n, "op", None) == "const" and np.dtype(n.dtype).kind in "iu":
        return int(n.value)
    return None


def _inside(node, lo, hi, env) -> bool:
    """Whether ``lo <= node <= hi`` provably holds over ``env``."""
    ivs = [interval(n, env) for n in (node, lo, hi)]
    if any(iv is None for iv in ivs):
        return False
    (a, b), (lo_v, _), (_, hi_v) = [(const_int(x), const_int(y)) for x, y in ivs]
    return None not in (a, b, lo_v, hi_v) and lo_v <= a and b <= hi_v


def _uses(node, leaves) -> set:
    return {n for n in sym.free_leaves(node) if n in leaves}


def _solve(arg, var, target):
    """``var`` such that ``arg == target``, as (solution, masks, new reduction dims) or None.

    ``new reduction dims`` are ``(leaf, min, extent)`` of RVars the solution introduces (the
    ``k`` preimages of a floor division by ``k``)."""
    if arg is var:
        return target, [], []
    op = getattr(arg.op, "name", arg.op)
    if op == "add":
        inside = [a for a in arg.args if var in sym.free_leaves(a)]
        if len(inside) != 1:
            return None
        rest = [a for a in arg.args if a is not inside[0]]
        other = rest[0]
        for a in rest[1:]:
            other = other + a
        return _solve(inside[0], var, target - other)
    if op == "mul" and len(arg.args) == 2:
        k = _const_int(arg.args[0])
        inner = arg.args[1]
        if k is None:
            k, inner = _const_int(arg.args[1]), arg.args[0]
        if k is None or var not in sym.free_leaves(inner) or k == 0:
            return None
        if k in (1, -1):
            return _solve(inner, var, target * k)
        sol = _solve(inner, var, sym.floor_divide(target, sym.const(k, I32)))
        if sol is None:
            return None
        s, masks, dims = sol
        return s, [sym.eq(sym.mod(target, sym.const(k, I32)), sym.const(0, I32))] + masks, dims
    if op == "floor_divide":
        k = _const_int(arg.args[1])
        if k is None or k <= 0 or var in sym.free_leaves(arg.args[1]):
            return None
        if k == 1:
            return _solve(arg.args[0], var, target)
        leaf = sym.leaf("hl.rvar", (E.unique_name("div"), 0), I32)
        sol = _solve(arg.args[0], var, target * k + leaf)
        if sol is None:
            return None
        s, masks, dims = sol
        return s, masks, [(leaf, sym.const(0, I32), sym.const(k, I32))] + dims
    return None


def _congruence(mask, domain, solved):
    """``(r, solution)`` when ``mask`` is ``mod(s +- r, K) == 0`` for an unsolved RVar ``r``
    of constant range ``[lo, lo + n)`` with ``n <= K`` and ``s`` free of other unsolved
    dimensions: at most one ``r`` satisfies it, ``lo + mod(-+s - lo, K)`` (the channel of a
    packed index ``z K + r``, e.g. the bilateral slice's ``z (ci + 1) + r``), so the RVar need
    not be looped over with all but one iteration masked off. Else None."""
    if getattr(mask.op, "name", mask.op) != "eq" or _const_int(mask.args[1]) != 0:
        return None
    m = mask.args[0]
    if getattr(m.op, "name", m.op) != "mod":
        return None
    e, k = m.args[0], _const_int(m.args[1])
    if k is None or k <= 0:
        return None
    for r in _uses(e, set(domain)) - set(solved):
        if not E.is_rvar(r):
            continue
        lo, n = (_const_int(v) for v in domain[r])
        if lo is None or n is None or n > k:
            continue
        for sign in (1, -1):
            rest = e - r if sign == 1 else e + r
            if _uses(rest, set(domain)) - set(solved):
                continue
            residue = -rest if sign == 1 else rest
            return r, sym.const(lo, I32) + sym.mod(residue - sym.const(lo, I32),
                                                   sym.const(k, I32))
    return None


def _retarget(node, old_fid, new_fid):
    """``node`` with its calls of ``old_fid`` made calls of ``new_fid``."""
    mapping = {c: sym.call(E.CALL, *c.args, out_dtype=c.dtype, fid=new_fid,
                           index=c.params["index"])
               for c in sym.calls(node, E.CALL) if c.params["fid"] == old_fid}
    return sym.substitute(node, mapping) if mapping else node


def stage_copy(f, j, name):
    """A new Func ``name`` equal to ``f`` after its definition ``j`` (0: the pure one)."""
    copy = Func(name)
    xs = [E.Var(n) for n in f._pure_arg_names]
    for d in f.definitions()[:j + 1]:
        vals = [E.Expr(_node=_retarget(v, f.fid, copy.fid)) for v in d.values]
        val = vals[0] if len(vals) == 1 else vals
        if d.stage_index == 0:
            copy[tuple(xs)] = val
        else:
            copy[tuple(E.Expr(_node=a) for a in d.args)] = val
    return copy


class Derivative:
    """The adjoints: ``d[f]`` (pure stage), ``d[f, i]`` (after update ``i``), ``d[buffer]``,
    ``d[param]`` (a 0-D Func), all ordinary Funcs."""

    def __init__(self, stages, inputs, funcs, output, customs):
        self._stages = stages  # fid -> [adjoint of stage 0 (pure), after update 0, ...]
        self._inputs = inputs  # fid / param leaf -> Func
        self._funcs = funcs
        self._output = output
        self._customs = customs  # fids whose only adjoint is their value's (custom rule)

    def __getitem__(self, key):
        index = None
        if isinstance(key, tuple):
            key, index = key
        if isinstance(key, Func):
            stages = self._stages.get(key.fid)
            if stages is None:
                if key.fid in self._funcs:
                    raise FuncError(
                        f"Func {key.name()} is {key.type()}-valued: integer Funcs have no"
                        " adjoint"
                    )
                raise FuncError(
                    f"Func {key.name()} is not in the pipeline of {self._output.name()}: it has"
                    " no adjoint"
                )
            if index is not None and key.fid in self._customs:
                raise FuncError(
                    f"Func {key.name()} has a custom adjoint: only d[{key.name()}] (the adjoint"
                    " of its value) exists"
                )
            k = 0 if index is None else index + 1
            if not 0 <= k < len(stages):
                raise FuncError(
                    f"Func {key.name()} has {len(stages) - 1} update(s); no adjoint for update"
                    f" {index}"
                )
            return stages[k]
        if index is not None:
            raise FuncError("an update index is only meaningful for a Func")
        if isinstance(key, Buffer):
            f = self._inputs.get(key.fid)
            if f is None:
                if not key.type().is_float():
                    raise FuncError(f"Buffer {key.name()} is {key.type()}: it has no adjoint")
                # the loss does not depend on it: zeros
                f = zero_func(f"{key.name()}_d", key.dimensions(), key.type())
            return f
        if isinstance(key, E.Param):
            f = self._inputs.get(key.node)
            if f is None:
                if not key.type().is_float():
                    raise FuncError(f"Param {key.name()} is {key.type()}: it has no adjoint")
                f = Func(E.cast(key.type(), 0), name=f"{key.name()}_d")
            return f
        raise FuncError(f"no adjoint for {type(key).__name__}: use a Func, Buffer or Param")


class _Contribution:
    """``target[lhs] += value`` with the reduction dims ``rdims`` [(leaf, min, extent)] and a
    boolean mask (or None)."""

    def __init__(self, lhs, value, rdims, mask):
        self.lhs, self.value, self.rdims, self.mask = lhs, value, rdims, mask


class _Adjoints:
    def __init__(self, output, seed_func, out_region, scatter_to_gather=True):
        self.output = output
        self.scatter_to_gather = scatter_to_gather
        graph = _AllRootGraph([output])
        self.graph = graph
        values = self.values = _values(graph)
        missing = [p for p in graph.params if p not in values]
        self.regions = root_regions(graph, {output.fid: out_region}, values) if not missing \
            else self._regions_need_params(missing)
        self.contribs: dict = {}  # fid / param leaf -> [_Contribution]
        self.stages: dict = {}
        self.inputs: dict = {}
        self.seed = seed_func
        self._copies: dict = {}
        self._keep: list = []
        self.customs: set = set()  # fids of Funcs with a custom adjoint

    @staticmethod
    def _regions_need_params(missing):
        names = ", ".join(E.PARAMS[p.key].name() if p.key in E.PARAMS else str(p.key)
                          for p in missing)
        raise FuncError(f"propagate_adjoints: set the Params {names} first (bounds need them)")

    def adjoint_vars(self, n):
        return [sym.leaf("hl.var", f"_d{k}", I32) for k in range(n)]

    # ---- driver ------------------------------------------------------------------------
    def run(self):
        g = self.graph
        for fid in reversed(g.order):
            f = g.funcs[fid]
            if not all(_is_float(t) for t in f.types()):
                continue
            if len(f.types()) != 1:
                raise FuncError(
                    f"propagate_adjoints: Func {f.name()} is a Tuple; differentiate Funcs with"
                    " one value (split the Tuple into several Funcs)"
                )
            self._process(f)
        for fid, buf in g.buffers.items():
            if buf.type().is_float():
                self.inputs[fid] = self._buffer_adjoint(buf, self.contribs.get(fid, []))
        for p in g.params:
            if np.dtype(p.dtype).kind == "f":
                obj = E.PARAMS.get(p.key)
                name = obj.name() if obj is not None else "param"
                self.inputs[p] = self._materialise(None, f"{name}_d", type_of_dtype(p.dtype), 0,
                                                   self.contribs.get(p, []))
        return Derivative(self.stages, self.inputs, g.funcs, self.output, self.customs)

    def _process(self, f):
        region = self.regions[f.fid]
        defs = f.definitions()
        n = len(defs)
        t = f.type()
        if f is self.output:
            final = self.seed
        elif f.fid not in self.contribs:
            # nothing downstream reads it (a custom rule bypassed it): zero, no propagation
            # (which could also refuse updates that no gradient needs)
            zero = self._materialise(f, f"{f.name()}_d", t, f.dimensions(), [])
            self.stages[f.fid] = [zero] * n
            return
        else:
            final = self._materialise(f, f"{f.name()}_{n}_d", t, f.dimensions(),
                                      self.contribs.get(f.fid, []))
        custom = f._custom_derivative
        if custom is not None and custom.adjoint is not None:
            self._custom(f, custom, final, region)
            return
        adj = [None] * n
        adj[n - 1] = final
        for k in range(n - 1, -1, -1):
            d = defs[k]
            cur = adj[k]
            read = _boundary.constant_exterior(
                cur, E.cast(t, 0), bounds=[(lo, ext) for lo, ext in region]) if region else cur
            self._keep.append(read)  # calls name Funcs by id only; keep it alive until used
            seed = E.as_expr(read[tuple(E.Expr(_node=a) for a in d.args)]).node
            value = d.values[0]
            if k > 0:
                # self-reads see the value before this update: a copy of stages 0..k-1
                before = self._stage_copy(f, k - 1)
                value = _retarget(value, f.fid, before.fid)
                scan = self._scan(f, d, k, cur, value, before)
                if scan is not None:
                    adj[k - 1], value, seed = scan
                else:
                    adj[k - 1] = self._previous_stage(f, d, k, cur, t, value, before)
            self._propagate(f, d, value, seed, region)
        self.stages[f.fid] = adj

    def _custom(self, f, custom, final, region):
        """Contributions from the user's adjoint rule instead of ``f``'s definitions."""
        read = _boundary.constant_exterior(
            final, E.cast(f.type(), 0), bounds=[(lo, ext) for lo, ext in region]) \
            if region else final
        for obj, fn in custom.adjoints(read):
            self._keep.append(fn)
            if isinstance(obj, E.Param):
                key, us = obj.node, []
            else:
                key, us = obj.fid, self.adjoint_vars(obj.dimensions())
            value = sym.call(E.CALL, *us, out_dtype=fn.type().dtype, fid=fn.fid, index=0)
            self.contribs.setdefault(key, []).append(_Contribution(us, value, [], None))
        self.stages[f.fid] = [final]
        self.customs.add(f.fid)

    # ---- updates -----------------------------------------------------------------------
    def _stage_copy(self, f, j):
        key = (f.fid, j)
        copy = self._copies.get(key)
        if copy is None:
            copy = self._copies[key] = stage_copy(f, j, f"{f.name()}_s{j}")
        return copy

    def _scan(self, f, d, k, cur, value, before):
        """A non-overwriting scan (spec 3.7.3; :func:`_reads_only_finished_points`):
        ``(adjoint before the update, the update's value, its seed)`` or None. The adjoint
        runs the recurrence backwards (every RVar ``r`` replaced by ``lo + hi - r``), adding
        the adjoint of each written point, times the local partial, into the point it read;
        values the partials read are those after the update (a stage copy). The written points'
        adjoints then seed the update's other contributions, and are zero before it."""
        selfs = [c for c in sym.calls(value, E.CALL) if c.params["fid"] == before.fid]
        if (len(selfs) != 1 or selfs[0].args == d.args or not _writes_each_point_once(d)
                or not _reads_only_finished_points(d, selfs[0].args)):
            return None
        after = self._stage_copy(f, k)
        value = _retarget(value, before.fid, after.fid)
        (read,) = [c for c in sym.calls(value, E.CALL) if c.params["fid"] == after.fid]
        partial = sym.grad(value, read)
        flip = {}
        for leaf, rv in d.rvars():
            lo, ext = rv.rdom.bounds[rv.dim]
            flip[leaf] = lo.node + lo.node + ext.node - sym.const(1, I32) - leaf
        xs = [E.Var(n) for n in f._pure_arg_names]
        at = tuple(E.Expr(_node=sym.substitute(a, flip)) for a in d.args)
        src = tuple(E.Expr(_node=sym.substitute(a, flip)) for a in read.args)
        back = Func(f"{f.name()}_{k}_d_scan")
        back[tuple(xs)] = cur[tuple(xs)]
        step = back[at] * E.Expr(_node=sym.substitute(partial, flip))
        if d.predicate is not None:
            step = E.select(E.Expr(_node=sym.substitute(d.predicate, flip)), step,
                            E.cast(f.type(), 0))
        back[src] = back[src] + step
        prev = Func(f"{f.name()}_{k}_d")
        prev[tuple(xs)] = back[tuple(xs)]
        written = tuple(E.Expr(_node=a) for a in d.args)
        prev[written] = E.cast(f.type(), 0) if d.predicate is None else E.select(
            E.Expr(_node=d.predicate), E.cast(f.type(), 0), prev[written])
        return prev, value, back[written].node

    def _previous_stage(self, f, d, k, cur, t, value, before):
        """The adjoint of ``f`` before update ``k - 1`` from the adjoint after it."""
        selfs = [c for c in sym.calls(value, E.CALL) if c.params["fid"] == before.fid]
        has_r = bool(d.rdoms)
        name = f"{f.name()}_{k}_d"
        xs = [E.Var(n) for n in f._pure_arg_names]
        prev = Func(name)
        lhs = d.args
        if not has_r and len(d.pure_var_names()) == len(lhs):  # every point, pointwise
            if selfs:
                partial = sym.grad(value, selfs[0])
                for c in selfs[1:]:
                    partial = partial + sym.grad(value, c)
                vmap = {sym.leaf("hl.var", nm, I32): x.node for nm, x in
                        zip(f._pure_arg_names, xs)}
                prev[tuple(xs)] = cur[tuple(xs)] * E.Expr(_node=sym.substitute(partial, vmap))
            else:  # every point overwritten
                prev[tuple(xs)] = E.cast(t, 0)
            return prev
        if not selfs:
            mask = Func(f"{name}_mask")
            mask[tuple(xs)] = E.cast(t, 1)
            pred = d.predicate
            wr = E.cast(t, 0) if pred is None else E.select(
                E.Expr(_node=pred), E.cast(t, 0), mask[tuple(E.Expr(_node=a) for a in lhs)])
            mask[tuple(E.Expr(_node=a) for a in lhs)] = wr
            prev[tuple(xs)] = cur[tuple(xs)] * mask[tuple(xs)]
            return prev
        if all(c.args == lhs for c in selfs):
            partial = sym.grad(value, selfs[0])
            for c in selfs[1:]:
                partial = partial + sym.grad(value, c)
            if _const_int(partial) == 1 or (getattr(partial, "op", None) == "const"
                                             and float(partial.value) == 1.0):
                prev[tuple(xs)] = cur[tuple(xs)]
                return prev
            if _writes_each_point_once(d):
                # the update reads only the point it writes, and writes each point once:
                # the adjoint there is scaled by the local partial (which may read the value
                # before the update: a stage copy), elsewhere it passes unchanged
                at = tuple(E.Expr(_node=a) for a in lhs)
                scaled = cur[at] * E.Expr(_node=partial)
                prev[tuple(xs)] = cur[tuple(xs)]
                prev[at] = scaled if d.predicate is None else E.select(
                    E.Expr(_node=d.predicate), scaled, cur[at])
                return prev
        raise FuncError(
            f"propagate_adjoints: update {k - 1} of Func {f.name()} reads {f.name()} in a way"
            " that cannot be reversed (a scan or a non-additive in-place reduction over an"
            f" RDom: {sym.to_str(value, limit=160)}). Rewrite it: accumulate with += into"
            f" {f.name()}, or write each step into a new Func (f_k[x] = g(f_(k-1)[...]))"
        )

    # ---- expression level --------------------------------------------------------------
    def _propagate(self, f, d, value, seed, region):
        calls = [c for c in sym.calls(value, E.CALL) if c.params["fid"] != f.fid]
        g = self.graph
        wrt = []
        for c in calls:
            callee = g.buffers.get(c.params["fid"]) or g.funcs.get(c.params["fid"])
            if np.dtype(c.dtype).kind == "f" and callee is not None:
                wrt.append(c)
        params = [p for p in sym.free_leaves(value) if E.is_param(p)
                  and np.dtype(p.dtype).kind == "f"]
        nodes = wrt + params
        if not nodes:
            return
        partials = sym.grad(value, nodes)
        # the definition's variables: the pure Vars on its left-hand side, and its RVars
        used = set(d.pure_var_names())
        domain = {}
        for k, nm in enumerate(f._pure_arg_names):
            if nm in used:
                lo, ext = region[k]
                domain[sym.leaf("hl.var", nm, I32)] = (sym.const(lo, I32), sym.const(ext, I32))
        for leaf, rv in d.rvars():
            lo, ext = rv.rdom.bounds[rv.dim]
            domain[leaf] = (lo.node, ext.node)
        for node, partial in zip(nodes, partials):
            if getattr(partial, "op", None) == "const" and float(partial.value) == 0.0:
                continue
            adj = seed * partial if np.dtype(seed.dtype) == np.dtype(partial.dtype) else \
                sym.astype(seed, partial.dtype) * partial
            if node in params:
                key, args = node, ()
            else:
                key, args = node.params["fid"], node.args
            self.contribs.setdefault(key, []).extend(
                self._contributions(args, adj, domain, d.predicate))

    def _contributions(self, args, adj, domain, predicate):
        """The contributions of one call: a clamped argument ``clamp(e, lo, hi)`` whose ``e``
        is solvable splits the gather over its preimage (:meth:`_clamp_edges`): the direct
        solution of ``e = u`` for ``lo <= u <= hi``, plus the points clamped onto ``lo``
        (``e = lo - 1 - r``) written at ``u = lo`` and those clamped onto ``hi`` at ``u = hi``,
        each a new RDom as long as the overhang of ``e``'s range past the edge. Every
        combination over the clamped arguments is a gather (edges: a line or corner of the
        adjoint), so nothing is left for a serial scatter over the consumer's domain."""
        edges = [self._clamp_edges(a, domain) for a in args]
        if not any(edges):
            return [self._contribution(args, adj, domain, predicate)]
        choices = [[None] if e is None else
                   [("in", e)] + [(side, e) for side, k in (("lo", e[3]), ("hi", e[4])) if k > 0]
                   for e in edges]
        out = []
        for combo in itertools.product(*choices):
            c = self._contribution(args, adj, domain, predicate, dict(enumerate(combo)))
            if c is None:  # a clamped argument's variable was solved by another argument
                return [self._contribution(args, adj, domain, predicate)]
            out.append(c)
        return out

    def _domain_env(self, domain):
        """Interval env: the Buffer extents and Params at their values, the definition's
        variables over their numeric ranges; None when a range is not computable."""
        env = _point_env(self.values)
        for leaf, (dlo, dext) in domain.items():
            ilo, ihi = interval(dlo, env), interval(dlo + dext - sym.const(1, I32), env)
            if ilo is None or ihi is None:
                return None
            env[leaf] = (ilo[0], ihi[1])
        return env

    def _edge_env(self, edges, us, new_dims):
        """Interval env of the written point where every argument is a clamp split: ``u`` in
        the clamp's ``[lo, hi]`` or an edge's overhang RVar in its range; else None."""
        if not edges or len(edges) != len(us) or any(e is None for e in edges.values()):
            return None
        env = _point_env(self.values)
        for i, (side, (_, lo, hi, _, _)) in edges.items():
            if side == "in":
                env[us[i]] = (interval(lo, env)[0], interval(hi, env)[1])
        for leaf, lo, ext in new_dims:
            env[leaf] = (lo, lo + ext - sym.const(1, I32))
        return env

    def _clamp_edges(self, arg, domain):
        """``(e, lo, hi, n_lo, n_hi)`` for an argument ``clamp(e, lo, hi)`` with constant
        bounds and ``e`` solvable for one of the definition's variables: ``n_lo`` / ``n_hi``
        values of ``e`` over the domain fall below ``lo`` / above ``hi``. None otherwise."""
        if not self.scatter_to_gather or getattr(getattr(arg, "op", None), "name",
                                                  None) != "clamp":
            return None
        e, lo, hi = arg.args
        if _uses(lo, set(domain)) or _uses(hi, set(domain)):
            return None
        free = _uses(e, set(domain))
        pure = [v for v in free if E.is_var(v)]
        cands = pure if len(pure) == 1 else (list(free) if len(free) == 1 else [])
        probe = sym.leaf("hl.var", E.unique_name("_probe"), I32)
        if not cands or _solve(e, cands[0], probe) is None:
            return None
        env = self._domain_env(domain)
        if env is None:
            return None
        ranges = [interval(n, env) for n in (e, lo, hi)]
        if any(r is None for r in ranges):
            return None
        (emin, emax), (lo_v, _), (hi_v, _) = [(const_int(a), const_int(b)) for a, b in ranges]
        if None in (emin, emax, lo_v, hi_v):
            return None
        return e, lo, hi, max(lo_v - emin, 0), max(emax - hi_v, 0)

    def _contribution(self, args, adj, domain, predicate, edges=None):
        """One contribution; ``edges`` maps an argument index to ``(side, clamp edges)``
        (:meth:`_contributions`) or None. None when an edge argument stays unsolved."""
        edges = edges or {}
        m = len(args)
        # fresh names: the consumer's own variables may be another adjoint's _d0, _d1, ...
        us = [sym.leaf("hl.var", E.unique_name(f"_u{k}"), I32) for k in range(m)]
        dvars = set(domain)
        solved: dict = {}
        masks, new_dims = [], []
        targets, written = list(us), list(us)
        args = list(args)
        for i, edge in edges.items():
            if edge is None:
                continue
            side, (e, lo, hi, n_lo, n_hi) = edge
            args[i] = e
            one = sym.const(1, I32)
            if side == "in":
                masks += [sym.ge(us[i], lo), sym.le(us[i], hi)]
            else:
                r = sym.leaf("hl.rvar", (E.unique_name("edge"), 0), I32)
                new_dims.append((r, sym.const(0, I32), sym.const(n_lo if side == "lo" else n_hi,
                                                                 I32)))
                written[i] = lo if side == "lo" else hi
                targets[i] = lo - one - r if side == "lo" else hi + one + r
        done = [False] * m
        progress = self.scatter_to_gather  # off: every call a general scatter (AE-10's (b))
        while progress:
            progress = False
            for i, a in enumerate(args):
                if done[i]:
                    continue
                a_sub = sym.substitute(a, solved) if solved else a
                free = _uses(a_sub, dvars) - set(solved)
                if not free:
                    continue
                pure_free = [v for v in free if E.is_var(v)]
                cands = pure_free if len(pure_free) == 1 else (
                    list(free) if len(free) == 1 else [])
                if not cands:
                    continue
                v = cands[0]
                sol = _solve(a_sub, v, targets[i])
                if sol is None:
                    continue
                s, ms, dims = sol
                solved = {k: sym.substitute(e, {v: s}) for k, e in solved.items()}
                solved[v] = s
                masks += ms
                new_dims += dims
                done[i] = True
                progress = True
        # an RVar tied to the point by a congruence only has one value there: solve it (its
        # range check below replaces the congruence)
        kept = []
        for mk in masks:
            hit = _congruence(mk, domain, solved)
            if hit is None:
                kept.append(mk)
                continue
            r, sol = hit
            sol = sym.substitute(sol, solved) if solved else sol  # in the written point only
            solved = {k: sym.substitute(e, {r: sol}) for k, e in solved.items()}
            solved[r] = sol
        masks = kept
        # clamp the solutions into their variables' ranges, mask outside; a solution that
        # stays inside over the known range of the written point (the clamp's [lo, hi], an
        # edge's overhang) needs neither
        known = self._edge_env(edges, us, new_dims)
        subst = {}
        for v, s in solved.items():
            lo, ext = domain[v]
            hi = lo + ext - sym.const(1, I32)
            if known is not None and _inside(s, lo, hi, known):
                subst[v] = s
                continue
            subst[v] = sym.clamp(s, lo, hi)
            masks.append(sym.logical_and(sym.ge(s, lo), sym.le(s, hi)))
        rdims = [(leaf, lo, ext) for leaf, (lo, ext) in domain.items() if leaf not in solved]
        rdims += new_dims
        value = sym.substitute(adj, subst) if subst else adj
        # a partial gather: the solved dimensions are pure (race-free); an unsolved argument
        # may read them (Listing 1's d_grid(x, y, fz(guide(x.., y..)), c) += ...: the z of a
        # pixel of the cell's preimage); it reads the clamped solutions, so a masked-off term
        # still writes (zero) inside the region
        if any(e is not None and not done[i] for i, e in edges.items()):
            return None
        lhs = [written[i] if done[i] else sym.substitute(a, subst) if subst else a
               for i, a in enumerate(args)]
        mask = None
        for mk in masks + ([predicate] if predicate is not None else []):
            mk = sym.substitute(mk, subst) if subst else mk
            mask = mk if mask is None else sym.logical_and(mask, mk)
        to_pure = dict(zip(us, self.adjoint_vars(m)))
        value, mask = (sym.substitute(v, to_pure) if v is not None else None
                       for v in (value, mask))
        lhs = [sym.substitute(a, to_pure) for a in lhs]
        rdims = [(leaf, sym.substitute(lo, to_pure), sym.substitute(ext, to_pure))
                 for leaf, lo, ext in rdims]
        return _Contribution(lhs, value, rdims, mask)

    # ---- building the adjoint Funcs -----------------------------------------------------
    def _buffer_adjoint(self, buf, contribs):
        """A Buffer's adjoint. Its scatters (updates at data-dependent points)
        accumulate in an intermediate Func when every one of them passes a dimension of at
        least 4 points through unchanged (a pixel's channels): unlike the adjoint, which
        takes the layout of the array it is realized into, an intermediate can be stored
        with that dimension innermost, so each scattered point is one vector
        read-modify-write (``auto_schedule``'s scatter lanes); the adjoint then reads it."""
        name, t, dims = f"{buf.name()}_d", buf.type(), buf.dimensions()
        us = self.adjoint_vars(dims)
        scatters = [c for c in contribs if any(sym.calls([a], E.CALL) for a in c.lhs)]
        lanes = set(range(1, dims))
        for c in scatters:
            moved = {leaf for a, u in zip(c.lhs, us) if a is not u for leaf in _uses(a, us)}
            lanes &= {k for k, (a, u) in enumerate(zip(c.lhs, us)) if a is u and u not in moved}
        if not scatters or not all(c.rdims for c in scatters) or not any(
                buf.dim(k).extent() >= 4 for k in lanes):
            return self._materialise(buf, name, t, dims, contribs)
        inner = self._materialise(buf, f"{name}_scattered", t, dims, scatters)
        xs = [E.Var(u.key) for u in us]
        direct = [c for c in contribs if c not in scatters]
        whole = _Contribution(us, inner[tuple(xs)].node, [], None)
        return self._materialise(buf, name, t, dims, direct + [whole])

    def _materialise(self, obj, name, t, dims, contribs):
        f = Func(name)
        us = self.adjoint_vars(dims)
        xs = [E.Var(u.key) for u in us]
        pure_terms, updates = [], []
        for c in contribs:
            if not c.rdims and all(a is u for a, u in zip(c.lhs, us)):
                pure_terms.append(c)
            else:
                updates.append(c)
        total = E.cast(t, 0)
        for c in pure_terms:
            total = total + self._value(c, t, {})
        f[tuple(xs)] = total
        for c in updates:
            rename = {}
            if c.rdims:
                r = E.RDom([(E.Expr(_node=lo), E.Expr(_node=ext)) for _, lo, ext in c.rdims])
                for (leaf, _, _), rv in zip(c.rdims, r):
                    rename[leaf] = rv.node
            lhs = [sym.substitute(a, rename) if rename else a for a in c.lhs]
            key = tuple(E.Expr(_node=a) for a in lhs)
            f[key] = f[key] + self._value(c, t, rename)
        return f

    @staticmethod
    def _value(c, t, rename):
        v = sym.substitute(c.value, rename) if rename else c.value
        e = E.cast(t, E.Expr(_node=v))
        if c.mask is not None:
            mk = sym.substitute(c.mask, rename) if rename else c.mask
            e = E.select(E.Expr(_node=mk), e, E.cast(t, 0))
        return e


def propagate_adjoints(output, adjoint=None, *, scatter_to_gather=True):
    """Adjoints of every Func, Buffer and Param ``output`` depends on.

    ``propagate_adjoints(loss)`` for a zero-dimensional float Func (seed 1), or
    ``propagate_adjoints(func, adjoint)`` with ``adjoint`` a numpy array / Buffer of the
    output's shape (numpy order), holding dL/d func over the region it covers.
    Regions are inferred from the current Buffer sizes and Param values.
    ``scatter_to_gather=False`` keeps every adjoint a general scatter over its consumer's
    domain (the paper's comparison of §4.2.1: same values, far slower code)."""
    require_float_func(output, "propagate_adjoints")
    t = output.type()
    n = output.dimensions()
    if adjoint is None:
        if n != 0:
            raise FuncError(
                f"propagate_adjoints({output.name()}): a {n}-dimensional output needs an adjoint"
                " buffer (propagate_adjoints(f, d_f)); only a scalar loss has the seed 1"
            )
        seed = Func(E.cast(t, 1), name=f"{output.name()}_d")
        region = []
    else:
        buf = adjoint if isinstance(adjoint, Buffer) else Buffer(
            np.ascontiguousarray(np.asarray(adjoint, dtype=t.dtype)), name=f"{output.name()}_dout")
        if buf.dimensions() != n:
            raise FuncError(
                f"propagate_adjoints: the adjoint buffer has {buf.dimensions()} dimensions,"
                f" {output.name()} has {n}"
            )
        region = [(buf.dim(k).min(), buf.dim(k).extent()) for k in range(n)]
        seed = _boundary.constant_exterior(buf, E.cast(t, 0))
        seed_named = Func(f"{output.name()}_d")
        vs = [E.Var(f"_d{k}") for k in range(n)]
        seed_named[tuple(vs)] = E.cast(t, seed[tuple(vs)])
        seed = seed_named
    return _Adjoints(output, seed, region, scatter_to_gather).run()
