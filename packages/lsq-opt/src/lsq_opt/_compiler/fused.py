"""Fused LLVM kernels: cost, J^T F, diag(J^T J) and J^T J p of a whole energy in one pass.

The numpy composition in :mod:`lsq_opt._compiler` (per-term lane kernels + shifted slice-adds)
is the test oracle; this module is the fast path. Per plan it generates, with core_ad's public
code-generation API (``core_ad.codegen.Emitter`` for the expressions, inside loop nests built
with core_ad's kernel-building layer: ``codegen.KernelModule``, ``Loop``, ``vector_loop``,
``parallel_for``), one LLVM module per index space:

**Grid domains** (stencil terms). Every array on the domain (unknowns, data, per-term valid
masks, ``InBounds`` / ``Index`` leaves) lives in a *padded, channel-planar* buffer: shape
``(planes, S0 + 2g, ..., S_last rounded up to the vector width + 2g)`` with a zero halo of
``g = 2 * max|offset|``. A stencil read at offset ``o`` relative to a point is then a load at a
constant displacement ``disp(o)`` -- no bounds checks, no copies. Functions (C ABI
``int32 fn(int64 s0, int64 s1, int8 **ptrs)``, segments ``[s0, s1)`` = rows, threads split the
rows):

* ``jtjp``: for every unknown point ``q`` (vectorised along the last axis), GATHER over terms
  ``t`` and the distinct offsets ``o`` at which ``t`` reads unknowns: the residual lane
  ``l = q - o`` is re-evaluated (its partials from ``core_ad.sym.diff``), ``jp_k = sum_j D_kj
  p(l + o_j)``, and ``q`` accumulates ``sum_k D_kj jp_k`` for every read ``j`` at offset ``o``,
  masked by ``valid_t(l)``. No intermediate J p buffer, no atomics, each output written once.
* ``grad``: J^T F and diag(J^T J) in the same gather form.
* ``cost``: per residual lane, ``sum valid F^2`` accumulated per row (float64).
* ``jtjs`` (compiled on first use, for the multigrid preconditioner): J^T J as stencil planes,
  one per (row plane, column plane, offset), from which ``Plan.jtj_matrix`` assembles CSR.

All terms evaluated at the same lane shift ``o`` are emitted as ONE cse program (shared loads
and subexpressions). The output kernels visit, per row, only the span that holds free
unknowns; rows are split over ``codegen.thread_pool()`` when there are >= 32k lanes.
``SampledImage`` reads are ``sym.gather`` from whole-array buffers (``codegen.BufferArg``); a
failed bounds check returns 1 and raises IndexError in Python.

Out-of-domain lanes are masked by the valid planes (zero in the halo); reads past the domain
get the halo's zeros, which is the ``InBounds`` semantics (OOB reads give 0, partials of OOB
reads belong to no unknown). Excluded (fixed) unknowns have ``p = 0`` in the padded p buffer.

**Graph terms** (hyperedges): a scalar loop over edges that gathers its reads through the
slot index arrays and SCATTERS ``J^T`` contributions into per-thread private copies of the
output (summed afterwards; deterministic for a given thread count). Reads of one (unknown,
channel) through several slots that hit the same vertex add before squaring in the diagonal.

Modules are named by a hash of their IR (core_ad's JIT caches them process-wide and, with
``CORE_AD_CACHE_DIR``, on disk).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np
from core_ad import codegen, sym
from llvmlite import ir

from .._language import BufferRef, InBoundsRef, IndexRef, ParamRef, Read, SizeRef
from .optimize import emit_guarded

__all__ = ["FusedPlan"]

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _sum(terms, dtype):
    if not terms:
        return sym.const(0.0, dtype)
    return terms[0] if len(terms) == 1 else sym.add(*terms)


def _ftype(dtype):
    return ir.DoubleType() if np.dtype(dtype) == np.float64 else ir.FloatType()


# =========================================================================== grid domains
class _GridDomain:
    # pointer slots of every grid function
    B_X, B_P, B_OUT, B_OUT2, B_VALID, B_DATA, B_INB, B_IDX, B_PARAMS, B_SEGBASE, B_SEGLEN, B_ROWSUM, B_BUF, B_SOUT = range(14)

    def __init__(self, plan, dims, terms):
        self.plan, self.dims, self.terms = plan, dims, terms
        dt = plan.dtype
        self.dtype = dt
        self.S = tuple(plan.sizes[d] for d in dims)
        self.V = max(1, codegen.host_vector_width(dt))
        h = 0
        for t in terms:
            for d in t.decoded.values():
                if isinstance(d, Read):
                    h = max(h, max((abs(o) for o in d.offset), default=0))
                elif isinstance(d, InBoundsRef):
                    h = max(h, max((abs(o) for o in d.offset), default=0))
        self.g = g = 2 * h
        last = -(-self.S[-1] // self.V) * self.V
        self.PS = tuple(s + 2 * g for s in self.S[:-1]) + (last + 2 * g,)
        self.plane = int(np.prod(self.PS))
        strides = []
        acc = 1
        for p in reversed(self.PS):
            strides.append(acc)
            acc *= p
        self.strides = tuple(reversed(strides))
        # planes: unknowns on this domain (all channels), data arrays read by the terms
        self.uplane, self.dplane = {}, {}
        nu = nd = 0
        for u in plan.unknowns:
            _, udims, ch = plan.decls[u]
            if tuple(udims) == tuple(dims):
                self.uplane[u] = nu
                nu += ch
        for t in terms:
            for d in t.decoded.values():
                if isinstance(d, Read) and d.role != "unknown" and d.name not in self.dplane:
                    self.dplane[d.name] = nd
                    nd += plan.decls[d.name][2]
        self.nu, self.nd = nu, nd
        # J^T J as a stencil: one coefficient plane per (row plane, column plane, offset)
        keys = []
        for t in terms:
            groups = {}
            for j, (_, d) in enumerate(t.ureads):
                groups.setdefault(d.offset, []).append(j)
            for o, js in groups.items():
                for j in js:
                    dj = t.ureads[j][1]
                    for _, d2 in t.ureads:
                        k = (self.uplane[dj.name] + dj.channel, self.uplane[d2.name] + d2.channel,
                             tuple(a - c for a, c in zip(d2.offset, o)))
                        if k not in keys:
                            keys.append(k)
        self.skeys = keys
        # whole-array buffers (SampledImage gathers): one flat array, one block per channel
        self.bufoff, off = {}, 0
        for t in terms:
            for d in t.decoded.values():
                if isinstance(d, BufferRef) and (d.name, d.channel) not in self.bufoff:
                    self.bufoff[(d.name, d.channel)] = off
                    off += int(np.prod([plan.sizes[x] for x in d.dims]))
        self.nbuf = off
        self.inb = sorted({d.offset for t in terms for d in t.decoded.values()
                           if isinstance(d, InBoundsRef)})
        self.idx_dims = sorted({d.dim for t in terms for d in t.decoded.values()
                                if isinstance(d, IndexRef)})
        # segments: rows of the last axis (1-D domains: chunks of a multiple of V lanes)
        if len(self.S) == 1:
            n = self.S[0]
            chunk = max(self.V, -(-max(1, n // 64) // self.V) * self.V)
            starts = np.arange(0, n, chunk)
            self.seg_base = (g + starts).astype(np.int64)
            self.seg_len = np.minimum(chunk, -(-(n - starts) // self.V) * self.V).astype(np.int64)
        else:
            rows = np.indices(self.S[:-1]).reshape(len(self.S) - 1, -1).T
            base = ((rows + g) * np.array(self.strides[:-1])).sum(1) + g
            self.seg_base = base.astype(np.int64)
            self.seg_len = np.full(len(base), last, np.int64)
        self.nseg = len(self.seg_base)
        # index maps: padded position of every entry of each unknown's full-layout block
        self.full_pos = {}  # u -> positions (C-order over dims + (C,)) in the x buffer
        interior = np.indices(self.S).reshape(len(self.S), -1).T + g
        lin = (interior * np.array(self.strides)).sum(1)
        for u, p0 in self.uplane.items():
            ch = plan.decls[u][2]
            pos = (p0 + np.arange(ch))[None, :] * self.plane + lin[:, None]
            self.full_pos[u] = pos.ravel()
        self.full_sel = np.concatenate([np.arange(plan._uoff[u], plan._uoff[u] + len(p))
                                        for u, p in self.full_pos.items()])
        self.full_posv = np.concatenate(list(self.full_pos.values()))
        colmap = plan._colmap[self.full_sel]
        keep = colmap >= 0
        self.free_cols = colmap[keep]           # columns of x on this domain
        self.free_pos = self.full_posv[keep]    # their padded positions
        self.identity = True if (len(self.free_cols) == plan.n and np.array_equal(
            self.free_cols, np.arange(plan.n))) else None
        self.lin = lin
        self.blocks = self._whole_unknown_blocks(plan, keep)
        # output kernels (jtjp, grad) only visit the span of each row that holds free unknowns
        self.oseg_base, self.oseg_len = self.seg_base, self.seg_len
        if len(self.S) > 1:
            fm = np.zeros(int(np.prod(self.S)), bool)
            for u in self.uplane:
                ch = plan.decls[u][2]
                cm = plan._colmap[plan._uoff[u]: plan._uoff[u] + fm.size * ch]
                fm |= (cm.reshape(-1, ch) >= 0).any(1)
            fm = fm.reshape(-1, self.S[-1])
            anyf = fm.any(1)
            j0 = np.argmax(fm, 1)
            j1 = self.S[-1] - 1 - np.argmax(fm[:, ::-1], 1)
            j0 = (j0 // self.V) * self.V
            ln = -(-(j1 + 1 - j0) // self.V) * self.V
            self.oseg_base = (self.seg_base + j0)[anyf].astype(np.int64)
            self.oseg_len = ln[anyf].astype(np.int64)
        self.noseg = len(self.oseg_base)
        self._static()

    # ---- buffers ----------------------------------------------------------------------
    def _pad(self, a):
        """(S..., C) -> (C, P...) zero-padded planar."""
        C = a.shape[-1]
        out = np.zeros((C,) + self.PS, self.dtype)
        sl = tuple(slice(self.g, self.g + s) for s in self.S)
        out[(slice(None),) + sl] = np.moveaxis(a, -1, 0)
        return out

    def refresh_data(self):
        """Re-pad the data arrays (after ``Plan.set_array``) into the existing buffer."""
        for name, p0 in self.dplane.items():
            a = self.plan.data[name]
            self.data[p0: p0 + a.shape[-1]] = self._pad(a)
        for (name, c), off in self.bufoff.items():
            b = self.plan.buffer(name, c)
            self.bufs[off: off + b.size] = b

    def _static(self):
        plan, dt = self.plan, self.dtype
        self.bufs = np.zeros(max(1, self.nbuf), dt)
        self.sout = np.zeros(1, dt)  # J^T J stencil planes (allocated on first use)
        self.data = np.zeros((max(1, self.nd),) + self.PS, dt)
        self.refresh_data()
        self.inbuf = np.zeros((max(1, len(self.inb)),) + self.PS, np.uint8)
        from . import _inbounds  # noqa: PLC0415

        for k, o in enumerate(self.inb):
            self.inbuf[k] = self._pad(_inbounds(self.S, o)[..., None].astype(np.uint8))[0]
        self.idxbuf = np.zeros((max(1, len(self.idx_dims)),) + self.PS, dt)
        for k, dd in enumerate(self.idx_dims):
            ix = np.arange(self.PS[dd], dtype=dt) - self.g
            shp = [1] * len(self.PS)
            shp[dd] = self.PS[dd]
            self.idxbuf[k] = np.broadcast_to(ix.reshape(shp), self.PS)
        # one plane per distinct mask (terms with the same reads share their bounds test)
        keys, masks, self.vplane = {}, [], []
        for t in self.terms:
            v = np.ones(self.S, bool) if t.valid is None else t.valid.reshape(self.S)
            k = keys.get(v.tobytes())
            if k is None:
                k = keys[v.tobytes()] = len(masks)
                masks.append(v)
            self.vplane.append(k)
        self.valid = np.zeros((len(masks),) + self.PS, np.uint8)
        for k, v in enumerate(masks):
            self.valid[k] = self._pad(v[..., None].astype(np.uint8))[0]
        self.x = np.zeros((max(1, self.nu),) + self.PS, dt)
        self.p = np.zeros_like(self.x)
        self.out = np.zeros_like(self.x)
        self.out2 = np.zeros_like(self.x)
        self.rowsum = np.zeros(self.nseg, np.float64)
        self.params = np.zeros(max(1, len(self.plan._param_order)), dt)

    def disp(self, off):
        return int(sum(o * s for o, s in zip(off, self.strides)))

    def _whole_unknown_blocks(self, plan, keep):
        """``[(x slice, first plane, channels)]`` when every unknown on this domain is free
        and its grid positions are one contiguous run of the padded buffer (a 1-D domain: the
        per-vertex terms of graph plans), else None. Then an unknown's block of x, (L, C), is
        the transpose of a (C, L) slice of the planes, and p moves in and out by strided
        copies: fancy indexing over free_pos / free_cols cost ~20 us of a graph plan's
        60-90 us product (an ARAP mesh, a spring network)."""
        lin = self.lin
        if not keep.all() or np.any(np.diff(lin) != 1):
            return None
        blocks = []
        for u, p0 in self.uplane.items():
            ch = plan.decls[u][2]
            cols = plan._colmap[plan._uoff[u]: plan._uoff[u] + len(lin) * ch]
            if len(cols) == 0 or np.any(np.diff(cols) != 1):
                return None
            blocks.append((slice(int(cols[0]), int(cols[-1]) + 1), p0, ch))
        return blocks

    def block_views(self, buf):
        """(x slice, (L, C) view of ``buf``) per :attr:`blocks` entry."""
        lo, n = int(self.lin[0]), len(self.lin)
        return [(sl, buf[p0: p0 + ch].reshape(ch, -1)[:, lo: lo + n].T) for sl, p0, ch in self.blocks]

    # ---- code -------------------------------------------------------------------------
    def build(self, module, prefix):
        self._build_fn(module, f"{prefix}_jtjp", "jtjp")
        self._build_fn(module, f"{prefix}_grad", "grad")
        self._build_fn(module, f"{prefix}_cost", "cost")

    def _build_fn(self, module, name, kind):
        plan = self.plan
        T = _ftype(self.dtype)
        V = self.V
        VT = ir.VectorType(T, V) if V > 1 else T
        f = module.range_function(name)
        b = f.builder
        ptr = {k: f.pointer(k, self.dtype) for k in (self.B_X, self.B_P, self.B_OUT, self.B_OUT2, self.B_DATA,
                                         self.B_IDX, self.B_PARAMS, self.B_SOUT)}
        ptr[self.B_VALID] = f.pointer(self.B_VALID, np.int8)
        ptr[self.B_INB] = f.pointer(self.B_INB, np.int8)
        segbase = f.pointer(self.B_SEGBASE, np.int64)
        seglen = f.pointer(self.B_SEGLEN, np.int64)
        rowsum = f.pointer(self.B_ROWSUM, np.float64)
        bufp = f.pointer(self.B_BUF, self.dtype)
        params = {}
        for k, pname in enumerate(plan._param_order):
            params[pname] = b.load(b.gep(ptr[self.B_PARAMS], [_I64(k)]))
        math_ = codegen.VecMath()

        seg = codegen.Loop(b, f.start, f.end, 1, "seg")
        base = b.load(b.gep(segbase, [seg.i]))
        ln = b.load(b.gep(seglen, [seg.i]))
        if kind == "cost":
            zero_d = ir.Constant(ir.VectorType(ir.DoubleType(), V), [0.0] * V) if V > 1 \
                else ir.Constant(ir.DoubleType(), 0.0)
            # accumulate in a stack slot (phi across the inner loop would need the body's
            # last block); mem2reg promotes it
            slot = b.alloca(zero_d.type)
            b.store(zero_d, slot)
        lane = codegen.Loop(b, _I64(0), ln, V, "lane")
        q = b.add(base, lane.i)

        item = np.dtype(self.dtype).itemsize

        def load(buf, plane, off):
            idx = b.add(q, _I64(plane * self.plane + off))
            al = 1 if ptr[buf].type.pointee == _I8 else item
            if V > 1:
                return codegen.dense_load(b, ptr[buf], idx, V, align=al)
            return b.load(b.gep(ptr[buf], [idx]), align=al)

        def load_bool(buf, plane, off):
            v = load(buf, plane, off)
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, None))

        def store(buf, plane, val):
            idx = b.add(q, _I64(plane * self.plane))
            if V > 1:
                codegen.dense_store(b, val, ptr[buf], idx, align=item)
            else:
                b.store(val, b.gep(ptr[buf], [idx]), align=item)

        def env_at(t, o, have=()):
            """Leaf values of term t at lane q - o (leaves in ``have`` are not loaded again)."""
            env = {}
            for lf in t.leaves:
                if lf in have:
                    continue
                d = t.decoded[lf]
                if isinstance(d, Read):
                    rel = self.disp(tuple(a - c for a, c in zip(d.offset, o)))
                    if d.role == "unknown":
                        env[lf] = load(self.B_X, self.uplane[d.name] + d.channel, rel)
                    else:
                        env[lf] = load(self.B_DATA, self.dplane[d.name] + d.channel, rel)
                elif isinstance(d, ParamRef):
                    env[lf] = params[d.name]
                elif isinstance(d, InBoundsRef):
                    env[lf] = load_bool(self.B_INB, self.inb.index(d.offset),
                                        self.disp(tuple(-c for c in o)))
                elif isinstance(d, IndexRef):
                    env[lf] = load(self.B_IDX, self.idx_dims.index(d.dim),
                                   self.disp(tuple(-c for c in o)))
                elif isinstance(d, BufferRef):
                    n = int(np.prod([plan.sizes[x] for x in d.dims]))
                    env[lf] = codegen.BufferArg(
                        b.gep(bufp, [_I64(self.bufoff[(d.name, d.channel)])]), _I64(n))
                elif isinstance(d, SizeRef):
                    env[lf] = _I64(plan.sizes[d.dim])
            return env

        zero = ir.Constant(VT, [0.0] * V if V > 1 else 0.0) if V > 1 else ir.Constant(T, 0.0)
        em = codegen.Emitter(b, width=V if V > 1 else None, math=math_,
                             on_bounds_error=lambda bld, failure: bld.ret(_I32(1)))

        opts = plan.optimizations

        def emit(roots, env, load_leaf=None):
            roots = opts.factor(roots)
            vals = emit_guarded(em, b, roots, env, load_leaf, opts.conditional)
            return [em.splat(em.convert(v, r.dtype, self.dtype)) for r, v in zip(roots, vals)]

        if kind == "cost":
            acc = b.load(slot)
            for ti, t in enumerate(self.terms):
                o = (0,) * len(self.S)
                valid = load_bool(self.B_VALID, self.vplane[ti], 0)
                vals = emit(list(t.chans), env_at(t, o))
                for v in vals:
                    sq = b.fmul(v, v)
                    sq = b.select(valid, sq, zero)
                    if self.dtype != np.float64:
                        sq = b.fpext(sq, zero_d.type)
                    acc = b.fadd(acc, sq)
            b.store(acc, slot)
            lane.close()
            tot = b.load(slot)
            if V > 1:
                tot = codegen.hsum(b, tot)
            b.store(tot, b.gep(rowsum, [seg.i]))
            seg.close()
            b.ret(_I32(0))
            return

        if kind == "jtjs":
            saccs = {}
            for ti, t in enumerate(self.terms):
                groups = {}
                for j, (_, d) in enumerate(t.ureads):
                    groups.setdefault(d.offset, []).append(j)
                for o, js in groups.items():
                    env = env_at(t, o)
                    valid = load_bool(self.B_VALID, self.vplane[ti], self.disp(tuple(-c for c in o)))
                    K, R = t.K, t.R
                    D = emit([t.partials[k][j] for k in range(K) for j in range(R)], env)
                    for j in js:
                        dj = t.ureads[j][1]
                        for j2, (_, d2) in enumerate(t.ureads):
                            key = (self.uplane[dj.name] + dj.channel,
                                   self.uplane[d2.name] + d2.channel,
                                   tuple(a - c for a, c in zip(d2.offset, o)))
                            s_ = None
                            for k in range(K):
                                m = b.fmul(D[k * R + j], D[k * R + j2])
                                s_ = m if s_ is None else b.fadd(s_, m)
                            s_ = b.select(valid, s_, zero)
                            saccs[key] = s_ if key not in saccs else b.fadd(saccs[key], s_)
            for kk, key in enumerate(self.skeys):
                store(self.B_SOUT, kk, saccs.get(key, zero))
            lane.close()
            seg.close()
            b.ret(_I32(0))
            return

        if opts.polynomial:
            outs = self._product_exprs(kind)
            vals = emit([e for e, _ in outs], self._static_env(b, params, bufp),
                        lambda lf: self._load_location(lf, load, load_bool))
            for (_, (buf, plane)), v in zip(outs, vals):
                store(buf, plane, v)
            lane.close()
            seg.close()
            b.ret(_I32(0))
            return

        accs = {}  # (u, c) -> accumulated value (jtjp / jtf)
        accs2 = {}  # diag
        # one program per lane shift o over every term evaluated at q - o: subexpressions of
        # different terms at the same lane (loads, sin/cos of a shared angle ...) are shared
        by_o = {}
        for ti, t in enumerate(self.terms):
            groups = {}
            for j, (_, d) in enumerate(t.ureads):
                groups.setdefault(d.offset, []).append(j)
            for o, js in groups.items():
                by_o.setdefault(o, []).append((ti, t, js))
        for o, entries in by_o.items():
            env = {}
            roots, spans = [], []
            for ti, t, js in entries:
                env.update(env_at(t, o, have=env))
                K, R = t.K, t.R
                a = len(roots)
                if kind == "jtjp":
                    roots += [t.partials[k][j] for k in range(K) for j in range(R)]
                else:
                    roots += list(t.chans) + [t.partials[k][j] for k in range(K) for j in js]
                spans.append((a, len(roots)))
            vals_all = emit(roots, env)
            for (ti, t, js), (a, z) in zip(entries, spans):
                vals = vals_all[a:z]
                valid = load_bool(self.B_VALID, self.vplane[ti], self.disp(tuple(-c for c in o)))
                K, R = t.K, t.R
                if kind == "jtjp":
                    D = [vals[k * R:(k + 1) * R] for k in range(K)]
                    pv = []
                    for j, (_, d) in enumerate(t.ureads):
                        rel = self.disp(tuple(a_ - c for a_, c in zip(d.offset, o)))
                        pv.append(load(self.B_P, self.uplane[d.name] + d.channel, rel))
                    jp = []
                    for k in range(K):
                        s = None
                        for j in range(R):
                            m = b.fmul(D[k][j], pv[j])
                            s = m if s is None else b.fadd(s, m)
                        jp.append(s)
                    for j in js:
                        d = t.ureads[j][1]
                        s = None
                        for k in range(K):
                            m = b.fmul(D[k][j], jp[k])
                            s = m if s is None else b.fadd(s, m)
                        s = b.select(valid, s, zero)
                        key = (d.name, d.channel)
                        accs[key] = s if key not in accs else b.fadd(accs[key], s)
                else:  # grad: J^T F and diag
                    F, Dg = vals[:K], vals[K:]
                    for jj, j in enumerate(js):
                        d = t.ureads[j][1]
                        s = s2 = None
                        for k in range(K):
                            dk = Dg[k * len(js) + jj]
                            m = b.fmul(dk, F[k])
                            m2 = b.fmul(dk, dk)
                            s = m if s is None else b.fadd(s, m)
                            s2 = m2 if s2 is None else b.fadd(s2, m2)
                        s = b.select(valid, s, zero)
                        s2 = b.select(valid, s2, zero)
                        key = (d.name, d.channel)
                        accs[key] = s if key not in accs else b.fadd(accs[key], s)
                        accs2[key] = s2 if key not in accs2 else b.fadd(accs2[key], s2)
        for u, p0 in self.uplane.items():
            for c in range(plan.decls[u][2]):
                store(self.B_OUT, p0 + c, accs.get((u, c), zero))
                if kind == "grad":
                    store(self.B_OUT2, p0 + c, accs2.get((u, c), zero))
        lane.close()
        seg.close()
        b.ret(_I32(0))

    # ---- the products as expressions (Optimizations.polynomial) ------------------------
    def _at(self, what, plane, rel, dtype):
        """The location leaf of buffer ``what``, plane ``plane``, ``rel`` elements from the
        lane: the same memory read from different lane shifts is one leaf (one load)."""
        return sym.leaf("lsq_at", (what, plane, rel), dtype)

    def _shifted(self, t, o):
        """Term t's leaves at lane q - o -> location leaves."""
        m = {}
        for lf in t.leaves:
            d = t.decoded[lf]
            if isinstance(d, Read):
                rel = self.disp(tuple(a - c for a, c in zip(d.offset, o)))
                if d.role == "unknown":
                    m[lf] = self._at("x", self.uplane[d.name] + d.channel, rel, lf.dtype)
                else:
                    m[lf] = self._at("d", self.dplane[d.name] + d.channel, rel, lf.dtype)
            elif isinstance(d, InBoundsRef):
                m[lf] = self._at("inb", self.inb.index(d.offset), self.disp(tuple(-c for c in o)),
                                 lf.dtype)
            elif isinstance(d, IndexRef):
                m[lf] = self._at("idx", self.idx_dims.index(d.dim),
                                 self.disp(tuple(-c for c in o)), lf.dtype)
        return m

    def _product_exprs(self, kind):
        """``[(expression, (buffer slot, plane))]``: J^T J p (``jtjp``) or J^T F and
        diag(J^T J) (``grad``) at the lane, as one expression per output plane."""
        dt = np.dtype(self.dtype)
        out, out2 = {}, {}
        for ti, t in enumerate(self.terms):
            groups = {}
            for j, (_, d) in enumerate(t.ureads):
                groups.setdefault(d.offset, []).append(j)
            K, R = t.K, t.R
            for o, js in groups.items():
                m = self._shifted(t, o)
                valid = self._at("valid", self.vplane[ti], self.disp(tuple(-c for c in o)), bool)
                if kind == "jtjp":
                    D = sym.substitute([t.partials[k][j] for k in range(K) for j in range(R)], m)
                    P = [self._at("p", self.uplane[d.name] + d.channel,
                                  self.disp(tuple(a - c for a, c in zip(d.offset, o))), dt)
                         for _, d in t.ureads]
                    jp = [_sum([D[k * R + j] * P[j] for j in range(R)], dt) for k in range(K)]
                    for j in js:
                        d = t.ureads[j][1]
                        c = _sum([D[k * R + j] * jp[k] for k in range(K)], dt)
                        out.setdefault((d.name, d.channel), []).append(sym.where(valid, c, 0.0))
                else:
                    F = sym.substitute(list(t.chans), m)
                    D = sym.substitute([t.partials[k][j] for k in range(K) for j in js], m)
                    for jj, j in enumerate(js):
                        d = t.ureads[j][1]
                        Dk = [D[k * len(js) + jj] for k in range(K)]
                        g = _sum([dk * f for dk, f in zip(Dk, F)], dt)
                        g2 = _sum([dk * dk for dk in Dk], dt)
                        out.setdefault((d.name, d.channel), []).append(sym.where(valid, g, 0.0))
                        out2.setdefault((d.name, d.channel), []).append(sym.where(valid, g2, 0.0))
        res = []
        for u, p0 in self.uplane.items():
            for c in range(self.plan.decls[u][2]):
                res.append((_sum(out.get((u, c), []), dt), (self.B_OUT, p0 + c)))
                if kind == "grad":
                    res.append((_sum(out2.get((u, c), []), dt), (self.B_OUT2, p0 + c)))
        return res

    def _static_env(self, b, params, bufp):
        """Values of the leaves that do not depend on the lane: params, buffers, sizes."""
        env = {}
        for t in self.terms:
            for lf, d in t.decoded.items():
                if isinstance(d, ParamRef):
                    env[lf] = params[d.name]
                elif isinstance(d, BufferRef):
                    n = int(np.prod([self.plan.sizes[x] for x in d.dims]))
                    env[lf] = codegen.BufferArg(
                        b.gep(bufp, [_I64(self.bufoff[(d.name, d.channel)])]), _I64(n))
                elif isinstance(d, SizeRef):
                    env[lf] = _I64(self.plan.sizes[d.dim])
        return env

    def _load_location(self, lf, load, load_bool):
        what, plane, rel = lf.key
        if what in ("inb", "valid"):
            return load_bool({"inb": self.B_INB, "valid": self.B_VALID}[what], plane, rel)
        return load({"x": self.B_X, "d": self.B_DATA, "p": self.B_P, "idx": self.B_IDX}[what],
                    plane, rel)

    # ---- calls ------------------------------------------------------------------------
    def bind(self, fns):
        self.fns = dict(fns)
        self._ptrs()

    def _ptrs(self):
        def arr(base, ln):
            return (ctypes.c_void_p * 14)(*[
                a.ctypes.data for a in (self.x, self.p, self.out, self.out2, self.valid,
                                        self.data, self.inbuf, self.idxbuf, self.params, base,
                                        ln, self.rowsum, self.bufs, self.sout)])

        self.ptr_all = arr(self.seg_base, self.seg_len)
        self.ptr_out = arr(self.oseg_base, self.oseg_len)

    def set_x(self, full):
        self.x.reshape(-1)[self.full_posv] = full[self.full_sel]

    def jtj_matrix(self, n):
        """J^T J over the free unknowns as a scipy CSR matrix, from the stencil planes of the
        ``jtjs`` kernel (run at the packed x). The sparsity pattern depends only on the free
        set, so it is built once: a call is the kernel plus one gather of the values."""
        import scipy.sparse as sp

        if self.sout.shape[0] != len(self.skeys):
            self.sout = np.zeros((len(self.skeys),) + self.PS, self.dtype)
            self._ptrs()
            self._jtj_pattern = self._csr_pattern(n)
        self.run("jtjs", self.plan_threads)
        indptr, indices, src, has_duplicates = self._jtj_pattern
        A = sp.csr_matrix((self.sout.reshape(-1)[src], indices, indptr), shape=(n, n))
        if has_duplicates:
            A.sum_duplicates()
        return A

    def _csr_pattern(self, n):
        """CSR row pointers and column indices of J^T J and, per stored entry, its position in
        the flattened stencil planes ``sout``."""
        colidx = np.full((max(1, self.nu),) + self.PS, -1, np.int64)
        colidx.reshape(-1)[self.free_pos] = self.free_cols
        cflat = colidx.reshape(len(colidx), -1)
        fp_plane, fp_q = self.free_pos // self.plane, self.free_pos % self.plane
        rows, cols, src = [], [], []
        for kk, (rp, cp, delta) in enumerate(self.skeys):
            sel = fp_plane == rp
            q = fp_q[sel]
            c = cflat[cp][q + self.disp(delta)]
            keep = c >= 0
            rows.append(self.free_cols[sel][keep])
            cols.append(c[keep])
            src.append(kk * self.sout[0].size + q[keep])
        rows, cols, src = (np.concatenate(a) for a in (rows, cols, src))
        order = np.lexsort((cols, rows))
        rows, cols, src = rows[order], cols[order], src[order]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        has_duplicates = bool(np.any((rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])))
        return indptr, cols, src, has_duplicates

    def coords(self):
        """(plane, grid coordinates) of every free unknown on this domain, in ``free_cols``
        order (for geometric aggregation)."""
        q = self.free_pos % self.plane
        out = [self.free_pos // self.plane]
        for k, st in enumerate(self.strides):
            out.append((q // st) % self.PS[k] - self.g)
        return np.stack(out, 1)

    def set_params(self):
        for k, n in enumerate(self.plan._param_order):
            self.params[k] = self.plan.params[n]

    def run(self, kind, threads):
        if kind == "cost":
            t = threads if int(self.seg_len.sum()) >= _MIN_LANES_PER_THREAD * 2 else 1
            _run_segments(self.fns[kind], self.nseg, ctypes.addressof(self.ptr_all), t)
        else:
            t = threads if int(self.oseg_len.sum()) >= _MIN_LANES_PER_THREAD * 2 else 1
            _run_segments(self.fns[kind], self.noseg, ctypes.addressof(self.ptr_out), t)


# below this many lanes per thread, handing work to the pool costs more than it saves
_MIN_LANES_PER_THREAD = 16384


def _run_segments(fn, n, ptrs, threads):
    """``fn`` over segments ``[0, n)`` split over ``threads``; ``ptrs`` is one pointer table
    or a callable giving range k's table (the graph part's per-thread private outputs)."""
    args = (lambda k: (ptrs(k),)) if callable(ptrs) else (ptrs,)
    if any(codegen.parallel_for(fn, n, args, threads=threads)):
        raise IndexError("lsq_opt fused kernel: a gather index was out of range")


# =========================================================================== graph terms
class _GraphPart:
    """All graph terms of a plan: scalar loop over edges, scatter into private outputs."""

    XF, PF, OUT, OUT2, DATA, IDX, PARAMS, ROWSUM = range(8)

    def __init__(self, plan, terms):
        self.plan, self.terms = plan, terms
        dt = plan.dtype
        self.dtype = dt
        # data arrays read by graph terms: one flat buffer, each array at an offset
        self.doff = {}
        chunks, off = [], 0
        for t in terms:
            for d in t.decoded.values():
                if isinstance(d, Read) and d.role != "unknown" and d.name not in self.doff:
                    a = plan.data[d.name].reshape(-1)
                    self.doff[d.name] = off
                    chunks.append(a)
                    off += a.size
        self.data = np.concatenate(chunks).astype(dt) if chunks else np.zeros(1, dt)
        # slot index arrays: one int64 buffer, one block per (graph, slot)
        self.ioff = {}
        ch, off = [], 0
        for t in terms:
            for (g, s), idx in ((k, v) for k, v in self._slots(t)):
                if (g, s) not in self.ioff:
                    self.ioff[(g, s)] = off
                    ch.append(idx)
                    off += len(idx)
        self.idx = np.concatenate(ch).astype(np.int64)
        self.E = [t.L for t in terms]
        self.params = np.zeros(max(1, len(plan._param_order)), dt)
        self.xf = np.zeros(plan.n_full, dt)
        self.pf = np.zeros(plan.n_full, dt)

    def _slots(self, t):
        out = []
        for d in t.decoded.values():
            if isinstance(d, Read):
                out.append(((t.graph, d.slot), self.plan.graphs[t.graph][d.slot]))
        return out

    def build(self, module, prefix):
        for ti in range(len(self.terms)):
            for kind in ("jtjp", "grad", "cost"):
                self._build_fn(module, f"{prefix}_{ti}_{kind}", ti, kind)

    def _build_fn(self, module, name, ti, kind):
        """Edges ``[s0, s1)``: a vector main loop (W edges at a time: gathers of the reads,
        libmvec math, lane-by-lane scatters, so repeated vertices within a vector are fine),
        then a scalar remainder loop."""
        plan, t = self.plan, self.terms[ti]
        f = module.range_function(name)
        b = f.builder
        ptr = {k: f.pointer(k, self.dtype) for k in (self.XF, self.PF, self.OUT, self.OUT2, self.DATA,
                                         self.PARAMS)}
        idxp = f.pointer(self.IDX, np.int64)
        rowsum = f.pointer(self.ROWSUM, np.float64)
        params = {n: b.load(b.gep(ptr[self.PARAMS], [_I64(k)]))
                  for k, n in enumerate(plan._param_order)}
        slot = None
        if kind == "cost":
            slot = b.alloca(ir.DoubleType())
            b.store(ir.Constant(ir.DoubleType(), 0.0), slot)
        W = max(1, codegen.host_vector_width(self.dtype))
        math_ = codegen.VecMath()
        codegen.vector_loop(b, f.start, f.end, W,
                            lambda e, w: self._body(b, t, kind, e, w, ptr, idxp, params, slot,
                                                    math_), "e")
        if kind == "cost":
            b.store(b.load(slot), b.gep(rowsum, [f.start]))
        b.ret(_I32(0))

    def _body(self, b, t, kind, e, W, ptr, idxp, params, slot, math_):
        plan = self.plan
        T = _ftype(self.dtype)
        vec = W is not None
        VT = ir.VectorType(T, W) if vec else T
        I64V = ir.VectorType(_I64, W) if vec else _I64
        em = codegen.Emitter(b, width=W, math=math_)
        vidx = {}

        def splat_i(c):
            return ir.Constant(I64V, [c] * W) if vec else _I64(c)

        def vertex(d):
            key = (t.graph, d.slot)
            if key not in vidx:
                p = b.gep(idxp, [b.add(e, _I64(self.ioff[key]))])
                if vec:
                    p = b.bitcast(p, I64V.as_pointer())
                vidx[key] = b.load(p, align=8)
            return vidx[key]

        def flat_pos(d):
            base = plan._uoff[d.name] if d.role == "unknown" else self.doff[d.name]
            return b.add(splat_i(base + d.channel), b.mul(vertex(d), splat_i(d.channels)))

        def gather(buf, pos):
            if not vec:
                return b.load(b.gep(ptr[buf], [pos]))
            v = ir.Constant(VT, ir.Undefined)
            for k in range(W):
                x = b.load(b.gep(ptr[buf], [b.extract_element(pos, _I32(k))]))
                v = b.insert_element(v, x, _I32(k))
            return v

        def scatter(buf, d, val):
            pos = flat_pos(d)
            for k in range(W if vec else 1):
                pk = b.extract_element(pos, _I32(k)) if vec else pos
                vk = b.extract_element(val, _I32(k)) if vec else val
                p = b.gep(ptr[buf], [pk])
                b.store(b.fadd(b.load(p), vk), p)

        env = {}
        for lf in t.leaves:
            d = t.decoded[lf]
            if isinstance(d, Read):
                env[lf] = gather(self.XF if d.role == "unknown" else self.DATA, flat_pos(d))
            elif isinstance(d, ParamRef):
                env[lf] = params[d.name]
        K, R = t.K, t.R
        zero = ir.Constant(VT, [0.0] * W) if vec else ir.Constant(T, 0.0)

        opts = plan.optimizations

        def emit(roots):
            roots = opts.factor(roots)
            vals = emit_guarded(em, b, roots, env, None, opts.conditional)
            return [em.splat(em.convert(v, r.dtype, self.dtype)) for r, v in zip(roots, vals)]

        if kind == "cost":
            acc = None
            for v in emit(list(t.chans)):
                sq = b.fmul(v, v)
                if self.dtype != np.float64:
                    sq = b.fpext(sq, ir.VectorType(ir.DoubleType(), W) if vec
                                 else ir.DoubleType())
                acc = sq if acc is None else b.fadd(acc, sq)
            if vec:
                acc = codegen.hsum(b, acc)
            b.store(b.fadd(b.load(slot), acc), slot)
        elif kind == "jtjp" and opts.polynomial:
            # J^T J p of the edge as expressions over its p reads: core_ad merges the terms
            dt = np.dtype(self.dtype)
            P = [sym.leaf("lsq_at", ("p", j), dt) for j in range(R)]
            for j, (_, d) in enumerate(t.ureads):
                env[P[j]] = gather(self.PF, flat_pos(d))
            jp = [_sum([t.partials[k][j] * P[j] for j in range(R)], dt) for k in range(K)]
            outs = emit([_sum([t.partials[k][j] * jp[k] for k in range(K)], dt) for j in range(R)])
            for j, (_, d) in enumerate(t.ureads):
                scatter(self.OUT, d, outs[j])
        elif kind == "jtjp":
            D = emit([t.partials[k][j] for k in range(K) for j in range(R)])
            pv = [gather(self.PF, flat_pos(d)) for _, d in t.ureads]
            jp = []
            for k in range(K):
                s_ = zero
                for j in range(R):
                    s_ = b.fadd(s_, b.fmul(D[k * R + j], pv[j]))
                jp.append(s_)
            for j, (_, d) in enumerate(t.ureads):
                s_ = zero
                for k in range(K):
                    s_ = b.fadd(s_, b.fmul(D[k * R + j], jp[k]))
                scatter(self.OUT, d, s_)
        else:
            vals = emit(list(t.chans) + [t.partials[k][j] for k in range(K) for j in range(R)])
            F, D = vals[:K], vals[K:]
            groups = {}
            for j, (_, d) in enumerate(t.ureads):
                groups.setdefault((d.name, d.channel), []).append(j)
            true = ir.Constant(ir.VectorType(ir.IntType(1), W), [1] * W) if vec \
                else ir.Constant(ir.IntType(1), 1)
            for j, (_, d) in enumerate(t.ureads):
                s_ = zero
                for k in range(K):
                    s_ = b.fadd(s_, b.fmul(D[k * R + j], F[k]))
                scatter(self.OUT, d, s_)
                # diagonal: the J entry of (edge, k) for the vertex of read j is the sum of the
                # partials of every read of the same (unknown, channel) hitting that vertex;
                # only the first such read adds its square
                grp = groups[(d.name, d.channel)]
                vj = vertex(d)
                first = true
                for j2 in grp:
                    if j2 < j:
                        d2 = t.ureads[j2][1]
                        first = b.and_(first, b.icmp_signed("!=", vertex(d2), vj))
                s2 = zero
                for k in range(K):
                    ent = D[k * R + j]
                    for j2 in grp:
                        if j2 != j:
                            d2 = t.ureads[j2][1]
                            same = b.icmp_signed("==", vertex(d2), vj)
                            ent = b.fadd(ent, b.select(same, D[k * R + j2], zero))
                    s2 = b.fadd(s2, b.fmul(ent, ent))
                scatter(self.OUT2, d, b.select(first, s2, zero))

    def bind(self, fns, threads):
        self.fns = dict(fns)
        self.threads = threads
        n_full = self.plan.n_full
        self.outs = [np.zeros(n_full, self.dtype) for _ in range(threads)]
        self.outs2 = [np.zeros(n_full, self.dtype) for _ in range(threads)]
        self.rowsum = np.zeros(max(self.E) + 1 if self.E else 1, np.float64)
        self.ptrs = []
        for k in range(threads):
            arr = (ctypes.c_void_p * 8)(*[a.ctypes.data for a in (
                self.xf, self.pf, self.outs[k], self.outs2[k], self.data, self.idx, self.params,
                self.rowsum)])
            self.ptrs.append(arr)

    def set_params(self):
        for k, n in enumerate(self.plan._param_order):
            self.params[k] = self.plan.params[n]

    def refresh_data(self):
        for name, off in self.doff.items():
            a = self.plan.data[name].reshape(-1)
            self.data[off: off + a.size] = a

    def run(self, kind, threads):
        """Returns (out, out2) summed over threads (full layout), or the cost sum."""
        t = max(1, min(threads, self.threads))
        if kind == "cost":
            total = 0.0
            for ti, E in enumerate(self.E):
                # one call per thread chunk: each writes its partial sum at rowsum[start]
                tt = max(1, min(t, E // _MIN_LANES_PER_THREAD))
                self.rowsum[:] = 0
                _run_segments(self.fns[(ti, "cost")], E, ctypes.addressof(self.ptrs[0]), tt)
                total += float(self.rowsum.sum())
            return total
        per_term = [max(1, min(t, E // _MIN_LANES_PER_THREAD)) for E in self.E]
        t = max(per_term, default=1)  # only the private outputs some range writes
        for k in range(t):
            self.outs[k][:] = 0
            if kind == "grad":
                self.outs2[k][:] = 0
        for ti, (E, tt) in enumerate(zip(self.E, per_term)):
            _run_segments(self.fns[(ti, kind)], E, lambda k: ctypes.addressof(self.ptrs[k]), tt)
        out = self.outs[0]
        for k in range(1, t):
            out += self.outs[k]
        out2 = None
        if kind == "grad":
            out2 = self.outs2[0]
            for k in range(1, t):
                out2 += self.outs2[k]
        return out, out2


# =========================================================================== the plan part
class FusedPlan:
    """The fused kernels of one :class:`~lsq_opt._compiler.Plan` (built on first use).

    ``build_time``: seconds to generate and compile (0 compile when the module was already
    compiled in this process); ``ir``: the module's LLVM IR."""

    KINDS = ("jtjp", "grad", "cost")

    def __init__(self, plan):
        t0 = time.perf_counter()
        self.plan = plan
        self.dtype = plan.dtype
        for t in plan.terms:
            if getattr(t, "partials", None) is None:
                memo = sym.DiffMemo()
                t.partials = [[sym.diff(c, lf, memo) for lf, _ in t.ureads] for c in t.chans]
        by_dims = {}
        graph_terms = []
        for t in plan.terms:
            if t.is_graph:
                graph_terms.append(t)
            else:
                by_dims.setdefault(tuple(t.dims), []).append(t)
        self.grids = [_GridDomain(plan, dims, ts) for dims, ts in by_dims.items()]
        self.graph = _GraphPart(plan, graph_terms) if graph_terms else None
        self.threads = codegen.num_threads()
        module = codegen.KernelModule("lsq_opt_fused")
        for k, gd in enumerate(self.grids):
            gd.build(module, f"grid{k}")
        if self.graph is not None:
            self.graph.build(module, "graph")
        fns = module.compile()
        self.ir, self.compile_time = module.ir, module.compile_time
        for k, gd in enumerate(self.grids):
            gd.bind({kind: fns[f"grid{k}_{kind}"] for kind in self.KINDS})
        if self.graph is not None:
            self.graph.bind({(ti, kind): fns[f"graph_{ti}_{kind}"]
                             for ti in range(len(graph_terms)) for kind in self.KINDS},
                            self.threads)
        self.build_time = time.perf_counter() - t0
        self._x_key = None
        self._lin = None
        self._grad = None
        self._pver = self._dver = None

    # ---- state ------------------------------------------------------------------------
    def _sync(self):
        plan = self.plan
        if plan._dver != self._dver:
            for gd in self.grids:
                gd.refresh_data()
            if self.graph is not None:
                self.graph.refresh_data()
            self._dver = plan._dver
            self._x_key = None
        if plan._pver != self._pver:
            for gd in self.grids:
                gd.set_params()
            if self.graph is not None:
                self.graph.set_params()
            self._pver = plan._pver
            self._x_key = None

    def set_x(self, x):
        """Pack x (and the fixed entries) into the kernels' buffers, unless already there."""
        self._sync()
        x = np.asarray(x)
        if self._x_key is not None and self._x_key.shape == x.shape and \
                np.array_equal(self._x_key, x):
            return
        full = self.plan._full(x)
        for gd in self.grids:
            gd.set_x(full)
        if self.graph is not None:
            self.graph.xf[:] = full
        self._x_key = x.copy()
        self._grad = None

    def linearize(self, x):
        self.grad(x)
        self._lin = self._x_key

    def jtjp_linearized(self, p):
        if self._x_key is not self._lin:
            self.set_x(self._lin)
            self._lin = self._x_key
        return self._jtjp(p)

    def cost(self, x) -> float:
        self.set_x(x)
        tot = 0.0
        for gd in self.grids:
            gd.run("cost", self.threads)
            tot += float(gd.rowsum.sum())
        if self.graph is not None:
            tot += self.graph.run("cost", self.threads)
        return 0.5 * tot

    def grad(self, x):
        """(J^T F, diag(J^T J)) on the free unknowns (cached per x)."""
        self.set_x(x)
        if self._grad is not None:
            return self._grad
        plan = self.plan
        g = np.zeros(plan.n, self.dtype)
        dg = np.zeros(plan.n, self.dtype)
        for gd in self.grids:
            gd.run("grad", self.threads)
            g[gd.free_cols] += gd.out.reshape(-1)[gd.free_pos]
            dg[gd.free_cols] += gd.out2.reshape(-1)[gd.free_pos]
        if self.graph is not None:
            o1, o2 = self.graph.run("grad", self.threads)
            g += o1[plan.free_idx]
            dg += o2[plan.free_idx]
        self._grad = (g, dg)
        return self._grad

    def jtjp(self, x, p):
        self.set_x(x)
        return self._jtjp(p)

    def _stencil_ready(self):
        if len(self.grids) != 1 or self.graph is not None:
            raise NotImplementedError(
                "the multigrid preconditioner needs an energy on one grid index space (no graph "
                "terms); use preconditioner='jacobi'")
        gd = self.grids[0]
        if "jtjs" not in gd.fns:
            module = codegen.KernelModule("lsq_opt_fused_jtjs")
            gd._build_fn(module, "grid0_jtjs", "jtjs")
            gd.fns["jtjs"] = module.compile()["grid0_jtjs"]
            gd.plan_threads = self.threads
        return gd

    def jtj_matrix(self, x):
        """J^T J on the free unknowns (scipy CSR) at x, assembled from generated stencil
        planes (one grid domain only)."""
        gd = self._stencil_ready()
        self.set_x(x)
        return gd.jtj_matrix(self.plan.n)

    def coords(self):
        gd = self._stencil_ready()
        order = np.argsort(gd.free_cols)
        return gd.coords()[order]

    def _jtjp(self, p):
        plan = self.plan
        p = np.asarray(p, self.dtype)
        if p.shape != (plan.n,):
            raise ValueError(f"p must have shape ({plan.n},), got {p.shape}")
        if len(self.grids) == 1 and self.graph is None:
            gd = self.grids[0]
            gd.p.reshape(-1)[gd.free_pos] = p[gd.free_cols] if gd.identity is None else p
            gd.run("jtjp", self.threads)
            return gd.out.reshape(-1)[gd.free_pos] if gd.identity is not None else \
                _scatter(plan.n, gd.free_cols, gd.out.reshape(-1)[gd.free_pos], self.dtype)
        out = np.zeros(plan.n, self.dtype)
        for gd in self.grids:
            if gd.blocks is not None:
                for sl, view in gd.block_views(gd.p):
                    view[...] = p[sl].reshape(view.shape)
                gd.run("jtjp", self.threads)
                for sl, view in gd.block_views(gd.out):
                    block = out[sl].reshape(view.shape)
                    block += view
                continue
            gd.p.reshape(-1)[gd.free_pos] = p[gd.free_cols]
            gd.run("jtjp", self.threads)
            out[gd.free_cols] += gd.out.reshape(-1)[gd.free_pos]
        if self.graph is not None:
            every = plan.n == plan.n_full  # no excluded unknowns: free_idx is the identity
            if every:
                self.graph.pf[:] = p
            else:
                self.graph.pf[plan.free_idx] = p
            o1, _ = self.graph.run("jtjp", self.threads)
            out += o1 if every else o1[plan.free_idx]
        return out


def _scatter(n, cols, vals, dtype):
    out = np.zeros(n, dtype)
    out[cols] = vals
    return out
