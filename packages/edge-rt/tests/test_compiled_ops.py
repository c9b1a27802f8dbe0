"""The compiled per-lane ops (ray-triangle interaction, BSDF): values against plain torch,
VJP and JVP against float64 central differences (torch.autograd.gradcheck), bad input."""

from __future__ import annotations

import pytest
import torch

from edge_rt import bsdf
from edge_rt.geometry import RAY_TRIANGLE


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
