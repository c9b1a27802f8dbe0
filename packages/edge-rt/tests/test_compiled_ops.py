"""The compiled per-lane ops (ray-triangle interaction, BSDF, path bounce, next-event
estimation): values against plain torch,
VJP and JVP against float64 central differences (torch.autograd.gradcheck), bad input."""

from __future__ import annotations

import pytest
import torch

from edge_rt import bsdf
from edge_rt.geometry import RAY_TRIANGLE
from edge_rt.integrator import BOUNCE
from edge_rt.next_event import CONTRIBUTION, shadow_rays


def rays_hitting_triangles(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b, c = (torch.rand(n, 3, generator=g, dtype=torch.float64) + s
               for s in (torch.tensor([0.0, 0.0, 2.0]), torch.tensor([1.0, 0.0, 2.0]),
                         torch.tensor([0.0, 1.0, 2.0])))
    w = torch.rand(n, 3, generator=g, dtype=torch.float64) + 0.2
    target = (w[:, :1] * a + w[:, 1:2] * b + w[:, 2:] * c) / w.sum(1, keepdim=True)
    o = torch.rand(n, 3, generator=g, dtype=torch.float64) * 0.2
    d = target - o
    return a, b, c, o, d / d.norm(dim=1, keepdim=True)


def test_ray_triangle_values_match_torch():
    a, b, c, o, d = rays_hitting_triangles()
    p, t, ng, bary, area = RAY_TRIANGLE(a, b, c, o, d)
    e1, e2 = b - a, c - a
    normal = torch.linalg.cross(e1, e2)
    torch.testing.assert_close(p, o + t * d, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p, a + bary[:, :1] * e1 + bary[:, 1:] * e2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ng, normal / normal.norm(dim=1, keepdim=True))
    torch.testing.assert_close(area[:, 0], 0.5 * normal.norm(dim=1))


def test_ray_triangle_vjp_and_jvp_match_finite_differences():
    inputs = [x.requires_grad_(True) for x in rays_hitting_triangles(4, seed=1)]
    assert torch.autograd.gradcheck(RAY_TRIANGLE, inputs, eps=1e-6, atol=1e-7, rtol=1e-6,
                                    check_forward_ad=True)


def test_bsdf_vjp_and_jvp_match_finite_differences():
    g = torch.Generator().manual_seed(2)

    def unit(x):
        return x / x.norm(dim=1, keepdim=True)

    n = unit(torch.tensor([[0.1, 0.2, 1.0]], dtype=torch.float64).repeat(5, 1)
             + 0.1 * torch.rand(5, 3, generator=g, dtype=torch.float64))
    wi = unit(torch.rand(5, 3, generator=g, dtype=torch.float64) + torch.tensor([0.0, 0.0, 1.0]))
    wo = unit(torch.rand(5, 3, generator=g, dtype=torch.float64) + torch.tensor([0.0, 0.0, 1.0]))
    kd, ks = (0.2 + 0.5 * torch.rand(5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    rough = 0.1 + 0.3 * torch.rand(5, generator=g, dtype=torch.float64)
    args = [x.requires_grad_(True) for x in (n, wi, wo, kd, ks, rough)]

    def f(n, wi, wo, kd, ks, rough):
        return bsdf.evaluate(n, n.detach(), wi, wo, kd, ks, rough)

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-6,
                                    check_forward_ad=True)


def test_bad_input_is_named_before_the_kernel():
    a, b, c, o, d = rays_hitting_triangles()
    with pytest.raises(ValueError, match=r"input 4 must be \(6, 3\)"):
        RAY_TRIANGLE(a, b, c, o, d[:, :2])
    with pytest.raises(ValueError, match=r"input 1 must be .*float64"):
        RAY_TRIANGLE(a, b.float(), c, o, d)
    with pytest.raises(ValueError, match="expected 5 inputs"):
        RAY_TRIANGLE(a, b, c, o)
    with pytest.raises(TypeError, match="float32 or float64"):
        RAY_TRIANGLE(*(x.long() for x in (a, b, c, o, d)))


def light_samples(n=5, seed=3):
    """Shading points near the origin facing up, light triangles above them facing down."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    def unit(x):
        return x / x.norm(dim=1, keepdim=True)

    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    p = 0.3 * rand(n, 3)
    ns, ng = unit(up + 0.2 * rand(n, 3)), unit(up + 0.1 * rand(n, 3))
    wi = unit(up + rand(n, 3))
    kd, ks = 0.2 + 0.5 * rand(n, 3), 0.1 + 0.3 * rand(n, 3)
    rough = 0.1 + 0.3 * rand(n, 1)
    a = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64) + 0.2 * rand(n, 3)
    b, c = a + torch.tensor([0.0, 1.0, 0.0]), a + torch.tensor([1.0, 0.0, 0.0])
    u = 0.1 + 0.8 * rand(n, 2)
    emission, weight = 1.0 + rand(n, 3), 0.5 + rand(n, 1)
    return p, ns, ng, wi, kd, ks, rough, a, b, c, u, emission, weight


def light_points_in_torch(p, a, b, c, u):
    su = torch.sqrt(u[:, :1])
    y = (1.0 - su) * a + u[:, 1:] * su * b + (1.0 - (1.0 - su) - u[:, 1:] * su) * c
    cross = torch.linalg.cross(b - a, c - a)
    to_light = y - p
    dist2 = (to_light * to_light).sum(1)
    wo = to_light / torch.sqrt(dist2)[:, None]
    cos_l = -(cross * wo).sum(1) / cross.norm(dim=1)
    return y, wo, dist2, cos_l, 0.5 * cross.norm(dim=1)


def test_next_event_values_match_torch():
    p, ns, ng, wi, kd, ks, rough, a, b, c, u, emission, weight = light_samples()
    y, wo, dist2, cos_l, area = light_points_in_torch(p, a, b, c, u)
    pmf, eps = torch.full((len(p),), 0.25, dtype=torch.float64), 1e-3
    origin, direction, tmax, p_light, usable = shadow_rays(
        p, ng, (a, b, c), u, pmf, eps)
    torch.testing.assert_close(direction, wo)
    torch.testing.assert_close(origin, p + eps * ng)
    torch.testing.assert_close(tmax, (y - origin).norm(dim=1) * (1.0 - 1e-3))
    torch.testing.assert_close(p_light, pmf / area * dist2 / cos_l)
    assert usable.all()
    value, = CONTRIBUTION(p, ns, ng, wi, kd, ks, rough, a, b, c, u, emission, weight)
    f = bsdf.evaluate(ns, ng, wi, wo, kd, ks, rough[:, 0])
    torch.testing.assert_close(value, f * emission * (cos_l / dist2 * area)[:, None] * weight)
    # A light seen from behind contributes nothing and is not usable.
    value, = CONTRIBUTION(p, ns, ng, wi, kd, ks, rough, a, c, b, u, emission, weight)
    assert (value == 0).all()
    assert not shadow_rays(p, ng, (a, c, b), u, pmf, eps)[4].any()


def test_next_event_vjp_and_jvp_match_finite_differences():
    args = [x.requires_grad_(diff) for x, diff in zip(light_samples(4, seed=4),
                                                      CONTRIBUTION.differentiable)]
    assert torch.autograd.gradcheck(CONTRIBUTION, args, eps=1e-6, atol=1e-7, rtol=1e-6,
                                    check_forward_ad=True)


def test_next_event_bad_input_is_named():
    args = list(light_samples())
    args[10] = args[10][:, :1]
    with pytest.raises(ValueError, match=r"input 10 must be \(5, 2\)"):
        CONTRIBUTION(*args)


def bounce_inputs(n=6, seed=5):
    p, ns, ng, wi, kd, ks, rough = light_samples(n, seed)[:7]
    u = 0.05 + 0.9 * torch.rand(n, 3, generator=torch.Generator().manual_seed(seed),
                                dtype=torch.float64)
    return p, ns, ng, wi, kd, ks, rough, u, torch.full((n, 1), 1e-3, dtype=torch.float64)


def test_bounce_values_match_torch():
    p, ns, ng, wi, kd, ks, rough, u, eps = bounce_inputs()
    wo, pdf, throughput, origin, alive = BOUNCE(p, ns, ng, wi, kd, ks, rough, u, eps)
    wo_ref, pdf_ref = bsdf.sample(ns, wi, kd, ks, rough[:, 0], u)
    torch.testing.assert_close(wo, wo_ref)
    torch.testing.assert_close(pdf[:, 0], pdf_ref)
    ok = (pdf_ref > 0) & ((ng * wo_ref).sum(1) > 0)
    assert ok.any() and (alive[:, 0] == ok.double()).all()
    f = bsdf.evaluate(ns, ng, wi, wo_ref, kd, ks, rough[:, 0])
    torch.testing.assert_close(throughput, torch.where(ok[:, None], f / pdf_ref[:, None], 0.0))
    side = torch.where((ng * wo_ref).sum(1) >= 0, 1.0, -1.0).double()[:, None]
    torch.testing.assert_close(origin, p + eps * side * ng)


def test_bounce_vjp_and_jvp_match_finite_differences():
    """Sampled directions and pdfs are held constant (spec 5.3), so the derivatives are
    those of the throughput at the fixed direction and of the origin: directional central
    differences of that function, against the JVP and (through <ct, J v>) the VJP."""
    import torch.autograd.forward_ad as fwad

    args = bounce_inputs(4, seed=6)
    p, ns, ng, wi, kd, ks, rough, u, eps = args
    wo, pdf = (x.detach() for x in BOUNCE(*args)[:2])
    side = torch.where((ng * wo).sum(1) >= 0, 1.0, -1.0).double()[:, None]

    def fixed_direction(p, ns, wi, kd, ks, rough):
        f = bsdf.evaluate(ns, ng, wi, wo, kd, ks, rough[:, 0])
        return torch.cat([f / pdf, p + eps * side * ng], 1)

    def compiled(p, ns, wi, kd, ks, rough):
        out = BOUNCE(p, ns, ng, wi, kd, ks, rough, u, eps)
        return torch.cat([out[2], out[3]], 1)

    primal = (p, ns, wi, kd, ks, rough)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        tangent = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in primal]
        h = 1e-6
        fd = (fixed_direction(*(x + h * t for x, t in zip(primal, tangent)))
              - fixed_direction(*(x - h * t for x, t in zip(primal, tangent)))) / (2 * h)
        with fwad.dual_level():
            jvp = fwad.unpack_dual(compiled(*(fwad.make_dual(x, t) for x, t in
                                              zip(primal, tangent)))).tangent
        torch.testing.assert_close(jvp, fd, rtol=1e-6, atol=1e-7)
        cotangent = torch.randn(fd.shape, generator=g, dtype=torch.float64)
        leaves = [x.clone().requires_grad_(True) for x in primal]
        vjp = torch.autograd.grad(compiled(*leaves), leaves, cotangent)
        torch.testing.assert_close(sum((v * t).sum() for v, t in zip(vjp, tangent)),
                                   (cotangent * fd).sum(), rtol=1e-6, atol=1e-7)


def test_bounce_bad_input_is_named():
    args = list(bounce_inputs())
    args[8] = args[8].float()
    with pytest.raises(ValueError, match=r"input 8 must be .*float64"):
        BOUNCE(*args)
