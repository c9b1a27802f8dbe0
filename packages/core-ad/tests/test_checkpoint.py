"""Checkpointing: recompute instead of store (docs/design/core-ad.md §2.6; CA-CKP-*)."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp
from core_ad._revolve import optimal_forward_steps


def _recurrence(h, w):
    return anp.tanh(h * w + 0.1)


def _unrolled(h, w, n):
    for _ in range(n):
        h = _recurrence(h, w)
    return h


def test_checkpoint_matches_plain_and_stores_boundaries():  # CA-CKP-1
    rng = np.random.default_rng(0)
    h0, w0 = rng.normal(size=8), rng.normal(size=8)

    def plain(h, w):
        return anp.sum(_unrolled(h, w, 50))

    def ckpt(h, w):
        return anp.sum(ad.checkpoint(lambda a, b: _unrolled(a, b, 50), h, w))

    g_plain = ad.grad(plain, (0, 1))(h0, w0)
    g_ckpt = ad.grad(ckpt, (0, 1))(h0, w0)
    for a, b in zip(g_plain, g_ckpt):
        if ad.is_lazy():  # the two paths fuse into different kernels: rounding may differ
            np.testing.assert_allclose(a, b, rtol=1e-14)
        else:
            np.testing.assert_array_equal(a, b)  # same op order: bitwise equal
    h, w = ad.Array(h0, requires_grad=True), ad.Array(w0, requires_grad=True)
    out = ad.checkpoint(lambda a, b: _unrolled(a, b, 50), h, w)
    assert len(ad._tracing._toposort([out])) == 3  # the two inputs and one checkpoint node


def _exp_step(r):
    return anp.exp(r) * 0.5


@pytest.mark.parametrize(
    "policy, kw, expected_forward",
    [
        ("store_all", {}, lambda n: n - 1),
        ("recompute_all", {}, lambda n: n * (n - 1) // 2),
        ("every_k", {"every": 7}, None),
        ("revolve", {"snapshots": 3}, lambda n: optimal_forward_steps(n, 3)),
        ("revolve", {"snapshots": 10}, lambda n: optimal_forward_steps(n, 10)),
    ],
)
def test_checkpointed_loop_policies(policy, kw, expected_forward):  # CA-CKP-4
    rng = np.random.default_rng(1)
    x0, w0 = rng.uniform(-0.5, 0.5, 6), rng.uniform(0.5, 0.9, 6)
    n = 100
    step = lambda h, w: anp.tanh(h * w + 0.2) * 1.1  # noqa: E731

    def unrolled(x, w):
        h = x
        for _ in range(n):
            h = step(h, w)
        return anp.sum(h * h)

    stats = ad.LoopStats()

    def looped(x, w):
        h = ad.checkpointed_loop(step, x, n, params=(w,), policy=policy, stats=stats, **kw)
        return anp.sum(h * h)

    ref = ad.grad(unrolled, (0, 1))(x0, w0)
    got = ad.grad(looped, (0, 1))(x0, w0)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-12)
    assert stats.taped_steps == n
    if expected_forward is not None:
        assert stats.forward_steps == expected_forward(n)
    if policy == "revolve":
        assert stats.peak_snapshots <= kw["snapshots"]


def test_revolve_on_long_recurrence_counts():  # CA-CKP-4, 1000 steps
    stats = ad.LoopStats()
    x = ad.Array(np.array([0.3, -0.2]), requires_grad=True)
    h = ad.checkpointed_loop(lambda h: anp.sin(h) * 0.99, x, 1000, policy="revolve",
                             snapshots=10, stats=stats)
    anp.sum(h).backward()
    assert stats.forward_steps == 3636  # Griewank's t(1000, 10)
    assert stats.peak_snapshots <= 10
    ref = ad.grad(lambda v: anp.sum(_sin_loop(v, 1000)))(x.value)
    np.testing.assert_allclose(x.grad, ref, rtol=1e-12)


def _sin_loop(v, n):
    for _ in range(n):
        v = anp.sin(v) * 0.99
    return v


def test_while_loop_nested_exp_through_checkpointed_loop():  # CA-CKP-4 on the thesis example
    # 3 iterations from x = 0.5 (CA-CF-1): f' = 1554.7142341744839
    g = ad.grad(lambda x: ad.checkpointed_loop(anp.exp, x, 3, policy="revolve", snapshots=2))(0.5)
    assert g == pytest.approx(1554.7142341744839, rel=1e-12)


def test_checkpoint_under_hvp():  # CA-CKP-5
    rng = np.random.default_rng(2)
    x0, v = rng.normal(size=5), rng.normal(size=5)
    plain = lambda x: anp.sum(anp.sin(_unrolled(x, x, 5)) ** 2)  # noqa: E731
    ck = lambda x: anp.sum(anp.sin(ad.checkpoint(lambda a: _unrolled(a, a, 5), x)) ** 2)  # noqa
    np.testing.assert_allclose(ad.hvp(ck, x0, v), ad.hvp(plain, x0, v), rtol=1e-12)
    np.testing.assert_allclose(ad.hessian(ck)(x0), ad.hessian(plain)(x0), rtol=1e-12)
    loop = lambda x: anp.sum(ad.checkpointed_loop(  # noqa: E731
        lambda h: anp.tanh(h) * 1.3, x, 6, policy="revolve", snapshots=2))
    loop_plain = lambda x: anp.sum(_tanh_loop(x, 6))  # noqa: E731
    np.testing.assert_allclose(ad.hessian(loop)(x0), ad.hessian(loop_plain)(x0), rtol=1e-12)


def _tanh_loop(x, n):
    for _ in range(n):
        x = anp.tanh(x) * 1.3
    return x


def test_checkpoint_forward_mode():
    x0, t = np.array([0.1, 0.4]), np.array([1.0, -2.0])
    f_ck = lambda x: ad.checkpoint(lambda a: anp.exp(anp.sin(a)), x)  # noqa: E731
    _, t1 = ad.jvp(f_ck, (x0,), (t,))
    np.testing.assert_allclose(t1, np.exp(np.sin(x0)) * np.cos(x0) * t, rtol=1e-14)


def test_power_chain_memory():  # CA-CKP-6: b = b*b 1000 times
    for a0, expected in ((1.0, 2.0**1000), (-1.0, -(2.0**1000)), (0.0, 0.0)):
        a = ad.Array(np.full(2**4, a0), requires_grad=True)
        b = ad.checkpointed_loop(lambda b: b * b, a, 1000, policy="revolve", snapshots=4)
        ad.backward(b, np.full(2**4, 1.0))
        assert np.all(a.grad == expected)


def test_checkpoint_closure_is_rejected():
    w = ad.Array(np.array([2.0]), requires_grad=True)
    x = ad.Array(np.array([1.0]), requires_grad=True)
    y = ad.checkpoint(lambda a: a * w, x)
    with pytest.raises(ad.CheckpointClosureError, match="pass it as an argument"):
        anp.sum(y).backward()


def test_loop_argument_errors():
    with pytest.raises(ValueError, match="snapshots"):
        ad.checkpointed_loop(anp.sin, np.ones(2), 5, policy="revolve")
    with pytest.raises(ValueError, match="unknown policy"):
        ad.checkpointed_loop(anp.sin, np.ones(2), 5, policy="magic")
    with pytest.raises(ValueError, match="n_steps"):
        ad.checkpointed_loop(anp.sin, np.ones(2), 0, policy="store_all")
