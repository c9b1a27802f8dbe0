"""Funcs: pure definitions, update definitions, calls, Tuples, and their scheduling methods.

``f[x, y] = e`` defines ``f`` (its first definition must be pure: distinct Vars as arguments);
any later ``f[...] = e`` is an update. ``f[x, y] += e`` (``-=``, ``*=``, ``/=``) is the update
``f[x, y] = f[x, y] + e``; on an undefined Func it first defines ``f`` as 0 (1 for ``*=``).
Halide's rules on updates are enforced: a pure Var on the left-hand side appears only at its
own position, and each value has the Func's type (Python literals are converted).
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np
from core_ad import sym

from . import _expr as E
from ._rfactor import rfactor
from ._schedule import Dim, LoopLevel, ScheduleError, Split, StageSchedule, dim_name
from ._types import Int, Type

__all__ = [
    "Definition",
    "Func",
    "FuncError",
    "FuncRef",
    "Stage",
    "Tuple",
    "callee",
    "rdom_of",
]


class FuncError(ValueError):
    """A Func is used or defined wrongly (undefined, wrong argument count, bad update)."""


_CALLEES: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
_RDOMS: weakref.WeakValueDictionary[str, E.RDom] = weakref.WeakValueDictionary()
_func_ids = itertools.count()
# Func.realize runs a one-output Pipeline. The compiler sits above the front end, so it
# registers its Pipeline class here (register_pipeline_class) instead of being imported.
_PIPELINE_CLASS: list[type] = []


def register_pipeline_class(cls: type) -> None:
    _PIPELINE_CLASS[:] = [cls]


def callee(fid: str):
    """The Func or Buffer of a call node's ``fid``."""
    try:
        return _CALLEES[fid]
    except KeyError:
        raise FuncError(f"the callee {fid!r} no longer exists") from None


def register_callee(fid: str, obj) -> None:
    _CALLEES[fid] = obj


def rdom_of(rvar_leaf) -> E.RDom:
    return _RDOMS[rvar_leaf.key[0]]


_orig_rdom_init = E.RDom.__init__


def _rdom_init(self, *a, **k):
    _orig_rdom_init(self, *a, **k)
    _RDOMS[self.uid] = self


E.RDom.__init__ = _rdom_init


class Tuple(tuple):
    """``hl.Tuple(a, b, ...)``: the values of a multi-valued Func."""

    def __new__(cls, *values):
        if len(values) == 1 and isinstance(values[0], (list, tuple)):
            values = tuple(values[0])
        return super().__new__(cls, values)


class Definition:
    """One definition: left-hand side ``args`` and ``values`` (sym nodes), the RDoms its
    RVars come from, the RDom predicate, and the stage schedule."""

    def __init__(self, func, args, values, stage_index):
        self.func = func
        self.args = tuple(args)
        self.values = tuple(values)
        self.stage_index = stage_index  # 0: pure, k: update k-1
        nodes = list(self.args) + list(self.values)
        # strong references: call nodes name their callees by id only
        self.refs = [callee(c.params["fid"]) for c in sym.calls(nodes, E.CALL)]
        self.refs += [callee(n.key[0]) for n in sym.free_leaves(nodes, "hl.bufdim")]
        leaves = sym.free_leaves(nodes)
        rvars = [n for n in leaves if E.is_rvar(n)]
        rdoms = []
        for rv in rvars:
            rd = rdom_of(rv)
            if rd not in rdoms:
                rdoms.append(rd)
        self.rdoms = rdoms
        pred = None
        for rd in rdoms:
            p = rd.predicate()
            if p is not None:
                pred = p if pred is None else sym.logical_and(pred, p)
        self.predicate = pred
        self.schedule = StageSchedule(dims=self._initial_dims())

    def is_update(self) -> bool:
        return self.stage_index > 0

    def rvars(self):
        """(leaf, RVar) of every RDom dimension of this definition, innermost first."""
        out = []
        for rd in self.rdoms:
            out += [(rv.node, rv) for rv in rd.vars]
        return out

    def pure_var_names(self):
        """Names of the Vars of the pure definition that appear unadorned at their position."""
        pure = self.func._pure_arg_names
        return [pure[k] for k, a in enumerate(self.args)
                if E.is_var(a) and a.key == pure[k]]

    def _initial_dims(self):
        dims = [Dim(rv.name(), pure=False) for _, rv in self.rvars()]
        dims += [Dim(n) for n in self.pure_var_names()]
        return dims

    def stage_name(self) -> str:
        return "" if self.stage_index == 0 else f".update({self.stage_index - 1})"


def _key_args(key):
    if not isinstance(key, tuple):
        key = (key,)
    return key


def _coord(func_name, k, a):
    e = E.as_expr(a)
    t = e.type()
    if t.is_float() or t.is_bool():
        raise FuncError(
            f"{func_name}: argument {k} is {t}; coordinates must be integers (cast with"
            " hl.i32(...))"
        )
    return E.cast(Int(32), e).node if t != Int(32) else e.node


class _Update:
    """What ``ref += v`` hands to ``Func.__setitem__``."""

    __slots__ = ("op", "ref", "value")

    def __init__(self, ref, op, value):
        self.ref, self.op, self.value = ref, op, value


class FuncRef(E.Expr):
    """``f[x, y]``: a call of ``f`` in an expression, or the left-hand side of a definition."""

    __slots__ = ("args", "func", "index")

    def __init__(self, func, args, index=None):
        self.func, self.args, self.index = func, tuple(args), index
        self._node = None

    @property
    def node(self):
        if self._node is None:
            self._node = self.func._call_node(self.args, self.index)
        return self._node

    def __getitem__(self, i) -> FuncRef:
        if self.index is not None:
            raise FuncError(f"{self.func.name()}: a Tuple component cannot be indexed again")
        n = len(self.func._types) if self.func.defined() else None
        if not isinstance(i, int) or (n is not None and not 0 <= i < n):
            raise FuncError(
                f"{self.func.name()} has {n} value(s); Tuple index {i!r} is out of range"
            )
        return FuncRef(self.func, self.args, i)

    def __iadd__(self, v):
        return _Update(self, "+", v)

    def __isub__(self, v):
        return _Update(self, "-", v)

    def __imul__(self, v):
        return _Update(self, "*", v)

    def __itruediv__(self, v):
        return _Update(self, "/", v)

    def __repr__(self):
        return f"{self.func.name()}[{', '.join(sym.to_str(a) for a in self.args)}]"


class _Scheduling:
    """The loop-scheduling methods shared by :class:`Func` (its pure stage) and
    :class:`Stage` (an update); each returns ``self`` so calls chain as in Halide."""

    def _definition(self) -> Definition:
        raise NotImplementedError

    def _sched(self):
        d = self._definition()
        d.func._touch()
        return d.schedule, d.func.name(), d.stage_name()

    def split(self, old, outer, inner, factor, tail=None):
        s, fn, st = self._sched()
        factor = _factor(factor, "split")
        o, on, inn = dim_name(old), dim_name(outer), dim_name(inner)
        k = s.find(o, fn, st)
        for n in (on, inn):
            if n != o and n in s.names():
                raise ScheduleError(f"{fn}{st}: split would create the dimension {n!r} twice")
        if on == inn:
            raise ScheduleError(f"{fn}{st}: split of {o!r} needs two different names")
        d = s.dims[k]
        s.dims[k:k + 1] = [Dim(inn, pure=d.pure), Dim(on, pure=d.pure)]
        s.splits.append(Split("split", o, on, inn, factor))
        return self

    def fuse(self, inner, outer, fused):
        s, fn, st = self._sched()
        i, o, f = dim_name(inner), dim_name(outer), dim_name(fused)
        ki, ko = s.find(i, fn, st), s.find(o, fn, st)
        if ko != ki + 1:
            raise ScheduleError(f"{fn}{st}: fuse needs {o!r} directly outside {i!r}")
        pure = s.dims[ki].pure and s.dims[ko].pure
        s.dims[ki:ko + 1] = [Dim(f, pure=pure)]
        s.splits.append(Split("fuse", f, o, i))
        return self

    def tile(self, x, y, *args):
        """``tile(x, y, xi, yi, w, h)`` (outer loops keep the names x, y) or
        ``tile(x, y, xo, yo, xi, yi, w, h)``."""
        if len(args) == 4:
            xi, yi, w, h = args
            xo, yo = x, y
        elif len(args) == 6:
            xo, yo, xi, yi, w, h = args
        else:
            raise ScheduleError("tile takes (x, y, xi, yi, w, h) or (x, y, xo, yo, xi, yi, w, h)")
        self.split(x, xo, xi, w).split(y, yo, yi, h)
        return self.reorder(xi, yi, xo, yo)

    def reorder(self, *vs):
        """Dimensions innermost first, as in Halide."""
        s, fn, st = self._sched()
        if len(vs) == 1 and isinstance(vs[0], (list, tuple)):
            vs = tuple(vs[0])
        names = [dim_name(v) for v in vs]
        if len(set(names)) != len(names):
            raise ScheduleError(f"{fn}{st}: reorder names a dimension twice: {names}")
        pos = sorted(s.find(n, fn, st) for n in names)
        dims = {d.name: d for d in s.dims}
        for p, n in zip(pos, names):
            s.dims[p] = dims[n]
        return self

    def _mark(self, v, kind, factor=None, split_suffix=None):
        s, fn, st = self._sched()
        n = dim_name(v)
        if factor is not None:
            inner = f"{n}.{split_suffix}"
            self.split(n, n, inner, factor)
            n = inner
        k = s.find(n, fn, st)
        d = s.dims[k]
        if kind == "parallel" and not d.pure and not s.atomic:
            raise ScheduleError(
                f"{fn}{st}: cannot parallelize the reduction dimension {n!r} (its iterations"
                " may write one location: use rfactor, or atomic() first if the update adds"
                " to its Func)"
            )
        if kind == "vectorized" and not d.pure:
            raise ScheduleError(
                f"{fn}{st}: cannot vectorize the reduction dimension {n!r} (use rfactor)"
            )
        d.kind = kind
        d.factor = factor
        return self

    def vectorize(self, v, factor=None):
        return self._mark(v, "vectorized", _factor(factor, "vectorize") if factor else None,
                          "v")

    def unroll(self, v, factor=None):
        return self._mark(v, "unrolled", _factor(factor, "unroll") if factor else None, "u")

    def parallel(self, v, task_size=None):
        if task_size is not None:
            self.split(v, v, f"{dim_name(v)}.t", _factor(task_size, "parallel"))
        return self._mark(v, "parallel")

    def _parallel_disjoint(self, v):
        """``parallel`` over a reduction dimension whose iterations the caller (the
        auto-scheduler) proved to write disjoint points."""
        s, fn, st = self._sched()
        d = s.dims[s.find(dim_name(v), fn, st)]
        d.kind, d.race_free = "parallel", True
        return self

    def atomic(self):
        """Halide's ``atomic()``: this update's reduction dimensions may then run in parallel
        (``parallel``, GPU loops), its stores made atomic additions. The update must add to
        its Func where it writes (``f(e) = f(e) + v``; checked at compilation). Float sums
        then depend on the order the additions land in."""
        s, fn, st = self._sched()
        if self._definition().stage_index == 0:
            raise ScheduleError(f"{fn}: atomic() applies to an update (f.update(i).atomic())")
        s.atomic = True
        return self

    def serial(self, v):
        return self._mark(v, "serial")

    def gpu_blocks(self, *vs):
        for v in vs:
            self._mark(v, "gpu_block")
        return self

    def gpu_threads(self, *vs):
        for v in vs:
            self._mark(v, "gpu_thread")
        return self

    def gpu_single_thread(self):
        """Run this definition as one GPU thread (a zero-dimensional Func, a tiny stage of a
        GPU pipeline: the data stays on the device)."""
        s, fn, st = self._sched()
        gpu = [d.name for d in s.dims if d.kind.startswith("gpu")]
        if gpu:
            raise ScheduleError(f"{fn}{st}: gpu_single_thread with GPU loops over {gpu}")
        s.gpu_single_thread = True
        return self

    def gpu_tile(self, *args):
        """``gpu_tile(x, xo, xi, n)``, ``gpu_tile(x, y, xo, yo, xi, yi, w, h)`` or
        ``gpu_tile(x, y, xi, yi, w, h)``: blocks over the outer, threads over the inner."""
        if len(args) == 4:
            x, xo, xi, n = args
            self.split(x, xo, xi, n)
            return self.gpu_blocks(xo).gpu_threads(xi)
        if len(args) == 6:
            x, y, xi, yi, w, h = args
            self.tile(x, y, xi, yi, w, h)
            return self.gpu_blocks(x, y).gpu_threads(xi, yi)
        if len(args) == 8:
            x, y, xo, yo, xi, yi, w, h = args
            self.tile(x, y, xo, yo, xi, yi, w, h)
            return self.gpu_blocks(xo, yo).gpu_threads(xi, yi)
        raise ScheduleError("gpu_tile takes 4, 6 or 8 arguments")

    def compute_with(self, stage, var):
        """Halide's ``compute_with``: compute this stage inside the loop nest of ``stage`` (a
        Func for its pure definition, or an update Stage), sharing that stage's loops from
        ``var`` outward; in each shared iteration this stage's body runs after the parent's.
        The shared loops pair with this stage's outermost loops by position and must have
        the same kinds and provably equal extents; the rules (and their ScheduleErrors) are
        checked when the pipeline is lowered (``_lower.fuse_stages``)."""
        s, fn, st = self._sched()
        if isinstance(stage, Func):
            parent = stage._definition()
        elif isinstance(stage, Stage):
            parent = stage._definition()
        else:
            raise ScheduleError(f"{fn}{st}.compute_with: expected a Func or a Stage, got"
                                f" {type(stage).__name__}")
        if parent is self._definition():
            raise ScheduleError(f"{fn}{st}.compute_with: a stage cannot be fused with itself")
        s.compute_with = (parent.func, parent.stage_index, dim_name(var))
        parent.func._touch()
        return self



def _factor(f, what) -> int:
    if isinstance(f, E.Expr):
        n = f.node
        if not isinstance(n, type(sym.const(1))) and not sym.free_leaves(n) == []:
            raise ScheduleError(f"{what}: the factor must be a constant integer")
        f = int(np.asarray(sym.compile([n], [], backend="numpy")()[0]))
    if not isinstance(f, (int, np.integer)) or int(f) < 1:
        raise ScheduleError(f"{what}: the factor must be a positive integer, got {f!r}")
    return int(f)


class Stage(_Scheduling):
    """``f.update(i)``: schedule handle of an update definition."""

    def __init__(self, func, index):
        self.func, self.index = func, index

    def _definition(self):
        return self.func._updates[self.index]

    def rfactor(self, preserved, *more):
        return rfactor(self.func, self.index, preserved, *more)

    def __repr__(self):
        return f"Stage({self.func.name()}.update({self.index}))"


def _loop_level(what, func, var) -> LoopLevel:
    if isinstance(func, Stage):
        func = func.func
    if not isinstance(func, Func):
        raise ScheduleError(f"{what}: expected a Func, got {type(func).__name__}")
    return LoopLevel("at", func, dim_name(var))


class Func(_Scheduling):
    """A pipeline stage: ``hl.Func("f")``, ``hl.Func(hl.Float(32), 2, "f")``, or
    ``hl.Func(expr)`` (a zero-dimensional Func with that value)."""

    def __init__(self, *args, name: str | None = None):
        self._pure: Definition | None = None
        self._updates: list[Definition] = []
        self._pure_arg_names: list[str] = []
        self._types: list[Type] = []
        self._declared: tuple | None = None
        given = None
        expr = None
        if len(args) == 1 and isinstance(args[0], str):
            given = args[0]
        elif len(args) in (2, 3) and isinstance(args[0], Type):
            self._declared = ([args[0]], int(args[1]))
            given = args[2] if len(args) == 3 else None
        elif len(args) == 1 and args[0] is not None:
            expr = args[0]
        elif args:
            raise FuncError(f"Func: unexpected arguments {args!r}")
        given = name or given
        self._name = given or f"f{next(_func_ids)}"
        self.fid = E.unique_name(self._name)
        register_callee(self.fid, self)
        self.compute_level = None  # LoopLevel; None: default (inline if possible, else root)
        self.store_level = None
        self.storage_order = None  # dimension indices, innermost first (reorder_storage)
        self.version = 0
        self._own_pipeline = None
        self.bound_estimates: dict = {}
        self._custom_derivative = None  # a CustomDerivative (custom_derivative)
        if expr is not None:
            self[()] = expr

    # ---- identity ----------------------------------------------------------------------
    def name(self) -> str:
        return self._name

    def __repr__(self):
        return f"Func({self._name!r})"

    def defined(self) -> bool:
        return self._pure is not None

    def dimensions(self) -> int:
        if self._pure is None:
            if self._declared:
                return self._declared[1]
            raise FuncError(f"Func {self._name} is not defined")
        return len(self._pure.args)

    def args(self):
        return [E.Var(n) for n in self._pure_arg_names]

    def type(self) -> Type:
        self._require_defined()
        if len(self._types) != 1:
            raise FuncError(f"Func {self._name} has {len(self._types)} values: use types()")
        return self._types[0]

    def types(self):
        self._require_defined()
        return list(self._types)

    def outputs(self) -> int:
        return len(self._types)

    def num_update_definitions(self) -> int:
        return len(self._updates)

    def definitions(self):
        self._require_defined()
        return [self._pure] + list(self._updates)

    def has_update_definition(self) -> bool:
        return bool(self._updates)

    def value(self):
        self._require_defined()
        return E.Expr(_node=self._pure.values[0])

    def _require_defined(self):
        if self._pure is None:
            raise FuncError(f"Func {self._name} is used but never defined")

    def _touch(self):
        self.version += 1

    # ---- calls -------------------------------------------------------------------------
    def __getitem__(self, key) -> FuncRef:
        return FuncRef(self, _key_args(key))

    def __call__(self, *args) -> FuncRef:
        return FuncRef(self, args)

    def _call_node(self, args, index):
        self._require_defined()
        n = len(self._pure.args)
        if len(args) != n:
            raise FuncError(
                f"Func {self._name} takes {n} argument(s), called with {len(args)}"
            )
        if index is None and len(self._types) > 1:
            raise FuncError(
                f"Func {self._name} returns a Tuple of {len(self._types)} values; index the call"
                f" ({self._name}[...][0])"
            )
        k = 0 if index is None else index
        coords = [_coord(self._name, j, a) for j, a in enumerate(args)]
        return sym.call(E.CALL, *coords, out_dtype=self._types[k].dtype, fid=self.fid, index=k)

    # ---- definitions -------------------------------------------------------------------
    def __setitem__(self, key, value):
        args = _key_args(key)
        if isinstance(value, _Update):
            if value.ref.func is not self:
                raise FuncError(f"{self._name}: += of another Func's reference")
            return self._define_update_op(args, value)
        values = self._values_of(value)
        if self._pure is None:
            self._define_pure(args, values)
        else:
            self._define_update(args, values)

    def _values_of(self, value):
        if isinstance(value, (list, tuple)) and not isinstance(value, E.Expr):
            if not value:
                raise FuncError(f"{self._name}: empty Tuple")
            return [E.as_expr(v) if not E._is_literal(v) else v for v in value]
        return [E.as_expr(value) if not E._is_literal(value) else value]

    def _define_pure(self, args, values):
        names = []
        for k, a in enumerate(args):
            if not isinstance(a, E.Var):
                raise FuncError(
                    f"the first definition of {self._name} must be pure: argument {k} is"
                    f" {a!r}, not a Var (use {self._name}[x, ...] = ... first, or += to start"
                    " from 0)"
                )
            if a.name() in names:
                raise FuncError(f"{self._name}: the Var {a.name()!r} appears twice on the left")
            names.append(a.name())
        if self._declared is not None and len(args) != self._declared[1]:
            raise FuncError(
                f"Func {self._name} was declared with {self._declared[1]} dimensions, defined"
                f" with {len(args)}"
            )
        exprs = [E.as_expr(v) for v in values]
        if self._declared is not None:
            exprs = [E.cast(self._declared[0][0], e) if E._is_literal(v) else e
                     for v, e in zip(values, exprs)]
        pure_leaves = {a.node for a in args}
        for e in exprs:
            for n in sym.free_leaves(e.node):
                if E.is_var(n) and n not in pure_leaves:
                    raise FuncError(
                        f"{self._name}: the pure definition uses the Var {n.key!r}, which is not"
                        " one of its arguments"
                    )
                if E.is_rvar(n):
                    raise FuncError(
                        f"{self._name}: the pure definition uses the RVar {n.key!r}; reductions"
                        " go in update definitions (f[x] += ...)"
                    )
        for e in exprs:
            self._check_calls(e.node, allow_self=False)
        self._types = [e.type() for e in exprs]
        self._pure_arg_names = names
        self._pure = Definition(self, [a.node for a in args], [e.node for e in exprs], 0)
        self._touch()

    def _define_update(self, args, values):
        n = len(self._pure.args)
        if len(args) != n:
            raise FuncError(
                f"update of {self._name} has {len(args)} argument(s); {self._name} has {n}"
            )
        if len(values) != len(self._types):
            raise FuncError(
                f"update of {self._name} gives {len(values)} value(s); {self._name} has"
                f" {len(self._types)}"
            )
        coords = []
        for k, a in enumerate(args):
            if isinstance(a, E.Var) and not isinstance(a, E.RVar) and \
                    a.name() != self._pure_arg_names[k]:
                raise FuncError(
                    f"update of {self._name}: the pure Var {a.name()!r} must appear at its"
                    f" own position ({k} holds {self._pure_arg_names[k]!r} in the pure"
                    " definition)"
                )
            coords.append(_coord(self._name, k, a))
        exprs = []
        for k, (v, t) in enumerate(zip(values, self._types)):
            e = E.cast(t, v) if E._is_literal(v) else E.as_expr(v)
            if e.type() != t:
                raise FuncError(
                    f"type mismatch in update {len(self._updates)} of {self._name}: value {k} is"
                    f" {e.type()}, but {self._name} holds {t} (cast with hl.cast)"
                )
            exprs.append(e.node)
        pure_here = {c.key for c in coords if E.is_var(c)}
        for e in exprs + coords:
            for leaf in sym.free_leaves(e):
                if E.is_var(leaf) and leaf.key not in pure_here:
                    raise FuncError(
                        f"update of {self._name} uses the Var {leaf.key!r}, which is not on its"
                        " left-hand side at its own position"
                    )
        for e in exprs:
            self._check_self_calls(e, coords)
        d = Definition(self, coords, exprs, len(self._updates) + 1)
        self._updates.append(d)
        self._touch()

    def _define_update_op(self, args, upd: _Update):
        v = upd.value
        if self._pure is None:
            ve = E.as_expr(v)
            init = 1 if upd.op in "*/" else 0
            t = self._declared[0][0] if self._declared else ve.type()
            pure = [E.Var.implicit(i) for i in range(len(args))]
            self._define_pure(pure, [E.cast(t, init)])
        if len(self._types) != 1 and upd.ref.index is None:
            raise FuncError(f"{self._name} has a Tuple value; update a component: f[x][0] += e")
        k = upd.ref.index or 0
        t = self._types[k]
        cur = FuncRef(self, args, upd.ref.index)
        rhs = E.cast(t, v) if E._is_literal(v) else E.as_expr(v)
        if rhs.type() != t:
            rhs = E.cast(t, rhs)
        new = {"+": cur + rhs, "-": cur - rhs, "*": cur * rhs, "/": cur / rhs}[upd.op]
        new = E.cast(t, new)
        if len(self._types) == 1:
            self._define_update(args, [new])
        else:
            vals = [new if j == k else FuncRef(self, args, j) for j in range(len(self._types))]
            self._define_update(args, vals)

    def _check_calls(self, node, allow_self):
        for c in sym.calls(node, E.CALL):
            if c.params["fid"] == self.fid and not allow_self:
                raise FuncError(f"the pure definition of {self._name} calls itself")

    def _check_self_calls(self, node, coords):
        for c in sym.calls(node, E.CALL):
            if c.params["fid"] != self.fid:
                continue
            for k, (a, lhs) in enumerate(zip(c.args, coords)):
                if E.is_var(lhs) and a is not lhs:
                    raise FuncError(
                        f"update of {self._name} reads {self._name} with {sym.to_str(a)} at the"
                        f" position of the pure Var {lhs.key!r} (Halide's rule: the same pure"
                        " Var, unadorned)"
                    )

    # ---- scheduling --------------------------------------------------------------------
    def _definition(self):
        self._require_defined()
        return self._pure

    def update(self, i: int = 0) -> Stage:
        self._require_defined()
        if not 0 <= i < len(self._updates):
            raise ScheduleError(f"{self._name} has {len(self._updates)} update definition(s);"
                                f" update({i}) does not exist")
        return Stage(self, i)

    def compute_root(self):
        self.compute_level = LoopLevel("root")
        self._touch()
        return self

    def compute_inline(self):
        self.compute_level = LoopLevel("inline")
        self._touch()
        return self

    def compute_at(self, func, var):
        self.compute_level = _loop_level("compute_at", func, var)
        self._touch()
        return self

    def store_root(self):
        self.store_level = LoopLevel("root")
        self._touch()
        return self

    def store_at(self, func, var):
        self.store_level = _loop_level("store_at", func, var)
        self._touch()
        return self

    def reorder_storage(self, *vs):
        """The order of this Func's dimensions in memory, innermost first (Halide's
        ``reorder_storage``): all of its pure Vars. Applies to an intermediate Func on the
        CPU; an output takes the layout of the array it is realized into, and GPU storage
        stays dense in the Func's own order."""
        if len(vs) == 1 and isinstance(vs[0], (list, tuple)):
            vs = tuple(vs[0])
        names = [dim_name(v) for v in vs]
        if sorted(names) != sorted(self._pure_arg_names) or len(set(names)) != len(names):
            raise ScheduleError(f"{self._name}.reorder_storage: name each of its dimensions"
                                f" {self._pure_arg_names} once, got {names}")
        order = [self._pure_arg_names.index(n) for n in names]
        self.storage_order = None if order == sorted(order) else order
        self._touch()
        return self

    def set_estimate(self, var, min, extent):
        # estimates only inform the auto-scheduler (the next issue); bounds come from realize
        self.bound_estimates[dim_name(var)] = (int(min), int(extent))
        return self

    def set_estimates(self, estimates):
        for v, (lo, ext) in zip(self.args(), estimates):
            self.set_estimate(v, lo, ext)
        return self

    # ---- running -----------------------------------------------------------------------
    def _pipeline(self):
        """This Func as a one-output Pipeline, kept so realizing again compiles nothing."""
        if self._own_pipeline is None:
            self._own_pipeline = _PIPELINE_CLASS[0]([self])
        return self._own_pipeline

    def realize(self, sizes=None, target=None):
        """``sizes`` (x extent first) or output Buffer(s). ``target`` is accepted for Halide
        compatibility; CPU or GPU code follows the schedule."""
        return self._pipeline().realize(sizes, target=target)

    def compile_jit(self, target=None):
        self._pipeline().compile_jit(target)
        return self

    def print_loop_nest(self):
        return self._pipeline().print_loop_nest()

    def loop_nest(self) -> str:
        return self._pipeline().loop_nest()


def require_float_func(func, who: str) -> None:
    """``func`` must be a defined Func with one float value (what derivatives act on)."""
    if not isinstance(func, Func):
        raise FuncError(f"{who}: expected a Func, got {type(func).__name__}")
    func._require_defined()
    if len(func.types()) != 1 or not func.type().is_float():
        raise FuncError(
            f"{who}: {func.name()} must have one float value, it has"
            f" {', '.join(str(t) for t in func.types())}"
        )


def zero_func(name: str, dims: int, value_type) -> "Func":
    """A ``dims``-dimensional Func that is 0 of ``value_type`` everywhere."""
    f = Func(name)
    f[tuple(E.Var(f"_{k}") for k in range(dims))] = E.cast(value_type, 0)
    return f
