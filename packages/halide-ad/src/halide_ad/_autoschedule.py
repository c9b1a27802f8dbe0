"""``auto_schedule``: the gradient-pipeline auto-scheduler of Li et al. 2018, §4.4 (CPU).

Decisions, in order (spec §4.2 normative rules, §4.3 default thresholds):

1. **Checkpoint or inline** (consumers before producers). Outputs and Funcs with update
   definitions (scatters, reductions) are computed at the root. With ``rule="pointwise"``
   (the default; the research code's rule, spec §4.3) only trivial Funcs (one call, no float
   arithmetic: boundary conditions) and Funcs read element-wise by exactly one Func are
   inlined, so a stencil is never recomputed per consumer tap. With ``rule="paper"`` (§4.2)
   a pure Func is inlined unless more than one realised Func calls it (calls through inlined
   Funcs count for the Func they are inlined into); on stencil chains such as the bilateral
   grid's blurs this recomputes each stage per tap (5 x 5 x 5 loads per grid read).
   ``inline`` / ``no_inline`` override both. A boundary condition of an input Buffer that
   is gathered at data-dependent points is copied at the root instead: with its channels
   innermost when every such read passes them through (a sampler's corners then read one
   line for all channels), else padded when the gathers cover 16x its size and its strides
   alias in L1 (``_interleaved_gather``, ``_staged_gather``).
2. **Bounds** of every Func from the output estimates (numeric, as at ``realize``).
3. **Pure definitions** of root Funcs: 16x16 tiles over two dimensions large enough, the tile
   index fused and parallel, the inner tile row vectorised by 8; else 256-wide strips of the
   largest dimension; else serial.
4. **Updates**: a scatter whose scattered coordinates do not read some pure Vars loops over
   those innermost (the coordinates computed once for all of them) and in parallel over the
   others, when they give ``min_threads`` iterations. Otherwise, when the pure dimensions
   cannot be tiled but the RVars can, ``rfactor``
   (only when the update is provably an associative ``+ * min max`` reduction). 2-D: the
   first large RVar becomes a pure dimension of the intermediate, whose column-wise partial
   reductions are parallel over 16-wide strips and vectorised. 1-D: the long RVar is split
   into 16 lanes x 16 x chunks, lanes vectorised and chunks parallel. Otherwise the update's
   pure Vars are tiled like a pure definition (RVars innermost), or fused and parallel, or
   (a scatter) left serial.

5. **Fusion** (``fuse=True``, the default): consecutive updates (of one Func, or of root
   Funcs next to each other) are computed with the first of their run (``compute_with``) at
   the innermost loop the lowering accepts (same loop kinds, equal extents or guards, no
   dependence broken: several updates of one Func only if they add and read it only where
   they add; the same parallel points): the k scatters and coordinate gradients that
   ``propagate_adjoints`` makes of a k-tap gather run as one pass over its domain, the
   coordinates, weights and loads computed once per iteration.

``compute_at`` is not used (paper: "We currently do not use compute_at").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from core_ad import codegen, sym

from . import _expr as E
from ._bounds import const_value, interval
from ._cuda import MAX_BLOCK
from ._derivative import _AllRootGraph, _values
from ._func import Func, FuncError, Stage, callee
from ._graph import Graph
from ._lower import (
    _loop_chain,
    _lower_def,
    additive_update,
    fuse_stages,
    region_leaf,
    root_regions,
)
from ._rfactor import check_rfactor, rfactor
from ._schedule import ScheduleError, StageSchedule
from ._storage import ALIAS_BYTES

__all__ = ["AutoSchedule", "auto_schedule"]

_RULES = ("pointwise", "paper")
_DIM_RULES = ("paper", "largest")


@dataclass
class AutoSchedule:
    """What ``auto_schedule`` decided: ``levels`` maps each Func name to ``"inline"`` or
    ``"root"`` with the reason, ``stages`` each scheduled stage to its directives, and
    ``rfactored`` the intermediate Funcs created by rfactor."""

    levels: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)
    rfactored: list = field(default_factory=list)
    _owners: dict = field(default_factory=dict, repr=False)  # key -> fid

    def key(self, f) -> str:
        """``f``'s key in ``levels`` and ``stages``: its name, or its unique id when another
        Func of the pipeline has the same name."""
        owner = self._owners.setdefault(f.name(), f.fid)
        return f.name() if owner == f.fid else f.fid

    def __str__(self):
        lines = [f"{name}: {lvl}" for name, lvl in self.levels.items()]
        lines += [f"  {st}: {'; '.join(ds) or 'serial'}" for st, ds in self.stages.items()]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Options:
    tile_w: int
    tile_h: int
    vector: int
    min_threads: int
    dims: str
    channel: int = 4  # GPU: the third tile size (over the fused remaining dimensions)
    gpu_min_parallel: int = 4096  # GPU: pure points below which a reduction goes parallel


def auto_schedule(outputs, estimates=None, target="cpu", inline=(), no_inline=(),
                  rule="pointwise", dims="paper", tile=(16, 16), vector_width=8, min_threads=8,
                  fuse=True):
    """Schedule every Func of the pipeline computing ``outputs`` (a Func or a list).

    ``estimates``: ``{output Func: [extent, ...]}`` or ``[(min, extent), ...]`` per output (x
    first, as ``realize``); an output missing from it uses its ``set_estimates``. Input sizes
    are the Buffers' own. ``inline`` / ``no_inline``: Funcs (or their names) to inline / to
    compute at the root whatever the rules say. ``fuse``: step 5 (False leaves every update
    its own loop nest, for comparison). Existing schedules of these Funcs are replaced.
    Returns an :class:`AutoSchedule` describing the decisions.
    """
    if target not in ("cpu", "gpu"):
        raise ScheduleError(f"auto_schedule: target must be 'cpu' or 'gpu', got {target!r}")
    gpu = target == "gpu"
    if rule not in _RULES:
        raise ScheduleError(f"auto_schedule: rule must be one of {_RULES}, got {rule!r}")
    if dims not in _DIM_RULES:
        raise ScheduleError(f"auto_schedule: dims must be one of {_DIM_RULES}, got {dims!r}")
    sizes = (*tile, vector_width, min_threads)
    if len(tile) != 2 or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in sizes):
        raise ScheduleError("auto_schedule: tile (two sizes), vector_width and min_threads must"
                            f" be positive integers, got {tile}, {vector_width}, {min_threads}")
    outputs = [outputs] if isinstance(outputs, Func) else list(outputs)
    opts = _Options(int(tile[0]), int(tile[1]), int(vector_width),
                    1 if gpu else int(min_threads), dims)
    if gpu and opts.tile_w * opts.tile_h * opts.channel > MAX_BLOCK:
        raise ScheduleError(f"auto_schedule: GPU tiles of {opts.tile_w} x {opts.tile_h} x"
                            f" {opts.channel} threads; a CUDA block holds at most {MAX_BLOCK}")
    graph = _AllRootGraph(outputs)
    funcs = {fid: graph.funcs[fid] for fid in reversed(graph.order)}  # consumers first
    forced_inline = _resolve(inline, funcs, "inline")
    forced_root = _resolve(no_inline, funcs, "no_inline")
    both = forced_inline & forced_root
    if both:
        raise ScheduleError("auto_schedule: " + ", ".join(sorted(funcs[f].name() for f in both))
                            + " in both inline and no_inline")
    for fid in forced_inline:
        f = funcs[fid]
        if f in outputs or f.has_update_definition():
            what = "a pipeline output" if f in outputs else "a Func with update definitions"
            raise ScheduleError(f"auto_schedule: {f.name()} is {what} and cannot be inlined")
    values = _values(graph)
    missing = [p for p in graph.params if p not in values]
    if missing:
        names = ", ".join(E.PARAMS[p.key].name() for p in missing if p.key in E.PARAMS)
        raise FuncError(f"auto_schedule: set the Params {names} first (bounds need them)")
    regions = root_regions(graph, _output_regions(outputs, estimates), values)
    sizes = {fid: ([e for _, e in regions[fid]], np.dtype(f.types()[0].dtype).itemsize)
             for fid, f in graph.funcs.items() if fid in regions}
    sizes.update({fid: (list(reversed(b.numpy().shape)), b.numpy().itemsize)
                  for fid, b in graph.buffers.items() if not b.on_device})

    result = AutoSchedule()
    interleaved = None if gpu else {}
    inlined = _choose_levels(graph, funcs, outputs, forced_inline, forced_root, rule, result,
                             sizes, opts, interleaved)
    # intermediates stored with a scattered-along Var innermost, and interleaved copies of
    # gathered Buffers (decided before their consumers are scheduled, which read them across
    # that Var)
    lanes_of = {} if gpu else {
        fid: lanes for fid, f in funcs.items() if fid not in inlined and f not in outputs
        and (lanes := _scatter_lanes(f, dict(zip(f._pure_arg_names,
                                                 (e for _, e in regions[fid]))), opts))}
    lanes_of.update(interleaved or {})
    for fid, f in funcs.items():
        f.store_level = f.storage_order = None
        for d in f.definitions():
            d.schedule = StageSchedule(dims=d._initial_dims())
        if fid in inlined:
            f.compute_inline()
            continue
        f.compute_root()
        ext = {n: e for n, (_, e) in zip(f._pure_arg_names, regions[fid])}
        pure = [(n, ext[n]) for n in f._pure_arg_names]
        if gpu:
            result.stages[result.key(f)] = _gpu_tile(f, pure, opts)
            for k, ldef in enumerate(graph.defs[fid][1:]):
                _gpu_schedule_update(f, k, ldef, ext, values, opts, result)
            continue
        lanes = lanes_of.get(fid)
        if fid in (interleaved or {}):
            result.stages[result.key(f)] = _interleave(f, pure, lanes, opts)
        elif lanes is not None:
            result.stages[result.key(f)] = _vector_innermost(f, pure, lanes, opts)
        else:
            nodes = _def_nodes(f._definition())
            across = _read_across(nodes, lanes_of, funcs, inlined, set(f._pure_arg_names))
            result.stages[result.key(f)] = _parallelize(
                f, pure, opts, reads=(nodes, sizes), across=across) or []
        for k, ldef in enumerate(graph.defs[fid][1:]):
            _schedule_update(f, k, ldef, ext, values, opts, result, sizes, lanes)
    if fuse and not gpu:  # GPU loops do not fuse (each definition is one kernel)
        _fuse_updates(outputs, result, regions, values)
    return result


def _fuse_updates(outputs, result, regions, values):
    """Step 5: each update of a root Func joins the fused run of the update before it (of
    its own Func, or the last run of an earlier root Func: the coordinate gradients of a
    gather are often separate Funcs, one per coordinate), at the innermost of the run's loops
    that ``fuse_stages`` accepts; or it starts a new run."""
    g = Graph(outputs)
    roots = [fid for fid in g.order if g.levels[fid].kind == "root"]
    order = [(fid, ld.index) for fid in roots for ld in g.defs[fid]]
    stmts = {(fid, k): _lower_def(g, fid, g.defs[fid][k]) for fid, k in order}
    env = {leaf: (sym.const(v, leaf.dtype),) * 2 for leaf, v in values.items()}
    for fid, reg in regions.items():
        for d, (lo, ext) in enumerate(reg):
            for w, v in (("min", lo), ("extent", ext)):
                env[region_leaf(fid, d, w)] = (sym.const(v, np.int32),) * 2
    first = None
    for ld in (ld for fid in roots for ld in g.defs[fid][1:]):
        sched = ld.source.schedule
        for k, dm in enumerate(first.schedule.dims if first is not None else ()):
            n = len(first.schedule.dims) - k  # innermost first: the loops shared
            if ld.func is not first.func and not _same_trips(
                    stmts[(first.func.fid, first.index)], stmts[(ld.func.fid, ld.index)], n, env):
                continue  # other Funcs: only loops over the same domain (not one guarded)
            sched.compute_with = (first.func, first.index, dm.name)
            try:
                fuse_stages(g, order, stmts)
            except ScheduleError:
                continue
            result.stages.setdefault(
                f"{result.key(ld.func)}.update({ld.index - 1})", []).append(
                f"compute_with({result.key(first.func)}.update({first.index - 1}), {dm.name})")
            break
        else:
            sched.compute_with = None
            first = ld


def _same_trips(a, b, n, env):
    """The ``n`` outermost loops of the nests ``a`` and ``b`` run equal trip counts at the
    estimated sizes ``env``: constant ones, or (tiles) the same function of the enclosing
    loops once the sizes are substituted."""
    try:
        pairs = list(zip(_loop_chain(a, n, ""), _loop_chain(b, n, "")))
    except ScheduleError:  # fewer loops than n
        return False
    sizes = {leaf: lo for leaf, (lo, _) in env.items()}
    outer = {}  # b's loop variables -> a's
    for fa, fb in pairs:
        ia, ib = interval(fa.extent, env), interval(fb.extent, env)
        ends = [None if iv is None else const_value(iv[j]) for iv in (ia, ib) for j in (0, 1)]
        if None in ends or len(set(ends)) != 1:
            ea = sym.substitute(fa.extent, sizes)
            if ea is not sym.substitute(fb.extent, {**sizes, **outer}):
                return False
        outer[fb.leaf] = fa.leaf
    return True


# ---- inputs ---------------------------------------------------------------------------------


def _resolve(items, funcs, what):
    """fids of the Funcs (or names) in ``items``; anything else raises a ScheduleError."""
    if isinstance(items, (Func, str)):
        items = [items]
    by_name: dict = {}
    for fid, f in funcs.items():
        by_name.setdefault(f.name(), []).append(fid)
    out = set()
    for it in items:
        if isinstance(it, Func):
            if it.fid not in funcs:
                raise ScheduleError(f"auto_schedule: {what} names Func {it.name()}, which the"
                                    " pipeline does not use")
            out.add(it.fid)
        elif isinstance(it, str):
            hits = by_name.get(it, [])
            if len(hits) != 1:
                why = "no Func" if not hits else f"{len(hits)} Funcs"
                raise ScheduleError(
                    f"auto_schedule: {what} names {it!r}, but the pipeline has {why} of that"
                    f" name (its Funcs: {', '.join(sorted(by_name))}); pass the Func itself")
            out.add(hits[0])
        else:
            raise ScheduleError(f"auto_schedule: {what} takes Funcs or Func names, got"
                                f" {type(it).__name__}")
    return out


def _output_regions(outputs, estimates):
    if estimates is None:
        estimates = {}
    elif not isinstance(estimates, dict):
        estimates = dict(zip(outputs, estimates)) if len(estimates) == len(outputs) and all(
            isinstance(e, (list, tuple)) for e in estimates) else {outputs[0]: estimates}
    out = {}
    for f in outputs:
        est = estimates.get(f)
        if est is None:
            est = [f.bound_estimates.get(n) for n in f._pure_arg_names]
            if any(e is None for e in est):
                raise ScheduleError(
                    f"auto_schedule: no size estimate for output {f.name()}: pass"
                    f" estimates={{{f.name()}: [extent, ...]}} or call set_estimates")
        if len(est) != f.dimensions():
            raise ScheduleError(f"auto_schedule: {f.name()} has {f.dimensions()} dimension(s),"
                                f" its estimate {list(est)} has {len(est)}")
        out[f.fid] = [(int(e[0]), int(e[1])) if isinstance(e, (list, tuple)) else (0, int(e))
                      for e in est]
    return out


# ---- step 1: inline or root -----------------------------------------------------------------


def _callers(graph):
    """fid -> {fid of each Func whose definitions call it}, over the unscheduled graph."""
    out = {fid: set() for fid in graph.order}
    for fid in graph.order:
        for d in graph.funcs[fid].definitions():
            for c in sym.calls(_def_nodes(d), E.CALL):
                g = c.params["fid"]
                if g in out and g != fid:
                    out[g].add(fid)
    return out


def _def_nodes(d):
    nodes = list(d.args) + list(d.values)
    if d.predicate is not None:
        nodes.append(d.predicate)
    for rd in d.rdoms:
        nodes += [b.node for pair in rd.bounds for b in pair]
    return nodes


def _is_trivial(f):
    """At most one call and no float arithmetic outside call coordinates (a boundary
    condition, a cast-free copy, a constant): inlining it costs no more than a load.
    (Counting coordinate clamps and selects as work roots every boundary wrapper; on the
    3x3 blur gradient that made the pipeline slower, 65-69 ms against 48-55 ms at 1024^2.)"""
    if len(f._pure.values) != 1:
        return False
    v = f._pure.values[0]
    calls = sym.calls(v, E.CALL)
    nodes = sym.toposort([v], stop={id(c) for c in calls})  # coordinates are not work
    return len(calls) <= 1 and not any(
        isinstance(n, sym.Apply) and not E.is_call(n) and n.dtype.kind == "f"
        and n.prim.name != "select" for n in nodes)


def _elementwise(f, caller):
    """Every call of ``f`` in ``caller`` has exactly the caller definition's coordinates."""
    for d in caller.definitions():
        for c in sym.calls(_def_nodes(d), E.CALL):
            if c.params["fid"] == f.fid and not (
                    len(c.args) == len(d.args) and all(a is b for a, b in zip(c.args, d.args))):
                return False
    return True


#: a Buffer gathered from at data-dependent points this many times its size is worth a copy
STAGE_REUSE = 16
#: the longest run of a gathered Buffer's pass-through dimension (bytes) worth interleaving
INTERLEAVE_BYTES = 256


def _wrapped_buffer(graph, f):
    """The host Buffer that trivial Func ``f`` (a boundary condition) wraps, or None."""
    (v,) = f._pure.values
    calls = sym.calls(v, E.CALL)
    buf = graph.buffers.get(calls[0].params["fid"]) if calls else None
    return None if buf is None or buf.on_device else buf


def _gathers(graph, f, callers):
    """(caller fid, call) for each call of ``f`` whose coordinates read data."""
    return [(c, call) for c in sorted(callers) for d in graph.funcs[c].definitions()
            for call in sym.calls(_def_nodes(d), E.CALL)
            if call.params["fid"] == f.fid and any(sym.calls([a], E.CALL) for a in call.args)]


def _staged_gather(graph, f, callers, sizes):
    """Why a trivial Func wrapping an input Buffer (a boundary condition) is worth computing
    at the root, or None. A caller gathers from it at data-dependent points over a domain at
    least ``STAGE_REUSE`` times the Buffer's size, and the Buffer has an outer stride that is
    a multiple of 4 KiB: its columns (or channels) then share one L1 cache set, and the
    gathers thrash it, while root storage is padded (``padded_empty``). A bilateral grid
    (4 x 12 x 8 x 64 x 64) sliced at 1024^2 pixels: the slice and its guide adjoint 2.3x
    faster for a 6 MiB copy."""
    buf = _wrapped_buffer(graph, f)
    if buf is None:
        return None
    arr = buf.numpy()
    if not any(st % ALIAS_BYTES == 0 for st, n in zip(arr.strides[:-1], arr.shape[:-1])
               if n > 1):
        return None
    for c in dict.fromkeys(c for c, _ in _gathers(graph, f, callers)):
        domain = int(np.prod(sizes[c][0])) if c in sizes else 0
        if domain >= STAGE_REUSE * arr.size:
            return (f"root (gathered at data-dependent points by {graph.funcs[c].name()}, "
                    f"{domain // arr.size}x its size: a padded copy)")
    return None


def _interleaved_gather(graph, f, callers, sizes, opts):
    """(why, dimension) when a trivial Func wrapping an input Buffer is worth a copy at the
    root with one dimension stored innermost, or None: every read of it at data-dependent
    points passes that dimension through as a loop variable that the caller does not tile
    (the channel of a bilinear sample), its run is 4 elements to ``INTERLEAVE_BYTES`` long, and some such caller covers
    the Buffer's size. Interleaved, a gathered point's channels share cache lines: a
    sampler's 4 corners x 16 channels touch 4 lines, not 64 lines in 16 planes (which, a
    multiple of 4 KiB apart, also share L1 sets). Spatial transformer, 4 x 16 x 512^2, one
    thread: forward 74 -> 44 ms, coordinate gradients 137 -> 74 ms, for a 27-30 ms copy."""
    buf = _wrapped_buffer(graph, f)
    gathers = _gathers(graph, f, callers)
    if buf is None or not gathers:
        return None
    names, arr = f._pure_arg_names, buf.numpy()
    candidates = set(range(1, len(names)))  # dimension 0 is innermost already
    for c, call in gathers:
        caller = graph.funcs[c]
        plan = _tiling(list(zip(caller._pure_arg_names, sizes[c][0])), opts) \
            if c in sizes else None
        tiled = set(plan[1:]) if plan else set()  # its rows are streamed, not its channels
        candidates &= {k for k, a in enumerate(call.args)
                       if E.is_rvar(a) or (E.is_var(a) and a.key not in tiled)}
    extents = list(reversed(arr.shape))
    runs = [k for k in sorted(candidates)  # ties: the inner dimension
            if opts.vector // 2 <= extents[k] and extents[k] * arr.itemsize <= INTERLEAVE_BYTES]
    covering = [c for c, _ in gathers
                if c in sizes and int(np.prod(sizes[c][0])) >= arr.size]
    if not runs or not covering:
        return None
    k = max(runs, key=lambda k: extents[k])
    return (f"root (gathered at data-dependent points by {graph.funcs[covering[0]].name()}:"
            f" a copy with {names[k]} innermost, so a point's {extents[k]} values share cache"
            " lines)", names[k])


def _choose_levels(graph, funcs, outputs, forced_inline, forced_root, rule, result, sizes,
                   opts, interleaved=None):
    """The Funcs to inline; ``interleaved`` (CPU; None on the GPU) collects the root copies of
    gathered Buffers stored with a dimension innermost (fid -> its Var name)."""
    callers = _callers(graph)
    inlined, elementwise = set(), set()
    realised_callers: dict = {}  # fid -> fids of the realised Funcs its values end up in
    for fid, f in funcs.items():  # consumers first, so every caller is decided
        eff = set()
        for c in callers[fid]:
            eff |= realised_callers[c] if c in inlined else {c}
        if fid in forced_inline:
            why = "inline (user)"
        elif fid in forced_root:
            why = "root (user)"
        elif f in outputs:
            why = "root (output)"
        elif f.has_update_definition():
            why = "root (scatters or reduces)"
        elif rule == "paper":
            why = ("root (called by " + ", ".join(sorted(funcs[c].name() for c in eff)) + ")"
                   if len(eff) > 1 else "inline (one caller)")
        elif _is_trivial(f):
            inter = (None if interleaved is None else
                     _interleaved_gather(graph, f, callers[fid], sizes, opts))
            if inter:
                why, interleaved[fid] = inter
            else:
                why = _staged_gather(graph, f, callers[fid], sizes) or "inline (trivial)"
        elif len(callers[fid]) == 1:
            (c,) = callers[fid]
            ok = _elementwise(f, funcs[c]) and (c not in inlined or c in elementwise)
            why = "inline (element-wise, one caller)" if ok else "root (not element-wise)"
            if ok:
                elementwise.add(fid)
        else:
            why = "root (several callers)"
        result.levels[result.key(f)] = why
        if why.startswith("inline"):
            inlined.add(fid)
            realised_callers[fid] = eff
    return inlined


# ---- steps 3-4: loops ---------------------------------------------------------------------


def _tiling(pure, opts):
    """("2d", W, H) / ("1d", L) / None for the pure dimensions ``[(name, extent)]``."""
    tw, th = opts.tile_w, opts.tile_h
    if opts.dims == "paper":  # the first two dimensions large enough, in order
        big = [(n, e) for n, e in pure if e >= min(tw, th)]
        pair = big[:2]
    else:  # the two largest, the lower index inner
        top = sorted(sorted(pure, key=lambda p: -p[1])[:2], key=pure.index)
        pair = [p for p in top if p[1] >= min(tw, th)]
    if len(pair) == 2:
        (w, ew), (h, eh) = pair
        if ew >= tw and eh >= th and (ew // tw) * (eh // th) >= opts.min_threads:
            return ("2d", w, h)
    if pure:
        name, e = max(pure, key=lambda p: p[1])
        if e >= tw * th and e // (tw * th) >= opts.min_threads:
            return ("1d", name)
    return None


def _read_across(nodes, lanes_of, funcs, inlined, pure_names, depth=0):
    """The pure Vars (of ``pure_names``) that index the innermost storage dimension of an
    intermediate read by ``nodes`` (``lanes_of``: fid -> that dimension's Var), looking
    through inlined Funcs that keep the coordinate in its dimension (boundary conditions)."""
    def var_of(a):  # the one pure Var a coordinate reads (clamped, shifted), or None
        vs = {v.key for v in sym.free_leaves(a) if E.is_var(v)}
        return vs.pop() if len(vs) == 1 and vs <= pure_names else None

    found = []
    for c in sym.calls(nodes, E.CALL):
        g = funcs.get(c.params["fid"])
        if g is None:
            continue
        if g.fid in lanes_of:
            found.append(var_of(c.args[g._pure_arg_names.index(lanes_of[g.fid])]))
        elif g.fid in inlined and depth < 4:
            inner = _read_across(_def_nodes(g._definition()), lanes_of, funcs, inlined,
                                 set(g._pure_arg_names), depth + 1)
            # g's Var v is the caller's coordinate in the same dimension
            found += [var_of(c.args[g._pure_arg_names.index(v)]) for v in inner]
    return [v for v in dict.fromkeys(found) if v is not None]


def _parallelize(stage, pure, opts, rvars=(), reads=None, across=()):
    """Apply the tiling of ``pure`` to ``stage`` (a Func or an update Stage): parallel over
    tiles (outermost), the inner tile row vectorised and innermost (an update's RVars
    ``rvars`` [(RVar, extent)] inside it); ``reads``: (its expressions, the sizes of what
    they read) for ``_gather_plane``; ``across``: pure Vars that index the innermost storage
    dimension of what it reads (just outside the vector loop: each vector's gathered lines
    serve every value of them). Returns the directives, or None when the domain is too small
    to tile."""
    plan = _tiling(pure, opts)
    if plan is None:
        return None
    v = opts.vector
    if plan[0] == "2d":
        _, w, h = plan
        wi, hi, t = f"{w}.ti", f"{h}.ti", f"{w}.{h}.t"
        tw, th = opts.tile_w, opts.tile_h
        if dict(pure)[w] >= tw * th and not (reads and _warped(reads[0], {w, h})):
            tw, th = tw * th, 1
        stage.tile(w, h, wi, hi, tw, th).fuse(w, h, t)
        done = [f"tile({w}, {h}, {tw}, {th})", f"parallel({t})"]
    else:
        _, w = plan
        wi, t = f"{w}.ti", w
        width = opts.tile_w * opts.tile_h
        stage.split(w, w, wi, width)
        done = [f"split({w}, {width})", f"parallel({w})"]
    stage.vectorize(wi, v)
    done.append(f"vectorize({wi}, {v})")
    tiled = {w, wi} | ({h, hi} if plan[0] == "2d" else set())
    inner = [] if isinstance(stage, Stage) else _invariant_heavy(stage, pure, tiled)
    inner += [n for n in across if n not in tiled and n not in inner]
    plane = 0 if reads is None else _gather_plane(*reads, {n for n in tiled if n in dict(pure)})
    inner, chunked = _chunk_planes(stage, inner, pure, plane)
    done += chunked
    _order(stage, f"{wi}.v", t, inner)
    if inner:
        done.append(f"{', '.join(inner)} just outside the vector loop (most of the"
                    " arithmetic does not read it: computed once per vector)")
    others = [n for n, _ in pure if n not in tiled and n not in inner]
    if others:
        # the other pure loops (channels, images) join the parallel loop outside the tiles:
        # a task is one tile of one plane and the next task its neighbour, not the same tile
        # of every plane (64 planes of a 16x16 tile stream nothing)
        dims = [d.name for d in stage._definition().schedule.dims]
        stage.reorder([d for d in dims if d not in others] + others)
        for o in others:
            stage.fuse(t, o, f"{t}.{o}")
            t = f"{t}.{o}"
        done.append(f"fuse({', '.join(others)} into the parallel tiles)")
    stage.parallel(t)
    done += _chunk_reduction(stage, rvars, plane)
    return done


def _chunk_reduction(stage, rvars, plane):
    """An update reducing over planes it gathers from at data-dependent positions (a sampler's
    coordinate gradient summing over channels) reads ``CHANNEL_BYTES`` worth of planes per pass
    over the image: the outermost RVar's outer part goes outside the parallel tiles (each
    pixel still sums in the same order). Returns the directives."""
    if not rvars or not plane:
        return []
    rv, extent = rvars[-1]
    per = CHANNEL_BYTES // plane
    if extent <= per or per < 2:
        return []
    name, size = rv.name(), _chunk(extent, per)
    stage.split(name, name, f"{name}.i", size)
    dims = [dm.name for dm in stage._definition().schedule.dims]
    stage.reorder([dm for dm in dims if dm != name] + [name])
    return [f"split({name}, {size}): {size} planes per pass, the passes outside the tiles"]


# Bytes of the planes a channel loop just outside the vector loop visits per vector: a gather
# at data-dependent positions (a flow warp's random offsets) reads that many planes at once,
# and the reads miss the caches once they are too many. One thread, FlowNet's warp (64 planes
# of 1 MiB) / the spatial transformer's (16 planes of 1 MiB) forward: all planes 663 / 58 ms,
# one at a time 249 / 157 ms, 8 MiB of planes 249 / 74 ms (2 and 4 MiB: 275 / 87 ms).
CHANNEL_BYTES = 8 << 20


def _chunk_planes(stage, inner, pure, plane):
    """``inner`` with each Var whose planes (``plane`` bytes each, gathered at data-dependent
    positions) exceed ``CHANNEL_BYTES`` split: the inner part of ``CHANNEL_BYTES`` worth of
    planes stays just outside the vector loop, the outer part joins the other pure loops (or
    the whole Var does, if one plane is already that large). Returns (the new inner Vars,
    the directives)."""
    if not inner or not plane:
        return inner, []
    ext = dict(pure)
    per = CHANNEL_BYTES // plane
    out, done = [], []
    for name in inner:
        if ext[name] <= per:
            out.append(name)
        elif per >= 2:
            size = _chunk(ext[name], per)
            stage.split(name, name, f"{name}.i", size)
            out.append(f"{name}.i")
            done.append(f"split({name}, {size}): {size} planes per vector at a time")
    return out, done


def _chunk(extent, most):
    """A chunk size of at most ``most`` for a loop of ``extent``: the largest divisor if it is
    at least half of ``most`` (no ragged last chunk), else chunks of balanced size."""
    div = max(k for k in range(1, most + 1) if extent % k == 0)
    return div if 2 * div >= most else -(-extent // -(-extent // most))


def _gather_plane(nodes, sizes, tiled):
    """Bytes per plane of the largest read among ``nodes`` at data-dependent positions: the
    product of the extents of the dimensions whose coordinate reads data or a ``tiled`` Var
    (a flow warp's image: both; a bilateral grid's lookup: the depth bin only), times the
    element size; 0 when no read is data-dependent. ``sizes``: fid -> (extents, bytes)."""
    plane = 0
    for c in sym.calls(nodes, E.CALL):
        fid = c.params["fid"]
        if not any(_varies(a, tiled) for a in c.args):
            continue
        dims = [k for k, a in enumerate(c.args) if sym.calls([a], E.CALL) or any(
            E.is_var(v) and v.key in tiled for v in sym.free_leaves(a))]
        if fid in sizes:
            ext, item = sizes[fid]
            plane = max(plane, int(np.prod([ext[k] for k in dims])) * item)
    return plane


def _varies(node, tiled, depth=0):
    """Whether ``node`` reads data at points that move with the ``tiled`` Vars (a flow
    field ``warp[x, y]``: neighbouring pixels may sample far apart), looking through pure
    Funcs (a spatial transformer's ``sample_x[x, y, n]`` reads only ``theta[.., n]``: its
    positions are an affine map of the pixel's, and neighbours sample neighbours)."""
    for c in sym.calls([node], E.CALL):
        moving = [k for k, a in enumerate(c.args)
                  if any(E.is_var(v) and v.key in tiled for v in sym.free_leaves(a))]
        if not moving:
            continue
        f = callee(c.params["fid"])
        if not isinstance(f, Func) or f._updates or depth >= 4:
            return True
        inner = {f._pure_arg_names[k] for k in moving}
        if any(_varies(v, inner, depth + 1) for v in f._definition().values):
            return True
    return False


def _warped(nodes, tiled):
    """Whether some read among ``nodes`` is at positions computed from data that moves with
    the ``tiled`` Vars but not at random (``_varies`` false: an affine sampling grid, which
    may rotate or transpose): only then do square tiles pay, by reading a compact block.
    Everything else (stencils, element-wise reads, scattered reads) streams best in rows:
    16 x 16 tiles walk 16 rows per 64 bytes, more streams than the prefetchers follow
    (one thread: a bilateral slice's element-wise adjoint stages 331 -> 61 ms and its guide
    adjoint 284 -> 138 ms in 256 x 1 strips; the 3x3 blur gradient 14-17 -> 10-12 ms; the
    spatial transformer's forward 64 -> 81 ms, which is why it keeps its tiles)."""
    for c in sym.calls(nodes, E.CALL):
        for a in c.args:
            data = [d for d in sym.calls([a], E.CALL) if any(
                E.is_var(v) and v.key in tiled for x in d.args for v in sym.free_leaves(x))]
            if data and not _varies(a, tiled):
                return True
    return False


def _order(stage, vec, outer, inner=()):
    """Loops innermost first: the RVars, the vector loop, the pure loops ``inner``, the other
    pure loops, ``outer``. Inside the vector loop, a reduction's accumulator stays in a
    register across its RVars."""
    dims = stage._definition().schedule.dims
    rvars = [d.name for d in dims if not d.pure]
    rest = [d.name for d in dims if d.pure and d.name not in (vec, outer, *inner)]
    stage.reorder(rvars + [vec] + list(inner) + rest + [outer])


def _invariant_heavy(f, pure, tiled, share=0.5):
    """The untiled pure Vars of ``f`` (innermost first) that at most ``1 - share`` of its
    arithmetic reads, such as the channel of a bilinear sample whose coordinates and weights
    are per pixel: with its loop just outside the vector loop, LLVM computes the rest once per
    vector (hoisted out of it), not once per channel."""
    order = sym.toposort(list(f._definition().values))
    # value arithmetic only: the index arithmetic of a plain copy reads no channel either
    ops = [n for n in order if hasattr(n, "prim") and np.dtype(n.dtype).kind == "f"]
    out = []
    for name, extent in pure:
        if name in tiled or extent < 2 or len(ops) < 8:
            continue
        reads: set = set()
        for n in order:
            if (getattr(n, "kind", None) == "hl.var" and n.key == name) or any(
                    id(a) in reads for a in getattr(n, "args", ())):
                reads.add(id(n))
        if sum(id(n) not in reads for n in ops) >= share * len(ops):
            out.append(name)
    return out


def _rvar_extents(ldef, values):
    """[(RVar, constant extent)] of an update, innermost first."""
    env = {leaf: (sym.const(v, leaf.dtype), sym.const(v, leaf.dtype))
           for leaf, v in values.items()}
    out = []
    for (leaf, _, ext), (_, rv) in zip(ldef.rvars, ldef.source.rvars()):
        iv = interval(ext, env)
        e = None if iv is None else const_value(iv[0])
        if e is None or const_value(iv[1]) != e:
            raise ScheduleError(f"auto_schedule: the extent of {rv.name()} in"
                                f" {ldef.func.name()}{ldef.source.stage_name()} is not a"
                                " constant after substituting the estimates")
        out.append((rv, int(e)))
    return out


def _schedule_update(f, k, ldef, ext, values, opts, result, sizes=None, lanes=None):
    where = f"{result.key(f)}.update({k})"
    d = ldef.source
    pure = [(n, ext[n]) for n in d.pure_var_names()]
    rvars = _rvar_extents(ldef, values)
    stage = f.update(k)
    done = _scatter_order(stage, d, pure, ext, opts, lanes)
    if done is not None:
        result.stages[where] = done
        return
    rv = None if pure else _disjoint_rvar(f, ldef, values, opts)
    if rv is not None:
        # outermost, where the pipeline runs a loop in parallel: each point is written by
        # one iteration of it, so it still sees its updates in the same order (bit-identical)
        names = [d.name for d in stage._definition().schedule.dims]
        stage.reorder([n for n in names if n != rv.name()] + [rv.name()])
        stage._parallel_disjoint(rv)
        result.stages[where] = [f"parallel({rv.name()}: its writes are disjoint)"]
        return
    if _tiling(pure, opts) is None:
        # the vector lanes first: dense accumulators
        intm, new_dims, done = _rfactor_update(f, k, rvars, opts, result, new_dims_first=True)
        if intm is not None:
            _schedule_intermediate(f, intm, new_dims, pure, opts, result)
        result.stages[where] = done
        stage = f.update(k)
    done = _parallelize(stage, pure, opts, rvars, (list(d.values), sizes or {}))
    if done is None and pure:  # too small to tile: one parallel loop over the pure Vars
        names = [n for n, _ in pure]
        for a, b in zip(names, names[1:]):
            stage.fuse(a, b, b)
        stage.parallel(names[-1])
        done = [f"parallel({' * '.join(names)})"]
    result.stages.setdefault(where, [])
    result.stages[where] += done or []


def _rfactor_update(f, k, rvars, opts, result, new_dims_first=False):
    """Spec §4.3 step 4.2: ``(intermediate, its new dimensions [(name, extent)], directives)``
    of update ``k`` rfactored over its RVars ``rvars`` [(RVar, extent)]: 2-D, the first RVar
    of at least the tile width becomes the intermediate's Var (its first with
    ``new_dims_first``); 1-D, a long RVar in 256-wide strips (``_rfactor_1d``). The
    intermediate is None when the RVars are too small or the update is not provably
    associative (the directives then say why)."""
    large = [(rv, e) for rv, e in rvars if e >= opts.tile_w]
    longest = max(rvars, key=lambda p: p[1], default=(None, 0))
    strip = opts.tile_w * opts.tile_h
    try:
        if len(large) >= 2:
            rv, e = large[0]
            intm = rfactor(f, k, [(rv, E.Var(f"{rv.name().replace('.', '_')}_v"))],
                           new_dims_first=new_dims_first)
            new_dim = intm._pure_arg_names[0 if new_dims_first else -1]
            return intm, [(new_dim, e)], [f"rfactor({rv.name()}) -> {result.key(intm)}"]
        if longest[1] >= strip:
            intm = _rfactor_1d(f, k, *longest, opts)
            lanes, chunks = intm._pure_arg_names[-2:]
            return intm, [(lanes, opts.tile_w), (chunks, -(-longest[1] // strip))], [
                f"split({longest[0].name()}, {strip}, {opts.tile_w}), rfactor ->"
                f" {result.key(intm)}"]
    except ScheduleError as err:  # not provably associative: the reduction stays as it is
        return None, [], [f"rfactor skipped ({err})"]
    return None, [], []


def _disjoint_rvar(f, ldef, values, opts):
    """The outermost RVar of a scatter with no pure Vars (per-column histograms
    ``hist(r.x, bin(r.x, r.y)) += ..``) that some left-hand-side argument
    maps one-to-one onto the points it writes: the argument reads no other RVar and is the
    RVar itself or the RVar clamped to bounds that contain its whole range (under the
    estimates), so different iterations write different points and the loop may run in
    parallel. The update must read ``f`` only where it writes. None if there is no such RVar
    with at least ``min_threads`` iterations."""
    d = ldef.source
    if any(not all(a is b for a, b in zip(c.args, d.args))
           for c in sym.calls(_def_nodes(d), E.CALL) if c.params["fid"] == f.fid):
        return None
    env = {leaf: (sym.const(v, leaf.dtype), sym.const(v, leaf.dtype))
           for leaf, v in values.items()}
    rvar_ids = {id(leaf) for leaf, _, _ in ldef.rvars}
    for (leaf, lo, ext), (_, rv) in reversed(list(zip(ldef.rvars, d.rvars()))):
        span = interval(lo, env), interval(ext, env)
        if None in span or const_value(span[1][0]) is None \
                or const_value(span[1][0]) < opts.min_threads:
            continue
        first = const_value(span[0][0])
        last = None if first is None else first + const_value(span[1][0]) - 1
        for a in d.args:
            if {id(n) for n in sym.free_leaves(a) if id(n) in rvar_ids} != {id(leaf)}:
                continue
            if a is leaf:
                return rv
            if isinstance(a, sym.Apply) and a.prim.name == "clamp" and a.args[0] is leaf \
                    and last is not None:
                bounds = [interval(b, env) for b in a.args[1:]]
                if None not in bounds and const_value(bounds[0][1]) is not None \
                        and const_value(bounds[1][0]) is not None \
                        and const_value(bounds[0][1]) <= first \
                        and last <= const_value(bounds[1][0]):
                    return rv
    return None


def _scattered_vars(d):
    """Names of the pure Vars read by the left-hand-side arguments of update ``d`` that are
    not its own pure Var (its scattered coordinates), or None if it scatters nothing."""
    names = d.func._pure_arg_names
    args = [a for k, a in enumerate(d.args) if not (E.is_var(a) and a.key == names[k])]
    if not args:
        return None
    return {v.key for a in args for v in sym.free_leaves(a) if E.is_var(v)}


def _scatter_lanes(f, ext, opts):
    """The pure Var of an intermediate Func that every update scatters along (no scattered
    coordinate reads it) and that is long enough for a vector, or None. Stored innermost
    (``reorder_storage``) and vectorised, a scatter then writes each point's run of it
    (the 12 affine coefficients of a bilateral grid cell, the channels of a pixel) with
    vector loads and stores instead of one scalar read-modify-write per element."""
    if not f._updates:
        return None
    names = f._pure_arg_names
    candidates = set(names[1:])  # dimension 0 is innermost already
    for d in f._updates:
        scattered = _scattered_vars(d)
        if scattered is None or not d.rvars():
            return None
        candidates -= scattered
        candidates &= {v.key for v in d.args if E.is_var(v)} & set(d.pure_var_names())
    lanes = [n for n in names if n in candidates and ext[n] >= opts.vector // 2]
    return max(lanes, key=ext.get, default=None)


def _lane_width(extent, opts, widest=None):
    """The vector width for a run of ``extent`` points: the widest power of two up to
    ``widest`` (default: the default width) that divides it (no partial vector: 12
    coefficients are 3 x 4), else the default."""
    w = widest or opts.vector
    while w > 4 and extent % w:
        w //= 2
    return w if extent % w == 0 else opts.vector


def _host_lanes(func, opts):
    """Lanes of one host SIMD register for ``func``'s type, at least the default width (16
    float32 lanes with AVX-512): the width of a vector along a run of points stored
    innermost (a scatter's channels), a choice the paper's tiles do not make."""
    return max(opts.vector, codegen.host_vector_width(func.types()[0].dtype))


def _vector_innermost(f, pure, lanes, opts):
    """The pure definition of a Func stored with ``lanes`` innermost: vectorised along it,
    the other loops fused into one parallel loop."""
    names = [n for n, _ in pure]
    f.reorder_storage([lanes] + [n for n in names if n != lanes])
    width = _lane_width(dict(pure)[lanes], opts)
    f.vectorize(lanes, width)
    others = [n for n in names if n != lanes]
    f.reorder([f"{lanes}.v", lanes] + others)
    # a task is a row of the next dimension, not one vector (whose index decomposition
    # would cost more than its stores)
    par = others[1:] or others
    for a, b in zip(par, par[1:]):
        f.fuse(a, b, b)
    f.parallel(par[-1])
    return [f"reorder_storage({lanes} innermost: every update scatters along it)",
            f"vectorize({lanes}, {width})", f"parallel({' * '.join(par)})"]


def _interleave(f, pure, lanes, opts):
    """The copy of a gathered Buffer stored with ``lanes`` innermost: vectorised along the
    Buffer's dense dimension, ``lanes`` just outside the vector loop (each vector's lines of
    the interleaved copy are completed in one pass over it), the rest fused and parallel.
    (Vectorised along ``lanes``, each vector would gather from ``lanes`` planes.)"""
    names = [n for n, _ in pure]
    f.reorder_storage([lanes] + [n for n in names if n != lanes])
    dense, others = names[0], [n for n in names[1:] if n != lanes]
    f.vectorize(dense, opts.vector)
    f.reorder([f"{dense}.v", lanes, dense] + others)
    for a, b in zip(others, others[1:]):
        f.fuse(a, b, b)
    directives = [f"reorder_storage({lanes} innermost: an interleaved copy)",
                  f"vectorize({dense}, {opts.vector})", f"{lanes} just outside the vector loop"]
    if others:
        f.parallel(others[-1])
        directives.append(f"parallel({' * '.join(others)})")
    return directives


def _scatter_order(stage, d, pure, func_ext, opts, lanes=None):
    """A scatter (some left-hand-side argument is not its pure Var) with pure Vars that no
    scattered argument reads: those Vars go innermost, inside the RVars, so the scattered
    coordinates and everything else invariant in them are computed once for all of them (a
    bilateral-grid adjoint ``d_grid(x, y, fz(pixel), c, n) += ...`` loops over the channels
    ``c`` per pixel, as a hand-written kernel would); the other pure Vars are fused and
    parallel (race-free: each writes its own slice). When the outer Vars give fewer than
    ``min_threads`` parallel iterations (a spatial transformer's 4 images), the largest inner
    Var is split and its outer part joins them; so is a Var whose planes of the scattered
    dimensions exceed ``CHANNEL_BYTES`` (scattered at data-dependent points, they would miss
    the caches). Returns the directives, or None when there is no such Var or still too little
    parallelism."""
    names = d.func._pure_arg_names
    scattered = _scattered_vars(d)
    if scattered is None or not d.rvars():
        return None
    inner = [n for n, _ in pure if n not in scattered]
    outer = [(n, e) for n, e in pure if n in scattered]
    if not inner or not outer:
        return None
    lanes = lanes if lanes in inner else None
    lane_extent = dict(pure).get(lanes)
    done = []
    out = [n for n, _ in outer]
    threads = int(np.prod([e for _, e in outer]))
    ext = dict(pure)
    dims = [k for k, a in enumerate(d.args) if sym.calls([a], E.CALL)]
    plane = int(np.prod([func_ext[names[k]] for k in dims])) * \
        np.dtype(d.func.types()[0].dtype).itemsize
    per = CHANNEL_BYTES // plane
    # a vectorised run of the storage's innermost Var writes contiguous points: no planes
    wide = [n for n in inner if ext[n] > per] if dims and lanes is None else []
    if wide:  # scattered at data-dependent points: a few planes at a time stay in the caches
        name = max(wide, key=ext.get)
        if per < 2:
            return None
        size = _chunk(ext[name], per)
        stage.split(name, name, f"{name}.i", size)
        inner = [f"{name}.i" if n == name else n for n in inner]
        out.insert(0, name)
        threads *= -(-ext[name] // size)
        done.append(f"split({name}, {size}): {size} planes at a time")
    host = _host_lanes(d.func, opts)
    if threads < opts.min_threads and not wide:
        name, e = max(((n, e) for n, e in pure if n in inner), key=lambda p: p[1])
        need = -(-opts.min_threads // threads)
        parts = next((p for p in range(need, e + 1) if e % p == 0), need)  # exact if it can
        if e // parts < 2:
            return None
        if name == lanes and -(-e // parts) < host:
            # parts narrower than a host vector would each redo every point's coordinates
            # and weights for no wider vector (a spatial transformer's 16 channels: one
            # 16-lane vector with AVX-512 scatters 1.3x faster than two parallel 8-lane parts)
            parts = max(1, e // host)
            done.append(f"{name} not split below {host} lanes")
        if parts > 1:
            stage.split(name, name, f"{name}.i", -(-e // parts))
            if name == lanes:
                lane_extent = -(-e // parts)
            inner = [f"{name}.i" if n == name else n for n in inner]
            out.insert(0, name)
            done.append(f"split({name}, {-(-e // parts)}): {parts} parts in parallel")
    if lanes is not None:
        lanes = f"{lanes}.i" if f"{lanes}.i" in inner else lanes
        inner = [lanes] + [n for n in inner if n != lanes]
    rv = [dm.name for dm in stage._definition().schedule.dims if not dm.pure]
    order = inner + rv + out
    if len(rv) >= 2 and len(out) >= 2 and _windowed(d, out[0], rv[0]):
        # a window per point (a grid cell's s x s pixels): the cells of a row inside the
        # window's rows, so the reads run along whole rows instead of s short pieces
        order = inner + [rv[0], out[0]] + rv[1:] + out[1:]
        done.append(f"{out[0]} between {rv[0]} and {rv[1]}: the windows' rows in one run")
        out = out[1:]
    stage.reorder(order)
    for a, b in zip(out, out[1:]):
        stage.fuse(a, b, b)
    stage.parallel(out[-1])
    done += [f"reorder({', '.join(inner)} innermost: not read by the scattered coordinates)",
             f"parallel({' * '.join(out)})"]
    if lanes is not None:
        width = _lane_width(lane_extent, opts, host)
        stage.vectorize(lanes, width)
        done.append(f"vectorize({lanes}, {width}): stored innermost")
    return done


def _windowed(d, var, rvar):
    """Whether update ``d`` reads some Func or Buffer at a coordinate that combines the pure
    Var ``var`` and the RVar ``rvar`` alone (``16 gx + r.x``: a window of points per
    ``var``, the gather form of a downsampling scatter's adjoint)."""
    rv = {id(leaf) for leaf, r in d.rvars() if r.name() == rvar}
    for c in sym.calls(list(d.values), E.CALL):
        for a in c.args:
            leaves = sym.free_leaves(a)
            if {v.key for v in leaves if E.is_var(v)} == {var} and any(
                    id(v) in rv for v in leaves):
                return True
    return False


def _rfactor_1d(f, k, rv, extent, opts):
    """Spec §4.3 step 4.2, CPU 1-D: ``r`` (extent ``E``) becomes ``lo + 256 o + 16 m + i``
    (``i < 16``, ``m < 16``, ``o < ceil(E / 256)``, with ``256 o + 16 m + i < E``), and the
    partial reductions over ``m`` are factored out into ``intm[..., i, o]``. The update is
    checked for an associative form before it is rewritten."""
    d = f._updates[k]
    check_rfactor(f, k)
    lanes, inner = opts.tile_w, opts.tile_w * opts.tile_h
    old = rv.rdom
    bounds = []
    for j, b in enumerate(old.bounds):
        bounds += [(0, lanes), (0, inner // lanes), (0, -(-extent // inner))] if j == rv.dim \
            else [b]
    new = E.RDom(bounds, name=f"{old.name}_split")
    i, m, o = new.vars[rv.dim:rv.dim + 3]
    flat = o * inner + m * lanes + i
    # the predicate drops the tail past E; the min keeps its reads provably in bounds
    at = old.bounds[rv.dim][0] + E.min(flat, extent - 1)
    mapping = {v.node: at.node if j == rv.dim
               else new.vars[j if j < rv.dim else j + 2].node
               for j, v in enumerate(old.vars)}
    pred = flat < extent
    if old.predicate() is not None:
        pred = pred & E.Expr(_node=sym.substitute(old.predicate(), mapping))
    new.where(pred)
    f._updates[k] = type(d)(f, [sym.substitute(a, mapping) for a in d.args],
                            [sym.substitute(v, mapping) for v in d.values], d.stage_index)
    f._touch()
    name = rv.name().replace(".", "_")
    return f.update(k).rfactor([(i, E.Var(f"{name}_i")), (o, E.Var(f"{name}_o"))])


def _schedule_intermediate(f, intm, new_dims, pure, opts, result):
    """The rfactor intermediate ``intm[pure..., new dims]``: root, its pure definition tiled
    as usual; its update parallel over the outermost new dimension (split in 16-wide strips
    when it is the only one), the innermost vectorised: the column-wise partial reductions
    (paper §4.4: "vectorize the column-wise reductions")."""
    intm.compute_root()
    result.levels[result.key(intm)] = f"root (rfactor of {result.key(f)})"
    result.rfactored.append(intm)
    result.stages[result.key(intm)] = _parallelize(intm, pure + new_dims, opts) or []
    stage = intm.update(0)
    lanes, outer = new_dims[0][0], new_dims[-1][0]
    if len(new_dims) == 1:  # one long dimension: 16-wide strips of it in parallel
        stage.split(lanes, lanes, f"{lanes}.ti", opts.tile_w)
        lanes = f"{lanes}.ti"
    stage.vectorize(lanes, opts.vector)
    _order(stage, f"{lanes}.v", outer)
    done = [f"vectorize({lanes}, {opts.vector})"]
    small = [(n, e) for n, e in pure if e > 1]
    if small and all(e <= 4 for _, e in small) and np.prod([e for _, e in small]) <= 16:
        # a few outputs (a 3x3 weight gradient): all of them inside the row loop, so each
        # row's shared reads (the adjoint's tap, its zero-padding test) serve every output
        for n, e in small:
            stage.unroll(n, e)
        dims = [d.name for d in stage._definition().schedule.dims]
        unrolled = [f"{n}.u" for n, _ in small]
        stage.reorder(unrolled + [d for d in dims if d not in unrolled])
        done += [f"unroll({n}, {e})" for n, e in small]
    stage.parallel(outer)
    result.stages[f"{result.key(intm)}.update(0)"] = done + [f"parallel({outer})"]



# --------------------------------------------------------------------------------------------
# GPU (spec §4.3 with the GPU branches; `target="gpu"`)


def _gpu_tile(stage, pure, opts):
    """Every pure dimension of ``stage`` on GPU blocks and threads, reduction loops serial
    inside each thread: ``W x H`` tiles of the two dimensions ``_tiling`` picks, the others
    fused into a third dimension split by ``opts.channel`` (when it has that many points); a
    long dimension alone in 256-wide strips; else everything fused in blocks of up to 32. A
    zero-dimensional stage is one thread. Returns the directives."""
    dims = stage._definition().schedule.dims
    rvars = [d.name for d in dims if not d.pure]
    if not pure:
        stage.gpu_single_thread()
        return ["gpu_single_thread()"]
    plan = _tiling(pure, opts)
    names = [n for n, _ in pure]
    size = dict(pure)
    if plan is None:
        stage.reorder(rvars + names)
        for a, b in zip(names, names[1:]):
            stage.fuse(a, b, b)
        total = int(np.prod(list(size.values())))
        width = max(1, min(total, 32))
        stage.gpu_tile(names[-1], names[-1], f"{names[-1]}.ti", width)
        return [f"gpu_tile({' * '.join(names)}, {width})"]
    tiled = list(plan[1:])
    rest = [n for n in names if n not in tiled]
    stage.reorder(rvars + tiled + rest)
    for a, b in zip(rest, rest[1:]):
        stage.fuse(a, b, b)
    widths = [opts.tile_w, opts.tile_h] if plan[0] == "2d" else [opts.tile_w * opts.tile_h]
    if rest and int(np.prod([size[n] for n in rest])) >= opts.channel:
        tiled.append(rest[-1])
        widths.append(opts.channel)
    inner = [f"{n}.ti" for n in tiled]
    for n, i, w in zip(tiled, inner, widths):
        stage.split(n, n, i, w)
    outer = tiled + ([rest[-1]] if rest and rest[-1] not in tiled else [])
    stage.reorder(rvars + inner + outer)
    stage.gpu_threads(*inner).gpu_blocks(*outer)
    return [f"gpu_tile({', '.join(tiled)}; {' x '.join(map(str, widths))})"
            + (f", gpu_blocks({outer[-1]})" if len(outer) > len(tiled) else "")]


def _gpu_atomic_tile(stage, pure, large, opts):
    """The reduction ``large`` ([(RVar, extent)]: two of at least the tile sizes, or one long
    one) on GPU blocks and threads, with atomic stores (the update adds to its Func); the pure
    Vars fused and split by ``opts.channel`` on the third axis; the other RVars serial."""
    dims = stage._definition().schedule.dims
    names = [n for n, _ in pure]
    rv_names = [rv.name() for rv, _ in large]
    others = [d.name for d in dims if not d.pure and d.name not in rv_names]
    stage.reorder(others + rv_names + names)
    for a, b in zip(names, names[1:]):
        stage.fuse(a, b, b)
    widths = [opts.tile_w, opts.tile_h] if len(large) == 2 else [opts.tile_w * opts.tile_h]
    tiled = list(rv_names)
    if names:
        tiled.append(names[-1])
        widths.append(min(opts.channel, int(np.prod([e for _, e in pure]))))
    inner = [f"{n}.ti" for n in tiled]
    for n, i, w in zip(tiled, inner, widths):
        stage.split(n, n, i, w)
    stage.reorder(others + inner + tiled)
    stage.atomic().gpu_threads(*inner).gpu_blocks(*tiled)
    return [f"gpu_tile({', '.join(tiled)}; {' x '.join(map(str, widths))}) with atomics"]


def _gpu_schedule_update(f, k, ldef, ext, values, opts, result):
    """Spec §4.3 step 4 on the GPU: pure Vars with enough points (``gpu_min_parallel``) go on
    the GPU (race-free: each writes its own slice), reduction loops serial per thread; a
    reduction over few pure points is rfactored when provably associative (the partial
    reductions on the GPU), or runs its RVars on the GPU with atomics when it adds to its Func
    (a scatter); else the pure Vars go on the GPU however few they are, or one thread."""
    where = f"{result.key(f)}.update({k})"
    d = ldef.source
    pure = [(n, ext[n]) for n in d.pure_var_names()]
    stage = f.update(k)
    points = int(np.prod([e for _, e in pure])) if pure else 1
    rvars = _rvar_extents(ldef, values)
    large = [(rv, e) for rv, e in rvars if e >= min(opts.tile_w, opts.tile_h)][:2]
    longest = max(rvars, key=lambda p: p[1], default=(None, 0))
    tilable = len(large) == 2 or longest[1] >= opts.tile_w * opts.tile_h
    done = []
    if points < opts.gpu_min_parallel and tilable:
        names = d.func._pure_arg_names
        scatter = any(not (E.is_var(a) and a.key == names[j]) for j, a in enumerate(d.args))
        intm = None
        if not scatter:
            intm, new_dims, done = _rfactor_update(f, k, rvars, opts, result)
        if intm is not None:
            intm.compute_root()
            result.levels[result.key(intm)] = f"root (rfactor of {result.key(f)})"
            result.rfactored.append(intm)
            result.stages[result.key(intm)] = _gpu_tile(intm, pure + new_dims, opts)
            result.stages[f"{result.key(intm)}.update(0)"] = _gpu_tile(
                intm.update(0), pure + new_dims, opts)
            stage = f.update(k)
            # the final reduction over the partial results (its RVars: the new dimensions)
            final = [(rv, const_value(rv.rdom.bounds[rv.dim][1].node))
                     for _, rv in f._updates[k].rvars()]
            big = [(rv, e) for rv, e in final
                   if e is not None and e >= min(opts.tile_w, opts.tile_h)][:2]
            if not pure and additive_update(f, k) and big:
                result.stages[where] = done + _gpu_atomic_tile(stage, pure, big, opts)
            else:
                result.stages[where] = done + _gpu_tile(stage, pure, opts)
            return
        if additive_update(f, k):
            result.stages[where] = done + _gpu_atomic_tile(
                stage, pure, large if len(large) == 2 else [longest], opts)
            return
    result.stages[where] = done + _gpu_tile(stage, pure, opts)
