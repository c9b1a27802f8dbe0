"""Forward-mode automatic differentiation of pipelines: ``propagate_tangents`` (the forward
mode of spec section 3.10, beyond the paper).

The tangent of every Func is an ordinary Func with the same definitions, in the same order:
each definition ``f[lhs] = value`` becomes ``f_t[lhs] = jvp(value)``, where ``jvp`` is
core_ad's forward sweep (``sym.jvp``, the rule table ``propagate_adjoints`` uses) with every
float call ``g(e_0, ..., e_k)`` an independent input whose tangent is the call
``g_t(e_0, ..., e_k)`` at the same coordinates. Coordinates are integers, so index tangents
are zero: boundary conditions, clamped and data-dependent reads, up- and down-sampling need no
special case, and no bounds inference is needed (forward mode never inverts an index).

Updates that read their own Func (``f[x] = f[x] * g[x]``, scans) read ``f_t`` at the same
coordinates, which holds the tangent of the value being read. When the update's partial with
respect to its self-read depends on ``f`` itself (a nonlinear self-read), the tangent also
needs ``f``'s value *at that point of the update* (a scan changes it as it goes): the tangent
is then computed by a Tuple Func holding (value, tangent) that replays ``f``'s definitions.
"""

from __future__ import annotations

import numbers

import numpy as np
from core_ad import sym

from . import _expr as E
from ._buffer import Buffer
from ._derivative import _AllRootGraph, stage_copy
from ._func import Func, FuncError, require_float_func, zero_func

__all__ = ["Tangents", "propagate_tangents"]


def _call(fid, args, dtype, index=0):
    return sym.call(E.CALL, *args, out_dtype=dtype, fid=fid, index=index)


class Tangents:
    """The tangents: ``t[f]`` (of ``f``'s value: after its last update), ``t[f, i]`` (after
    update ``i``; ``-1``: the pure definition), ``t[buffer]``, ``t[param]`` (a 0-D Func), all
    ordinary Funcs. A Func, Buffer or Param whose value does not depend on the given tangents
    has a zero tangent."""

    def __init__(self, funcs, given, output, pipeline):
        # fid -> None (zero) or (tangent Func, None / the (value, tangent) Tuple Func /
        # "custom"); float Funcs only
        self._funcs = funcs
        self._pipeline = pipeline  # fid -> Func: every Func of the pipeline
        self._given = given  # fid / param leaf -> tangent Func
        self._output = output
        self._prefixes: dict = {}

    def __getitem__(self, key):
        index = None
        if isinstance(key, tuple):
            key, index = key
        if isinstance(key, Func):
            return self._func(key, index)
        if index is not None:
            raise FuncError("an update index is only meaningful for a Func")
        if isinstance(key, Buffer):
            f = self._given.get(key.fid)
            if f is None:
                if not key.type().is_float():
                    raise FuncError(f"Buffer {key.name()} is {key.type()}: it has no tangent")
                f = zero_func(f"{key.name()}_t", key.dimensions(), key.type())
            return f
        if isinstance(key, E.Param):
            f = self._given.get(key.node)
            if f is None:
                if not key.type().is_float():
                    raise FuncError(f"Param {key.name()} is {key.type()}: it has no tangent")
                f = Func(E.cast(key.type(), 0), name=f"{key.name()}_t")
            return f
        raise FuncError(f"no tangent for {type(key).__name__}: use a Func, Buffer or Param")

    def _func(self, f, index):
        if f.fid not in self._pipeline:
            raise FuncError(
                f"Func {f.name()} is not in the pipeline of {self._output.name()}: it has no"
                " tangent"
            )
        if f.fid not in self._funcs:
            raise FuncError(f"Func {f.name()} is {f.type()}-valued: integer Funcs have no tangent")
        n = f.num_update_definitions()
        j = n if index is None else index + 1
        if not 0 <= j <= n:
            raise FuncError(f"Func {f.name()} has {n} update(s); no tangent for update {index}")
        entry = self._funcs[f.fid]
        if entry is None:
            return zero_func(f"{f.name()}_t", f.dimensions(), f.type())
        tan, pair = entry
        if j == n:
            return tan
        if isinstance(pair, str):
            raise FuncError(
                f"Func {f.name()} has a custom tangent: only t[{f.name()}] (the tangent of its"
                " value) exists"
            )
        key = (f.fid, j)
        if key not in self._prefixes:
            src = pair if pair is not None else tan
            copy = stage_copy(src, j, f"{f.name()}_{j}_t")
            if pair is not None:  # the tangent is the Tuple's component 1
                proj = Func(f"{f.name()}_{j}_t")
                xs = [E.Var(nm) for nm in f._pure_arg_names]
                proj[tuple(xs)] = copy[tuple(xs)][1]
                copy = proj
            self._prefixes[key] = copy
        return self._prefixes[key]


class _Forward:
    def __init__(self, output, tangents):
        self.output = output
        self.graph = _AllRootGraph([output])
        self.given: dict = {}  # Buffer fid / Param leaf -> tangent Func (0-D for a Param)
        self.funcs: dict = {}  # fid -> (tangent Func, Tuple Func or None) or None (zero)
        self._read_given(tangents)

    # ---- the user's tangents ------------------------------------------------------------
    def _read_given(self, tangents):
        if not isinstance(tangents, dict):
            raise FuncError(
                "propagate_tangents: tangents must be a dict {Buffer or Param: tangent}, got"
                f" {type(tangents).__name__}"
            )
        g = self.graph
        for key, v in tangents.items():
            if isinstance(key, Buffer):
                if key.fid not in g.buffers:
                    raise FuncError(
                        f"propagate_tangents: {self.output.name()} does not read Buffer"
                        f" {key.name()}, which has a tangent"
                    )
                self.given[key.fid] = self._buffer_tangent(key, v)
            elif isinstance(key, E.Param):
                if key.node not in g.params:
                    raise FuncError(
                        f"propagate_tangents: {self.output.name()} does not use Param"
                        f" {key.name()}, which has a tangent"
                    )
                self.given[key.node] = self._param_tangent(key, v)
            else:
                raise FuncError(
                    "propagate_tangents: tangents are keyed by input Buffers and Params, got"
                    f" {type(key).__name__} (an intermediate Func's tangent follows from its"
                    " inputs')"
                )

    @staticmethod
    def _buffer_tangent(buf, v):
        t = buf.type()
        if not t.is_float():
            raise FuncError(f"propagate_tangents: Buffer {buf.name()} is {t}: it has no tangent")
        if isinstance(v, Func):
            if v.dimensions() != buf.dimensions():
                raise FuncError(
                    f"propagate_tangents: the tangent of Buffer {buf.name()} is a Func of"
                    f" {v.dimensions()} dimensions, the Buffer has {buf.dimensions()}"
                )
            src = v
        else:
            if not isinstance(v, Buffer):  # an array covers the input's domain, mins included
                v = Buffer(np.asarray(v, dtype=t.dtype), name=f"{buf.name()}_tin")
                if v.dimensions() == buf.dimensions():
                    v.set_min([buf.dim(d).min() for d in range(buf.dimensions())])
            if v.shape != buf.shape or any(v.dim(d).min() != buf.dim(d).min()
                                           for d in range(buf.dimensions())):
                raise FuncError(
                    f"propagate_tangents: the tangent of Buffer {buf.name()} has numpy shape"
                    f" {v.shape}, the Buffer has {buf.shape} (and the same mins)"
                )
            src = v
        # a Func of the input's type, so the tangent pipeline's arithmetic stays in it
        f = Func(f"{buf.name()}_t")
        xs = tuple(E.Var(f"_{k}") for k in range(buf.dimensions()))
        f[xs] = E.cast(t, src[xs])
        return f

    @staticmethod
    def _param_tangent(p, v):
        t = p.type()
        if not t.is_float():
            raise FuncError(f"propagate_tangents: Param {p.name()} is {t}: it has no tangent")
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            e = E.cast(t, float(v))
        elif isinstance(v, E.Expr) and v.type().is_float() and not sym.free_leaves(
                v.node, "hl.var") and not sym.calls(v.node, E.CALL):
            e = E.cast(t, v)
        else:
            raise FuncError(
                f"propagate_tangents: the tangent of Param {p.name()} must be a number, a float"
                f" Param or an expression of Params, got {v!r}"
            )
        return Func(e, name=f"{p.name()}_t")

    # ---- driver -------------------------------------------------------------------------
    def run(self):
        g = self.graph
        for fid in g.order:
            f = g.funcs[fid]
            if not all(t.is_float() for t in f.types()):
                continue
            if len(f.types()) != 1:
                raise FuncError(
                    f"propagate_tangents: Func {f.name()} is a Tuple; differentiate Funcs with"
                    " one value (split the Tuple into several Funcs)"
                )
            custom = f._custom_derivative
            if custom is not None and custom.tangent is not None:
                self.funcs[fid] = self._custom(f, custom)
            else:
                self.funcs[fid] = self._func(f)
        return Tangents(self.funcs, self.given, self.output, g.funcs)

    def _inputs(self, node, self_fid=None):
        """The float calls (of Funcs / Buffers with a tangent, and of ``self_fid``) and the
        Params with a tangent in ``node``."""
        calls = []
        for c in sym.calls(node, E.CALL):
            fid = c.params["fid"]
            if np.dtype(c.dtype).kind != "f":
                continue
            if fid == self_fid or fid in self.given or self.funcs.get(fid) is not None:
                calls.append(c)
        params = [p for p in sym.free_leaves(node) if p in self.given]
        return calls, params

    def _tangent_call(self, c):
        fid = c.params["fid"]
        if fid in self.given:
            return _call(self.given[fid].fid, c.args, c.dtype)
        tan, _ = self.funcs[fid]
        return _call(tan.fid, c.args, c.dtype)

    def _jvp(self, value, self_fid, self_tangent):
        """``jvp(value)``; ``self_tangent(call)``: the tangent of a self-read."""
        calls, params = self._inputs(value, self_fid)
        if not calls and not params:
            return None
        ts = [self_tangent(c) if c.params["fid"] == self_fid else self._tangent_call(c)
              for c in calls]
        ts += [_call(self.given[p].fid, (), p.dtype) for p in params]
        return sym.jvp(value, calls + params, ts)

    def _func(self, f):
        defs = f.definitions()
        t = f.type()
        if not any(any(self._inputs(d.values[0])) for d in defs):
            return None
        nonlinear = False
        for d in defs[1:]:
            selfs = [c for c in sym.calls(d.values[0], E.CALL) if c.params["fid"] == f.fid]
            if selfs and any(c.params["fid"] == f.fid
                             for p in sym.grad(d.values[0], selfs)
                             for c in sym.calls(p, E.CALL)):
                nonlinear = True
        xs = [E.Var(n) for n in f._pure_arg_names]
        if not nonlinear:
            tan = Func(f"{f.name()}_t")
            for d in defs:
                tv = self._jvp(d.values[0], f.fid, lambda c: _call(tan.fid, c.args, c.dtype))
                val = E.cast(t, 0) if tv is None else E.cast(t, E.Expr(_node=tv))
                lhs = xs if d.stage_index == 0 else [E.Expr(_node=a) for a in d.args]
                tan[tuple(lhs)] = val
            return tan, None
        pair = Func(f"{f.name()}_vt")
        for d in defs:
            value = d.values[0]
            tv = self._jvp(value, f.fid, lambda c: _call(pair.fid, c.args, c.dtype, 1))
            prim = {c: _call(pair.fid, c.args, c.dtype, 0)
                    for c in sym.calls(value, E.CALL) if c.params["fid"] == f.fid}
            vals = [E.Expr(_node=sym.substitute(v, prim) if prim else v)
                    for v in (value, tv if tv is not None else sym.const(0, t.dtype))]
            lhs = xs if d.stage_index == 0 else [E.Expr(_node=a) for a in d.args]
            pair[tuple(lhs)] = [E.cast(t, v) for v in vals]
        tan = Func(f"{f.name()}_t")
        tan[tuple(xs)] = pair[tuple(xs)][1]
        return tan, pair


    def _custom(self, f, custom):
        """The user's tangent rule, given the tangent Funcs of the Funcs, Buffers and Params
        ``f`` reads (zero Funcs for the ones without)."""
        ins = {}
        for obj in custom.inputs():
            if isinstance(obj, E.Param):
                tan = self.given.get(obj.node) or Func(E.cast(obj.type(), 0),
                                                       name=f"{obj.name()}_t")
            elif obj.fid in self.given:
                tan = self.given[obj.fid]
            elif self.funcs.get(obj.fid) is not None:
                tan = self.funcs[obj.fid][0]
            else:
                tan = zero_func(f"{obj.name()}_t", obj.dimensions(), obj.type())
            ins[obj] = tan
        tan = custom.tangent(ins)
        custom.check_func("tangent", tan, f.dimensions(), f"Func {f.name()}")
        return tan, "custom"


def propagate_tangents(output, tangents):
    """Tangents (Jacobian-vector products) of ``output`` and every Func it depends on.

    ``tangents`` maps input Buffers to tangent arrays / Buffers of their shape (numpy order) or
    Funcs of their dimensions, and float Params to numbers (or Params); inputs left out have
    zero tangents. Returns :class:`Tangents`: ``propagate_tangents(f, {a: v})[f]`` is the Func
    ``J_a f . v``, to be realised (and scheduled) over any region ``f`` can be realised on."""
    require_float_func(output, "propagate_tangents")
    return _Forward(output, tangents).run()
