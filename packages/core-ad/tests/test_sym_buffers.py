"""Buffers in lane-wise kernels: gather and scatter_add (reference numpy backend)."""

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
