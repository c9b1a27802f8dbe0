"""Gather / scatter duality, scatter_add, overwrite scatter, broadcast reductions, index errors.

docs/design/core-ad.md, "Acceptance tests" (CA-ARR-1..6, 11, 12). Small examples use integer-valued or
exactly representable inputs, so results are compared exactly; the large ones state their
tolerance. No timing assertions (docs/ARCHITECTURE.md, "Testing and benchmarking").
"""

from __future__ import annotations

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp

# --------------------------------------------------------------------------------------------
# CA-ARR-1, CA-ARR-2: gather


def test_ca_arr_1_gather_reverse_accumulates_duplicates():
    a = ad.Array(np.linspace(0, 1, 10), requires_grad=True)
    c = anp.take(a, [1, 4, 8, 4])
    # linspace values k/9: exact to 1 ulp; the spec prints 4 decimals
    np.testing.assert_allclose(c.value, [0.1111, 0.4444, 0.8889, 0.4444], atol=5e-5)
    np.testing.assert_array_equal(c.value, np.linspace(0, 1, 10)[[1, 4, 8, 4]])
    ad.backward(anp.sum(c))
    np.testing.assert_array_equal(a.grad, [0, 1, 0, 0, 2, 0, 0, 0, 1, 0])


def test_ca_arr_2_gather_forward():
    a = ad.Array(np.linspace(0, 1, 10), requires_grad=True)
    c = anp.take(a, [1, 4, 8, 4])
    ad.forward(a, np.arange(10.0))
    np.testing.assert_array_equal(c.tangent, [1, 4, 8, 4])
    _, t = ad.jvp(lambda x: anp.take(x, [1, 4, 8, 4]), (np.linspace(0, 1, 10),), (np.arange(10.0),))
    np.testing.assert_array_equal(t, [1, 4, 8, 4])


# --------------------------------------------------------------------------------------------
# CA-ARR-3, CA-ARR-4: scatter_add and overwrite scatter

W5 = np.array([1.0, 10.0, 100.0, 1000.0, 10000.0])


def test_ca_arr_3_scatter_add():
    t = ad.Array(np.zeros(5), requires_grad=True)
    v = ad.Array([1.0, 2.0, 3.0], requires_grad=True)
    y = anp.scatter_add(t, [0, 2, 0], v)
    np.testing.assert_array_equal(y.value, [4, 0, 2, 0, 0])
    # plain inputs (lists, a scalar broadcast to every write) give the same values
    np.testing.assert_array_equal(anp.scatter_add(np.zeros(5), [0, 2, 0], [1.0, 2.0, 3.0]), y.value)
    np.testing.assert_array_equal(anp.scatter_add(np.zeros(5), [0, 2, 0], 1.0), [2, 0, 1, 0, 0])
    ad.backward(anp.sum(y * W5))
    np.testing.assert_array_equal(v.grad, [1, 100, 1])
    np.testing.assert_array_equal(t.grad, W5)
    # forward mode: the tangents are scattered the same way
    _, ty = ad.jvp(lambda tt, vv: anp.scatter_add(tt, [0, 2, 0], vv),
                   (np.zeros(5), np.array([1.0, 2.0, 3.0])),
                   (np.arange(5.0), np.array([10.0, 20.0, 30.0])))
    np.testing.assert_array_equal(ty, [40, 1, 22, 3, 4])


def test_ca_arr_4_scatter_overwrite_masks_target():
    t = ad.Array([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    v = ad.Array([9.0], requires_grad=True)
    y = anp.scatter(t, [2], v)
    np.testing.assert_array_equal(y.value, [1, 2, 9, 4])
    ad.backward(anp.sum(y * np.array([1.0, 2.0, 3.0, 4.0])))
    np.testing.assert_array_equal(t.grad, [1, 2, 0, 4])
    np.testing.assert_array_equal(v.grad, [3])


def test_ca_arr_4_scatter_duplicates_last_writer_wins():
    w = np.array([1.0, 2.0, 3.0, 4.0])
    t = ad.Array([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    v = ad.Array([7.0, 8.0, 9.0], requires_grad=True)
    y = anp.scatter(t, [2, 0, 2], v)
    np.testing.assert_array_equal(y.value, [8, 2, 9, 4])  # v[2] wrote last at index 2
    ad.backward(anp.sum(y * w))
    np.testing.assert_array_equal(v.grad, [0, 1, 3])  # the overwritten write gets nothing
    np.testing.assert_array_equal(t.grad, [0, 2, 0, 4])
    # forward mode: only the surviving write carries its tangent
    tangents = (np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0]))
    _, ty = ad.jvp(lambda tt, vv: anp.scatter(tt, [2, 0, 2], vv), (t.value, v.value), tangents)
    np.testing.assert_array_equal(ty, [20, 2, 30, 4])


# --------------------------------------------------------------------------------------------
# CA-ARR-5, CA-ARR-6: Halide's convolution and upsampling through gathers


def test_ca_arr_5_convolution_adjoint_is_correlation():
    inp = ad.Array([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    ker = ad.Array([1.0, 10.0, 100.0], requires_grad=True)
    xs, rs = np.arange(2, 5), np.arange(3)
    idx = xs[:, None] - rs[None, :]  # input(x - r) for x in [2, 4], r in [0, 2]
    out = anp.sum(anp.take(inp, idx) * ker, axis=1)
    np.testing.assert_array_equal(out.value, [123, 234, 345])
    ad.backward(anp.sum(out))
    np.testing.assert_array_equal(inp.grad, [100, 110, 111, 11, 1])
    np.testing.assert_array_equal(ker.grad, [12, 9, 6])


def test_ca_arr_6_upsample():
    inp = ad.Array([3.0, 5.0], requires_grad=True)
    out = anp.take(inp, np.arange(8) // 4)
    np.testing.assert_array_equal(out.value, [3, 3, 3, 3, 5, 5, 5, 5])
    ad.backward(anp.sum(out * np.arange(8.0)))
    np.testing.assert_array_equal(inp.grad, [6, 22])


# --------------------------------------------------------------------------------------------
# CA-ARR-11, CA-ARR-12: broadcast <-> reduce, and a large scatter_add


def test_ca_arr_11_broadcast_parameter_gets_summed_gradient():
    n = 100_000
    u = np.random.default_rng(4).standard_normal(n)
    # implicit broadcast (0-d parameter times lanes) and the explicit broadcast_to primitive
    for make in (lambda p: p * u, lambda p: anp.broadcast_to(p, (n,)) * u):
        p = ad.Array(1.5, requires_grad=True)
        ad.backward(anp.sum(make(p)))
        assert p.grad.shape == ()
        # pairwise (numpy) vs the engine's reduction order over 1e5 terms: 1e-12 relative
        assert float(p.grad) == pytest.approx(float(np.sum(u)), rel=1e-12, abs=1e-12)


def test_ca_arr_12_scatter_add_million_lanes_matches_add_at():
    rng = np.random.default_rng(12)
    n, bins = 1_000_000, 1_000
    idx = rng.integers(0, bins, n)
    vals = rng.standard_normal(n)
    t = ad.Array(np.zeros(bins), requires_grad=True)
    v = ad.Array(vals, requires_grad=True)
    y = anp.scatter_add(t, idx, v)
    ref = np.zeros(bins)
    np.add.at(ref, idx, vals)
    # the same values summed in possibly different orders (about 1000 terms per bin):
    # 1e-9 relative of the bin magnitude, as the spec asks
    np.testing.assert_allclose(y.value, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    g = rng.standard_normal(bins)
    ad.backward(y, g)
    np.testing.assert_array_equal(v.grad, g[idx])  # the backward pass is a gather: exact
    np.testing.assert_array_equal(t.grad, g)


# --------------------------------------------------------------------------------------------
# errors


def _x(n=5, name=None):
    x = ad.Array(np.arange(float(n)), requires_grad=True)
    return ad.label(x, name) if name else x


OPS = {
    "take": lambda x, idx: anp.take(x, idx),
    "scatter_add": lambda x, idx: anp.scatter_add(x, idx, np.ones(len(idx))),
    "scatter": lambda x, idx: anp.scatter(x, idx, np.ones(len(idx))),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("bad", [5, 17, -1, -6])
def test_out_of_range_and_negative_indices_raise(op, bad):
    with pytest.raises(IndexError) as e:
        OPS[op](_x(), [0, bad, 1])
    msg = str(e.value)
    assert op in msg and f"index {bad} " in msg and "size 5" in msg


@pytest.mark.parametrize("op", sorted(OPS))
def test_index_error_names_the_labelled_array(op):
    with pytest.raises(IndexError, match=r"index 9 .*'verts'"):
        OPS[op](_x(name="verts"), [2, 9])
    # also on plain numpy inputs (no label there), the index is still named
    with pytest.raises(IndexError, match=r"index -2 "):
        OPS[op](np.zeros(4), [1, -2])


@pytest.mark.parametrize("op", sorted(OPS))
def test_float_indices_raise_type_error(op):
    with pytest.raises(TypeError, match=r"integer.*float64"):
        OPS[op](_x(), np.array([0.0, 2.0]))


@pytest.mark.parametrize("op", ["scatter_add", "scatter"])
@pytest.mark.parametrize("traced_values", [False, True], ids=["numpy_values", "traced_values"])
def test_scatter_values_shape_mismatch_raises_value_error(op, traced_values):
    fn = getattr(anp, op)
    values = np.ones((3, 2))
    if traced_values:
        values = ad.Array(values, requires_grad=True)
    with pytest.raises(ValueError, match=rf"{op}.*\(3, 2\).*\(2, 4\)"):
        fn(ad.Array(np.zeros((5, 4)), requires_grad=True), [1, 3], values)


def test_getitem_float_index_array_is_rejected():
    # numpy's own convention for x[float_array] is IndexError; the message names the dtype
    with pytest.raises(IndexError, match="float64"):
        _x()[np.array([0.0, 1.0])]
