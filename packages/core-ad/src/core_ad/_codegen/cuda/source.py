"""CUDA C emission from a ``cse`` :class:`~core_ad._sym.program.Program`.

One ``extern "C" __global__`` kernel per compiled graph, with a grid-stride loop over the
lanes. Every node of the straight-line program becomes one typed local (``const T v_t3 =
...;``), so an operand is always an identifier (or a cast of one) and a spelling may use it
more than once. The spelling of a lane-wise primitive is its rule-table ``cspell``, with the
float32 names of the C math functions (``expf``, ``fmaxf`` ...) for float32 operations and a
few backend overrides where the C spelling's semantics differ from the reference ``impl``
(documented at :data:`_OVERRIDES`).

Kernel signature (the launcher in :mod:`.launcher` follows it)::

    extern "C" __global__ void NAME(
        const long long n,                       // number of lanes
        // per input k, in the order of `inputs`:
        const T* __restrict__ in<k>, const long long s<k>,    // per-lane leaf: stride 1,
                                                              //   or 0 for a 0-d array
        const T* __restrict__ in<k>, const long long len<k>,  // sym.buffer leaf: its length
        // per output j, in the order of `outputs`:
        T* __restrict__ out<j>,                  // per-lane output: n elements, or the whole
                                                 //   buffer of a scatter_add output (the
                                                 //   launcher pre-fills it with a copy)
        unsigned long long* __restrict__ err)    // {site, lane, index}; site 0: no error

A gather or scatter_add whose index is negative or not below the buffer length skips the
access and records the first such event (``atomicCAS`` on ``err[0]``) as the 1-based access
site, the lane and the index; the launcher turns it into an :class:`IndexError`.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

import numpy as np

from ... import _rules as R
from ..._primitives import Primitive
from ..._sym.buffers import is_buffer, is_reduction, is_scatter
from ..._sym.expr import Apply, Const, Leaf
from ..._sym.program import Program, _describe, check_inputs, check_program, cse
from ..._sym.simplify import CORE_PRIMITIVES
from .writer import CudaWriter

__all__ = [
    "KernelSpec",
    "c_literal",
    "c_type",
    "cuda_source",
    "kernel_spec",
    "program_spec",
    "spell",
    "DEFAULT_NAME",
]

DEFAULT_NAME = "core_ad_kernel"

_CTYPES = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char",
    np.dtype(np.int16): "short",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

# dtypes a scatter_add may accumulate into (atomicAdd exists for these element types)
_ATOMIC_DTYPES = frozenset(
    np.dtype(t) for t in (np.float32, np.float64, np.int32, np.uint32, np.int64, np.uint64)
)


def c_type(dtype, what: str = "a value") -> str:
    """The C type of a numpy dtype; a TypeError naming ``what`` for unsupported dtypes."""
    dt = np.dtype(dtype)
    try:
        return _CTYPES[dt]
    except KeyError:
        raise TypeError(
            f"cuda backend: dtype {dt} of {what} is not supported (supported: bool, int8-64,"
            " uint8-64, float32, float64)"
        ) from None


def c_literal(value, dtype) -> str:
    """A C expression for the constant ``value`` of ``dtype``, exactly representing it.

    float32 literals carry an ``f`` suffix; infinities and NaNs are spelled by their bit
    patterns (``__int_as_float`` / ``__longlong_as_double``), which need no header.
    """
    dt = np.dtype(dtype)
    c_type(dt, f"the constant {value!r}")
    if dt.kind == "b":
        return "true" if bool(value) else "false"
    if dt.kind == "f":
        v = np.asarray(value, dtype=dt)[()]
        if not np.isfinite(v):
            if dt == np.float32:
                bits = int(np.asarray(v, np.float32).view(np.uint32))
                return f"__int_as_float((int){bits:#010x}U)"
            bits = int(np.asarray(v, np.float64).view(np.uint64))
            return f"__longlong_as_double((long long){bits:#018x}ULL)"
        if dt == np.float32:
            s = str(np.float32(v))  # shortest decimal that round-trips in float32
            if not any(ch in s for ch in ".en"):
                s += ".0"
            return s + "f"
        s = repr(float(v))  # shortest decimal that round-trips in float64
        return s
    v = int(value)
    if dt == np.int64:
        return "(-9223372036854775807LL - 1)" if v == -(2**63) else f"{v}LL"
    if dt == np.uint64:
        return f"{v}ULL"
    if dt == np.int32:
        return "(-2147483647 - 1)" if v == -(2**31) else f"{v}"
    if dt == np.uint32:
        return f"{v}U"
    return f"(({_CTYPES[dt]}){v})"


# --------------------------------------------------------------------------------------------
# spellings

_F32_FUNCS = (
    "exp expm1 log log1p sqrt sin cos tan asin acos atan atan2 sinh cosh tanh erf fabs fmax fmin"
    " pow floor ceil rint trunc"
).split()
_F32_RE = re.compile(r"\b(" + "|".join(_F32_FUNCS) + r")\(")


def float32_spelling(template: str) -> str:
    """``template`` with the C math functions renamed to their float32 versions."""
    return _F32_RE.sub(lambda m: m.group(1) + "f(", template)


_JOIN_OPS = frozenset("+ - * / % & | ^ && || << >>".split())
_COMPARE = frozenset((R.lt_p, R.le_p, R.gt_p, R.ge_p, R.eq_p, R.ne_p))
_LOGICAL = frozenset((R.logical_and_p, R.logical_or_p, R.logical_not_p))
_ROUNDING = frozenset((R.floor_p, R.ceil_p, R.round_p, R.trunc_p))

_NAN_ANY2 = "(({0}) != ({0}) || ({1}) != ({1}))"
# Backend overrides of a core primitive's cspell, by (primitive, "float" | "int"). Why:
# * maximum / minimum / clamp: C's fmax/fmin drop a NaN operand, numpy's maximum/minimum (the
#   reference impl) propagate it; integer operands must not go through double.
# * sign: the cspell gives 0 for NaN, numpy gives NaN.
# * isnan / isfinite: spelled arithmetically, so they need no header and accept integers.
# * abs / floor / ceil / round / trunc / pow on integers: numpy keeps the integer dtype.
_OVERRIDES = {
    (R.maximum_p, "float"): "(" + _NAN_ANY2 + " ? ({0}) + ({1}) : fmax({0}, {1}))",
    (R.maximum_p, "int"): "(({0}) > ({1}) ? ({0}) : ({1}))",
    (R.minimum_p, "float"): "(" + _NAN_ANY2 + " ? ({0}) + ({1}) : fmin({0}, {1}))",
    (R.minimum_p, "int"): "(({0}) < ({1}) ? ({0}) : ({1}))",
    (R.clamp_p, "float"): "((({0}) != ({0}) || ({1}) != ({1}) || ({2}) != ({2}))"
    " ? ({0}) + ({1}) + ({2}) : fmin(fmax({0}, {1}), {2}))",
    (R.clamp_p, "int"): "(((({0}) > ({1})) ? ({0}) : ({1})) < ({2})"
    " ? ((({0}) > ({1})) ? ({0}) : ({1})) : ({2}))",
    (R.sign_p, "float"): "(({0}) > 0 ? 1 : (({0}) < 0 ? -1 : (({0}) == 0 ? 0 : ({0}))))",
    (R.abs_p, "int"): "(({0}) < 0 ? -({0}) : ({0}))",
    (R.pow_p, "int"): "core_ad_ipow({0}, {1})",
    (R.isnan_p, "float"): "(({0}) != ({0}))",
    (R.isnan_p, "int"): "false",
    (R.isfinite_p, "float"): "(({0}) - ({0}) == ({0}) - ({0}))",
    (R.isfinite_p, "int"): "true",
}
for _p in _ROUNDING:
    _OVERRIDES[(_p, "int")] = "({0})"
_OVERRIDES[(R.abs_p, "bool")] = "({0})"


def _no_spelling(prim: Primitive) -> NotImplementedError:
    return NotImplementedError(
        f"cuda backend: primitive {prim.name!r} has no C spelling (Primitive.cspell is None),"
        " so it cannot appear in a generated kernel; register it with a cspell template over"
        " its operands, e.g. cspell='myfunc({0}, {1})'"
    )


def _fields(prim: Primitive, template: str, nargs: int) -> None:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise NotImplementedError(
            f"cuda backend: the C spelling {template!r} of primitive {prim.name!r} is not a"
            f" valid format template: {e}"
        ) from None
    for _, fname, _, _ in parsed:
        if fname is None:
            continue
        if not fname.isdigit() or int(fname) >= nargs:
            raise NotImplementedError(
                f"cuda backend: the C spelling {template!r} of primitive {prim.name!r} refers to"
                f" {{{fname}}}, but the node has {nargs} operand{'s' if nargs != 1 else ''}"
            )


def _family(dt: np.dtype) -> str:
    return "float" if dt.kind == "f" else ("bool" if dt.kind == "b" else "int")


def _template(prim: Primitive, arg_dtypes, out_dtype):
    """(template or infix operator, operand dtypes to cast to (None: as is))."""
    nargs = len(arg_dtypes)
    if prim not in CORE_PRIMITIVES:
        if prim.cspell is None:
            raise _no_spelling(prim)
        t = prim.cspell
        if all(np.dtype(d) == np.float32 for d in (*arg_dtypes, out_dtype)):
            t = float32_spelling(t)
        return t, [None] * nargs
    T = np.dtype(out_dtype)
    if prim in _COMPARE:
        common = np.result_type(*arg_dtypes)
        return prim.cspell, [common] * nargs
    if prim in _LOGICAL:
        return prim.cspell, [None] * nargs
    if prim in (R.isnan_p, R.isfinite_p):
        fam = "float" if np.dtype(arg_dtypes[0]).kind == "f" else "int"
        return _OVERRIDES[(prim, fam)], [None]
    if prim is R.select_p:
        return prim.cspell, [None, T, T]
    fam = _family(T)
    t = _OVERRIDES.get((prim, fam))
    if t is None and fam == "bool":
        t = _OVERRIDES.get((prim, "int"))
    if t is None:
        t = prim.cspell
    if t is None:
        raise _no_spelling(prim)
    if T == np.float32:
        t = float32_spelling(t)
    return t, [T] * nargs


def _cast(name: str, have: np.dtype, want) -> str:
    """``name`` (of dtype ``have``) converted to ``want`` with numpy's ``astype`` values on
    x86, as the LLVM backend gives them: a plain C cast, except float -> integer, where C
    leaves NaN and out-of-range values undefined and the device saturates (NaN -> 0, so a
    NaN-derived index would silently read element 0); the preamble's ``core_ad_cvtt*``
    give x86's integer indefinite (the minimum integer) there, which bounds checks catch."""
    if want is None or np.dtype(want) == np.dtype(have):
        return name
    have, want = np.dtype(have), np.dtype(want)
    if have.kind == "f" and want.kind in "iu":
        bits = 8 * want.itemsize
        if bits < 32:  # through int32, then truncated (numpy's astype does the same)
            return f"(({c_type(want)})core_ad_cvtt32({name}))"
        return f"core_ad_cvtt{'u' if want.kind == 'u' else ''}{bits}({name})"
    return f"(({c_type(want)}){name})"


def spell(prim: Primitive, operands, arg_dtypes, out_dtype) -> str:
    """The C expression of the lane-wise ``prim`` over C operand expressions.

    ``operands``: C expressions (identifiers are safest: a spelling may repeat an operand);
    ``arg_dtypes``: their numpy dtypes; ``out_dtype``: the node's dtype. Operands are cast as
    numpy would promote them (arithmetic in the result dtype, comparisons in the operands'
    common dtype). The scalar-expression emitter that sibling code generators (halide_ad,
    lsq_opt) can call for their own loop nests. Raises NotImplementedError naming the primitive
    when it has no C spelling; gather/scatter (buffer operands) are emitted by the kernel
    writer, not here.
    """
    nargs = len(operands)
    arg_dtypes = [np.dtype(d) for d in arg_dtypes]
    out_dtype = np.dtype(out_dtype)
    c_type(out_dtype, f"the result of {prim.name}")
    for d in arg_dtypes:
        c_type(d, f"an operand of {prim.name}")
    if prim.extra.get("buffer_args"):
        raise NotImplementedError(
            f"cuda backend: primitive {prim.name!r} takes whole buffers; only the rule table's"
            " lane_gather / lane_scatter_add are supported in generated kernels"
        )
    if prim is R.cast_p or prim is R.convert_p:
        return _cast(f"({operands[0]})", arg_dtypes[0], out_dtype)
    template, want = _template(prim, arg_dtypes, out_dtype)
    ops = [_cast(o, d, w) for o, d, w in zip(operands, arg_dtypes, want)]
    if "{" not in template and (prim.variadic or template.strip() in _JOIN_OPS):
        # an infix operator joining the operands (variadic add / mul)
        if nargs < 2:
            raise NotImplementedError(
                f"cuda backend: primitive {prim.name!r} joins its operands with"
                f" {template.strip()!r} but has {nargs} operand(s)"
            )
        return "(" + f" {template.strip()} ".join(ops) + ")"
    _fields(prim, template, nargs)
    return template.format(*ops)


# --------------------------------------------------------------------------------------------
# the kernel

LANE = "lane"
BUFFER = "buffer"
SCATTER = "scatter"
SUM = "sum"


@dataclass(frozen=True)
class KernelSpec:
    """A generated kernel and what its launcher needs to know.

    ``input_kinds[k]``: ``"lane"`` (per-lane array or 0-d scalar) or ``"buffer"`` (whole 1-D
    array). ``output_kinds[j]``: ``("lane", None)``, ``("scatter", k)`` (a copy of input
    buffer ``k`` accumulated into) or ``("sum", None)`` (one zeroed number every lane adds
    into atomically). ``sites[s - 1]``: ``(op, buffer name, input index)`` of
    bounds-checked access site ``s`` (the value the kernel stores in ``err[0]``).
    """

    name: str
    source: str
    program: Program
    inputs: tuple
    roots: tuple
    input_kinds: tuple
    output_kinds: tuple
    sites: tuple
    params: tuple = field(default=())  # the C parameter declarations (one per input/output)


_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _comment(text: str) -> str:
    """``text`` made safe inside a ``//`` comment (no line continuation, no control chars)."""
    return re.sub(r"[^A-Za-z0-9_ ,.:'()\[\]+-]", "?", str(text))[:80]


def prepare(outputs, inputs, where: str = "compile_cuda"):
    """Validate like :func:`core_ad.sym.compile`: (roots, inputs, program)."""
    roots, _, inputs = check_inputs(outputs, inputs, where)
    prog = cse(roots)
    check_program(prog, roots, inputs, where)
    return roots, inputs, prog


def _check_name(name) -> str:
    if not isinstance(name, str) or not _IDENT_RE.fullmatch(name):
        raise ValueError(f"cuda backend: kernel name {name!r} is not a C identifier")
    return name


def kernel_spec(outputs, inputs, name: str = DEFAULT_NAME) -> KernelSpec:
    """Generate the CUDA kernel for ``outputs`` over ``inputs`` (see the module docstring)."""
    _check_name(name)
    roots, inputs, prog = prepare(outputs, inputs, "cuda_source")
    return _Writer(prog, roots, inputs, name).spec()


def program_spec(prog: Program, roots, inputs, name: str = DEFAULT_NAME) -> KernelSpec:
    """The kernel of an already checked program (``sym.compile`` validated ``roots`` /
    ``inputs`` and built ``prog = cse(roots)``)."""
    return _Writer(prog, list(roots), list(inputs), _check_name(name)).spec()


def cuda_source(outputs, inputs, name: str = DEFAULT_NAME) -> str:
    """The CUDA C source of the kernel computing ``outputs`` from ``inputs``."""
    return kernel_spec(outputs, inputs, name).source


def _is_two(e) -> bool:
    return isinstance(e, Const) and e.dtype.kind in "fiu" and float(e.value) == 2.0


def spell_node(n: Apply, operands) -> str:
    """The C expression of the lane-wise node ``n`` over C operand expressions: :func:`spell`
    of its primitive, except a float power by the constant 2, spelled ``x * x`` (exact, as
    numpy's fast path for squares and the LLVM backend give it)."""
    if n.prim is R.pow_p and n.dtype.kind == "f" and _is_two(n.args[1]):
        x = _cast(operands[0], n.args[0].dtype, n.dtype)
        return f"({x} * {x})"
    return spell(n.prim, operands, [a.dtype for a in n.args], n.dtype)


def _buffer_label(n: Apply) -> str:
    """The array a gather / scatter node indexes, as its errors name it: the node's ``name``
    (the traced array's label) or the buffer's."""
    return str((n.params or {}).get("name") or n.args[0].key)


class _Writer:
    def __init__(self, prog: Program, roots, inputs, name: str):
        self.prog = prog
        self.roots = roots
        self.inputs = inputs
        self.name = name
        self.input_index = {id(v): k for k, v in enumerate(inputs)}
        self.local: dict[int, str] = {}
        self.sites: list = []
        self.used: set[int] = set()

    def ref(self, node) -> str:
        self.used.add(id(node))
        return self.local[id(node)]

    def _buffer_operand(self, n: Apply, pos: int) -> int:
        b = n.args[pos]
        if not is_buffer(b):
            raise TypeError(
                f"cuda backend: operand {pos} of {n.prim.name} must be a sym.buffer, got"
                f" {_describe(b)}"
            )
        return self.input_index[id(b)]

    def _check_operands(self, n: Apply) -> None:
        bargs = set(n.prim.extra.get("buffer_args", ()))
        for pos, a in enumerate(n.args):
            if pos not in bargs and is_buffer(a):
                raise TypeError(
                    f"cuda backend: buffer {a.name!r} is used as a per-lane operand of"
                    f" {n.prim.name}; read it with sym.gather(buffer, index)"
                )

    def spec(self) -> KernelSpec:
        params = ["const long long n"]
        input_kinds = []
        for k, v in enumerate(self.inputs):
            ct = c_type(v.dtype, f"input {v.name!r}")
            if is_buffer(v):
                input_kinds.append(BUFFER)
                params.append(f"const {ct}* __restrict__ in{k}, const long long len{k}")
            else:
                input_kinds.append(LANE)
                params.append(f"const {ct}* __restrict__ in{k}, const long long s{k}")
        output_kinds = []
        for j, r in enumerate(self.roots):
            if is_buffer(r):
                raise ValueError(
                    f"cuda backend: output {j} is the whole buffer {r.name!r}; outputs are"
                    " per-lane values or scatter_add results"
                )
            if is_scatter(r):
                k = self._buffer_operand(r, 0)
                if r.dtype not in _ATOMIC_DTYPES:
                    raise NotImplementedError(
                        f"cuda backend: scatter_add into buffer {r.args[0].name!r} of dtype"
                        f" {r.dtype} is not supported (atomicAdd needs float32, float64 or"
                        " 32/64-bit integer elements)"
                    )
                output_kinds.append((SCATTER, k))
            elif is_reduction(r):
                if r.dtype not in _ATOMIC_DTYPES:
                    raise NotImplementedError(
                        f"cuda backend: lane_sum of dtype {r.dtype} is not supported"
                        " (atomicAdd needs float32 or float64)"
                    )
                output_kinds.append((SUM, None))
            else:
                output_kinds.append((LANE, None))
            params.append(f"{c_type(r.dtype, f'output {j}')}* __restrict__ out{j}")
        params.append("unsigned long long* __restrict__ err")

        pre: list = []  # (node, declaration) of constants, hoisted out of the loop
        body = CudaWriter(preamble=False)  # one lane's statements
        for pname, n in self.prog.assignments:
            var = f"v_{pname}"
            if isinstance(n, Leaf):
                k = self.input_index[id(n)]
                self.local[id(n)] = var
                if not is_buffer(n):
                    body.line(f"const {c_type(n.dtype)} {var} = in{k}[i * s{k}];")
                continue
            if isinstance(n, Const):
                self.local[id(n)] = var
                pre.append((n, f"const {c_type(n.dtype, 'a constant')} {var} ="
                               f" {c_literal(n.value, n.dtype)};"))
                continue
            self._check_operands(n)
            prim = n.prim
            if is_scatter(n) or is_reduction(n):
                continue  # an output: accumulated after the lane's values are computed
            if prim is R.lane_gather_p:
                k = self._buffer_operand(n, 0)
                ct = c_type(n.dtype, "a gather")
                self.sites.append(("gather", _buffer_label(n), k))
                body.line(f"{ct} {var} = ({ct})0;")
                body.checked(self.ref(n.args[1]), f"len{k}", len(self.sites), "i",
                             f"{var} = in{k}[ix];")
                self.local[id(n)] = var
                continue
            expr = spell_node(n, [self.ref(a) for a in n.args])
            body.line(f"const {c_type(n.dtype)} {var} = {expr};")
            self.local[id(n)] = var
        for j, r in enumerate(self.roots):
            if is_scatter(r):
                k = self._buffer_operand(r, 0)
                self.sites.append(("scatter_add", _buffer_label(r), k))
                val = _cast(self.ref(r.args[2]), r.args[2].dtype, r.dtype)
                body.checked(self.ref(r.args[1]), f"len{k}", len(self.sites), "i",
                             CudaWriter.atomic_add(f"out{j}[ix]", val))
            elif is_reduction(r):
                body.line(CudaWriter.atomic_add(f"out{j}[0]", self.ref(r.args[0])))
            else:
                body.line(f"out{j}[i] = {self.ref(r)};")

        notes = ["lanes"] + [f"{kind} input {_comment(v.name)}"
                             for kind, v in zip(input_kinds, self.inputs)]
        notes += [f"output {j}" + (f": scatter_add into {_comment(self.roots[j].args[0].name)}"
                                   if kind == SCATTER else "")
                  for j, (kind, _) in enumerate(output_kinds)]
        notes.append("error slot {site, lane, index}")
        w = CudaWriter()
        with w.kernel(self.name, list(zip(params, notes))):
            if not self.sites:
                w.line("(void)err;")
            for c, decl in pre:
                if id(c) in self.used:
                    w.line(decl)
            with w.grid_stride_loop("i", "n"):
                w.extend(body)
        return KernelSpec(
            name=self.name,
            source=w.source(),
            program=self.prog,
            inputs=tuple(self.inputs),
            roots=tuple(self.roots),
            input_kinds=tuple(input_kinds),
            output_kinds=tuple(output_kinds),
            sites=tuple(self.sites),
            params=tuple(params),
        )
