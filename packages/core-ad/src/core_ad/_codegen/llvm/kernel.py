"""The lane-wise kernel builder: a cse Program to one LLVM function over a range of lanes.

Signature of the generated function (C ABI)::

    int32 kernel(int64 start, int64 end, int8 **ptrs, int64 *lens, int64 *err)

``ptrs`` holds one data pointer per input (in input order), then one per output; ``lens`` the
length of each buffer input at the same positions and of each scatter output's target after
them. Lanes ``[start, end)`` are computed: a main loop in explicit vector form, ``W`` lanes at a
time (``<W x T>`` values; transcendentals through libmvec, see :mod:`.vecmath`), then a scalar
remainder loop (libm). ``W`` is the ISA's width for the widest float type of the program
(AVX2: 4 if any float64 / int64 value is present, else 8; AVX-512: 8 / 16; SSE: 2 / 4); the
emitter pads or splits libmvec calls of the other float type. Inputs marked scalar in the
*variant* (0-d arrays broadcast to every lane) are loaded once before the loops. A program of
more than ``SPLIT_OPS`` operations (and no buffers) runs as calls to internal functions of
``PART_OPS`` operations each, the values crossing them in stack arrays.

The *strided* variant reads every lane input and writes every lane output with a stride
(in elements) taken from ``lens`` at its position (gathers and scatters in the vector loop):
the columns of a row-major (N, width) block, read and written in place, without the
transposing copies a caller would otherwise make (edge_rt's kernels: a quarter of a render).

A failed bounds check of a gather / scatter_add stores ``err[0] = 1``, ``err[1]`` = the
check's ordinal, ``err[2]`` = the lane, ``err[3]`` = the index, and returns 1 before any
out-of-range access; the Python side raises IndexError (:mod:`.runtime`).

``lane_scatter_add`` outputs accumulate into ``ptrs[output]`` (a copy of the buffer or a
per-thread partial, plain load/add/store in lane order) or, in the ``atomic`` variant, into one
shared copy with ``atomicrmw``.

A ``lane_sum`` output is one number per call, the sum over lanes ``[start, end)`` stored at
``ptrs[output][0]`` (the caller adds the calls' partials). It is accumulated with Neumaier's
compensated summation in a vector of partial sums (the padded lanes of the staged tail
masked off), then over the vector's lanes in order: the error stays a few ulps of the sum's
magnitude whatever the lane count, where a plain running sum would grow with it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir

from ..._sym.buffers import is_buffer, is_reduction, is_scatter
from ..._sym.expr import Apply
from ..._sym.program import Program
from .builder import loop, masked_gather, masked_scatter, splat, vector_loop
from .emitter import BufferArg, Emitter, Unsupported, llvm_type, lowering_for
from .vecmath import VecMath, intrinsic

__all__ = ["KernelIR", "build_kernel", "check_supported", "vector_width", "CHECKED_PRIMS"]

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)

CHECKED_PRIMS = ("lane_gather", "lane_scatter_add")

# Programs of more operations than SPLIT_OPS (and no buffers) are emitted as a sequence of
# internal functions of PART_OPS operations each (Emitter.emit_program's ops_per_function).
# LLVM's greedy register allocator and machine scheduler grow faster than linearly with the
# size of one basic block, so such kernels were compiled at -O0 (spilling nearly every value:
# slow code); in parts they get the optimising code generation in about linear time. Measured
# on h2mc's length-3 rough-glass Hessian kernel (31.8k operations, one thread): one block at
# -O0 1.6 s, 23 us per lane; one block at -O1 15 s, 3.7 us; parts of 1000 at -O3 3.7 s,
# 3.1 us (parts of 3000: 5.4 s, 3.4 us). See docs/design/core_ad.md.
SPLIT_OPS = 6000
PART_OPS = 1000


class KernelIR(NamedTuple):
    """The IR text, the function name, the vector width, and per bounds check (by ordinal)
    ``(op name, buffer name, input position of the buffer or output position of the
    target)``."""

    text: str
    name: str
    width: int
    checks: list
    parts: int = 1  # functions the program was split into (see SPLIT_OPS)


def check_supported(prog: Program, roots, inputs) -> None:
    """Raise :class:`~.emitter.Unsupported` if the LLVM backend cannot compile ``prog``."""
    for _, n in prog.assignments:
        llvm_type(n.dtype)  # raises for complex, float16, ...
        if isinstance(n, Apply) and lowering_for(n.prim) is None:
            raise Unsupported(
                f"primitive {n.prim.name!r} has no LLVM lowering (register one with"
                " core_ad.codegen.register_lowering, or compile with backend='numpy')"
            )
        if isinstance(n, Apply):
            ba = n.prim.extra.get("buffer_args", ())
            for k, a in enumerate(n.args):
                if (k in ba) != is_buffer(a):
                    raise Unsupported(
                        f"{n.prim.name}: operand {k} must {'' if k in ba else 'not '}be a"
                        " sym.buffer"
                    )
    for r in roots:
        if is_buffer(r):
            raise Unsupported(
                f"buffer {str(r.key)!r} cannot be an output of a lane-wise kernel (outputs are"
                " lanes or scatter_add results)"
            )


def vector_width(prog: Program, math: VecMath) -> int:
    """Lanes per vector iteration: the ISA's width for 64-bit elements if the program has any
    64-bit value (float64, int64), else for 32-bit elements."""
    if any(n.dtype.itemsize >= 8 for _, n in prog.assignments if not is_buffer(n)):
        return math.width(np.float64)
    return math.width(np.float32)


def build_kernel(prog: Program, roots, inputs, *, name: str, math: VecMath,
                 scalar_mask=(), vectorize: bool = True, atomic: bool = False,
                 strided: bool = False) -> KernelIR:
    """The IR of the kernel computing ``roots`` over ``inputs`` (see the module docstring).

    ``scalar_mask[j]``: input ``j`` is one value broadcast to every lane; ``vectorize=False``
    gives a scalar loop only; ``atomic``: scatter_add with atomic adds; ``strided``: lane
    inputs and outputs at the strides in ``lens``.
    """
    n_in = len(inputs)
    mask = tuple(scalar_mask) or (False,) * n_in
    width = vector_width(prog, math) if vectorize else 1
    module = ir.Module(name=name)
    fnty = ir.FunctionType(_I32, [_I64, _I64, _I8P.as_pointer(), _I64.as_pointer(),
                                  _I64.as_pointer()])
    fn = ir.Function(module, fnty, name)
    start, end, ptrs, lens, err = fn.args
    for a, nm in zip(fn.args, ("start", "end", "ptrs", "lens", "err")):
        a.name = nm
    for a in (ptrs, lens, err):
        a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    # ---- pointers, lengths, hoisted scalars ----------------------------------------------
    def data_ptr(pos, dtype):
        p = b.load(b.gep(ptrs, [_I64(pos)]), align=8)
        return b.bitcast(p, llvm_type(dtype, storage=True).as_pointer())

    def length(pos):
        return b.load(b.gep(lens, [_I64(pos)]), align=8)

    in_ptrs, buffers, scalars = {}, {}, {}
    strides = {}  # the strided variant: ("in", input) / ("out", k) -> stride in elements
    for j, v in enumerate(inputs):
        p = data_ptr(j, v.dtype)
        if is_buffer(v):
            buffers[v] = BufferArg(p, length(j))
        elif mask[j]:
            scalars[v] = _load(b, p, _I64(0), v.dtype, None)
        else:
            in_ptrs[v] = p
            if strided:
                strides["in", v] = length(j)
    out_ptrs = []
    targets = {}
    seen_scatter = set()
    for k, r in enumerate(roots):
        p = data_ptr(n_in + k, r.dtype)
        out_ptrs.append(p)
        if is_scatter(r) and id(r) not in seen_scatter:
            seen_scatter.add(id(r))
            targets[r] = BufferArg(p, length(n_in + k))
        elif strided and not is_scatter(r) and not is_reduction(r):
            strides["out", k] = length(n_in + k)
    sums = {k: _Accumulator(b, r.dtype, width) for k, r in enumerate(roots)
            if is_reduction(r)}
    entry = b.block
    exit_ok = fn.append_basic_block("exit")
    exit_err = fn.append_basic_block("error")
    failures = []  # (block, ordinal, lane, index) of every bounds-check failure branch
    checked = []

    def body(i, w, lane0=None, in_over=None, out_over=None, tail=None):
        """Loads at lane ``i``, the program at width ``w``, stores. ``lane0`` (default ``i``)
        is the first lane's number for error reports; ``in_over`` / ``out_over`` replace the
        input / output pointers where ``tail`` (the staged tail: contiguous copies) holds."""
        lane0 = i if lane0 is None else lane0
        env = dict(scalars)

        def stride(key):
            s = strides.get(key)
            return s if s is None or tail is None else b.select(tail, _I64(1), s)

        for v, p in in_ptrs.items():
            env[v] = _load(b, (in_over or {}).get(v, p), i, v.dtype, w, stride(("in", v)))

        def on_error(bld, failure):
            lane = bld.add(lane0, failure.lane)
            failures.append((bld.block, _I64(failure.ordinal), lane, failure.index))
            bld.branch(exit_err)

        em = Emitter(b, w, math=math, buffers=buffers, scatter_targets=targets,
                     on_bounds_error=on_error, atomic_scatter=atomic)
        def store(k, v):  # as soon as the value exists: it need not stay live to the end
            if k in sums:
                v = em.splat(v) if w is not None else v
                if out_over is not None:  # the staged tail's padding lanes add nothing
                    v = b.select(_lanes_before(b, lane0, end, w), v,
                                 ir.Constant(v.type, None))
                sums[k].add(v)
            elif not is_scatter(roots[k]):
                _store(b, (out_over or {}).get(k, out_ptrs[k]), i, v, roots[k].dtype, w, em,
                       stride(("out", k)))

        em.emit_program(prog, env, on_output=store, ops_per_function=part_ops)
        if not checked:
            checked.extend(em.checked)

    n_ops = sum(isinstance(n, Apply) for _, n in prog.assignments)
    part_ops = PART_OPS if n_ops > SPLIT_OPS and not (buffers or targets) else None
    if width > 1 and not targets:
        # One copy of the program: the last, partial group of lanes runs the vector code on
        # staged copies (inputs padded with the last lane, outputs copied back lane by lane)
        # instead of a scalar remainder loop, which halves the code to optimise and compile.
        _staged_loop(b, fn, body, entry, start, end, width, in_ptrs, roots, out_ptrs, strides,
                     exit_ok)
    else:  # a scatter: padded lanes must not add anything, so a scalar remainder loop
        vector_loop(b, start, end, width, body)
        b.branch(exit_ok)

    b.position_at_end(exit_ok)
    for k, acc in sums.items():
        b.store(acc.total(), out_ptrs[k], align=roots[k].dtype.itemsize)
    b.ret(_I32(0))

    b.position_at_end(exit_err)
    if failures:
        phis = [b.phi(_I64) for _ in range(3)]
        for blk, ordv, lane, idx in failures:
            for ph, v in zip(phis, (ordv, lane, idx)):
                ph.add_incoming(v, blk)
        b.store(_I64(1), b.gep(err, [_I64(0)]), align=8)
        for k, ph in enumerate(phis):
            b.store(ph, b.gep(err, [_I64(k + 1)]), align=8)
        b.ret(_I32(1))
    else:
        b.unreachable()
    checks = []
    for n in checked:
        buf = n.args[0]
        if n.prim.name == "lane_gather":
            pos = next(k for k, v in enumerate(inputs) if v is buf)
        else:
            pos = n_in + next(k for k, r in enumerate(roots) if r is n)
        checks.append((n.prim.name, str(buf.key), pos))
    text = str(module)
    if width > 1 and width * max(llvm_type_bytes(prog)) > 32:
        # 512-bit vectors (AVX-512): make the backend pass them in zmm registers, as libmvec's
        # 'e' variants expect, even on CPUs that prefer 256-bit vectors
        text = _add_fn_attr(text, name, '"min-legal-vector-width"="512"')  # parts too
    return KernelIR(text, name, width, checks, -(-n_ops // part_ops) if part_ops else 1)


class _Accumulator:
    """Neumaier-compensated running sums (a vector of them and a scalar one) in stack slots
    that LLVM promotes to registers."""

    def __init__(self, b, dtype, width):
        self.b = b
        self.ty = llvm_type(dtype)
        self.slots = {}
        for w in {1, width}:
            t = self.ty if w == 1 else ir.VectorType(self.ty, w)
            pair = (b.alloca(t), b.alloca(t))
            for p in pair:
                b.store(ir.Constant(t, None), p)
            self.slots[w] = pair

    def add(self, y):
        b = self.b
        w = y.type.count if isinstance(y.type, ir.VectorType) else 1
        ps, pc = self.slots[w]
        s, c = _neumaier(b, b.load(ps), b.load(pc), y)
        b.store(s, ps)
        b.store(c, pc)

    def total(self):
        """The sum of every lane's and the scalar partials, in lane order."""
        b = self.b
        s, c = (b.load(p) for p in self.slots[1])
        for w, (ps, pc) in self.slots.items():
            if w == 1:
                continue
            vs, vc = b.load(ps), b.load(pc)
            for k in range(w):
                s, c = _neumaier(b, s, c, b.extract_element(vs, _I32(k)))
                c = b.fadd(c, b.extract_element(vc, _I32(k)))
        # an infinite or NaN sum makes the compensation NaN: report the sum itself then
        finite = b.fcmp_ordered("<", _fabs(b, s), ir.Constant(self.ty, float("inf")))
        return b.select(finite, b.fadd(s, c), s)


def _neumaier(b, s, c, y):
    """One step of Neumaier's summation: the new sum and compensation."""
    t = b.fadd(s, y)
    s_bigger = b.fcmp_ordered(">=", _fabs(b, s), _fabs(b, y))
    lost = b.select(s_bigger, b.fadd(b.fsub(s, t), y), b.fadd(b.fsub(y, t), s))
    return t, b.fadd(c, lost)


def _fabs(b, v):
    return b.call(intrinsic(b.module, "llvm.fabs", v.type, [v.type]), [v])


def _lanes_before(b, lane0, end, w):
    """The mask of the ``w`` lanes from ``lane0`` that are below ``end``."""
    iota = ir.Constant(ir.VectorType(_I64, w), list(range(w)))
    return b.icmp_signed("<", b.add(splat(b, lane0, w), iota), splat(b, end, w))


def _staged_loop(b, fn, body, entry, start, end, width, in_ptrs, roots, out_ptrs, strides,
                 exit_ok):
    """Lanes [start, end), W at a time; a partial last group goes through stack copies
    (contiguous, whatever the strides of the lanes they copy)."""
    W = width
    stage_in, stage_out = {}, {}
    with b.goto_block(entry):
        b.position_at_start(entry)
        for v in in_ptrs:
            st = llvm_type(v.dtype, storage=True)
            stage_in[v] = b.bitcast(b.alloca(ir.ArrayType(st, W)), st.as_pointer())
        for k, r in enumerate(roots):
            if is_reduction(r):  # one number, not lanes
                continue
            st = llvm_type(r.dtype, storage=True)
            stage_out[k] = b.bitcast(b.alloca(ir.ArrayType(st, W)), st.as_pointer())
    head = fn.append_basic_block("vec.head")
    check = fn.append_basic_block("vec.check")
    stage = fn.append_basic_block("tail.stage")
    main = fn.append_basic_block("vec.body")
    latch = fn.append_basic_block("vec.latch")
    unstage = fn.append_basic_block("tail.unstage")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(_I64, name="i")
    i.add_incoming(start, entry)
    b.cbranch(b.icmp_signed("<", i, end), check, exit_ok)
    b.position_at_end(check)
    is_tail = b.icmp_signed(">", b.add(i, _I64(W)), end)
    b.cbranch(is_tail, stage, main)

    # the tail: copies of the remaining lanes, padded with the last one (valid values, so no
    # spurious bounds errors or floating-point traps)
    b.position_at_end(stage)
    last = b.sub(end, _I64(1))
    for v, p in in_ptrs.items():
        for lane in range(W):
            src = b.add(i, _I64(lane))
            src = b.select(b.icmp_signed("<", src, end), src, last)
            src = _scaled(b, src, strides.get(("in", v)))
            b.store(b.load(b.gep(p, [src])), b.gep(stage_in[v], [_I64(lane)]))
    b.branch(main)

    # one copy of the program for full groups and the staged tail
    b.position_at_end(main)
    at = b.select(is_tail, _I64(0), i)
    ins = {v: b.select(is_tail, stage_in[v], p) for v, p in in_ptrs.items()}
    outs = {k: b.select(is_tail, stage_out[k], out_ptrs[k]) for k in stage_out}
    body(at, W, lane0=i, in_over=ins, out_over=outs, tail=is_tail)
    b.cbranch(is_tail, unstage, latch)
    b.position_at_end(latch)
    i.add_incoming(b.add(i, _I64(W)), latch)
    b.branch(head)

    # the real lanes of the tail back to the outputs: one loop over them for all outputs (a
    # branch per output and lane would give kernels with many outputs thousands of blocks)
    b.position_at_end(unstage)
    with loop(b, _I64(0), b.sub(end, i), 1, "tail.lane") as lane:
        dst = b.add(i, lane)
        for k in stage_out:
            b.store(b.load(b.gep(stage_out[k], [lane])),
                    b.gep(out_ptrs[k], [_scaled(b, dst, strides.get(("out", k)))]))
    b.branch(exit_ok)


def llvm_type_bytes(prog):
    return [n.dtype.itemsize for _, n in prog.assignments] or [8]


def _add_fn_attr(text: str, name: str, attr: str) -> str:
    """Append a string attribute to the definition lines of function ``name`` and of its
    parts (``name.partN``, see :meth:`~.emitter.Emitter.emit_program`)."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if line.startswith("define ") and (f'@"{name}"(' in line or f'@"{name}.part' in line):
            head, brace = line.rsplit("{", 1) if line.rstrip().endswith("{") else (line, None)
            lines[k] = f"{head.rstrip()} {attr}" + (" {" + brace if brace is not None else "")
    return "\n".join(lines)


def _scaled(b, i, stride):
    """Element index of lane ``i`` at ``stride`` (None: contiguous)."""
    return i if stride is None else b.mul(i, stride)


def _lane_pointers(b, ptr, i, stride, w, itemsize):
    """The addresses of the ``w`` lanes from ``i`` at ``stride`` elements apart."""
    base = b.ptrtoint(b.gep(ptr, [_scaled(b, i, stride)]), _I64)
    step = b.mul(stride, _I64(itemsize))
    iota = ir.Constant(ir.VectorType(_I64, w), list(range(w)))
    offsets = b.mul(iota, splat(b, step, w))
    return b.inttoptr(b.add(splat(b, base, w), offsets), ir.VectorType(ptr.type, w))


def _load(b, ptr, i, dtype, w, stride=None):
    st = llvm_type(dtype, storage=True)
    align = max(1, np.dtype(dtype).itemsize)
    if w is None:
        v = b.load(b.gep(ptr, [_scaled(b, i, stride)]), align=align)
    elif stride is None:
        vt = ir.VectorType(st, w)
        v = b.load(b.bitcast(b.gep(ptr, [i]), vt.as_pointer()), align=align)
    else:
        v = masked_gather(b, _lane_pointers(b, ptr, i, stride, w, align), align)
    if np.dtype(dtype).kind == "b":
        v = b.icmp_unsigned("!=", v, ir.Constant(v.type, None))
    return v


def _store(b, ptr, i, v, dtype, w, em, stride=None):
    st = llvm_type(dtype, storage=True)
    align = max(1, np.dtype(dtype).itemsize)
    if w is not None:
        v = em.splat(v)
    if np.dtype(dtype).kind == "b":
        v = b.zext(v, ir.VectorType(st, w) if w is not None else st)
    if w is None:
        b.store(v, b.gep(ptr, [_scaled(b, i, stride)]), align=align)
    elif stride is None:
        b.store(v, b.bitcast(b.gep(ptr, [i]), ir.VectorType(st, w).as_pointer()), align=align)
    else:
        masked_scatter(b, v, _lane_pointers(b, ptr, i, stride, w, align), align)
