"""Lambertian + Blinn-Phong with Schlick Fresnel (spec section 11.2), evaluated in core_ad
compiled kernels and exposed to torch as an autograd Function.

Conventions: ``wi`` points from the surface to the viewer (the reversed incoming ray), ``wo``
from the surface to the light; both unit vectors in world space. ``evaluate`` returns
BRDF * cos(n, wo) per RGB channel. ``sample`` / ``pdf`` are the sampling routines of the path
tracer (cosine-weighted diffuse lobe, Blinn-Phong half-vector lobe), in torch on detached
values: the renderer treats sampled directions and pdfs as constants (unbiased, spec 5.3).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from core_ad import sym

_INPUTS = ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz", "ox", "oy", "oz",
           "kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")
# Inputs whose cotangent is needed (the geometric normal only gates grazing angles).
_DIFF_INPUTS = tuple(n for n in _INPUTS if n[0] != "g")


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _smith_g1(cos_t, alpha_sqrt):
    # Rational approximation of the Beckmann-Smith G1 (redner's bsdf.h): a = 1/(sqrt(r) tan).
    sin_t = sym.sqrt(sym.maximum(1.0 - cos_t * cos_t, 1e-12))
    a = cos_t / (alpha_sqrt * sin_t)
    g = (3.535 * a + 2.181 * a * a) / (1.0 + 2.276 * a + 2.577 * a * a)
    return sym.where(a >= 1.6, 1.0, g)


def bsdf_expressions(dtype: str):
    """The BRDF*cos expressions (r, g, b) over the scalar vars named in ``_INPUTS``."""
    v = {name: sym.var(name, dtype) for name in _INPUTS}
    n = (v["nx"], v["ny"], v["nz"])
    ng = (v["gx"], v["gy"], v["gz"])
    wi = (v["ix"], v["iy"], v["iz"])
    wo = (v["ox"], v["oy"], v["oz"])
    kd = (v["kdr"], v["kdg"], v["kdb"])
    ks = (v["ksr"], v["ksg"], v["ksb"])
    rough = sym.maximum(v["rough"], 1e-6)
    cos_i, cos_o = _dot(n, wi), _dot(n, wo)
    # redner's cut-offs: the viewer side by the geometric normal only, the light side by both.
    # Gating the viewer side by the shading normal too would add a jump that moves with the
    # normals and that no edge sampler accounts for (a bias in normal gradients).
    valid = sym.logical_and(
        sym.logical_and(_dot(ng, wi) > 0.0, _dot(ng, wo) > 1e-3), cos_o > 1e-3)
    hx, hy, hz = wi[0] + wo[0], wi[1] + wo[1], wi[2] + wo[2]
    hinv = sym.rsqrt(sym.maximum(hx * hx + hy * hy + hz * hz, 1e-20))
    h = (hx * hinv, hy * hinv, hz * hinv)
    cos_h = sym.maximum(_dot(h, n), 1e-12)
    exponent = sym.maximum(2.0 / rough - 2.0, 0.0)
    d_term = sym.exp(exponent * sym.log(cos_h)) * (exponent + 2.0) / (2.0 * math.pi)
    alpha_sqrt = sym.sqrt(rough)
    g_term = _smith_g1(sym.maximum(cos_i, 1e-6), alpha_sqrt) * _smith_g1(
        sym.maximum(cos_o, 1e-6), alpha_sqrt)
    schlick = (1.0 - sym.abs(_dot(h, wo))) ** 5
    # No specular lobe at all when Ks = 0 (as redner): Schlick's (1 - Ks)(1 - h.wo)^5 would
    # otherwise add a white grazing-angle highlight to purely diffuse materials.
    has_specular = (ks[0] + ks[1] + ks[2]) > 0.0
    spec_common = sym.where(has_specular,
                            d_term * g_term / (4.0 * sym.maximum(cos_i, 1e-6)), 0.0)
    out = []
    for c in range(3):
        fresnel = ks[c] + (1.0 - ks[c]) * schlick
        value = kd[c] * cos_o / math.pi + fresnel * spec_common
        out.append(sym.where(valid, value, 0.0))
    return v, out


_KERNELS: dict = {}


def _kernels(dtype: str):
    """(forward, vjp, jvp) compiled kernels for ``dtype`` ("float32" / "float64"), built
    once each: the value, the reverse-mode product with output cotangents, and the
    forward-mode product with input tangents (for derivative images)."""
    if dtype not in _KERNELS:
        v, out = bsdf_expressions(dtype)
        inputs = [v[n] for n in _INPUTS]
        diff_vars = [v[n] for n in _DIFF_INPUTS]
        cts = [sym.var(f"ct{c}", dtype) for c in range(3)]
        tangents = [sym.var(f"dt_{n}", dtype) for n in _DIFF_INPUTS]
        fwd = sym.compile(out, inputs)
        bwd = sym.compile(sym.vjp(out, diff_vars, cts), inputs + cts)
        tan = sym.compile(sym.jvp(out, diff_vars, tangents), inputs + tangents)
        _KERNELS[dtype] = (fwd, bwd, tan)
    return _KERNELS[dtype]


def _columns(tensors):
    cols = []
    for t in tensors:
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        cols.extend([np.ascontiguousarray(a[:, k]) for k in range(a.shape[1])])
    return cols


class _BsdfEval(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n, ng, wi, wo, kd, ks, rough):
        dtype = str(n.dtype).removeprefix("torch.")
        fwd = _kernels(dtype)[0]
        cols = _columns([n, ng, wi, wo, kd, ks, rough[:, None]])
        ctx.save_for_backward(n, ng, wi, wo, kd, ks, rough)
        ctx.save_for_forward(n, ng, wi, wo, kd, ks, rough)
        if len(cols[0]) == 0:
            return n.new_zeros((0, 3))
        return torch.from_numpy(np.stack(fwd(*cols), axis=1))

    @staticmethod
    def backward(ctx, grad_out):
        n, ng, wi, wo, kd, ks, rough = ctx.saved_tensors
        if n.shape[0] == 0:
            return (None,) * 7
        dtype = str(n.dtype).removeprefix("torch.")
        bwd = _kernels(dtype)[1]
        cols = _columns([n, ng, wi, wo, kd, ks, rough[:, None], grad_out.contiguous()])
        g = [torch.from_numpy(np.asarray(x)) for x in bwd(*cols)]
        g = [x.expand(n.shape[0]) if x.dim() == 0 else x for x in g]
        grads = [torch.stack(g[k:k + 3], dim=1) for k in (0, 3, 6, 9, 12)]
        return grads[0], None, grads[1], grads[2], grads[3], grads[4], g[15]


    @staticmethod
    def jvp(ctx, dn, dng, dwi, dwo, dkd, dks, drough):
        n, ng, wi, wo, kd, ks, rough = ctx.saved_tensors
        if n.shape[0] == 0:
            return n.new_zeros((0, 3))
        tan = _kernels(str(n.dtype).removeprefix("torch."))[2]

        def tangent(t, shape):
            return torch.zeros(shape, dtype=n.dtype) if t is None else t

        m = n.shape[0]
        ts = [tangent(dn, (m, 3)), tangent(dwi, (m, 3)), tangent(dwo, (m, 3)),
              tangent(dkd, (m, 3)), tangent(dks, (m, 3)), tangent(drough, (m,))[:, None]]
        cols = _columns([n, ng, wi, wo, kd, ks, rough[:, None], *ts])
        out = [np.broadcast_to(np.asarray(x), (m,)) for x in tan(*cols)]
        return torch.from_numpy(np.stack(out, axis=1).copy())


def evaluate(n, ng, wi, wo, kd, ks, rough):
    """BRDF * cos(n, wo), shape (N, 3). All arguments (N, 3) except ``rough`` (N,).

    ``n`` is the shading normal, ``ng`` the geometric normal (both already flipped toward the
    viewer for two-sided shading)."""
    return _BsdfEval.apply(n, ng, wi, wo, kd, ks, rough)


def _frame(n):
    # An orthonormal basis around n (Duff et al. 2017, branchless).
    sign = torch.where(n[:, 2] >= 0, 1.0, -1.0).to(n.dtype)
    a = -1.0 / (sign + n[:, 2])
    b = n[:, 0] * n[:, 1] * a
    t = torch.stack([1.0 + sign * n[:, 0] ** 2 * a, sign * b, -sign * n[:, 0]], 1)
    s = torch.stack([b, sign + n[:, 1] ** 2 * a, -n[:, 1]], 1)
    return t, s


def specular_probability(kd, ks):
    """Probability of sampling the specular lobe: by mean reflectance."""
    md, ms = kd.mean(1), ks.mean(1)
    total = md + ms
    return torch.where(total > 0, ms / torch.clamp(total, min=1e-12), torch.zeros_like(ms))


def _exponent(rough):
    return torch.clamp(2.0 / torch.clamp(rough, min=1e-6) - 2.0, min=0.0)


def pdf(n, wi, wo, kd, ks, rough):
    """Solid-angle pdf of ``sample`` producing ``wo`` (N,)."""
    p_spec = specular_probability(kd, ks)
    cos_o = (n * wo).sum(1)
    diffuse = torch.clamp(cos_o, min=0.0) / math.pi
    h = wi + wo
    h = h / torch.clamp(h.norm(dim=1, keepdim=True), min=1e-12)
    cos_h = torch.clamp((h * n).sum(1), min=0.0)
    e = _exponent(rough)
    pdf_h = (e + 2.0) / (2.0 * math.pi) * cos_h ** (e + 1.0)
    spec = pdf_h / (4.0 * torch.clamp((h * wo).sum(1).abs(), min=1e-12))
    return torch.where(cos_o > 0, (1.0 - p_spec) * diffuse + p_spec * spec,
                       torch.zeros_like(cos_o))


def sample(n, wi, kd, ks, rough, u):
    """Sample a light direction ``wo`` from (N, 3) uniforms ``u`` (u[:,0] picks the lobe)."""
    p_spec = specular_probability(kd, ks)
    t, s = _frame(n)
    phi = 2.0 * math.pi * u[:, 2]
    # Diffuse: cosine-weighted hemisphere.
    r = torch.sqrt(u[:, 1])
    local_d = torch.stack([r * torch.cos(phi), r * torch.sin(phi),
                           torch.sqrt(torch.clamp(1.0 - u[:, 1], min=0.0))], 1)
    # Specular: Blinn-Phong half vector, cos(theta_h) = u^(1/(e+2)), reflected about h.
    e = _exponent(rough)
    cos_h = u[:, 1] ** (1.0 / (e + 2.0))
    sin_h = torch.sqrt(torch.clamp(1.0 - cos_h ** 2, min=0.0))
    local_h = torch.stack([sin_h * torch.cos(phi), sin_h * torch.sin(phi), cos_h], 1)
    use_spec = (u[:, 0] < p_spec)[:, None]
    local = torch.where(use_spec, local_h, local_d)
    world = local[:, :1] * t + local[:, 1:2] * s + local[:, 2:] * n
    reflected = 2.0 * (world * wi).sum(1, keepdim=True) * world - wi
    wo = torch.where(use_spec, reflected, world)
    return wo / torch.clamp(wo.norm(dim=1, keepdim=True), min=1e-12)
