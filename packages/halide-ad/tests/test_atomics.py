"""``f.update(i).atomic()``: reduction dimensions run in parallel on the CPU with atomic
additions (``atomicrmw``), as Halide's ``atomic()`` (spec item 5: CPU float atomics). Each
result is compared with the same update run serially; integer counts exactly, float sums to
rounding (the additions land in any order)."""
from __future__ import annotations

import numpy as np
import pytest

import halide_ad as hl

x, c = hl.Var("x"), hl.Var("c")


def _parallel_over_rows(f, r):
    f.update(0).atomic().parallel(r.y)


def test_parallel_scatter_with_atomics_equals_serial(histograms):
    img = np.random.default_rng(0).random((301, 257)).astype(np.float32)
    p = hl.Pipeline(list(histograms(img, 13, _parallel_over_rows)))
    assert "atomicrmw add" in p.ir() and "atomicrmw fadd" in p.ir()
    want_c, want_w = map(np.asarray, hl.Pipeline(list(histograms(img, 13))).realize(
        [[13], [13]]))
    for _ in range(3):  # threads interleave differently each time
        count, weight = map(np.asarray, p.realize([[13], [13]]))
        np.testing.assert_array_equal(count, want_c)
        np.testing.assert_allclose(weight, want_w, rtol=1e-12, atol=1e-9)
    assert count.sum() == img.size


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_atomic_scatter_of_vectors(dtype):
    """A vectorised pure dimension (4 channels) inside a parallel reduction loop: each lane
    an atomic addition; a partial vector (3 channels) runs its scalar tail."""
    rng = np.random.default_rng(1)
    for channels in (4, 3):
        img = rng.random((channels, 64, 96)).astype(dtype)
        lum = rng.random((64, 96)).astype(dtype)
        results = []
        for parallel in (True, False):
            inp, key = hl.Buffer(img), hl.Buffer(lum)
            r = hl.RDom([(0, 96), (0, 64)])
            hist = hl.Func("hist")
            hist[c, x] = hl.cast(hl.Float(8 * np.dtype(dtype).itemsize), 0)
            b = hl.clamp(hl.i32(key[r.x, r.y] * 5), 0, 4)
            hist[c, b] += inp[r.x, r.y, c]
            if parallel:
                st = hist.update(0).atomic().reorder(c, r.x, r.y)
                st.vectorize(c, 4).parallel(r.y)
            results.append(np.asarray(hist.realize([channels, 5])))
        np.testing.assert_allclose(results[0], results[1],
                                   rtol=1e-5 if dtype == np.float32 else 1e-12)
        want = np.stack([np.bincount(np.clip((lum * 5).astype(int), 0, 4).ravel(),
                                     weights=img[k].ravel(), minlength=5)
                         for k in range(channels)], axis=1)
        np.testing.assert_allclose(results[0], want, rtol=1e-4 if dtype == np.float32 else 1e-10)


def test_atomic_parallel_of_an_overwriting_update_is_refused(max_per_bin):
    top, r = max_per_bin(np.random.default_rng(2).random((16, 16)).astype(np.float32), 4)
    top.update(0).atomic().parallel(r.y)
    with pytest.raises(hl.ScheduleError, match=r"top: iterations of the parallel loop over .* only an"
                                              r" update adding to top where it writes"):
        hl.Pipeline(top).ir()


def test_atomic_needs_an_update_and_parallel_rvars_need_atomic():
    f = hl.Func("f")
    r = hl.RDom([(0, 10)])
    f[x] = 0
    f[x] += r.x
    with pytest.raises(hl.ScheduleError, match=r"atomic\(\) applies to an update"):
        f.atomic()
    with pytest.raises(hl.ScheduleError, match=r"cannot parallelize the reduction dimension.*"
                                              r"atomic\(\) first"):
        f.update(0).parallel(r.x)
