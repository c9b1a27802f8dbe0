"""SampledImage (spec 2.8) and dense optical flow (spec 3.9, Fig. 30; AE-13)."""

import numpy as np
import pytest
from lsq_opt import (Array, Dim, Energy, Graph, Index, SampledImage, Unknown, compile_problem)
from lsq_opt.examples import flow


def bilinear(img, u, v):
    """Reference bilinear lookup, corners outside the image read as 0."""
    W, H = img.shape
    x0, y0 = np.floor(u).astype(int), np.floor(v).astype(int)
    ax, ay = u - x0, v - y0
    out = np.zeros_like(u)
    for dx, dy, w in ((0, 0, (1 - ax) * (1 - ay)), (1, 0, ax * (1 - ay)), (0, 1, (1 - ax) * ay),
                      (1, 1, ax * ay)):
        xc, yc = x0 + dx, y0 + dy
        ok = (xc >= 0) & (xc < W) & (yc >= 0) & (yc < H)
        out += w * np.where(ok, img[np.clip(xc, 0, W - 1), np.clip(yc, 0, H - 1)], 0.0)
    return out


def sampled_plan(rng, W_=11, H_=8, kernels=None, dtype=np.float64):
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H), 2)
    A = Array("A", (W, H))
    S = SampledImage(Array("S", (W, H)), Array("Sx", (W, H)), Array("Sy", (W, H)))
    e = Energy(S(Index(0) + X(0, 0, 0), Index(1) + X(0, 0, 1)) - A(0, 0))
    data = {"A": rng.random((W_, H_)), "S": rng.random((W_, H_)), "Sx": rng.normal(size=(W_, H_)),
            "Sy": rng.normal(size=(W_, H_))}
    return compile_problem(e, arrays=data, kernels=kernels, dtype=dtype), data


@pytest.mark.parametrize("kernels", ["fused", "lanes"])
def test_sampled_image_value_and_partials(kernels):
    """Value = bilinear interpolation (OOB corners 0, some lanes sample outside); partials =
    the supplied derivative images, bilinearly sampled (spec 2.8), float64 to 1e-9 (the
    coordinates are rounded to 2^-32 for the zero-derivative split)."""
    rng = np.random.default_rng(0)
    plan, d = sampled_plan(rng, kernels=kernels)
    W_, H_ = d["A"].shape
    x = rng.uniform(-2.5, 2.5, plan.n)
    U = plan.vector_to_unknowns(x)["X"]
    ii, jj = np.meshgrid(np.arange(W_), np.arange(H_), indexing="ij")
    u, v = ii + U[..., 0], jj + U[..., 1]
    assert ((u < 0) | (u > W_ - 1) | (v < 0) | (v > H_ - 1)).any()
    np.testing.assert_allclose(plan.residuals(x), (bilinear(d["S"], u, v) - d["A"]).ravel(),
                               atol=1e-9)
    J = plan.jacobian(x).toarray()
    lane = np.arange(W_ * H_)
    np.testing.assert_allclose(J[lane, 2 * lane], bilinear(d["Sx"], u, v).ravel(), atol=1e-12)
    np.testing.assert_allclose(J[lane, 2 * lane + 1], bilinear(d["Sy"], u, v).ravel(), atol=1e-12)
    F = plan.residuals(x)
    p = rng.normal(size=plan.n)
    np.testing.assert_allclose(plan.jtf(x), J.T @ F, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plan.jtjp(x, p), J.T @ (J @ p), rtol=1e-12, atol=1e-12)


def test_sampled_image_derivative_matches_fd_on_a_consistent_image():
    """AE-13: for an image whose derivative images are exact (a bilinear function a x + b y +
    c xy), the supplied partials equal central differences of the residuals (h = 1e-6,
    coordinates ~ 10: FD error ~1e-9; no sample sits on a cell edge)."""
    W, H = Dim("W"), Dim("H")
    X = Unknown("X", (W, H), 2)
    A = Array("A", (W, H))
    S = SampledImage(Array("S", (W, H)), Array("Sx", (W, H)), Array("Sy", (W, H)))
    e = Energy(S(Index(0) + X(0, 0, 0), Index(1) + X(0, 0, 1)) - A(0, 0))
    ii, jj = np.meshgrid(np.arange(14.0), np.arange(10.0), indexing="ij")
    img = 0.3 * ii - 0.2 * jj + 0.05 * ii * jj
    data = {"A": np.zeros_like(ii), "S": img, "Sx": 0.3 + 0.05 * jj, "Sy": -0.2 + 0.05 * ii}
    plan = compile_problem(e, arrays=data)
    rng = np.random.default_rng(1)
    U = np.stack([rng.uniform(0.1, 0.9, ii.shape), rng.uniform(0.1, 0.9, ii.shape)], -1)
    U[-1, :, 0] = -1.5  # stay inside the image
    U[:, -1, 1] = -1.5
    x = plan.unknowns_to_vector({"X": U})
    J = plan.jacobian(x).toarray()
    h = 1e-6
    for k in rng.choice(plan.n, 20, replace=False):
        e_ = np.zeros(plan.n)
        e_[k] = h
        fd = (plan.residuals(x + e_) - plan.residuals(x - e_)) / (2 * h)
        np.testing.assert_allclose(J[:, k], fd, atol=1e-8)


def test_sampled_image_float32():
    rng = np.random.default_rng(2)
    p32, _ = sampled_plan(rng, dtype=np.float32)
    rng = np.random.default_rng(2)
    l32, _ = sampled_plan(rng, dtype=np.float32, kernels="lanes")
    x = rng.uniform(-1, 1, p32.n).astype(np.float32)
    p = rng.normal(size=p32.n).astype(np.float32)
    a, b = p32.jtjp(x, p), l32.jtjp(x, p)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


def test_sampled_image_errors():
    W, H, N = Dim("W"), Dim("H"), Dim("N")
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    with pytest.raises(TypeError, match="must be Arrays"):
        SampledImage(X, A, A)
    with pytest.raises(TypeError, match="2-D"):
        SampledImage(Array("B", N), Array("Bx", N), Array("By", N))
    V = Unknown("V", N)
    G = Graph("G", ["a"], N)
    S = SampledImage(A, Array("Ax", (W, H)), Array("Ay", (W, H)))
    from lsq_opt import LsqCompileError
    with pytest.raises(LsqCompileError, match="not allowed in graph"):
        compile_problem(Energy(S(V(G.a), 1.0) - 1.0), sizes={"N": 3, "W": 4, "H": 4},
                        arrays={"A": np.ones((4, 4)), "Ax": np.ones((4, 4)), "Ay": np.ones((4, 4))},
                        graphs={"G": {"a": np.array([0, 1, 2])}})


def test_ae13_optical_flow_endpoint_error():
    """AE-13: 2-level hierarchy with the w_fit ramp recovers a (1.3, -0.7) px flow with mean
    endpoint error < 0.1 px in the interior."""
    r = flow.run((48, 40))
    assert r["finite"]
    assert r["mean_epe_interior"] < 0.1, r["mean_epe_interior"]
