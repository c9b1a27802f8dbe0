"""Schedule invariance: one algorithm under many random legal schedules gives the same
numbers (the Halide guarantee the AD relies on, docs/design/halide-ad.md §1). Integer pipelines must be
bit-identical; the float pipeline uses only exact operations (adds of small integers in
float32), so it must be bit-identical too."""

import halide_ad as hl
import numpy as np
import pytest

x, y = hl.Var("x"), hl.Var("y")


def _pipeline(img):
    inp = hl.Buffer(img)
    c = hl.BoundaryConditions.repeat_edge(inp)
    a, b, out = hl.Func("a"), hl.Func("b"), hl.Func("out")
    a[x, y] = c[x - 1, y] + 2 * c[x, y] + c[x + 1, y]
    b[x, y] = a[x, y - 1] + 2 * a[x, y] + a[x, y + 1]
    r = hl.RDom([(-1, 3)])
    out[x, y] = b[x, y]
    out[x, y] += b[x + r.x, y] * (r.x + 2)
    return a, b, out


def _reference(img):
    w = img.shape[1]
    p = np.pad(img, 2, mode="edge").astype(np.float64)  # x in [-2, w+1], y in [-2, h+1]
    a = p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]  # x in [-1, w]
    b = a[:-2] + 2 * a[1:-1] + a[2:]  # y in [-1, h]
    b = b[1:-1]
    return b[:, 1:-1] + sum(b[:, 1 + k:1 + k + w] * (k + 2) for k in (-1, 0, 1))


def _random_schedule(rng, a, b, out):
    xi, yi, yo = hl.Var("xi"), hl.Var("yi"), hl.Var("yo")
    choice = rng.integers(0, 4)
    if choice == 1:
        out.tile(x, y, xi, yi, int(rng.choice([4, 8, 16])), int(rng.choice([2, 4, 8])))
        if rng.random() < 0.6:
            out.vectorize(xi, int(rng.choice([4, 8])))
        if rng.random() < 0.6:
            out.parallel(y)
    elif choice == 2:
        out.split(y, yo, yi, int(rng.choice([3, 4, 7]))).parallel(yo)
        out.vectorize(x, 8)
    elif choice == 3:
        out.reorder(y, x)
        if rng.random() < 0.5:
            out.unroll(x, 2)
    if rng.random() < 0.5:
        out.update(0).vectorize(x, int(rng.choice([4, 8])))
    if rng.random() < 0.4:
        out.update(0).parallel(y)
    for f in (a, b):
        k = rng.integers(0, 4)
        if k == 1:
            f.compute_root()
            if rng.random() < 0.5:
                f.vectorize(x, 8).parallel(y)
        elif k == 2 and choice == 1:
            f.compute_at(out, x)
            if rng.random() < 0.5:
                f.vectorize(x, 4)
        elif k == 3:
            f.compute_root().split(y, yo, yi, 5).parallel(yo)
    if choice == 1 and rng.random() < 0.5 and a.compute_level is None:
        a.compute_at(out, y).store_at(out, y)
    for f in (a, b):  # a column-major layout, at the root or inside out's loops
        if f.compute_level is not None and rng.random() < 0.4:
            f.reorder_storage(y, x)


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_agree(seed):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 8, (23, 37)).astype(np.float32)
    want = _reference(img)
    a, b, out = _pipeline(img)
    _random_schedule(rng, a, b, out)
    got = np.asarray(out.realize([37, 23]))
    np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=out.loop_nest())


def test_fuse_and_store_at():
    img = np.arange(30 * 20, dtype=np.int32).reshape(20, 30)
    inp = hl.Buffer(img)
    g, f = hl.Func("g"), hl.Func("f")
    g[x, y] = inp[x, y] * 2
    f[x, y] = g[x, y] + 1
    fused = hl.Var("fused")
    f.fuse(x, y, fused).parallel(fused)
    np.testing.assert_array_equal(np.asarray(f.realize([30, 20])), img * 2 + 1)


def test_compute_at_inner_tile_with_store_at_outer_row():
    img = np.random.default_rng(3).integers(0, 100, (17, 29)).astype(np.int32)
    inp = hl.Buffer(img)
    c = hl.BoundaryConditions.repeat_edge(inp)
    g, f = hl.Func("g"), hl.Func("f")
    xi = hl.Var("xi")
    g[x, y] = c[x, y] * 3
    f[x, y] = g[x - 1, y] + g[x + 1, y]
    f.split(x, x, xi, 8)
    g.compute_at(f, x).store_at(f, y)
    p = np.pad(img, ((0, 0), (1, 1)), mode="edge") * 3
    np.testing.assert_array_equal(np.asarray(f.realize([29, 17])), p[:, :-2] + p[:, 2:])


def test_reorder_storage_lays_out_channels_innermost():
    """A 3-D intermediate stored channels-first (``reorder_storage(c, x, y)``) and vectorised
    along them (dense stores in that layout), at the root and inside its consumer's rows,
    gives the same values as the default layout."""
    c = hl.Var("c")
    img = np.random.default_rng(3).integers(0, 8, (5, 37, 29)).astype(np.float32)
    im = hl.Buffer(img)
    want = None
    for layout in ("default", "root", "compute_at"):
        g, out = hl.Func("g"), hl.Func("out")
        g[x, y, c] = im[x, y, c] * 2 + c
        out[x, y, c] = g[x, y, c] + g[x, y, (c + 1) % 5]
        if layout == "root":
            g.compute_root().reorder_storage(c, x, y).vectorize(c, 4)
        elif layout == "compute_at":
            g.compute_at(out, y).reorder_storage(c, x, y)
        got = np.asarray(out.realize([29, 37, 5])).copy()
        if want is None:
            want = got
        np.testing.assert_array_equal(got, want, err_msg=layout)
