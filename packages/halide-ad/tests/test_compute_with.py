"""``compute_with``: stages fused into one loop nest, correctness (the requests it must
refuse: ``error/test_compute_with_errors.py``; its speed: ``performance/``).

Correctness: a fused pipeline computes what the unfused one does. Accumulations are float64
sums of small integers here, exact in any order, so fused and unfused must be bit-identical
even where fusion reorders the additions (colliding scatters of two updates), and both must
equal a numpy reference (``np.add.at``)."""

import halide_ad as hl
import numpy as np
import pytest

RNG = np.random.default_rng(5)
N, M = 24, 200  # output size, scattered samples


def _scatters(idx, vals, two_d=False, shift=1):
    """``f`` with three additive scatter updates over separate RDoms of one size (the second
    at the same index as the first: every one of its writes collides)."""
    x, y = hl.Var("x"), hl.Var("y")
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    rs = [hl.RDom([(0, M)], name=f"r{k}") for k in range(3)]
    f = hl.Func("f")
    if two_d:
        f[x, y] = hl.f64(0)
        at = [hl.clamp(ib[r.x] + s, 0, N - 1) for r, s in zip(rs, (0, 0, shift))]
        for k, (r, a) in enumerate(zip(rs, at)):
            f[x, a] += vb[r.x] * (k + 1) + hl.f64(x)
    else:
        f[x] = hl.f64(0)
        for k, r in enumerate(rs):
            f[hl.clamp(ib[r.x] + (shift if k == 2 else 0), 0, N - 1)] += vb[r.x] * (k + 1)
    return f, rs


def _reference(idx, vals, two_d=False, shift=1, width=8):
    out = np.zeros(N)
    for k, s in enumerate((0, 0, shift)):
        np.add.at(out, np.clip(idx + s, 0, N - 1), vals * (k + 1))
    if not two_d:
        return out
    xs = np.arange(width, dtype=np.float64)
    counts = np.zeros(N)
    for s in (0, 0, shift):
        np.add.at(counts, np.clip(idx + s, 0, N - 1), 1.0)
    return out[:, None] + counts[:, None] * xs[None, :]   # (y, x), as realize returns it


def _data():
    return RNG.integers(0, N, M).astype(np.int32), RNG.integers(-4, 5, M).astype(np.float64)


def test_fused_scatters_are_one_loop_and_equal_unfused():
    idx, vals = _data()
    f, rs = _scatters(idx, vals)
    unfused = np.asarray(f.realize([N])).copy()
    f.update(1).compute_with(f.update(0), rs[0].x)
    f.update(2).compute_with(f.update(0), rs[0].x)
    nest = f.loop_nest()
    assert nest.count("for r") == 1, nest          # the three updates share one loop
    assert nest.count("f(clamp(") == 3, nest
    fused = np.asarray(f.realize([N]))
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_array_equal(fused, _reference(idx, vals))


@pytest.mark.parametrize("schedule", ["serial", "parallel", "vectorized"])
def test_fused_2d_scatters_with_parallel_and_vector_loops(schedule):
    idx, vals = _data()
    f, rs = _scatters(idx, vals, two_d=True)
    width = 8
    unfused = np.asarray(f.realize([width, N])).copy()
    x = hl.Var("x")
    for k, r in enumerate(rs):
        st = f.update(k)
        if schedule == "parallel":
            st.reorder(r.x, x).parallel(x)         # x outermost, one slice per thread
        elif schedule == "vectorized":
            st.reorder(x, r.x).vectorize(x, 4)     # x innermost, 4 lanes
    def inner(k):
        return f.update(k)._definition().schedule.dims[0].name
    f.update(1).compute_with(f.update(0), inner(0))
    f.update(2).compute_with(f.update(1), inner(1))  # a chain: fused into update(0)'s loops
    nest = f.loop_nest()
    assert nest.count("f((hl.region") == 4, nest   # the pure definition and 3 updates
    assert len([ln for ln in nest.splitlines() if ln.strip().startswith(
        ("for", "parallel", "vectorized"))]) == 2 + (3 if schedule == "vectorized" else 2), nest
    fused = np.asarray(f.realize([width, N]))
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_array_equal(fused, _reference(idx, vals, True, width=width))


def test_fused_reductions_of_two_funcs_share_the_loop():
    """Different Funcs (update loops of constant extents): a histogram and a sum."""
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x = hl.Var("x")
    r, s = hl.RDom([(0, M)], name="r"), hl.RDom([(0, M)], name="s")
    hist, total = hl.Func("hist"), hl.Func("total")
    hist[x] = hl.f64(0)
    hist[hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    total[x] = hl.f64(0)
    total[0] += vb[s.x] * vb[s.x]
    p = hl.Pipeline([hist, total])
    want = [np.asarray(b).copy() for b in p.realize([N])]
    total.update(0).compute_with(hist.update(0), r.x)
    assert p.loop_nest().count("for r.x") == 1 and "for s.x" not in p.loop_nest()
    got = [np.asarray(b) for b in p.realize([N])]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[1][0], np.sum(vals * vals))


def test_fused_bodies_share_their_common_subexpressions():
    """Two corners of a linear-interpolation adjoint: fused, the position (a float-to-int
    conversion of a load) is computed once per iteration."""
    pos = hl.Buffer(RNG.uniform(0, N - 2, M), name="pos")
    x = hl.Var("x")
    r0, r1 = hl.RDom([(0, M)], name="r0"), hl.RDom([(0, M)], name="r1")
    d = hl.Func("d")
    d[x] = hl.f64(0)
    for k, r in enumerate((r0, r1)):
        i = hl.clamp(hl.i32(hl.floor(pos[r.x])), 0, N - 2)
        w = pos[r.x] - hl.f64(i)
        d[i + k] += w if k else 1.0 - w
    want = np.asarray(d.realize([N])).copy()
    floors = hl.Pipeline(d).ir().count("fptosi")
    d.update(1).compute_with(d.update(0), r0.x)
    p = hl.Pipeline(d)
    assert p.ir().count("fptosi") < floors
    np.testing.assert_allclose(np.asarray(p.realize([N])), want, rtol=1e-13, atol=1e-13)


def test_auto_schedule_fuses_updates_unless_told_not_to():
    idx, vals = _data()
    f, _ = _scatters(idx, vals, two_d=True)
    off = hl.auto_schedule(f, {f: [8, N]}, fuse=False)
    assert not any("compute_with" in d for ds in off.stages.values() for d in ds), off
    want = np.asarray(f.realize([8, N])).copy()
    on = hl.auto_schedule(f, {f: [8, N]})
    assert [d for d in on.stages["f.update(1)"] + on.stages["f.update(2)"]
            if d.startswith("compute_with(f.update(0)")], on
    np.testing.assert_array_equal(np.asarray(f.realize([8, N])), want)


def test_fused_loops_of_different_extents_are_guarded():
    """Halide's guards: a shared loop runs to the largest extent, each body only over its
    own; here RDoms of 200 and 150 samples, and the pure definitions of two Funcs of
    different sizes (the loop over each Func's region)."""
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x, y = hl.Var("x"), hl.Var("y")
    r, s = hl.RDom([(0, M)], name="r"), hl.RDom([(0, 150)], name="s")
    f = hl.Func("f")
    f[x] = hl.f64(0)
    f[hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    f[hl.clamp(ib[s.x], 0, N - 1)] += 2.0 * vb[s.x]
    want = np.asarray(f.realize([N])).copy()
    f.update(1).compute_with(f.update(0), r.x)
    assert "if lt(" in f.loop_nest()
    np.testing.assert_array_equal(np.asarray(f.realize([N])), want)

    img = hl.Buffer(RNG.integers(0, 9, (6, 9)).astype(np.float64), name="img")
    a, b, out = hl.Func("a"), hl.Func("b"), hl.Func("out")
    a[x, y] = img[x, y] * 2.0
    b[x, y] = img[x, y] + 1.0
    out[x, y] = a[x + 2, y + 1] + b[x, y]          # a is needed on a larger region than b
    a.compute_root()
    b.compute_root()
    want = np.asarray(out.realize([5, 3])).copy()
    b.compute_with(a, y)
    assert out.loop_nest().count("if lt(") == 2     # the fast path's test, then b's guard
    np.testing.assert_array_equal(np.asarray(out.realize([5, 3])), want)


def test_fused_vector_loops_of_unequal_extents_are_versioned():
    """Vector loops over two Funcs' regions (tails of different lengths) fuse where their
    extents are equal at run time and run one after the other where not."""
    img = hl.Buffer(RNG.integers(0, 9, (6, 9)).astype(np.float64), name="img")
    x, y = hl.Var("x"), hl.Var("y")
    a, b, out = hl.Func("a"), hl.Func("b"), hl.Func("out")
    a[x, y] = img[x, y] * 2.0
    b[x, y] = img[x, y] + 1.0
    out[x, y] = a[x + 2, y + 1] + a[x, y] + b[x, y]   # a: 7 columns, b: 5
    want = np.asarray(out.realize([5, 3])).copy()
    a.compute_root().vectorize(x, 4)
    b.compute_root().vectorize(x, 4)
    b.compute_with(a, "x.v")
    nest = out.loop_nest()
    assert "(eq(minimum(4" in nest and nest.count("vectorized x.v") == 3, nest
    np.testing.assert_array_equal(np.asarray(out.realize([5, 3])), want)
    np.testing.assert_array_equal(np.asarray(out.realize([7, 2])), img.numpy()[1:3, 2:9] * 2.0
                                  + img.numpy()[:2, :7] * 3.0 + 1.0)


def test_versioned_fusion_shares_points_only_where_the_regions_are_equal():
    """The fused version addresses the second Func's points as the first's (so their reads
    are shared); regions of equal extents but other origins must take the unfused version."""
    img = hl.Buffer(RNG.integers(0, 9, (8, 12)).astype(np.float64), name="img")
    x, y = hl.Var("x"), hl.Var("y")
    a, b, out = hl.Func("a"), hl.Func("b"), hl.Func("out")
    a[x, y] = img[x, y] * 2.0
    b[x, y] = img[x, y] + 1.0
    out[x, y] = a[x + 1, y] + b[x, y + 1]   # equal extents, origins shifted
    a.compute_root().vectorize(x, 4)
    b.compute_root().vectorize(x, 4)
    b.compute_with(a, "x.v")
    i = img.numpy()
    np.testing.assert_array_equal(np.asarray(out.realize([9, 5])),
                                  i[:5, 1:10] * 2.0 + i[1:6, :9] + 1.0)


def test_auto_schedule_fuses_tiled_reductions_of_two_funcs_innermost():
    """Per-pixel sums over channels into two Funcs (the coordinate adjoints of a sampler),
    tiled with tails: one body per channel iteration, sharing its loads, equal to the
    unfused result."""
    img = hl.Buffer(RNG.integers(-4, 5, (5, 150, 203)).astype(np.float64), name="img")
    x, y = hl.Var("x"), hl.Var("y")
    r, s = hl.RDom([(0, 5)], name="r"), hl.RDom([(0, 5)], name="s")
    gx, gy = hl.Func("gx"), hl.Func("gy")
    gx[x, y] = hl.f64(0)
    gx[x, y] += img[x, y, r.x] * 2.0
    gy[x, y] = hl.f64(0)
    gy[x, y] += img[x, y, s.x] * img[x, y, s.x]
    p = hl.Pipeline([gx, gy])
    hl.auto_schedule([gx, gy], {gx: [203, 150], gy: [203, 150]}, fuse=False)
    want = [np.asarray(v).copy() for v in p.realize([203, 150])]
    res = hl.auto_schedule([gx, gy], {gx: [203, 150], gy: [203, 150]})
    assert "compute_with(gx.update(0), r.x)" in res.stages["gy.update(0)"], res
    got = [np.asarray(v) for v in p.realize([203, 150])]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
