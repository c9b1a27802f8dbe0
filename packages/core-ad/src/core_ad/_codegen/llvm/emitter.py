"""The scalar-expression emitter: core_ad expressions to LLVM IR (llvmlite), for any loop nest.

There is ONE emitter. The lane-wise kernel builder (:mod:`.kernel`) calls it twice per kernel
(vector main loop, scalar remainder); sibling packages (halide_ad's loop nests, lsq_opt's
matrix-free kernels) call it from their own loops::

    from core_ad import codegen, sym
    x, y = sym.var("x"), sym.var("y")
    f = sym.sin(x) * y
    val, (gx, gy) = codegen.emit_with_grad(builder, f, [x, y], {x: xv, y: yv})

Values are scalar (``double``) or vector (``<4 x double>``) LLVM values; the emitter works at
the width of the vector values in ``env`` (scalars in ``env`` and constants are splatted).
Booleans are ``i1`` in registers (``i8`` in memory, see :func:`llvm_type`).

The per-primitive lowering is the table :data:`LOWERINGS`, keyed by primitive name;
``register_lowering(name, fn)`` adds one for a user primitive, or the primitive may carry
``extra["llvm_lowering"]``. ``fn(em, node, args)`` gets the :class:`Emitter`, the
:class:`~core_ad._sym.expr.Apply` node and the emitted operand values (a :class:`BufferArg`
for a buffer operand) and returns the value of ``node.dtype`` (``None`` for an effect such as
``lane_scatter_add``). The tests assert that every lane-wise primitive of the rule table has a
lowering.

Semantics follow numpy (the reference backend) exactly where it is cheap to do so: operands of
mixed dtypes are converted the way numpy promotes them (n-ary sums and products fold left
with pairwise promotion, and reuse the shorter products the numpy backend reuses, so the
association order is the numpy backend's); ``maximum``/``minimum`` propagate NaN and return
the second operand on ties; ``sign(+-0) = +0``; casts to bool test ``!= 0`` (NaN is true);
float-to-int casts reproduce numpy's x86 results bit for bit, also for NaN and out-of-range
values (INT_MIN, through int32 for 8/16-bit targets), never LLVM poison; integer ``pow`` is
exact binary exponentiation (a negative exponent, which numpy rejects, gives
``trunc(x**y)``); ``pow`` with a constant exponent 2, 3, 4, -1, -2 or 0.5 is multiplied out
(or ``sqrt``), as numpy does for 2, 3 and 0.5 (the others within 2 ulp of ``pow``). No fast-math flags: results are IEEE, no
contraction into FMAs. Transcendentals go through :class:`~.vecmath.VecMath` (libmvec for
vectors, libm for scalars).

Buffers (``sym.buffer``): ``lane_gather`` reads ``buf[index]`` and ``lane_scatter_add`` adds
into a target (by default the buffer itself; the kernel builder passes per-thread targets).
Both check ``0 <= index < length`` *before* the memory access; on failure the emitter branches
to a new block and calls ``on_bounds_error(builder, failure)``, which must terminate that block
(return an error code, branch to an exit). :class:`BoundsFailure` carries the node, its
ordinal among the checked nodes, the offending lane (within the vector) and index.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
from llvmlite import ir
from llvmlite.ir.instructions import Instruction

from ... import _rules as R
from ..._sym.program import Program, _schedule, cse
from ..._sym.expr import Apply, Const, Expr, Leaf
from ..._sym.graph import as_expr_list
from .vecmath import VecMath, intrinsic

__all__ = [
    "Emitter",
    "BufferArg",
    "BoundsFailure",
    "Unsupported",
    "LOWERINGS",
    "register_lowering",
    "lowering_for",
    "llvm_type",
    "emit",
    "emit_program",
    "emit_with_grad",
]


class Unsupported(NotImplementedError):
    """The LLVM backend cannot compile this program (dtype or primitive without a lowering)."""


class BufferArg(NamedTuple):
    """A whole 1-D buffer: ``ptr`` to its first element (storage type, see
    :func:`llvm_type`) and its ``length`` (an ``i64`` value)."""

    ptr: ir.Value
    length: ir.Value


class BoundsFailure(NamedTuple):
    """What :func:`Emitter.on_bounds_error` receives: the gather/scatter ``node``, its
    ``ordinal`` (0, 1, ... in emission order among checked nodes), the offending ``lane``
    (``i64``, offset within the vector; 0 for scalars) and ``index`` (``i64``)."""

    node: Apply
    ordinal: int
    lane: ir.Value
    index: ir.Value


# --------------------------------------------------------------------------------------------
# types

_I1 = ir.IntType(1)
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def llvm_type(dtype, storage: bool = False) -> ir.Type:
    """The LLVM scalar type of ``dtype`` (bool: ``i1``, or ``i8`` with ``storage=True``)."""
    dt = np.dtype(dtype)
    if dt == np.float64:
        return ir.DoubleType()
    if dt == np.float32:
        return ir.FloatType()
    if dt.kind == "b":
        return _I8 if storage else _I1
    if dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8):
        return ir.IntType(8 * dt.itemsize)
    raise Unsupported(f"dtype {dt} is not supported by the LLVM backend")


def _signed(dt) -> bool:
    return np.dtype(dt).kind == "i"


def _is_float(dt) -> bool:
    return np.dtype(dt).kind == "f"


# --------------------------------------------------------------------------------------------
# the lowering table

Lowering = Callable[["Emitter", Apply, list], "ir.Value | None"]
LOWERINGS: dict[str, Lowering] = {}


def register_lowering(name: str, fn: Lowering | None = None):
    """Register ``fn(em, node, args)`` as the LLVM lowering of primitive ``name`` (usable as a
    decorator). A name may be registered once."""

    def deco(f):
        if name in LOWERINGS:
            raise ValueError(f"primitive {name!r} already has an LLVM lowering")
        LOWERINGS[name] = f
        return f

    return deco(fn) if fn is not None else deco


def lowering_for(prim) -> Lowering | None:
    """The lowering of ``prim``: its ``extra["llvm_lowering"]``, else the table entry of its
    name (a core name only for the rule table's own primitive); None if it has none."""
    fn = prim.extra.get("llvm_lowering")
    if fn is not None:
        return fn
    if prim.name in _CORE_NAMES:
        from ..._sym.simplify import CORE_PRIMITIVES

        return LOWERINGS[prim.name] if prim in CORE_PRIMITIVES else None
    return LOWERINGS.get(prim.name)


_CORE_NAMES: frozenset = frozenset()  # the rule table's names (filled below)


# --------------------------------------------------------------------------------------------
# the emitter


class Emitter:
    """Emits core_ad expressions with an llvmlite ``builder``.

    Args:
        builder: positioned where the code goes (the emitter may add blocks after it for
            bounds checks and integer powers; the builder ends positioned in the last one).
        width: lane count; ``None``: taken from the vector values of ``env`` (scalar if none).
        math: :class:`~.vecmath.VecMath` (default: libmvec if available).
        buffers: ``{buffer_leaf: BufferArg}`` (buffers may also be given in ``env``).
        scatter_targets: ``{scatter_node: BufferArg}`` where ``lane_scatter_add`` accumulates
            (default: into the buffer operand itself, in place).
        on_bounds_error: ``callback(builder, BoundsFailure)``, required when a gather or
            scatter is emitted with ``bounds_check=True``; it must terminate the block.
        atomic_scatter: accumulate with ``atomicrmw`` (for targets shared between threads).
    """

    def __init__(self, builder: ir.IRBuilder, width: int | None = None, *,
                 math: VecMath | None = None, buffers: dict | None = None,
                 scatter_targets: dict | None = None, on_bounds_error=None,
                 bounds_check: bool = True, atomic_scatter: bool = False,
                 c_semantics: bool = False):
        self.b = builder
        # numpy semantics by default (min/max propagate NaN, float->int casts give numpy's
        # value out of range). A DSL whose semantics leave those cases undefined, as C and
        # Halide do, sets c_semantics: min/max/clamp are one compare-and-select (a NaN operand
        # gives the other one) and float->int saturates (NaN -> 0). Results agree wherever
        # numpy's are defined, and every result stays defined (integers still wrap: no
        # "nsw", whose overflow would be poison), so a clamp of any value is a real bound.
        self.c_semantics = c_semantics
        self.width = width
        self.math = math if math is not None else VecMath()
        self.buffers = dict(buffers or {})
        self.scatter_targets = dict(scatter_targets or {})
        self.on_bounds_error = on_bounds_error
        self.bounds_check = bounds_check
        self.atomic_scatter = atomic_scatter
        self.checked: list = []  # the gather/scatter nodes checked, by ordinal
        self._consts: dict = {}
        # id(node) -> (node, value) kept across emit calls when a dict: a caller emitting
        # several statements in one basic-block region shares their common subexpressions
        # (and evicts the entries its own stores invalidate)
        self.memo: dict | None = None

    # ---- types and constants -----------------------------------------------------------
    @property
    def vector(self) -> bool:
        return bool(self.width) and self.width > 1

    def ty(self, dtype) -> ir.Type:
        t = llvm_type(dtype)
        return ir.VectorType(t, self.width) if self.vector else t

    def const(self, value, dtype) -> ir.Value:
        dt = np.dtype(dtype)
        key = (dt.str, np.asarray(value, dt).tobytes())
        c = self._consts.get(key)
        if c is None:
            c = _scalar_const(value, dt)
            if self.vector:
                c = ir.Constant(ir.VectorType(c.type, self.width), [c] * self.width)
            self._consts[key] = c
        return c

    def splat(self, v: ir.Value) -> ir.Value:
        """``v`` at the emitter's width (scalars broadcast)."""
        if not self.vector or isinstance(v.type, ir.VectorType):
            return v
        if isinstance(v, ir.Constant):
            return ir.Constant(ir.VectorType(v.type, self.width), [v] * self.width)
        t = ir.VectorType(v.type, self.width)
        first = self.b.insert_element(ir.Constant(t, ir.Undefined), v, _I32(0))
        return self.b.shuffle_vector(first, ir.Constant(t, ir.Undefined),
                                     ir.Constant(ir.VectorType(_I32, self.width), [0] * self.width))

    # ---- conversions -------------------------------------------------------------------
    def convert(self, v: ir.Value, src, dst) -> ir.Value:
        """``v`` (of dtype ``src``) converted to ``dst`` with numpy's ``astype`` semantics
        (float-to-int saturating; to bool: ``!= 0``)."""
        src, dst = np.dtype(src), np.dtype(dst)
        if src == dst:
            return v
        b = self.b
        tt = self.ty(dst)
        if dst.kind == "b":
            return self.to_bool(v, src)
        if src.kind == "b":
            return b.uitofp(v, tt) if _is_float(dst) else b.zext(v, tt)
        if _is_float(src):
            if _is_float(dst):
                return b.fpext(v, tt) if dst.itemsize > src.itemsize else b.fptrunc(v, tt)
            return self._float_to_int(v, src, dst)
        if _is_float(dst):
            return b.sitofp(v, tt) if _signed(src) else b.uitofp(v, tt)
        if dst.itemsize < src.itemsize:
            return b.trunc(v, tt)
        if dst.itemsize > src.itemsize:
            return b.sext(v, tt) if _signed(src) else b.zext(v, tt)
        return v  # same width, different signedness: the bits are the value

    def _cvtt(self, v, src, bits: int) -> ir.Value:
        """x86 ``cvttsd2si`` semantics: truncate toward zero; NaN and out-of-range values
        give the integer indefinite value INT_MIN (never LLVM poison)."""
        b = self.b
        it = ir.IntType(bits)
        if self.vector:
            it = ir.VectorType(it, self.width)
        lo, hi = -float(2 ** (bits - 1)), float(2 ** (bits - 1))
        if self.c_semantics:
            # saturating (NaN -> 0): defined for every input, so a clamp of the result bounds
            # it -- a plain fptosi would be poison out of range, and poison indices are UB
            if not self.vector:
                return b.call(intrinsic(b.module, "llvm.fptosi.sat", it, [v.type],
                                        overloads=[it, v.type]), [v])
            # x86 scalarises the vector intrinsic (a compare and branch per lane); the same
            # saturation from vector compares and selects stays in vector registers
            above = b.fcmp_ordered(">=", v, self.const(hi, src))
            inside = b.select(b.fcmp_ordered(">=", v, self.const(lo, src)), v,
                              self.const(lo, src))  # NaN and -inf become lo here
            r = b.fptosi(b.select(above, self.const(0.0, src), inside), it)
            int_t = np.dtype(f"int{bits}")
            r = b.select(above, self.const(2 ** (bits - 1) - 1, int_t), r)
            return b.select(b.fcmp_unordered("uno", v, v), self.const(0, int_t), r)
        ok = b.and_(b.fcmp_ordered(">=", v, self.const(lo, src)),
                    b.fcmp_ordered("<", v, self.const(hi, src)))
        r = b.fptosi(v, it)
        return b.select(ok, r, self.const(-(2 ** (bits - 1)), np.dtype(f"int{bits}")))

    def truncate_in_range(self, v, src, dst) -> ir.Value:
        """``convert`` to a signed 32/64-bit int for an operand known to lie inside its range
        or be NaN (``astype(..., in_range=True)``): a plain ``fptosi`` and one select for NaN,
        where the range checks of ``_cvtt`` would cost a compare and a select more per side.
        Equal to ``convert`` on every such operand; an operand that breaks the promise gives
        an arbitrary int, frozen so that it is never poison (a poison index would be UB even
        behind a bounds check)."""
        b = self.b
        nan_value = 0 if self.c_semantics else -(2 ** (8 * dst.itemsize - 1))
        r = b.select(b.fcmp_unordered("uno", v, v), self.const(nan_value, dst),
                     b.fptosi(v, self.ty(dst)))
        frozen = Instruction(b.block, r.type, "freeze", [r])  # llvmlite has no builder.freeze
        b._insert(frozen)
        return frozen

    def _float_to_int(self, v, src, dst) -> ir.Value:
        """numpy's float -> integer ``astype`` on x86, bit for bit (also where C leaves it
        undefined): 8/16-bit targets through int32, signed 32/64-bit directly, unsigned
        32/64-bit by the compiler's split at 2**(bits-1)."""
        b = self.b
        tt = self.ty(dst)
        bits = 8 * dst.itemsize
        if bits < 32:
            return b.trunc(self._cvtt(v, src, 32), tt)
        if _signed(dst):
            return self._cvtt(v, src, bits)
        half = float(2 ** (bits - 1))
        small = b.fcmp_unordered("<", v, self.const(half, src))  # NaN: the first branch
        lo = self._cvtt(v, src, bits)
        hi = b.xor(self._cvtt(b.fsub(v, self.const(half, src)), src, bits),
                   self.const(-(2 ** (bits - 1)), np.dtype(f"int{bits}")))
        return b.select(small, lo, hi)

    def to_bool(self, v, src) -> ir.Value:
        src = np.dtype(src)
        if src.kind == "b":
            return v
        zero = self.const(0, src)
        if _is_float(src):
            return self.b.fcmp_unordered("!=", v, zero)
        return self.b.icmp_unsigned("!=", v, zero)

    # ---- emission ----------------------------------------------------------------------
    def emit(self, exprs, env: dict):
        """Emit ``exprs`` (an Expr or a list) with leaf values ``env``; returns the value (or
        the list of values; ``None`` for a scatter_add)."""
        roots, single = as_expr_list(exprs, "emit")
        prog = cse(roots)
        vals = self.emit_program(prog, env)
        return vals[0] if single else vals

    def emit_program(self, prog: Program, env: dict, on_output=None,
                     ops_per_function: int | None = None) -> list:
        """Emit a :func:`~core_ad.sym.cse` program; returns one value per output.
        ``on_output(k, value)``, if given, is called for output ``k`` as soon as its value is
        emitted (storing it there keeps it from staying live to the end of the program).

        ``ops_per_function``: a program of more operations than this is emitted as a sequence
        of calls to internal functions of at most that many operations each (see
        :meth:`_emit_split`); not with buffers or a memo."""
        env = dict(env)
        self._infer_width(env)
        values: dict[int, object] = {}
        nodes = [n for _, n in prog.assignments]
        names = dict(prog.assignments)
        outputs_of: dict[int, list] = {}
        if on_output is not None:
            for k, o in enumerate(prog.outputs):
                outputs_of.setdefault(id(names[o]), []).append(k)
        order, via = _schedule(nodes)
        if ops_per_function is not None and sum(isinstance(n, Apply) for n in order) > \
                ops_per_function:
            if self.memo is not None or self.buffers or self.scatter_targets:
                raise ValueError("emit: ops_per_function cannot split a program with buffers,"
                                 " scatter targets or a memo")
            out_ids = {id(names[o]): outputs_of.get(id(names[o]), ()) for o in prog.outputs}
            outs = self._emit_split(order, via, env, ops_per_function, out_ids, on_output)
            return [outs[id(names[o])] for o in prog.outputs]
        memo = self.memo
        for n in order:
            if memo is not None and id(n) in memo:
                values[id(n)] = memo[id(n)][1]
            elif isinstance(n, Leaf):
                values[id(n)] = self._leaf_value(n, env)
            elif isinstance(n, Const):
                values[id(n)] = self.const(n.value, n.dtype)
            else:
                values[id(n)] = self._apply_scheduled(n, via, lambda a: values[id(a)])
            if memo is not None:
                memo[id(n)] = (n, values[id(n)])
            for k in outputs_of.get(id(n), ()):
                on_output(k, values[id(n)])
        return [values[id(names[o])] for o in prog.outputs]

    def _emit_split(self, order, via, env, ops_per_function, outputs_of, on_output) -> dict:
        """Emit ``order`` as calls, from the current block, to internal ``noinline``
        functions of at most ``ops_per_function`` operations each. Values crossing a function
        boundary (inputs, values used by a later part, outputs) go through stack arrays, one
        per LLVM type, that every part gets a pointer to: LLVM's register allocator and
        machine scheduler grow faster than linearly with the size of one basic block (a
        30k-operation h2mc Hessian kernel: 15 s at -O1 as one block), so this bounds the cost
        per part and lets large kernels get the optimising code generation.
        ``outputs_of``: ``{id(output node): [output numbers to pass to on_output]}``. Returns
        ``{id(output node): value}`` in the caller's block, where ``on_output`` is called."""
        b = self.b
        part_of = {}  # id(node) -> part index (-1: the caller, None: constants)
        count, part = 0, 0
        for n in order:
            if isinstance(n, Apply):
                if count == ops_per_function:
                    count, part = 0, part + 1
                count += 1
                part_of[id(n)] = part
            else:
                part_of[id(n)] = -1 if isinstance(n, Leaf) else None

        def deps(n):
            if id(n) in via:
                prev, i = via[id(n)]
                return (prev, n.args[i])
            return n.args

        # every value has its dtype's type at the emitter's width (apply checks it)
        slot_of, types, counts = {}, [], []  # id(node) -> (type number, index)

        def add_slot(n):
            if id(n) in slot_of:
                return
            t = self.ty(n.dtype)
            if t not in types:
                types.append(t)
                counts.append(0)
            k = types.index(t)
            slot_of[id(n)] = (k, counts[k])
            counts[k] += 1

        by_id = {id(n): n for n in order}
        for n in order:
            if isinstance(n, Apply):
                for a in deps(n):
                    if part_of[id(a)] not in (None, part_of[id(n)]):
                        add_slot(a)
        for nid in outputs_of:
            if part_of[nid] is not None and part_of[nid] >= 0:
                add_slot(by_id[nid])
        fn = b.function
        with b.goto_block(fn.entry_basic_block):
            b.position_at_start(fn.entry_basic_block)
            areas = [b.bitcast(b.alloca(ir.ArrayType(t, c)), t.as_pointer())
                     for t, c in zip(types, counts)]

        def slot(bases, nid):
            k, i = slot_of[nid]
            return b.gep(bases[k], [_I64(i)])

        main_vals = {}  # values in the caller: inputs, constants, then outputs read back
        for n in order:
            if isinstance(n, Leaf):
                main_vals[id(n)] = v = self._leaf_value(n, env)
                if id(n) in slot_of:
                    b.store(v, slot(areas, id(n)))
            elif isinstance(n, Const):
                main_vals[id(n)] = self.const(n.value, n.dtype)
        by_part = [[] for _ in range(part + 1)]
        for n in order:
            if isinstance(n, Apply):
                by_part[part_of[id(n)]].append(n)
        fnty = ir.FunctionType(ir.VoidType(), [t.as_pointer() for t in types])
        main_block = b.block
        prefix = f"{fn.name}.part"
        first = sum(g.name.startswith(prefix) for g in b.module.functions)  # a second emit
        for p, nodes in enumerate(by_part):
            f = ir.Function(b.module, fnty, f"{prefix}{first + p}")
            f.linkage = "internal"
            f.attributes.add("noinline")
            f.attributes.add("nounwind")
            for a in f.args:
                a.add_attribute("noalias")
            b.position_at_end(f.append_basic_block("entry"))
            local = {}

            def value(a, bases=f.args, local=local):
                v = local.get(id(a))
                if v is None:
                    if part_of[id(a)] is None:  # a constant
                        return main_vals[id(a)]
                    v = local[id(a)] = b.load(slot(bases, id(a)))
                return v

            for n in nodes:
                v = local[id(n)] = self._apply_scheduled(n, via, value)
                if id(n) in slot_of:
                    b.store(v, slot(f.args, id(n)))
            b.ret_void()
            b.position_at_end(main_block)
            b.call(f, areas)
        outs = {}
        for nid, ks in outputs_of.items():
            v = main_vals.get(nid)
            if v is None:
                v = b.load(slot(areas, nid))
            outs[nid] = v
            for k in ks:
                on_output(k, v)
        return outs

    def _apply_scheduled(self, n: Apply, via: dict, value):
        """The value of ``n`` from its operands' (``value(operand)``), as ``_schedule``
        ordered it: an n-ary sum or product with a shorter one in ``via`` is that one op the
        remaining operand."""
        if id(n) in via:
            prev, i = via[id(n)]
            op = "add" if n.prim is R.add_p else "mul"
            return self.binop(op, value(prev), prev.dtype, value(n.args[i]), n.args[i].dtype,
                              n.dtype)
        return self.apply(n, [value(a) for a in n.args])

    def apply(self, node: Apply, args: list):
        fn = lowering_for(node.prim)
        if fn is None:
            raise Unsupported(
                f"primitive {node.prim.name!r} has no LLVM lowering; register one with"
                " core_ad.codegen.register_lowering(name, fn) or"
                " extra={'llvm_lowering': fn}, or compile with backend='numpy'"
            )
        v = fn(self, node, args)
        if v is not None and v.type != self.ty(node.dtype):
            raise TypeError(
                f"lowering of {node.prim.name!r} returned {v.type}, expected"
                f" {self.ty(node.dtype)} ({node.dtype})"
            )
        return v

    def _infer_width(self, env):
        widths = {v.type.count for v in env.values()
                  if isinstance(v, ir.Value) and isinstance(v.type, ir.VectorType)}
        if len(widths) > 1:
            raise ValueError(f"emit: leaf values have different vector widths {sorted(widths)}")
        if widths:
            w = widths.pop()
            if self.width not in (None, 1, w):
                raise ValueError(f"emit: leaf values have {w} lanes, the emitter {self.width}")
            if self.width != w:
                self.width = w
                self._consts.clear()

    def _leaf_value(self, n: Leaf, env):
        v = env.get(n)
        if v is None:
            v = self.buffers.get(n)
        if v is None:
            raise ValueError(f"emit: no value given for leaf {n.name!r}")
        if isinstance(v, BufferArg):
            return v
        want = llvm_type(n.dtype)
        got = v.type.element if isinstance(v.type, ir.VectorType) else v.type
        if got != want:
            raise TypeError(f"emit: leaf {n.name!r} ({n.dtype}) needs {want} values, got {v.type}")
        return self.splat(v)

    # ---- arithmetic helpers ------------------------------------------------------------
    def binop(self, op: str, a, adt, b, bdt, out_dt) -> ir.Value:
        """``a op b`` for op in add/sub/mul/div computed in ``out_dt`` (operands converted)."""
        out = np.dtype(out_dt)
        a = self.convert(a, adt, out)
        b = self.convert(b, bdt, out)
        bld = self.b
        if _is_float(out):
            return {"add": bld.fadd, "sub": bld.fsub, "mul": bld.fmul, "div": bld.fdiv}[op](a, b)
        if out.kind == "b":
            return {"add": bld.or_, "mul": bld.and_}[op](a, b)
        return {"add": bld.add, "sub": bld.sub, "mul": bld.mul}[op](a, b)

    def fold(self, op: str, node: Apply, args: list) -> ir.Value:
        """Left fold of an n-ary add/mul with numpy's pairwise promotion."""
        acc, acc_dt = args[0], node.args[0].dtype
        for a, n in zip(args[1:], node.args[1:]):
            dt = np.result_type(acc_dt, n.dtype)
            acc = self.binop(op, acc, acc_dt, a, n.dtype, dt)
            acc_dt = dt
        return self.convert(acc, acc_dt, node.dtype)

    def cmp(self, op: str, a, adt, b, bdt) -> ir.Value:
        dt = np.result_type(adt, bdt)
        a = self.convert(a, adt, dt)
        b = self.convert(b, bdt, dt)
        if _is_float(dt):
            if op == "!=":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(op, a, b)
        if _signed(dt):
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def isnan(self, v, dt) -> ir.Value:
        if not _is_float(dt):
            return self.const(False, np.bool_)
        return self.b.fcmp_unordered("uno", v, v)

    def call_intrinsic(self, name: str, *args) -> ir.Value:
        t = args[0].type
        return self.b.call(intrinsic(self.b.module, name, t, [a.type for a in args]), list(args))

    def any_true(self, mask: ir.Value) -> ir.Value:
        """An ``i1`` that is true if any lane of ``mask`` is."""
        if not isinstance(mask.type, ir.VectorType):
            return mask
        bits = self.b.bitcast(mask, ir.IntType(mask.type.count))
        return self.b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0))

    def lanes(self):
        return range(self.width) if self.vector else [None]

    def extract(self, v, k):
        return v if k is None else self.b.extract_element(v, _I32(k))

    # ---- bounds checks -----------------------------------------------------------------
    def check_bounds(self, node: Apply, idx64: ir.Value, length: ir.Value) -> None:
        """Branch to an error block unless ``0 <= idx64 < length`` on every lane."""
        ordinal = len(self.checked)
        self.checked.append(node)
        if not self.bounds_check:
            return
        if self.on_bounds_error is None:
            raise ValueError(
                "emit: a gather/scatter_add needs on_bounds_error=callback(builder, failure)"
                " (or bounds_check=False when the indices are known to be in range)"
            )
        b = self.b
        bad = b.icmp_unsigned(">=", idx64, self.splat(length))  # negative: huge unsigned
        anybad = self.any_true(bad)
        fn = b.function
        fail = fn.append_basic_block(f"oob{ordinal}")
        ok = fn.append_basic_block(f"inb{ordinal}")
        br = b.cbranch(anybad, fail, ok)
        br.set_weights([1, 1 << 20])
        b.position_at_end(fail)
        if self.vector:
            bits = b.bitcast(bad, ir.IntType(self.width))
            tz = b.call(intrinsic(b.module, "llvm.cttz", bits.type, [bits.type, _I1]),
                        [bits, _I1(0)])
            lane = b.zext(tz, _I64) if self.width < 64 else tz
            index = b.extract_element(idx64, lane)
        else:
            lane, index = _I64(0), idx64
        self.on_bounds_error(b, BoundsFailure(node, ordinal, lane, index))
        if not b.block.is_terminated:
            raise ValueError("emit: on_bounds_error must terminate the error block")
        b.position_at_end(ok)

    def index64(self, idx, dt) -> ir.Value:
        dt = np.dtype(dt)
        if dt.itemsize == 8:
            return idx
        t = ir.VectorType(_I64, self.width) if self.vector else _I64
        return self.b.sext(idx, t) if _signed(dt) else self.b.zext(idx, t)


def _scalar_const(value, dt: np.dtype) -> ir.Constant:
    t = llvm_type(dt)
    if _is_float(dt):
        return ir.Constant(t, float(dt.type(value)))
    if dt.kind == "b":
        return ir.Constant(t, int(bool(value)))
    v = int(dt.type(value))
    bits = 8 * dt.itemsize
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return ir.Constant(t, v)


# --------------------------------------------------------------------------------------------
# lowerings


def _conv_all(em, node, args, dt=None):
    dt = node.dtype if dt is None else dt
    return [em.convert(a, n.dtype, dt) for a, n in zip(args, node.args)]


def _lower_add(em, node, args):
    return em.fold("add", node, args)


def _lower_mul(em, node, args):
    return em.fold("mul", node, args)


def _lower_sub(em, node, args):
    return em.binop("sub", args[0], node.args[0].dtype, args[1], node.args[1].dtype, node.dtype)


def _lower_div(em, node, args):
    return em.binop("div", args[0], node.args[0].dtype, args[1], node.args[1].dtype, node.dtype)


def _lower_neg(em, node, args):
    (x,) = _conv_all(em, node, args)
    if _is_float(node.dtype):
        return em.b.fneg(x)
    return em.b.sub(em.const(0, node.dtype), x)


def _lower_identity(em, node, args):
    return em.convert(args[0], node.args[0].dtype, node.dtype)


def _lower_safe_mul(em, node, args):
    a, p = _conv_all(em, node, args)
    dt = node.dtype
    if not _is_float(dt):
        return em.binop("mul", a, dt, p, dt, dt)
    r = em.b.fmul(a, p)
    zero = em.const(0.0, dt)
    return em.b.select(em.b.fcmp_ordered("==", a, zero), zero, r)


def _small_int_exponent(node):
    y = node.args[1]
    if not isinstance(y, Const) or y.dtype.kind not in "iuf":
        return None
    v = float(y.value)
    if v in (2.0, 3.0, 4.0, -1.0, -2.0, 0.5):
        return v
    return None


def _lower_pow(em, node, args):
    dt = node.dtype
    x, y = _conv_all(em, node, args)
    b = em.b
    if not _is_float(dt):
        return _int_pow(em, x, y, dt)
    k = _small_int_exponent(node)
    if k == 2.0:
        return b.fmul(x, x)
    if k == 3.0:
        return b.fmul(b.fmul(x, x), x)
    if k == 4.0:
        x2 = b.fmul(x, x)
        return b.fmul(x2, x2)
    if k == -1.0:
        return b.fdiv(em.const(1.0, dt), x)
    if k == -2.0:
        return b.fdiv(em.const(1.0, dt), b.fmul(x, x))
    if k == 0.5:
        return em.call_intrinsic("llvm.sqrt", x)
    return em.math.call(b, "pow", [x, y], dt)


def _int_pow(em, x, y, dt):
    """Exact integer power by binary exponentiation (a small loop over the exponent's bits)."""
    b = em.b
    one, zero = em.const(1, dt), em.const(0, dt)
    if _signed(dt):
        neg = b.icmp_signed("<", y, zero)
        e0 = b.select(neg, zero, y)
    else:
        neg = None
        e0 = y
    pre = b.block
    fn = b.function
    loop = fn.append_basic_block("ipow")
    done = fn.append_basic_block("ipow.done")
    b.branch(loop)
    b.position_at_end(loop)
    r = b.phi(x.type)
    base = b.phi(x.type)
    e = b.phi(x.type)
    r.add_incoming(one, pre)
    base.add_incoming(x, pre)
    e.add_incoming(e0, pre)
    odd = b.icmp_unsigned("!=", b.and_(e, one), zero)
    r2 = b.select(odd, b.mul(r, base), r)
    base2 = b.mul(base, base)
    e2 = b.lshr(e, one)
    r.add_incoming(r2, loop)
    base.add_incoming(base2, loop)
    e.add_incoming(e2, loop)
    b.cbranch(em.any_true(b.icmp_unsigned("!=", e2, zero)), loop, done)
    b.position_at_end(done)
    if neg is None:
        return r2
    # x**-k: 1 for x == 1, +-1 for x == -1 (by parity), 0 otherwise (trunc of the real power)
    minus1 = em.const(-1, dt)
    odd_y = b.icmp_unsigned("!=", b.and_(y, one), zero)
    at_m1 = b.select(odd_y, minus1, one)
    small = b.select(b.icmp_signed("==", x, one), one,
                     b.select(b.icmp_signed("==", x, minus1), at_m1, zero))
    return b.select(neg, small, r2)


def _math(name):
    def lower(em, node, args):
        xs = _conv_all(em, node, args)
        return em.math.call(em.b, name, xs, node.dtype)

    lower.__name__ = f"_lower_{name}"
    return lower


def _lower_sqrt(em, node, args):
    (x,) = _conv_all(em, node, args)
    return em.call_intrinsic("llvm.sqrt", x)


def _lower_rsqrt(em, node, args):
    (x,) = _conv_all(em, node, args)
    return em.b.fdiv(em.const(1.0, node.dtype), em.call_intrinsic("llvm.sqrt", x))


def _lower_abs(em, node, args):
    (x,) = _conv_all(em, node, args)
    dt = node.dtype
    if _is_float(dt):
        return em.call_intrinsic("llvm.fabs", x)
    if _signed(dt):
        neg = em.b.icmp_signed("<", x, em.const(0, dt))
        return em.b.select(neg, em.b.sub(em.const(0, dt), x), x)
    return x


def _minmax(em, op, a, c, dt):
    """numpy's maximum (op ">") / minimum (op "<"): NaN propagates, ties give ``c``."""
    b = em.b
    if _is_float(dt):
        pick = b.fcmp_ordered(op, a, c)
        if em.c_semantics:
            return b.select(pick, a, c)
        return b.select(em.isnan(a, dt), a, b.select(pick, a, c))
    cmp = b.icmp_signed if _signed(dt) else b.icmp_unsigned
    return b.select(cmp(op, a, c), a, c)


def _lower_maximum(em, node, args):
    a, c = _conv_all(em, node, args)
    return _minmax(em, ">", a, c, node.dtype)


def _lower_minimum(em, node, args):
    a, c = _conv_all(em, node, args)
    return _minmax(em, "<", a, c, node.dtype)


def _lower_clamp(em, node, args):
    x, lo, hi = _conv_all(em, node, args)
    return _minmax(em, "<", _minmax(em, ">", x, lo, node.dtype), hi, node.dtype)


def _lower_sign(em, node, args):
    (x,) = _conv_all(em, node, args)
    dt = node.dtype
    b = em.b
    one, zero, m1 = em.const(1, dt), em.const(0, dt), None
    if dt.kind == "b":
        return x
    if _is_float(dt):
        m1 = em.const(-1, dt)
        mid = b.select(em.isnan(x, dt), x, zero)
        return b.select(b.fcmp_ordered(">", x, zero), one,
                        b.select(b.fcmp_ordered("<", x, zero), m1, mid))
    if _signed(dt):
        m1 = em.const(-1, dt)
        return b.select(b.icmp_signed(">", x, zero), one,
                        b.select(b.icmp_signed("<", x, zero), m1, zero))
    return b.select(b.icmp_unsigned("!=", x, zero), one, zero)


def _rounding(intr):
    def lower(em, node, args):
        (x,) = _conv_all(em, node, args)
        if _is_float(node.dtype):
            return em.call_intrinsic(intr, x)
        return x  # integers are already integral

    return lower


def _int_divmod(em, a, c, dt):
    """numpy's integer floor_divide and mod, without traps: by 0 both give 0, and by -1 the
    quotient is the wrapping negation (INT_MIN // -1 = INT_MIN, as numpy)."""
    b = em.b
    zero, one = em.const(0, dt), em.const(1, dt)
    by_zero = b.icmp_unsigned("==", c, zero)
    if not _signed(dt):
        safe = b.select(by_zero, one, c)
        return (b.select(by_zero, zero, b.udiv(a, safe)),
                b.select(by_zero, zero, b.urem(a, safe)))
    by_m1 = b.icmp_signed("==", c, em.const(-1, dt))
    special = b.or_(by_zero, by_m1)
    safe = b.select(special, one, c)
    q, r = b.sdiv(a, safe), b.srem(a, safe)
    # truncation rounds toward 0: step down when the remainder and divisor signs differ
    fix = b.and_(b.icmp_signed("!=", r, zero),
                 b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", safe, zero)))
    q = b.select(fix, b.sub(q, one), q)
    r = b.select(fix, b.add(r, safe), r)
    q = b.select(by_zero, zero, b.select(by_m1, b.sub(zero, a), q))
    return q, b.select(special, zero, r)


def _float_divmod(em, a, c, dt):
    """numpy's float divmod (npy_divmod): fmod, sign fix-up, then a floored quotient."""
    b = em.b
    zero, one = em.const(0.0, dt), em.const(1.0, dt)
    m = raw = b.frem(a, c)
    div = b.fdiv(b.fsub(a, m), c)
    nonzero = b.fcmp_unordered("!=", m, zero)
    fix = b.and_(nonzero, b.xor(b.fcmp_ordered("<", c, zero), b.fcmp_ordered("<", m, zero)))
    m = b.select(fix, b.fadd(m, c), m)
    div = b.select(fix, b.fsub(div, one), div)
    # a zero remainder takes the divisor's sign
    m = b.select(nonzero, m, em.call_intrinsic("llvm.copysign", zero, c))
    fl = em.call_intrinsic("llvm.floor", div)
    fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), em.const(0.5, dt)), b.fadd(fl, one), fl)
    # div == 0: the quotient is a signed zero (copysign(0, a / b))
    q = b.select(b.fcmp_ordered("==", div, zero),
                 em.call_intrinsic("llvm.copysign", zero, b.fdiv(a, c)), fl)
    # c == 0: numpy gives a / c for the quotient and fmod's NaN for the remainder
    by_zero = b.fcmp_ordered("==", c, zero)
    q = b.select(by_zero, b.fdiv(a, c), q)
    m = b.select(by_zero, raw, m)
    return q, m


def _power_of_two(node):
    """k if ``node`` is the integer constant 2**k (k >= 0), else None."""
    if not isinstance(node, Const) or node.dtype.kind not in "iu":
        return None
    v = int(node.value)
    return v.bit_length() - 1 if v > 0 and v & (v - 1) == 0 else None


def _divmod(which):
    def lower(em, node, args):
        a, c = _conv_all(em, node, args)
        dt = node.dtype
        if _is_float(dt):
            return _float_divmod(em, a, c, dt)[which]
        if dt.kind == "b":
            raise Unsupported(f"{node.prim.name} of booleans")
        k = _power_of_two(node.args[1])
        if k is not None:  # floor semantics by 2**k: an arithmetic shift / a mask
            if which == 0:
                shift = em.const(k, dt)
                return em.b.ashr(a, shift) if _signed(dt) else em.b.lshr(a, shift)
            return em.b.and_(a, em.const((1 << k) - 1, dt))
        return _int_divmod(em, a, c, dt)[which]

    return lower


def _compare(op):
    def lower(em, node, args):
        return em.cmp(op, args[0], node.args[0].dtype, args[1], node.args[1].dtype)

    return lower


def _logical(op):
    def lower(em, node, args):
        a, c = (em.to_bool(v, n.dtype) for v, n in zip(args, node.args))
        return em.b.and_(a, c) if op == "and" else em.b.or_(a, c)

    return lower


def _lower_logical_not(em, node, args):
    x = em.to_bool(args[0], node.args[0].dtype)
    return em.b.xor(x, em.const(True, np.bool_))


def _lower_isfinite(em, node, args):
    dt = node.args[0].dtype
    if not _is_float(dt):
        return em.const(True, np.bool_)
    a = em.call_intrinsic("llvm.fabs", args[0])
    return em.b.fcmp_ordered("!=", a, em.const(np.inf, dt))


def _lower_isnan(em, node, args):
    return em.isnan(args[0], node.args[0].dtype)


def _lower_cast(em, node, args):
    src, dst = node.args[0].dtype, node.dtype
    if node.params.get("in_range") and _is_float(src) and dst in (np.int32, np.int64):
        return em.truncate_in_range(args[0], src, dst)
    return em.convert(args[0], src, dst)


def _lower_select(em, node, args):
    c = em.to_bool(args[0], node.args[0].dtype)
    a = em.convert(args[1], node.args[1].dtype, node.dtype)
    d = em.convert(args[2], node.args[2].dtype, node.dtype)
    return em.b.select(c, a, d)


def _buffer_operand(node, arg, what):
    if not isinstance(arg, BufferArg):
        raise TypeError(f"{what}: operand 0 must be a buffer (BufferArg), got {arg!r}")
    return arg


def _lower_lane_gather(em, node, args):
    buf = _buffer_operand(node, args[0], "lane_gather")
    idx = em.index64(args[1], node.args[1].dtype)
    em.check_bounds(node, idx, buf.length)
    b = em.b
    dt = node.dtype
    st = llvm_type(dt, storage=True)
    ptr = buf.ptr
    if ptr.type != st.as_pointer():
        ptr = b.bitcast(ptr, st.as_pointer())
    align = max(1, np.dtype(dt).itemsize)
    if not em.vector:
        v = b.load(b.gep(ptr, [idx]), align=align)
    else:
        v = ir.Constant(ir.VectorType(st, em.width), ir.Undefined)
        for k in range(em.width):
            i = b.extract_element(idx, _I32(k))
            v = b.insert_element(v, b.load(b.gep(ptr, [i]), align=align), _I32(k))
    if np.dtype(dt).kind == "b":
        v = b.icmp_unsigned("!=", v, ir.Constant(v.type, None))
    return v


def _lower_lane_scatter_add(em, node, args):
    buf = _buffer_operand(node, args[0], "lane_scatter_add")
    target = em.scatter_targets.get(node, buf)
    dt = node.dtype  # the buffer's dtype
    idx = em.index64(args[1], node.args[1].dtype)
    val = em.convert(args[2], node.args[2].dtype, dt)
    em.check_bounds(node, idx, target.length)
    b = em.b
    st = llvm_type(dt, storage=True)
    ptr = target.ptr
    if ptr.type != st.as_pointer():
        ptr = b.bitcast(ptr, st.as_pointer())
    align = max(1, np.dtype(dt).itemsize)
    kind = np.dtype(dt).kind
    if kind == "b":
        val = b.zext(val, st) if not em.vector else b.zext(val, ir.VectorType(st, em.width))
    for k in em.lanes():
        i = em.extract(idx, k)
        v = em.extract(val, k)
        p = b.gep(ptr, [i])
        if em.atomic_scatter:
            op = "fadd" if kind == "f" else ("or" if kind == "b" else "add")
            b.atomic_rmw(op, p, v, "monotonic")
        else:
            old = b.load(p, align=align)
            if kind == "f":
                new = b.fadd(old, v)
            elif kind == "b":
                new = b.or_(old, v)
            else:
                new = b.add(old, v)
            b.store(new, p, align=align)
    return None


for _name, _fn in {
    "add": _lower_add,
    "mul": _lower_mul,
    "sub": _lower_sub,
    "div": _lower_div,
    "neg": _lower_neg,
    "identity": _lower_identity,
    "stop_gradient": _lower_identity,
    "safe_mul": _lower_safe_mul,
    "pow": _lower_pow,
    "exp": _math("exp"),
    "expm1": _math("expm1"),
    "log": _math("log"),
    "log1p": _math("log1p"),
    "sin": _math("sin"),
    "cos": _math("cos"),
    "tan": _math("tan"),
    "asin": _math("asin"),
    "acos": _math("acos"),
    "atan": _math("atan"),
    "sinh": _math("sinh"),
    "cosh": _math("cosh"),
    "tanh": _math("tanh"),
    "erf": _math("erf"),
    "atan2": _math("atan2"),
    "sqrt": _lower_sqrt,
    "rsqrt": _lower_rsqrt,
    "abs": _lower_abs,
    "maximum": _lower_maximum,
    "minimum": _lower_minimum,
    "clamp": _lower_clamp,
    "sign": _lower_sign,
    "floor": _rounding("llvm.floor"),
    "ceil": _rounding("llvm.ceil"),
    "round": _rounding("llvm.rint"),
    "trunc": _rounding("llvm.trunc"),
    "floor_divide": _divmod(0),
    "mod": _divmod(1),
    "lt": _compare("<"),
    "le": _compare("<="),
    "gt": _compare(">"),
    "ge": _compare(">="),
    "eq": _compare("=="),
    "ne": _compare("!="),
    "logical_and": _logical("and"),
    "logical_or": _logical("or"),
    "logical_not": _lower_logical_not,
    "isfinite": _lower_isfinite,
    "isnan": _lower_isnan,
    "cast": _lower_cast,
    "convert": _lower_cast,
    "select": _lower_select,
    "lane_gather": _lower_lane_gather,
    "lane_scatter_add": _lower_lane_scatter_add,
    # a lane's contribution to the sum is its operand; the kernel accumulates the outputs
    "lane_sum": lambda em, node, args: args[0],
}.items():
    register_lowering(_name, _fn)
del _name, _fn

_CORE_NAMES = frozenset(LOWERINGS)


# --------------------------------------------------------------------------------------------
# module-level conveniences


def emit(builder: ir.IRBuilder, exprs, env: dict, **kw):
    """Emit ``exprs`` (an Expr, a list of Exprs) with leaf values ``env`` (``{leaf: value}``,
    buffers as :class:`BufferArg`); returns the value or the list of values. ``kw``: see
    :class:`Emitter`."""
    return Emitter(builder, **kw).emit(exprs, env)


def emit_program(builder: ir.IRBuilder, prog: Program, env: dict, **kw) -> list:
    """Emit a :func:`~core_ad.sym.cse` program; one value per output."""
    return Emitter(builder, **kw).emit_program(prog, env)


def emit_with_grad(builder: ir.IRBuilder, expr: Expr, wrt, env: dict, *, hessian=False, **kw):
    """Emit ``expr`` and its gradient with respect to ``wrt`` (a list of leaves/nodes) in one
    common-subexpression-shared program: ``(value, [d expr / d w for w in wrt])``, plus the
    Hessian (nested list) as a third element with ``hessian=True``."""
    from ..._sym.diff import grad as _grad, hessian as _hessian

    wrt = list(wrt) if isinstance(wrt, list | tuple) else [wrt]
    g = _grad(expr, wrt)
    outs = [expr] + list(g)
    H = None
    if hessian:
        H = _hessian(expr, wrt)
        outs += [h for row in H for h in row]
    vals = Emitter(builder, **kw).emit(outs, env)
    n = len(wrt)
    if not hessian:
        return vals[0], vals[1:1 + n]
    hv = vals[1 + n:]
    return vals[0], vals[1:1 + n], [hv[i * n:(i + 1) * n] for i in range(n)]

