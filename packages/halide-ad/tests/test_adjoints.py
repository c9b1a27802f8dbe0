"""propagate_adjoints against central finite differences in float64, for every construct.

Each case builds a scalar float64 loss from random inputs (non-square images, non-symmetric
weights) and compares the realised adjoint of every input Buffer / Param with
``(L(x + h e) - L(x - h e)) / 2h``, h = 1e-6: the pipelines are smooth polynomials / sines of
O(1) values, so the truncation error is O(h^2) ~ 1e-12 and the rounding error ~ 1e-10; the
tolerance 1e-6 (relative to the gradient's largest entry) leaves room for both.
"""

import numpy as np
import pytest

import halide_ad as hl

H, W = 5, 7
TOL = 1e-6


def _rng(seed=0):
    return np.random.default_rng(seed)


def _fd_check(build, arrays, params=None, tol=TOL, h=1e-6, samples=8):
    """``build(arrays, params) -> (loss, {name: Buffer}, {name: Param})``. Checks ``samples``
    random entries of each array's gradient (each FD entry compiles two pipelines) plus its
    corners, and every Param."""
    params = params or {}
    loss, bufs, ps = build(arrays, params)
    d = hl.propagate_adjoints(loss)

    def value(arrs, prms):
        lo, _, _ = build(arrs, prms)
        return float(np.asarray(lo.realize([])))

    for name, a in arrays.items():
        got = np.asarray(d[bufs[name]].realize(list(reversed(a.shape))))
        want = np.zeros_like(a)
        pick = np.random.default_rng(a.size).choice(a.size, min(samples, a.size), replace=False)
        idxs = {np.unravel_index(int(k), a.shape) for k in pick}
        idxs |= {(0,) * a.ndim, tuple(s - 1 for s in a.shape)}
        for idx in sorted(idxs):
            e = np.zeros_like(a)
            e[idx] = h
            plus = dict(arrays, **{name: a + e})
            minus = dict(arrays, **{name: a - e})
            want[idx] = (value(plus, params) - value(minus, params)) / (2 * h)
        sel = tuple(np.array(k) for k in zip(*sorted(idxs)))
        scale = max(1.0, np.abs(want[sel]).max())
        assert np.abs(got[sel] - want[sel]).max() <= tol * scale, (name, got, want)
    for name, v in params.items():
        got = float(np.asarray(d[ps[name]].realize([])))
        want = (value(arrays, dict(params, **{name: v + h}))
                - value(arrays, dict(params, **{name: v - h}))) / (2 * h)
        assert abs(got - want) <= tol * max(1.0, abs(want)), (name, got, want)
    return d, loss, bufs


def _sum_sq(f, w, h):
    r = hl.RDom([(0, w), (0, h)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[r.x, r.y] * f[r.x, r.y]
    return loss


x, y = hl.Var("x"), hl.Var("y")


def test_pointwise():
    def build(arrs, prms):
        a, b = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["b"], "b")
        f = hl.Func("f")
        f[x, y] = hl.sin(a[x, y]) * b[x, y] + hl.exp(a[x, y] * 0.3) / (2.0 + b[x, y] ** 2)
        return _sum_sq(f, W, H), {"a": a, "b": b}, {}

    rng = _rng()
    _fd_check(build, {"a": rng.standard_normal((H, W)), "b": rng.standard_normal((H, W))})


BOUNDARIES = {
    "repeat_edge": lambda b: hl.BoundaryConditions.repeat_edge(b),
    "constant_exterior": lambda b: hl.BoundaryConditions.constant_exterior(b, 0.25),
    "repeat_image": lambda b: hl.BoundaryConditions.repeat_image(b),
    "mirror_image": lambda b: hl.BoundaryConditions.mirror_image(b),
    "mirror_interior": lambda b: hl.BoundaryConditions.mirror_interior(b),
}


@pytest.mark.parametrize("bc", sorted(BOUNDARIES))
def test_stencil_every_boundary_condition(bc):
    def build(arrs, prms):
        a, k = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["k"], "k")
        c = BOUNDARIES[bc](a)
        bx = hl.Func("bx")
        bx[x, y] = (c[x - 2, y] * k[hl.i32(0)] + c[x, y] * k[hl.i32(1)]
                    + c[x + 1, y] * k[hl.i32(2)])
        by = hl.Func("by")
        by[x, y] = bx[x, y - 1] * 0.3 + bx[x, y] * bx[x, y] + hl.sin(bx[x, y + 2])
        return _sum_sq(by, W, H), {"a": a, "k": k}, {}

    rng = _rng(1)
    _fd_check(build, {"a": rng.standard_normal((H, W)), "k": rng.standard_normal(3)})


def test_rdom_convolution_adjoint_is_a_gather():
    """The paper's example: output(x) = input(x - r.x) * kernel(r.x); the adjoint of input
    must be a gather over x (pure variable on the left), never a scatter."""
    n = 9
    seen = {}

    def build(arrs, prms):
        a, k = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["k"], "k")
        c = hl.BoundaryConditions.constant_exterior(a, 0.0)
        seen.setdefault("input", c)  # the first build is the differentiated one
        r = hl.RDom([(0, 4)])
        out = hl.Func("out")
        out[x] = hl.f64(0)
        out[x] += c[x - r.x] * k[r.x]
        lo = hl.Func("loss")
        rr = hl.RDom([(0, n)])
        lo[()] = hl.f64(0)
        lo[()] += out[rr.x] * out[rr.x] * (1.0 + 0.1 * hl.f64(rr.x))
        return lo, {"a": a, "k": k}, {}

    rng = _rng(2)
    d, loss, bufs = _fd_check(build, {"a": rng.standard_normal(n), "k": rng.standard_normal(4)})
    d_input = d[seen["input"]]
    updates = d_input.definitions()[1:]
    assert updates, "the adjoint of the convolution input is a reduction over r.x"
    for df in updates:  # d_input(x) += d_out(x + r.x) * k(r.x): pure x on the left
        assert all(_is_pure_var(a) for a in df.args), df.args


def _is_pure_var(node):
    return getattr(node, "kind", None) == "hl.var"


@pytest.mark.parametrize("channels", [3, 4])
def test_packed_channel_index_adjoint_is_a_direct_gather(channels):
    """``out(x, z) += coeff(x, 4 z + r.x) * img(x, r.x)`` (the bilateral slice's affine
    coefficients packed per output channel): each coefficient index ``k`` has one ``(z, r)``,
    ``r = k mod 4``, so its adjoint reads it directly (no loop over ``r`` masked to one
    iteration); with 3 channels the 4th of each group gets nothing."""
    n, groups = 6, 2
    seen = {}

    def build(arrs, prms):
        cb, ib = hl.Buffer(arrs["coeff"], "coeff"), hl.Buffer(arrs["img"], "img")
        z = hl.Var("z")
        cf = hl.Func("cf")
        cf[x, y] = cb[x, y] * 1.5
        seen.setdefault("cf", cf)
        r = hl.RDom([(0, channels)])
        out = hl.Func("out")
        out[x, z] = hl.f64(0)
        out[x, z] += cf[x, 4 * z + r.x] * ib[x, r.x]
        rr = hl.RDom([(0, n), (0, groups)])
        lo = hl.Func("loss")
        lo[()] = hl.f64(0)
        lo[()] += out[rr.x, rr.y] * out[rr.x, rr.y]
        return lo, {"coeff": cb, "img": ib}, {}

    rng = _rng(4)
    d, _, _ = _fd_check(build, {"coeff": rng.standard_normal((4 * groups, n)),
                                "img": rng.standard_normal((channels, n))})
    assert not any(df.rdoms for df in d[seen["cf"]].definitions()), "a loop over r is left"
    got = np.asarray(d[seen["cf"]].realize([n, 4 * groups]))
    if channels == 3:
        assert not got[3::4].any()


def test_histogram_scatter():
    """hist[clamp(int(a * 4))] += w: a data-dependent scatter; adjoints to w flow back by
    gathering hist's adjoint at the data-dependent index."""
    nb = 6

    def build(arrs, prms):
        a, wt = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["w"], "w")
        r = hl.RDom([(0, W), (0, H)])
        hist = hl.Func("hist")
        hist[x] = hl.f64(0)
        hist[hl.clamp(hl.i32(a[r.x, r.y] * 4.0), 0, nb - 1)] += wt[r.x, r.y] * a[r.x, r.y]
        lo = hl.Func("loss")
        rb = hl.RDom([(0, nb)])
        lo[()] = hl.f64(0)
        lo[()] += hist[rb.x] * hist[rb.x] * hl.f64(rb.x + 1)
        return lo, {"a": a, "w": wt}, {}

    rng = _rng(3)
    # values away from the bin edges so that +-h never changes a bin
    a = (rng.integers(0, 6, (H, W)) + 0.3 + 0.4 * rng.random((H, W))) / 4.0
    _fd_check(build, {"a": a, "w": rng.standard_normal((H, W))})


@pytest.mark.parametrize("channels, intermediate", [(4, True), (1, False)])
def test_buffer_scattered_per_channel_accumulates_in_an_intermediate(channels, intermediate):
    """A Buffer read at data-dependent points (a flow warp reading its image directly, the
    coordinates clamped) scatters its adjoint. When every scatter passes a dimension of at
    least 4 points through (the channels), the scatters accumulate in an intermediate Func
    (which the auto-scheduler can store channels-innermost) and the Buffer's adjoint reads
    it; with one channel there is nothing to vectorise along and no intermediate. Both
    against finite differences, unscheduled and auto-scheduled."""
    c = hl.Var("c")

    def build(arrs, prms):
        im, off = hl.Buffer(arrs["image"], "image"), hl.Buffer(arrs["offsets"], "offsets")
        warped = hl.Func("warped")
        sx = hl.clamp(x + hl.i32(hl.floor(off[x, y] * 3.0)), 0, W - 1)
        warped[x, y, c] = hl.sin(im[sx, y, c]) * off[x, y]
        lo = hl.Func("loss")
        r = hl.RDom([(0, W), (0, H), (0, channels)])
        lo[()] = hl.f64(0)
        lo[()] += warped[r.x, r.y, r.z] * warped[r.x, r.y, r.z] * hl.f64(r.z + 1)
        return lo, {"image": im, "offsets": off}, {}

    rng = _rng(5)
    # offsets away from the floor's steps, so that +-h never moves a sample
    offsets = (rng.integers(-2, 3, (H, W)) + 0.3 + 0.4 * rng.random((H, W))) / 3.0
    arrays = {"image": rng.standard_normal((channels, H, W)), "offsets": offsets}
    _fd_check(build, arrays)
    loss, bufs, _ = build(arrays, {})
    d_image = hl.propagate_adjoints(loss)[bufs["image"]]
    names = {f.name() for f in hl.Pipeline(d_image)._compile().graph.funcs.values()}
    assert ("image_d_scattered" in names) == intermediate, names
    want = np.asarray(d_image.realize([W, H, channels])).copy()
    decided = hl.auto_schedule(d_image, {d_image: [W, H, channels]})
    if intermediate:
        assert "scatter" in decided.levels["image_d_scattered"], decided.levels
    got = np.asarray(hl.Pipeline(d_image).realize([W, H, channels]))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_upsample_adjoint_uses_new_rdom():
    """out(x) = in(x / 2): the adjoint of in sums d_out over the 2 preimages (a new RDom
    of extent 2, gathered over x)."""
    n = 5

    def build(arrs, prms):
        a = hl.Buffer(arrs["a"], "a")
        up = hl.Func("up")
        up[x, y] = a[x / 2, y / 3]
        lo = _sum_sq_weighted(up, 2 * n, 6)
        return lo, {"a": a}, {}

    rng = _rng(4)
    d, _, bufs = _fd_check(build, {"a": rng.standard_normal((2, n))})
    da = d[bufs["a"]]
    for df in da.definitions():
        assert all(_is_pure_var(a) for a in df.args)


def _sum_sq_weighted(f, w, h):
    r = hl.RDom([(0, w), (0, h)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[r.x, r.y] * f[r.x, r.y] * (1.0 + 0.1 * hl.f64(r.x) + 0.01 * hl.f64(r.y))
    return loss


def test_downsample():
    def build(arrs, prms):
        a = hl.Buffer(arrs["a"], "a")
        c = hl.BoundaryConditions.repeat_edge(a)
        dn = hl.Func("down")
        dn[x, y] = c[2 * x, y] + c[2 * x + 1, y] * 0.5 + c[2 * x - 1, y] * 0.25
        return _sum_sq_weighted(dn, 3, H), {"a": a}, {}

    rng = _rng(5)
    _fd_check(build, {"a": rng.standard_normal((H, W))})


def _blur3x3(c, k):
    """The benchmark's blur: a 3x3 RDom of taps of ``c`` weighted by ``k``."""
    r = hl.RDom([(0, 3), (0, 3)])
    blur = hl.Func("blur")
    blur[x, y] = hl.f64(0)
    blur[x, y] += c[x + r.x - 1, y + r.y - 1] * k[r.x, r.y]
    return blur


@pytest.mark.parametrize("bc", sorted(BOUNDARIES))
def test_rdom_blur_every_boundary_condition(bc):
    def build(arrs, prms):
        a, k = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["k"], "k")
        return _sum_sq_weighted(_blur3x3(BOUNDARIES[bc](a), k), W, H), {"a": a, "k": k}, {}

    rng = _rng(11)
    _fd_check(build, {"a": rng.standard_normal((H, W)), "k": rng.standard_normal((3, 3))},
              samples=12)


@pytest.mark.parametrize("case", ["offset", "narrow", "scaled", "halved", "one_clamped"])
def test_explicit_clamps_gather_their_edges(case):
    """Clamped indices that are not a plain repeat_edge: an offset and a stencil RVar inside
    the clamp, bounds narrower than the buffer (entries outside them get no adjoint), a
    scaled (2x, masked) and a halved (new RDom) coordinate, and a clamp on one coordinate
    only."""
    def build(arrs, prms):
        a = hl.Buffer(arrs["a"], "a")
        r = hl.RDom([(0, 3)])
        f = hl.Func("f")
        f[x, y] = hl.f64(0)
        if case == "offset":
            f[x, y] += a[hl.clamp(x + r.x - 2, 0, W - 1), hl.clamp(y + 1, 0, H - 1)] * (
                1.0 + hl.f64(r.x))
        elif case == "narrow":
            f[x, y] += a[hl.clamp(x + r.x - 1, 2, W - 3), hl.clamp(y - r.x, 1, H - 2)]
        elif case == "scaled":
            f[x, y] += a[hl.clamp(2 * x - r.x, 0, W - 1), hl.clamp(y, 0, H - 1)] * (
                0.5 + hl.f64(r.x))
        elif case == "halved":
            f[x, y] += a[hl.clamp(x / 2 + r.x, 1, W - 1), hl.clamp(y, 0, H - 1)]
        else:
            f[x, y] += a[hl.clamp(x - r.x, 0, W - 1), (y + 2 * r.x) % H]
        return _sum_sq_weighted(f, W + 3, H + 2), {"a": a}, {}

    rng = _rng(12)
    d, _, bufs = _fd_check(build, {"a": rng.standard_normal((H, W))}, samples=16)
    if case != "one_clamped":
        _assert_gather_only(d[bufs["a"]])


def _assert_gather_only(adjoint):
    """No update of ``adjoint`` writes at an RVar-dependent point: the direct solutions are
    pure, the clamped edges are lines / corners at constant coordinates."""
    for df in adjoint.definitions()[1:]:
        for a in df.args:
            assert not any(getattr(n, "kind", None) == "hl.rvar"
                           for n in hl._expr.sym.free_leaves(a)), df.args


def test_repeat_edge_adjoint_is_a_parallel_gather():
    """The auto-scheduled adjoint of the benchmark's repeat_edge blur: the image adjoint is a
    parallel gather of the wrapper's adjoint plus the folded-in border lines and corners
    (each reducing over the 1-pixel overhang), not a serial scatter over the wrapper's
    (w + 2) x (h + 2) domain; and it equals the float64 numpy reference."""
    n, m = 37, 21
    rng = _rng(13)
    img, k, g = rng.standard_normal((m, n)), rng.standard_normal((3, 3)), \
        rng.standard_normal((m, n))
    a, kb = hl.Buffer(img, "a"), hl.Buffer(k, "k")
    blur = _blur3x3(hl.BoundaryConditions.repeat_edge(a), kb)
    d = hl.propagate_adjoints(blur, g)
    d_a = d[a]
    _assert_gather_only(d_a)
    hl.auto_schedule([d_a], {d_a: [n, m]})
    nest = hl.Pipeline([d_a]).loop_nest()
    own = nest[nest.index(f"produce {d_a.name()}"):]
    assert own.lstrip().startswith("produce") and "\n  parallel " in own, own
    for line in own.splitlines()[1:]:
        if line.startswith("produce"):
            break
        if " r" in line and line.lstrip().startswith("for r"):
            assert line.rstrip().endswith("[0, 1):"), line  # the overhang, not the domain
    p = np.pad(img, 1, mode="edge")
    dp = np.zeros_like(p)
    for i in range(3):
        for j in range(3):
            dp[j:j + m, i:i + n] += k[j, i] * g
    dp[1] += dp[0]
    dp[-2] += dp[-1]
    dp[:, 1] += dp[:, 0]
    dp[:, -2] += dp[:, -1]
    got = np.asarray(d_a.realize([n, m]))
    np.testing.assert_allclose(got, dp[1:-1, 1:-1], rtol=1e-12, atol=1e-12)


def test_param_and_update_stages():
    """A Param, a pointwise in-place update (f = f * g, using f's value before the update),
    and an overwriting update over an RDom (masked)."""
    def build(arrs, prms):
        a = hl.Buffer(arrs["a"], "a")
        g = hl.Param(hl.Float(64), "g", prms["g"])
        f = hl.Func("f")
        f[x, y] = a[x, y] * g
        f[x, y] = f[x, y] * f[x, y] + a[x, y]
        r = hl.RDom([(1, 3)])
        f[r.x, 2] = a[r.x, 0] * 2.0
        return _sum_sq_weighted(f, W, H), {"a": a}, {"g": g}

    rng = _rng(6)
    d, loss, bufs = _fd_check(build, {"a": rng.standard_normal((H, W))}, {"g": 0.7})


def test_update_stage_adjoints_are_indexable():
    a = hl.Buffer(_rng(7).standard_normal((H, W)), "a")
    f = hl.Func("f")
    f[x, y] = a[x, y]
    f[x, y] = f[x, y] * 3.0
    loss = _sum_sq(f, W, H)
    d = hl.propagate_adjoints(loss)
    after = np.asarray(d[f, 0].realize([W, H]))
    before = np.asarray(d[f].realize([W, H]))
    fwd = 3.0 * np.asarray(a)
    np.testing.assert_allclose(after, 2 * fwd, rtol=1e-12)
    np.testing.assert_allclose(before, 6 * fwd, rtol=1e-12)


def test_adjoint_buffer_seed_matches_vjp():
    """propagate_adjoints(f, d_f): <J^T w, v> == <w, J v> for random v, w."""
    rng = _rng(8)
    a0 = rng.standard_normal((H, W))

    def fwd(arr):
        a = hl.Buffer(arr, "a")
        c = hl.BoundaryConditions.mirror_image(a)
        f = hl.Func("f")
        f[x, y] = c[x + 1, y] * 2.0 - c[x, y - 1] + c[x - 2, y + 1] * 0.5
        return f, a

    f, a = fwd(a0)
    wbar = rng.standard_normal((H, W))
    d = hl.propagate_adjoints(f, wbar)
    jt_w = np.asarray(d[a].realize([W, H]))
    v = rng.standard_normal((H, W))
    jv = np.asarray(fwd(v)[0].realize([W, H]))  # linear in a
    assert abs(np.sum(jt_w * v) - np.sum(wbar * jv)) < 1e-10 * np.abs(jv).sum()


def test_second_order_by_nesting():
    """The gradient of ||grad L||^2 (a Hessian-vector product) by differentiating the
    adjoint Funcs again, against finite differences of the exact first-order gradient."""
    rng = _rng(9)
    a0 = rng.standard_normal((H, W))

    def build(arr):
        a = hl.Buffer(arr, "a")
        c = hl.BoundaryConditions.repeat_edge(a)
        f = hl.Func("f")
        f[x, y] = hl.sin(c[x - 1, y]) * c[x, y + 1] + c[x, y] ** 3
        loss = _sum_sq(f, W, H)
        return loss, a

    def grad_norm(arr):
        loss, a = build(arr)
        d = hl.propagate_adjoints(loss)
        ga = d[a]
        r = hl.RDom([(0, W), (0, H)])
        g2 = hl.Func("g2")
        g2[()] = hl.f64(0)
        g2[()] += ga[r.x, r.y] * ga[r.x, r.y]
        return g2, a

    g2, a = grad_norm(a0)
    dd = hl.propagate_adjoints(g2)
    got = np.asarray(dd[a].realize([W, H]))
    h = 1e-6
    want = np.zeros_like(a0)
    for idx in [(0, 0), (2, 3), (4, 6), (1, 5)]:
        e = np.zeros_like(a0)
        e[idx] = h
        want[idx] = (float(np.asarray(grad_norm(a0 + e)[0].realize([])))
                     - float(np.asarray(grad_norm(a0 - e)[0].realize([])))) / (2 * h)
        assert abs(got[idx] - want[idx]) <= 1e-5 * max(1.0, abs(want[idx])), idx


def test_unrelated_inputs_have_zero_adjoints():
    rng = _rng(10)
    a = hl.Buffer(rng.standard_normal((H, W)), "a")
    other = hl.Buffer(rng.standard_normal((3, 4)), "other")
    p = hl.Param(hl.Float(64), "p", 1.5)
    f = hl.Func("f")
    f[x, y] = a[x, y] * 2.0
    d = hl.propagate_adjoints(_sum_sq(f, W, H))
    assert np.all(np.asarray(d[other].realize([4, 3])) == 0)
    assert float(np.asarray(d[p].realize([]))) == 0.0


def test_in_place_updates_that_write_each_point_once():
    """Updates that read only the point they write and write each point once (a predicated
    RDom over the image, a constant point) take the local partial of the update -- here
    value-dependent, read from the value before the update -- at the written points and pass
    the adjoint unchanged elsewhere."""
    def build(arrs, prms):
        a = hl.Buffer(arrs["a"], "a")
        f = hl.Func("f")
        f[x, y] = a[x, y] * 1.5
        r = hl.RDom([(0, W), (0, H)])
        r.where(r.x + r.y < 6)
        f[r.x, r.y] = hl.sin(f[r.x, r.y]) * f[r.x, r.y]
        f[2, 1] = f[2, 1] * f[2, 1] + 0.5
        return _sum_sq_weighted(f, W, H), {"a": a}, {}

    _fd_check(build, {"a": _rng(8).standard_normal((H, W))})
