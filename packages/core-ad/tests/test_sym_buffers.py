"""Buffers in lane-wise kernels: gather and scatter_add (reference numpy backend); lane_sum,
the sum over a kernel's lanes (numpy and LLVM backends)."""

import math

import numpy as np
import pytest

from core_ad import sym


def test_gather_and_scatter_add_match_numpy():
    rng = np.random.default_rng(0)
    table = rng.normal(size=50)
    idx = rng.integers(0, 50, size=1000)
    x = rng.normal(size=1000)
    b, acc = sym.buffer("table"), sym.buffer("acc")
    i, v = sym.var("i", "int64"), sym.var("x")
    f = sym.compile([sym.gather(b, i) * v, sym.scatter_add(acc, i, v * v)], [b, acc, i, v])
    y, out = f(table, np.ones(50), idx, x)
    np.testing.assert_array_equal(y, table[idx] * x)
    ref = np.ones(50)
    np.add.at(ref, idx, x * x)
    np.testing.assert_allclose(out, ref, rtol=1e-12)  # summation order differs from add.at


def test_out_of_range_index_names_buffer_and_index():
    b, i = sym.buffer("verts"), sym.var("i", "int64")
    f = sym.compile([sym.gather(b, i)], [b, i])
    with pytest.raises(IndexError, match=r"index 7 .* 'verts'"):
        f(np.zeros(7), np.array([0, 7]))
    with pytest.raises(IndexError, match="index -1"):
        f(np.zeros(7), np.array([-1, 0]))


def test_derivative_with_respect_to_gather_node_and_not_buffer():
    b, i, x = sym.buffer("t"), sym.var("i", "int64"), sym.var("x")
    g = sym.gather(b, i)
    e = sym.sin(g) * x
    d = sym.compile([sym.diff(e, g)], [b, i, x])(np.array([0.5, 1.0]), np.array([1]),
                                                   np.array([2.0]))[0]
    np.testing.assert_allclose(d, np.cos(1.0) * 2.0, rtol=1e-14)
    with pytest.raises(NotImplementedError, match="whole buffer"):
        sym.diff(e, b)


def test_bad_buffer_programs():
    b, i, x = sym.buffer("t"), sym.var("i", "int64"), sym.var("x")
    with pytest.raises(TypeError, match="integer expression"):
        sym.gather(b, x)
    with pytest.raises(TypeError, match="sym.buffer"):
        sym.gather(x, i)
    with pytest.raises(ValueError, match="only be an output"):
        sym.compile([sym.scatter_add(b, i, x) * 2.0], [b, i, x])


# ---- lane_sum ------------------------------------------------------------------------------
# The LLVM backend sums with Neumaier compensation per vector lane and thread: within a few ulps
# of the exact sum (math.fsum), where numpy's pairwise sum is within O(log n) ulps.


@pytest.mark.parametrize("backend", ["llvm", "numpy"])
@pytest.mark.parametrize("n", [0, 1, 3, 17, 1000, 100_003])
def test_lane_sum_matches_the_exact_sum(backend, n):
    x = sym.var("x")
    e = sym.sin(x) * sym.exp(-x * x) + x**3
    f = sym.compile([sym.lane_sum(e), e, sym.lane_sum(sym.const(2.0))], [x], backend=backend)
    xs = np.random.default_rng(n).standard_normal(n)
    total, lanes, count = f(xs)
    assert total.shape == () and total.dtype == np.float64
    exact = math.fsum(lanes)
    assert abs(float(total) - exact) <= 4 * np.finfo(float).eps * max(1.0, np.abs(lanes).sum())
    assert float(count) == 2.0 * n  # a constant is summed over every lane


def test_lane_sum_is_compensated_and_thread_count_independent_in_value():
    x = sym.var("x")
    f = sym.compile([sym.lane_sum(x)], [x])
    cancel = np.array([1e16, 1.0, -1e16] * 1000)
    assert float(f(cancel)[0]) == math.fsum(cancel) == 1000.0  # numpy's sum gives 66
    xs = np.random.default_rng(0).standard_normal(300_000)
    sums = {t: float(f(xs, num_threads=t)[0]) for t in (1, 2, 3)}
    for v in sums.values():
        assert abs(v - math.fsum(xs)) <= 2 * np.finfo(float).eps * np.abs(xs).sum()
    assert float(f(xs, num_threads=2)[0]) == sums[2]  # deterministic for a thread count


def test_lane_sum_float32_and_non_finite_values():
    x = sym.var("x", "float32")
    f = sym.compile([sym.lane_sum(x * x)], [x])
    xs = np.random.default_rng(1).standard_normal(10_001).astype(np.float32)
    got = f(xs)[0]
    assert got.dtype == np.float32
    assert abs(float(got) - math.fsum(np.float64(xs * xs))) <= 1e-6 * float(got)
    g = sym.compile([sym.lane_sum(sym.var("y"))], [sym.var("y")])
    assert float(g(np.array([1.0, np.inf, 2.0]))[0]) == np.inf
    assert np.isnan(g(np.array([np.inf, -np.inf]))[0])
    assert np.isnan(g(np.array([np.nan, 1.0]))[0])


def test_lane_sum_derivatives_match_finite_differences():
    """Forward mode (tangent 1 in every lane) gives d/dh sum(f(x + h)); reverse mode spreads
    the cotangent to every lane: each lane's gradient is d sum / d x_j. Central differences in
    float64, relative 1e-7."""
    x = sym.var("x")
    s = sym.lane_sum(sym.sin(x) * x)
    value = sym.compile([s], [x])
    xs = np.linspace(-1.0, 2.0, 11)
    h = 1e-6

    def fd(dx):
        return (float(value(xs + dx)[0]) - float(value(xs - dx)[0])) / (2 * h)

    d = float(sym.compile([sym.diff(s, x)], [x])(xs)[0])
    np.testing.assert_allclose(d, fd(np.full_like(xs, h)), rtol=1e-7)
    g = sym.compile(sym.grad(s, [x]), [x])(xs)[0]
    np.testing.assert_allclose(g, [fd(np.eye(len(xs))[j] * h) for j in range(len(xs))],
                               rtol=1e-7, atol=1e-9)


def test_bad_lane_sum_programs():
    x, i = sym.var("x"), sym.var("i", "int64")
    with pytest.raises(TypeError, match="floating point"):
        sym.lane_sum(i)
    with pytest.raises(ValueError, match="lane_sum can only be an output"):
        sym.compile([sym.lane_sum(x) * 2.0], [x])
