"""Lambertian + Blinn-Phong with Schlick Fresnel (spec section 11.2), evaluated in core_ad
compiled kernels and exposed to torch as an autograd Function.

Conventions: ``wi`` points from the surface to the viewer (the reversed incoming ray), ``wo``
from the surface to the light; both unit vectors in world space. ``evaluate`` returns
BRDF * cos(n, wo) per RGB channel. ``sample`` / ``pdf`` are the sampling routines of the path
tracer (cosine-weighted diffuse lobe, Blinn-Phong half-vector lobe), compiled core_ad kernels
without derivatives: the renderer treats sampled directions and pdfs as constants (unbiased,
spec 5.3).
"""

from __future__ import annotations

import math


from core_ad import sym

from ._compiled import CompiledOp, columns, lanes_to_tensor

_INPUTS = ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz", "ox", "oy", "oz",
           "kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")


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


def _bsdf_lanes(dtype: str):
    v, out = bsdf_expressions(dtype)
    return [v[n] for n in _INPUTS], out


# (n, ng, wi, wo, kd, ks, rough (N, 1)) -> BRDF * cos (N, 3); the geometric normal only gates
# grazing angles, so it gets no cotangent
_EVAL = CompiledOp(_bsdf_lanes, (3, 3, 3, 3, 3, 3, 1), (3,),
                   differentiable=(True, False, True, True, True, True, True))


def evaluate(n, ng, wi, wo, kd, ks, rough):
    """BRDF * cos(n, wo), shape (N, 3). All arguments (N, 3) except ``rough`` (N,).

    ``n`` is the shading normal, ``ng`` the geometric normal (both already flipped toward the
    viewer for two-sided shading)."""
    return _EVAL(n, ng, wi, wo, kd, ks, rough[:, None])[0]


def sampling_expressions(dtype: str):
    """Sampling (wo and its pdf) and the pdf of a given wo, as core_ad expressions: a
    cosine-weighted diffuse lobe and the Blinn-Phong half-vector lobe, picked by mean
    reflectance (Duff et al.'s branchless frame around n).

    Returns ``((wo_x, wo_y, wo_z, pdf), sample_inputs), ((pdf,), pdf_inputs)``, the inputs as
    named vars. Public so that h2mc can substitute its own expressions for the inputs and
    differentiate sampled paths with respect to the random numbers ``u0..u2``."""
    names = ("nx", "ny", "nz", "ix", "iy", "iz", "ox", "oy", "oz", "kdr", "kdg", "kdb",
             "ksr", "ksg", "ksb", "rough", "u0", "u1", "u2")
    v = {name: sym.var(name, dtype) for name in names}
    n = (v["nx"], v["ny"], v["nz"])
    wi = (v["ix"], v["iy"], v["iz"])
    md = (v["kdr"] + v["kdg"] + v["kdb"]) / 3.0
    ms = (v["ksr"] + v["ksg"] + v["ksb"]) / 3.0
    total = md + ms
    p_spec = sym.where(total > 0.0, ms / sym.maximum(total, 1e-12), 0.0)
    e = sym.maximum(2.0 / sym.maximum(v["rough"], 1e-6) - 2.0, 0.0)

    def pdf_of(wo):
        cos_o = _dot(n, wo)
        hx, hy, hz = wi[0] + wo[0], wi[1] + wo[1], wi[2] + wo[2]
        inv = sym.rsqrt(sym.maximum(hx * hx + hy * hy + hz * hz, 1e-24))
        h = (hx * inv, hy * inv, hz * inv)
        cos_h = sym.maximum(_dot(h, n), 1e-30)
        pdf_h = (e + 2.0) / (2.0 * math.pi) * sym.exp((e + 1.0) * sym.log(cos_h))
        spec = pdf_h / (4.0 * sym.maximum(sym.abs(_dot(h, wo)), 1e-12))
        mixed = (1.0 - p_spec) * sym.maximum(cos_o, 0.0) / math.pi + p_spec * spec
        return sym.where(cos_o > 0.0, mixed, 0.0)

    sign = sym.where(n[2] >= 0.0, sym.const(1.0, dtype), sym.const(-1.0, dtype))
    a = -1.0 / (sign + n[2])
    b = n[0] * n[1] * a
    t = (1.0 + sign * n[0] * n[0] * a, sign * b, -sign * n[0])
    bt = (b, sign + n[1] * n[1] * a, -n[1])
    phi = 2.0 * math.pi * v["u2"]
    cphi, sphi = sym.cos(phi), sym.sin(phi)
    r = sym.sqrt(v["u1"])
    local_d = (r * cphi, r * sphi, sym.sqrt(sym.maximum(1.0 - v["u1"], 0.0)))
    cos_h = sym.exp(sym.log(sym.maximum(v["u1"], 1e-30)) / (e + 2.0))
    sin_h = sym.sqrt(sym.maximum(1.0 - cos_h * cos_h, 0.0))
    local_h = (sin_h * cphi, sin_h * sphi, cos_h)
    use_spec = v["u0"] < p_spec
    local = [sym.where(use_spec, local_h[k], local_d[k]) for k in range(3)]
    world = [local[0] * t[k] + local[1] * bt[k] + local[2] * n[k] for k in range(3)]
    twice = 2.0 * _dot(world, wi)
    raw = [sym.where(use_spec, twice * world[k] - wi[k], world[k]) for k in range(3)]
    inv = sym.rsqrt(sym.maximum(_dot(raw, raw), 1e-24))
    wo = [raw[k] * inv for k in range(3)]
    given = (v["ox"], v["oy"], v["oz"])
    sample_inputs = [v[k] for k in names if k[0] != "o"]
    pdf_inputs = [v[k] for k in names if k[0] != "u"]
    return (wo + [pdf_of(wo)], sample_inputs), ([pdf_of(given)], pdf_inputs)


_SAMPLING: dict = {}


def _sampling_kernels(dtype: str):
    if dtype not in _SAMPLING:
        (s_out, s_in), (p_out, p_in) = sampling_expressions(dtype)
        _SAMPLING[dtype] = (sym.compile(s_out, s_in), sym.compile(p_out, p_in))
    return _SAMPLING[dtype]


def _run(kernel, tensors, like):
    """(N, outputs) results of a kernel without derivatives."""
    if like.shape[0] == 0:
        return like.new_zeros(0, len(kernel.outputs))
    return lanes_to_tensor(kernel(*columns(tensors)), like.shape[0])


def sample(n, wi, kd, ks, rough, u):
    """Sample a light direction from (N, 3) uniforms ``u`` (u[:, 0] picks the lobe):
    ``(wo (N, 3), pdf (N,))``, one compiled kernel, no derivatives (held constant)."""
    kernel = _sampling_kernels(str(n.dtype).removeprefix("torch."))[0]
    out = _run(kernel, [n, wi, kd, ks, rough[:, None], u], n)
    return out[:, :3], out[:, 3]


def pdf(n, wi, wo, kd, ks, rough):
    """Solid-angle pdf (N,) of ``sample`` producing ``wo``, compiled, no derivatives."""
    kernel = _sampling_kernels(str(n.dtype).removeprefix("torch."))[1]
    return _run(kernel, [n, wi, wo, kd, ks, rough[:, None]], n)[:, 0]
