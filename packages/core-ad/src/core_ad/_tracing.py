"""Tracing arrays: an array-granular tape over numpy (Enoki-style, one node per array op).

An :class:`Array` is a numpy value plus, when it was computed from arrays that require
gradients, the primitive, parameters and arguments that produced it. Leaves are arrays created
by the user (``requires_grad=True`` makes them differentiable). The graph holds parent links
only; nodes are also appended (weakly) to a creation-ordered tape so that Enoki-style
:func:`forward` can find everything that depends on a seeded array.

Derivatives come from the rule table (:mod:`core_ad._rules`). Reverse mode visits each node
once in reverse topological order, summing adjoints over fan-out. With ``create_graph=True`` the
derivative computation itself is traced on :class:`Array` values, which gives closure and hence
nesting to any order.
"""

from __future__ import annotations

import sys
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from . import _lazy
from . import _rules as R
from ._device import array_module, is_device_array, on_device, to_host, unsupported
from ._primitives import Primitive, register_kind

_state = threading.local()


def _grad_enabled() -> bool:
    return getattr(_state, "grad_enabled", True)


@contextmanager
def _grad_mode(enabled: bool):
    prev = _grad_enabled()
    _state.grad_enabled = enabled
    try:
        yield
    finally:
        _state.grad_enabled = prev


def no_grad():
    """Context manager: operations inside record no graph."""
    return _grad_mode(False)


def enable_grad():
    """Context manager: re-enable recording (inside :func:`no_grad`)."""
    return _grad_mode(True)


class GraphFreedError(RuntimeError):
    """A traversal reached a node whose graph was freed by an earlier backward pass."""


class _Tape:
    """Creation-ordered weak references to recorded nodes (for Enoki-style forward)."""

    def __init__(self):
        self.refs: list[weakref.ref] = []
        self._limit = 1024

    def append(self, node):
        self.refs.append(weakref.ref(node))
        if len(self.refs) > self._limit:
            self.refs = [r for r in self.refs if r() is not None]
            self._limit = max(1024, 2 * len(self.refs))

    def live(self):
        for r in self.refs:
            n = r()
            if n is not None:
                yield n


_TAPE = _Tape()


def _as_value(x, dtype=None):
    if isinstance(x, Array):
        x = x.value
    if is_device_array(x):  # CuPy data stay on the device
        return x if dtype is None else x.astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)


class Array:
    """A differentiable array over numpy (or CuPy: see :mod:`core_ad._device`).

    ``Array(value, requires_grad=True)`` creates a leaf whose gradient accumulates in ``.grad``
    after :meth:`backward`. Arithmetic, comparisons, indexing and the functions of
    :mod:`core_ad.numpy` record nodes; numpy ufuncs applied to an Array dispatch there too.
    ``.tangent`` holds forward-mode tangents after :func:`forward` (a separate slot from
    ``.grad``).
    """

    __slots__ = (
        "_value",
        "_prim",
        "_args",
        "_params",
        "_requires_grad",
        "_freed",
        "_retain",
        "grad",
        "tangent",
        "name",
        "__weakref__",
    )
    __array_priority__ = 1000

    def __init__(self, value, requires_grad: bool = False, dtype=None, name: str | None = None):
        self._value = _as_value(value, dtype)
        self._prim = None
        self._args = None
        self._params = None
        self._freed = False
        self._retain = False
        self.grad = None
        self.tangent = None
        self.name = name
        self._requires_grad = False
        if requires_grad:
            self.requires_grad = True

    @classmethod
    def _node(cls, value, prim, args, params):
        node = cls.__new__(cls)
        node._value = value
        node._prim = prim
        node._args = args
        node._params = params
        node._requires_grad = True
        node._freed = False
        node._retain = False
        node.grad = None
        node.tangent = None
        node.name = None
        _TAPE.append(node)
        return node

    @property
    def value(self) -> np.ndarray:
        """The numpy value, or the CuPy one for data on the device (evaluates pending lazy
        arithmetic, see :mod:`core_ad._lazy`)."""
        v = self._value
        if isinstance(v, _lazy.Pending):
            return _lazy.force(self)
        return v

    @value.setter
    def value(self, v):
        self._value = v

    @property
    def is_pending(self) -> bool:
        """True while the value is scheduled but not computed (lazy mode)."""
        return isinstance(self._value, _lazy.Pending)

    @classmethod
    def _view(cls, x):
        """An untracked Array sharing ``x``'s value, pending or not (lazy derivative sweeps)."""
        v = cls.__new__(cls)
        v._value = x._value
        v._prim = v._args = v._params = None
        v._requires_grad = v._freed = v._retain = False
        v.grad = v.tangent = v.name = None
        return v

    # ---- gradient bookkeeping
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool):
        if self._prim is not None:
            if not flag:
                raise ValueError("cannot clear requires_grad on a computed array; use detach()")
            return
        if flag and self._value.dtype.kind not in "fc":
            raise TypeError(
                f"cannot differentiate with respect to an array of dtype {self.value.dtype};"
                " only floating-point arrays can require gradients"
            )
        self._requires_grad = bool(flag)

    @property
    def is_leaf(self) -> bool:
        return self._prim is None

    def retain_grad(self):
        """Keep the adjoint of this computed array in ``.grad`` after backward."""
        self._retain = True
        return self

    def detach(self) -> Array:
        return Array(self.value)

    def backward(self, seed=None, retain_graph: bool = False, create_graph: bool = False):
        backward(self, seed, retain_graph=retain_graph, create_graph=create_graph)

    # ---- numpy-like surface
    shape = property(lambda self: self._value.shape)
    dtype = property(lambda self: self._value.dtype)
    ndim = property(lambda self: self._value.ndim)
    size = property(lambda self: self._value.size)
    T = property(lambda self: R.transpose(self))

    def __len__(self):
        return len(self.value)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __bool__(self):
        return bool(self.value)

    def __float__(self):
        return float(self.value)

    def __int__(self):
        return int(self.value)

    def item(self):
        return self.value.item()

    def numpy(self) -> np.ndarray:
        """The primal value (detached), as a numpy array (a host copy of device data)."""
        return to_host(self.value)

    def __array__(self, dtype=None, copy=None):
        v = self.value
        if is_device_array(v):  # as CuPy: no implicit transfer
            raise TypeError("implicit conversion of an Array on the device to a numpy array is"
                            " not allowed; use .numpy() (a host copy) or .value (the CuPy array)")
        return v if dtype is None else v.astype(dtype)

    def __repr__(self):
        tag = ", requires_grad=True" if self.requires_grad else ""
        label = f", name={self.name!r}" if self.name else ""
        device = ", device='cuda'" if is_device_array(self.value) else ""
        return (f"Array({np.array2string(self.numpy(), precision=6)}{tag}{label}{device})")

    def __hash__(self):
        return id(self)

    def reshape(self, *shape):
        return R.reshape(self, shape[0] if len(shape) == 1 else shape)

    def astype(self, dtype):
        return R.astype(self, dtype)

    def sum(self, axis=None, keepdims=False):
        return R.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return R.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return R.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return R.min(self, axis, keepdims)

    def transpose(self, *axes):
        return R.transpose(self, axes if axes else None)

    def __getitem__(self, index):
        return R.getitem(self, index)

    def __setitem__(self, index, value):
        raise TypeError(
            "Arrays are immutable (in-place updates would break derivatives);"
            " use core_ad.numpy.scatter / index updates that return a new array"
        )

    __add__ = lambda self, o: R.add(self, o)  # noqa: E731
    __radd__ = lambda self, o: R.add(o, self)  # noqa: E731
    __sub__ = lambda self, o: R.sub(self, o)  # noqa: E731
    __rsub__ = lambda self, o: R.sub(o, self)  # noqa: E731
    __mul__ = lambda self, o: R.mul(self, o)  # noqa: E731
    __rmul__ = lambda self, o: R.mul(o, self)  # noqa: E731
    __truediv__ = lambda self, o: R.div(self, o)  # noqa: E731
    __rtruediv__ = lambda self, o: R.div(o, self)  # noqa: E731
    __floordiv__ = lambda self, o: R.floor_divide(self, o)  # noqa: E731
    __rfloordiv__ = lambda self, o: R.floor_divide(o, self)  # noqa: E731
    __mod__ = lambda self, o: R.mod(self, o)  # noqa: E731
    __rmod__ = lambda self, o: R.mod(o, self)  # noqa: E731
    __pow__ = lambda self, o: R.pow(self, o)  # noqa: E731
    __rpow__ = lambda self, o: R.pow(o, self)  # noqa: E731
    __matmul__ = lambda self, o: R.matmul(self, o)  # noqa: E731
    __rmatmul__ = lambda self, o: R.matmul(o, self)  # noqa: E731
    __neg__ = lambda self: R.neg(self)  # noqa: E731
    __pos__ = lambda self: self  # noqa: E731
    __abs__ = lambda self: R.abs(self)  # noqa: E731
    __lt__ = lambda self, o: R.lt(self, o)  # noqa: E731
    __le__ = lambda self, o: R.le(self, o)  # noqa: E731
    __gt__ = lambda self, o: R.gt(self, o)  # noqa: E731
    __ge__ = lambda self, o: R.ge(self, o)  # noqa: E731
    __and__ = lambda self, o: R.logical_and(self, o)  # noqa: E731
    __or__ = lambda self, o: R.logical_or(self, o)  # noqa: E731
    __invert__ = lambda self: R.logical_not(self)  # noqa: E731

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = _UFUNCS.get(ufunc)
        if method != "__call__" or fn is None or kwargs:
            if any(isinstance(a, Array) and a.requires_grad for a in inputs):
                raise TypeError(
                    f"numpy.{ufunc.__name__}.{method} on a traced Array is not differentiable;"
                    " use the functions of core_ad.numpy"
                )
            vals = [a.value if isinstance(a, Array) else a for a in inputs]
            return getattr(ufunc, method)(*vals, **kwargs)
        return fn(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        fn = _ARRAY_FUNCTIONS.get(func)
        if fn is not None:
            return fn(*args, **kwargs)
        if _any_traced(args) or _any_traced(kwargs.values()):
            raise TypeError(
                f"numpy.{func.__name__} on a traced Array is not differentiable;"
                " use the functions of core_ad.numpy"
            )
        return func(*_strip(args), **{k: _strip([v])[0] for k, v in kwargs.items()})


def _any_traced(xs):
    for x in xs:
        if isinstance(x, Array) and x.requires_grad:
            return True
        if isinstance(x, (list, tuple)) and _any_traced(x):
            return True
    return False


def _strip(xs):
    out = []
    for x in xs:
        if isinstance(x, Array):
            out.append(x.value)
        elif isinstance(x, (list, tuple)):
            out.append(type(x)(_strip(x)))
        else:
            out.append(x)
    return out


_UFUNCS = {
    np.add: R.add,
    np.subtract: R.sub,
    np.multiply: R.mul,
    np.divide: R.div,
    np.negative: R.neg,
    np.power: R.pow,
    np.exp: R.exp,
    np.expm1: R.expm1,
    np.log: R.log,
    np.log1p: R.log1p,
    np.sqrt: R.sqrt,
    np.sin: R.sin,
    np.cos: R.cos,
    np.tan: R.tan,
    np.arcsin: R.arcsin,
    np.arccos: R.arccos,
    np.arctan: R.arctan,
    np.arctan2: R.arctan2,
    np.sinh: R.sinh,
    np.cosh: R.cosh,
    np.tanh: R.tanh,
    np.absolute: R.abs,
    np.sign: R.sign,
    np.floor: R.floor,
    np.ceil: R.ceil,
    np.rint: R.round,
    np.trunc: R.trunc,
    np.maximum: R.maximum,
    np.minimum: R.minimum,
    np.less: R.lt,
    np.less_equal: R.le,
    np.greater: R.gt,
    np.greater_equal: R.ge,
    np.equal: R.eq,
    np.not_equal: R.ne,
    np.logical_and: R.logical_and,
    np.logical_or: R.logical_or,
    np.logical_not: R.logical_not,
    np.isfinite: R.isfinite,
    np.isnan: R.isnan,
    np.square: R.square,
    np.reciprocal: R.reciprocal,
    np.matmul: R.matmul,
}

_ARRAY_FUNCTIONS = {
    np.sum: R.sum,
    np.mean: R.mean,
    np.max: R.max,
    np.min: R.min,
    np.prod: R.prod,
    np.where: R.where,
    np.reshape: R.reshape,
    np.transpose: R.transpose,
    np.concatenate: R.concatenate,
    np.stack: R.stack,
    np.dot: R.dot,
    np.matmul: R.matmul,
    np.cross: R.cross,
    np.take: R.take,
    np.broadcast_to: R.broadcast_to,
    np.expand_dims: R.expand_dims,
    np.squeeze: R.squeeze,
    np.swapaxes: R.swapaxes,
    np.clip: R.clamp,
}


def _producer(x, prim):
    """The recorded arguments of ``x`` if it is a live node of ``prim``, else None."""
    if isinstance(x, Array) and x._prim is prim and not x._freed:
        return x._args
    return None


def _reshape_back(args, params):
    """reshape(reshape(y, s), y.shape) is y."""
    inner = _producer(args[0], R.reshape_p)
    if inner is not None and isinstance(inner[0], Array) and inner[0].shape == params["shape"]:
        return inner[0]
    return None


def _take_stacked_slice(args, params):
    """getitem(concatenate(parts of width 1, axis=a), [:, ..., k, ...]) is part k, squeezed.

    This is how ``x[:, j]`` of a stacked set of columns returns the column itself, so its
    derivative is not a scatter into a dense zero matrix (batch_hessian depends on it).
    """
    parts = _producer(args[0], R.concatenate_p)
    if parts is None:
        return None
    x, index = args[0], params["index"]
    axis = x.ndim + x._params["axis"]
    if len(index) != axis + 1 or not all(
        isinstance(i, slice) and i == slice(None) for i in index[:axis]
    ):
        return None
    k = index[axis]
    if not isinstance(k, (int, np.integer)) or not -x.shape[axis] <= k < x.shape[axis]:
        return None
    if not all(isinstance(p, Array) and p.shape[axis] == 1 for p in parts):
        return None
    k = int(k) % x.shape[axis]
    part = parts[k]
    return R.reshape(part, part.shape[:axis] + part.shape[axis + 1 :])


_PEEPHOLES = {R.reshape_p: _reshape_back, R.getitem_p: _take_stacked_slice}


def _process(prim: Primitive, args: tuple, params: dict):
    rewrite = _PEEPHOLES.get(prim)
    if rewrite is not None and _grad_enabled():
        hit = rewrite(args, params)
        if hit is not None:
            return hit
    out = _lazy.record(prim, args, params, Array) if _lazy.is_lazy() else None
    if out is None:
        vals = tuple(a.value if isinstance(a, Array) else a for a in args)
        if any(is_device_array(v) for v in vals):
            raise unsupported(prim.name, _lazy._user_frame(), _lazy.is_lazy())
        out = np.asarray(prim.impl(*vals, **params))
    if (
        prim.differentiable
        and out.dtype.kind in "fc"
        and _grad_enabled()
        and any(isinstance(a, Array) and a._requires_grad for a in args)
    ):
        res = Array._node(out, prim, args, params)
    else:
        res = Array.__new__(Array)
        res._value = out
        res._prim = res._args = res._params = None
        res._requires_grad = res._freed = res._retain = False
        res.grad = res.tangent = res.name = None
    if isinstance(out, _lazy.Pending):
        _lazy.track(res, out.scope)
    return res


register_kind(Array, 10, _process, broadcasts=True)


# ---------------------------------------------------------------------------------------------
# traversals


def _toposort(roots, stop=frozenset()):
    """Ancestors of ``roots`` that require gradients, parents before children.

    Iterative (no recursion limit). Nodes whose id is in ``stop`` are treated as leaves.
    """
    order, visited = [], set()
    stack = [(r, False) for r in roots if isinstance(r, Array) and r._requires_grad]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if node._prim is None or id(node) in stop:
            continue
        if node._freed:
            raise GraphFreedError(
                "this graph was freed by an earlier backward pass; call backward(...,"
                " retain_graph=True) the first time to traverse it again"
            )
        for a in node._args:
            if isinstance(a, Array) and a._requires_grad and id(a) not in visited:
                stack.append((a, False))
    return order


def _check_seed(out: Array, seed, what="seed"):
    if seed is None:
        if on_device(out):  # one number read by every lane (a 0-d leaf of the kernel)
            cp = sys.modules["cupy"]
            return cp.broadcast_to(cp.ones((), out.dtype), out.shape)
        return np.ones(out.shape, dtype=out.dtype)
    if isinstance(seed, Array) and seed.requires_grad:
        if seed.shape != out.shape:
            raise ValueError(f"{what} has shape {seed.shape} but the output has shape {out.shape}")
        return seed
    seed = seed.value if isinstance(seed, Array) else seed
    xp = array_module(seed)
    seed = xp.asarray(seed)
    if seed.shape != out.shape:
        if seed.shape == () or seed.size == 1 and seed.ndim <= out.ndim:
            seed = xp.broadcast_to(seed.reshape(()), out.shape)
        else:
            raise ValueError(f"{what} has shape {seed.shape} but the output has shape {out.shape}")
    if seed.dtype.kind not in "fc":
        raise TypeError(f"{what} must be floating point, got dtype {seed.dtype}")
    return seed.astype(out.dtype, copy=False)


def _backprop(outputs, seeds, targets=None, create_graph=False, retain_graph=False,
              accumulate=True, keep_pending=False):
    """Reverse sweep. Returns the cotangents reaching ``targets`` (dict id -> cotangent).

    With ``accumulate`` leaf gradients (and retained gradients) are summed into ``.grad``.
    Targets stop the traversal: nothing below a target is visited. A lazy sweep evaluates
    the cotangents it found, unless ``keep_pending`` (they are then Arrays, maybe pending).
    """
    # a lazy evaluation inside the sweep must not rewrite the graph being traversed
    with _lazy.no_elimination():
        return _backprop_sweep(outputs, seeds, targets, create_graph, retain_graph, accumulate,
                               keep_pending)


def _backprop_sweep(outputs, seeds, targets, create_graph, retain_graph, accumulate,
                    keep_pending=False):
    stop = frozenset(id(t) for t in targets) if targets is not None else frozenset()
    order = _toposort(outputs, stop)
    reach = None
    if targets is not None:
        # Only nodes with a path to a target matter: prune the rest (cheaper, and it keeps
        # recorded sweeps from re-entering custom rules that do not lead to the targets).
        reach = set(stop)
        for node in order:
            if node._prim is not None and id(node) not in stop and any(
                isinstance(a, Array) and id(a) in reach for a in node._args
            ):
                reach.add(id(node))
    cts: dict[int, object] = {}
    for o, s in zip(outputs, seeds):
        if not (isinstance(o, Array) and o._requires_grad):
            continue
        prev = cts.get(id(o))
        cts[id(o)] = s if prev is None else R.add(prev, s)
    found = {}
    deferred = []  # (leaf or retained node, adjoint): accumulated after the sweep
    fuse = _lazy.is_lazy() and not create_graph
    # Local partials are evaluated on every lane, masked-off ones included (sqrt'(0) = inf);
    # the safe multiply zeroes those lanes, so the floating-point warnings are expected noise.
    with _grad_mode(create_graph), np.errstate(divide="ignore", invalid="ignore"):
        for node in reversed(order):
            ct = cts.pop(id(node), None)
            if ct is None or (reach is not None and id(node) not in reach):
                continue
            if id(node) in stop:
                found[id(node)] = ct
                continue
            if node._prim is None:
                if accumulate:
                    deferred.append((node, ct))
                continue
            if node._retain and accumulate:
                deferred.append((node, ct))
            args = node._args
            wrt = tuple(
                isinstance(a, Array) and a._requires_grad and (reach is None or id(a) in reach)
                for a in args
            )
            if create_graph:
                in_args, out = args, node
                if not isinstance(ct, Array):
                    ct = Array(ct)
            elif fuse and (node._prim.vjp is None or node._prim.extra.get("lanewise")
                           or node._prim.extra.get("shape_only_vjp") or on_device(node)):
                # lazy: the partials and adjoint arithmetic are recorded on the (possibly
                # pending) primal values and fused with them into one kernel (device data:
                # every rule, as they have no eager path)
                in_args = tuple(Array._view(a) if isinstance(a, Array) else a for a in args)
                out = Array._view(node)
                if is_device_array(ct):  # a seed: recorded like the rest
                    ct = Array(ct)
            else:
                in_args = tuple(a.value if isinstance(a, Array) else a for a in args)
                out = node.value
                if isinstance(ct, Array):
                    ct = ct.value
            in_cts = R.apply_vjp(node._prim, ct, in_args, out, wrt, node._params)
            for a, c in zip(args, in_cts):
                if c is None:
                    continue
                prev = cts.get(id(a))
                cts[id(a)] = c if prev is None else R.add(prev, c)
    if not retain_graph:
        for node in order:
            if node._prim is not None and id(node) not in stop and (
                reach is None or id(node) in reach
            ):
                node._args = None
                node._freed = True
    # after freeing (and dropping the sweep's own references to the nodes and to the last
    # cotangents it handled): a lazy evaluation then stores only what is still referenced
    order = reach = node = ct = in_cts = in_args = out = a = c = prev = None
    with _grad_mode(create_graph):
        for node, ct in deferred:
            _accumulate(node, ct, create_graph)
    if fuse and not keep_pending:
        found = {k: v.value if isinstance(v, Array) else v for k, v in found.items()}
    return found


def _accumulate(node: Array, ct, create_graph):
    if create_graph:
        g = ct if isinstance(ct, Array) else Array(ct)
        if g.dtype != node.dtype:
            g = R.astype(g, node.dtype)
    else:
        g = ct.value if isinstance(ct, Array) else ct
        xp = array_module(g)
        g = g.astype(node.dtype, copy=True) if xp is not np else np.array(g, dtype=node.dtype)
        if g.shape != node.shape:
            g = xp.broadcast_to(g, node.shape).copy()
    if node.grad is None:
        node.grad = g
    else:
        node.grad = R.add(node.grad, g)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def backward(outputs, seed=None, retain_graph: bool = False, create_graph: bool = False):
    """Reverse mode from ``outputs`` (one array or a list), seeded with ``seed``.

    A missing seed is all ones (Enoki's convention: for a non-scalar output this back-propagates
    the sum of its lanes). Seeds may be per-lane weights of the output's shape; with several
    outputs pass one seed per output (Enoki's static, multi-seed backward). Leaf gradients
    accumulate in ``.grad`` across calls until :func:`clear_grads`. The graph is freed unless
    ``retain_graph`` (or ``create_graph``, which also records the derivative computation so
    that the resulting ``.grad`` arrays can be differentiated again).
    """
    outs = _as_list(outputs)
    for o in outs:
        if not isinstance(o, Array):
            raise TypeError(f"backward: expected an Array output, got {type(o).__name__}")
    if seed is None:
        seeds = [None] * len(outs)
    elif isinstance(outputs, (list, tuple)):
        seeds = _as_list(seed)
    else:
        seeds = [seed]
    if len(seeds) != len(outs):
        raise ValueError(f"backward: {len(outs)} outputs but {len(seeds)} seeds")
    seeds = [_check_seed(o, s) for o, s in zip(outs, seeds)]
    if not any(o.requires_grad for o in outs):
        raise ValueError("backward: the output does not depend on any array that requires grad")
    _backprop(outs, seeds, create_graph=create_graph,
              retain_graph=retain_graph or create_graph)


def _push_tangents(outputs, seeds: dict, nb: int = 0, create_graph: bool = False,
                   store: bool = False):
    """Forward sweep from seeded arrays (dict id -> tangent) to ``outputs``."""
    order = _toposort(outputs)
    tan = dict(seeds)
    fused = []
    with _grad_mode(create_graph), np.errstate(divide="ignore", invalid="ignore"), \
            _lazy.no_elimination():
        for node in order:
            if node._prim is None or id(node) in seeds:
                continue
            ts = [tan.get(id(a)) if isinstance(a, Array) else None for a in node._args]
            if all(t is None for t in ts):
                continue
            if create_graph:
                args, out = node._args, node
            elif on_device(node):
                # device data: tangent arithmetic recorded on the (maybe pending) primal values
                # and fused into CUDA kernels, evaluated together after the sweep
                args = tuple(Array._view(a) if isinstance(a, Array) else a for a in node._args)
                out = Array._view(node)
                ts = [t if t is None or isinstance(t, Array) else Array(t) for t in ts]
                fused.append(node)
            else:
                args = tuple(a.value if isinstance(a, Array) else a for a in node._args)
                out = node.value
                ts = [t.value if isinstance(t, Array) else t for t in ts]
            t = R.apply_jvp(node._prim, ts, args, out, nb, node._params)
            tan[id(node)] = t
    if fused:  # the values of the device sweep's tangents (one evaluation for all)
        for node in fused:
            t = tan[id(node)]
            tan[id(node)] = t.value if isinstance(t, Array) else t
    if store:
        for node in order:
            if id(node) in tan and id(node) not in seeds:
                node.tangent = tan[id(node)]
    return [tan.get(id(o)) for o in outputs]


def forward(inputs, seeds=None, create_graph: bool = False):
    """Enoki-style forward mode: push tangents from ``inputs`` to every array depending on them.

    Sets ``.tangent`` on every reached array (a slot separate from ``.grad``). A missing seed is
    all ones.
    """
    ins = _as_list(inputs)
    seeds = [None] * len(ins) if seeds is None else _as_list(seeds)
    seed_map = {}
    for x, s in zip(ins, seeds):
        if not (isinstance(x, Array) and x.requires_grad):
            raise ValueError("forward: seeded arrays must require grad")
        seed_map[id(x)] = _check_seed(x, s, "tangent")
        x.tangent = seed_map[id(x)]
    live = [n for n in _TAPE.live() if not n._freed]
    _push_tangents(live, seed_map, 0, create_graph, store=True)


def clear_grads(*arrays):
    for a in arrays:
        a.grad = None
        a.tangent = None


def detach(x):
    """The primal value as a constant Array (no graph)."""
    return Array(x.value) if isinstance(x, Array) else Array(x)


def label(x: Array, name: str) -> Array:
    """Name an array (used in error messages and diagnostics)."""
    x.name = name
    return x
