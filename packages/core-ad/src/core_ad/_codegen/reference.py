"""The ``"numpy"`` backend: the reference evaluator (the oracle of every other backend).

The callable is generated once, as Python source over the topologically ordered program
(``fn.source``, ``fn.program``); inputs are converted to their leaf's dtype and broadcast
together into the lane shape; floating-point warnings of masked-off lanes are silenced.
``fn(*arrays, out=arrays)`` copies the results into ``out`` and returns it (the LLVM
backend's ``out=``)."""

from __future__ import annotations

import builtins
import functools

import numpy as np

from .. import _rules as R
from .._sym.buffers import is_buffer, is_reduction, is_scatter
from .._sym.expr import Const, Leaf
from .._sym.program import Program, _schedule
from .._sym.simplify import impl_of

__all__ = ["compile_reference"]


def _finish(r, shape, dt, copy):
    r = np.asarray(r)
    if r.dtype != dt:
        r = r.astype(dt)
        copy = False
    if r.shape != shape:
        return np.array(np.broadcast_to(r, shape))
    return r.copy() if copy else r


def _write_out(out, results):
    """``out=``: the results copied into the given arrays, which are returned."""
    out = tuple(out)
    if len(out) != len(results):
        raise ValueError(f"out=: expected {len(results)} arrays (one per output), got "
                         f"{len(out)}")
    for o, r in zip(out, results):
        np.copyto(o, r, casting="no")
    return out


def _lane_sum(v, shape):
    v = np.broadcast_to(np.asarray(v), shape)  # a constant or scalar value counts every lane
    return np.asarray(np.sum(v, dtype=v.dtype))


_CHUNK = 16
_INFIX = {R.add_p: " + ", R.mul_p: " * ", R.sub_p: " - ", R.div_p: " / "}


def compile_reference(prog: Program, roots, inputs):
    """The numpy reference evaluator of ``prog``: generated Python source over numpy, inputs
    converted to their leaf's dtype and broadcast together into the lane shape."""
    ns: dict = {
        "_asarray": np.asarray,
        "_bshapes": np.broadcast_shapes,
        "_errstate": np.errstate,
        "_finish": _finish,
        "_lane_sum": _lane_sum,
        "_write_out": _write_out,
        "_where": np.where,
    }
    in_names = [v.name for v in inputs]
    n_in = len(inputs)
    ns["_ARGMSG"] = (
        f"compiled function takes {n_in} array{'s' if n_in != 1 else ''}"
        f" ({', '.join(in_names)}), got %d"
    )

    def shape_error(arrays):
        shapes = ", ".join(f"{nm}: {a.shape}" for nm, a in zip(in_names, arrays))
        return ValueError(f"compiled function: input shapes do not broadcast ({shapes})")

    ns["_shape_error"] = shape_error
    slot: dict[int, str] = {}
    lines = ["def compiled(*args, out=None):", f"    if len(args) != {n_in}:",
             "        raise TypeError(_ARGMSG % len(args))"]
    for i, v in enumerate(inputs):
        ns[f"_dt{i}"] = v.dtype
        lines.append(f"    a{i} = _asarray(args[{i}], _dt{i})")
        slot[id(v)] = f"a{i}"
    arrays = ", ".join(f"a{i}" for i in range(n_in))
    lanes = [i for i, v in enumerate(inputs) if not is_buffer(v)]  # buffers are not lanes
    lines += [
        "    try:",
        f"        shape = _bshapes({''.join(f'a{i}.shape, ' for i in lanes)})",
        "    except ValueError:",
        f"        raise _shape_error(({arrays}{',' if n_in == 1 else ''})) from None",
        "    with _errstate(all='ignore'):",
    ]
    nk = nv = 0
    body = []
    order, via = _schedule([n for _, n in prog.assignments])
    for n in order:
        if isinstance(n, Leaf):
            continue
        if isinstance(n, Const):
            name = f"k{nk}"
            nk += 1
            ns[name] = n.value
            slot[id(n)] = name
            continue
        args = [slot[id(a)] for a in n.args]
        prim = n.prim
        name = f"v{nv}"
        if id(n) in via:
            prev, i = via[id(n)]
            expr = f"({slot[id(prev)]}{_INFIX[prim]}{args[i]})"
        elif prim in _INFIX and not n.params:
            # long sums/products in chunks: no deeply nested expression for Python's compiler
            op = _INFIX[prim]
            head, rest = args[:_CHUNK], args[_CHUNK:]
            while rest:
                body.append(f"        {name} = ({op.join(head)})")
                head, rest = [name] + rest[: _CHUNK - 1], rest[_CHUNK - 1 :]
            expr = "(" + op.join(head) + ")"
        elif prim is R.neg_p:
            expr = f"(-{args[0]})"
        elif prim is R.select_p:
            expr = f"_where({', '.join(args)})"
        elif prim is R.lane_sum_p:
            expr = f"_lane_sum({args[0]}, shape)"
        else:
            fname = f"_f{nv}"
            impl = impl_of(prim)
            ns[fname] = functools.partial(impl, **n.params) if n.params else impl
            expr = f"{fname}({', '.join(args)})"
        nv += 1
        body.append(f"        {name} = {expr}")
        slot[id(n)] = name
    lines += body or ["        pass"]
    outs = []
    seen: set = set()
    for r in roots:
        k = f"_odt{len(outs)}"
        ns[k] = r.dtype
        copy = isinstance(r, Leaf) or id(r) in seen
        seen.add(id(r))
        if is_scatter(r):  # a whole buffer, not lanes
            outs.append(slot[id(r)])
        elif is_reduction(r):  # one number
            outs.append(f"_finish({slot[id(r)]}, (), {k}, {copy})")
        else:
            outs.append(f"_finish({slot[id(r)]}, shape, {k}, {copy})")
    lines.append(f"    results = ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    lines.append("    return results if out is None else _write_out(out, results)")
    source = "\n".join(lines) + "\n"
    code = builtins.compile(source, "<core_ad.sym.compile>", "exec")
    exec(code, ns)  # noqa: S102 - generated from the program above
    fn = ns["compiled"]
    fn.source = source
    fn.program = prog
    fn.inputs = list(inputs)
    fn.outputs = list(roots)
    fn.backend = "numpy"

    def call_stacked(inputs, num_threads=None):
        """The LLVM kernels' ``call_stacked``: rows of ``inputs`` in, ``(n_out, N)`` out."""
        n = np.shape(inputs)[1]
        return np.stack([np.broadcast_to(r, (n,)) for r in fn(*inputs)])

    fn.call_stacked = call_stacked
    return fn
