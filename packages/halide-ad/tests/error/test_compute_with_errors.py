"""Fusion requests ``compute_with`` must refuse, each with a ScheduleError naming the
stages and the rule (checked when the pipeline is lowered)."""

import halide_ad as hl
import numpy as np
import pytest

RNG = np.random.default_rng(6)
N, M = 24, 200


def _data():
    return RNG.integers(0, N, M).astype(np.int32), RNG.integers(-4, 5, M).astype(np.float64)


def _scatters(idx, vals, two_d=False):
    """``f`` with three additive scatter updates over separate RDoms of one size."""
    x = hl.Var("x")
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    rs = [hl.RDom([(0, M)], name=f"r{k}") for k in range(3)]
    f = hl.Func("f")
    if two_d:
        f[x, hl.Var("y")] = hl.f64(0)
        for r in rs:
            f[x, hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    else:
        f[x] = hl.f64(0)
        for r in rs:
            f[hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    return f, rs


def _expect(f, match, sizes=(N,)):
    with pytest.raises(hl.ScheduleError, match=match):
        f.realize(list(sizes))


def test_error_parent_must_come_first_and_not_itself():
    f, rs = _scatters(*_data())
    with pytest.raises(hl.ScheduleError, match="cannot be fused with itself"):
        f.update(0).compute_with(f.update(0), rs[0].x)
    with pytest.raises(hl.ScheduleError, match="expected a Func or a Stage"):
        f.update(0).compute_with("f", rs[0].x)
    f.update(0).compute_with(f.update(1), rs[1].x)
    _expect(f, r"the parent must be computed first")


def test_error_unknown_loop():
    f, rs = _scatters(*_data())
    f.update(1).compute_with(f.update(0), "z")
    _expect(f, r"f.update\(0\) has no dimension 'z'")


def test_error_unequal_vector_extents_and_kinds():
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x = hl.Var("x")
    r, s = hl.RDom([(0, 4)], name="r"), hl.RDom([(0, 3)], name="s")
    f = hl.Func("f")
    f[x] = hl.f64(0)
    f[hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    f[hl.clamp(ib[s.x], 0, N - 1)] += vb[s.x]
    f.update(0).unroll(r.x)
    f.update(1).unroll(s.x).compute_with(f.update(0), r.x)
    _expect(f, "fused vector or unrolled loops need provably equal extents")

    f, rs = _scatters(idx, vals, two_d=True)
    f.update(0).reorder(x, rs[0].x).vectorize(x, 4)
    f.update(1).reorder(x, rs[1].x).vectorize(x, 2)
    f.update(1).compute_with(f.update(0), "x.v")
    _expect(f, r"is vectorized \(2 wide\), the parent's x.v is vectorized \(4 wide\)", (8, N))

    g, rs = _scatters(idx, vals, two_d=True)
    g.update(0).parallel("x")
    g.update(1).compute_with(g.update(0), "x")
    _expect(g, "fused loops need one kind", (8, N))


def test_error_fusion_would_break_a_dependence():
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x = hl.Var("x")
    r, s = hl.RDom([(0, M)], name="r"), hl.RDom([(0, M)], name="s")
    # a product update reorders with a sum update: not only rounding
    f = hl.Func("f")
    f[x] = hl.f64(1)
    f[ib[r.x]] += vb[r.x]
    f[ib[s.x]] = f[ib[s.x]] * 2.0
    f.update(1).compute_with(f.update(0), r.x)
    _expect(f, r"both access f and fusion would reorder")
    # a later stage reading what the earlier one scatters
    h, a = hl.Func("h"), hl.Func("a")
    h[x] = hl.f64(0)
    h[ib[r.x]] += vb[r.x]
    a[x] = hl.f64(0)
    a[0] += h[hl.clamp(s.x, 0, N - 1)]
    a.update(0).compute_with(h.update(0), r.x)
    _expect(hl.Pipeline([h, a]), r"both access h")


def test_error_moving_past_a_stage_in_between():
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x = hl.Var("x")
    rs = [hl.RDom([(0, M)], name=f"r{k}") for k in range(3)]
    f = hl.Func("f")
    f[x] = hl.f64(1)
    f[ib[rs[0].x]] += vb[rs[0].x]
    f[x] = f[x] * 2.0
    f[ib[rs[2].x]] += vb[rs[2].x]
    f.update(2).compute_with(f.update(0), rs[0].x)
    _expect(f, r"f.update\(0\) would run after f.update\(1\)")


def test_error_parallel_lanes_cover_different_points():
    """Both updates run one parallel loop over x * y, x fastest in one and y in the other:
    an iteration of the fused loop would write two different (x, y) slices of f."""
    idx, vals = _data()
    ib, vb = hl.Buffer(idx, name="idx"), hl.Buffer(vals, name="vals")
    x, y, z, t = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("t")
    r, s = hl.RDom([(0, M)], name="r"), hl.RDom([(0, M)], name="s")
    f = hl.Func("f")
    f[x, y, z] = hl.f64(0)
    f[x, y, hl.clamp(ib[r.x], 0, N - 1)] += vb[r.x]
    f[x, y, hl.clamp(ib[s.x], 0, N - 1)] += vb[s.x]
    f.update(0).reorder(r.x, x, y).fuse(x, y, t).parallel(t)
    f.update(1).reorder(s.x, y, x).fuse(y, x, t).parallel(t)
    f.update(1).compute_with(f.update(0), t)
    _expect(f, "cover different points", (4, 4, N))


def test_error_stage_not_computed_at_the_root():
    idx, vals = _data()
    f, rs = _scatters(idx, vals)
    x = hl.Var("x")
    out = hl.Func("out")
    out[x] = f[x] * 2.0
    f.compute_at(out, x)
    f.update(1).compute_with(f.update(0), rs[0].x)
    _expect(out, "both Funcs must be computed at the root")
