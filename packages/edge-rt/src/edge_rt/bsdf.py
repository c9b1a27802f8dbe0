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

import torch

from core_ad import sym

from ._compiled import CompiledOp, columns, run_kernel

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


def _frame(n, dtype):
    """Tangent and bitangent of the unit normal ``n`` (Duff et al.'s branchless frame)."""
    sign = sym.where(n[2] >= 0.0, sym.const(1.0, dtype), sym.const(-1.0, dtype))
    a = -1.0 / (sign + n[2])
    b = n[0] * n[1] * a
    return (1.0 + sign * n[0] * n[0] * a, sign * b, -sign * n[0]), (b, sign + n[1] * n[1] * a,
                                                                     -n[1])


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

    t, bt = _frame(n, dtype)
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
    return run_kernel(kernel, columns(tensors), like.shape[0])


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


# -- rough dielectric (Walter et al. 2007, GGX) ----------------------------------------------
#
# Conventions as above (``wi`` toward the viewer, ``wo`` toward the light, ``n`` and ``ng``
# flipped toward the viewer). ``eta`` is the *relative* index of refraction: the index on the
# light's side of the surface over the index on the viewer's side (``relative_eta``: the
# material's interior index when the viewer is outside, its inverse when inside). GGX width
# ``alpha = sqrt(roughness)``: the Beckmann-equivalent width of the Blinn-Phong lobe of the same
# roughness (exponent 2 / roughness - 2), so both models read ``roughness`` alike.
#
# Radiance transport: the transmission term carries Walter's eta_viewer^2 factor, so that
# ``f(wi, wo, eta) * eta^2 == f(wo, wi, 1 / eta)`` (generalised reciprocity) and radiance
# leaving a denser medium is scaled by 1 / eta^2 as it enters a thinner one. The path tracer
# traces from the camera, so this is the BSDF it needs; a light tracer would drop the factor.

_DIELECTRIC_INPUTS = ("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz", "ox", "oy", "oz",
                      "eta", "rough")
# GGX alpha^2 = roughness, floored: alpha >= 3e-4 keeps D's peak (1 / (pi alpha^2)) finite in
# float32.
_MIN_ALPHA2 = 1e-7


def _alpha2(rough):
    return sym.maximum(rough, _MIN_ALPHA2)


def fresnel_dielectric(cos_i, eta):
    """Exact unpolarised Fresnel reflectance at a smooth interface (Walter eq. 22): ``cos_i``
    the cosine on the incident side (>= 0), ``eta`` the relative index; 1 under total internal
    reflection."""
    g2 = eta * eta - 1.0 + cos_i * cos_i
    g = sym.sqrt(sym.maximum(g2, 1e-12))
    a = (g - cos_i) / (g + cos_i)
    b = (cos_i * (g + cos_i) - 1.0) / (cos_i * (g - cos_i) + 1.0)
    return sym.where(g2 > 0.0, 0.5 * a * a * (1.0 + b * b), 1.0)


def _ggx_d(cos_h, alpha2):
    t = cos_h * cos_h * (alpha2 - 1.0) + 1.0
    return sym.where(cos_h > 0.0, alpha2 / (math.pi * t * t), 0.0)


def _ggx_g1(cos_v, cos_vh, alpha2):
    """Smith G1 of GGX for direction v (cosines with the macro normal and the microfacet
    normal); zero on the microfacet's back side."""
    c = sym.abs(cos_v)
    g = 2.0 * c / (c + sym.sqrt(alpha2 + (1.0 - alpha2) * c * c))
    return sym.where(cos_v * cos_vh > 0.0, g, 0.0)


def _half_vectors(n, wi, wo, eta, reflect):
    """The microfacet normal that maps ``wi`` to ``wo``: ``normalize(wi + wo)`` for reflection,
    ``normalize(wi + eta wo)`` turned toward ``n`` for refraction (Walter eqs. 13, 16), and
    whether it exists (the refraction half-vector vanishes for eta = 1 and wo = -wi)."""
    raw = [sym.where(reflect, wi[k] + wo[k], wi[k] + eta * wo[k]) for k in range(3)]
    length2 = _dot(raw, raw)
    inv = sym.rsqrt(sym.maximum(length2, 1e-24))
    flip = sym.where(_dot(raw, n) < 0.0, -inv, inv)
    return [x * flip for x in raw], length2 > 1e-12


def dielectric_expressions(dtype: str):
    """BSDF * |cos(n, wo)| of the rough dielectric over the scalar vars named in
    ``_DIELECTRIC_INPUTS`` (one expression; the material has no colour): Walter's reflection
    term ``F D G / (4 cos_i)`` where ``wo`` lies on the viewer's side, his transmission term
    ``|wi.h| |wo.h| (1 - F) D G / (cos_i (wi.h + eta wo.h)^2)`` (which includes the solid-angle
    Jacobian of refraction) where it lies on the other side. The side is the geometric
    normal's, and the shading normal must agree (light leaks are rejected); zero where
    ``ng.wi <= 0``, and going to zero continuously as ``n.wi`` drops to 0 (G1's factor)."""
    v = {name: sym.var(name, dtype) for name in _DIELECTRIC_INPUTS}
    n = (v["nx"], v["ny"], v["nz"])
    ng = (v["gx"], v["gy"], v["gz"])
    wi = (v["ix"], v["iy"], v["iz"])
    wo = (v["ox"], v["oy"], v["oz"])
    eta, alpha2 = v["eta"], _alpha2(v["rough"])
    cos_i, cos_o = _dot(n, wi), _dot(n, wo)
    go = _dot(ng, wo)
    reflect = go > 0.0
    h, exists = _half_vectors(n, wi, wo, eta, reflect)
    cos_h, ih, oh = _dot(h, n), _dot(h, wi), _dot(h, wo)
    dg = _ggx_d(cos_h, alpha2) * _ggx_g1(cos_i, ih, alpha2) * _ggx_g1(cos_o, oh, alpha2)
    fresnel = fresnel_dielectric(sym.abs(ih), eta)
    safe_cos_i = sym.maximum(cos_i, 1e-4)
    den = ih + eta * oh
    reflected = fresnel * dg / (4.0 * safe_cos_i)
    transmitted = (sym.abs(ih) * sym.abs(oh) * (1.0 - fresnel) * dg
                   / (safe_cos_i * sym.maximum(den * den, 1e-24)))
    same_side = sym.where(reflect, cos_o > 1e-4, cos_o < -1e-4)
    # The viewer side is gated by the geometric normal only (as bsdf_expressions): where the
    # shading normal turns away from the viewer, G1(wi) -> 0 over the clamped cos_i brings the
    # value to zero continuously; a cut on cos_i would be a jump that moves with the normals,
    # which no edge sampler accounts for (a bias in shading-normal gradients).
    valid = sym.logical_and(
        _dot(ng, wi) > 0.0,
        sym.logical_and(sym.logical_and(same_side, sym.abs(go) > 1e-4),
                        sym.logical_and(exists, ih > 0.0)))
    return v, sym.where(valid, sym.where(reflect, reflected, transmitted), 0.0)


def _dielectric_lanes(dtype: str):
    v, out = dielectric_expressions(dtype)
    return [v[n] for n in _DIELECTRIC_INPUTS], [out]


# (n, ng, wi, wo, eta (N, 1), rough (N, 1)) -> BSDF * |cos| (N, 1)
_EVAL_DIELECTRIC = CompiledOp(_dielectric_lanes, (3, 3, 3, 3, 1, 1), (1,),
                              differentiable=(True, False, True, True, True, True))


def relative_eta(eta, front):
    """The relative index the dielectric expressions take, (N,): the material's interior index
    ``eta`` (N,) where the viewer is outside (``front``: the ray hit the side the winding's
    normal points to), its inverse where inside. Differentiable in ``eta``."""
    return torch.where(front, eta, 1.0 / eta)


def evaluate_dielectric(n, ng, wi, wo, eta, rough):
    """Rough dielectric BSDF * |cos(n, wo)|, shape (N,). ``eta`` (N,) relative index
    (:func:`relative_eta`), ``rough`` (N,) (GGX alpha = sqrt(rough)); the rest (N, 3)."""
    return _EVAL_DIELECTRIC(n, ng, wi, wo, eta[:, None], rough[:, None])[0][:, 0]


def _visible_normal(n, wi, alpha, u1, u2, dtype):
    """A GGX microfacet normal seen from ``wi`` (Heitz 2018, "Sampling the GGX distribution of
    visible normals"): stretch the view to the unit-roughness configuration, sample the
    projected hemisphere there, unstretch. Its pdf is ``G1(wi) max(0, wi.m) D(m) / (wi.n)``,
    so every normal it returns faces the viewer (plain D(m) cos sampling wastes up to a third
    of its samples at alpha 0.5 and grazing incidence)."""
    t, bt = _frame(n, dtype)
    vx, vy, vz = alpha * _dot(wi, t), alpha * _dot(wi, bt), sym.maximum(_dot(wi, n), 1e-7)
    inv = sym.rsqrt(vx * vx + vy * vy + vz * vz)
    vx, vy, vz = vx * inv, vy * inv, vz * inv
    lensq = vx * vx + vy * vy
    inv_len = sym.rsqrt(sym.maximum(lensq, 1e-30))
    # a basis around the stretched view (any, at normal incidence)
    t1 = (sym.where(lensq > 0.0, -vy * inv_len, 1.0), sym.where(lensq > 0.0, vx * inv_len, 0.0),
          sym.const(0.0, dtype))
    t2 = (vy * t1[2] - vz * t1[1], vz * t1[0] - vx * t1[2], vx * t1[1] - vy * t1[0])
    r, phi = sym.sqrt(u1), 2.0 * math.pi * u2
    p1, s = r * sym.cos(phi), r * sym.sin(phi)
    half = 0.5 * (1.0 + vz)
    # q = sqrt(1 - p1^2) and the height sqrt(1 - p1^2 - p2^2) written without cancellation
    # (1 - p1^2 = 1 - u1 + s^2; q^2 - s^2 = 1 - u1): near the disk's rim (u1 -> 1) the plain
    # forms lose half their digits, and the sample's direction with them
    q = sym.sqrt(1.0 - u1 + s * s)
    p2 = (1.0 - half) * q + half * s
    q_minus_s = sym.where(s < 0.0, q - s, (1.0 - u1) / sym.maximum(q + s, 1e-30))
    up = sym.sqrt(sym.maximum(half * q_minus_s * (q + p2), 0.0))
    hx = p1 * t1[0] + p2 * t2[0] + up * vx
    hy = p1 * t1[1] + p2 * t2[1] + up * vy
    hz = sym.maximum(p1 * t1[2] + p2 * t2[2] + up * vz, 0.0)
    mx, my, mz = alpha * hx, alpha * hy, hz
    inv_m = sym.rsqrt(sym.maximum(mx * mx + my * my + mz * mz, 1e-30))
    return [(mx * t[k] + my * bt[k] + mz * n[k]) * inv_m for k in range(3)]


def dielectric_sampling_expressions(dtype: str):
    """Sampling of the rough dielectric: a GGX microfacet normal from (u1, u2) by
    visible-normal sampling (:func:`_visible_normal`), then reflection with probability
    F(wi.m) (``u0 < F``), refraction otherwise. Samples whose direction lands on the wrong
    side of ``n`` for its lobe get pdf 0 (the path ends; unbiased, as the BSDF vanishes
    wherever no valid sample lands), as does a viewer at or below the shading horizon.

    Returns ``((wo_x, wo_y, wo_z, pdf), sample_inputs), ((pdf,), pdf_inputs)`` as
    :func:`sampling_expressions`, over vars n, wi, (wo,) eta, rough, (u0..u2)."""
    names = ("nx", "ny", "nz", "ix", "iy", "iz", "ox", "oy", "oz", "eta", "rough",
             "u0", "u1", "u2")
    v = {name: sym.var(name, dtype) for name in names}
    n = (v["nx"], v["ny"], v["nz"])
    wi = (v["ix"], v["iy"], v["iz"])
    eta, alpha2 = v["eta"], _alpha2(v["rough"])

    cos_i = _dot(n, wi)

    def pdf_of(wo):
        cos_o = _dot(n, wo)
        reflect = cos_o > 0.0
        h, exists = _half_vectors(n, wi, wo, eta, reflect)
        cos_h, ih, oh = _dot(h, n), _dot(h, wi), _dot(h, wo)
        # the visible normals' density: G1(wi) (wi.m) D(m) / (wi.n)
        pdf_h = (_ggx_g1(cos_i, ih, alpha2) * ih * _ggx_d(cos_h, alpha2)
                 / sym.maximum(cos_i, 1e-7))
        fresnel = fresnel_dielectric(sym.abs(ih), eta)
        den = ih + eta * oh
        reflected = fresnel * pdf_h / (4.0 * sym.maximum(sym.abs(oh), 1e-12))
        transmitted = ((1.0 - fresnel) * pdf_h * eta * eta * sym.abs(oh)
                       / sym.maximum(den * den, 1e-24))
        valid = sym.logical_and(sym.logical_and(sym.logical_and(exists, ih > 0.0),
                                                cos_i > 1e-7),
                                sym.logical_or(reflect, oh < 0.0))
        return sym.where(valid, sym.where(reflect, reflected, transmitted), 0.0)

    m = _visible_normal(n, wi, sym.sqrt(alpha2), v["u1"], v["u2"], dtype)
    c = _dot(m, wi)
    reflect = v["u0"] < fresnel_dielectric(sym.abs(c), eta)
    cos_t = sym.sqrt(sym.maximum(1.0 - (1.0 - c * c) / (eta * eta), 0.0))
    raw = [sym.where(reflect, 2.0 * c * m[k] - wi[k], (c / eta - cos_t) * m[k] - wi[k] / eta)
           for k in range(3)]
    inv = sym.rsqrt(sym.maximum(_dot(raw, raw), 1e-24))
    wo = [x * inv for x in raw]
    # the pdf of the lobe that produced wo: zero where pdf_of would read it as the other lobe
    consistent = sym.logical_and(c > 0.0, sym.where(reflect, _dot(n, wo) > 0.0,
                                                    _dot(n, wo) < 0.0))
    sampled_pdf = sym.where(consistent, pdf_of(wo), 0.0)
    given = (v["ox"], v["oy"], v["oz"])
    sample_inputs = [v[k] for k in names if k[0] != "o"]
    pdf_inputs = [v[k] for k in names if k[0] != "u"]
    return (wo + [sampled_pdf], sample_inputs), ([pdf_of(given)], pdf_inputs)


def _dielectric_sampling_kernels(dtype: str):
    key = ("dielectric", dtype)
    if key not in _SAMPLING:
        (s_out, s_in), (p_out, p_in) = dielectric_sampling_expressions(dtype)
        _SAMPLING[key] = (sym.compile(s_out, s_in), sym.compile(p_out, p_in))
    return _SAMPLING[key]


def sample_dielectric(n, wi, eta, rough, u):
    """Sample a light direction of the rough dielectric from (N, 3) uniforms ``u`` (u[:, 0]
    picks the lobe): ``(wo (N, 3), pdf (N,))``, no derivatives. ``eta`` relative (N,)."""
    kernel = _dielectric_sampling_kernels(str(n.dtype).removeprefix("torch."))[0]
    out = _run(kernel, [n, wi, eta[:, None], rough[:, None], u], n)
    return out[:, :3], out[:, 3]


def pdf_dielectric(n, wi, wo, eta, rough):
    """Solid-angle pdf (N,) of ``sample_dielectric`` producing ``wo``, no derivatives."""
    kernel = _dielectric_sampling_kernels(str(n.dtype).removeprefix("torch."))[1]
    return _run(kernel, [n, wi, wo, eta[:, None], rough[:, None]], n)[:, 0]
