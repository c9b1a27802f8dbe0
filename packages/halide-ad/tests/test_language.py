"""The language: types and coercion, Halide's integer division, select, Tuples, Params,
RDoms with predicates, update rules, multi-output Pipelines, realize into Buffers, and the
compile cache."""

import halide_ad as hl
import numpy as np
import pytest

x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")


def test_numpy_axes_are_reversed():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)  # h=3, w=4
    b = hl.Buffer(a)
    assert (b.width(), b.height()) == (4, 3)
    assert b[1, 2] == a[2, 1]
    f = hl.Func("f")
    f[x, y] = b[x, y] + hl.f32(10) * hl.f32(y)
    out = np.asarray(f.realize([4, 3]))
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, a + 10 * np.arange(3)[:, None])


def test_type_coercion_rules():
    xf = hl.f32(x)
    assert (x + 1).type() == hl.Int(32)
    assert (x + 1.5).type() == hl.Float(32)  # float literal with an int: Float(32)
    assert (xf + 1).type() == hl.Float(32)
    assert (hl.f64(x) + xf).type() == hl.Float(64)
    assert (hl.u8(x) + hl.i32(x)).type() == hl.Int(32)
    assert (hl.u8(x) + 1).type() == hl.UInt(8)  # literals take the other operand's type
    assert (x < 3).type() == hl.Bool()
    with pytest.raises(hl.ExprError, match="truth value"):
        bool(x < 3)


def test_integer_division_and_modulo_round_toward_minus_infinity():
    f = hl.Func("f")
    f[x] = hl.Tuple((x - 8) / 3, (x - 8) % 3, (x - 8) / -3, (x - 8) % -3)
    q, r, qn, rn = (np.asarray(b) for b in f.realize([17]))
    v = np.arange(17) - 8
    np.testing.assert_array_equal(q, v // 3)
    np.testing.assert_array_equal(r, v % 3)
    np.testing.assert_array_equal(qn, v // -3)
    np.testing.assert_array_equal(rn, v % -3)


def test_float_modulo_and_math():
    f = hl.Func("f")
    v = hl.f32(x) * 0.25 - 2.0
    f[x] = hl.Tuple(v % 1.5, hl.floor(v), hl.exp(v), hl.lerp(hl.f32(0), hl.f32(2), 0.25))
    m, fl, ex, le = (np.asarray(b) for b in f.realize([16]))
    vv = np.arange(16, dtype=np.float32) * 0.25 - 2.0
    np.testing.assert_allclose(m, np.mod(vv, np.float32(1.5)), rtol=1e-6)
    np.testing.assert_array_equal(fl, np.floor(vv))
    np.testing.assert_allclose(ex, np.exp(vv), rtol=4e-7)
    np.testing.assert_array_equal(le, np.full(16, 0.5, np.float32))


def test_multiway_select_and_logic():
    f = hl.Func("f")
    f[x] = hl.select(x < 3, 0, (x < 6) & ~(x == 4), 1, 2)
    np.testing.assert_array_equal(np.asarray(f.realize([8])), [0, 0, 0, 1, 2, 1, 2, 2])


def test_tuple_func_and_component_calls():
    f, g = hl.Func("f"), hl.Func("g")
    f[x] = (x * 2, hl.f32(x) / 2)
    g[x] = hl.f32(f[x][0]) + f[x][1]
    np.testing.assert_allclose(np.asarray(g.realize([5])), 2.5 * np.arange(5))
    with pytest.raises(hl.FuncError, match="Tuple"):
        hl.Func("h")[x] = f[x] + 1


def test_params_change_without_recompiling():
    g = hl.Param(hl.Float(32), "g", 2.0)
    f = hl.Func("f")
    f[x] = hl.pow(hl.f32(x), g)
    p = hl.Pipeline(f)
    np.testing.assert_allclose(np.asarray(p.realize([4])), np.arange(4.0) ** 2)
    compiled = p._compiled
    g.set(3.0)
    np.testing.assert_allclose(np.asarray(p.realize([4])), np.arange(4.0) ** 3)
    np.asarray(p.realize([9]))  # another size: same code
    assert p._compiled is compiled


def test_realize_again_compiles_nothing():
    f = hl.Func("f")
    f[x, y] = x + y
    p = hl.Pipeline(f)
    p.realize([8, 8])
    compiled = p._compiled
    out = p.realize([20, 3])
    assert p._compiled is compiled
    np.testing.assert_array_equal(np.asarray(out), np.add.outer(np.arange(3), np.arange(20)))
    f.vectorize(x, 4)  # a schedule change recompiles
    p.realize([8, 8])
    assert p._compiled is not compiled


def test_zero_dimensional_func_and_reduction():
    a = np.random.default_rng(0).random((7, 9))
    b = hl.Buffer(a)
    r = hl.RDom(b)
    s = hl.Func("s")
    s[()] = 0.0 * hl.f64(0)
    s[()] += b[r.x, r.y]
    assert np.asarray(s.realize([])).shape == ()
    np.testing.assert_allclose(float(np.asarray(s.realize([]))), a.sum(), rtol=1e-12)


def test_rdom_where_predicate():
    r = hl.RDom([(0, 10), (0, 10)])
    r.where(r.x * r.x + r.y * r.y < 25)
    cnt = hl.Func("cnt")
    cnt[()] = 0
    cnt[()] += r.x + 100 * r.y
    assert int(np.asarray(cnt.realize([]))) == sum(
        i + 100 * j for i in range(10) for j in range(10) if i * i + j * j < 25)


def test_update_at_data_dependent_coordinates_histogram():
    img = np.random.default_rng(1).integers(0, 16, (13, 11)).astype(np.uint8)
    b = hl.Buffer(img)
    r = hl.RDom(b)
    h = hl.Func("h")
    h[x] = 0
    h[hl.i32(b[r.x, r.y])] += 1
    np.testing.assert_array_equal(np.asarray(h.realize([256])),
                                  np.bincount(img.ravel(), minlength=256))


def test_recursive_update_scan():
    a = np.arange(1.0, 9.0)
    b = hl.Buffer(a)
    r = hl.RDom([(1, 7)])
    f = hl.Func("f")
    f[x] = b[x]
    f[r.x] = f[r.x - 1] + f[r.x]
    np.testing.assert_array_equal(np.asarray(f.realize([8])), np.cumsum(a))


def test_multi_output_pipeline_shares_producers():
    g, f1, f2 = hl.Func("g"), hl.Func("f1"), hl.Func("f2")
    g[x] = x * x
    g.compute_root()
    f1[x] = g[x] + 1
    f2[x] = g[x] * 2
    o1, o2 = hl.Pipeline([f1, f2]).realize([6])
    np.testing.assert_array_equal(np.asarray(o1), np.arange(6) ** 2 + 1)
    np.testing.assert_array_equal(np.asarray(o2), 2 * np.arange(6) ** 2)


def test_realize_into_a_given_buffer_and_strided_input():
    a = np.arange(60, dtype=np.float64).reshape(6, 10)[::2, 1::3]  # not contiguous in x
    b = hl.Buffer(a)
    f = hl.Func("f")
    f[x, y] = b[x, y] * 2
    out = hl.Buffer(hl.Float(64), [a.shape[1], a.shape[0]])
    f.realize(out)
    np.testing.assert_array_equal(np.asarray(out), a * 2)


def test_realize_into_views_writes_where_they_are():
    """Output Buffers are indexed with their own strides: a crop of a larger array (padded
    rows) is written in place and its surroundings are left alone; a Tuple whose values have
    different layouts is computed densely and copied into them."""
    f = hl.Func("f")
    f[x, y] = hl.f64(x) + 10 * y
    big = np.full((5, 12), -1.0)
    f.realize(hl.Buffer(big[:, 2:9]))
    np.testing.assert_array_equal(big[:, 2:9], np.add.outer(10.0 * np.arange(5), np.arange(7)))
    assert (big[:, :2] == -1).all() and (big[:, 9:] == -1).all()
    g = hl.Func("g")
    g[x, y] = hl.Tuple(hl.f64(x) * 2, hl.i32(y) * 3 + x)
    first, second = np.zeros((4, 6)), np.zeros((9, 6), np.int32)[::2][:4]
    hl.Pipeline([g]).realize([hl.Buffer(first), hl.Buffer(second)])
    np.testing.assert_array_equal(first, np.tile(2.0 * np.arange(6), (4, 1)))
    np.testing.assert_array_equal(second, np.add.outer(3 * np.arange(4), np.arange(6)))


def test_intermediate_storage_is_reused_across_realizes():
    """A root intermediate's storage is allocated by the first realize of given sizes and
    reused by the next ones (fresh large arrays would pay the kernel's page faults on every
    call); other sizes get storage of their own. Values are right either way."""
    import tracemalloc

    img = np.random.default_rng(1).random((256, 512))
    im = hl.Buffer(img)
    mid, out = hl.Func("mid"), hl.Func("out")
    mid[x, y] = im[x, y] * 2
    out[x, y] = mid[x, y] + 1
    mid.compute_root()
    p = hl.Pipeline(out)
    dst = np.empty_like(img)
    p.realize(hl.Buffer(dst))
    tracemalloc.start()
    try:
        p.realize(hl.Buffer(dst))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < img.nbytes // 4, peak  # mid (1 MiB) was not allocated again
    np.testing.assert_array_equal(dst, 2 * img + 1)
    small = np.asarray(p.realize([100, 30]))
    np.testing.assert_array_equal(small, 2 * img[:30, :100] + 1)
    p.realize(hl.Buffer(dst))
    np.testing.assert_array_equal(dst, 2 * img + 1)


def test_intermediate_storage_is_padded_away_from_4k_strides():
    """Root intermediates get outer strides that are not multiples of 4 KiB (columns and
    channels of power-of-two images would share one L1 set); results are unchanged."""
    from halide_ad._storage import ALIAS_BYTES, padded_empty

    a, b = padded_empty((3, 4, 1024), [np.float32, np.int64])
    assert a.shape == b.shape == (3, 4, 1024)
    assert all(st % ALIAS_BYTES for st in a.strides[:-1])
    assert [st // 4 for st in a.strides] == [st // 8 for st in b.strides]
    img = np.random.default_rng(0).random((4, 1024), np.float32)
    im = hl.Buffer(img)
    mid, out = hl.Func("mid"), hl.Func("out")
    mid[x, y] = im[x, y] * 2
    out[x, y] = mid[x, y] + mid[x, (y + 1) % 4]
    mid.compute_root()
    np.testing.assert_array_equal(np.asarray(out.realize([1024, 4])),
                                  2 * img + 2 * np.roll(img, -1, axis=0))


def test_buffer_views_on_outer_axes_are_used_without_copies():
    a = np.arange(48, dtype=np.float32).reshape(8, 6)[::-2]  # negative stride in y
    b = hl.Buffer(a)
    assert b.numpy() is a or np.shares_memory(b.numpy(), a)
    f = hl.Func("f")
    f[x, y] = b[x, y] + 1
    np.testing.assert_array_equal(np.asarray(f.realize([6, 4])), a + 1)


def test_print_loop_nest_shows_the_schedule():
    f, g = hl.Func("prod"), hl.Func("cons")
    xi, yi = hl.Var("xi"), hl.Var("yi")
    f[x, y] = x + y
    g[x, y] = f[x, y] + f[x + 1, y]
    g.tile(x, y, xi, yi, 16, 8).vectorize(xi, 4).parallel(y)
    f.compute_at(g, x)
    text = g.loop_nest()
    assert "parallel y" in text and "vectorized xi.v" in text and "allocate prod" in text
    np.testing.assert_array_equal(np.asarray(g.realize([37, 19])),
                                  2 * np.add.outer(np.arange(19), np.arange(37)) + 1)


def test_boundary_conditions_match_numpy_pad():
    a = np.random.default_rng(2).random((5, 7)).astype(np.float32)
    modes = {"repeat_edge": "edge", "repeat_image": "wrap", "mirror_image": "symmetric",
             "mirror_interior": "reflect"}
    for name, mode in modes.items():
        f = getattr(hl.BoundaryConditions, name)(hl.Buffer(a))
        g = hl.Func("g")
        g[x, y] = f[x - 3, y - 3]
        got = np.asarray(g.realize([13, 11]))
        np.testing.assert_array_equal(got, np.pad(a, 3, mode=mode), err_msg=name)
    f = hl.BoundaryConditions.constant_exterior(hl.Buffer(a), 7.0)
    g = hl.Func("g")
    g[x, y] = f[x - 2, y - 2]
    np.testing.assert_array_equal(np.asarray(g.realize([11, 9])),
                                  np.pad(a, 2, constant_values=7.0))


def test_rfactor_sum_and_max():
    a = np.random.default_rng(4).random((40, 30))
    b = hl.Buffer(a)
    u = hl.Var("u")
    r = hl.RDom(b)
    s = hl.Func("s")
    s[()] = hl.f64(0)
    s[()] += b[r.x, r.y]
    intm = s.update(0).rfactor([(r.y, u)])
    intm.compute_root().update(0).vectorize(u, 4).parallel(u)
    np.testing.assert_allclose(float(np.asarray(s.realize([]))), a.sum(), rtol=1e-12)
    assert "s_intm" in s.loop_nest()
    m = hl.Func("m")
    r2 = hl.RDom([(0, 30)])
    m[y] = hl.f64(-1e9)
    m[y] = hl.max(m[y], b[r2.x, y])
    m.update(0).rfactor(r2.x, u)
    np.testing.assert_array_equal(np.asarray(m.realize([40])), a.max(axis=1))


def test_rfactor_refuses_non_associative_updates():
    f = hl.Func("f")
    r = hl.RDom([(0, 4)])
    f[x] = 1.0 * hl.f32(1)
    f[x] = f[x] * 0.5 + hl.f32(r.x)
    with pytest.raises(hl.ScheduleError, match="associative"):
        f.update(0).rfactor(r.x, hl.Var("u"))


def test_clamped_data_dependent_index_is_safe_for_nan_and_inf():
    # the float -> int cast saturates (NaN -> 0), so the clamp bounds every index the
    # compiled loop reads, whatever the data
    data = hl.Buffer(np.array([np.nan, np.inf, -np.inf, 2.2, 1e30, -7.0], np.float32))
    lut = hl.Buffer(np.array([10, 20, 30, 40], np.int32))
    f = hl.Func("f")
    f[x] = lut[hl.clamp(hl.i32(data[x]), 0, 3)]
    np.testing.assert_array_equal(np.asarray(f.realize([6])), [10, 40, 10, 30, 40, 10])


def test_multi_output_pipeline_with_per_output_sizes():
    """Outputs of different dimensionality (an image and its row sums) in one realize."""
    img, sums = hl.Func("img"), hl.Func("sums")
    r = hl.RDom([(0, 5)])
    img[x, y] = x + 10 * y
    img.compute_root()
    sums[y] = 0
    sums[y] += img[r.x, y]
    o_img, o_sums = hl.Pipeline([img, sums]).realize([[5, 3], [3]])
    want = np.arange(5)[None, :] + 10 * np.arange(3)[:, None]
    np.testing.assert_array_equal(np.asarray(o_img), want)
    np.testing.assert_array_equal(np.asarray(o_sums), want.sum(axis=1))
