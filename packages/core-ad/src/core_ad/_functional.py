"""Functional transforms on plain numpy inputs and pytrees (JAX conventions).

Each transform wraps its differentiable inputs in fresh graph nodes, runs the function on
traced :class:`~core_ad.Array` values and reads derivatives off the tape. When an input is
itself traced by an enclosing transform, the wrapper is an identity node connected to it and
the derivative computation is recorded (``create_graph``), so transforms nest: ``grad(grad(f))``,
``jacobian(grad(f))``, ``hessian`` of a function that calls ``grad`` ...

Lazy vertex elimination is off while a transform traces its function (a simplified graph is
first-order only, and an outer transform may differentiate the recorded sweep again), except
in ``grad`` / ``value_and_grad`` at the outermost level: there it folds the intermediates that
only the graph holds into edge weights computed with the primal, so they are never stored (a
function that turns out to read arrays traced outside is traced again without it).
"""

from __future__ import annotations

import sys

import numpy as np

from . import _lazy
from . import _rules as R
from ._device import is_device_array, on_device, unsupported
from ._pytree import flatten, unflatten
from ._tracing import Array, _backprop, _check_seed, _grad_mode, _push_tangents, _toposort


def _is_traced(x) -> bool:
    return isinstance(x, Array) and x.requires_grad


def _float_input(x, where: str):
    """``x``'s value (an Array's is not evaluated: it may stay pending)."""
    v = x if isinstance(x, Array) or is_device_array(x) else np.asarray(x)
    if v.dtype.kind not in "fc":
        raise TypeError(
            f"{where}: cannot differentiate with respect to an array of dtype {v.dtype};"
            " only floating-point inputs are differentiable (cast it, or move it out of argnums)"
        )
    return v


def _wrap(x, where: str):
    """A differentiable input node for one level of transformation."""
    if _is_traced(x):
        _float_input(x, where)
        return R.identity(x)
    v = _float_input(x, where)
    if isinstance(v, Array):  # an untracked Array: a leaf sharing its (maybe pending) value
        leaf = _shared_view(v)
        leaf.requires_grad = True
        return leaf
    return Array(v, requires_grad=True)


def _shared_view(x: Array) -> Array:
    """An untracked Array sharing ``x``'s value; a pending one is computed with the other
    arrays of its scope when any of them is needed."""
    view = Array._view(x)
    if view.is_pending:
        _lazy.track(view, view._value.scope)
    return view


def _argnums(argnums, nargs, where):
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not -nargs <= a < nargs:
            raise ValueError(f"{where}: argnums {a} out of range for {nargs} positional arguments")
    return tuple(a % nargs for a in nums), isinstance(argnums, int)


def _prepare(args, argnums, where):
    """Replace the leaves of the selected arguments by input nodes."""
    nums, single = _argnums(argnums, len(args), where)
    args = list(args)
    inputs, defs = [], []
    with _grad_mode(True):
        for a in nums:
            leaves, td = flatten(args[a])
            wrapped = [_wrap(x, where) for x in leaves]
            inputs.append(wrapped)
            defs.append(td)
            args[a] = unflatten(td, wrapped)
    nested = any(not x.is_leaf for group in inputs for x in group)
    return args, nums, single, inputs, defs, nested


def _reaches_outer(outs, inputs) -> bool:
    """Whether ``outs`` depend on traced arrays other than ``inputs`` (an enclosing level).

    Then the derivative computation must be recorded, or the enclosing transform would
    silently lose the dependence.
    """
    stop = frozenset(id(x) for x in inputs)
    return any(
        n.is_leaf and id(n) not in stop for n in _toposort([o for o in outs if _is_traced(o)], stop)
    )


def _finish(x, nested, as_arrays=False):
    """Numpy result at the outermost level, traced Array inside an enclosing transform;
    ``as_arrays``: an untracked Array holding the (possibly still pending) value."""
    if nested:
        return x
    if isinstance(x, Array):
        return _shared_view(x) if as_arrays else x.value
    return x


def _lazy_results(args, nums) -> bool:
    """Whether a transform returns lazy Arrays: in lazy mode, when every differentiated
    input is an Array (the caller chose traced arrays), so that a loop of gradient steps
    (``x = x - lr * grad(f)(x)``) stays pending and evaluates as one fused kernel (Enoki's
    behaviour, spec 2.3). With numpy inputs the results are numpy, as in eager mode."""
    if not _lazy.is_lazy():
        return False
    leaves = [leaf for a in nums for leaf in flatten(args[a])[0]]
    return bool(leaves) and all(isinstance(leaf, Array) for leaf in leaves)


def _cotangent(found: dict, node: Array):
    """The cotangent the sweep found for ``node``; zeros (allocated only then) when none."""
    ct = found.get(id(node))
    return _zeros_like(node) if ct is None else ct


def _untraced_value(v):
    """The value of an untraced tangent or vector: a CuPy array as it is, else numpy."""
    v = v.value if isinstance(v, Array) else v
    return v if is_device_array(v) else np.asarray(v)


def _zeros_like(x: Array):
    """Zeros of ``x``'s shape and dtype, on ``x``'s device."""
    xp = sys.modules["cupy"] if on_device(x) else np
    return xp.zeros(x.shape, dtype=x.dtype)


def value_and_grad(f, argnums=0, has_aux: bool = False):
    """``f(*args) -> (value, gradient)`` for a scalar-valued ``f``; see :func:`grad`."""

    def trace(args, eliminate):
        with _grad_mode(True), _lazy.transform_trace(eliminate):
            return f(*args)

    def vg(*args):
        as_arrays = _lazy_results(args, _argnums(argnums, len(args), "grad")[0])
        prepared = _prepare(args, argnums, "grad")
        eliminated = _lazy.stats()["eliminated"]
        out = trace(prepared[0], eliminate=not prepared[-1])
        if _lazy.stats()["eliminated"] != eliminated and _reaches_outer(
            [o for o in flatten(out)[0] if isinstance(o, Array)],
            [x for group in prepared[3] for x in group],
        ):
            # the sweep will be recorded for an enclosing level: trace again, unsimplified
            out = None
            prepared = _prepare(args, argnums, "grad")
            out = trace(prepared[0], eliminate=False)
        args, nums, single, inputs, defs, nested = prepared
        aux = None
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError("grad(has_aux=True): f must return a pair (value, aux)")
            out, aux = out
        if not isinstance(out, Array):
            out = Array(out)
        if out.shape != ():
            raise TypeError(
                f"grad requires a scalar output, got shape {out.shape}; use vjp or jacobian"
            )
        flat_inputs = [x for group in inputs for x in group]
        nested = nested or _reaches_outer([out], flat_inputs)
        found = {}
        if out.requires_grad:
            found = _backprop(
                [out],
                [_check_seed(out, None)],
                targets=flat_inputs,
                create_graph=nested,
                retain_graph=nested,
                accumulate=False,
                keep_pending=as_arrays,
            )
        grads = []
        for group, td in zip(inputs, defs):
            leaves = [_finish(_cotangent(found, x), nested, as_arrays) for x in group]
            grads.append(unflatten(td, leaves))
        g = grads[0] if single else tuple(grads)
        value = _finish(out, nested, as_arrays)
        return ((value, aux), g) if has_aux else (value, g)

    return vg


def grad(f, argnums=0, has_aux: bool = False):
    """Gradient of a scalar-valued ``f`` with respect to ``args[argnums]`` (pytrees allowed)."""
    vg = value_and_grad(f, argnums, has_aux)

    def g_plain(*args):
        out = vg(*args)
        if has_aux:
            (_, aux), dx = out
            return dx, aux
        return out[1]

    return g_plain


def vjp(f, *primals):
    """``(out, pullback)``: ``pullback(cotangent)`` returns one cotangent per primal.

    The pullback may be called several times (the graph is retained while it lives).
    """
    args, nums, single, inputs, defs, nested = _prepare(primals, tuple(range(len(primals))),
                                                          "vjp")
    with _grad_mode(True), _lazy.no_elimination():
        out = f(*args)
    outs, out_def = flatten(out)
    outs = [o if isinstance(o, Array) else Array(o) for o in outs]
    flat_inputs = [x for group in inputs for x in group]
    nested = nested or _reaches_outer(outs, flat_inputs)

    def pullback(cotangent):
        cts, ct_def = flatten(cotangent)
        if ct_def != out_def:
            raise ValueError(
                f"vjp: cotangent structure {ct_def} does not match the output structure {out_def}"
            )
        seeds = []
        for i, (o, c) in enumerate(zip(outs, cts)):
            cv = c if _is_traced(c) else _untraced_value(c)
            if tuple(cv.shape) != o.shape:
                raise ValueError(
                    f"vjp: cotangent {i} has shape {tuple(cv.shape)} but output {i} has shape"
                    f" {o.shape}"
                )
            if not _is_traced(cv) and cv.dtype.kind not in "fc":
                raise TypeError(f"vjp: cotangent {i} must be floating point, got {cv.dtype}")
            seeds.append(cv if _is_traced(cv) else cv.astype(o.dtype, copy=False))
        create = nested or any(_is_traced(s) for s in seeds)
        found = _backprop(
            outs, seeds, targets=flat_inputs, create_graph=create, retain_graph=True,
            accumulate=False,
        )
        res = []
        for group, td in zip(inputs, defs):
            res.append(
                unflatten(td, [_finish(_cotangent(found, x), create) for x in group])
            )
        return tuple(res)

    return unflatten(out_def, [_finish(o, nested) for o in outs]), pullback


def jvp(f, primals, tangents):
    """``(f(*primals), J @ tangents)`` by forward mode on the tape."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    args, nums, single, inputs, defs, nested = _prepare(primals, tuple(range(len(primals))),
                                                          "jvp")
    seeds = {}
    for i, (group, td, t) in enumerate(zip(inputs, defs, tangents)):
        tl, ttd = flatten(t)
        if ttd != td:
            raise ValueError(f"jvp: tangent {i} structure {ttd} does not match primal {td}")
        for x, tv in zip(group, tl):
            tv = tv if _is_traced(tv) else _untraced_value(tv)
            if tuple(tv.shape) != x.shape:
                raise ValueError(
                    f"jvp: tangent {i} has shape {tuple(tv.shape)} but primal {i} has shape"
                    f" {x.shape}"
                )
            seeds[id(x)] = tv if _is_traced(tv) else tv.astype(x.dtype, copy=False)
    with _grad_mode(True), _lazy.no_elimination():
        out = f(*args)
    outs, out_def = flatten(out)
    outs = [o if isinstance(o, Array) else Array(o) for o in outs]
    nested = nested or _reaches_outer(outs, [x for group in inputs for x in group])
    create = nested or any(_is_traced(s) for s in seeds.values())
    touts = _push_tangents(outs, seeds, 0, create_graph=create)
    touts = [
        _finish(t, create) if t is not None else _zeros_like(o)
        for o, t in zip(outs, touts)
    ]
    return (
        unflatten(out_def, [_finish(o, nested) for o in outs]),
        unflatten(out_def, touts),
    )


def _single_array_fn(f, x, where):
    """Call ``f`` on one differentiable array input; returns (input node, output, nested)."""
    if where != "hvp" and on_device(x):  # (hvp: one tangent, fused like the rest)
        raise unsupported(f"{where} (derivatives along a batch of directions)",
                          _lazy._user_frame())
    args, nums, single, inputs, defs, nested = _prepare((x,), 0, where)
    node = inputs[0][0]
    if len(inputs[0]) != 1:
        raise TypeError(f"{where}: expects a single array argument, not a pytree")
    with _grad_mode(True), _lazy.no_elimination():
        out = f(node)
    if not isinstance(out, Array):
        out = Array(out)
    return node, out, nested or _reaches_outer([out], [node])


def jacobian(f, mode: str = "auto"):
    """``jacobian(f)(x)`` of shape ``out.shape + x.shape``.

    ``mode`` is ``"fwd"`` (one vector forward pass with one direction per input entry),
    ``"rev"`` (one reverse pass per output entry) or ``"auto"`` (forward when the input has no
    more entries than the output).
    """
    if mode not in ("auto", "fwd", "rev"):
        raise ValueError(f"jacobian: mode must be 'auto', 'fwd' or 'rev', got {mode!r}")

    def jac(x):
        node, out, nested = _single_array_fn(f, x, "jacobian")
        n, m = node.size, out.size
        use_fwd = mode == "fwd" or (mode == "auto" and n <= m)
        if not out.requires_grad:
            return _finish(Array(np.zeros(out.shape + node.shape, out.dtype)), nested)
        if use_fwd:
            seeds = np.eye(n, dtype=node.dtype).reshape((n,) + node.shape)
            (t,) = _push_tangents([out], {id(node): seeds}, 1, create_graph=nested)
            if t is None:
                return _finish(np.zeros(out.shape + node.shape, out.dtype), nested)
            J = R.transpose(R.reshape(t, (n, m)))
        else:
            rows = []
            for i in range(m):
                seed = np.zeros(m, out.dtype)
                seed[i] = 1
                found = _backprop([out], [seed.reshape(out.shape)], targets=[node],
                                  create_graph=nested, retain_graph=True, accumulate=False)
                g = found.get(id(node))
                rows.append(R.reshape(g, (n,)) if g is not None else np.zeros(n, out.dtype))
            J = R.stack(rows) if nested else np.stack([np.asarray(r) for r in rows])
        return _finish(R.reshape(J, out.shape + node.shape), nested)

    return jac


def _symmetrize(H):
    return 0.5 * (H + np.swapaxes(H, -1, -2))


def hessian(f):
    """``hessian(f)(x)`` of a scalar ``f``, shape ``x.shape + x.shape``, exactly symmetric.

    Forward-over-reverse: the gradient is recorded (``create_graph``) and one vector forward
    pass with ``x.size`` directions differentiates it.
    """

    def hess(x):
        node, out, nested = _single_array_fn(f, x, "hessian")
        if out.shape != ():
            raise TypeError(f"hessian requires a scalar output, got shape {out.shape}")
        n = node.size
        g = _gradient_node(out, node)
        zeros = np.zeros(node.shape + node.shape, node.dtype)
        if g is None:
            return _finish(zeros, nested)
        seeds = np.eye(n, dtype=node.dtype).reshape((n,) + node.shape)
        (t,) = _push_tangents([g], {id(node): seeds}, 1, create_graph=nested)
        if t is None:
            return _finish(zeros, nested)
        H = R.reshape(t, (n, n))
        H = R.mul(R.add(H, R.transpose(H)), 0.5)
        return _finish(R.reshape(H, node.shape + node.shape), nested)

    return hess


def _gradient_node(out: Array, node: Array):
    """The gradient of ``out`` at ``node`` as a recorded (differentiable) array, or None."""
    if not out.requires_grad:
        return None
    found = _backprop([out], [_check_seed(out, None)], targets=[node], create_graph=True,
                      retain_graph=True, accumulate=False)
    g = found.get(id(node))
    if g is not None and not isinstance(g, Array):
        g = Array(g)
    return g


def hvp(f, x, v):
    """Hessian-vector product ``H(x) @ v`` of a scalar ``f`` (forward-over-reverse)."""
    node, out, nested = _single_array_fn(f, x, "hvp")
    if out.shape != ():
        raise TypeError(f"hvp requires a scalar output, got shape {out.shape}")
    vv = v if _is_traced(v) else _untraced_value(v)
    if tuple(vv.shape) != node.shape:
        raise ValueError(f"hvp: v has shape {tuple(vv.shape)} but x has shape {node.shape}")
    g = _gradient_node(out, node)
    if g is None:
        return _finish(_zeros_like(node), nested)
    seed = vv if _is_traced(vv) else vv.astype(node.dtype, copy=False)
    (t,) = _push_tangents([g], {id(node): seed}, 0, create_graph=nested or _is_traced(vv))
    if t is None:
        return _finish(_zeros_like(node), nested)
    return _finish(t, nested or _is_traced(vv))


class LaneMixingError(ValueError):
    """``batch_hessian`` was given a function whose output lanes depend on other lanes."""


def batch_hessian(f, x, *, compiled: bool = False, seed: int = 0):
    """Per-lane gradients ``(B, n)`` and exactly symmetric Hessians ``(B, n, n)``.

    ``f`` maps ``x`` of shape ``(B, n)`` lane-wise to ``(B,)``: lane ``b`` of the output may
    depend only on row ``b`` of ``x``. The gradient of ``sum(f(x))`` is recorded and differentiated
    by one vector forward pass with ``n`` directions, so the cost is a small multiple of ``n``
    evaluations of ``f`` on all lanes at once. A randomized lane-support test (one extra forward
    pass with a tangent on a random half of the lanes) rejects functions that mix lanes with a
    :class:`LaneMixingError`.

    ``compiled=True`` instead traces ``f`` once symbolically on its columns (``x[:, j]``) and
    evaluates a compiled kernel of the gradient and Hessian (see
    :func:`core_ad.compiled_batch_hessian`; like ``jax.jit``, values ``f`` closes over are
    baked in on the first call for a given ``(f, n, dtype)``).
    """
    xv = _float_input(x, "batch_hessian")
    if on_device(xv):
        raise unsupported("batch_hessian", _lazy._user_frame())
    xv = xv.value if isinstance(xv, Array) else xv
    if xv.ndim != 2:
        raise ValueError(f"batch_hessian: x must have shape (B, n), got {xv.shape}")
    if compiled:
        from ._compiled_hessian import cached_batch_hessian

        return cached_batch_hessian(f, xv.shape[1], xv.dtype)(xv)
    B, n = xv.shape
    # One leaf per column: x[:, j] inside f is then column j itself (a peephole in the tracer),
    # so derivatives stay (B,)-sized per column instead of dense (B, n) scatters.
    cols = [Array(np.ascontiguousarray(xv[:, j]), requires_grad=True) for j in range(n)]
    with _grad_mode(True), _lazy.no_elimination():
        node = R.stack(cols, axis=1)
        out = f(node)
    if not isinstance(out, Array):
        out = Array(out)
    if out.shape != (B,):
        raise ValueError(f"batch_hessian: f must map shape {(B, n)} to {(B,)}, got {out.shape}")
    zeros_g, zeros_h = np.zeros((B, n), xv.dtype), np.zeros((B, n, n), xv.dtype)
    if not out.requires_grad:
        return zeros_g, zeros_h

    rng = np.random.default_rng(seed)
    lanes = rng.random(B) < 0.5
    probe = rng.standard_normal((B, n)).astype(xv.dtype) * lanes[:, None]
    (t_probe,) = _push_tangents([out], {id(c): probe[:, j] for j, c in enumerate(cols)}, 0)
    if t_probe is not None:
        leaked = np.flatnonzero((np.asarray(t_probe) != 0) & ~lanes)
        if leaked.size:
            raise LaneMixingError(
                f"batch_hessian: output lane {int(leaked[0])} depends on other lanes of x;"
                " f must map each row of x to its own output lane (no reductions across lanes)"
            )

    found = _backprop([out], [np.ones(B, xv.dtype)], targets=cols, create_graph=True,
                      retain_graph=True, accumulate=False)
    grads = [found.get(id(c)) for c in cols]
    live = [i for i, g in enumerate(grads) if isinstance(g, Array) and g.requires_grad]
    for i, g in enumerate(grads):
        if g is not None:
            zeros_g[:, i] = np.asarray(g.value if isinstance(g, Array) else g)
    if not live:
        return zeros_g, zeros_h
    seeds = {}
    for j, c in enumerate(cols):
        t = np.zeros((n, B), xv.dtype)
        t[j] = 1
        seeds[id(c)] = t
    tangents = _push_tangents([grads[i] for i in live], seeds, 1)
    H = zeros_h
    for i, t in zip(live, tangents):
        if t is not None:
            H[:, i, :] = np.asarray(t).T  # t[j, b] = d g_i[b] / d x[b, j]
    return zeros_g, _symmetrize(H)
