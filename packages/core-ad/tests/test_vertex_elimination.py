"""Vertex elimination (spec 1.7, 2.5): in lazy mode interior lane-wise nodes that only the graph
holds are collapsed into edge weights before each evaluation (cheapest first, cost = in-degree x
out-degree < 10). Gradients are those of the eager mode (float64, 1e-12) and of central
differences, while the graph holds fewer nodes and bytes (counted by ``whos``)."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp


@pytest.fixture(autouse=True)
def _elimination_on():
    prev = ad.set_vertex_elimination(True)
    yield
    ad.set_vertex_elimination(prev)


def chain(x, n=20):
    b = x
    for _ in range(n):
        b = anp.sin(b) * 1.1 + b * b * 0.25
    return b


def chain_sin(x, n):
    for _ in range(n):
        x = anp.sin(x) * 1.1 + x * 0.5
    return x


X0 = np.linspace(-0.8, 0.9, 5000)


def _grad_and_report(x0, lazy, f=chain):
    x = ad.Array(x0, requires_grad=True)
    with ad.lazy(lazy):
        b = f(x)
        ad.eval(b)
        rep = ad.whos(b, file=False)  # the graph the output holds
        anp.sum(b).backward()
    return np.asarray(x.grad), rep


def test_eliminated_graph_gives_eager_gradients_with_fewer_nodes_and_bytes():
    g_eager, rep_eager = _grad_and_report(X0, False)
    g_lazy, rep_lazy = _grad_and_report(X0, True)
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-12, atol=1e-14)
    ad.set_vertex_elimination(False)
    g_kept, rep_kept = _grad_and_report(X0, True)
    np.testing.assert_allclose(g_kept, g_eager, rtol=1e-12, atol=1e-14)
    # 20 iterations of 5 nodes; eliminated: the output, a linear node on x with one weight
    assert rep_eager.n_nodes == rep_kept.n_nodes == 100
    assert rep_lazy.n_nodes == 1
    assert rep_kept.evaluated_bytes == 101 * X0.nbytes  # x and every intermediate
    assert rep_lazy.evaluated_bytes == 3 * X0.nbytes  # x, the output, its weight
    assert [r["kind"] for r in rep_lazy.rows].count("weight") == 1


def test_graph_stays_one_node_when_every_iteration_is_evaluated():
    """Enoki's advice (a flush per iteration): nodes evaluated by an earlier flush are
    collapsed by the next one, so what the graph holds does not grow with the iterations."""
    x = ad.Array(X0, requires_grad=True)
    held = []
    with ad.lazy():
        b = x
        for _ in range(6):
            b = anp.sin(b) * 1.1 + b * 0.5
            ad.eval(b)
            rep = ad.whos(b, file=False)
            held.append((rep.n_nodes, rep.evaluated_bytes))
        anp.sum(b).backward()
    assert held == [(1, 3 * X0.nbytes)] * 6  # x, b, one weight
    g_eager, _ = _grad_and_report(X0, False, lambda x: chain_sin(x, 6))
    np.testing.assert_allclose(x.grad, g_eager, rtol=1e-12, atol=1e-14)


def test_eliminated_gradient_matches_central_differences():
    x0 = np.array([-0.7, -0.2, 0.1, 0.5, 0.85])
    g, _ = _grad_and_report(x0, True)
    h = 1e-6
    for i in range(len(x0)):
        e = np.zeros_like(x0)
        e[i] = h
        fd = (chain(x0 + e).sum() - chain(x0 - e).sum()) / (2 * h)
        assert abs(g[i] - fd) <= 1e-7 * max(1.0, abs(fd))


def test_gather_nodes_are_never_crossed():
    idx = np.arange(0, 5000, 3)

    def f(x):
        u = anp.exp(anp.sin(x) * 0.5)  # eliminable up to the gather
        v = anp.take(u, idx)
        return anp.cos(v) * v + v  # eliminable after it

    g_eager, _ = _grad_and_report(X0, False, f)
    g_lazy, rep = _grad_and_report(X0, True, f)
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-12, atol=1e-14)
    kinds = [r["kind"] for r in rep.rows]
    # left: exp (feeds the gather; now linear in x), the gather, the linear output
    assert rep.n_nodes == 3 and kinds.count("take") == 1 and kinds.count("linear") == 2
    assert not {"sin", "cos", "exp", "mul", "add"} & set(kinds)


def test_referenced_and_retained_intermediates_are_kept():
    x = ad.Array(X0, requires_grad=True)
    with ad.lazy():
        held = anp.sin(x) * 2.0
        kept = anp.exp(held).retain_grad()
        out = anp.cos(kept) + kept * held
        ad.eval(out)
        # held by the user / retained: not collapsed, the output now reads them directly
        assert {id(a) for a in out._args} == {id(held), id(kept)}
        anp.sum(out).backward(retain_graph=True)
    gx, gk = np.asarray(x.grad), np.asarray(kept.grad)
    e = np.exp(2 * np.sin(X0))
    np.testing.assert_allclose(gk, -np.sin(e) + 2 * np.sin(X0), rtol=1e-12, atol=1e-14)
    dheld = (-np.sin(e) + 2 * np.sin(X0)) * e + e
    np.testing.assert_allclose(gx, dheld * 2 * np.cos(X0), rtol=1e-12, atol=1e-14)


def test_threshold_and_explicit_simplify_in_eager_mode():
    xs = [ad.Array(X0 + k, requires_grad=True) for k in range(5)]
    v = anp.sin(anp.add(*xs))
    s1, s2 = anp.exp(v), anp.cos(v)  # held: v has in-degree 1 (the add), out-degree 2
    del v
    assert ad.simplify_graph() == 1  # v (cost 2); the 5-operand add has cost 5 x 2 = 10
    assert s1._prim.name == "linear" and len(s1._args) == 1
    assert ad.simplify_graph() == 0
    assert ad.simplify_graph(threshold=11) == 1  # the add
    assert len(s1._args) == 5 and len(s2._args) == 5
    (s1 * s2).sum().backward()
    t = sum(X0 + k for k in range(5))
    expect = np.cos(t) * (np.exp(np.sin(t)) * np.cos(np.sin(t)) - np.exp(np.sin(t))
                          * np.sin(np.sin(t)))
    for x in xs:
        np.testing.assert_allclose(x.grad, expect, rtol=1e-12, atol=1e-14)


def test_forward_mode_through_an_eliminated_graph():
    x = ad.Array(X0, requires_grad=True)
    with ad.lazy():
        b = chain(x, 5)
        ad.eval(b)
    assert b._prim.name == "linear"
    ad.forward(x)
    xe = ad.Array(X0, requires_grad=True)
    be = chain(xe, 5)
    ad.forward(xe)
    np.testing.assert_allclose(b.tangent, be.tangent, rtol=1e-12, atol=1e-14)


def test_nested_differentiation_is_refused_on_a_simplified_graph_and_agrees_in_transforms():
    x = ad.Array(X0[:50], requires_grad=True)
    with ad.lazy():
        y = anp.sum(chain(x, 3))
        float(y)  # the evaluation eliminates the chain
        with pytest.raises(ad.GraphSimplifiedError, match="set_vertex_elimination"):
            y.backward(create_graph=True)

    def f(x):
        return anp.sum(chain(x, 3) * x)

    x0 = X0[:6]
    H_eager, gg_eager = ad.hessian(f)(x0), ad.grad(lambda z: anp.sum(ad.grad(f)(z) ** 2))(x0)
    with ad.lazy():
        H_lazy = ad.hessian(f)(x0)
        gg_lazy = ad.grad(lambda z: anp.sum(ad.grad(f)(z) ** 2))(x0)
    np.testing.assert_allclose(H_lazy, H_eager, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(gg_lazy, gg_eager, rtol=1e-12, atol=1e-13)
    # and with elimination off the recorded sweep works on the lazy graph
    ad.set_vertex_elimination(False)
    x = ad.Array(x0, requires_grad=True)
    with ad.lazy():
        f(x).backward(create_graph=True)
        (gx,) = [x.grad]
        ad.clear_grads(x)
        anp.sum(gx).backward()
    np.testing.assert_allclose(x.grad, H_eager.sum(axis=0), rtol=1e-12, atol=1e-13)


def test_zero_weights_stay_zero_through_composed_weights():
    """Products of weights keep the sweep's safe multiplies: a zero weight times sqrt'(0) = inf
    gives 0, not NaN, after elimination too."""
    x0 = np.linspace(-1.0, 1.0, 101)  # includes 0
    mask = (np.abs(x0) > 0.5).astype(float)  # 0 at x = 0

    def f(x):
        return anp.exp(anp.sqrt(anp.abs(x)) * 0.5) * mask + x

    g_eager, rep_eager = _grad_and_report(x0, False, f)
    g_lazy, rep_lazy = _grad_and_report(x0, True, f)
    assert np.all(np.isfinite(g_eager)) and g_eager[50] == 1.0
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-12, atol=1e-14)
    assert rep_eager.n_nodes == 6 and rep_lazy.n_nodes == 1


def test_outermost_value_and_grad_eliminates_and_matches_eager_and_differences():
    """grad / value_and_grad at the outermost level: a whole-array sum stays pending, so the
    value and the gradient come from one kernel after the sweep. A partial sum evaluates during
    the trace; the graph is simplified first, so that evaluation computes the primal and the
    folded edge weights together and stores no intermediates. Both gradients are the eager
    one and that of central differences."""
    from core_ad import _lazy

    def f(x):
        return anp.sum(chain(x, 3) * x)

    def f_rows(x):  # the row sums are eager: they evaluate the trace
        return anp.sum(anp.sum(anp.reshape(chain(x, 3) * x, (50, -1)), axis=1))

    v_eager, g_eager = ad.value_and_grad(f)(X0)
    before = dict(_lazy.stats())
    with ad.lazy():
        v_lazy, g_lazy = ad.value_and_grad(f)(X0)
    after = dict(_lazy.stats())
    assert after["evaluations"] - before["evaluations"] == 1
    assert after["outputs"] - before["outputs"] == 2  # the value and the gradient
    with ad.lazy():
        v_rows, g_rows = ad.value_and_grad(f_rows)(X0)
    last = _lazy.stats()
    assert last["eliminated"] > after["eliminated"]
    # the primal and one folded weight (forward), the seeded gradient (backward)
    assert last["outputs"] - after["outputs"] <= 3
    for v, g in ((v_lazy, g_lazy), (v_rows, g_rows)):
        np.testing.assert_allclose(v, v_eager, rtol=1e-13)
        np.testing.assert_allclose(g, g_eager, rtol=1e-12, atol=1e-14)
    h, idx = 1e-6, np.array([0, 1234, 4999])
    for i in idx:
        e = np.zeros_like(X0)
        e[i] = h
        np.testing.assert_allclose(g_lazy[i], (f(X0 + e) - f(X0 - e)) / (2 * h), rtol=1e-6)


def test_grad_of_a_function_reading_an_outer_traced_array_stays_differentiable():
    """A top-level grad whose function reads an array traced outside records its sweep for
    that array; the trace is redone without elimination, so the result is differentiable
    again (it would raise GraphSimplifiedError otherwise) and agrees with the eager mode."""
    y0 = np.linspace(0.5, 1.5, X0.size)

    def outer_grad(lazy):
        y = ad.Array(y0, requires_grad=True)
        with ad.lazy(lazy):
            g = ad.grad(lambda x: anp.sum(chain(x * y, 3)))(X0)
            anp.sum(g * g).backward()
        return np.asarray(g.numpy()), np.asarray(y.grad)

    for a, b in zip(outer_grad(True), outer_grad(False)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def _branches(x):
    """A ``where`` whose first branch has an infinite / NaN partial in the lanes it does not
    select (``sqrt`` at 0 and below), both branches eliminable, the select itself too."""
    a = anp.sqrt(x) * 3.0
    b = anp.sin(x) * x + x
    z = anp.where(x > 0.0, a, b)
    return anp.exp(z * 0.5) + z * z


def _one_branch(x):
    """Only the first branch reads ``x``: its edge is masked alone (not summed with the other
    branch's), so the mask, not a weight of 0, must drop its NaN partials."""
    z = anp.where(x > 0.0, anp.sqrt(x) * 3.0, 0.25)
    return anp.exp(z * 0.5) + z * z


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")
@pytest.mark.parametrize("f", [_branches, _one_branch])
def test_where_is_eliminated_and_masks_the_branch_it_did_not_select(f):
    x0 = np.concatenate([np.linspace(-0.8, 0.9, 4999), [0.0]])
    g_eager, rep_eager = _grad_and_report(x0, False, f)
    g_lazy, rep_lazy = _grad_and_report(x0, True, f)
    assert np.isfinite(g_eager).all()  # sqrt's inf / NaN partials never reach the gradient
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-12, atol=1e-14)
    kinds = [r["kind"] for r in rep_lazy.rows]
    assert "select" not in kinds and rep_lazy.n_nodes < rep_eager.n_nodes, kinds
    assert kinds.count("weight") >= 1
    h = 1e-6
    for i in (0, 1000, 2500, 4998):
        e = np.zeros_like(x0)
        e[i] = h
        fd = (f(x0 + e).sum() - f(x0 - e).sum()) / (2 * h)
        assert abs(g_lazy[i] - fd) <= 1e-6 * max(1.0, abs(fd))


def test_where_of_one_array_in_both_branches_sums_the_masked_edges():
    def f(x):
        y = anp.sin(x) * 2.0
        return anp.exp(anp.where(x > 0.1, y, y) * 0.5)

    g_eager, _ = _grad_and_report(X0, False, f)
    g_lazy, rep = _grad_and_report(X0, True, f)
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-12, atol=1e-14)
    assert "select" not in [r["kind"] for r in rep.rows]


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")
def test_where_in_float32_keeps_float32_gradients():
    x0 = np.linspace(-0.8, 0.9, 64).astype(np.float32)
    g_eager, _ = _grad_and_report(x0, False, _branches)
    g_lazy, _ = _grad_and_report(x0, True, _branches)
    assert g_lazy.dtype == np.float32
    np.testing.assert_allclose(g_lazy, g_eager, rtol=1e-5, atol=1e-6)
