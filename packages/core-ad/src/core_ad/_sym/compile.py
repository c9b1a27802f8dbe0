"""Straight-line programs (``cse``) and compilation to vectorised numpy callables."""

from __future__ import annotations

import builtins
import functools
import keyword
import re
from typing import NamedTuple

import numpy as np

from .. import _rules as R
from .expr import Apply, Const, Expr, Leaf
from .buffers import check_scatter_outputs, is_buffer, is_scatter
from .graph import as_expr_list, toposort
from .simplify import impl_of

__all__ = ["Program", "cse", "compile", "evaluate"]


class Program(NamedTuple):
    """A straight-line program: ``assignments`` is a list of ``(name, node)`` in topological
    order (leaves, constants and operations; each distinct node once -- hash-consing makes
    the DAG the CSE'd program), ``outputs`` the names of the outputs, in order."""

    assignments: list
    outputs: list

    def names(self) -> dict:
        """``{node: name}``."""
        return {n: name for name, n in self.assignments}

    def __str__(self) -> str:
        names = self.names()
        lines = []
        for name, n in self.assignments:
            if isinstance(n, Apply):
                args = ", ".join(names[a] for a in n.args)
                extra = "".join(f", {k}={v!r}" for k, v in n.params.items())
                lines.append(f"{name} = {n.prim.name}({args}{extra})")
            elif isinstance(n, Const):
                lines.append(f"{name} = {n.value!r}")
            else:
                lines.append(f"{name} = input {n.name}")
        lines.append("return " + ", ".join(self.outputs))
        return "\n".join(lines)


_IDENT = re.compile(r"[^0-9a-zA-Z_]")


def _leaf_name(leaf: Leaf, used: set) -> str:
    base = _IDENT.sub("_", leaf.name).strip("_") or "leaf"
    if base[0].isdigit() or keyword.iskeyword(base) or re.fullmatch(r"[tc]\d+", base):
        base = "in_" + base
    name, i = base, 1
    while name in used:
        name = f"{base}_{i}"
        i += 1
    used.add(name)
    return name


def cse(outputs) -> Program:
    """The straight-line program computing ``outputs`` (an Expr or a list of Exprs)."""
    roots, _ = as_expr_list(outputs, "cse")
    used: set = set()
    names: dict[int, str] = {}
    assigns = []
    nt = nc = 0
    for n in toposort(roots):
        if isinstance(n, Leaf):
            name = _leaf_name(n, used)
        elif isinstance(n, Const):
            name = f"c{nc}"
            nc += 1
        else:
            name = f"t{nt}"
            nt += 1
        names[id(n)] = name
        assigns.append((name, n))
    return Program(assigns, [names[id(r)] for r in roots])


def _describe(x) -> str:
    if isinstance(x, Expr):
        return f"a {type(x).__name__} node {x!r}"
    return f"an object of type {type(x).__name__}"


def _finish(r, shape, dt, copy):
    r = np.asarray(r)
    if r.dtype != dt:
        r = r.astype(dt)
        copy = False
    if r.shape != shape:
        return np.array(np.broadcast_to(r, shape))
    return r.copy() if copy else r


_CHUNK = 16
_INFIX = {R.add_p: " + ", R.mul_p: " * ", R.sub_p: " - ", R.div_p: " / "}


_NARY = (R.add_p, R.mul_p)


def _nary_key(n, skip=None):
    ids = sorted(map(id, n.args))
    if skip is not None:
        ids.remove(skip)
    return (n.prim, n.dtype, tuple(ids))


def _schedule(nodes):
    """Evaluation order, and for n-ary sums/products the reuse of a shorter one.

    Flattening turns the adjoint chain of reverse mode, a_k = a_{k+1} * cos(e_k), into n-ary
    products that share all but one factor. Where the program also contains the product of
    all factors but one, the node is evaluated as (that product) op (the remaining factor): one
    operation per node instead of one per factor. The shorter product becomes an extra
    dependency of the longer one (no cycle: its operands are a subset of the longer one's).
    """
    table = {}
    for n in nodes:
        if isinstance(n, Apply) and n.prim in _NARY and not n.params:
            table.setdefault(_nary_key(n), n)
    via = {}
    for n in nodes:
        if isinstance(n, Apply) and n.prim in _NARY and not n.params and len(n.args) >= 3:
            for i, a in enumerate(n.args):
                prev = table.get(_nary_key(n, id(a)))
                if prev is not None and prev is not n:
                    via[id(n)] = (prev, i)
                    break
    if not via:
        return list(nodes), via
    order, done = [], set()
    for r in nodes:  # nodes are children-first; add the extra dependencies, iteratively
        if id(r) in done:
            continue
        stack = [r]
        while stack:
            n = stack[-1]
            if id(n) in done:
                stack.pop()
                continue
            deps = list(n.args)
            if id(n) in via:
                deps.append(via[id(n)][0])
            pending = [d for d in deps if id(d) not in done]
            if pending:
                stack.extend(pending)
            else:
                stack.pop()
                done.add(id(n))
                order.append(n)
    return order, via


def check_inputs(outputs, inputs, where: str):
    """``(roots, single, inputs)``: the outputs as a list (and whether one Expr was given) and
    the inputs as a list of distinct vars / leaves, or a TypeError / ValueError naming the
    problem. Every backend (and the interop bridges) validates this way."""
    roots, single = as_expr_list(outputs, where)
    if isinstance(inputs, Expr):
        inputs = [inputs]
    if not isinstance(inputs, list | tuple):
        raise TypeError(f"{where}: inputs must be a list of vars/leaves, got"
                        f" {type(inputs).__name__}")
    inputs = list(inputs)
    for i, v in enumerate(inputs):
        if not isinstance(v, Leaf):
            raise TypeError(f"{where}: input {i} must be a var or leaf, got {_describe(v)}")
    if len({id(v) for v in inputs}) != len(inputs):
        dup = next(v for i, v in enumerate(inputs) if any(v is w for w in inputs[:i]))
        raise ValueError(f"{where}: input {dup.name!r} is listed twice")
    return roots, single, inputs


def check_program(prog: Program, roots, inputs, where: str) -> None:
    """Scatter outputs only as outputs, and every leaf the outputs use among the inputs."""
    check_scatter_outputs(prog, roots)
    in_ids = {id(v) for v in inputs}
    missing = [n.name for _, n in prog.assignments if isinstance(n, Leaf) and id(n) not in in_ids]
    if missing:
        raise ValueError(
            f"{where}: the outputs depend on leaves that are not among the inputs: "
            + ", ".join(missing)
        )


def compile(outputs, inputs, backend: str | None = None, **options):  # noqa: A001
    """Compile ``outputs`` into ``fn(*arrays)`` evaluating them over arrays of lanes.

    ``inputs``: the vars / leaves, in the order ``fn`` takes its arrays. Every leaf the
    outputs depend on must be listed (extra inputs are allowed). ``fn`` returns a tuple with
    one numpy array per output, of the output's dtype (constant outputs are broadcast).

    ``backend`` (see :mod:`core_ad._codegen`): ``None`` -- the default, ``"llvm"`` when
    llvmlite imports (else ``"numpy"``; ``CORE_AD_BACKEND`` overrides), falling back to numpy
    for programs LLVM cannot lower (user primitives without a lowering);

    * ``"numpy"``: the reference evaluator. At call time the arrays are converted to their
      leaf's dtype and broadcast together into the lane shape. The callable is generated
      once, as Python source over the topologically ordered program (``fn.source``,
      ``fn.program``); floating-point warnings of masked-off lanes are silenced.
    * ``"llvm"``: a vectorised, multi-threaded kernel (:mod:`core_ad._codegen.llvm`), cached
      by graph structure (a second compile returns the same object). Strict inputs: exact
      dtypes, 1-D arrays of N lanes or 0-d scalars; ``fn.compile_time``; ``options``:
      ``vectorize``, ``libmvec``, ``scatter``.
    * ``"cuda"``: not available yet.
    """
    from .. import _codegen

    backend, auto = _codegen.resolve_backend(backend)
    roots, _, inputs = check_inputs(outputs, inputs, "compile")
    if backend != "numpy":
        hit = _codegen.lookup(backend, roots, inputs, options)
        if hit is not None:
            return hit
    prog = cse(roots)
    check_program(prog, roots, inputs, "compile")
    return _codegen.compile_program(backend, prog, roots, inputs, options, auto=auto,
                                    fallback=lambda: _compile_numpy(prog, roots, inputs))


def _compile_numpy(prog: Program, roots, inputs):
    ns: dict = {
        "_asarray": np.asarray,
        "_bshapes": np.broadcast_shapes,
        "_errstate": np.errstate,
        "_finish": _finish,
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
    lines = ["def compiled(*args):", f"    if len(args) != {n_in}:",
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
        else:
            outs.append(f"_finish({slot[id(r)]}, shape, {k}, {copy})")
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    source = "\n".join(lines) + "\n"
    code = builtins.compile(source, "<core_ad.sym.compile>", "exec")
    exec(code, ns)  # noqa: S102 - generated from the program above
    fn = ns["compiled"]
    fn.source = source
    fn.program = prog
    fn.inputs = list(inputs)
    fn.outputs = list(roots)
    fn.backend = "numpy"
    return fn


def evaluate(outputs, env: dict):
    """Evaluate expressions for ``env = {leaf: array}`` (compiles once per call; for repeated
    evaluation keep the result of :func:`compile`). Returns an array or a list, following
    ``outputs``."""
    roots, single = as_expr_list(outputs, "evaluate")
    leaves = list(env.keys())
    fn = compile(roots, leaves, backend="numpy")  # one-off: no kernel compilation
    res = fn(*[env[k] for k in leaves])
    return res[0] if single else list(res)
