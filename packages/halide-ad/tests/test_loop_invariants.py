"""Code generation hoists what a loop's body computes independently of the loop (a sampler's
coordinates, weights and bounds tests around a reduction over channels) out of it, and runs
it only when the loop runs (its reads may need a region that an empty loop never asks for)."""

import re

import halide_ad as hl
import numpy as np
import pytest

RNG = np.random.default_rng(11)


def _channel_sum(vectorize):
    """``g(x) = sum over r < n of a linear interpolation of img(., r) at pos(x)``: per-pixel
    coordinates and weights, a read per channel."""
    x = hl.Var("x")
    n = hl.Param(hl.Int(32), "n", 0)
    img = hl.Buffer(RNG.standard_normal((5, 64)), name="img")
    pos = hl.Buffer(RNG.uniform(0, 62, 64), name="pos")
    r = hl.RDom([(0, n)], name="r")
    g = hl.Func("g")
    i0 = hl.clamp(hl.i32(hl.floor(pos[x])), 0, 62)
    t = pos[x] - hl.floor(pos[x])
    g[x] = hl.f64(0)
    g[x] += img[i0, r.x] * (1 - t) + img[i0 + 1, r.x] * t
    if vectorize:
        g.update(0).vectorize(x, 8)
    i, p = img.numpy(), pos.numpy()
    k = np.clip(np.floor(p).astype(int), 0, 62)
    w = p - np.floor(p)
    return g, n, (i[:, k] * (1 - w) + i[:, k + 1] * w).sum(0)


@pytest.mark.parametrize("vectorize", [False, True])
def test_reduction_with_hoisted_coordinates_matches_numpy_and_runs_empty(vectorize):
    g, n, want = _channel_sum(vectorize)
    np.testing.assert_array_equal(np.asarray(g.realize([64])), np.zeros(64))  # n = 0
    n.set(5)
    np.testing.assert_allclose(np.asarray(g.realize([64])), want, rtol=1e-13, atol=1e-13)


def test_coordinates_are_computed_outside_the_channel_loop():
    g, n, _ = _channel_sum(vectorize=True)
    n.set(5)
    p = hl.Pipeline([g])
    p.realize([64])
    ir = p._compile().ir
    bodies = re.findall(r'^"?r\.x\.body[^:\n]*:\n(.*?)(?=^\S[^\n]*:\n)', ir, re.S | re.M)
    assert bodies and not any("llvm.floor" in b for b in bodies), bodies
