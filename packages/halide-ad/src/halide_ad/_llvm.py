"""CPU code generation: lowered loop nests to one LLVM module, through core_ad's emitter.

Each definition of each root Func becomes one entry point of a ``codegen.KernelModule`` (core_ad's
kernel-building layer; C ABI)::

    int32 def_k(int64 start, int64 end, int8 **ptrs, int64 *ints)

running iterations ``[start, end)`` of its outermost loop (the Python driver splits a parallel
outermost loop across the thread pool with ``codegen.parallel_for``; ctypes releases the GIL).
A parallel loop inside serial ones becomes an entry point of its own, its enclosing values
passed in a closure struct, which the kernel runs on the pool through core_ad's
``KernelModule.call_parallel``; parallel loops inside a parallel one run serially. ``ptrs`` holds the
storage of every Buffer, root Func (one per Tuple component) and Param; ``ints`` every run-time size
(region, storage and buffer mins / extents / strides). Expressions are emitted by
``core_ad.codegen.Emitter``; Func and Buffer reads are the lowering of the ``hl_call``
primitive registered here. Returns 0, or 2 when an allocation fails.

A parallel outermost loop over a reduction dimension (``f.update(i).atomic().parallel(r)``)
makes the update's stores atomic additions (``atomicrmw fadd`` / ``add``, per lane in vector
code): the update must add to its Func where it writes, else a ``ScheduleError`` names it.

Vectorised loops: a loop of kind "vectorized" whose extent equals its width ``W`` runs its
body once on ``<W x T>`` values (dense loads/stores where the innermost coordinate is the loop
variable plus a value independent of it; otherwise ``llvm.masked.gather`` loads and per-lane
stores); a partial (tail) iteration runs as a scalar loop.

Float to int32 / int64 casts are core_ad's saturating conversions, except where the operand
has constant bounds inside the int range (``_in_range_casts``): those are marked
``astype(..., in_range=True)``, which core_ad emits as a plain ``fptosi`` with NaN sent to 0,
the same values.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from core_ad import codegen, sym
from llvmlite import ir
from llvmlite.ir.instructions import GEPInstr

from . import _expr as E
from ._bounds import const_int, const_value, interval
from ._lower import (Allocate, Block, For, IfThen, LetStmt, Provide, atomic_addend,
                     provide_nodes, stmt_accesses, walk)
from ._schedule import ScheduleError

__all__ = ["ModuleBuilder", "Slots"]

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
I8P = I8.as_pointer()


class Slots:
    """Positions of run-time values: ``ptrs`` (storage, params) and ``ints`` (sizes)."""

    def __init__(self):
        self.ptr: dict = {}
        self.int: dict = {}

    def ptr_slot(self, key):
        return self.ptr.setdefault(key, len(self.ptr))

    def int_slot(self, key):
        return self.int.setdefault(key, len(self.int))


class _Storage:
    """Pointers (one per Tuple component), mins and strides (int32) of a Func or Buffer, and
    its alias metadata: accesses to different storages never alias (as in Halide; realize
    refuses an output that shares memory with an input)."""

    __slots__ = ("alias", "dtypes", "inner", "mins", "ptrs", "strides")

    def __init__(self, ptrs, mins, strides, dtypes, alias=None, inner=0):
        self.ptrs, self.mins, self.strides, self.dtypes = ptrs, mins, strides, dtypes
        self.alias = alias  # (alias.scope node, noalias node)
        self.inner = inner  # the dimension of unit stride (``reorder_storage``)


def _tag(instr, st: _Storage):
    if st.alias is not None:
        instr.set_metadata("alias.scope", st.alias[0])
        instr.set_metadata("noalias", st.alias[1])
    return instr


def _dense(node_args, vleaf, inner=0) -> bool:
    """Lanes read consecutive elements: the coordinate of unit stride (``inner``) is
    ``vleaf`` plus something free of it, and the other coordinates do not depend on it."""
    if vleaf is None:
        return False
    if vleaf in sym.free_leaves(node_args[inner] - vleaf):
        return False
    return all(vleaf not in sym.free_leaves(a) for d, a in enumerate(node_args) if d != inner)


class _Ctx:
    def __init__(self, builder, storage, vleaf, width, env):
        self.b = builder
        self.storage = storage
        self.vleaf = vleaf
        self.width = width
        self.env = env
        self.memo: dict = {}  # id(node) -> (node, value): coordinates shared by several reads
        self.em = None
        # id(node) -> (node, leaf, value) of the lane-uniform values _scalarize emitted, when kept
        # (None: each statement emits its own): hoisted values are then found again, by
        # identity, in the expressions of the loop body that uses them
        self.uniform: dict | None = None
        self.bounds: dict = {}  # interval memo of _in_range_casts

    def emit_once(self, nodes):
        """Values of ``nodes``, each emitted once per statement: the taps of a stencil share
        their variable coordinates (emitted before any branch of the read that needs them, so
        the values dominate every later use in the statement)."""
        nodes = _in_range_casts(nodes, self.bounds)
        missing = [n for n in nodes if id(n) not in self.memo]
        if missing:
            emitted, env = self._scalarize(missing) if self.vleaf is not None \
                else (missing, self.env)
            for n, v in zip(missing, self.em.emit(emitted, env)):
                self.memo[id(n)] = (n, v)
        return [self.memo[id(n)][1] for n in nodes]

    def _scalarize(self, nodes):
        """``nodes`` with their lane-invariant arithmetic emitted once as scalars and read
        through fresh leaves, and the env binding those. The vector emitter broadcasts every
        leaf before computing, so a tile's origin (a floor division and a modulo of the fused
        tile index) would otherwise be a vector division, which x86 does as 8 scalar ones."""
        scalar_env = {k: v for k, v in self.env.items()
                      if not isinstance(v.type, ir.VectorType)}
        order = sym.toposort(list(nodes))
        uniform: dict = {}
        for n in order:
            if hasattr(n, "kind"):  # a leaf
                uniform[id(n)] = n in scalar_env
            elif not hasattr(n, "prim"):  # a constant
                uniform[id(n)] = True
            else:  # reads stay with _lower_call (it shares their coordinates between taps)
                uniform[id(n)] = n.prim is not E.CALL and all(uniform[id(a)] for a in n.args)
        hoist = {id(n): n for n in nodes if hasattr(n, "prim") and uniform[id(n)]}
        for n in order:
            if hasattr(n, "prim") and not uniform[id(n)]:
                for a in n.args:
                    if uniform[id(a)] and hasattr(a, "prim"):
                        hoist[id(a)] = a
        if not hoist:
            return nodes, self.env
        env = dict(self.env)
        mapping = {}
        kept = self.uniform if self.uniform is not None else {}
        for k in [k for k in hoist if k in kept]:
            a, (leaf, v) = hoist.pop(k), kept[k][1:]
            env[leaf], mapping[a] = v, leaf
        roots = list(hoist.values())
        values = codegen.Emitter(self.b, c_semantics=True).emit(roots, scalar_env)
        for a, v in zip(roots, values):
            leaf = sym.leaf("hl.uniform", E.unique_name("u"), a.dtype)
            env[leaf] = v
            mapping[a] = leaf
            if self.uniform is not None:
                self.uniform[id(a)] = (a, leaf, v)
        return [sym.substitute(n, mapping) for n in nodes], env


def _in_range_casts(nodes, memo):
    """``nodes`` with each float to int32 / int64 cast whose operand has constant bounds inside
    the int range (a bin index ``int(clamp(v, 0, 1) * n)``, say) marked ``in_range``: core_ad
    then emits a plain truncation (``fptosi.sat`` costs a compare and a select more per side
    on x86)."""
    m = {}
    for n in sym.toposort(list(nodes)):
        if getattr(n, "prim", None) is None or n.prim.name != "cast" or \
                n.dtype not in (np.int32, np.int64) or n.args[0].dtype.kind != "f" or \
                n.params.get("in_range"):
            continue
        iv = interval(n.args[0], {}, memo)
        lo, hi = (None, None) if iv is None else (const_value(iv[0]), const_value(iv[1]))
        top = 2.0 ** (8 * n.dtype.itemsize - 1)
        if lo is not None and hi is not None and -top <= lo and hi < top:
            m[n] = sym.astype(n.args[0], n.dtype, in_range=True)
    return [sym.substitute(n, m) for n in nodes] if m else nodes


def _split_const(node):
    """``(rest, c)`` with ``node == rest + c`` for an integer constant ``c`` (``rest`` None
    when ``node`` is a constant)."""
    v = const_value(node)
    if v is not None:
        return None, int(v)
    if getattr(node, "prim", None) is not None and node.prim.name == "add":
        consts = [a for a in node.args if const_value(a) is not None]
        if consts:
            others = [a for a in node.args if const_value(a) is None]
            rest = others[0]
            for o in others[1:]:
                rest = rest + o
            return rest, sum(int(const_value(a)) for a in consts)
    return node, 0


def _flat_index(b, emit, st: _Storage, coords, width, lane0=False, parts=False):
    """Σ (coord_d - min_d) * stride_d in int32 (Halide's index type: every buffer has fewer
    than 2^31 elements, checked at realize); a vector in a vector context, or the index of
    lane 0 (``lane0``, for dense accesses).

    Each coordinate is split into a variable part and an integer constant, so the index is
    Σ rest_d * stride_d + Σ (c_d - min_d) * stride_d: the stencil taps ``f[x, y + k]`` of a
    loop share one product and differ by a loop-invariant offset. The arithmetic is ``nsw``
    (it cannot wrap for in-bounds accesses), so LLVM may widen it to 64-bit induction
    variables. With ``parts``: ``(variable part or None, constant offset)`` instead of their
    sum, so that gathers at several taps share their per-lane addresses."""
    split = [_split_const(a) for a in coords]
    rests = [r for r, _ in split if r is not None]
    values = iter(emit(rests) if rests else [])
    acc = off = None
    for d, (rest, c) in enumerate(split):
        sd = st.strides[d]
        o = b.sub(ir.Constant(I32, c), st.mins[d], flags=["nsw"])
        if d != st.inner:
            o = b.mul(o, sd, flags=["nsw"])
        off = o if off is None else b.add(off, o, flags=["nsw"])
        if rest is None:
            continue
        v = next(values)
        if lane0 and isinstance(v.type, ir.VectorType):
            v = b.extract_element(v, ir.Constant(I32, 0))
        if d != st.inner:
            v = b.mul(v, codegen.splat(b, sd, v.type.count) if isinstance(v.type, ir.VectorType)
                      else sd, flags=["nsw"])
        acc = v if acc is None else _add(b, acc, v)
    if off is None:
        off = ir.Constant(I32, 0)
    if parts:
        return acc, off
    idx = off
    if acc is not None:
        idx = _add(b, acc, idx)
    if width and not lane0 and not isinstance(idx.type, ir.VectorType):
        idx = codegen.splat(b, idx, width)
    return idx


def _add(b, x, y):
    xv, yv = isinstance(x.type, ir.VectorType), isinstance(y.type, ir.VectorType)
    if xv and not yv:
        y = codegen.splat(b, y, x.type.count)
    elif yv and not xv:
        x = codegen.splat(b, x, y.type.count)
    return b.add(x, y, flags=["nsw"])


def _mem_type(dt):
    return codegen.llvm_type(dt, storage=True)


def _to_reg(b, v, dt):
    if np.dtype(dt).kind == "b":
        zero = ir.Constant(v.type, None)
        return b.icmp_unsigned("!=", v, zero)
    return v


def _to_mem(b, v, dt):
    if np.dtype(dt).kind == "b":
        t = ir.VectorType(I8, v.type.count) if isinstance(v.type, ir.VectorType) else I8
        return b.zext(v, t)
    return v


def _lower_call(em, node, args):
    """The ``hl_call`` lowering: a read of a Func's or Buffer's storage."""
    ctx = em.hl_ctx
    b = em.b
    st = ctx.storage[node.params["fid"]]
    k = node.params["index"]
    ptr, dt = st.ptrs[k], st.dtypes[k]
    width = em.width if em.vector else None
    emit = ctx.emit_once
    if width is None:
        idx = _flat_index(b, emit, st, node.args, None)
        return _to_reg(b, _tag(b.load(b.gep(ptr, [idx])), st), dt)
    if ctx.vleaf not in sym.free_leaves(list(node.args)):  # one element for every lane
        idx = _flat_index(b, emit, st, node.args, width, lane0=True)
        return _to_reg(b, codegen.splat(b, _tag(b.load(b.gep(ptr, [idx])), st), width), dt)
    if _dense(node.args, ctx.vleaf, st.inner):
        # base pointer from the variable part (shared by the taps), then a constant offset
        acc, off = _flat_index(b, emit, st, node.args, width, lane0=True, parts=True)
        base = ptr if acc is None else b.gep(ptr, [acc])
        return _to_reg(b, codegen.dense_load(b, base, off, width, st.alias), dt)
    acc, off = _flat_index(b, emit, st, node.args, width, parts=True)
    if not _maybe_dense(node.args, ctx.vleaf, st.inner):
        return _to_reg(b, _gather(b, st, k, acc, off), dt)
    # Coordinates like clamp(x + 1, lo, hi) are consecutive except near the edges: test the
    # lanes at run time and take one vector load where they are (the interior). Only
    # the unit-stride coordinate depends on the lane, so the test reads it alone: invariant in
    # the loops over the other coordinates (a column reduction's rows), it is hoisted out.
    x0 = emit([node.args[st.inner]])[0]
    ramp = b.sub(x0, codegen.splat(b, b.extract_element(x0, ir.Constant(I32, 0)), width))
    steps = ir.Constant(ir.VectorType(I32, width), list(range(width)))
    eq = b.icmp_signed("==", ramp, steps)
    all_ok = b.icmp_signed("==", b.bitcast(eq, ir.IntType(width)),
                           ir.Constant(ir.IntType(width), (1 << width) - 1))
    fn = b.function
    dense_bb, gather_bb = fn.append_basic_block("ld.dense"), fn.append_basic_block("ld.gather")
    merge = fn.append_basic_block("ld.merge")
    b.cbranch(all_ok, dense_bb, gather_bb)
    b.position_at_end(dense_bb)
    v1 = codegen.dense_load(b, ptr, b.add(b.extract_element(acc, ir.Constant(I32, 0)), off),
                            width, st.alias)
    b.branch(merge)
    b.position_at_end(gather_bb)
    v2 = _gather(b, st, k, acc, off)
    g_end = b.block
    b.branch(merge)
    b.position_at_end(merge)
    phi = b.phi(v1.type)
    phi.add_incoming(v1, dense_bb)
    phi.add_incoming(v2, g_end)
    return _to_reg(b, phi, dt)


def _gather(b, st: _Storage, k, indices, offset):
    """Lanes ``ptr[indices[lane] + offset]`` of value ``k`` of ``st`` as one
    ``llvm.masked.gather`` (all lanes on): ``vgatherdps`` / ``vpgatherdd`` on AVX2 and
    AVX-512, as Halide emits for a vector read at data-dependent coordinates (the bilateral
    grid's slicing); LLVM scalarises it where the target has no gathers. Per-lane extract,
    load and insert (``codegen.gather``) made the bilateral grid's slicing 1.5x Halide's time."""
    ptr = st.ptrs[k]
    n = indices.type.count
    et = ptr.type.pointee
    if offset is not None:
        ptr = b.gep(ptr, [offset])
    # llvmlite's builder types GEPs with scalar indices only: a vector GEP (one address per
    # lane, which the x86 backend folds into the gather's base + index * scale)
    addrs = GEPInstr(b.block, ptr, [indices], False, "", source_etype=et)
    addrs.type = ir.VectorType(ptr.type, n)
    b._insert(addrs)
    return _tag(codegen.masked_gather(b, addrs, np.dtype(st.dtypes[k]).itemsize), st)


def _maybe_dense(node_args, vleaf, inner=0) -> bool:
    """The unit-stride coordinate depends on the vector lane (clamped or selected, say) and
    no other does."""
    return vleaf in sym.free_leaves(node_args[inner]) and \
        all(vleaf not in sym.free_leaves(a) for d, a in enumerate(node_args) if d != inner)


E.CALL.extra["llvm_lowering"] = _lower_call


class ModuleBuilder:
    """Builds the module of one pipeline: ``add_kernel(name, stmt, roots)`` per definition."""

    def __init__(self, name: str, slots: Slots, root_storage: dict, params: list, fids=()):
        self.kernels = codegen.KernelModule(name)
        self.module = self.kernels.module
        self.alias = self._alias_scopes(list(fids))
        self.slots = slots
        self.root_storage = root_storage  # fid -> (dtypes, ndims, kind, unit-stride dimension)
        self.params = params
        self.malloc = self.kernels.declare("malloc", I8P, [I64])
        self.free = self.kernels.declare("free", ir.VoidType(), [I8P])

    def _alias_scopes(self, fids):
        """One alias scope per storage: ``(alias.scope, noalias)`` metadata by id."""
        m = self.module
        domain = m.add_metadata([ir.MetaDataString(m, "halide_ad.storage")])
        scopes = {f: m.add_metadata([ir.MetaDataString(m, f"storage.{k}"), domain])
                  for k, f in enumerate(fids)}
        return {f: (m.add_metadata([sc]), m.add_metadata([o for g, o in scopes.items()
                                                          if g != f]))
                for f, sc in scopes.items()} if len(fids) > 1 else {}

    # ---- kernels -----------------------------------------------------------------------
    def compile(self) -> dict:
        """{kernel name: ctypes callable} (compiled once per process for equal pipelines)."""
        return self.kernels.compile()

    def add_kernel(self, name: str, stmt) -> bool:
        """Add ``int32 name(start, end, ptrs, ints)``; returns whether the outermost loop is
        driven by ``[start, end)`` (else the whole nest runs on one call)."""
        f = self.kernels.range_function(name, ints=True)
        b, start, end = f.builder, f.start, f.end
        self.err_block = f.fail_block(2)  # an allocation failed
        self.kernel_name, self.ints, self.outlined = name, f.arg("ints"), 0
        env, storage = self._prologue(b, f.arg("ptrs"), f.arg("ints"), _uses(stmt))
        ranged = isinstance(stmt, For) and stmt.kind in ("serial", "parallel")
        # the driver runs a parallel outermost loop on the thread pool; parallel loops inside
        # it then run serially (the cores are taken), else each runs on the pool by itself
        self.in_parallel = ranged and stmt.kind == "parallel"
        # threads run iterations of a reduction loop that may write one point: atomic stores
        self.atomic_loop = stmt if self.in_parallel and not stmt.pure else None
        if ranged:
            self._loop(b, stmt, env, storage, None, lo=b.trunc(start, I32),
                       hi=b.trunc(end, I32))
        else:
            self._stmt(b, stmt, env, storage, None)
        f.ret()
        return ranged

    def _prologue(self, b, ptrs, ints, uses):
        """Loads of the sizes, params and storage the kernel uses (``uses``: leaves and
        callee ids)."""
        env = {}
        fids, leaves = uses
        for key, slot in self.slots.int.items():
            if key[0] == "leaf":
                leaf = key[1]
                if leaf.key[0] not in fids and leaf not in leaves:
                    continue
                v = b.load(b.gep(ints, [ir.Constant(I64, slot)]))
                env[leaf] = b.trunc(v, I32)
        for leaf in self.params:
            if leaf not in leaves:
                continue
            slot = self.slots.ptr_slot(("param", leaf))
            p = b.load(b.gep(ptrs, [ir.Constant(I64, slot)]))
            t = _mem_type(leaf.dtype)
            env[leaf] = _to_reg(b, b.load(b.bitcast(p, t.as_pointer())), leaf.dtype)
        storage = {}
        for fid, (dtypes, ndim, kind, inner) in self.root_storage.items():
            if fid not in fids:
                continue
            ps = []
            for k, dt in enumerate(dtypes):
                slot = self.slots.ptr_slot(("store", fid, k))
                p = b.load(b.gep(ptrs, [ir.Constant(I64, slot)]))
                ps.append(b.bitcast(p, _mem_type(dt).as_pointer()))
            # Buffers and root Funcs ("strided") alike: strides from the arrays, ``inner`` of
            # unit stride (dimension 0 of a Buffer: Buffers copy arrays whose last axis does
            # not; a root Func's storage order, reorder_storage)
            leaf = "hl.bufdim" if kind == "buffer" else "hl.store"
            mins = [env[sym.leaf(leaf, (fid, d, "min"), np.int32)] for d in range(ndim)]
            strides = [ir.Constant(I32, 1) if d == inner else
                       b.trunc(b.load(b.gep(ints, [ir.Constant(I64, self.slots.int_slot(
                           ("stride", fid, d)))])), I32) for d in range(ndim)]
            storage[fid] = _Storage(ps, mins, strides, dtypes, self.alias.get(fid), inner)
        return env, storage

    @staticmethod
    def _dense_layout(b, env, fid, ndim, order=None):
        """Mins and strides (int32) of a dense Func storage laid out in the dimension
        ``order`` (innermost first; default 0, 1, ...), and its element count (int64)."""
        mins = [env[sym.leaf("hl.store", (fid, d, "min"), np.int32)] for d in range(ndim)]
        strides = [None] * ndim
        stride = ir.Constant(I32, 1)
        total = ir.Constant(I64, 1)
        for d in range(ndim) if order is None else order:
            strides[d] = stride
            ext = env[sym.leaf("hl.store", (fid, d, "extent"), np.int32)]
            stride = b.mul(stride, ext)
            total = b.mul(total, b.sext(ext, I64))
        return mins, strides, total

    # ---- statements --------------------------------------------------------------------
    def _context(self, b, env, storage, vec) -> _Ctx:
        em = codegen.Emitter(b, c_semantics=True)  # Halide leaves NaN order of min/max open
        ctx = _Ctx(b, storage, vec[0] if vec else None, vec[1] if vec else None, env)
        em.hl_ctx, ctx.em, em.memo = ctx, em, ctx.memo
        return ctx

    def _emit(self, b, exprs, env, storage, vec):
        return self._context(b, env, storage, vec).em.emit(exprs, env)

    def _stmt(self, b, s, env, storage, vec):
        if isinstance(s, Block):
            env = dict(env)
            # the Provides of one Block (the bodies of stages fused by compute_with) share a
            # context: their common subexpressions (coordinates, weights, loads) are emitted
            # once, less what a store in between may have changed
            ctx = None
            for k, t in enumerate(s.stmts):
                if isinstance(t, LetStmt):
                    if vec is not None:
                        raise ScheduleError("a Func computed inside a vectorized loop")
                    env[t.leaf] = self._emit(b, t.value, env, storage, vec)
                    continue
                if isinstance(t, Provide):
                    ctx = ctx or self._context(b, env, storage, vec)
                    self._provide(b, t, env, storage, vec, ctx)
                else:
                    self._stmt(b, t, env, storage, vec)
                if ctx is not None and k + 1 < len(s.stmts):
                    _evict(ctx.memo, stmt_accesses(t)[1])
        elif isinstance(s, For):
            self._loop(b, s, env, storage, vec)
        elif isinstance(s, Provide):
            self._provide(b, s, env, storage, vec)
        elif isinstance(s, Allocate):
            self._allocate(b, s, env, storage, vec)
        elif isinstance(s, IfThen):
            # a guard reads only loops outside the fused body: scalar even in a vector loop
            scalars = {k: v for k, v in env.items() if not isinstance(v.type, ir.VectorType)}
            cond = self._emit(b, s.cond, scalars, storage, None)
            if s.otherwise is None:
                with b.if_then(cond):
                    self._stmt(b, s.body, env, storage, vec)
                return
            with b.if_else(cond) as (then, other):
                with then:
                    self._stmt(b, s.body, env, storage, vec)
                with other:
                    self._stmt(b, s.otherwise, env, storage, vec)
        else:
            raise TypeError(f"unknown statement {type(s).__name__}")

    def _loop(self, b, s: For, env, storage, vec, lo=None, hi=None):
        if lo is None:
            lo = ir.Constant(I32, 0)
            if vec is not None and vec[0] in sym.free_leaves(s.extent):
                raise ScheduleError(f"the extent of loop {s.name} depends on a vectorized loop")
            scalars = {k: v for k, v in env.items() if not isinstance(v.type, ir.VectorType)}
            hi = self._emit(b, s.extent, scalars, storage, None)
            if s.kind == "parallel" and vec is None and not self.in_parallel:
                self._parallel(b, s, env, storage, hi)
                return
        kind = s.kind
        # unrolling also applies inside a vectorized loop; vectorization does not nest
        if (kind == "vectorized" and vec is None) or kind == "unrolled":
            w = s.factor if s.factor is not None else const_int(s.extent)
            if w is None:
                raise ScheduleError(
                    f"cannot {kind.removesuffix('d')} loop {s.name}: its"
                    " extent is not a constant (give a factor: vectorize(x, 8))"
                )
            full = b.icmp_signed("==", hi, ir.Constant(I32, w))
            with b.if_else(full) as (then, other):
                with then:
                    if kind == "vectorized":
                        lanes = ir.Constant(ir.VectorType(I32, w), list(range(w)))
                        e = dict(env)
                        e[s.leaf] = lanes
                        self._stmt(b, s.body, e, storage, (s.leaf, w))
                    else:
                        self._unrolled(b, s, env, storage, vec, w)
                with other:
                    self._serial(b, s, env, storage, vec, ir.Constant(I32, 0), hi)
            return
        inner = s.body
        if (s.split_extent is not None and isinstance(inner, For) and inner.factor is not None
                and (inner.kind == "unrolled" or (inner.kind == "vectorized" and vec is None))):
            # iterations with a full inner tile first, without a per-tile extent test
            w = inner.factor
            scalars = {k: v for k, v in env.items() if not isinstance(v.type, ir.VectorType)}
            e = self._emit(b, s.split_extent, scalars, storage, None)

            def tiles():
                full = b.sdiv(e, ir.Constant(I32, w))
                mid = _imin(b, _imax(b, full, lo), hi)
                self._serial(b, s, env, storage, vec, lo, mid,
                             emit_body=lambda e2: self._full(b, inner, e2, storage, vec))
                self._serial(b, s, env, storage, vec, mid, hi)

            if not (isinstance(lo, ir.Constant) and lo.constant == 0):
                tiles()
                return
            # the whole dimension one full tile (channels: unroll(c, 2) over 2 channels) runs
            # straight, without loop control, and what its copies compute from the tile's
            # origin alone (a channel's offset, a test of the channel) is invariant in the
            # enclosing loops: the bilateral grid's histogram (its blurz stage) 68 -> 56 ms at
            # 4096^2, one thread (Halide 21: 54 ms)
            one_tile = b.and_(b.icmp_signed("==", e, ir.Constant(I32, w)),
                              b.icmp_signed("==", hi, ir.Constant(I32, 1)))
            with b.if_else(one_tile) as (then, other):
                with then:
                    one = dict(env)
                    one[s.leaf] = ir.Constant(I32, 0)
                    self._full(b, inner, one, storage, vec)
                with other:
                    tiles()
            return
        self._serial(b, s, env, storage, vec, lo, hi)

    def _parallel(self, b, s: For, env, storage, extent):
        """A parallel loop inside serial ones: its body becomes an entry point that core_ad's
        runtime runs over ``[0, extent)`` on the thread pool (``call_parallel``), reading the
        enclosing loop variables, lets and storage from a closure struct. Constants stay
        constants in the body (a unit stride keeps its accesses dense)."""
        fids = [fid for fid in sorted(_uses(s)[0]) if fid in storage]
        captured = [v for v in env.values() if not isinstance(v, ir.Constant)]
        for fid in fids:
            st = storage[fid]
            captured += [v for v in st.ptrs + st.mins + st.strides
                         if not isinstance(v, ir.Constant)]
        captured = list({id(v): v for v in captured}.values())
        closure_type = ir.LiteralStructType([v.type for v in captured])
        entry = ir.IRBuilder(b.function.entry_basic_block)
        entry.position_at_start(b.function.entry_basic_block)
        closure = entry.alloca(closure_type, name=f"{s.name}.closure")
        for k, v in enumerate(captured):
            b.store(v, b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)]))

        body = self.kernels.range_function(f"{self.kernel_name}_par{self.outlined}", ints=True)
        self.outlined += 1
        cb = body.builder
        fields = cb.bitcast(body.arg("ptrs"), closure_type.as_pointer())
        slot = {id(v): k for k, v in enumerate(captured)}

        def inside(v):
            if isinstance(v, ir.Constant):
                return v
            return cb.load(cb.gep(fields, [ir.Constant(I32, 0), ir.Constant(I32, slot[id(v)])]))

        inner_env = {k: inside(v) for k, v in env.items()}
        inner_storage = {}
        for fid in fids:
            st = storage[fid]
            inner_storage[fid] = _Storage([inside(v) for v in st.ptrs],
                                          [inside(v) for v in st.mins],
                                          [inside(v) for v in st.strides], st.dtypes, st.alias,
                                          st.inner)
        outer = self.err_block, self.atomic_loop, self.in_parallel
        self.err_block = body.fail_block(2)
        self.atomic_loop = None if s.pure else s
        self.in_parallel = True
        self._loop(cb, s, inner_env, inner_storage, None, lo=cb.trunc(body.start, I32),
                   hi=cb.trunc(body.end, I32))
        body.ret()
        self.err_block, self.atomic_loop, self.in_parallel = outer

        rc = self.kernels.call_parallel(b, body, b.bitcast(closure, I8P.as_pointer()),
                                        self.ints, b.sext(extent, I64))
        failed = b.function.append_basic_block(f"{s.name}.failed")
        done = b.function.append_basic_block(f"{s.name}.done")
        b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, done)
        ir.IRBuilder(failed).ret(rc)
        b.position_at_end(done)

    def _full(self, b, s: For, env, storage, vec):
        """The body of a vectorized / unrolled loop known to run its full width."""
        w = s.factor
        if s.kind == "vectorized":
            e = dict(env)
            e[s.leaf] = ir.Constant(ir.VectorType(I32, w), list(range(w)))
            self._stmt(b, s.body, e, storage, (s.leaf, w))
            return
        self._unrolled(b, s, env, storage, vec, w)

    def _unrolled(self, b, s: For, env, storage, vec, w):
        """``w`` copies of the body of unrolled loop ``s``. The copies of a single update or
        definition share one context: what does not depend on the unrolled Var (a pixel's
        load, its bin) is emitted once, less what the previous copy's store may have
        changed."""
        ctx = None
        for k in range(w):
            e = dict(env)
            e[s.leaf] = ir.Constant(I32, k)
            if not isinstance(s.body, Provide):
                self._stmt(b, s.body, e, storage, vec)
                continue
            if ctx is None:
                ctx = self._context(b, e, storage, vec)
            else:
                ctx.env = e
                _evict(ctx.memo, {s.body.func.fid}, s.leaf)
            self._provide(b, s.body, e, storage, vec, ctx)

    def _serial(self, b, s, env, storage, vec, lo, hi, emit_body=None):
        body = s.body
        if emit_body is None and isinstance(body, IfThen) and s.leaf not in \
                sym.free_leaves(body.cond) and not sym.calls([body.cond], E.CALL):
            # unswitched: a guard of fused stages tests the enclosing loops only, and each
            # version's body can then have its loop-invariant part hoisted
            scalars = {k: v for k, v in env.items() if not isinstance(v.type, ir.VectorType)}
            cond = self._emit(b, body.cond, scalars, storage, None)
            with b.if_else(cond) as (then, other):
                with then:
                    self._serial(b, dataclasses.replace(s, body=body.body), env, storage,
                                 vec, lo, hi)
                with other:
                    if body.otherwise is not None:
                        self._serial(b, dataclasses.replace(s, body=body.otherwise), env,
                                     storage, vec, lo, hi)
            return
        hoist = self._invariants(s) if emit_body is None else None
        if hoist is not None:
            if not (isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant)
                    and hi.constant > lo.constant):
                # hoisted reads must not run for an empty loop (their region may be empty)
                with b.if_then(b.icmp_signed("<", lo, hi)):
                    self._serial(b, s, env, storage, vec, lo, hi,
                                 self._hoisted_body(b, env, storage, vec, *hoist))
                return
            emit_body = self._hoisted_body(b, env, storage, vec, *hoist)
        with codegen.loop(b, lo, hi, 1, s.name) as i:
            e = dict(env)
            e[s.leaf] = i
            if emit_body is None:
                self._stmt(b, s.body, e, storage, vec)
            else:
                emit_body(e)

    @staticmethod
    def _invariants(s: For):
        """``(body Provides, their loop-invariant subexpressions)`` of a loop whose body is
        Provides only (a reduction's RVar inside the vector loop, say), or None: what the body
        computes independently of the loop (a bilinear sample's coordinates, weights and
        bounds tests around a channel loop) is then emitted once, before it. LLVM leaves most
        of it in the loop: the reads sit behind branches."""
        body = s.body.stmts if isinstance(s.body, Block) else [s.body]
        if not all(isinstance(t, Provide) for t in body):
            return None
        written = {t.func.fid for t in body}
        exprs = [e for t in body for e in (*t.args, *t.values)
                 + ((t.predicate,) if t.predicate is not None else ())]
        variant: set = set()
        roots: dict = {}
        for n in sym.toposort(exprs):
            args = getattr(n, "args", ())
            if n is s.leaf or (E.is_call(n) and n.params["fid"] in written) or any(
                    id(a) in variant for a in args):
                variant.add(id(n))
                roots.update((id(a), a) for a in args
                             if id(a) not in variant and hasattr(a, "prim"))
        return (body, list(roots.values())) if roots else None

    def _hoisted_body(self, b, env, storage, vec, body, roots):
        """Emit ``roots`` here, before the loop; returns the loop body's emitter reusing them."""
        ctx = self._context(b, env, storage, vec)
        ctx.uniform = {}
        ctx.emit_once(roots)

        def emit(e):
            ctx.env = e
            for k, t in enumerate(body):
                self._provide(b, t, e, storage, vec, ctx)
                if k + 1 < len(body):
                    _evict(ctx.memo, {t.func.fid})
        return emit

    def _provide(self, b, s: Provide, env, storage, vec, ctx=None):
        st = storage[s.func.fid]
        n = len(s.values)
        exprs = list(s.values)
        if self.atomic_loop is not None:
            exprs = [self._atomic_addend(s, k) for k in range(len(exprs))]
        if s.predicate is not None:
            exprs.append(s.predicate)
        ctx = ctx or self._context(b, env, storage, vec)
        vals = ctx.emit_once(exprs)
        values = vals[:n]
        pred = vals[-1] if s.predicate is not None else None
        width = vec[1] if vec else None
        dense = width is not None and _dense(s.args, vec[0], st.inner)
        base = None
        if dense:
            # addressed as a dense read of the same point is (base from the variable part, then
            # the constant offset): an accumulator's load and store are then one address, which
            # LLVM keeps in a register across the reduction loops inside the vector loop
            base, idx = _flat_index(b, ctx.emit_once, st, s.args, width, lane0=True, parts=True)
        else:
            idx = _flat_index(b, ctx.emit_once, st, s.args, width)
        store = self._store if self.atomic_loop is None else self._atomic_add
        if pred is not None and width is None:
            with b.if_then(pred):
                store(b, st, values, idx, None, dense)
            return
        store(b, st, values, idx, width, dense, pred, base)

    def _atomic_addend(self, s, k):
        name = s.func.name()
        v = atomic_addend(s, k, name, [self.atomic_loop],
                          "else use rfactor or keep the loop serial")
        if np.dtype(v.dtype).kind not in "fiu" or np.dtype(v.dtype).itemsize < 4:
            raise ScheduleError(f"{name}: atomic additions need a float or a 32/64-bit integer"
                                f" value, not {np.dtype(v.dtype)}")
        return v

    def _atomic_add(self, b, st, values, idx, width, dense, pred=None, base=None):
        """``f[idx] += v`` as atomic read-modify-writes (one per lane; masked-off lanes add
        nothing; ``base``: a dense store's variable offset, as ``_store``)."""
        for k, v in enumerate(values):
            ptr = st.ptrs[k] if base is None else b.gep(st.ptrs[k], [base])
            op = "fadd" if np.dtype(st.dtypes[k]).kind == "f" else "add"
            if width is None:
                b.atomic_rmw(op, b.gep(ptr, [idx]), v, "monotonic")
                continue
            for lane in range(width):
                i = b.add(idx, ir.Constant(idx.type, lane)) if dense else b.extract_element(
                    idx, ir.Constant(I32, lane))
                x = v if not isinstance(v.type, ir.VectorType) else b.extract_element(
                    v, ir.Constant(I32, lane))
                if pred is not None:
                    c = b.extract_element(pred, ir.Constant(I32, lane)) if isinstance(
                        pred.type, ir.VectorType) else pred
                    x = b.select(c, x, ir.Constant(x.type, 0))
                b.atomic_rmw(op, b.gep(ptr, [i]), x, "monotonic")

    def _store(self, b, st, values, idx, width, dense, pred=None, base=None):
        for k, v in enumerate(values):
            ptr, dt = st.ptrs[k], st.dtypes[k]
            if base is not None:
                ptr = b.gep(ptr, [base])
            v = _to_mem(b, v, dt)
            if width is None:
                _tag(b.store(v, b.gep(ptr, [idx])), st)
                continue
            if not isinstance(v.type, ir.VectorType):
                v = codegen.splat(b, v, width)
            if dense:
                if pred is not None:
                    codegen.masked_dense_store(b, v, ptr, idx, pred, st.alias)
                else:
                    codegen.dense_store(b, v, ptr, idx, st.alias)
                continue
            for lane in range(width):
                i = b.extract_element(idx, ir.Constant(I32, lane))
                x = b.extract_element(v, ir.Constant(I32, lane))
                p = b.gep(ptr, [i])
                if pred is not None:
                    c = b.extract_element(pred, ir.Constant(I32, lane))
                    x = b.select(c, x, _tag(b.load(p), st))
                _tag(b.store(x, p), st)

    def _allocate(self, b, s: Allocate, env, storage, vec):
        if vec is not None:
            raise ScheduleError(f"{s.func.name()} is computed inside a vectorized loop")
        f = s.func
        ndim = f.dimensions()
        order = f.storage_order  # checked against its dimensions by reorder_storage
        mins, strides, total = self._dense_layout(b, env, f.fid, ndim, order)
        too_big = b.icmp_signed(">=", total, ir.Constant(I64, 2**31))
        ok = b.function.append_basic_block("alloc.size_ok")
        b.cbranch(too_big, self.err_block, ok)
        b.position_at_end(ok)
        total = b.select(b.icmp_signed(">", total, ir.Constant(I64, 0)), total,
                         ir.Constant(I64, 1))
        ptrs, raw = [], []
        for t in f.types():
            nbytes = b.mul(total, ir.Constant(I64, np.dtype(t.dtype).itemsize))
            p = b.call(self.malloc, [nbytes])
            isnull = b.icmp_unsigned("==", p, ir.Constant(I8P, None))
            ok = b.function.append_basic_block("alloc.ok")
            b.cbranch(isnull, self.err_block, ok)
            b.position_at_end(ok)
            raw.append(p)
            ptrs.append(b.bitcast(p, _mem_type(t.dtype).as_pointer()))
        inner = dict(storage)
        inner[f.fid] = _Storage(ptrs, mins, strides, [t.dtype for t in f.types()],
                                self.alias.get(f.fid), 0 if order is None else order[0])
        self._stmt(b, s.body, env, inner, vec)
        for p in raw:
            b.call(self.free, [p])


def _evict(memo, fids, leaf=None):
    """Drop the emitted values that read a Func of ``fids`` (just written) or depend on
    ``leaf`` (a loop variable about to change)."""
    if not (fids or leaf is not None) or not memo:
        return
    dirty = set()
    for n in sym.toposort([n for n, _ in memo.values()]):
        if n is leaf or (E.is_call(n) and n.params["fid"] in fids) or any(
                id(a) in dirty for a in getattr(n, "args", ())):
            dirty.add(id(n))
    for k in dirty:
        memo.pop(k, None)


def _imin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _imax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _uses(stmt):
    """(callee / stored Func ids, leaves) of every expression in ``stmt``."""
    nodes = provide_nodes(stmt)
    fids = {c.params["fid"] for c in sym.calls(nodes, E.CALL)}
    fids |= {s.func.fid for s in walk(stmt) if isinstance(s, Provide)}
    return fids, set(sym.free_leaves(nodes))
