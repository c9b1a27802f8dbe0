"""Sliding windows: a Func stored outside the loop it is computed in (``store_root()`` or
``store_at`` an outer loop) computes, after the first iteration, only the part of its region
the previous iterations did not (Halide's sliding window optimisation; issue item 5). Results
equal the compute_root schedule exactly; ``loop_nest()`` says where a window slides."""
from __future__ import annotations

import numpy as np

import halide_ad as hl

x, y = hl.Var("x"), hl.Var("y")
yo, yi = hl.Var("yo"), hl.Var("yi")


def _blur(img, schedule):
    inp = hl.BoundaryConditions.repeat_edge(hl.Buffer(img))
    bx, by = hl.Func("bx"), hl.Func("by")
    bx[x, y] = hl.sin(inp[x - 1, y]) + hl.sin(inp[x, y]) + hl.sin(inp[x + 1, y])
    by[x, y] = bx[x, y - 1] + 2 * bx[x, y] + bx[x, y + 1]
    schedule(bx, by)
    return by


def _realize(by, img):
    return np.asarray(by.realize([img.shape[1], img.shape[0]]))


IMG = np.random.default_rng(0).random((37, 29)).astype(np.float32)
WANT = _realize(_blur(IMG, lambda bx, by: bx.compute_root()), IMG)


def _sliding(by):
    return "sliding window over" in hl.Pipeline(by).loop_nest()


def test_store_root_compute_at_rows_slides():
    by = _blur(IMG, lambda bx, by: bx.store_root().compute_at(by, y))
    assert _sliding(by)
    np.testing.assert_array_equal(_realize(by, IMG), WANT)


def test_store_at_the_outer_loop_of_a_split_slides_within_each_strip():
    def schedule(bx, by):
        by.split(y, yo, yi, 8)
        bx.store_at(by, yo).compute_at(by, yi)

    by = _blur(IMG, schedule)
    assert _sliding(by)
    np.testing.assert_array_equal(_realize(by, IMG), WANT)


def test_window_over_strips_of_rows():
    """Computed per strip of 5 rows: each strip computes the 5 rows it has not yet (the
    window moves by the split factor), the last strip clipped by the image."""
    def schedule(bx, by):
        by.split(y, yo, yi, 5)
        bx.store_root().compute_at(by, yo).vectorize(x, 8)

    by = _blur(IMG, schedule)
    assert _sliding(by)
    # vector sin differs from scalar sin in the last bits: compare with the same vectors
    want = _realize(_blur(IMG, lambda bx, by: bx.compute_root().vectorize(x, 8)), IMG)
    np.testing.assert_array_equal(_realize(by, IMG), want)


def test_no_window_when_stored_where_computed_or_the_loop_is_parallel():
    for schedule in (lambda bx, by: bx.compute_at(by, y),
                     lambda bx, by: (by.parallel(y), bx.store_root().compute_at(by, y))):
        by = _blur(IMG, schedule)
        assert not _sliding(by)
        np.testing.assert_array_equal(_realize(by, IMG), WANT)


def test_no_window_for_an_update_writing_other_rows():
    """An update that scatters into rows (not at its pure y) would add to the rows kept
    from the previous iteration a second time: such a Func is recomputed whole."""
    img = np.random.default_rng(1).random((12, 10)).astype(np.float32)
    inp = hl.Buffer(img)
    r = hl.RDom([(0, 2)])
    f, g = hl.Func("f"), hl.Func("g")
    f[x, y] = inp[x, hl.clamp(y, 0, 11)]
    f[x, r.x + 3] += 1.0
    g[x, y] = f[x, y] + f[x, y + 1]
    want = np.asarray(g.realize([10, 11]))
    f.store_root().compute_at(g, y)
    assert "sliding window over" not in hl.Pipeline(g).loop_nest()
    np.testing.assert_array_equal(np.asarray(g.realize([10, 11])), want)
