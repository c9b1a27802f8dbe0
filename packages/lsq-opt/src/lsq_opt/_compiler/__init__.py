"""The lsq_opt compiler: an :class:`~lsq_opt._language.Energy` -> a :class:`Plan` implementing the
``LeastSquaresProblem`` protocol (cost = 1/2 sum F^2; J^T F, diag(J^T J), J^T J p, sparse J).

Per residual term (one ``Energy`` argument, K channels) the compiler builds, with
:func:`core_ad.sym.compile`, two per-lane kernels:

* ``f``: the K residual channels;
* ``fj``: the K channels and, for every *unknown read* u_r the term contains (a stencil read
  ``X(o, c)`` or a graph read ``X(G.v, c)``), the partials dr_k/du_r (OnePass ``sym.diff`` with one
  memo per term). The user never writes a derivative.

Lanes are the points of the term's domain (every pixel of its index space for a stencil term,
every hyperedge for a graph term). Stencil leaves are fed with shifted copies of the images
(zero outside); graph leaves with gathers ``A[idx_slot]``.

Boundaries (spec 2.6 / 10.3): a stencil residual without ``InBounds`` is zero (value and
partials) where any of its reads is out of bounds; with ``InBounds`` it is evaluated
everywhere, out-of-bounds reads give 0, and partials with respect to out-of-bounds reads
belong to no unknown (they are dropped).

Linearisation: ``fj`` is evaluated once per distinct x (the values F and the J entries are
cached against a copy of x), so ``jtf``, ``jtj_diag`` and every ``jtjp`` of one outer iteration
share one kernel evaluation. ``jtjp`` is J^T (J p) from the cached entries.

Products: J p per term is ``sum_r D_r * shift(P_u, o_r)``; J^T v and diag(J^T J) are GATHERS:
the unknown at q accumulates ``D_r(q - o_r) * v(q - o_r)`` for every read r of u at offset
o_r -- one shifted slice-add per (term, channel, read), no atomics. Graph terms scatter with
``np.add.at``.

The composition is written over an array module ``xp`` (``Plan._memory``: the plan's numpy
arrays, or for ``backend="cuda"`` their CuPy mirrors on the device, with ``cupy.add.at``;
see :mod:`lsq_opt._compiler.cuda`); the Plan's solver protocol stays numpy in / numpy out. A
cuda plan also offers ``device_problem()``: the protocol over device vectors, with fused product
kernels, which the solvers' all-device loop runs on.

Exclude (spec 2.6 [REC]): excluded unknowns are fixed (not in x); the energy is unchanged.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import scipy.sparse as sp
from core_ad import sym

from .._language import (
    EDGE_SLOT,
    edge_dim_name,
    VIEW_SUFFIX,
    BufferRef,
    Energy,
    SizeRef,
    InBoundsRef,
    IndexRef,
    ParamRef,
    Read,
    decode_leaf,
)
from .._solver.materialized import gram_matrix
from .optimize import Optimizations, code_statistics

__all__ = ["LsqCompileError", "Optimizations", "Plan", "code_statistics", "compile_problem"]


class LsqCompileError(ValueError):
    """An energy that cannot be compiled (undeclared / unbound arrays, mixed domains ...)."""


# --------------------------------------------------------------------------- shifting helpers
@functools.lru_cache(maxsize=4096)
def _shift_slices(shape, off):
    """Slices (dst, src) so that dst_arr[dst] = src_arr[src] realises B[p] = A[p + off]."""
    dst, src = [], []
    for n, o in zip(shape, off):
        lo, hi = max(0, -o), min(n, n - o)
        if hi <= lo:
            return None
        dst.append(slice(lo, hi))
        src.append(slice(lo + o, hi + o))
    return tuple(dst), tuple(src)


def _shifted(a, off, shape, xp=np):
    """B[p] = A[p + off] (0 where p + off is outside)."""
    out = xp.zeros(shape, a.dtype)
    s = _shift_slices(tuple(shape), tuple(off))
    if s is not None:
        out[s[0]] = a[s[1]]
    return out


def _add_shifted(dst, v, off):
    """dst[q] += v[q - off] where q - off is inside (the gather of a read at offset ``off``)."""
    s = _shift_slices(dst.shape, tuple(-o for o in off))  # cached: a few shapes and offsets
    if s is not None:
        dst[s[0]] += v[s[1]]


def _inbounds(shape, off):
    m = np.zeros(shape, bool)
    s = _shift_slices(tuple(shape), tuple(off))
    if s is not None:
        m[s[0]] = True
    return m


class _HostMemory:
    """Where the lanes composition finds its arrays, over the array module ``xp``: here the
    plan's own numpy arrays. The cuda backend's :class:`~lsq_opt._compiler.cuda.DeviceMemory`
    has the same interface over CuPy arrays (device copies, refreshed when the plan's change)."""

    xp = np
    upload = staticmethod(np.asarray)  # host array -> xp array
    download = staticmethod(np.asarray)  # xp array -> host array
    scatter_add = staticmethod(np.add.at)  # unbuffered dst[idx] += v

    def __init__(self, plan):
        self.plan = plan

    def data(self, name):
        return self.plan.data[name]

    def buffer(self, name, c):
        return self.plan.buffer(name, c)

    def graph(self, g, slot):
        return self.plan.graphs[g][slot]

    def param(self, name):
        return self.plan.params[name]

    def valid(self, t):
        return t.valid

    def constant(self, key, make):
        """A feed that never changes (``make()`` gives it on the host; ``key`` names it)."""
        return make()


def _lane_kernel(outputs, leaves, backend, name):
    if backend == "cuda":
        from .cuda import lane_kernel

        return lane_kernel(outputs, leaves, name)
    return sym.compile(outputs, leaves, backend=backend)


# --------------------------------------------------------------------------- terms
# constant exponents written as powers of sqrt(x) / sqrt(sqrt(x)) (exponent x 4 -> (root, power));
# the code generator multiplies out powers 1-4 and takes sqrt natively, where any other real
# exponent is a libm pow call, as is the derivative of every one of these (x^-0.25 -> -0.25
# x^-1.25): a Charbonnier TV product fell from 0.95 to 0.29 ms, its solve 3x
_ROOT_POWERS = {1: (4, 1), -1: (4, -1), 3: (4, 3), -3: (4, -3), 2: (2, 1), -2: (2, -1),
                6: (2, 3), -6: (2, -3)}


def _roots_for_fractional_powers(expr):
    """``expr`` with every ``pow(x, c)`` of a constant ``c`` in +-{1/4, 1/2, 3/4, 3/2} replaced
    by ``sqrt`` (twice for quarters) and an integer power, the same function up to rounding
    (sqrt is correctly rounded; at x = -0 a negative power gives -inf where pow gives +inf)."""
    mapping = {}
    for node in sym.calls([expr], "pow"):  # children first: a base's own powers go first
        c = node.args[1]
        if not sym.is_const(c) or c.dtype.kind != "f":
            continue
        quarters = float(c.value) * 4.0
        if quarters != round(quarters) or int(quarters) not in _ROOT_POWERS:
            continue
        degree, power = _ROOT_POWERS[int(quarters)]
        root = sym.sqrt(sym.substitute(node.args[0], mapping) if mapping else node.args[0])
        if degree == 4:
            root = sym.sqrt(root)
        mapping[node] = root ** power if power > 0 else 1.0 / root ** -power
    return sym.substitute(expr, mapping) if mapping else expr


class _Term:
    def __init__(self, index, chans, dtype, backend):
        self.index = index
        self.K = len(chans)
        leaves = sym.free_leaves(chans)
        decoded = {}
        for lf in leaves:
            d = decode_leaf(lf)
            if d is None:
                raise LsqCompileError(
                    f"residual term {index} reads {lf.kind!r} (key {lf.key!r}), which is not a "
                    f"declared Unknown, Array or Param (undeclared array {lf.kind!r})")
            decoded[lf] = d
        # retype float leaves to the plan dtype
        if np.dtype(dtype) != np.float64:
            mapping = {lf: sym.leaf(lf.kind, lf.key, dtype) for lf in leaves if lf.dtype.kind == "f"}
            chans = [sym.substitute(c, mapping) for c in chans]
            decoded = {mapping.get(lf, lf): d for lf, d in decoded.items()}
            leaves = list(decoded)
        chans = [_roots_for_fractional_powers(c) for c in chans]
        self.chans = chans
        self.leaves = leaves
        self.decoded = decoded
        reads = [(lf, d) for lf, d in decoded.items() if isinstance(d, Read)]
        if not reads:
            raise LsqCompileError(f"residual term {index} reads no array (a residual must read at least one array)")
        kinds = {("g", d.graph) if d.graph is not None else ("s", d.dims) for _, d in reads}
        if len(kinds) > 1:
            raise LsqCompileError(
                f"residual term {index} contains image reads from multiple domains: {sorted(map(str, kinds))}")
        (k, dom), = kinds
        self.is_graph = k == "g"
        self.graph = dom if self.is_graph else None
        self.dims = None if self.is_graph else dom
        self.has_inbounds = any(isinstance(d, InBoundsRef) for d in decoded.values())
        if self.is_graph and any(isinstance(d, (InBoundsRef, IndexRef, BufferRef, SizeRef))
                                 for d in decoded.values()):
            raise LsqCompileError(f"residual term {index}: InBounds/Index/SampledImage are not "
                                  "allowed in graph residuals")
        for d in decoded.values():
            if isinstance(d, InBoundsRef) and len(d.offset) != len(dom):
                raise LsqCompileError(f"residual term {index}: InBounds{d.offset} has the wrong arity for dims {dom}")
        self.reads = reads
        self.ureads = [(lf, d) for lf, d in reads if d.role == "unknown"]
        memo = sym.DiffMemo()
        partials = [sym.diff(c, lf, memo) for c in chans for lf, _ in self.ureads]
        self.R = len(self.ureads)
        self.partials = [partials[k * self.R:(k + 1) * self.R] for k in range(self.K)]
        self.f = _lane_kernel(list(chans), leaves, backend, f"lsq_term{index}_f")
        self.fj = _lane_kernel(list(chans) + partials, leaves, backend, f"lsq_term{index}_fj")
        self.L = None  # lanes, set at bind


def _collect_decls(terms, excludes):
    decls = {}
    for t in terms:
        for d in t.decoded.values():
            if isinstance(d, Read):
                prev = decls.setdefault(d.name, (d.role, d.dims, d.channels))
                if prev != (d.role, d.dims, d.channels):
                    raise LsqCompileError(
                        f"array {d.name!r} is declared twice with different signatures: {prev} vs "
                        f"{(d.role, d.dims, d.channels)}")
    for t in terms:
        for d in t.decoded.values():
            if isinstance(d, BufferRef):
                prev = decls.setdefault(d.name, ("array", d.dims, d.channels))
                if prev != ("array", d.dims, d.channels):
                    raise LsqCompileError(
                        f"array {d.name!r} is declared twice with different signatures")
    for ex in excludes:
        for lf in sym.free_leaves(ex.cond):
            d = decode_leaf(lf)
            if isinstance(d, Read):
                decls.setdefault(d.name, (d.role, d.dims, d.channels))
    return decls


# --------------------------------------------------------------------------- compile
def compile_problem(energy: Energy, *, sizes=None, arrays=None, params=None, graphs=None,
                    dtype=np.float64, backend="llvm", kernels=None, ignore_unused=False,
                    positional=None, optimizations=None) -> Plan:
    """Compile ``energy`` and bind it by name.

    ``sizes``: ``{dim_name: int}`` (optional where a bound array fixes the dim); ``arrays``:
    ``{name: ndarray}`` for every Array the energy reads and, optionally, initial / fixed values
    of Unknowns (default 0); ``params``: ``{name: float}``; ``graphs``: ``{graph_name:
    {slot: int array}}``; ``dtype``: float64 or float32; ``backend``: ``"llvm"``, ``"numpy"``
    or ``"cuda"`` (the per-term lane kernels: residuals, materialised J, and the oracle products;
    ``"cuda"``: core_ad's CUDA kernels on CuPy arrays, the lanes composition on the device, see
    :mod:`lsq_opt._compiler.cuda`; needs CuPy and a CUDA device); ``kernels``: ``"fused"``
    (default with the llvm backend: one generated LLVM pass per product, see
    :mod:`lsq_opt._compiler.fused`) or ``"lanes"`` (the composition of per-term lane kernels;
    the test oracle with the numpy backend; the only choice with the cuda backend).

    Names are strict: an entry of ``arrays`` / ``params`` / ``graphs`` that the energy does not
    read raises :class:`LsqCompileError` naming it and the expected names, unless
    ``ignore_unused=True`` (one shared data dict for several energies).

    ``positional``: Opt's binding by position (:mod:`lsq_opt._compiler.positional`): a list
    whose entry ``i`` binds every declaration with ``index=i`` (arrays, unknowns' initial
    values, params; ``None`` for unused positions); an Array sharing an Unknown's index is
    that unknown's constant view. Declarations without an index still bind by name.

    ``optimizations``: an :class:`~lsq_opt._compiler.optimize.Optimizations` for the fused
    kernels (default ``Optimizations.for_backend(backend)``: all of Opt's code optimisations,
    conditional execution only for ``"cuda"``: on the CPU it measured slower); every setting
    gives the same results up to rounding.
    """
    if not isinstance(energy, Energy):
        raise TypeError(f"compile_problem: expected an Energy, got {type(energy).__name__}")
    if positional is not None:
        from .positional import bind_positional

        energy, arrays, params = bind_positional(energy, positional, arrays or {}, params or {})
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"compile_problem: dtype must be float32 or float64, got {dtype}")
    if not energy.terms:
        raise LsqCompileError("compile_problem: the energy has no residual terms")
    if backend not in ("llvm", "numpy", "cuda"):
        raise ValueError(f"compile_problem: backend must be 'llvm', 'numpy' or 'cuda', got {backend!r}")
    if kernels is None:
        kernels = "fused" if backend == "llvm" else "lanes"
    if kernels not in ("fused", "lanes"):
        raise ValueError(f"compile_problem: kernels must be 'fused' or 'lanes', got {kernels!r}")
    if backend == "cuda":
        if kernels != "lanes":
            raise ValueError("compile_problem: the cuda backend composes lane kernels "
                             "(kernels='lanes'); the fused kernels are LLVM only")
        from .cuda import require_device

        require_device()  # before the (slow) term compilation
    terms = [_Term(i, chans, dtype, backend) for i, chans in enumerate(energy.terms)]
    plan = Plan(energy, terms, dict(sizes or {}), dict(arrays or {}), dict(params or {}),
                dict(graphs or {}), dtype, backend, ignore_unused=ignore_unused)
    plan.kernels = kernels
    if optimizations is None:
        optimizations = Optimizations.for_backend(backend)
    if not isinstance(optimizations, Optimizations):
        raise TypeError("compile_problem: optimizations must be an Optimizations, got "
                        f"{type(optimizations).__name__}")
    plan.optimizations = optimizations
    if backend == "cuda":
        from .cuda import DeviceMemory

        plan._memory = DeviceMemory(plan)
    return plan


class Plan:
    """A compiled, bound problem (the ``LeastSquaresProblem`` protocol). x is the flat vector of
    the free unknown scalars (unknowns in declaration-discovery order, each raveled C-order over
    ``dims + (channels,)``, excluded entries removed)."""

    def __init__(self, energy, terms, sizes, arrays, params, graphs, dtype, backend,
                 ignore_unused=False):
        self.energy, self.terms, self.dtype, self.backend = energy, terms, dtype, backend
        self.kernels = "lanes"
        # read when the fused kernels are built (on first use)
        self.optimizations = Optimizations.for_backend(backend)
        self._fused = None
        self._energy_kernels = None  # the cuda backend's fused kernels, built on first use
        self._memory = _HostMemory(self)  # where the lanes composition's arrays live
        self._pver = self._dver = 0
        self.decls = _collect_decls(terms, energy.excludes)
        self.sizes = {}
        for k, v in sizes.items():
            if not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"size of dim {k!r} must be a positive integer, got {v!r}")
            self.sizes[k] = int(v)
        self._size_src = {k: "sizes" for k in self.sizes}
        arrays, graphs = self._bind_edge_attributes(arrays, graphs)
        self._check_names(arrays, params, graphs, terms, ignore_unused)
        arrays = {k: v for k, v in arrays.items() if k in self.decls}
        # resolve sizes from bound arrays
        for name, (role, dims, ch) in self.decls.items():
            if name in arrays:
                self._infer_sizes(name, dims, ch, np.asarray(arrays[name]))
        for name, (role, dims, ch) in self.decls.items():
            if role == "array" and name not in arrays:
                raise LsqCompileError(
                    f"array {name!r} is read by the energy but not bound (pass arrays={{{name!r}: ...}})")
            for d in dims:
                if d not in self.sizes:
                    raise LsqCompileError(f"the size of dim {d!r} (used by {name!r}) is unknown: pass sizes={{{d!r}: n}}")
        self.data = {}
        for name, (role, dims, ch) in self.decls.items():
            if role == "array":
                self.data[name] = self._check_shape(name, dims, ch, arrays[name])
        self.views = {}  # const view name -> unknown name (refreshed at every linearize)
        for name, (role, dims, ch) in self.decls.items():
            if role == "view":
                u = name[: -len(VIEW_SUFFIX)]
                if self.decls.get(u, (None,))[0] != "unknown":
                    raise LsqCompileError(
                        f"{name!r} is a constant view of {u!r}, which the energy does not read as "
                        "an Unknown")
                if self.decls[u][1:] != (dims, ch):
                    raise LsqCompileError(f"{name!r}: dims/channels differ from unknown {u!r}")
                self.views[name] = u
        # params
        self.params = {}
        needed = {d.name for t in terms for d in t.decoded.values() if isinstance(d, ParamRef)}
        for p in sorted(needed):
            if p not in params:
                raise LsqCompileError(f"param {p!r} is used by the energy but not bound (pass params={{{p!r}: value}})")
        for p, v in params.items():
            self.set_param(p, v)
        self._param_order = sorted(needed)
        # unknown layout
        self.unknowns = [n for n, (role, _, _) in self.decls.items() if role == "unknown"]
        if not self.unknowns:
            raise LsqCompileError("the energy reads no Unknown")
        self._ushape, self._uoff = {}, {}
        off = 0
        for u in self.unknowns:
            _, dims, ch = self.decls[u]
            shp = tuple(self.sizes[d] for d in dims) + (ch,)
            self._ushape[u], self._uoff[u] = shp, off
            off += int(np.prod(shp))
        self.n_full = off
        self._fixed = np.zeros(off, dtype)
        for u in self.unknowns:
            if u in arrays:
                _, dims, ch = self.decls[u]
                self._uview(self._fixed, u)[...] = self._check_shape(u, dims, ch, arrays[u])
        # graphs
        self.graphs = {}
        for t in terms:
            if t.is_graph:
                self._bind_graph(t, graphs)
        # lanes and static masks
        self.m = 0
        for t in terms:
            if t.is_graph:
                t.L = len(next(iter(self.graphs[t.graph].values())))
                t.valid = None
            else:
                t.shape = tuple(self.sizes[d] for d in t.dims)
                t.L = int(np.prod(t.shape))
                if t.has_inbounds:
                    t.valid = None
                else:
                    v = np.ones(t.shape, bool)
                    for _, d in t.reads:
                        v &= _inbounds(t.shape, d.offset)
                    t.valid = v.ravel()
            t.row0 = self.m
            self.m += t.K * t.L
        # exclusion
        free = np.ones(self.n_full, bool)
        for ex in energy.excludes:
            self._apply_exclude(ex, free)
        self.free_idx = np.flatnonzero(free)
        self.n = len(self.free_idx)
        self._colmap = np.full(self.n_full, -1, np.int64)
        self._colmap[self.free_idx] = np.arange(self.n)
        self._lin_x = None
        self._lin = None
        self._j_structure = None  # J's sparsity, found on the first jacobian()
        self.x0 = self._fixed[self.free_idx].copy()
        self.linearize_changes_cost = bool(self.views)
        self._refresh_views(self._fixed)

    # ------------------------------------------------------------------ binding helpers
    def _bind_edge_attributes(self, arrays, graphs):
        """Edge attributes (``Graph(..., attrs=...)``) are bound inside their graph's dict; they
        become arrays over the graph's edge index space, read through the hidden slot
        ``EDGE_SLOT`` whose index of edge e is e. Returns the (arrays, graphs) to bind."""
        attrs: dict[str, dict[str, str]] = {}  # graph -> {attribute: array name}
        for name, (role, dims, _) in self.decls.items():
            g = name.split(".", 1)[0]
            if role == "array" and dims == (edge_dim_name(g),):
                attrs.setdefault(g, {})[name[len(g) + 1:]] = name
        if not attrs:
            return arrays, graphs
        arrays, graphs = dict(arrays), dict(graphs)
        for g, names in attrs.items():
            if g not in graphs:
                raise LsqCompileError(f"graph {g!r} is read by the energy but not bound "
                                      f"(pass graphs={{{g!r}: {{slot: idx, attribute: values}}}})")
            bound = dict(graphs[g])
            slots = [k for k in bound if k not in names]
            if not slots:
                raise LsqCompileError(f"graph {g!r}: no vertex slot is bound, only edge attributes {sorted(bound)}")
            E = len(np.asarray(bound[slots[0]]))
            for a, arr_name in names.items():
                ch = self.decls[arr_name][2]
                expected = (E,) if ch == 1 else (E, ch)
                if a not in bound:
                    raise LsqCompileError(
                        f"graph {g!r}: edge attribute {a!r} is read by the energy but not bound (pass "
                        f"graphs={{{g!r}: {{..., {a!r}: values of shape {expected}}}}})")
                values = np.asarray(bound.pop(a))
                if values.shape != expected:
                    raise ValueError(
                        f"graph {g!r}: edge attribute {a!r} has shape {values.shape}, expected "
                        f"{expected} (one {'value' if ch == 1 else f'{ch}-vector'} per edge; slot "
                        f"{slots[0]!r} has {E} edges)")
                arrays[arr_name] = values
            bound[EDGE_SLOT] = np.arange(E)
            graphs[g] = bound
        return arrays, graphs

    def _check_names(self, arrays, params, graphs, terms, ignore_unused):
        """Every name bound must be one the energy reads: a misspelled initial value would
        otherwise silently start from zeros."""
        if ignore_unused:
            return
        readable = sorted(n for n, (role, _, _) in self.decls.items() if role in ("array", "unknown"))
        unknown_names = [k for k in arrays if k not in self.decls]
        if unknown_names:
            raise LsqCompileError(
                f"arrays {unknown_names} are not read by the energy; expected names: Arrays and "
                f"Unknowns {readable} (pass ignore_unused=True to bind a shared data dict)")
        needed = sorted({d.name for t in terms for d in t.decoded.values() if isinstance(d, ParamRef)})
        extra = [k for k in params if k not in needed]
        if extra:
            raise LsqCompileError(f"params {extra} are not used by the energy; expected names: {needed} "
                                  "(pass ignore_unused=True to bind a shared parameter dict)")
        read_graphs = sorted({t.graph for t in terms if t.is_graph})
        extra = [k for k in graphs if k not in read_graphs]
        if extra:
            raise LsqCompileError(f"graphs {extra} are not read by the energy; expected names: {read_graphs}")

    def describe_nonfinite(self, x) -> str:
        """Where ``F(x)`` is first non-finite: the residual term, its channel, and the pixel
        (stencil terms) or edge (graph terms), with the data the term reads there; used in the
        solvers' error for a non-finite initial cost."""
        F = self.residuals(x)
        bad = np.flatnonzero(~np.isfinite(F))
        if not len(bad):
            return "every residual is finite"
        row = int(bad[0])
        t = next(t for t in reversed(self.terms) if t.row0 <= row)
        channel, lane = divmod(row - t.row0, t.L)
        names = sorted({d.name for _, d in t.reads})
        if t.is_graph:
            where = f"edge {lane} of graph {t.graph!r}"
            slots = {s: int(np.asarray(idx)[lane]) if np.ndim(idx) == 1 else np.asarray(idx)[lane].tolist()
                     for s, idx in sorted(self.graphs[t.graph].items()) if s != EDGE_SLOT}
            where += f" (slots {slots})"
        else:
            pos = tuple(int(i) for i in np.unravel_index(lane, t.shape))
            where = f"pixel {pos} of dims {tuple(t.dims)}"
        return (f"residual term {t.index} channel {channel} is {F[row]} at {where} "
                f"({len(bad)} non-finite residuals in all; the term reads {names})")

    def _infer_sizes(self, name, dims, ch, a):
        exp_nd = len(dims) + (1 if ch > 1 else 0)
        if a.ndim != exp_nd:
            raise ValueError(
                f"array {name!r} has shape {a.shape} but its declaration {list(dims)} with {ch} "
                f"channel(s) needs {exp_nd} axes")
        for d, n in zip(dims, a.shape):
            if d in self.sizes and self.sizes[d] != n:
                src = self._size_src.get(d)
                src_shape = self._size_shape.get(d) if hasattr(self, "_size_shape") else None
                raise ValueError(
                    f"mismatched image sizes: array {name!r} has shape {tuple(a.shape)} but dim {d!r} is "
                    f"{self.sizes[d]} from {src!r}"
                    + (f" of shape {tuple(src_shape)}" if src_shape is not None else ""))
            if d not in self.sizes:
                self.sizes[d] = int(n)
                self._size_src[d] = name
                if not hasattr(self, "_size_shape"):
                    self._size_shape = {}
                self._size_shape[d] = tuple(a.shape)
        if ch > 1 and a.shape[-1] != ch:
            raise ValueError(f"array {name!r} has shape {a.shape}: last axis must be its {ch} channels")

    def _check_shape(self, name, dims, ch, a):
        a = np.asarray(a)
        if not np.issubdtype(a.dtype, np.number) and a.dtype != np.bool_:
            raise TypeError(f"array {name!r}: expected numbers, got dtype {a.dtype}")
        exp = tuple(self.sizes[d] for d in dims) + ((ch,) if ch > 1 else ())
        if a.shape != exp:
            raise ValueError(f"mismatched image sizes: array {name!r} has shape {a.shape}, expected {exp}")
        return np.ascontiguousarray(a.reshape(exp[: len(dims)] + (ch,)), dtype=self.dtype)

    def _uview(self, full, u):
        o = self._uoff[u]
        shp = self._ushape[u]
        return full[o: o + math.prod(shp)].reshape(shp)

    def _bind_graph(self, t, graphs):
        g = t.graph
        if g in self.graphs:
            return
        if g not in graphs:
            raise LsqCompileError(f"graph {g!r} is read by the energy but not bound (pass graphs={{{g!r}: {{slot: idx}}}})")
        slot_dims = {}  # the slots every term on this graph reads, not just this one's
        for u in self.terms:
            if u.is_graph and u.graph == g:
                for _, d in u.reads:
                    slot_dims[d.slot] = d.dims
        bound = graphs[g]
        out, E = {}, None
        for s, dims in slot_dims.items():
            if s not in bound:
                raise LsqCompileError(f"graph {g!r}: slot {s!r} is not bound")
            idx = np.asarray(bound[s])
            if not np.issubdtype(idx.dtype, np.integer):
                raise TypeError(f"graph {g!r} slot {s!r}: indices must be integers, got {idx.dtype}")
            shape = tuple(self.sizes[d] for d in dims)
            size = int(np.prod(shape))
            if idx.ndim == 2 and len(shape) > 1:
                if idx.shape[1] != len(shape):
                    raise ValueError(f"graph {g!r} slot {s!r}: coordinates need {len(shape)} columns, got {idx.shape}")
                bad = np.flatnonzero(np.any((idx < 0) | (idx >= np.array(shape)), axis=1))
                if len(bad):
                    e = int(bad[0])
                    raise IndexError(
                        f"graph {g!r}: edge {e} slot {s!r} has index {tuple(idx[e])} outside the "
                        f"index space {shape} of dims {list(dims)}")
                idx = np.ravel_multi_index(tuple(idx.T), shape)
            elif idx.ndim != 1:
                raise ValueError(f"graph {g!r} slot {s!r}: expected a 1-D index array, got shape {idx.shape}")
            bad = np.flatnonzero((idx < 0) | (idx >= size))
            if len(bad):
                e = int(bad[0])
                raise IndexError(
                    f"graph {g!r}: edge {e} slot {s!r} has index {int(idx[e])} outside the "
                    f"index space of size {size} (dims {list(dims)})")
            if E is None:
                E = len(idx)
            elif len(idx) != E:
                raise ValueError(f"graph {g!r}: slots have different edge counts ({E} vs {len(idx)})")
            out[s] = idx.astype(np.int64)
        self.graphs[g] = out

    def _apply_exclude(self, ex, free):
        leaves = sym.free_leaves(ex.cond)
        reads = [(lf, decode_leaf(lf)) for lf in leaves]
        dims = {d.dims for _, d in reads if isinstance(d, Read)}
        if len(dims) != 1 or any(isinstance(d, Read) and d.graph is not None for _, d in reads):
            raise LsqCompileError("Exclude: the condition must read stencil arrays of one index space")
        (dims,) = dims
        shape = tuple(self.sizes[d] for d in dims)
        feeds = []
        for lf, d in reads:
            if isinstance(d, Read):
                if d.role == "unknown":
                    src = self._uview(self._fixed, d.name)[..., d.channel]
                else:
                    src = self.data[d.name][..., d.channel]
                feeds.append(_shifted(src, d.offset, shape))
            elif isinstance(d, ParamRef):
                feeds.append(np.asarray(self.params[d.name]))
            elif isinstance(d, InBoundsRef):
                feeds.append(_inbounds(shape, d.offset))
            elif isinstance(d, IndexRef):
                feeds.append(np.indices(shape)[d.dim].astype(np.float64))
            else:
                raise LsqCompileError(f"Exclude: undeclared leaf {lf.kind!r}")
        (mask,) = sym.compile([ex.cond], leaves, backend="numpy")(*feeds)
        mask = np.broadcast_to(np.asarray(mask, bool), shape)
        for u in self.unknowns:
            if self.decls[u][1] == dims:
                v = self._uview(free, u)
                v[mask] = False

    # ------------------------------------------------------------------ public binding API
    def set_param(self, name, value):
        self.params[name] = np.asarray(value, dtype=self.dtype).reshape(())
        self._lin_x = None
        self._pver += 1

    def set_array(self, name, value):
        """Replace a data array between solves (same shape)."""
        if name not in self.data:
            raise KeyError(f"no data array {name!r}")
        _, dims, ch = self.decls[name]
        self.data[name] = self._check_shape(name, dims, ch, value)
        self._lin_x = None
        self._dver += 1

    def unknowns_to_vector(self, values: dict) -> np.ndarray:
        """x from ``{unknown_name: array}`` (unknowns not given keep their bound values). The
        entries of excluded unknowns are taken as their new fixed values."""
        full = self._fixed.copy()
        for u, a in values.items():
            if u not in self._ushape:
                raise KeyError(f"{u!r} is not an unknown of this plan (unknowns: {self.unknowns})")
            _, dims, ch = self.decls[u]
            self._uview(full, u)[...] = self._check_shape(u, dims, ch, a)
        self._fixed[...] = np.where(self._colmap < 0, full, self._fixed)
        if self._fused is not None:
            self._fused._x_key = None
        return full[self.free_idx].copy()

    def vector_to_unknowns(self, x) -> dict:
        full = self._full(x)
        out = {}
        for u in self.unknowns:
            v = self._uview(full, u).copy()
            out[u] = v[..., 0] if v.shape[-1] == 1 else v
        return out

    def _full(self, x):
        x = np.asarray(x)
        if x.shape != (self.n,):
            raise ValueError(f"x must have shape ({self.n},), got {x.shape}")
        full = self._fixed.copy()
        full[self.free_idx] = x
        return full

    def _pfull(self, p):
        p = np.asarray(p, self.dtype)
        if p.shape != (self.n,):
            raise ValueError(f"p must have shape ({self.n},), got {p.shape}")
        full = np.zeros(self.n_full, self.dtype)
        full[self.free_idx] = p
        return full

    # ------------------------------------------------------------------ evaluation
    def _feeds(self, t, full):
        """The lane kernels' arguments (``full``: the unknowns, an array of ``_memory.xp``)."""
        mem = self._memory
        xp = mem.xp
        feeds = []
        for i, lf in enumerate(t.leaves):
            d = t.decoded[lf]
            if isinstance(d, Read):
                if d.role == "unknown":
                    src = self._uview(full, d.name)
                else:
                    src = mem.data(d.name)
                if t.is_graph:
                    flat = src.reshape(-1, src.shape[-1])
                    a = flat[mem.graph(t.graph, d.slot), d.channel]
                else:
                    a = _shifted(src[..., d.channel], d.offset, t.shape, xp)
                feeds.append(xp.ascontiguousarray(a.ravel(), self.dtype))
            elif isinstance(d, ParamRef):
                feeds.append(mem.param(d.name))
            elif isinstance(d, BufferRef):
                feeds.append(mem.buffer(d.name, d.channel))
            elif isinstance(d, SizeRef):
                feeds.append(mem.constant((t.index, i), lambda: np.asarray(self.sizes[d.dim], np.int64)))
            elif isinstance(d, InBoundsRef):
                feeds.append(mem.constant((t.index, i), lambda: np.ascontiguousarray(
                    _inbounds(t.shape, d.offset).ravel())))
            else:  # IndexRef
                feeds.append(mem.constant((t.index, i), lambda: np.ascontiguousarray(
                    np.indices(t.shape)[d.dim].astype(self.dtype).ravel())))
        return feeds

    def buffer(self, name, c):
        """Channel c of data array ``name`` as a flat C-order buffer (SampledImage reads)."""
        return np.ascontiguousarray(self.data[name][..., c]).ravel()

    def _lanes(self, t, a):
        xp = self._memory.xp
        a = xp.asarray(a, self.dtype)
        return xp.broadcast_to(a, (t.L,)) if a.shape != (t.L,) else a

    def _eval_term(self, t, full, with_j):
        xp = self._memory.xp
        fn = t.fj if with_j else t.f
        with np.errstate(all="ignore"):
            outs = fn(*self._feeds(t, full))
        F = xp.stack([self._lanes(t, o) for o in outs[: t.K]])
        D = None
        if with_j:
            D = xp.stack([self._lanes(t, o) for o in outs[t.K:]]).reshape(t.K, t.R, t.L) if t.R else \
                xp.zeros((t.K, 0, t.L), self.dtype)
        valid = self._memory.valid(t)
        if valid is not None:
            F = xp.where(valid, F, 0).astype(self.dtype)
            if D is not None:
                D = xp.where(valid, D, 0).astype(self.dtype)
        return F, D

    def _linearize(self, x):
        """Per term (F, D) at x, arrays of ``_memory.xp`` (cached against a copy of x)."""
        x = np.asarray(x)
        if self._lin_x is not None and self._lin_x.shape == x.shape and np.array_equal(self._lin_x, x):
            return self._lin
        full = self._memory.upload(self._full(x))
        lin = [self._eval_term(t, full, True) for t in self.terms]
        self._lin_x, self._lin = x.copy(), lin
        return lin

    def _residuals(self, x):
        x = np.asarray(x)
        if self._lin_x is not None and self._lin_x.shape == x.shape and np.array_equal(self._lin_x, x):
            Fs = [F for F, _ in self._lin]
        else:
            full = self._memory.upload(self._full(x))
            Fs = [self._eval_term(t, full, False)[0] for t in self.terms]
        return self._memory.xp.concatenate([F.ravel() for F in Fs])

    def residuals(self, x) -> np.ndarray:
        """F(x), flat: terms in order, each channel-major over its lanes (C-order pixels / edges)."""
        return self._memory.download(self._residuals(x))

    def cost(self, x) -> float:
        """0.5 * sum(F^2) (nan/inf when F is not finite)."""
        if self.kernels == "fused":
            return self.fused.cost(x)
        return self.cost_lanes(x)

    def cost_lanes(self, x) -> float:
        F = self._residuals(x).astype(np.float64)
        with np.errstate(all="ignore"):
            return float(0.5 * self._memory.xp.dot(F, F))

    def _transpose_apply(self, lin, V, square=False):
        """J_full^T applied to per-term lane vectors V (list of (K, L)); square=True gives diag."""
        mem = self._memory
        g = mem.xp.zeros(self.n_full, self.dtype)
        for t, (F, D), v in zip(self.terms, lin, V):
            if square and t.is_graph:
                self._graph_diag(t, D, g)
                continue
            for k in range(t.K):
                for r, (_, d) in enumerate(t.ureads):
                    w = D[k, r] * D[k, r] if square else D[k, r] * v[k]
                    gu = self._uview(g, d.name)[..., d.channel]
                    if t.is_graph:
                        mem.scatter_add(gu.reshape(-1), mem.graph(t.graph, d.slot), w)
                    else:
                        _add_shifted(gu, w.reshape(t.shape), d.offset)
        return g

    def _graph_diag(self, t, D, g):
        """diag(J^T J) of a graph term: reads of one (unknown, channel) through different slots
        may hit the same vertex on an edge; their partials then add before squaring."""
        mem = self._memory
        groups = {}
        for r, (_, d) in enumerate(t.ureads):
            groups.setdefault((d.name, d.channel), []).append((r, mem.graph(t.graph, d.slot)))
        for (name, c), rs in groups.items():
            gu = self._uview(g, name)[..., c].reshape(-1)
            for k in range(t.K):
                for a, (r, idx) in enumerate(rs):
                    mem.scatter_add(gu, idx, D[k, r] * D[k, r])
                    for r2, idx2 in rs[a + 1:]:
                        same = idx == idx2
                        if same.any():
                            mem.scatter_add(gu, idx[same], 2 * D[k, r][same] * D[k, r2][same])

    def device_problem(self):
        """For ``backend="cuda"``: this plan as a ``LeastSquaresProblem`` over device (CuPy)
        vectors, the problem of the solvers' all-device loop
        (:class:`~lsq_opt._compiler.cuda.DeviceProblem`; :func:`lsq_opt.solve` uses it unless
        ``device_loop=False``). None for the host backends."""
        if self.backend != "cuda":
            return None
        from .cuda import DeviceProblem

        return DeviceProblem(self)

    # ------------------------------------------------------------------ fused kernels
    @property
    def fused(self):
        """The fused LLVM kernels (:class:`~lsq_opt._compiler.fused.FusedPlan`), built on
        first use."""
        if self._fused is None:
            from .fused import FusedPlan

            self._fused = FusedPlan(self)
        return self._fused

    def _refresh_views(self, full):
        for name, u in self.views.items():
            v = self._uview(full, u)
            self.data[name] = np.ascontiguousarray(v, self.dtype).copy()
        if self.views:
            self._dver += 1
            self._lin_x = None

    def linearize(self, x):
        """Solver hook: called once per new iterate before ``jtf`` / ``jtj_diag`` / ``jtjp``.
        Constant views of unknowns (``X.const()``, the IRLS weights of ``L_p``) take the values
        of x here, so with views the energy itself changes at each linearisation
        (``linearize_changes_cost``)."""
        if self.views:
            self._refresh_views(self._full(np.asarray(x)))
        if self.kernels == "fused":
            self.fused.linearize(x)
        else:
            self._linearize(x)
        self._lin_point = np.array(x, copy=True)

    def jtjp_linearized(self, p) -> np.ndarray:
        """J^T J p at the x of the last :meth:`linearize` (the solvers' PCG operator)."""
        if self.kernels == "fused":
            return self.fused.jtjp_linearized(p)
        return self.jtjp_lanes(self._lin_point, p)

    def jtf(self, x) -> np.ndarray:
        if self.kernels == "fused":
            return self.fused.grad(x)[0].copy()
        return self.jtf_lanes(x)

    def jtj_diag(self, x) -> np.ndarray:
        if self.kernels == "fused":
            return self.fused.grad(x)[1].copy()
        return self.jtj_diag_lanes(x)

    def jtjp(self, x, p) -> np.ndarray:
        """J^T J p, matrix-free."""
        if self.kernels == "fused":
            return self.fused.jtjp(x, p)
        return self.jtjp_lanes(x, p)

    def jtj_matrix(self, x):
        """J^T J on the free unknowns (scipy CSR) at x: assembled from generated stencil
        planes for an energy on one grid (fused kernels), else J^T J of the materialised J."""
        if self.kernels == "fused":
            try:
                return self.fused.jtj_matrix(x)
            except NotImplementedError:
                pass
        return gram_matrix(self.jacobian(x))

    def prepare_jtj_matrix(self) -> None:
        """Compile what :meth:`jtj_matrix` runs, without running it: the stencil kernel of a
        fused plan on one grid (~0.3 s the first time), so that a caller timing the assembly
        (the solvers' ``linear_system="auto"``) prices the assembly, not the compile. Plans
        that assemble through J are left as they are."""
        if self.kernels == "fused":
            try:
                self.fused._stencil_ready()
            except NotImplementedError:
                pass

    @property
    def is_grid_energy(self) -> bool:
        """True when every term is a stencil term and every unknown lies on a grid of at least
        two dims (what geometric multigrid aggregation needs; the solvers' "auto"
        preconditioner picks multigrid for such energies)."""
        return (not any(t.is_graph for t in self.terms)
                and all(len(self.decls[u][1]) >= 2 for u in self.unknowns))

    def unknown_coords(self) -> np.ndarray:
        """(n, 1 + max ndim) int: per free unknown, a plane id (unknown, channel) and its grid
        position (vertex index for 1-D index spaces); for geometric multigrid aggregation.
        Fixed for the plan's lifetime: computed once (read-only)."""
        coords = getattr(self, "_unknown_coords", None)
        if coords is None:
            coords = self._unknown_coords = self._compute_unknown_coords()
            coords.flags.writeable = False
        return coords

    def _compute_unknown_coords(self) -> np.ndarray:
        nd = max(len(self.decls[u][1]) for u in self.unknowns)
        parts, plane = [], 0
        for u in self.unknowns:
            shp = self._ushape[u]
            idx = np.indices(shp).reshape(len(shp), -1).T  # (..., channel) C-order
            c = np.zeros((idx.shape[0], 1 + nd), np.int64)
            c[:, 0] = plane + idx[:, -1]
            c[:, 1: len(shp)] = idx[:, :-1]
            parts.append(c)
            plane += shp[-1]
        return np.concatenate(parts)[self.free_idx]

    def jtf_lanes(self, x) -> np.ndarray:
        lin = self._linearize(x)
        return self._memory.download(self._transpose_apply(lin, [F for F, _ in lin]))[self.free_idx]

    def jtj_diag_lanes(self, x) -> np.ndarray:
        lin = self._linearize(x)
        g = self._transpose_apply(lin, [None] * len(lin), square=True)
        return self._memory.download(g)[self.free_idx]

    def _jp_full(self, lin, pfull):
        mem = self._memory
        out = []
        for t, (F, D) in zip(self.terms, lin):
            jp = mem.xp.zeros((t.K, t.L), self.dtype)
            for r, (_, d) in enumerate(t.ureads):
                pu = self._uview(pfull, d.name)[..., d.channel]
                if t.is_graph:
                    ps = pu.reshape(-1)[mem.graph(t.graph, d.slot)]
                else:
                    ps = _shifted(pu, d.offset, t.shape, mem.xp).ravel()
                jp += D[:, r, :] * ps
            out.append(jp)
        return out

    def jp(self, x, p) -> np.ndarray:
        """J p (flat, residual order)."""
        lin = self._linearize(x)
        jp = self._jp_full(lin, self._memory.upload(self._pfull(p)))
        return self._memory.download(self._memory.xp.concatenate([v.ravel() for v in jp]))

    def jtjp_lanes(self, x, p) -> np.ndarray:
        """J^T J p, matrix-free: J^T (J p) from the cached J entries (the numpy oracle)."""
        lin = self._linearize(x)
        jp = self._jp_full(lin, self._memory.upload(self._pfull(p)))
        return self._memory.download(self._transpose_apply(lin, jp))[self.free_idx]

    def jacobian(self, x):
        """The materialised J (scipy.sparse.csr_matrix, m x n): the materialised linear systems,
        checks and baselines. Its sparsity is the plan's (graphs and exclusions are fixed at
        compile time): found once, after which a call gathers the partials into it."""
        lin = self._linearize(x)
        if self._j_structure is None:
            self._j_structure = self._jacobian_structure()
        picks, inverse, indices, indptr = self._j_structure
        vals = [self._memory.download(D)[k, r][ok]
                for (t, (_, D)) in zip(self.terms, lin) for (k, r, ok) in picks[t.index]]
        vals = np.concatenate(vals) if vals else np.zeros(0)
        data = np.bincount(inverse, weights=vals, minlength=len(indices)).astype(self.dtype)
        return sp.csr_matrix((data, indices, indptr), shape=(self.m, self.n))

    def _jacobian_structure(self):
        """Per term, the (channel k, read r, lanes) blocks of J's entries, and the CSR layout
        they sum into (entries at the same (row, column) add)."""
        picks, rows, cols = {}, [], []
        for t in self.terms:
            picks[t.index] = []
            lanes = np.arange(t.L)
            for r, (_, d) in enumerate(t.ureads):
                base = self._uoff[d.name]
                C = self._ushape[d.name][-1]
                if t.is_graph:
                    pix = self.graphs[t.graph][d.slot]
                    ok = np.ones(t.L, bool)
                else:
                    coords = np.indices(t.shape).reshape(len(t.shape), -1) + np.array(d.offset)[:, None]
                    ok = np.all((coords >= 0) & (coords < np.array(t.shape)[:, None]), axis=0)
                    pix = np.zeros(t.L, np.int64)
                    pix[ok] = np.ravel_multi_index(tuple(coords[:, ok]), t.shape)
                col = self._colmap[base + pix * C + d.channel]
                ok = ok & (col >= 0)
                for k in range(t.K):
                    picks[t.index].append((k, r, ok))
                    rows.append(t.row0 + k * t.L + lanes[ok])
                    cols.append(col[ok])
        rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        cols = np.concatenate(cols) if cols else np.zeros(0, np.int64)
        keys, inverse = np.unique(rows * max(self.n, 1) + cols, return_inverse=True)
        indptr = np.zeros(self.m + 1, np.int64)
        np.cumsum(np.bincount(keys // max(self.n, 1), minlength=self.m), out=indptr[1:])
        return picks, inverse.ravel(), (keys % max(self.n, 1)).astype(np.int64), indptr

    def __repr__(self):
        return (f"Plan(n={self.n}, m={self.m}, unknowns={self.unknowns}, terms={len(self.terms)}, "
                f"dtype={self.dtype}, backend={self.backend!r})")
