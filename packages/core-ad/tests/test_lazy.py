"""Lazy mode (opt-in): traced lane-wise arithmetic is recorded and fused into compiled kernels;
values and gradients agree with the eager numpy mode (the reference) to the LLVM backend's
accuracy (a few ulp; absolute 1e-14 where a value cancels to near zero)."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp
from core_ad import _lazy


def f(x, y):
    return anp.sin(x) * anp.exp(-x * x) + x ** 3 * y + anp.log1p(y * y)


def _value_and_grads(x0, y0):
    x, y = ad.Array(x0, requires_grad=True), ad.Array(y0, requires_grad=True)
    out = f(x, y)
    total = anp.sum(out)
    total.backward()
    return np.asarray(out.numpy()), np.asarray(x.grad), np.asarray(y.grad)


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    return rng.uniform(-1.5, 1.5, 1000), rng.uniform(-1.0, 1.0, 1000)


def test_lazy_values_and_gradients_match_eager(xy):
    eager = _value_and_grads(*xy)
    with ad.lazy():
        lazy = _value_and_grads(*xy)
    for a, b in zip(lazy, eager):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_lazy_arithmetic_is_pending_until_needed(xy):
    x0, y0 = xy
    with ad.lazy():
        before = dict(_lazy.stats())
        out = f(ad.Array(x0), ad.Array(y0))
        assert _lazy.stats()["evaluations"] == before["evaluations"]  # nothing computed yet
        ad.eval(out)
        after = _lazy.stats()
        assert after["evaluations"] == before["evaluations"] + 1
        assert after["kernels"] == before["kernels"] + 1  # the whole expression, one kernel
        np.testing.assert_allclose(out.numpy(), f(x0, y0), rtol=1e-13, atol=1e-14)


def test_repeated_iterations_hit_the_kernel_cache(xy):
    x0, y0 = xy
    with ad.lazy():
        ad.eval(f(ad.Array(x0), ad.Array(y0)))
        compiled = _lazy.stats()["compiled"]
        for k in range(3):
            ad.eval(f(ad.Array(x0 + k), ad.Array(y0)))
        assert _lazy.stats()["compiled"] == compiled


def test_lazy_switch_restores_the_previous_mode():
    before = ad.is_lazy()  # eager, or lazy when the suite runs with CORE_AD_LAZY=1
    with ad.lazy():
        assert ad.is_lazy()
        with ad.lazy(False):
            assert not ad.is_lazy()
        assert ad.is_lazy()
    assert ad.is_lazy() == before
