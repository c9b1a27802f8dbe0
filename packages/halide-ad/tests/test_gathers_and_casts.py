"""Code generation of data-dependent vector reads and float to int casts (docs/design/halide-ad.md,
"CPU code generation"): a vector read at coordinates that depend on the data is one
``llvm.masked.gather``, and a float to int cast whose operand has constant bounds inside the
int range is a plain conversion with NaN sent to 0 -- the values of the saturating one."""

import halide_ad as hl
import numpy as np
import pytest

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8, np.bool_])
def test_vector_gather_at_data_dependent_coordinates_matches_numpy(dtype):
    """``g(x) = table(idx(x))`` over 8-wide vectors with a scalar tail (61 points)."""
    table = (RNG.uniform(0, 100, 37) if dtype != np.bool_ else RNG.uniform(0, 1, 37) > 0.5)
    table = table.astype(dtype)
    idx = RNG.integers(-5, 45, 61).astype(np.int32)  # clamped into the table below
    x = hl.Var("x")
    t, i = hl.Buffer(table, name="table"), hl.Buffer(idx, name="idx")
    g = hl.Func("g")
    g[x] = t[hl.clamp(i[x], 0, 36)]
    g.vectorize(x, 8)
    np.testing.assert_array_equal(np.asarray(g.realize([61])), table[np.clip(idx, 0, 36)])
    assert "llvm.masked.gather" in hl.Pipeline(g).ir()


def test_gather_taps_at_offsets_and_dense_interior_match_numpy():
    """Taps at constant offsets of one data-dependent coordinate share its lane addresses;
    ``clamp(x + 1, ...)`` reads are dense inside and gathered at the edges (run-time test)."""
    a = RNG.standard_normal((9, 50)).astype(np.float32)
    zi = RNG.integers(0, 7, (9, 50)).astype(np.int32)
    x, y = hl.Var("x"), hl.Var("y")
    A, Z = hl.Buffer(a, name="a"), hl.Buffer(zi, name="zi")
    g = hl.Func("g")
    z = hl.clamp(Z[x, y], 0, 6)
    g[x, y] = A[x, z] + 2 * A[x, z + 1] + A[hl.clamp(x + 1, 0, 49), y]
    g.vectorize(x, 8)
    xs = np.arange(50)
    want = a[zi, xs] + 2 * a[zi + 1, xs] + a[:, np.clip(xs + 1, 0, 49)]
    # float32 sums of three taps in another order than numpy's: an ulp of the largest tap
    np.testing.assert_allclose(np.asarray(g.realize([50, 9])), want, rtol=1e-6,
                               atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("vectorize", [False, True])
def test_bounded_float_to_int_cast_is_a_plain_conversion_with_nan_as_zero(vectorize):
    """A bilateral grid's bin index ``int(clamp(v, 0, 1) * 10 + 0.5)``: the same values as the
    saturating cast (NaN to 0, infinities clamped first), without ``fptosi.sat``."""
    v = np.array([0.0, 0.26, 0.5, 0.94, 0.95, 1.0, np.nan, -np.inf, np.inf, -3.0, 7.0,
                  0.049, 0.05, 1e-30, -0.0, 0.61], dtype=np.float32)
    x = hl.Var("x")
    im = hl.Buffer(v, name="v")
    f = hl.Func("f")
    f[x] = hl.i32(hl.clamp(im[x], hl.f32(0), hl.f32(1)) * hl.f32(10) + hl.f32(0.5))
    if vectorize:
        f.vectorize(x, 8)
    c = np.clip(np.nan_to_num(v, nan=0.0), 0, 1)  # the emitted clamp sends NaN to a bound
    want = (c * np.float32(10) + np.float32(0.5)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(f.realize([16])), want)
    ir = hl.Pipeline(f).ir()
    assert "fptosi.sat" not in ir and "fcmp uno" in ir


def test_unbounded_float_to_int_cast_keeps_saturating():
    """Without provable bounds the cast saturates: out of range to INT_MIN / INT_MAX, NaN
    to 0 (never LLVM poison)."""
    v = np.array([1.5, -2.5, 3e9, -3e9, np.nan, np.inf, -np.inf, 2147483520.0],
                 dtype=np.float32)
    x = hl.Var("x")
    im = hl.Buffer(v, name="v")
    f = hl.Func("f")
    f[x] = hl.i32(im[x] * hl.f32(1))
    want = np.array([1, -2, 2**31 - 1, -2**31, 0, 2**31 - 1, -2**31, 2147483520],
                    dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(f.realize([8])), want)
    assert "fptosi.sat" in hl.Pipeline(f).ir()


@pytest.mark.parametrize("channels", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("parallel", [False, True])
def test_unrolled_channel_scatter_matches_numpy_for_any_channel_count(channels, parallel):
    """A histogram computed per row of its consumer, its channel loop innermost and
    ``unroll(c, 2)`` (the bilateral grid's schedule): the channel count equal to the factor
    runs one straight tile, other counts the tiles and a guarded tail."""
    h, w, nb = 6, 40, 5
    img = RNG.uniform(0, 1, (h, w)).astype(np.float32)
    x, y, z, c = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("c")
    im = hl.Buffer(img, name="img")
    r = hl.RDom([hl.Range(0, 4)], name="r")
    val = hl.clamp(im[x * 4 + r.x, y], hl.f32(0), hl.f32(1))
    hist = hl.Func("hist")
    hist[x, y, z, c] = hl.f32(0)
    hist[x, y, hl.i32(val * hl.f32(nb - 1) + hl.f32(0.5)), c] += \
        hl.select(c == 0, val, hl.f32(1)) * hl.f32(1 + c)
    out = hl.Func("out")
    out[x, y, z, c] = hist[x, y, z, c] * hl.f32(2)
    out.reorder(c, z, x, y)
    if parallel:
        out.parallel(y)
    hist.compute_at(out, y)
    hist.update(0).reorder(c, r.x, x, y).unroll(c, 2)
    got = np.asarray(out.realize([w // 4, h, nb, channels]))
    want = np.zeros((channels, nb, h, w // 4))
    bins = (img * np.float32(nb - 1) + np.float32(0.5)).astype(int)
    for cc in range(channels):
        for yy in range(h):
            for xx in range(w):
                add = img[yy, xx] if cc == 0 else 1.0
                want[cc, bins[yy, xx], yy, xx // 4] += 2 * add * (1 + cc)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("extent", [6, 8, 12, 16])
def test_vector_split_whose_extent_is_one_tile_matches_numpy(extent):
    x, y = hl.Var("x"), hl.Var("y")
    a = RNG.standard_normal((5, extent)).astype(np.float32)
    A = hl.Buffer(a, name="a")
    f = hl.Func("f")
    f[x, y] = A[x, y] * 3 + 1
    f.vectorize(x, 8)
    np.testing.assert_allclose(np.asarray(f.realize([extent, 5])), a * 3 + 1, rtol=1e-6)
