"""Finite-difference checks of forward-mode, reverse-mode and higher derivatives."""

from __future__ import annotations

import numpy as np

from ._functional import jvp, vjp
from ._pytree import flatten, unflatten


def _flat_fn(f, args):
    """Express ``f`` as a map from one flat float vector to one flat float vector."""
    leaves, td = flatten(tuple(args))
    arrays = [np.asarray(x, dtype=np.float64) for x in leaves]
    for i, a in enumerate(arrays):
        if np.asarray(leaves[i]).dtype.kind not in "fc":
            raise TypeError(f"check_grads: argument leaf {i} is not floating point")
    sizes = [a.size for a in arrays]
    shapes = [a.shape for a in arrays]
    bounds = np.cumsum([0] + sizes)

    def split(vec):
        return unflatten(td, [vec[a:b].reshape(s) for a, b, s in
                              zip(bounds[:-1], bounds[1:], shapes)])

    x0 = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    return x0, split


def _ravel_out(out):
    leaves, _ = flatten(out)
    return np.concatenate([np.asarray(o, dtype=np.float64).ravel() for o in leaves])


def _fd_jacobian(fun, x0, eps):
    cols = []
    for i in range(x0.size):
        h = eps * max(1.0, abs(x0[i]))
        xp, xm = x0.copy(), x0.copy()
        xp[i] += h
        xm[i] -= h
        cols.append((fun(xp) - fun(xm)) / (2 * h))
    return np.stack(cols, axis=1)


def _compare(name, J_ad, J_fd, rtol, atol):
    scale = max(1.0, float(np.max(np.abs(J_fd))) if J_fd.size else 1.0)
    err = np.abs(J_ad - J_fd)
    bad = err > atol * scale + rtol * np.abs(J_fd)
    if bad.any() or not np.all(np.isfinite(J_ad)):
        if not np.all(np.isfinite(J_ad)):
            bad = ~np.isfinite(J_ad)
        i, j = np.unravel_index(int(np.argmax(np.where(bad, err, -1))), J_ad.shape)
        raise AssertionError(
            f"check_grads: {name} d out[{i}] / d in[{j}] = {J_ad[i, j]!r} but central finite"
            f" differences give {J_fd[i, j]!r} (abs err {err[i, j]:.3e}; allowed"
            f" {atol * scale + rtol * abs(J_fd[i, j]):.3e}); {int(bad.sum())} of {bad.size}"
            " entries off"
        )


def check_grads(f, args, order: int = 2, modes=("fwd", "rev"), *, eps: float = 6e-6,
                rtol: float = 1e-5, atol: float = 1e-6, seed: int = 0):
    """Compare derivatives of ``f(*args)`` with central finite differences, in float64.

    For each mode the full Jacobian is built by AD (one JVP per input entry for ``"fwd"``, one
    VJP per output entry for ``"rev"``) and compared entry by entry with central differences
    using the step ``eps * max(1, |x_i|)`` (``eps`` ~ machine-epsilon^(1/3), which balances
    truncation and rounding). ``order=2`` then checks the derivative of the first-order map
    (``x -> J(x) v`` for forward mode and ``x -> J(x)^T w`` for reverse mode, with random
    ``v``/``w``) the same way, so reverse-over-reverse, forward-over-forward and the mixed
    compositions are all exercised; higher orders recurse. A mismatch raises AssertionError
    naming the entry, the two values and the error. Entries pass when
    ``|ad - fd| <= atol * max(1, max|fd|) + rtol * |fd|``.
    """
    if order < 1:
        raise ValueError(f"check_grads: order must be >= 1, got {order}")
    bad_modes = set(modes) - {"fwd", "rev"}
    if bad_modes:
        raise ValueError(f"check_grads: unknown modes {sorted(bad_modes)}; use 'fwd', 'rev'")
    args = tuple(args)
    x0, split = _flat_fn(f, args)

    def fun(x):
        return _ravel_out(f(*split(x)))

    y0 = fun(x0)
    J_fd = _fd_jacobian(fun, x0, eps)
    n, m = x0.size, y0.size
    rng = np.random.default_rng(seed)
    for mode in modes:
        if mode == "fwd":
            cols = []
            for i in range(n):
                e = np.zeros(n)
                e[i] = 1.0
                _, t = jvp(lambda *a: f(*a), split(x0), split(e))
                cols.append(_ravel_out(t))
            J_ad = np.stack(cols, axis=1) if cols else np.zeros((m, 0))
        else:
            out, pull = vjp(lambda *a: f(*a), *split(x0))
            leaves, td = flatten(out)
            sizes = [np.asarray(o).size for o in leaves]
            shapes = [np.shape(o) for o in leaves]
            rows = []
            for i in range(m):
                e = np.zeros(m)
                e[i] = 1.0
                b = np.cumsum([0] + sizes)
                ct = unflatten(td, [e[a:c].reshape(s) for a, c, s in
                                    zip(b[:-1], b[1:], shapes)])
                rows.append(_ravel_out(pull(ct)))
            J_ad = np.stack(rows, axis=0) if rows else np.zeros((0, n))
        _compare("forward-mode" if mode == "fwd" else "reverse-mode", J_ad, J_fd, rtol, atol)
    if order >= 2:
        for mode in modes:
            if mode == "fwd":
                v = split(rng.standard_normal(n))

                def first(*a, v=v):
                    return jvp(lambda *b: f(*b), a, v)[1]
            else:
                out_leaves, out_td = flatten(f(*split(x0)))
                w = unflatten(out_td, [rng.standard_normal(np.shape(o)) for o in out_leaves])

                def first(*a, w=w):
                    return vjp(lambda *b: f(*b), *a)[1](w)
            check_grads(first, split(x0), order - 1, modes, eps=eps, rtol=rtol, atol=atol,
                        seed=seed + 1)
