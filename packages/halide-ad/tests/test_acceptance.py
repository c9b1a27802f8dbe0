"""The acceptance experiments AE-1 to AE-8 (docs/design/halide-ad.md; the paper's sections
3.5-3.10), as named tests with the exact values the papers' and the research branch's tests
give. Finite-difference checks of the same constructs on random data are in
``test_adjoints.py``; AE-9 (schedule invariance) is in ``test_checkpoint_schedules.py``, AE-11
in ``test_autoschedule.py``, AE-12 in ``test_table1_ops.py``."""

import numpy as np
import pytest

import halide_ad as hl

x, y = hl.Var("x"), hl.Var("y")


def _grad(loss, buf, n):
    return np.asarray(hl.propagate_adjoints(loss)[buf].realize(list(n)))


def _sum(f, lo, hi, weight=None):
    r = hl.RDom([(lo, hi - lo)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[r.x] if weight is None else f[r.x] * weight(r.x)
    return loss


def test_ae1_gamma_and_l2_match_their_closed_forms():
    rng = np.random.default_rng(1)
    im0 = rng.uniform(0.1, 1.0, (48, 64))
    tgt0 = rng.uniform(0.0, 1.0, (48, 64))
    im, tgt = hl.Buffer(im0, "im"), hl.Buffer(tgt0, "tgt")
    g = hl.Param(hl.Float(64), "g", 2.2)
    f = hl.Func("gamma")
    f[x, y] = hl.pow(im[x, y], g)
    r = hl.RDom([(0, 64), (0, 48)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += (f[r.x, r.y] - tgt[r.x, r.y]) ** 2
    d = hl.propagate_adjoints(loss)
    fv = im0 ** 2.2
    d_im = np.asarray(d[im].realize([64, 48]))
    np.testing.assert_allclose(d_im, 2 * (fv - tgt0) * 2.2 * im0 ** 1.2, rtol=1e-10)
    d_g = float(np.asarray(d[g].realize([])))
    np.testing.assert_allclose(d_g, np.sum(2 * (fv - tgt0) * fv * np.log(im0)), rtol=1e-10)


def test_ae2_conv_adjoint_is_a_gather_equal_to_the_correlation():
    rng = np.random.default_rng(2)
    a0, k0 = rng.standard_normal(102), np.array([0.25, -0.5, 2.0])
    a, k = hl.Buffer(a0, "a"), hl.Buffer(k0, "k")
    r = hl.RDom([(0, 3)])
    conv = hl.Func("conv")
    conv[x] = hl.f64(0)
    conv[x] += a[x + r.x] * k[r.x]
    w0 = rng.standard_normal(100)
    w = hl.Buffer(w0, "w")
    loss = _sum(conv, 0, 100, lambda i: w[i])
    d = hl.propagate_adjoints(loss)
    for df in d[a].definitions():  # scatter-to-gather: pure Vars on every left-hand side
        assert all(getattr(arg, "kind", None) == "hl.var" for arg in df.args), df.args
    want = np.zeros(102)
    for t in range(3):
        want[t:t + 100] += w0 * k0[t]
    got = np.asarray(d[a].realize([102]))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    again = np.asarray(hl.propagate_adjoints(loss)[a].realize([102]))
    np.testing.assert_array_equal(again, got)  # repeated runs are bit-identical


def test_ae3_upsampling_and_downsampling():
    a = hl.Buffer(np.arange(1.0, 5.0), "a")
    up = hl.Func("up")
    up[x] = a[x / 4]
    assert list(_grad(_sum(up, 0, 16), a, [4])) == [4.0, 4.0, 4.0, 4.0]
    b = hl.Buffer(np.arange(10.0), "b")
    r = hl.RDom([(0, 4)])
    down = hl.Func("down")
    down[x] = hl.f64(0)
    down[x] += b[4 * x + r.x]
    assert list(_grad(_sum(down, 0, 2), b, [10])) == [1.0] * 8 + [0.0, 0.0]


def test_ae4_partial_updates_mask_the_overwritten_adjoint():
    fb = hl.Buffer(np.arange(1.0, 5.0), "f")
    g, h = hl.Func("g"), hl.Func("h")
    g[x] = fb[x]
    g[1] = hl.f64(2)
    h[x] = g[x]
    assert list(_grad(_sum(h, 0, 4), fb, [4])) == [1.0, 0.0, 1.0, 1.0]

    inp = hl.Buffer(np.array([1.0, 2.0, 3.0]), "input")
    f_in = hl.Func("f_in")  # (a Buffer read at Python ints is its value, as in Halide)
    f_in[x] = inp[x]
    out = hl.Func("sparse")
    out[x] = f_in[x]
    out[1] = hl.f64(0)
    out[2] = 2.0 * f_in[1]
    assert list(_grad(_sum(out, 0, 3), inp, [3])) == [1.0, 2.0, 0.0]

    inp2 = hl.Buffer(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]), "input2")
    rng_out = hl.Func("ranges")
    rng_out[x] = inp2[x]
    r0, r1 = hl.RDom([(1, 2)]), hl.RDom([(3, 4)])
    rng_out[r0.x] = inp2[r0.x - 1]
    rng_out[r1.x] = hl.f64(0)
    assert list(_grad(_sum(rng_out, 0, 5), inp2, [7])[:3]) == [2.0, 1.0, 0.0]


@pytest.mark.parametrize("bc, want", [
    ("repeat_edge", [1, 5]), ("constant_exterior", [1, 2]), ("repeat_image", [3, 3]),
    ("mirror_image", [2, 4]), ("mirror_interior", [3, 3]),
])
def test_ae6_boundary_conditions(bc, want):
    inp = hl.Buffer(np.array([1.0, 2.0]), "input")
    fn = getattr(hl.BoundaryConditions, bc)
    c = fn(inp, 0.0) if bc == "constant_exterior" else fn(inp)
    blur = hl.Func("blur")
    blur[x] = c[x] + c[x + 1]
    assert list(_grad(_sum(blur, 0, 3), inp, [2])) == want


def test_ae6_explicit_clamp_accumulates_the_clamped_contributions():
    inp = hl.Buffer(np.array([1.0, 2.0]), "input")
    clamped = hl.Func("clamped")
    clamped[x] = inp[hl.clamp(x, 0, 1)]
    blur = hl.Func("blur")
    blur[x] = clamped[x] + clamped[x + 1]
    loss = _sum(blur, 0, 3)
    d = hl.propagate_adjoints(loss)
    d_clamped = np.asarray(d[clamped].realize([4]))
    d_in = np.asarray(d[inp].realize([2]))
    assert d_in[1] == d_clamped[1] + d_clamped[2] + d_clamped[3]
    assert list(d_in) == [1.0, 5.0]


def _histogram(repeats=1):
    inp = hl.Buffer(np.array([2, 2, 1, 3], np.int32), "input")
    k = hl.Buffer(np.array([0.5, 1.0, 1.5, 2.0, 2.5]), "k")
    out = hl.Func("hist")
    out[x] = hl.f64(0)
    r = hl.RDom([(0, 4)])
    for _ in range(repeats):
        out[hl.clamp(inp[r.x], 0, 3)] += k[r.x]
    return _sum(out, 0, 4, lambda i: hl.f64(i + 1)), k


def test_ae7_histogram_and_diagonal_and_circle_scatters():
    loss, k = _histogram()
    assert list(_grad(loss, k, [5])) == [3.0, 3.0, 2.0, 4.0, 0.0]
    loss, k = _histogram(10)
    assert list(_grad(loss, k, [5])) == [30.0, 30.0, 20.0, 40.0, 0.0]

    inp = hl.Buffer(np.arange(1.0, 6.0), "input")
    f = hl.Func("diag")
    f[x, y] = hl.f64(0)
    r = hl.RDom([(0, 4)])
    f[r.x, r.x] = inp[r.x] + inp[r.x + 1]
    rr = hl.RDom([(0, 4), (0, 4)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[rr.x, rr.y]
    assert list(_grad(loss, inp, [5])) == [1.0, 2.0, 2.0, 2.0, 1.0]

    n = 9
    img = hl.Buffer(np.ones((n, n)), "img")
    circle = hl.Func("circle")
    circle[x, y] = img[x, y]
    rc = hl.RDom([(0, n), (0, n)])
    rc.where((rc.x - 4) * (rc.x - 4) + (rc.y - 4) * (rc.y - 4) <= 9)
    circle[rc.x, rc.y] = circle[rc.x, rc.y] * 2.0
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += circle[rr2.x, rr2.y] if (rr2 := hl.RDom([(0, n), (0, n)])) else 0
    d_img = np.asarray(hl.propagate_adjoints(loss)[img].realize([n, n]))
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    inside = (ii - 4) ** 2 + (jj - 4) ** 2 <= 9
    np.testing.assert_array_equal(d_img, np.where(inside, 2.0, 1.0))


def test_ae8_second_order_polynomial():
    xp = hl.Param(hl.Float(64), "x", 1.0)
    p = hl.Func("p")
    p[()] = xp * xp + 3.0 * xp + 4.0
    d1 = hl.propagate_adjoints(p)[xp]
    assert float(np.asarray(d1.realize([]))) == 5.0
    d2 = hl.propagate_adjoints(d1)[xp]
    assert float(np.asarray(d2.realize([]))) == 2.0


def _fd_matches(build, a0, h=1e-6, tol=1e-6):
    """``build(buffer) -> loss``: the adjoint of the buffer against central differences on
    every entry (float64)."""
    buf = hl.Buffer(a0.copy(), "g")
    got = np.asarray(hl.propagate_adjoints(build(buf))[buf].realize(list(reversed(a0.shape))))
    want = np.zeros_like(a0)
    for idx in np.ndindex(a0.shape):
        e = np.zeros_like(a0)
        e[idx] = h
        lp = float(np.asarray(build(hl.Buffer(a0 + e, "g")).realize([])))
        lm = float(np.asarray(build(hl.Buffer(a0 - e, "g")).realize([])))
        want[idx] = (lp - lm) / (2 * h)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def _total(f, *extents):
    r = hl.RDom([(0, e) for e in extents])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[tuple(r[k] for k in range(len(extents)))] * (1.0 + 0.25 * hl.f64(r[0]))
    return loss


z = hl.Var("z")
N = 4


def _accumulate(g):
    f, r = hl.Func("f"), hl.RDom([(0, N)])
    f[x] = hl.f64(0)
    f[x] = f[x] + g[r.x] * hl.f64(x + 1)
    return _total(f, 3)


def _double(g):
    f = hl.Func("f")
    f[x] = g[x]
    f[x] = 2.0 * f[x]
    return _total(f, N)


def _square_at_new_point(g):
    f = hl.Func("f")
    f[x, y] = hl.f64(0)
    f[x, 0] = g[x]
    f[x, 1] = f[x, 0] * f[x, 0]
    return _total(f, N, 2)


def _linear_scan(g):
    f, r = hl.Func("f"), hl.RDom([(0, N - 1)])
    f[x, y] = g[x]
    f[x, r.x + 1] = 2.0 * f[x, r.x] + g[r.x]
    return _total(f, N, N)


def _scan_into_a_new_plane(g):
    f, r = hl.Func("f"), hl.RDom([(0, N - 1)])
    f[x, y, z] = hl.f64(0)
    f[x, y, 0] = g[x]
    f[x, r.x + 1, 1] = f[x, r.x, 0] * f[x, r.x, 0]
    return _total(f, N, N, 2)


def _two_dimensional_scan(g):
    f, r = hl.Func("f"), hl.RDom([(0, 2), (0, 2)])
    f[x, y, z] = g[x] * 0.5
    f[x, r.x + 1, r.y + 1] = 2.0 * f[x, r.x, r.y] + g[r.x]
    return _total(f, N, 3, 3)


def _square_in_place(g):  # Halide refuses it (the overwritten value is needed); a stage copy
    f = hl.Func("f")      # keeps that value here
    f[x] = g[x]
    f[x] = f[x] * f[x]
    return _total(f, N)


def _square_scan(g):  # refused by Halide's check 1; each point is read after its last write
    f, r = hl.Func("f"), hl.RDom([(0, N - 1)])
    f[x, y] = g[x]
    f[x, r.x + 1] = f[x, r.x] * f[x, r.x]
    return _total(f, N, N)


@pytest.mark.parametrize("build", [_accumulate, _double, _square_at_new_point, _linear_scan,
                                   _scan_into_a_new_plane, _two_dimensional_scan,
                                   _square_in_place, _square_scan])
def test_ae5_accepted_in_place_updates_pass_finite_differences(build):
    _fd_matches(build, np.random.default_rng(5).uniform(0.5, 1.0, N))


def _reduce_into_itself(g):
    f, r = hl.Func("acc"), hl.RDom([(0, N)])
    f[x] = hl.f64(1)
    f[x] = 2.0 * f[x] + g[r.x]
    return _total(f, 2)


def _diagonal_scan(g):
    f, r = hl.Func("acc"), hl.RDom([(0, 2), (0, 2)])
    f[x, y, z] = g[x]
    f[x, r.x + 1, r.x + r.y + 1] = 2.0 * f[x, r.x, r.y] + g[r.x]
    return _total(f, N, 3, 4)


@pytest.mark.parametrize("build", [_reduce_into_itself, _diagonal_scan])
def test_ae5_rejected_in_place_updates_name_the_func_and_update(build):
    with pytest.raises(hl.FuncError, match=r"update 0 of Func acc .*Rewrite"):
        hl.propagate_adjoints(build(hl.Buffer(np.ones(N), "g")))


def test_ae5_nonlinear_scan_horner_and_reverse():
    inp = hl.Buffer(np.array([2.0, 3.0]), "in")
    f, r = hl.Func("f"), hl.RDom([(0, 2)])
    f[x, y] = inp[x]
    f[x, r.x + 1] = f[x, r.x] * f[x, r.x] + inp[r.x]
    rl = hl.RDom([(0, 2)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[rl.x, 2]
    assert float(np.asarray(loss.realize([]))) == 163.0
    assert list(_grad(loss, inp, [2])) == [82.0, 134.0]

    coeffs = hl.Buffer(np.arange(1.0, 9.0), "coeffs")
    poly, r = hl.Func("polynomial"), hl.RDom([(0, 8)])
    poly[x, y] = hl.f64(0)
    poly[x, 7 - r.x] = poly[x, 8 - r.x] * (hl.f64(x) / 1023.0) + coeffs[r.x]
    rl = hl.RDom([(0, 1024)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += poly[rl.x, 0] / 1024.0
    js = np.arange(1024) / 1023.0
    want = [np.sum(js ** (7 - i)) / 1024.0 for i in range(8)]
    np.testing.assert_allclose(_grad(loss, coeffs, [8]), want, rtol=1e-5)

    inp = hl.Buffer(np.arange(5.0), "input")
    rev, r = hl.Func("reverse"), hl.RDom([(0, 5)])
    rev[x] = hl.f64(0)
    rev[r.x] = inp[4 - r.x]
    loss = _sum(rev, 0, 5, lambda i: hl.f64(i + 1))
    assert list(_grad(loss, inp, [5])) == [5.0, 4.0, 3.0, 2.0, 1.0]


def test_ae5_scan_adjoint_autoscheduled_equals_unscheduled():
    """The backward scan keeps its RVar loop serial under the auto-scheduler (parallel over
    the pure x only): identical to the unscheduled pipeline."""
    def d_g():
        g = hl.Buffer(np.linspace(0.5, 1.0, 64), "g")
        f, r = hl.Func("f"), hl.RDom([(0, 63)])
        f[x, y] = g[x]
        f[x, r.x + 1] = 0.5 * f[x, r.x] * f[x, r.x] + g[r.x] * 0.1
        return hl.propagate_adjoints(_total(f, 64, 64))[g]

    plain = np.asarray(d_g().realize([64]))
    scheduled = d_g()
    hl.auto_schedule([scheduled], {scheduled: [64]})
    np.testing.assert_array_equal(np.asarray(scheduled.realize([64])), plain)
