"""``parallel`` at any loop level: a parallel loop inside serial ones (a channel loop outside
the rows, a producer computed per row of its consumer) has its body outlined and run on the
thread pool by core_ad's runtime, once per iteration of the loops around it; inside a loop
that already runs in parallel it runs serially. Results equal the serial schedule exactly
(pure loops write distinct points; atomic counts are integers)."""
from __future__ import annotations

import numpy as np
import pytest
from core_ad._codegen.llvm import builder

import halide_ad as hl

x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")


@pytest.fixture
def pool_loops(monkeypatch):
    """The extents of the parallel loops that compiled code hands to the thread pool."""
    extents = []
    run = builder.parallel_for

    def recording(fn, n, args, **kw):
        extents.append(n)
        return run(fn, n, args, **kw)

    monkeypatch.setattr(builder, "parallel_for", recording)
    return extents


def _shade(img, schedule):
    inp = hl.Buffer(img)
    f = hl.Func("shade")
    f[x, y, c] = hl.sin(inp[x, y, c]) * 2 + inp[x, y, c] * inp[x, y, c]
    schedule(f)
    return np.asarray(f.realize(list(img.shape[::-1])))


def test_parallel_rows_inside_the_channel_loop(pool_loops):
    img = np.random.default_rng(0).random((3, 37, 45)).astype(np.float32)
    want = _shade(img, lambda f: f.vectorize(x, 8))  # the same vector code, serially
    got = _shade(img, lambda f: f.vectorize(x, 8).parallel(y))
    np.testing.assert_array_equal(got, want)
    assert pool_loops == [37, 37, 37]  # one pool run per channel, over the rows


def test_parallel_tiles_inside_a_serial_loop(pool_loops):
    img = np.random.default_rng(1).random((2, 50, 70))
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    tile = hl.Var("tile")

    def tiled(f):
        f.tile(x, y, xo, yo, xi, yi, 16, 16).fuse(xo, yo, tile).parallel(tile)

    np.testing.assert_array_equal(_shade(img, tiled), _shade(img, lambda f: None))
    assert pool_loops == [5 * 4, 5 * 4]  # ceil(70/16) x ceil(50/16) tiles per channel


def test_producer_computed_per_row_runs_its_columns_in_parallel(pool_loops):
    img = np.random.default_rng(2).random((40, 300)).astype(np.float32)
    inp = hl.BoundaryConditions.repeat_edge(hl.Buffer(img))
    blur_x, out = hl.Func("blur_x"), hl.Func("out")
    blur_x[x, y] = inp[x - 1, y] + inp[x, y] + inp[x + 1, y]
    out[x, y] = blur_x[x, y - 1] + blur_x[x, y] + blur_x[x, y + 1]
    xo, xi = hl.Var("xo"), hl.Var("xi")
    blur_x.compute_at(out, y).split(x, xo, xi, 64).parallel(xo)
    got = np.asarray(out.realize([300, 40]))
    p = np.pad(img.astype(np.float64), 1, mode="edge")
    bx = p[:, :-2] + p[:, 1:-1] + p[:, 2:]
    want = bx[:-2] + bx[1:-1] + bx[2:]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # ceil(300/64) column strips, for each of the 3 rows of blur_x each of the 40 rows reads
    assert pool_loops == [5] * (3 * 40)


def test_atomic_reduction_loop_inside_a_pure_loop(pool_loops):
    """Per-channel histograms: the rows of the RDom in parallel inside the channel loop, the
    counts atomic additions."""
    img = np.random.default_rng(3).random((3, 61, 53)).astype(np.float32)
    inp = hl.Buffer(img)
    r = hl.RDom([(0, 53), (0, 61)])
    hist = hl.Func("hist")
    hist[x, c] = 0
    hist[hl.clamp(hl.i32(inp[r.x, r.y, c] * 16), 0, 15), c] += 1
    hist.update(0).atomic().parallel(r.y)
    p = hl.Pipeline(hist)
    assert "atomicrmw add" in p.ir()
    want = np.stack([np.bincount(np.clip((img[k] * 16).astype(int), 0, 15).ravel(),
                                 minlength=16) for k in range(3)])  # [c, bin]
    for _ in range(3):  # threads interleave differently each time
        np.testing.assert_array_equal(np.asarray(p.realize([16, 3])), want)
    assert pool_loops == [61] * 3 * 3  # the rows, per channel, per realize


def test_parallel_inside_a_parallel_loop_runs_serially(pool_loops):
    img = np.random.default_rng(4).random((4, 20, 24)).astype(np.float32)
    want = _shade(img, lambda f: None)
    got = _shade(img, lambda f: f.parallel(c).parallel(y))
    np.testing.assert_array_equal(got, want)
    assert pool_loops == []  # the outermost loop runs on the pool from Python; y inside it
