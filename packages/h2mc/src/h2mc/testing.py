"""Derivative checks for h2mc path spaces (used by its tests; public so users can check their
own scenes): states with a path of a technique, the smooth piece a path lies on, and central
differences of log f* compared with the compiled derivatives (AE-7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import edge_rt
from edge_rt import scenes

from ._pathspace import _VERTEX, NEE

_KS = _VERTEX.index("ksr")  # the first vertex's specular red among kernel parameters


def glossy_box():
    """The Cornell box with a glossy tall box (Phong exponent 98) and a smooth-shaded glossy
    sphere (interpolated vertex normals) instead of the short box."""
    sc = scenes.cornell_box((16, 12))
    meshes = [m for m in sc.meshes if m.name != "short_box"]
    tall = next(m for m in meshes if m.name == "tall_box")
    tall.material = edge_rt.Material(diffuse=(0.3, 0.3, 0.3), specular=(0.6, 0.6, 0.6),
                                     roughness=(0.02,))
    meshes.append(scenes.uv_sphere((0.4, -0.65, 0.3), 0.35, rings=8, segments=16,
                                   material=edge_rt.Material(diffuse=(0.2, 0.4, 0.6),
                                                             specular=(0.4, 0.4, 0.4),
                                                             roughness=(0.1,))))
    return edge_rt.Scene(sc.camera, meshes)


def glass_box():
    """:func:`glossy_box` with its sphere made rough glass (edge_rt dielectric, eta 1.5,
    roughness 0.09: GGX alpha 0.3, smooth-shaded)."""
    sc = glossy_box()
    sc.meshes[-1].material = edge_rt.Material(roughness=(0.09,), eta=1.5)
    return sc


def valid_states(ps, length, technique, rng, n):
    """``n`` states with a path of technique ``(length, technique)``, those whose first
    vertex is glossy first (a third of them take the specular lobe there)."""
    u = rng.random((max(1024, (16 if technique == NEE else 256) * n), ps.dim))
    lanes, params = ps.trace(u).structure[length, technique]
    glossy = params[_KS] > 0
    order = np.concatenate([lanes[glossy], lanes[~glossy]])
    return u[order[:n]]


def same_piece(ps, u, length, technique=None):
    """``same(p, up, pp)``: lanes whose path of ``(length, technique)`` keeps its structure
    and every branch decision of its expression between states ``u`` (paths ``p``) and
    ``up``."""
    base = {}

    def same(p, up, pp):
        if "b" not in base:
            base["b"] = ps.branches(u, length, technique, p)
        return (p.same_structure(pp, length, technique)
                & (ps.branches(up, length, technique, pp) == base["b"]).all(1))
    return same


def central_differences(ps, u, derivatives, value, same, dims, h):
    """Central differences of ``log value(paths)`` (gradient) and of the exact gradient
    (Hessian) along ``dims``, Richardson-extrapolated from steps ``2h`` and ``h`` (error
    O(h^4): near the light or at grazing glossy angles single central differences at h = 1e-6
    were measured to err by up to 6e-3, scaling as h^2, i.e. truncation); ``ok`` drops lanes
    whose structure or branches change within +-2h. ``h``: a step per lane."""
    p = ps.trace(u)
    ok = np.ones(len(u), bool)
    n = len(dims)
    est = []
    for step in (2 * h, h):
        gfd, Hfd = np.zeros((len(u), n)), np.zeros((len(u), n, n))
        for a, j in enumerate(dims):
            vals, grads = [], []
            for s in (1.0, -1.0):
                up = u.copy()
                up[:, j] += s * step
                pp = ps.trace(up)
                ok &= same(p, up, pp)
                with np.errstate(divide="ignore"):
                    vals.append(np.log(value(pp)))
                grads.append(derivatives(up, pp)[1])
            with np.errstate(invalid="ignore"):
                gfd[:, a] = (vals[0] - vals[1]) / (2 * step)
            Hfd[:, :, a] = (grads[0] - grads[1]) / (2 * step)[:, None]
        est.append((gfd, Hfd))
    (g2, H2), (g1, H1) = est
    with np.errstate(invalid="ignore"):
        return (4 * g1 - g2) / 3, (4 * H1 - H2) / 3, ok


def fd_steps(H):
    """1e-6 (PRACTICES' default for samples in [0, 1]), shrunk on lanes whose curvature
    |H| exceeds 1e4 so that h^2 |H| stays <= 1e-8: the features of such paths (the light seen
    from right next to it, a sharp glossy lobe) are ~1/sqrt(|H|) wide."""
    return 1e-6 / np.sqrt(np.maximum(1.0, np.abs(H).max(axis=(1, 2)) / 1e4))


def relative_errors(g, H, gfd, Hfd, ok):
    g_err = np.abs(g - gfd)[ok].max(1) / np.abs(g[ok]).max(1)
    H_err = np.abs(H - Hfd)[ok].max((1, 2)) / np.abs(H[ok]).max((1, 2))
    return g_err.max(), H_err.max()

class InCoordinates:
    """``ps`` tracing every lane in the modified coordinates of technique index ``t`` (for
    ``central_differences``, which traces through ``trace(u)``)."""

    def __init__(self, ps, t):
        self.ps, self.t = ps, t

    def trace(self, w):
        return self.ps.trace(w, coords=np.full(len(w), self.t))

    def branches(self, w, length, technique, paths):
        return self.ps.branches(w, length, technique, paths)


def modified_states(ps, length, technique, rng, n):
    """``n`` states with a path of ``(length, technique)`` in its modified coordinates."""
    t = ps.techniques.index((length, technique))
    u = valid_states(ps, length, technique, rng, n)
    return ps.to_modified(u, ps.trace(u), np.full(len(u), t), rng), t


@dataclass
class DerivativeCheck:
    """:func:`check_technique_derivatives`' result: the traced ``paths``, the compiled
    ``logf``, ``grad`` and ``hess``, the lanes ``ok`` that stay on one smooth piece (and have a
    path), and the largest relative errors over them."""

    paths: object
    logf: np.ndarray
    grad: np.ndarray
    hess: np.ndarray
    ok: np.ndarray
    grad_error: float
    hess_error: float


def check_technique_derivatives(ps, u, length, technique, modified=False):
    """The compiled value, gradient and Hessian of ``log f*`` of technique ``(length,
    technique)`` on PSS states ``u``, against :func:`central_differences` with
    :func:`fd_steps`, relative to each lane's largest entry (:func:`relative_errors`).
    ``modified``: ``u`` is in the technique's modified coordinates (:func:`modified_states`),
    and ``log f*_w`` is compared with differences of the traced ``f*_w``."""
    t = ps.techniques.index((length, technique))
    view = InCoordinates(ps, t) if modified else ps
    p = view.trace(u)
    lf, g, H = ps.log_f_derivatives(u, length, technique, paths=p)
    gfd, Hfd, ok = central_differences(
        view, u, lambda v, pp: ps.log_f_derivatives(v, length, technique, paths=pp),
        (lambda pp: pp.scores_w[:, t]) if modified else (
            lambda pp: pp.f_star_of(length, technique)),
        same_piece(view, u, length, technique), ps.dims(length, technique), fd_steps(H))
    ok &= np.isfinite(lf)
    g_err, H_err = relative_errors(g, H, gfd, Hfd, ok) if ok.any() else (np.inf, np.inf)
    return DerivativeCheck(p, lf, g, H, ok, g_err, H_err)
