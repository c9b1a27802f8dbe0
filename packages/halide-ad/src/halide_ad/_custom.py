"""User-supplied derivatives of one Func: ``custom_derivative`` (beyond the paper, spec
section 3.11 allows it as an extension).

``propagate_adjoints`` / ``propagate_tangents`` call the user's rules for that Func instead of
differentiating its definitions, for stages whose automatic derivative is numerically poor
(``log(1 + exp(x))`` overflows to inf / inf), or cheaper by hand (a normalisation).
"""

from __future__ import annotations

import numpy as np
from core_ad import sym

from . import _expr as E
from ._buffer import Buffer
from ._func import Func, FuncError, callee, require_float_func

__all__ = ["CustomDerivative", "custom_derivative"]


class CustomDerivative:
    """The rules attached to a Func by :func:`custom_derivative`."""

    def __init__(self, func, adjoint, tangent, inputs):
        self.func, self.adjoint, self.tangent = func, adjoint, tangent
        self._inputs = inputs

    def inputs(self):
        """What a rule receives or must return a derivative for: the declared inputs, or the
        float Funcs, Buffers and Params the Func's definitions read (first-read order)."""
        return list(self._inputs) if self._inputs is not None else _reads(self.func)

    def check_func(self, what, fn, dims, of):
        """``fn`` must be a float Func of ``dims`` dimensions (the derivative ``what`` of
        ``of``)."""
        name = self.func.name()
        if not isinstance(fn, Func):
            raise FuncError(
                f"the custom {what} of Func {name} must give a Func for {of}, got"
                f" {type(fn).__name__}"
            )
        fn._require_defined()
        if fn.dimensions() != dims:
            raise FuncError(
                f"the custom {what} of Func {name} gives a {fn.dimensions()}-dimensional Func"
                f" for {of}, which has {dims} dimension(s)"
            )
        if len(fn.types()) != 1 or not fn.type().is_float():
            raise FuncError(
                f"the custom {what} of Func {name} gives a Func of"
                f" {', '.join(str(t) for t in fn.types())} for {of}; it must have one float value"
            )

    def adjoints(self, d_func):
        """The user's adjoint rule applied to ``d_func``: [(input, Func)], checked; inputs
        mapped to None contribute nothing."""
        name = self.func.name()
        res = self.adjoint(d_func)
        if not isinstance(res, dict):
            raise FuncError(
                f"the custom adjoint of Func {name} must return a dict {{input: Func}}, got"
                f" {type(res).__name__}"
            )
        inputs = self.inputs()
        known = {id(obj) for obj in inputs}
        for key in res:
            if id(key) not in known:
                raise FuncError(
                    f"the custom adjoint of Func {name} returns an adjoint for {_describe(key)},"
                    f" which {name} does not read; it reads {_names(inputs)}"
                )
        missing = [obj for obj in inputs if not any(k is obj for k in res)]
        if missing:
            raise FuncError(
                f"the custom adjoint of Func {name} returns no adjoint for {_names(missing)},"
                f" which {name} reads (map it to None if it contributes nothing)"
            )
        out = []
        for obj in inputs:
            fn = next(v for k, v in res.items() if k is obj)
            if fn is None:
                continue
            dims = 0 if isinstance(obj, E.Param) else obj.dimensions()
            self.check_func("adjoint", fn, dims, _describe(obj))
            out.append((obj, fn))
        return out


def _reads(f):
    """The float Funcs, Buffers and Params ``f``'s definitions read, first-read order."""
    out, seen = [], set()
    for d in f.definitions():
        nodes = list(d.values)
        for c in sym.calls(nodes, E.CALL):
            fid = c.params["fid"]
            if fid != f.fid and np.dtype(c.dtype).kind == "f" and fid not in seen:
                seen.add(fid)
                out.append(callee(fid))
        for p in sym.free_leaves(nodes):
            if E.is_param(p) and np.dtype(p.dtype).kind == "f" and p not in seen:
                seen.add(p)
                out.append(E.PARAMS[p.key])
    return out


def _check_cut(func, inputs):
    """Every float Buffer and Param ``func`` depends on must be reached only through the
    declared ``inputs``: a path around them would get no derivative."""
    if not inputs:
        raise FuncError(f"custom_derivative({func.name()}): inputs is empty")
    for obj in inputs:
        if not isinstance(obj, (Func, Buffer, E.Param)):
            raise FuncError(
                f"custom_derivative({func.name()}): inputs are Funcs, Buffers and Params, got"
                f" {type(obj).__name__}"
            )
    declared = {id(o) for o in inputs}
    seen, stack = set(), [func]
    while stack:
        f = stack.pop()
        for obj in _reads(f):
            if id(obj) in declared or id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, Func):
                stack.append(obj)
            else:
                raise FuncError(
                    f"custom_derivative({func.name()}): {func.name()} depends on"
                    f" {_describe(obj)} other than through the declared inputs"
                    f" ({_names(inputs)}); declare it, or an intermediate Func that reads it"
                )
    for obj in inputs:
        if not _depends(func, obj):
            raise FuncError(
                f"custom_derivative({func.name()}): {func.name()} does not depend on the"
                f" declared input {_describe(obj)}"
            )


def _depends(func, leaf):
    seen, stack = set(), [func]
    while stack:
        f = stack.pop()
        for obj in _reads(f):
            if obj is leaf:
                return True
            if isinstance(obj, Func) and id(obj) not in seen:
                seen.add(id(obj))
                stack.append(obj)
    return False


def _describe(obj) -> str:
    kind = {Func: "Func", Buffer: "Buffer", E.Param: "Param"}.get(type(obj))
    if kind is None:
        return f"a {type(obj).__name__}"
    return f"{kind} {obj.name()}"


def _names(objs) -> str:
    return ", ".join(_describe(o) for o in objs) or "nothing differentiable"


def custom_derivative(func, adjoint=None, tangent=None, inputs=None):
    """Give ``func`` hand-written derivatives; returns ``func``.

    ``inputs``: the Funcs, Buffers and Params the rules differentiate with respect to;
    default: the float ones ``func``'s definitions read. Declaring inputs further upstream
    makes the rules cover a whole sub-pipeline (a softmax from its input, through its max and
    sum reductions); every path from ``func`` to a float Buffer or Param must pass through
    them. ``adjoint(d_func) -> {input: Func or None}``: ``d_func`` is the adjoint of
    ``func``'s value (a Func with ``func``'s dimensions, zero outside the region the pipeline
    uses); return, for every input, its adjoint contribution from ``func`` as a Func of that
    input's dimensions (0 for a Param), or None. Funcs between ``func`` and its inputs get no
    adjoint from ``func``.
    ``tangent(tangents) -> Func``: ``tangents`` maps each of those inputs to its tangent Func;
    return the tangent of ``func``'s value. A rule left out is derived automatically from the
    definitions. ``propagate_adjoints`` / ``propagate_tangents`` use the rules whenever the
    pipeline contains ``func``; ``d[func]`` / ``t[func]`` are then the derivatives of its value
    (no per-update ones)."""
    require_float_func(func, "custom_derivative")
    if adjoint is None and tangent is None:
        raise FuncError(f"custom_derivative({func.name()}): give an adjoint, a tangent or both")
    for what, rule in (("adjoint", adjoint), ("tangent", tangent)):
        if rule is not None and not callable(rule):
            raise FuncError(
                f"custom_derivative({func.name()}): {what} must be a function, got"
                f" {type(rule).__name__}"
            )
    if inputs is not None:
        inputs = list(inputs)
        _check_cut(func, inputs)
    func._custom_derivative = CustomDerivative(func, adjoint, tangent, inputs)
    return func
