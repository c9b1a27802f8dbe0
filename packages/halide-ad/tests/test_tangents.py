"""propagate_tangents against central finite differences in float64, and the transpose
identity <J^T w, v> == <w, J v> against propagate_adjoints.

Each case realises the tangent Func of a float64 output for random inputs and random
tangents (non-square images, non-symmetric stencils) and compares it with
``(F(x + h v) - F(x - h v)) / 2h`` over the whole output, h = 1e-6: the pipelines are smooth in
O(1) values, so truncation ~ 1e-12 and rounding ~ 1e-10; the tolerance 1e-7 relative to the
largest entry leaves room for both. The transpose identity is exact up to rounding (1e-10).
"""

import numpy as np
import pytest

import halide_ad as hl

H, W = 5, 7
TOL = 1e-7
x, y = hl.Var("x"), hl.Var("y")


def _rng(seed):
    return np.random.default_rng(seed)


def _jvp_check(build, arrays, params=None, size=(W, H), h=1e-6):
    """``build(arrays, params) -> (out, {name: Buffer}, {name: Param})``; tangents: random
    for every array and Param. Returns the realised JVP."""
    params = params or {}
    rng = _rng(len(arrays) + 10 * len(params))
    va = {k: rng.standard_normal(a.shape) for k, a in arrays.items()}
    vp = {k: float(rng.standard_normal()) for k in params}
    out, bufs, ps = build(arrays, params)
    tans = {bufs[k]: v for k, v in va.items()}
    tans.update({ps[k]: v for k, v in vp.items()})
    t = hl.propagate_tangents(out, tans)
    got = np.asarray(t[out].realize(list(size)))

    def value(s):
        arrs = {k: a + s * va[k] for k, a in arrays.items()}
        prms = {k: p + s * vp[k] for k, p in params.items()}
        built = build(arrs, prms)  # holds the Params: Funcs reference them weakly
        return np.asarray(built[0].realize(list(size)))

    want = (value(h) - value(-h)) / (2 * h)
    scale = max(1.0, np.abs(want).max())
    assert np.abs(got - want).max() <= TOL * scale, (got, want)
    assert np.abs(want).max() > 1e-3  # the check is not vacuous
    return t, out, bufs


def test_pointwise_with_params():
    def build(arrs, prms):
        a, b = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["b"], "b")
        g = hl.Param(hl.Float(64), "g", prms["g"])
        f = hl.Func("f")
        f[x, y] = hl.sin(a[x, y]) * b[x, y] * g + hl.exp(a[x, y] * 0.3) / (2.0 + b[x, y] ** 2)
        return f, {"a": a, "b": b}, {"g": g}

    rng = _rng(0)
    _jvp_check(build, {"a": rng.standard_normal((H, W)), "b": rng.standard_normal((H, W))},
               {"g": 0.7})


BOUNDARIES = {
    "repeat_edge": lambda b: hl.BoundaryConditions.repeat_edge(b),
    "constant_exterior": lambda b: hl.BoundaryConditions.constant_exterior(b, 0.25),
    "repeat_image": lambda b: hl.BoundaryConditions.repeat_image(b),
    "mirror_image": lambda b: hl.BoundaryConditions.mirror_image(b),
    "mirror_interior": lambda b: hl.BoundaryConditions.mirror_interior(b),
}


def _stencil(bc):
    def build(arrs, prms):
        a, k = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["k"], "k")
        c = BOUNDARIES[bc](a)
        bx = hl.Func("bx")
        bx[x, y] = (c[x - 2, y] * k[hl.i32(0)] + c[x, y] * k[hl.i32(1)]
                    + c[x + 1, y] * k[hl.i32(2)])
        by = hl.Func("by")
        by[x, y] = bx[x, y - 1] * 0.3 + bx[x, y] * bx[x, y] + hl.sin(bx[x, y + 2])
        return by, {"a": a, "k": k}, {}
    return build


@pytest.mark.parametrize("bc", sorted(BOUNDARIES))
def test_stencil_every_boundary_condition(bc):
    rng = _rng(1)
    _jvp_check(_stencil(bc), {"a": rng.standard_normal((H, W)), "k": rng.standard_normal(3)})


def _conv(arrs, prms):
    a, k = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["k"], "k")
    c = hl.BoundaryConditions.constant_exterior(a, 0.0)
    r = hl.RDom([(0, 4)])
    out = hl.Func("out")
    out[x] = hl.f64(0)
    out[x] += c[x - r.x] * k[r.x] * c[x - r.x]
    return out, {"a": a, "k": k}, {}


def test_rdom_reduction():
    rng = _rng(2)
    _jvp_check(_conv, {"a": rng.standard_normal(9), "k": rng.standard_normal(4)}, size=(9,))


def _updates(arrs, prms, scans=True):
    """A pointwise nonlinear in-place update, a masked overwrite over an RDom, a linear scan
    and a nonlinear scan (propagate_adjoints refuses scans: ``scans=False`` leaves them out)."""
    a = hl.Buffer(arrs["a"], "a")
    g = hl.Param(hl.Float(64), "g", prms["g"])
    f = hl.Func("f")
    f[x, y] = a[x, y] * g
    f[x, y] = f[x, y] * f[x, y] + a[x, y]
    r = hl.RDom([(1, 3)])
    f[r.x, 2] = a[r.x, 0] * 2.0
    if scans:
        s = hl.RDom([(1, W - 1)])
        f[s.x, y] = f[s.x - 1, y] * 0.5 + f[s.x, y]
        f[s.x, y] = hl.sin(f[s.x - 1, y]) * f[s.x, y]
    return f, {"a": a}, {"g": g}


def test_update_stages_and_scans():
    rng = _rng(3)
    t, f, bufs = _jvp_check(_updates, {"a": rng.standard_normal((H, W)) * 0.5}, {"g": 0.7})
    assert len(t[f].definitions()) == 1  # the nonlinear scan: a (value, tangent) Tuple


def test_update_stage_tangents_are_indexable():
    rng = _rng(4)
    arr, v = rng.standard_normal((H, W)), rng.standard_normal((H, W))
    a = hl.Buffer(arr, "a")
    f = hl.Func("f")
    f[x, y] = a[x, y]
    f[x, y] = f[x, y] * f[x, y]
    f[x, y] = f[x, y] * 3.0
    t = hl.propagate_tangents(f, {a: v})
    np.testing.assert_allclose(np.asarray(t[f, -1].realize([W, H])), v, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(t[f, 0].realize([W, H])), 2 * arr * v, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(t[f].realize([W, H])), 6 * arr * v, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(t[f, 1].realize([W, H])), 6 * arr * v, rtol=1e-14)


def _histogram(arrs, prms):
    """Clamped data-dependent bins: the index's tangent is zero, the weights' flows."""
    a, wt = hl.Buffer(arrs["a"], "a"), hl.Buffer(arrs["w"], "w")
    r = hl.RDom([(0, W), (0, H)])
    hist = hl.Func("hist")
    hist[x] = hl.f64(0)
    hist[hl.clamp(hl.i32(a[r.x, r.y] * 4.0), 0, 5)] += wt[r.x, r.y] * a[r.x, r.y]
    return hist, {"a": a, "w": wt}, {}


def _hist_inputs():
    rng = _rng(5)
    # values away from the bin edges so that +-h never changes a bin
    a = (rng.integers(0, 6, (H, W)) + 0.3 + 0.4 * rng.random((H, W))) / 4.0
    return {"a": a, "w": rng.standard_normal((H, W))}


def test_data_dependent_clamped_indices():
    _jvp_check(_histogram, _hist_inputs(), size=(6,))


def _resample(arrs, prms):
    a = hl.Buffer(arrs["a"], "a")
    c = hl.BoundaryConditions.repeat_edge(a)
    up = hl.Func("up")
    up[x, y] = c[x / 2, y / 3] * c[(x + 1) / 2, y / 3]
    dn = hl.Func("down")
    dn[x, y] = up[2 * x, y] + up[2 * x + 1, y] * 0.5 + up[2 * x - 1, y] * hl.cos(up[x, y])
    return dn, {"a": a}, {}


def test_upsampling_and_downsampling():
    _jvp_check(_resample, {"a": _rng(6).standard_normal((2, 4))}, size=(W, H))


CASES = {
    "stencil": (_stencil("mirror_image"), lambda: {"a": _rng(7).standard_normal((H, W)),
                                                   "k": _rng(8).standard_normal(3)}, (W, H)),
    "reduction": (_conv, lambda: {"a": _rng(9).standard_normal(9),
                                  "k": _rng(10).standard_normal(4)}, (9,)),
    "updates": (lambda arrs, prms: _updates(arrs, {"g": 0.7}, scans=False),
                lambda: {"a": _rng(11).standard_normal((H, W)) * 0.5}, (W, H)),
    "histogram": (_histogram, _hist_inputs, (6,)),
    "resample": (_resample, lambda: {"a": _rng(12).standard_normal((2, 4))}, (W, H)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_transpose_identity_against_adjoints(case):
    """<J^T w, v> == <w, J v> for random v, w: forward and reverse mode are transposes."""
    build, inputs, size = CASES[case]
    arrays = inputs()
    out, bufs, _ = build(arrays, {})
    rng = _rng(13)
    v = {k: rng.standard_normal(a.shape) for k, a in arrays.items()}
    w = rng.standard_normal(tuple(reversed(size)))
    jv = np.asarray(hl.propagate_tangents(out, {bufs[k]: v[k] for k in v})[out]
                    .realize(list(size)))
    d = hl.propagate_adjoints(out, w)
    jtw_v = sum(np.sum(np.asarray(d[bufs[k]].realize(list(reversed(a.shape)))) * v[k])
                for k, a in arrays.items())
    w_jv = np.sum(w * jv)
    assert abs(jtw_v - w_jv) <= 1e-10 * max(1.0, np.abs(w * jv).sum()), (jtw_v, w_jv)


def test_tangent_funcs_can_be_scheduled():
    rng = _rng(14)
    out, bufs, _ = _stencil("repeat_edge")({"a": rng.standard_normal((H, W)),
                                            "k": rng.standard_normal(3)}, {})
    t = hl.propagate_tangents(out, {bufs["a"]: rng.standard_normal((H, W))})
    want = np.asarray(t[out].realize([W, H]))
    xi, yi = hl.Var("xi"), hl.Var("yi")
    tf = t[out]
    tf.tile(x, y, xi, yi, 4, 2).vectorize(xi, 4).parallel(y)
    bx = next(f for f in out.definitions()[0].refs if f.name() == "bx")
    t[bx].compute_at(tf, x)
    np.testing.assert_allclose(np.asarray(tf.realize([W, H])), want, rtol=1e-13, atol=1e-13)


def test_inputs_without_tangent_have_zero_tangents():
    rng = _rng(15)
    a = hl.Buffer(rng.standard_normal((H, W)), "a")
    b = hl.Buffer(rng.standard_normal((H, W)), "b")
    p = hl.Param(hl.Float(64), "p", 1.5)
    only_b = hl.Func("only_b")
    only_b[x, y] = b[x, y] * p
    f = hl.Func("f")
    f[x, y] = a[x, y] * 2.0 + only_b[x, y]
    v = rng.standard_normal((H, W))
    t = hl.propagate_tangents(f, {a: v})
    np.testing.assert_allclose(np.asarray(t[f].realize([W, H])), 2 * v, rtol=1e-14)
    assert np.all(np.asarray(t[only_b].realize([W, H])) == 0)
    assert float(np.asarray(t[p].realize([]))) == 0.0
    np.testing.assert_array_equal(np.asarray(t[a].realize([W, H])), v)


def test_forward_over_reverse_hessian_vector_product():
    """Tangents of an adjoint Func (RDoms, zero padding, clamped scatters) are Hessian-vector
    products: against central differences of the exact gradient, and symmetric."""
    rng = _rng(16)
    a0, v, u = (rng.standard_normal((H, W)) for _ in range(3))

    def gradient(arr):
        a = hl.Buffer(arr, "a")
        c = hl.BoundaryConditions.repeat_edge(a)
        f = hl.Func("f")
        f[x, y] = hl.sin(c[x - 1, y]) * c[x, y + 1] + c[x, y] ** 3
        r = hl.RDom([(0, W), (0, H)])
        loss = hl.Func("loss")
        loss[()] = hl.f64(0)
        loss[()] += f[r.x, r.y] * f[r.x, r.y]
        return hl.propagate_adjoints(loss)[a], a

    g, a = gradient(a0)
    hv = np.asarray(hl.propagate_tangents(g, {a: v})[g].realize([W, H]))
    hu = np.asarray(hl.propagate_tangents(g, {a: u})[g].realize([W, H]))
    h = 1e-6
    want = (np.asarray(gradient(a0 + h * v)[0].realize([W, H]))
            - np.asarray(gradient(a0 - h * v)[0].realize([W, H]))) / (2 * h)
    assert np.abs(hv - want).max() <= TOL * np.abs(want).max()
    assert abs(np.sum(u * hv) - np.sum(v * hu)) <= 1e-12 * np.abs(u * hv).sum()


def test_tangents_given_as_a_param_and_as_a_func():
    """A Param's tangent may be a Param (new directions without rebuilding), a Buffer's a
    Func (a direction computed by another pipeline)."""
    rng = _rng(17)
    arr = rng.standard_normal((H, W))
    a = hl.Buffer(arr, "a")
    g = hl.Param(hl.Float(64), "g", 0.5)
    f = hl.Func("f")
    f[x, y] = hl.exp(a[x, y] * g)
    dg = hl.Param(hl.Float(64), "dg", 1.0)
    ramp = hl.Func("ramp")
    ramp[x, y] = hl.f64(x) - 0.5 * hl.f64(y)
    t = hl.propagate_tangents(f, {g: dg, a: ramp})[f]
    xs, ys = np.meshgrid(np.arange(W), np.arange(H))
    for s in (1.0, -2.5):
        dg.set(s)
        want = np.exp(arr * 0.5) * (arr * s + 0.5 * (xs - 0.5 * ys))
        np.testing.assert_allclose(np.asarray(t.realize([W, H])), want, rtol=1e-13)
