"""The caching allocator of kernel outputs (``core_ad.codegen.host_empty``): large blocks are
reused once every view of them is gone, never while one is alive; sizes share blocks by size
class; the cache stays under its cap and can be emptied; kernel outputs come from it."""

import gc

import numpy as np
import pytest

from core_ad import codegen, sym
from core_ad._codegen import host_pool

N = 1 << 17  # 1 MiB of float64: pooled


@pytest.fixture(autouse=True)
def _empty_pool():
    codegen.empty_host_cache()
    yield
    codegen.empty_host_cache()


def test_pooled_arrays_are_aligned_writable_and_of_the_asked_shape():
    a = codegen.host_empty(N, np.float32)
    assert a.shape == (N,) and a.dtype == np.float32 and a.flags.writeable
    assert a.ctypes.data % 64 == 0
    a[:] = 3.0
    assert float(a.sum()) == 3.0 * N
    z = codegen.host_zeros(N, np.float64)
    assert not z.any()


def test_small_arrays_are_plain_numpy():
    a = codegen.host_empty(100, np.float64)
    assert a.flags.owndata


def test_a_released_block_is_reused_and_a_viewed_one_is_not():
    # earlier tests' garbage cycles (torch tensors over pooled arrays) are released first:
    # else the gc.collect() below frees them after ``a`` and the pool hands out theirs
    gc.collect()
    a = codegen.host_empty(N, np.float64)
    addr = a.ctypes.data
    del a
    gc.collect()
    b = codegen.host_empty(N - 7, np.float64)  # same size class
    assert b.ctypes.data == addr
    view = b[10:20]
    view[:] = 1.5
    del b
    c = codegen.host_empty(N, np.float64)  # the view still holds b's block
    assert c.ctypes.data != addr
    c[:] = -1.0
    np.testing.assert_array_equal(view, 1.5)
    stats = codegen.host_cache_stats()
    assert stats["reused"] >= 1


def test_size_classes_round_up_by_at_most_an_eighth():
    for n in (1 << 18, (1 << 18) + 1, 300_000, 8_000_000, 8_388_609, 12_345_678):
        c = host_pool._size_class(n)
        assert n <= c <= n * 1.125


def test_the_free_cache_stays_under_its_cap_and_empties(monkeypatch):
    monkeypatch.setattr(host_pool, "CAP_BYTES", 3 * N * 8)
    arrays = [codegen.host_empty(N, np.float64) for _ in range(6)]
    del arrays
    gc.collect()
    assert 0 < codegen.host_cache_stats()["free_bytes"] <= 3 * N * 8
    assert codegen.empty_host_cache() > 0
    assert codegen.host_cache_stats()["free_bytes"] == 0


def test_compiled_kernel_outputs_reuse_pooled_blocks():
    x = sym.var("x")
    fn = sym.compile([sym.sin(x) * x], [x])
    xs = np.linspace(-1.0, 1.0, N)
    (first,) = fn(xs)
    np.testing.assert_allclose(first, np.sin(xs) * xs, rtol=1e-14)
    del first
    # garbage from earlier tests (lazy arrays in cycles) is freed first, so the count below
    # moves for this call alone; at least this output is reused (the lazy mode may take
    # further pooled blocks for its own temporaries)
    gc.collect()
    reused = codegen.host_cache_stats()["reused"]
    (second,) = fn(xs)
    assert codegen.host_cache_stats()["reused"] >= reused + 1
    np.testing.assert_allclose(second, np.sin(xs) * xs, rtol=1e-14)
