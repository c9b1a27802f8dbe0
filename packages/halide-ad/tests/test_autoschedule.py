"""``hl.auto_schedule`` (spec §4.2/4.3, CPU): the same values as the unscheduled pipeline,
forward and adjoint; the decisions the rules prescribe; user overrides; clear errors. And the
guarantee that an unscheduled pipeline does no asymptotically more work than all-compute_root,
measured by a deterministic count (loop trips x loads of every realised definition)."""

import math

import halide_ad as hl
import numpy as np
import pytest
from core_ad import sym
from halide_ad import _autoschedule
from halide_ad import _expr as E
from halide_ad._bounds import const_value, interval
from halide_ad._derivative import _values
from halide_ad._graph import Graph
from halide_ad._lower import root_regions
from halide_ad.apps import bilateral_grid, histogram

RNG = np.random.default_rng(7)


def _blur3x3(img, weights):
    """float64 3x3 weighted blur (repeat_edge, an RDom update) and loss = sum(blur^2)."""
    h, w = img.shape
    x, y = hl.Var("x"), hl.Var("y")
    im, wt = hl.Buffer(img, name="img"), hl.Buffer(weights, name="w")
    clamped = hl.BoundaryConditions.repeat_edge(im)
    r = hl.RDom([(0, 3), (0, 3)])
    blur = hl.Func("blur")
    blur[x, y] = hl.f64(0)
    blur[x, y] += clamped[x + r.x - 1, y + r.y - 1] * wt[r.x, r.y]
    s = hl.RDom([(0, w), (0, h)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += blur[s.x, s.y] * blur[s.x, s.y]
    d = hl.propagate_adjoints(loss)
    return {"blur": blur, "loss": loss, "clamped": clamped, "d_img": d[im], "d_w": d[wt]}


def _separable(img):
    """float64 separable [1 2 1] blur, repeat_edge; seeded adjoint of its output."""
    x, y = hl.Var("x"), hl.Var("y")
    im = hl.Buffer(img, name="img")
    clamped = hl.BoundaryConditions.repeat_edge(im)
    blur_x, blur_y, scaled = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("scaled")
    blur_x[x, y] = clamped[x - 1, y] + 2 * clamped[x, y] + clamped[x + 1, y]
    scaled[x, y] = blur_x[x, y] * 0.25  # read element-wise by blur_y only
    blur_y[x, y] = (scaled[x, y - 1] + 2 * scaled[x, y] + scaled[x, y + 1]) * 0.25
    d = hl.propagate_adjoints(blur_y, np.cos(img))
    return {"blur_x": blur_x, "scaled": scaled, "blur_y": blur_y, "clamped": clamped,
            "d_img": d[im]}


def _soft_histogram(img, nbins=16):
    """float64 scatter: hist[bin(v)] += v^2 over the image; loss = sum_i hist[i] * (i + 1)."""
    h, w = img.shape
    i = hl.Var("i")
    im = hl.Buffer(img, name="img")
    r = hl.RDom([(0, w), (0, h)])
    hist = hl.Func("hist")
    hist[i] = hl.f64(0)
    v = im[r.x, r.y]
    hist[hl.clamp(hl.i32(v * nbins), 0, nbins - 1)] += v * v
    b = hl.RDom([(0, nbins)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += hist[b.x] * hl.f64(b.x + 1)
    d = hl.propagate_adjoints(loss)
    return {"hist": hist, "loss": loss, "d_img": d[im]}


def _realize(f, sizes):
    return np.array(np.asarray(f.realize(sizes)), copy=True)


def _assert_close(a, b, rtol=1e-12):
    scale = max(np.abs(b).max(), 1e-300)
    assert np.abs(a - b).max() <= rtol * scale, (np.abs(a - b).max(), scale)


# ---- values -------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["pointwise", "paper"])
def test_blur3x3_forward_and_adjoints_match_unscheduled(rule):
    img, wts = RNG.random((40, 64)), RNG.random((3, 3))
    sizes = {"blur": [64, 40], "loss": [], "d_img": [64, 40], "d_w": [3, 3]}
    ref = {k: _realize(f, sizes[k]) for k, f in _blur3x3(img, wts).items() if k in sizes}
    p = _blur3x3(img, wts)
    outs = [p[k] for k in sizes]
    hl.auto_schedule(outs, {p[k]: sizes[k] for k in sizes}, rule=rule)
    for k in sizes:
        _assert_close(_realize(p[k], sizes[k]), ref[k])


@pytest.mark.parametrize("rule", ["pointwise", "paper"])
def test_separable_blur_and_adjoint_match_unscheduled(rule):
    img = RNG.random((48, 64))
    ref = {k: _realize(_separable(img)[k], [64, 48]) for k in ("blur_y", "d_img")}
    p = _separable(img)
    hl.Pipeline([p["blur_y"], p["d_img"]]).auto_schedule([[64, 48], [64, 48]], rule=rule)
    for k in ref:
        _assert_close(_realize(p[k], [64, 48]), ref[k])


def test_soft_histogram_scatter_and_adjoint_match_unscheduled():
    img = RNG.random((40, 64))
    ref = {k: _realize(_soft_histogram(img)[k], s) for k, s in (("hist", [16]), ("d_img", [64, 40]))}
    p = _soft_histogram(img)
    decided = hl.auto_schedule([p["hist"], p["d_img"]], {p["hist"]: [16], p["d_img"]: [64, 40]})
    _assert_close(_realize(p["hist"], [16]), ref["hist"])
    _assert_close(_realize(p["d_img"], [64, 40]), ref["d_img"])
    # a scatter has no pure Var to parallelise over and cannot be rfactored here: serial
    assert all(d.kind == "serial" for d in p["hist"].update(0)._definition().schedule.dims)
    assert "rfactor skipped" in decided.stages["hist.update(0)"][0]


def test_histogram_app_matches_unscheduled():
    img = RNG.random((40, 64)).astype(np.float32)
    ref = histogram.build(hl, img, nbins=32)
    app = histogram.build(hl, img, nbins=32)
    hl.auto_schedule(list(app.outputs.values()),
                     {app.outputs["hist"]: [32], app.outputs["cdf"]: [32],
                      app.outputs["equalized"]: [64, 40]})
    for name in app.outputs:
        np.testing.assert_array_equal(app.realize(name), ref.realize(name))


def test_bilateral_grid_app_and_adjoint_match_unscheduled():
    img = RNG.random((40, 48)).astype(np.float32)
    seed = RNG.random((40, 48)).astype(np.float32)

    def build():
        app = bilateral_grid.build(hl, img)
        d = hl.propagate_adjoints(app.output, seed)
        return app.output, d[app.buffers["img"]], app

    out0, d0, keep0 = build()
    ref = [_realize(out0, [48, 40]), _realize(d0, [48, 40])]
    out, d_img, keep = build()
    decided = hl.auto_schedule([out, d_img], {out: [48, 40], d_img: [48, 40]})
    # float32: the pipelines are identical up to the order the vectorised loops sum in
    np.testing.assert_allclose(_realize(out, [48, 40]), ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_realize(d_img, [48, 40]), ref[1], rtol=1e-5, atol=1e-5)
    assert decided.levels["blurz"] == "root (not element-wise)"  # a stencil of grid
    assert decided.levels["grid"] == "root (scatters or reduces)"


# ---- decisions ---------------------------------------------------------------------------

def _dims(stage):
    return {d.name: d.kind for d in stage._definition().schedule.dims}


def test_rules_pointwise_inlines_only_trivial_and_elementwise_funcs():
    p = _separable(RNG.random((64, 64)))
    decided = hl.auto_schedule(p["blur_y"], {p["blur_y"]: [64, 64]})
    lv = decided.levels
    assert lv["blur_y"] == "root (output)"
    assert lv[p["clamped"].name()] == "inline (trivial)"
    assert lv["blur_x"] == "inline (element-wise, one caller)"  # read as scaled[x, y]
    assert lv["scaled"] == "root (not element-wise)"  # a stencil: recomputed per tap if inlined
    assert p["blur_x"].compute_level.kind == "inline"
    assert p["scaled"].compute_level.kind == "root"


def _lut_lookup(lut, guide):
    """A per-pixel lookup in a small 3-D table at a data-dependent depth (a bilateral
    slice's access pattern) through repeat_edge, and its adjoint w.r.t. the table."""
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    tb, gu = hl.Buffer(lut, name="lut"), hl.Buffer(guide, name="guide")
    table = hl.BoundaryConditions.repeat_edge(tb)
    depth = lut.shape[0]
    out = hl.Func("sliced")
    z = hl.clamp(hl.i32(gu[x, y] * depth), 0, depth - 1)
    out[x, y, c] = table[x / 8, y / 8, z, c] * gu[x, y]
    d = hl.propagate_adjoints(out, np.ones((lut.shape[0], guide.shape[0], guide.shape[1])))
    return out, table, d[tb]


def test_a_small_buffer_gathered_at_data_dependent_points_is_staged():
    """A table with 4 KiB outer strides, gathered at data-dependent points over a domain
    many times its size, gets a root (padded) copy; a domain about its size keeps the
    boundary condition inline. Values equal the unscheduled pipeline's either way."""
    lut = RNG.random((4, 4, 32, 32))  # (c, depth, gy, gx): 4 KiB between depth planes
    for size, staged in ((256, True), (32, False)):
        guide = RNG.random((size, size)) * 0.999
        out, table, d_lut = _lut_lookup(lut, guide)
        want = [_realize(out, [size, size, 4]), _realize(d_lut, [32, 32, 4, 4])]
        decided = hl.auto_schedule([out, d_lut], {out: [size, size, 4], d_lut: [32, 32, 4, 4]})
        level = decided.levels[table.name()]
        assert level.startswith("root (gathered") == staged, level
        got = hl.Pipeline([out, d_lut]).realize([[size, size, 4], [32, 32, 4, 4]])
        _assert_close(np.asarray(got[0]), want[0])
        _assert_close(np.asarray(got[1]), want[1])


def _shifted_sample(image, offsets, channel=lambda c: c):
    """out[x, y, c] = image[x + offsets[x, y], y, channel(c)] through constant_exterior (a
    flow warp's gather: positions read data, the channel passes through), and its adjoint
    w.r.t. the image."""
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    im, off = hl.Buffer(image, name="image"), hl.Buffer(offsets, name="offsets")
    padded = hl.BoundaryConditions.constant_exterior(im, 0.0)
    out = hl.Func("warped")
    out[x, y, c] = padded[x + hl.clamp(off[x, y], -3, 3), y, channel(c)] * 2.0
    d = hl.propagate_adjoints(out, np.ones(image.shape))
    return out, padded, d[im]


@pytest.mark.parametrize("channels, channel, interleaved", [
    (8, lambda c: c, True),          # 8 channels passed through: one copy, channels innermost
    (2, lambda c: c, False),         # too few to fill a cache line's worth
    (8, lambda c: 7 - c, False),     # the channel is computed, not passed through
])
def test_a_buffer_gathered_per_channel_gets_an_interleaved_copy(channels, channel,
                                                                 interleaved):
    """A Buffer read at data-dependent points, whose channel every such read passes through
    unchanged, is copied at the root with the channels innermost (each gathered point's
    channels then share cache lines), the copy vectorised along x with the channel loop just
    outside; otherwise its boundary condition stays inline. Values equal the unscheduled
    pipeline's either way."""
    image = RNG.random((channels, 64, 128))  # 8 x 4 tiles: the rows are tiled, not copied
    offsets = RNG.integers(-3, 4, (64, 128)).astype(np.int32)
    out, padded, d_image = _shifted_sample(image, offsets, channel)
    sizes = [[128, 64, channels], [128, 64, channels]]
    want = [_realize(out, sizes[0]), _realize(d_image, sizes[1])]
    decided = hl.auto_schedule([out, d_image], dict(zip([out, d_image], sizes)))
    level = decided.levels[padded.name()]
    assert ("innermost" in level) == interleaved, level
    assert level.startswith("root") == interleaved, level
    if interleaved:
        c_dim = padded._pure_arg_names[2]
        assert padded.storage_order == [2, 0, 1]
        dims = [(d.name, d.kind) for d in padded._definition().schedule.dims]
        assert dims[0][1] == "vectorized" and dims[1][0] == c_dim, dims
    got = hl.Pipeline([out, d_image]).realize(sizes)
    _assert_close(np.asarray(got[0]), want[0])
    _assert_close(np.asarray(got[1]), want[1])


def test_rules_paper_inlines_single_caller_stencils():
    p = _separable(RNG.random((64, 64)))
    decided = hl.auto_schedule(p["blur_y"], {p["blur_y"]: [64, 64]}, rule="paper")
    assert decided.levels["scaled"] == "inline (one caller)"
    assert decided.levels["blur_x"] == "inline (one caller)"


def test_rules_tiles_vectorises_parallelises_root_stages():
    p = _blur3x3(RNG.random((64, 64)), RNG.random((3, 3)))
    outs = [p["blur"], p["d_img"], p["d_w"]]
    decided = hl.auto_schedule(outs, {p["blur"]: [64, 64], p["d_img"]: [64, 64],
                                      p["d_w"]: [3, 3]})
    # 64 x 64: (64/16)^2 = 16 >= 8 tiles of 16 x 16, parallel tile index outermost
    for stage in (p["blur"], p["blur"].update(0)):
        sched = stage._definition().schedule
        # innermost first: the RVars (an update's), then the 8 vector lanes
        nr = sum(not d.pure for d in sched.dims)
        assert [(d.pure, d.kind) for d in sched.dims[:nr]] == [(False, "serial")] * nr
        vec = sched.dims[nr]
        assert (vec.name, vec.kind, vec.factor) == ("x.ti.v", "vectorized", 8)
        assert sched.dims[-1].name == "x.y.t" and sched.dims[-1].kind == "parallel"
        assert [s.factor for s in sched.splits if s.kind == "split"][:2] == [16, 16]
    assert sum(not d.pure for d in p["blur"].update(0)._definition().schedule.dims) == 2
    # d_w: a 3 x 3 domain reducing over 64 x 64 -> rfactor, the partial sums parallel
    assert len(decided.rfactored) == 1
    intm = decided.rfactored[0]
    assert intm.compute_level.kind == "root"
    dims = intm.update(0)._definition().schedule.dims
    kinds = [d.kind for d in dims]
    # innermost first: the 3 x 3 weights unrolled inside the rows (each row's reads of the
    # adjoint serve all nine), the rows, the vector lanes; the strips parallel
    assert kinds[:4] == ["unrolled", "unrolled", "serial", "vectorized"], kinds
    assert kinds[-1] == "parallel"
    # the vectorised new dimension is the intermediate's first (innermost in storage): the
    # lanes' partial sums are consecutive, loaded and stored as one vector
    assert dims[3].name.startswith(intm._pure_arg_names[0] + "."), (dims[3].name, intm)
    assert decided.stages["w_d.update(0)"][0].startswith("rfactor(")
    # the repeat_edge wrapper costs a load: inlined
    assert decided.levels[p["clamped"].name()] == "inline (trivial)"


def test_small_domains_stay_serial_and_loss_is_rfactored():
    img, wts = RNG.random((24, 24)), RNG.random((3, 3))
    ref = _realize(_blur3x3(img, wts)["loss"], [])
    p = _blur3x3(img, wts)
    decided = hl.auto_schedule([p["loss"]], {p["loss"]: []})
    # 24 x 24: (24/16)^2 = 1 < 8 tiles, and no dimension of 256 x 8
    assert all(k == "serial" for k in _dims(p["blur"]).values())
    assert decided.stages["loss.update(0)"][0].startswith("rfactor(")
    _assert_close(_realize(p["loss"], []), ref)


def test_user_overrides_win():
    p = _separable(RNG.random((64, 64)))
    decided = hl.auto_schedule(p["blur_y"], {p["blur_y"]: [64, 64]},
                               inline=[p["scaled"]], no_inline=["blur_x"])
    assert decided.levels["scaled"] == "inline (user)"
    assert decided.levels["blur_x"] == "root (user)"
    assert p["scaled"].compute_level.kind == "inline"
    assert p["blur_x"].compute_level.kind == "root"


def test_auto_schedule_replaces_earlier_schedules():
    p = _separable(RNG.random((64, 64)))
    p["blur_x"].compute_root().parallel(hl.Var("y"))
    hl.auto_schedule(p["blur_y"], {p["blur_y"]: [64, 64]})
    assert p["blur_x"].compute_level.kind == "inline"
    assert all(d.kind == "serial" for d in p["blur_x"]._definition().schedule.dims)


# ---- errors ------------------------------------------------------------------------------

def test_unknown_func_in_inline_list_is_named():
    p = _separable(RNG.random((16, 16)))
    stranger = hl.Func("stranger")
    stranger[hl.Var("x")] = hl.f64(1)
    with pytest.raises(hl.ScheduleError, match="inline names Func stranger, which the pipeline"):
        hl.auto_schedule(p["blur_y"], {p["blur_y"]: [16, 16]}, inline=[stranger])
    with pytest.raises(hl.ScheduleError, match="no_inline names 'nope', but the pipeline has"
                                               " no Func of that name"):
        hl.auto_schedule(p["blur_y"], {p["blur_y"]: [16, 16]}, no_inline=["nope"])


def test_bad_overrides_and_options_raise():
    p = _blur3x3(RNG.random((16, 16)), RNG.random((3, 3)))
    est = {p["loss"]: []}
    with pytest.raises(hl.ScheduleError, match="blur is a Func with update definitions"):
        hl.auto_schedule(p["loss"], est, inline=[p["blur"]])
    with pytest.raises(hl.ScheduleError, match="loss is a pipeline output"):
        hl.auto_schedule(p["loss"], est, inline=[p["loss"]])
    with pytest.raises(hl.ScheduleError, match="in both inline and no_inline"):
        hl.auto_schedule(p["loss"], est, inline=[p["clamped"]], no_inline=[p["clamped"]])
    with pytest.raises(hl.ScheduleError, match="target must be 'cpu' or 'gpu', got 'metal'"):
        hl.auto_schedule(p["loss"], est, target="metal")
    with pytest.raises(hl.ScheduleError, match="no size estimate for output blur"):
        hl.auto_schedule(p["blur"])
    with pytest.raises(hl.ScheduleError, match="must be positive integers"):
        hl.auto_schedule(p["loss"], est, tile=(16, 0))
    with pytest.raises(hl.ScheduleError, match="rule must be one of"):
        hl.auto_schedule(p["loss"], est, rule="greedy")
    with pytest.raises(hl.ScheduleError, match="has 2 dimension"):
        hl.auto_schedule(p["blur"], {p["blur"]: [16]})


def test_set_estimates_are_used():
    p = _blur3x3(RNG.random((64, 64)), RNG.random((3, 3)))
    p["blur"].set_estimates([(0, 64), (0, 64)])
    hl.auto_schedule(p["blur"])
    assert _dims(p["blur"])["x.y.t"] == "parallel"


# ---- the guarantee: unscheduled is never asymptotically worse than all-root ----------------

def _work(outputs, sizes):
    """Deterministic work of the lowered pipeline: for every realised definition, its loop
    trips (pure region x RDom extents) times the loads in its (inlined) body."""
    g = Graph(outputs)
    values = _values(g)
    regions = root_regions(g, {o.fid: [(0, e) for e in s] for o, s in zip(outputs, sizes)},
                           values)
    env = {leaf: (sym.const(v, leaf.dtype),) * 2 for leaf, v in values.items()}
    total = 0
    for fid in g.order:
        ext = dict(zip(g.funcs[fid]._pure_arg_names, (e for _, e in regions[fid])))
        for d in g.defs[fid]:
            trips = math.prod(ext[n] for n in d.source.pure_var_names())
            for _, _, rext in d.rvars:
                trips *= int(const_value(interval(rext, env)[0]))
            total += trips * max(len(sym.calls(d.nodes(), E.CALL)), 1)
    return total


@pytest.mark.parametrize("build", [_separable, lambda img: _blur3x3(img, RNG.random((3, 3)))])
def test_unscheduled_adjoint_work_grows_linearly_like_all_root(build):
    unscheduled, root = [], []
    for n in (64, 128, 256):
        img = RNG.random((n, n))
        unscheduled.append(_work([build(img)["d_img"]], [[n, n]]))
        p = build(img)
        for f in Graph([p["d_img"]]).funcs.values():
            if f is not p["d_img"]:
                f.compute_root()
        root.append(_work([p["d_img"]], [[n, n]]))
    for w in (unscheduled, root):  # 4x the pixels: 4x the work, up to the borders (N^3: 8x)
        assert all(3.8 < b / a < 4.2 for a, b in zip(w, w[1:])), w
    ratios = [u / r for u, r in zip(unscheduled, root)]
    # a constant factor at every size, up to the O(N) border lines and corners of a clamped
    # read's adjoint (inlined unscheduled, their share shrinks as 1/N): an N^3 or N^4
    # unscheduled adjoint would change the ratio 2-4x per step
    assert max(ratios) / min(ratios) < 1.05, ratios


def test_funcs_with_one_name_keep_separate_records():
    x = hl.Var("x")
    im = hl.Buffer(RNG.random(300), name="img")
    a, b, out = hl.Func("same"), hl.Func("same"), hl.Func("out")
    a[x] = im[x] * 2
    b[x] = a[x - 1] + a[x + 1]
    out[x] = b[x - 1] * b[x + 1]
    decided = hl.auto_schedule(out, {out: [(2, 296)]}, no_inline=[a])
    # consumers are decided first: b keeps the name, a is recorded under its unique id
    assert decided.levels == {"out": "root (output)", "same": "root (not element-wise)",
                              a.fid: "root (user)"}
    with pytest.raises(hl.ScheduleError, match="has 2 Funcs of that name"):
        hl.auto_schedule(out, {out: [(2, 296)]}, inline=["same"])


def test_pipeline_auto_schedule_uses_the_last_realize_sizes():
    img = RNG.random((64, 64))
    ref = _realize(_separable(img)["blur_y"], [64, 64])
    p = _separable(img)
    pipe = hl.Pipeline(p["blur_y"])
    with pytest.raises(hl.ScheduleError, match="no size estimate for output blur_y"):
        pipe.auto_schedule()
    pipe.realize([64, 64])
    decided = pipe.auto_schedule()
    assert decided.stages["blur_y"][0] == "tile(x, y, 16, 16)"
    _assert_close(np.asarray(pipe.realize([64, 64])), ref)


def _signal_loss(sig, associative=True):
    """float64 1-D reductions over 5000 samples (not a multiple of 256), one with a predicate:
    loss = sum over s > 0.3 of sin(s)^2; its adjoint."""
    i = hl.Var("i")
    buf = hl.Buffer(sig, name="sig")
    r = hl.RDom([(0, sig.size)])
    r.where(buf[r.x] > 0.3)
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    if associative:
        loss[()] += hl.sin(buf[r.x]) ** 2
    else:  # a decaying sum: not f op e
        loss[()] = loss[()] * 0.999 + hl.sin(buf[r.x]) ** 2
    grad = hl.Func("grad")
    grad[i] = buf[i] * 2
    return loss, grad, buf


def test_long_1d_reduction_is_split_and_rfactored():
    sig = RNG.random(5000)
    ref = _realize(_signal_loss(sig)[0], [])
    loss, _, _ = _signal_loss(sig)
    decided = hl.auto_schedule(loss, {loss: []})
    assert decided.stages["loss.update(0)"][0].startswith("split(")
    intm = decided.rfactored[0]
    assert intm.dimensions() == 2  # 16 lanes x ceil(5000 / 256) chunks
    kinds = {d.name: d.kind for d in intm.update(0)._definition().schedule.dims}
    assert list(kinds.values())[0] == "serial"  # the 16 partial sums of one lane
    assert sorted(kinds.values())[-1] == "vectorized" and "parallel" in kinds.values()
    _assert_close(_realize(loss, []), ref)


def test_non_associative_reduction_is_left_serial():
    sig = RNG.random(5000)
    ref = _realize(_signal_loss(sig, associative=False)[0], [])
    loss, _, _ = _signal_loss(sig, associative=False)
    decided = hl.auto_schedule(loss, {loss: []})
    assert decided.stages["loss.update(0)"][0].startswith("rfactor skipped (")
    assert not decided.rfactored
    np.testing.assert_array_equal(_realize(loss, []), ref)


def _shifted_exterior(img, flow):
    """float64 gather through zero padding at a data-dependent row offset, per channel:
    out(x, y, c) = ext(x + 1, y + floor(3 flow(x, y)), c) flow(x, y); the padding's adjoint
    reads d_ext at clamped coordinates."""
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    im, fl = hl.Buffer(img, name="img"), hl.Buffer(flow, name="flow")
    ext = hl.BoundaryConditions.constant_exterior(im, hl.f64(0))
    out = hl.Func("out")
    out[x, y, c] = ext[x + 1, y + hl.clamp(hl.i32(hl.floor(3 * fl[x, y])), 0, 3), c] * fl[x, y]
    d = hl.propagate_adjoints(out, np.cos(img))
    return {"out": out, "d_img": d[im], "d_flow": d[fl]}


def test_padding_adjoint_is_a_gather_with_parallel_edge_updates():
    img, flow = RNG.random((16, 20, 24)), RNG.random((20, 24))
    sizes = {"out": [24, 20, 16], "d_img": [24, 20, 16], "d_flow": [24, 20]}
    ref = {k: _realize(f, sizes[k]) for k, f in _shifted_exterior(img, flow).items()}
    p = _shifted_exterior(img, flow)
    decided = hl.auto_schedule(list(p.values()), {p[k]: sizes[k] for k in sizes})
    for k in sizes:
        _assert_close(_realize(p[k], sizes[k]), ref[k])
    # the clamps of the padding's read split into a pure gather plus its edges (lines at a
    # constant coordinate), each update parallel over its pure Vars
    updates = p["d_img"].definitions()[1:]
    assert updates
    for df in updates:
        assert not any(getattr(n, "kind", None) == "hl.rvar"
                       for a in df.args for n in hl._expr.sym.free_leaves(a)), df.args
    whys = [s for k, v in decided.stages.items() if k.startswith("img_d.update") for s in v]
    assert len(whys) == len(updates) and all(w.startswith("parallel(") for w in whys), whys


def _column_histograms(data, w):
    """A scatter with no pure Var whose first coordinate is the RVar itself: per column
    ``r.x``, a histogram of the data-dependent bins of its rows."""
    x, y = hl.Var("x"), hl.Var("y")
    dat, wt = hl.Buffer(data, name="data"), hl.Buffer(w, name="w")
    r = hl.RDom([(0, data.shape[1]), (0, data.shape[0])])
    hist = hl.Func("hist")
    hist[x, y] = hl.f64(0)
    hist[r.x, hl.clamp(hl.i32(dat[r.x, r.y] * 4.0), 0, 3)] += wt[r.x, r.y]
    return hist


def test_scatter_writing_each_column_once_runs_parallel_over_it():
    data, w = RNG.random((30, 40)), RNG.random((30, 40))
    ref = _realize(_column_histograms(data, w), [40, 4])
    hist = _column_histograms(data, w)
    decided = hl.auto_schedule([hist], {hist: [40, 4]})
    (why,) = decided.stages["hist.update(0)"]
    assert why.startswith("parallel(") and "disjoint" in why, why
    # outermost: only the outermost loop of a definition runs on the thread pool (an inner
    # "parallel" loop used to run serially here)
    assert hist.update(0)._definition().schedule.dims[-1].kind == "parallel"
    assert "\n  parallel r" in hl.Pipeline([hist]).loop_nest()
    got = _realize(hist, [40, 4])
    np.testing.assert_array_equal(got, ref)  # each column's updates in the same order


def test_rvar_parallel_by_hand_is_still_refused_by_name():
    p = _soft_histogram(RNG.random((8, 8)))
    rx = p["hist"].update(0)._definition().schedule.dims[0].name
    with pytest.raises(hl.ScheduleError, match="cannot parallelize the reduction dimension"):
        p["hist"].update(0).parallel(rx)


def test_tile_origin_is_computed_once_per_row_not_per_lane():
    """In a 16x16-tiled, vectorised loop the tile's origin (floor division and modulo of the
    fused tile index) does not depend on the vector lane: it is emitted as scalars, never as
    a vector division (8 scalar divisions on x86, per row). The values are unchanged."""
    n = 64
    img = RNG.random((n + 2, n + 2))
    im = hl.Buffer(img, name="img")
    x, y = hl.Var("x"), hl.Var("y")
    f = hl.Func("masked_copy")
    f[x, y] = hl.select((x > 3) & (y < n - 5), im[hl.clamp(x + 1, 0, n), y + 1], hl.f64(-1))
    decided = hl.auto_schedule([f], {f: [n, n]})
    assert any("vectorize" in s for s in decided.stages[decided.key(f)]), decided.stages
    p = hl.Pipeline([f])
    assert "sdiv <" not in p.ir() and "srem <" not in p.ir()
    xs, ys = np.meshgrid(np.arange(n), np.arange(n))
    want = np.where((xs > 3) & (ys < n - 5), img[ys + 1, np.minimum(xs + 1, n)], -1.0)
    np.testing.assert_array_equal(np.asarray(p.realize([n, n])), want)


def test_channel_loop_of_a_bilinear_sample_sits_just_outside_the_vector_loop():
    """The sample's coordinates and weights are per pixel: the channel loop goes just outside
    the vector loop (LLVM computes them once per vector of pixels, not once per channel), a
    pointwise map over channels keeps its order. Values match the unscheduled pipeline's to
    rounding (vector code re-associates lane-invariant arithmetic)."""
    n, ch = 64, 5
    img = RNG.random((ch, n, n))
    im = hl.BoundaryConditions.repeat_edge(hl.Buffer(img, name="img"))
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    sx = hl.f64(x) * 0.9 + hl.f64(y) * 0.07 + 0.25   # exact arithmetic: vector = scalar
    sy = hl.f64(y) * 0.8 - hl.f64(x) * 0.05 + 1.5
    ix, iy = hl.i32(hl.floor(sx)), hl.i32(hl.floor(sy))
    fx, fy = sx - hl.floor(sx), sy - hl.floor(sy)
    warp = hl.Func("warp")
    warp[x, y, c] = hl.lerp(hl.lerp(im[ix, iy, c], im[ix + 1, iy, c], fx),
                            hl.lerp(im[ix, iy + 1, c], im[ix + 1, iy + 1, c], fx), fy)
    want = _realize(warp, [n, n, ch])
    decided = hl.auto_schedule([warp], {warp: [n, n, ch]})
    assert any("c just outside the vector loop" in s for s in decided.stages["warp"])
    nest = hl.Pipeline([warp]).loop_nest().split("vectorized")[0].splitlines()
    assert nest[-2].strip().startswith("for c in"), nest
    _assert_close(_realize(warp, [n, n, ch]), want)

    scale, img2 = hl.Func("scale"), hl.Buffer(img, name="img2")
    scale[x, y, c] = img2[x, y, c] * hl.f64(c + 1)
    decided = hl.auto_schedule([scale], {scale: [n, n, ch]})
    assert not any("outside the vector loop" in s for s in decided.stages["scale"])
    assert any("fuse(c into the parallel tiles)" in s for s in decided.stages["scale"])
    nest = hl.Pipeline([scale]).loop_nest()
    assert "parallel x.y.t.c in" in nest, nest


def test_plain_copy_keeps_its_channels_outside_the_tiles():
    """A copy has no value arithmetic for the channel loop to share: its planes join the
    parallel loop (each task one tile of one plane), they are not looped inside a tile."""
    x, y, c, n = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("n")
    src = hl.Buffer(RNG.random((3, 4, 64, 97)), name="src")
    copy = hl.Func("copy")
    copy[x, y, c, n] = src[x + 1, y, c, n]
    decided = hl.auto_schedule([copy], {copy: [96, 64, 4, 3]})
    assert not any("outside the vector loop" in s for s in decided.stages["copy"])
    assert any("fuse(c, n into the parallel tiles)" in s for s in decided.stages["copy"])
    np.testing.assert_array_equal(_realize(copy, [96, 64, 4, 3]), src.numpy()[..., 1:])


def test_scatter_over_few_images_splits_the_channels_for_parallelism():
    """A bilinear scatter ``d(ix(x, y, n), iy(x, y, n), c, n) += ..`` over 2 images: the
    channels not read by the coordinates stay innermost (coordinates once per pixel), and
    half of them join the images in parallel (2 x 4 parallel iterations reach min_threads)."""
    x, y, c, n = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("n")
    size, ch, imgs = 20, 8, 2
    pos = RNG.uniform(0, size - 1, (imgs, 2, size, size))
    vals = RNG.random((imgs, ch, size, size))
    pb, vb = hl.Buffer(pos, name="pos"), hl.Buffer(vals, name="vals")
    r = hl.RDom([(0, size), (0, size)], name="r")
    ix = hl.clamp(hl.i32(pb[r.x, r.y, 0, n]), 0, size - 1)
    iy = hl.clamp(hl.i32(pb[r.x, r.y, 1, n]), 0, size - 1)
    d = hl.Func("d")
    d[x, y, c, n] = hl.f64(0)
    d[ix, iy, c, n] += vb[r.x, r.y, c, n]
    decided = hl.auto_schedule([d], {d: [size, size, ch, imgs]})
    stage = decided.stages["d.update(0)"]
    assert any(s.startswith("split(c, 2)") for s in stage), stage
    assert any("c.i innermost" in s for s in stage), stage
    want = np.zeros((imgs, ch, size, size))
    k = np.clip(pos.astype(int), 0, size - 1)
    for b in range(imgs):
        for yy in range(size):
            for xx in range(size):
                want[b, :, k[b, 1, yy, xx], k[b, 0, yy, xx]] += vals[b, :, yy, xx]
    np.testing.assert_array_equal(_realize(d, [size, size, ch, imgs]), want)


@pytest.mark.parametrize("host_lanes", [8, 16])
def test_scattered_channels_are_not_split_below_a_host_vector(monkeypatch, host_lanes):
    """A spatial transformer's image adjoint scatters 16 channels stored innermost over 4
    images (4 parallel iterations, below min_threads): with 8-lane host vectors (AVX2) the
    channels split into 2 parallel parts of one vector each; with 16 lanes (AVX-512) one
    16-lane vector per corner, not 2 parts that would each redo the pixel's coordinates.
    Values match the unscheduled pipeline's."""
    from halide_ad.apps import _common, spatial_transformer
    monkeypatch.setattr(_autoschedule.codegen, "host_vector_width", lambda dtype: host_lanes)
    image = RNG.standard_normal((4, 16, 24, 24)).astype(np.float32)
    theta = np.tile(np.array([[0.1, 0.9, 0.05], [0.95, -0.1, 0.0]], np.float32), (4, 1, 1))
    app = spatial_transformer.build(hl, image, theta)
    d_out = RNG.standard_normal((4, 16, 24, 24)).astype(np.float32)
    _, _, want = _common.adjoint_pipeline(hl, app, d_out, ("image",), schedule=False)
    p, funcs, got = _common.adjoint_pipeline(hl, app, d_out, ("image",), schedule=False)
    hl.Pipeline(funcs).realize([hl.Buffer(a) for a in want])
    decided = hl.auto_schedule(funcs, {f: list(reversed(a.shape)) for f, a in zip(funcs, got)})
    stage = next(v for k, v in decided.stages.items()
                 if k.endswith("_d.update(0)") and any("stored innermost" in s for s in v))
    if host_lanes == 16:
        assert "_d2 not split below 16 lanes" in stage and "parallel(_d3)" in stage, stage
        assert "vectorize(_d2, 16): stored innermost" in stage, stage
    else:
        assert "split(_d2, 8): 2 parts in parallel" in stage, stage
        assert "vectorize(_d2.i, 8): stored innermost" in stage, stage
    hl.Pipeline(funcs).realize([hl.Buffer(a) for a in got])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


def _warp(n, ch, data_dependent, images=2):
    """``out(x, y, c, b) = img(x + dx, y + dy, c, b)``, the offsets read from data (a flow
    warp) or known from the loops (``(1, -1)``); ``"affine"``: a transpose scaled by a
    per-image factor read from data through a Func (a spatial transformer's sampling grid)."""
    x, y, c, b = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("b")
    img = hl.Buffer(RNG.random((images, ch, n, n)), name="img")
    off = hl.Buffer(RNG.integers(-n // 2, n // 2, (images, 2, n, n)).astype(np.float64),
                    name="off")
    src = hl.BoundaryConditions.repeat_edge(img)
    out = hl.Func("out")
    if data_dependent == "affine":
        scale = hl.Buffer(RNG.uniform(0.5, 1.0, images), name="scale")
        grid = hl.Func("grid")
        grid[x, y, b] = hl.f64(y) * scale[b]
        grid.compute_root()
        at = [hl.clamp(hl.i32(grid[x, y, b]), 0, n - 1), hl.clamp(x, 0, n - 1)]
    elif data_dependent:
        at = [hl.clamp(v + hl.i32(off[x, y, k, b]), 0, n - 1) for k, v in enumerate((x, y))]
    else:
        at = [x + 1, y - 1]
    out[x, y, c, b] = src[at[0], at[1], c, b] * (hl.f64(x) * 0.5 + hl.f64(y) * 0.25 + 1.0)
    return out, img


@pytest.mark.parametrize("data_dependent", [True, False])
def test_channels_gathered_at_data_dependent_positions_go_a_few_planes_at_a_time(
        monkeypatch, data_dependent):
    """Past ``CHANNEL_BYTES`` of planes read at data-dependent positions (a flow warp's random
    offsets) the channel loop is split: a few planes per vector, the rest in the parallel
    loop; the scatter of the adjoint stores the channels innermost and writes them as
    vectors instead (no planes); the positions of a plain stencil are not data: no split.
    Values match the unscheduled pipeline's."""
    monkeypatch.setattr(_autoschedule, "CHANNEL_BYTES", 4 * 64 * 64 * 8)  # 4 planes
    n, ch = 64, 12
    out, img = _warp(n, ch, data_dependent)
    d_img = hl.propagate_adjoints(out, np.ones((2, ch, n, n)))[img]
    size = [n, n, ch, 2]
    want = [_realize(out, size), _realize(d_img, size)]
    decided = hl.auto_schedule([out, d_img], {out: size, d_img: size})
    split = [s for stage in decided.stages.values() for s in stage if "planes" in s]
    if data_dependent:
        assert any(s.startswith("split(c, 4): 4 planes per vector") for s in
                   decided.stages["out"]), decided
        stages = [s for stage in decided.stages.values() for s in stage]
        assert any(s.startswith("reorder_storage(_d2 innermost") for s in stages), decided
        assert any(s.startswith("vectorize(_d2") and s.endswith("stored innermost")
                   for s in stages), decided
        # the adjoint read back across the channels: each vector's lines serve them all
        assert any(s.startswith("_d2 just outside the vector loop") for s in stages), decided
    else:
        assert not split, decided
    np.testing.assert_array_equal(_realize(out, size), want[0])
    np.testing.assert_array_equal(_realize(d_img, size), want[1])


def test_rows_stream_and_affinely_warped_reads_keep_square_tiles():
    """Stencils and element-wise reads are tiled in rows (256 x 1) once the rows are that
    long; a read through an affine sampling grid keeps 16 x 16 tiles (a compact source
    block whatever the grid's orientation); narrow images keep square tiles. Values match
    the unscheduled pipelines'."""
    p = _separable(RNG.random((64, 512)))
    want = _realize(p["blur_y"], [512, 64])
    decided = hl.auto_schedule(p["blur_y"], {p["blur_y"]: [512, 64]})
    assert "tile(x, y, 256, 1)" in decided.stages["blur_y"], decided
    _assert_close(_realize(p["blur_y"], [512, 64]), want)
    narrow = _separable(RNG.random((64, 64)))
    decided = hl.auto_schedule(narrow["blur_y"], {narrow["blur_y"]: [64, 64]})
    assert "tile(x, y, 16, 16)" in decided.stages["blur_y"], decided
    out, _ = _warp(256, 2, "affine")
    size = [256, 256, 2, 2]
    want = _realize(out, size)
    decided = hl.auto_schedule([out], {out: size})
    assert "tile(x, y, 16, 16)" in decided.stages["out"], decided
    np.testing.assert_array_equal(_realize(out, size), want)


def test_channels_gathered_at_coherent_positions_stay_together(monkeypatch):
    """Positions read from data through a Func that reads its data per image only (an affine
    sampling grid: neighbouring pixels sample neighbours) are not split into planes: the
    chunking is for scattered reads (a flow field), and cost the spatial transformer's
    forward and coordinate gradient 10-20%. Values match the unscheduled pipeline's."""
    monkeypatch.setattr(_autoschedule, "CHANNEL_BYTES", 4 * 64 * 64 * 8)  # 4 planes
    n, ch = 64, 12
    out, img = _warp(n, ch, "affine")
    size = [n, n, ch, 2]
    want = _realize(out, size)
    decided = hl.auto_schedule([out], {out: size})
    assert not [s for stage in decided.stages.values() for s in stage if "planes" in s], decided
    np.testing.assert_array_equal(_realize(out, size), want)


def test_reduction_over_planes_gathered_from_data_runs_in_passes(monkeypatch):
    """A coordinate gradient summing over 12 channels read at data-dependent positions goes
    over the image in passes of a few planes (the passes outside the parallel tiles); each
    pixel sums in the same order, so the values are bit-identical."""
    monkeypatch.setattr(_autoschedule, "CHANNEL_BYTES", 4 * 64 * 64 * 8)
    n, ch = 64, 12
    x, y = hl.Var("x"), hl.Var("y")
    img = hl.Buffer(RNG.random((ch, n, n)), name="img")
    pos = hl.Buffer(RNG.uniform(0, n - 1, (n, n)), name="pos")
    r = hl.RDom([(0, ch)], name="r")
    g = hl.Func("g")
    i0 = hl.clamp(hl.i32(pos[x, y]), 0, n - 2)
    g[x, y] = hl.f64(0)
    g[x, y] += img[i0 + 1, y, r.x] - img[i0, y, r.x]
    want = _realize(g, [n, n])
    decided = hl.auto_schedule([g], {g: [n, n]})
    assert any(s.startswith("split(r.x, 4): 4 planes per pass") for s in
               decided.stages["g.update(0)"]), decided
    lines = [ln.strip() for ln in hl.Pipeline([g]).loop_nest().splitlines()]
    k = next(i for i, ln in enumerate(lines) if ln.startswith("for r.x in"))
    assert lines[k + 1].startswith("parallel"), lines
    np.testing.assert_array_equal(_realize(g, [n, n]), want)
