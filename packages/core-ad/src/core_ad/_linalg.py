"""Batched small symmetric eigen-decomposition, compiled and differentiable.

``eigh(H)`` on ``(B, n, n)`` returns ``(lam (B, n) ascending, E (B, n, n))`` with the
eigenvectors as columns, of the symmetric part ``(H + H^T) / 2`` (so every perturbation of
``H`` has a defined derivative, as in JAX's ``eigh(symmetrize_input=True)``).

* numpy input, ``n <= 16``: the compiled cyclic-Jacobi kernel (:mod:`core_ad._codegen.eigh`);
  larger ``n`` falls back on ``numpy.linalg.eigh``; CuPy input: the CUDA kernel;
* traced :class:`core_ad.Array` input: one graph node whose derivative rules are the
  classical perturbation formulas, written with rule-table ops so they nest (Hessians,
  ``create_graph``). With ``M = E^T sym(dH) E`` and ``F_ij = 1 / (lam_j - lam_i)`` (0 on the
  diagonal and between equal eigenvalues, where the eigenvectors are not unique):
  ``dlam = diag(M)``, ``dE = E (F o M)``; the reverse rule is the transpose,
  ``Hbar = sym(E (diag(lam_bar) + F o (E^T E_bar)) E^T)``.
"""

from __future__ import annotations

import numpy as np

from . import _rules as R
from ._codegen import eigh as _kernels
from ._custom import custom_call
from ._device import on_device, unsupported
from ._lazy import _user_frame
from ._tracing import Array


def _numeric_eigh(H):
    mod = type(H).__module__
    if mod.startswith("cupy"):
        return _kernels.eigh_cuda(H)
    H = np.asarray(H)
    if H.ndim == 3 and H.shape[1] == H.shape[2] and H.shape[1] > _kernels.MAX_N:
        return np.linalg.eigh(0.5 * (H + np.swapaxes(H, 1, 2)))
    return _kernels.eigh_cpu(H)


def _gaps(lam):
    """``F_ij = 1 / (lam_j - lam_i)``, 0 where ``lam_j == lam_i`` (the diagonal included)."""
    d = R.sub(R.expand_dims(lam, -2), R.expand_dims(lam, -1))
    nz = R.ne(d, 0.0)
    return R.where(nz, R.div(1.0, R.where(nz, d, 1.0)), 0.0)


def _sym(M):
    return R.mul(R.add(M, R.swapaxes(M, -1, -2)), 0.5)


def _eye_like(lam):
    n = R.shape_of(lam)[-1]
    return np.eye(n, dtype=R.dtype_of(lam))


def eigh(H):
    """Eigenvalues (ascending) and eigenvectors (columns) of each lane's ``(H + H^T) / 2``.

    ``H``: ``(B, n, n)`` float32/float64 (numpy, CuPy or a traced :class:`core_ad.Array`).
    Raises ValueError for other shapes, TypeError for other dtypes.
    """
    if not isinstance(H, Array):
        return _numeric_eigh(H)
    if on_device(H):
        raise unsupported("eigh of a traced Array", _user_frame())
    lam0, E0 = _numeric_eigh(H.value)

    def parts(node_args):
        if any(isinstance(a, Array) for a in node_args):  # a recorded sweep: differentiable
            return eigh(node_args[0])
        return lam0, E0

    def vjp_fn(cts, node_args):
        lam, E = parts(node_args)
        lam_bar, E_bar = cts
        I = _eye_like(lam)
        inner = R.mul(_gaps(lam), R.matmul(R.swapaxes(E, -1, -2), E_bar))
        inner = R.add(inner, R.mul(R.expand_dims(lam_bar, -1), I))
        Hbar = R.matmul(R.matmul(E, inner), R.swapaxes(E, -1, -2))
        return (_sym(Hbar),)

    def jvp_fn(tangents, node_args, nb):
        (dH,) = tangents
        if dH is None:
            return [None, None]
        lam, E = parts(node_args)
        M = R.matmul(R.matmul(R.swapaxes(E, -1, -2), _sym(dH)), E)
        dlam = R.sum(R.mul(M, _eye_like(lam)), axis=-1)
        dE = R.matmul(E, R.mul(_gaps(lam), M))
        return [dlam, dE]

    lam, E = custom_call("eigh", [lam0, E0], [H], vjp_fn, jvp_fn)
    return lam, E
