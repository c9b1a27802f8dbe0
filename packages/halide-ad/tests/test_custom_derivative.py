"""custom_derivative: hand-written adjoints and tangents used by propagate_adjoints and
propagate_tangents, against central finite differences in float64.

h = 1e-6 * max(1, |input|) (PRACTICES); the stages are smooth in the inputs (softmax is shift
invariant, so rows offset by 700 are as smooth as the others, but their FD rounding error
grows to ~ 1e-13 * 700 / 7e-4 ~ 1e-7 relative), hence the tolerance 1e-6 relative to the
largest gradient entry.
"""

import numpy as np
import pytest

import halide_ad as hl

H, W = 4, 6
TOL = 1e-6
x, y = hl.Var("x"), hl.Var("y")


def _softmax(a):
    """Row-wise softmax over x, stabilised by the row maximum: exp(a - max) / sum. The max is
    a non-additive reduction, which propagate_adjoints refuses to reverse."""
    r = hl.RDom([(0, W)])
    m = hl.Func("rowmax")
    m[y] = a[0, y]
    m[y] = hl.max(m[y], a[r.x, y])
    e = hl.Func("e")
    e[x, y] = hl.exp(a[x, y] - m[y])
    s = hl.Func("rowsum")
    s[y] = hl.f64(0)
    s[y] += e[r.x, y]
    sm = hl.Func("softmax")
    sm[x, y] = e[x, y] / s[y]
    return sm


def _softmax_with_rules(a, tangent=True):
    sm = _softmax(a)
    r = hl.RDom([(0, W)])

    def adjoint(d):  # d_a = sm * (d - <d, sm>_row)
        dot = hl.Func("dot")
        dot[y] = hl.f64(0)
        dot[y] += d[r.x, y] * sm[r.x, y]
        da = hl.Func("softmax_da")
        da[x, y] = sm[x, y] * (d[x, y] - dot[y])
        return {a: da}

    def tangent_rule(t):  # t_sm = sm * (t_a - <sm, t_a>_row)
        ta = t[a]
        dot = hl.Func("tdot")
        dot[y] = hl.f64(0)
        dot[y] += sm[r.x, y] * ta[r.x, y]
        tsm = hl.Func("softmax_t")
        tsm[x, y] = sm[x, y] * (ta[x, y] - dot[y])
        return tsm

    return hl.custom_derivative(sm, adjoint=adjoint, tangent=tangent_rule if tangent else None,
                                inputs=[a])


def _loss(f, wt):
    r = hl.RDom([(0, W), (0, H)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[r.x, r.y] * f[r.x, r.y] * wt[r.x, r.y]
    return loss


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((H, W))
    a[1] += 700.0  # exp(a) overflows past 709: the stabilised forward is still exact
    return a, rng.standard_normal((H, W))


def _softmax_np(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _loss_np(a, wt):
    return float(np.sum(_softmax_np(a) ** 2 * wt))


def test_automatic_adjoint_refuses_the_max_reduction():
    a, wt = _inputs()
    with pytest.raises(hl.FuncError, match="update 0 of Func rowmax"):
        hl.propagate_adjoints(_loss(_softmax(hl.Buffer(a, "a")), hl.Buffer(wt, "wt")))


def test_custom_adjoint_of_a_softmax_against_fd():
    a0, wt = _inputs()
    a = hl.Buffer(a0, "a")
    sm = _softmax_with_rules(a)
    np.testing.assert_allclose(np.asarray(sm.realize([W, H])), _softmax_np(a0), rtol=1e-13)
    d = hl.propagate_adjoints(_loss(sm, hl.Buffer(wt, "wt")))
    got = np.asarray(d[a].realize([W, H]))
    want = np.zeros_like(a0)
    for idx in np.ndindex(a0.shape):  # the loss in numpy: exact FD of the same function
        h = 1e-6 * max(1.0, abs(a0[idx]))
        e = np.zeros_like(a0)
        e[idx] = h
        want[idx] = (_loss_np(a0 + e, wt) - _loss_np(a0 - e, wt)) / (2 * h)
    assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max()), (got, want)
    assert np.abs(want).max() > 1e-2
    # the same gradient through the pipeline's own forward (no numpy reference)
    idx = (1, 2)
    h = 1e-6 * abs(a0[idx])
    e = np.zeros_like(a0)
    e[idx] = h

    def value(arr):
        return float(np.asarray(_loss(_softmax(hl.Buffer(arr, "a")),
                                      hl.Buffer(wt, "wt")).realize([])))

    assert abs(got[idx] - (value(a0 + e) - value(a0 - e)) / (2 * h)) <= TOL


def test_custom_tangent_and_automatic_tangent_against_fd_and_transpose():
    a0, _ = _inputs(1)
    v = np.random.default_rng(2).standard_normal(a0.shape)
    h = 1e-6 * 700
    want = (_softmax_np(a0 + h * v) - _softmax_np(a0 - h * v)) / (2 * h)
    a = hl.Buffer(a0, "a")
    for rules in (True, False):  # the custom tangent; the automatic one through the max
        sm = _softmax_with_rules(a, tangent=rules)
        t = hl.propagate_tangents(sm, {a: v})
        got = np.asarray(t[sm].realize([W, H]))
        assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max()), rules
    w = np.random.default_rng(3).standard_normal(a0.shape)
    jtw = np.asarray(hl.propagate_adjoints(sm, w)[a].realize([W, H]))
    assert abs(np.sum(jtw * v) - np.sum(w * got)) <= 1e-12 * np.abs(w * got).sum()


def _softplus(a, g):
    """softplus(g * a), written the overflow-free way, with its own derivative rules for both
    a Buffer and a Param input (the default inputs: what the definition reads)."""
    f = hl.Func("softplus")
    z = a[x] * g
    f[x] = hl.max(z, 0.0) + hl.log(1.0 + hl.exp(-hl.abs(z)))
    sig = hl.Func("sigmoid")
    sig[x] = 1.0 / (1.0 + hl.exp(-a[x] * g))

    def adjoint(d):
        r = hl.RDom([(0, 5)])
        da = hl.Func("da")
        da[x] = d[x] * sig[x] * g
        dg = hl.Func("dg")
        dg[()] = hl.f64(0)
        dg[()] += d[r.x] * sig[r.x] * a[r.x]
        return {a: da, g: dg}

    return hl.custom_derivative(f, adjoint=adjoint)


def test_custom_adjoint_with_a_param_input():
    rng = np.random.default_rng(4)
    a0 = rng.standard_normal(5) * 3.0
    a0[2] = 800.0  # exp(800) overflows: the rule's sigmoid does not
    wt = rng.standard_normal(5)

    def loss(arr, gv):
        a = hl.Buffer(arr, "a")
        g = hl.Param(hl.Float(64), "g", gv)
        lo = hl.Func("loss")
        r = hl.RDom([(0, 5)])
        lo[()] = hl.f64(0)
        # a call names its callee by id only: keep callees alive until a definition holds them
        wb, sp = hl.Buffer(wt, "wt"), _softplus(a, g)
        lo[()] += sp[r.x] * wb[r.x]
        return lo, a, g

    lo, a, g = loss(a0, 0.8)
    d = hl.propagate_adjoints(lo)
    got_a = np.asarray(d[a].realize([5]))
    got_g = float(np.asarray(d[g].realize([])))

    def value(arr, gv):
        lo_, _, _g = loss(arr, gv)
        return float(np.asarray(lo_.realize([])))

    for i in range(5):
        h = 1e-6 * max(1.0, abs(a0[i]))
        e = np.zeros(5)
        e[i] = h
        want = (value(a0 + e, 0.8) - value(a0 - e, 0.8)) / (2 * h)
        assert abs(got_a[i] - want) <= TOL * max(1.0, abs(want)), (i, got_a[i], want)
    want_g = (value(a0, 0.8 + 1e-6) - value(a0, 0.8 - 1e-6)) / 2e-6
    assert abs(got_g - want_g) <= TOL * max(1.0, abs(want_g)), (got_g, want_g)
    assert np.all(np.isfinite(got_a))
