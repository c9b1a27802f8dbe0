"""Lazy evaluation with fusion for traced arrays (Enoki / Dr.Jit style).

By default (mode ``"auto"``) lane-wise operations on at least ``AUTO_MIN_LANES`` lanes are lazy
and smaller ones eager; ``core_ad.set_lazy(True)`` / ``with core_ad.lazy():`` makes every size
lazy, ``set_lazy(False)`` every size eager. In lazy mode a lane-wise
operation (a primitive with an LLVM lowering) on operands of one shape does not compute: it
records a :mod:`core_ad.sym` node over *leaves* (the numpy buffers it reads) and the Array holds
a :class:`Pending` value (shape and dtype known). Anything that needs numbers -- ``.value``,
printing, ``numpy()``/``np.asarray``, a partial reduction, a transpose, gather or scatter
(these stay eager), :func:`eval` -- evaluates **every live pending array of the scope at
once**: their expressions become the outputs of one lane-wise kernel per lane count (a
reshape keeps a pending array pending: the lanes stay in order), compiled by
``sym.compile`` (LLVM, vectorised, multi-threaded) through the structural kernel cache.

A sum over every element of a pending array stays pending too: a ``lane_sum`` output of the
kernel that computes its operand (no array of terms is stored, and the sum is compensated).
Operations on such sums whose result has one element (``mean``, a loss's scalar arithmetic)
stay pending as well and are evaluated after the kernels that compute the sums; an operation
that would spread a sum over many lanes evaluates the scope first.
Leaves are named by their order of first use in the scope, so a loop whose iterations repeat
the same operations builds the same expressions and hits the cache.

Reverse mode on the fused graph: in a first-order ``backward`` the local partials of lane-wise
nodes (``cos x`` for ``sin x``) and the adjoint arithmetic are recorded the same way, on the
still-pending primal expressions, so primal and derivative arithmetic end up in one kernel
(CSE and constant folding by the symbolic engine); it is evaluated once, after the graph is
freed, so intermediates that nothing references any more are never stored.

A scope also evaluates when it has recorded ``max_pending_nodes`` operations (bounds the
kernel size and its compile time).

Arrays whose data are CuPy arrays (:mod:`core_ad._device`) are recorded the same way, at every
size (device data have no eager path), together with 1-D gathers and scatters (``lane_gather``
/ ``lane_scatter_add`` nodes over the index's lanes, bounds-checked by the kernel), and
evaluated by ``sym.compile(..., backend="cuda")`` kernels: pending arrays are grouped by
(device, lane count). What has no device path raises ``DeviceUnsupportedError``.

Before each evaluation the graph is simplified by vertex elimination (:mod:`core_ad._eliminate`,
on by default, ``set_vertex_elimination(False)`` turns it off), so that intermediates that only
the graph holds are folded into edge weights and never stored.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from ._device import DeviceMismatchError, array_module, describe, is_device_array, is_host_scalar

_state = threading.local()
MAX_PENDING_NODES = 4000
SCALAR_LANES = 16  # arrays with fewer lanes are evaluated by scalar (not vector) kernels


class Pending:
    """A not-yet-computed value: a symbolic expression over the scope's leaves. ``reduces``:
    the expression reads whole-array sums (``lane_sum`` nodes, listed in ``Scope.sums``).
    ``device``: ``"cpu"`` (numpy leaves, LLVM kernels) or ``"cuda"`` (CuPy leaves, CUDA
    kernels). ``result``: the computed value once its scope was evaluated (read by untracked
    views sharing this Pending, e.g. a derivative sweep's operands)."""

    __slots__ = ("expr", "shape", "dtype", "scope", "where", "reduces", "device", "result")

    def __init__(self, expr, shape, dtype, scope, where, reduces=False, device="cpu"):
        self.expr, self.shape, self.dtype, self.scope = expr, shape, np.dtype(dtype), scope
        self.where, self.reduces, self.device = where, reduces, device
        self.result = None

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))


class Scope:
    """The leaves and pending arrays recorded since the last evaluation."""

    def __init__(self):
        # id(buffer) -> (var, buffer); ("cuda", id) for a host scalar uploaded to the device,
        # ("buffer", id) for a device array read whole by gathers / scatters
        self.leaves = {}
        self.aliases = []  # arrays whose leaf buffer is another array
        self.pending = []  # weakrefs to Arrays holding a Pending of this scope
        # id(lane_sum or device lane_scatter_add node) -> (node, (device, lanes of the kernel
        # that computes it))
        self.sums = {}
        self.n_ops = 0
        self.closed = False

    def leaf(self, arr, device="cpu"):
        """The var reading ``arr`` (numpy, or CuPy for ``device="cuda"``: a host scalar is
        then uploaded as a 0-d device array)."""
        from . import sym

        key = id(arr) if device == "cpu" or is_device_array(arr) else ("cuda", id(arr))
        hit = self.leaves.get(key)
        if hit is not None:
            return hit[0]
        if not isinstance(key, int):
            self.aliases.append(arr)  # its id stays taken while the upload is a leaf
            arr = sys.modules["cupy"].asarray(np.asarray(arr).reshape(-1)[:1].reshape(()))
        elif arr.ndim and not any(arr.strides):
            # a broadcast scalar (a reduction's adjoint seed): read one number, not a copy
            # of it per lane; the broadcast view stays alive so that its id is not reused
            self.aliases.append(arr)
            arr = arr.reshape(-1)[:1].reshape(())
        name = f"_lazy{len(self.leaves)}_{arr.dtype.str[1:]}"
        # the symbolic engine takes leaves as finite and drops NaN-safe guards on that basis:
        # a buffer holding inf or NaN gets a leaf that says otherwise. Its sum is inf or NaN
        # then (one pass, no temporary); a sum that merely overflows errs on the safe side.
        if arr.dtype.kind in "fc" and not np.isfinite(arr.sum()):
            v = sym.leaf("lazy", name, arr.dtype, finite=False)
        else:
            v = sym.var(name, arr.dtype)
        self.leaves[key] = (v, arr)
        return v

    def buffer(self, arr):
        """The ``sym.buffer`` leaf reading the whole device array ``arr`` (gathers and
        scatters index it)."""
        from . import sym

        key = ("buffer", id(arr))
        hit = self.leaves.get(key)
        if hit is None:
            v = sym.buffer(f"_lazy{len(self.leaves)}_{arr.dtype.str[1:]}", arr.dtype)
            hit = self.leaves[key] = (v, arr)
        return hit[0]


# The mode of a thread that has not called set_lazy: "auto" -- operations on at least
# AUTO_MIN_LANES lanes are recorded and fused, smaller ones run eagerly: on a few lanes a
# kernel's compile and launch cost more than numpy (a 20-step rotation fit on 3-vectors: 0.02 s
# eager, 0.08 s lazy, 0.29 s on the first call), on many lanes fusion wins (bench_grad, the
# memory argument). The bound is where a lazy value_and_grad of 50 lane-wise ops (10 steps of
# sin(b) * 1.1 + b * b * 0.25, then a sum) catches up with numpy: recording costs ~30 us per
# op (with sym's construction memo), so lazy took 3.0-3.4 ms up to 16k lanes (4.3 at 32k, 4.8
# at 50k), eager 1.6 ms at 2000, 2.3 at 5000, 4.9 at 16k, 9.0 at 32k, 16 at 50k.
# CORE_AD_LAZY=1 in the environment (read at import): lazy at every size -- how CI runs the
# core-ad suite a second time; CORE_AD_LAZY=0: eager everywhere.
AUTO = "auto"
AUTO_MIN_LANES = 8192
_ENV = os.environ.get("CORE_AD_LAZY", AUTO).strip().lower()
DEFAULT_LAZY = (True if _ENV in ("1", "true", "yes", "on")
                else False if _ENV in ("0", "false", "no", "off") else AUTO)


def lazy_mode():
    """This thread's mode: True (lazy at every size), False (eager) or ``"auto"``."""
    return getattr(_state, "lazy", DEFAULT_LAZY)


def is_lazy() -> bool:
    """Whether operations may be recorded lazily (True in ``"auto"`` mode too)."""
    return bool(lazy_mode())


def min_lanes() -> int:
    """The fewest lanes an operation needs to be recorded lazily in this thread's mode."""
    return AUTO_MIN_LANES if lazy_mode() == AUTO else 1


def set_lazy(flag=True):
    """Set this thread's mode: True (lazy at every size), False (eager, evaluating what is
    pending) or ``"auto"`` (lazy from :data:`AUTO_MIN_LANES` lanes, the default); returns the
    previous mode."""
    if flag != AUTO:
        flag = bool(flag)
    prev = lazy_mode()
    if prev and not flag:
        evaluate_scope()
    _state.lazy = flag
    return prev


@contextmanager
def lazy(flag=True):
    """``with core_ad.lazy():`` -- lazy mode at every size inside the block (``lazy(False)``:
    eager; ``lazy("auto")``: the default), evaluated when it is left."""
    prev = set_lazy(flag)
    try:
        yield
    finally:
        set_lazy(prev)


def current_scope() -> Scope:
    s = getattr(_state, "scope", None)
    if s is None or s.closed:
        s = _state.scope = Scope()
    return s


def vertex_elimination_enabled() -> bool:
    return getattr(_state, "elim", True) and not getattr(_state, "no_elim", 0)


def set_vertex_elimination(flag: bool = True) -> bool:
    """Turn vertex elimination before lazy evaluations on or off (per thread); returns the
    previous setting."""
    prev = getattr(_state, "elim", True)
    _state.elim = bool(flag)
    return prev


@contextmanager
def transform_trace(eliminate: bool = False):
    """The trace of a transform's function. Vertex elimination stays on only when
    ``eliminate`` (a first-order transform) and no other transform is tracing: an enclosing
    one may differentiate the recorded graph again, which a simplified graph cannot."""
    depth = getattr(_state, "transforms", 0)
    _state.transforms = depth + 1
    off = not (eliminate and depth == 0)
    _state.no_elim = getattr(_state, "no_elim", 0) + off
    try:
        yield
    finally:
        _state.transforms = depth
        _state.no_elim -= off


@contextmanager
def no_elimination():
    """No automatic vertex elimination inside the block: derivative sweeps, and the traces of
    transforms that may differentiate the graph again (eliminated nodes are first-order only)."""
    _state.no_elim = getattr(_state, "no_elim", 0) + 1
    try:
        yield
    finally:
        _state.no_elim -= 1


SIMPLIFY = None  # set by _eliminate (it needs _tracing, which imports this module)


def stats() -> dict:
    """Counters: ``evaluations`` (scope flushes), ``kernels`` (kernel launches), ``outputs``
    (arrays computed), ``compiled`` (kernels built, i.e. cache misses), ``eliminated`` (graph
    nodes collapsed by vertex elimination before evaluations)."""
    return _STATS


_STATS = {"evaluations": 0, "kernels": 0, "outputs": 0, "compiled": 0, "eliminated": 0}


def _user_frame() -> str:
    """``file:line`` of the first frame outside core_ad (named in evaluation errors)."""
    import sys

    f = sys._getframe(2)
    while f is not None and "/core_ad/" in f.f_code.co_filename.replace("\\", "/"):
        f = f.f_back
    return "<unknown>" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def _lane_shape(args):
    """The common shape of the array operands, or None when they differ (eager then)."""
    shape = None
    for a in args:
        s = getattr(a, "shape", None)
        if s is None or (isinstance(a, np.ndarray | np.generic) and a.ndim == 0):
            continue
        s = tuple(s)
        if s == ():
            continue
        if shape is None:
            shape = s
        elif s != shape:
            return None
    return () if shape is None else shape


def record(prim, args, params, array_cls):
    """The Pending value of ``prim(*args)`` or None when the operation must run eagerly."""
    from . import _rules as R
    from ._codegen.llvm.emitter import LOWERINGS
    from ._primitives import bind

    if prim is R.reduce_sum_p:
        return _record_sum(args[0], params["axes"], params["keepdims"])
    if prim is R.reshape_p or prim is R.broadcast_to_p:
        return _record_reshape(prim, args[0], params["shape"])
    if prim is R.take_p or prim is R.scatter_add_p:
        return _record_indexed(prim, args, params, array_cls)
    if not prim.elementwise or prim.name not in LOWERINGS:
        return None
    shape = _lane_shape(args)
    if shape is None:
        return None
    pending = [a._value for a in args if isinstance(getattr(a, "_value", None), Pending)]
    device = _device_of(prim, args, array_cls)
    if (not pending and device == "cpu" and min_lanes() > 1
            and math.prod(shape) < min_lanes()):
        return None  # (device data have no eager path: recorded at every size)
    reduces = any(v.reduces for v in pending)
    if reduces and math.prod(shape) != 1:
        if device == "cpu":
            return None  # a sum spread over lanes: evaluate the sum first
        evaluate_scope()  # on the device: the sum becomes a 0-d leaf of the new scope
        reduces = False
    scope = current_scope()
    exprs = []
    for a in args:
        if isinstance(a, array_cls):
            v = a._value
            if isinstance(v, Pending) and v.result is not None:
                v = v.result
            if isinstance(v, Pending):
                if v.scope is not scope:
                    return None
                exprs.append(v.expr)
                continue
            a = v
        if device == "cuda" and is_device_array(a):
            if a.dtype.kind not in "biuf":
                return None
            exprs.append(scope.leaf(a, device))
        elif isinstance(a, np.ndarray | np.generic):
            a = np.asarray(a)
            if a.dtype.kind not in "biuf":
                return None
            exprs.append(scope.leaf(a, device))
        elif isinstance(a, bool | int | float):
            exprs.append(a)
        else:
            return None
    expr = bind(prim, *exprs, **params)
    scope.n_ops += 1
    return Pending(expr, shape, expr.dtype, scope, _user_frame(), reduces, device)


def _device_of(prim, args, array_cls) -> str:
    """``"cuda"`` when an operand is a CuPy array (or pending on the device), else ``"cpu"``;
    a :class:`DeviceMismatchError` naming both when another operand is a numpy array or a
    pending host value (host scalars -- :func:`is_host_scalar` -- go with either)."""
    cuda = host = None
    for a in args:
        v = a._value if isinstance(a, array_cls) else a
        if isinstance(v, Pending) and v.result is not None:
            v = v.result
        if isinstance(v, Pending):
            on_device = v.device == "cuda"
        elif is_device_array(v):
            on_device = True
        elif isinstance(v, np.ndarray) and not is_host_scalar(v):
            on_device = False
        else:
            continue
        if on_device:
            cuda = a if cuda is None else cuda
        else:
            host = a if host is None else host
    if cuda is None:
        return "cpu"
    if host is not None:
        raise DeviceMismatchError(
            f"{prim.name} at {_user_frame()} mixes {describe(cuda)} with {describe(host)}; put"
            " both on one device (cupy.asarray(x) uploads, cupy.asnumpy(x) downloads)"
        )
    return "cuda"


def _record_indexed(prim, args, params, array_cls):
    """``take`` / ``scatter_add`` along the only axis of device data: a ``lane_gather`` /
    ``lane_scatter_add`` over the lanes of the index, fused with the arithmetic that computes
    the index and the values. The kernel checks every index and the launcher's IndexError
    names the array and the lane. A scatter's result is an output of that kernel (like a
    whole-array sum). Host data: None (numpy's)."""
    from . import _rules as R
    from ._device import DeviceUnsupportedError

    idx = params["indices"]
    operands = (*args, idx)
    if _device_of(prim, operands, array_cls) == "cpu":
        return None
    target = args[0]
    if len(target.shape) != 1:
        raise DeviceUnsupportedError(
            f"{prim.name} at {_user_frame()}: on CuPy arrays only 1-D arrays are gathered from"
            f" / scattered into in device kernels, got shape {tuple(target.shape)}")
    if any(isinstance(getattr(a, "_value", None), Pending) and a._value.reduces
           for a in operands):
        evaluate_scope()  # an index or value that reads a sum: the sum first
    buf = force(target) if isinstance(target, array_cls) else target
    scope = current_scope()
    where = _user_frame()
    exprs = [_operand_expr(a, scope, array_cls) for a in (idx, *args[1:])]
    if any(e is None for e in exprs):
        raise DeviceUnsupportedError(
            f"{prim.name} at {where}: an index or value of dtype"
            f" {', '.join(str(R.dtype_of(a)) for a in (idx, *args[1:]))} on the device")
    leaf = scope.buffer(buf)
    scope.n_ops += 1
    name = params["name"]
    if prim is R.take_p:
        expr = R.lane_gather(leaf, exprs[0], name=name)
        return Pending(expr, tuple(R.shape_of(idx)), expr.dtype, scope, where, device="cuda")
    expr = R.lane_scatter_add(leaf, exprs[0], exprs[1], name=name)
    scope.sums[id(expr)] = (expr, ("cuda", math.prod(R.shape_of(idx))))
    return Pending(expr, tuple(target.shape), expr.dtype, scope, where, True, "cuda")


def _operand_expr(a, scope, array_cls):
    """The expression of an operand in ``scope`` on the device (None: not a number array)."""
    v = a._value if isinstance(a, array_cls) else a
    if isinstance(v, Pending) and v.result is not None:
        v = v.result
    if isinstance(v, Pending):
        return v.expr if v.scope is scope else None
    if isinstance(v, bool | int | float):
        return v
    if (is_device_array(v) or isinstance(v, np.ndarray | np.generic)) and v.dtype.kind in "biuf":
        return scope.leaf(v, "cuda")
    return None


def _pending_value(x):
    """``x``'s value; a computed CuPy array becomes a Pending leaf (device data have no eager
    path, so a reshape or sum of them is recorded too)."""
    v = getattr(x, "_value", None)
    if isinstance(v, Pending) and v.result is not None:
        v = v.result
    if is_device_array(v) and v.dtype.kind in "biuf":
        scope = current_scope()
        return Pending(scope.leaf(v, "cuda"), tuple(v.shape), v.dtype, scope, _user_frame(),
                       device="cuda")
    return v


def _record_reshape(prim, x, shape):
    """A pending array in another shape: a reshape keeps the lanes in order (kernels run over
    the flattened lanes), and a one-element array broadcast is its value in every lane."""
    from . import _rules as R

    v = _pending_value(x)
    if not isinstance(v, Pending) or v.scope is not current_scope():
        return None
    if prim is R.broadcast_to_p and v.size != 1:
        return None  # a real broadcast: numpy's
    if prim is R.broadcast_to_p and v.reduces and math.prod(shape) != 1:
        if v.device == "cpu":
            return None  # a sum spread over lanes: numpy's
        evaluate_scope()  # on the device: the sum first, then a 0-d leaf read by every lane
        v = _pending_value(x)
    return Pending(v.expr, tuple(shape), v.dtype, v.scope, v.where, v.reduces, v.device)


def _record_sum(x, axes, keepdims):
    """The Pending sum of every element of ``x`` when ``x`` is pending in this scope (a sum of
    a computed array is numpy's job), else None."""
    from . import _rules as R

    v = _pending_value(x)
    if (not isinstance(v, Pending) or v.reduces or v.scope is not current_scope()
            or v.dtype.kind != "f" or not v.shape or len(axes) != len(v.shape)):
        return None
    expr = R.lane_sum(v.expr)
    v.scope.sums[id(expr)] = (expr, (v.device, v.size))
    v.scope.n_ops += 1
    shape = (1,) * len(v.shape) if keepdims else ()
    return Pending(expr, shape, v.dtype, v.scope, _user_frame(), True, v.device)


def track(arr, scope):
    scope.pending.append(weakref.ref(arr))
    if scope.n_ops >= MAX_PENDING_NODES and not getattr(_state, "simplifying", False):
        evaluate_scope(scope)


def materialize(p: Pending, scope: Scope):
    """The value of a pending expression that folded to a constant or a leaf."""
    from . import sym

    e = p.expr
    if sym.is_const(e):
        xp = sys.modules["cupy"] if p.device == "cuda" else np
        return xp.full(p.shape, e.value, p.dtype)
    for v, buf in scope.leaves.values():
        if v is e:  # the leaf itself, maybe reshaped (same size) or broadcast (one element)
            b = (buf.reshape(p.shape) if buf.size == p.size
                 else array_module(buf).broadcast_to(buf, p.shape))
            return b.astype(p.dtype, copy=True)
    return None


def evaluate_scope(scope: Scope | None = None):
    """Compute every live pending array of ``scope`` (default: the current one)."""

    scope = getattr(_state, "scope", None) if scope is None else scope
    if scope is None or scope.closed:
        return
    if SIMPLIFY is not None and vertex_elimination_enabled() and not getattr(
        _state, "simplifying", False
    ):
        # records its edge weights in this scope, evaluated below
        _STATS["eliminated"] += SIMPLIFY()
    scope.closed = True  # new operations open a new scope
    live = []
    for r in scope.pending:
        a = r()
        if a is not None and isinstance(a._value, Pending) and a._value.scope is scope:
            live.append(a)
    if not live:
        return
    _STATS["evaluations"] += 1
    try:
        _evaluate_live(scope, live)
    except BaseException:
        # a kernel that failed (an index out of range ...) leaves the arrays it did not compute
        # pending: the scope reopens, so reading one evaluates (and reports) again instead of
        # finding it stranded in a closed scope
        if getattr(_state, "scope", None) is scope:
            scope.closed = False
        raise


def _evaluate_live(scope, live):
    """The body of :func:`evaluate_scope`: compute the ``live`` pending arrays."""
    from . import sym

    computed = [(a, a._value) for a in live]
    lane_groups: dict = {}  # (device, lanes) -> arrays
    sum_groups: dict = {}  # arrays whose expressions read sums: evaluated after the sums
    for a in live:
        p = a._value
        m = materialize(p, scope)
        if m is not None:
            a._value = m
            continue
        (sum_groups if p.reduces else lane_groups).setdefault((p.device, p.size), []).append(a)
    needed = {}  # the sums read, each computed by the kernel of its operand's lanes
    if sum_groups:
        stop = set(scope.sums)
        for arrays in sum_groups.values():
            for n in sym.toposort([a._value.expr for a in arrays], stop=stop):
                if id(n) in stop:
                    needed[id(n)] = scope.sums[id(n)]
    for _, group in needed.values():
        lane_groups.setdefault(group, [])
    sums = {}
    for group, arrays in lane_groups.items():
        extra = [node for node, g in needed.values() if g == group]
        for node, value in zip(extra, _evaluate_group(scope, group, arrays, extra)):
            sums[node] = scope.leaf(value, group[0])
    for (device, lanes), arrays in sum_groups.items():
        exprs = sym.substitute([a._value.expr for a in arrays], sums)
        for a, e in zip(arrays, exprs):
            p = a._value
            a._value = Pending(e, p.shape, p.dtype, scope, p.where, device=device)
        rest = []
        for a in arrays:  # e.g. the sum itself: now one of the leaves
            m = materialize(a._value, scope)
            if m is None:
                rest.append(a)
            else:
                a._value = m
        if rest:  # arithmetic on a few numbers: numpy on the host (no kernel to compile)
            _evaluate_group(scope, (device, lanes), rest, [],
                            backend="numpy" if device == "cpu" else "cuda")
    for a, p in computed:  # for views sharing the Pending (they are not tracked)
        p.result = a._value


def _evaluate_group(scope, group, arrays, extra, backend=None):
    """Compute the pending ``arrays`` of ``group = (device, lanes)`` (any shapes, ``lanes``
    elements) in one kernel over their flattened lanes, which also computes the sums ``extra``
    (lane_sum nodes over that many lanes); returns their values. On ``"cuda"``: a CUDA kernel
    over CuPy arrays (``backend`` is then ``"cuda"`` too)."""
    from . import sym
    from ._codegen.cache import KERNELS

    device, lanes = group
    if device == "cuda":
        backend, xp = "cuda", sys.modules["cupy"]
    else:
        xp = np
    outs, index = [], {}
    for a in arrays:
        e = a._value.expr
        if e not in index:
            index[e] = len(outs)
            outs.append(e)
    outs += extra
    where = arrays[0]._value.where if arrays else "<a sum>"
    leaves = sorted(sym.free_leaves(outs), key=lambda v: int(v.key[5:].split("_")[0]))
    var_buf = {v: buf for v, buf in scope.leaves.values()}
    lane_input = None
    if extra and lanes > 1 and not any(v.kind != "buffer" and var_buf[v].size == lanes
                                       for v in leaves):
        # a kernel's lane count is the length of its per-lane inputs: sums and scatters over
        # lanes whose operands are all one number (a broadcast, a constant) need one anyway
        lane_input = xp.zeros(lanes, np.bool_)
        leaves.append(sym.var("_lazy_lanes", np.bool_))
    misses = KERNELS.misses
    try:
        # a few lanes gain nothing from vector code, whose staged tail costs compile time
        # per output (a tape of scalar intermediates has thousands of outputs)
        fn = (sym.compile(outs, leaves, backend=backend) if backend is not None
              else sym.compile(outs, leaves, vectorize=lanes >= SCALAR_LANES))
    except Exception as e:  # a lowering problem: name the user's line of the first op
        raise type(e)(f"{e} (lazy evaluation of the operation at {where})") from e
    _STATS["compiled"] += KERNELS.misses - misses
    ins = []
    for v in leaves:
        buf = lane_input if v.key == "_lazy_lanes" else var_buf[v]
        if v.kind == "buffer":  # read (or copied and scattered into) whole
            buf = xp.ascontiguousarray(buf)
        elif buf.ndim and (buf.size != 1 or lanes == 1):
            buf = xp.ascontiguousarray(buf).reshape(-1)
        elif buf.ndim:  # one element broadcast to every lane (a broadcast_to recorded it)
            buf = buf.reshape(())
        ins.append(buf)
    try:
        res = fn(*ins)
    except (IndexError, ValueError, FloatingPointError) as e:
        raise type(e)(f"{e} (lazy evaluation of the operation at {where})") from e
    _STATS["kernels"] += backend != "numpy"
    _STATS["outputs"] += len(outs)
    for a in arrays:
        p = a._value
        r = xp.asarray(res[index[p.expr]])
        a._value = (xp.broadcast_to(r, p.shape) if r.ndim == 0 else r.reshape(p.shape)).astype(
            p.dtype, copy=r.ndim == 0)
    return [xp.asarray(r) for r in res[len(res) - len(extra):]]


def force(arr):
    """``arr``'s numpy value (evaluating its scope when pending)."""
    v = arr._value
    if isinstance(v, Pending) and v.result is not None:
        arr._value = v = v.result
    if isinstance(v, Pending):
        evaluate_scope(v.scope)
        v = arr._value
        if isinstance(v, Pending):  # its scope was evaluated without it (cannot happen)
            raise RuntimeError("lazy evaluation left an array pending")
    return v
