"""Lazy Arrays over CuPy data: fused CUDA kernels for the primal, reverse and forward mode.

Two tiers run the same checks:

* **host** (g++ present): the generated CUDA C compiled for the CPU by
  :mod:`core_ad._codegen.cuda.host_emulation`, launched through a stand-in ``cupy`` module
  whose arrays refuse to mix with numpy arrays (as CuPy's do), so a host array slipping into
  the device path fails here as on a GPU;
* **gpu** (``@pytest.mark.gpu``: CuPy and a CUDA device): the real thing.

References are core_ad's eager numpy mode and the CPU lazy path on the same float64 inputs.
Tolerances: 1e-12 relative for per-lane values and gradients (the same IEEE operations;
transcendentals of the host libm or CUDA's within a few ulp); whole-array sums 1e-12
relative to the sum of magnitudes (atomic accumulation on the device, another order than
numpy's pairwise sum). Finite differences: central, h = 1e-6, 1e-7 relative.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp
from core_ad import _lazy
from core_ad._codegen.cuda import launcher
from core_ad._codegen.cuda.host_emulation import HostKernels, stand_in_cupy

N = 300
RTOL = 1e-12


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not available")
    return HostKernels([], tmp_path_factory.mktemp("lazy_cuda"), compile_missing=True)


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def cp(request, monkeypatch):
    """The array module of the device: the stand-in over host-compiled kernels, or CuPy."""
    if request.param == "host":
        fake, fakex = stand_in_cupy(request.getfixturevalue("host_kernels"))
        monkeypatch.setitem(sys.modules, "cupy", fake)
        monkeypatch.setitem(sys.modules, "cupyx", fakex)
        monkeypatch.setattr(launcher, "_KERNELS", {})
    elif not launcher.available():
        pytest.skip("no CuPy with a usable CUDA device")
    import cupy

    with ad.lazy():
        yield cupy


def host(cp, a):
    assert isinstance(a, cp.ndarray), f"expected a device array, got {type(a).__name__}"
    return cp.asnumpy(a)


def bench_f(m, x):
    """bench_grad's function."""
    return m.sum(m.sin(x) * m.exp(-x * x) + x**3)


def branchy_f(m, x):
    """Selects, a division and a clamp: masks and safe multiplies in the fused sweep."""
    y = m.where(x > 0.2, m.sqrt(m.abs(x) + 1.0) / (1.0 + x * x), m.cos(3.0 * x))
    return m.sum(m.maximum(y, -0.5) * m.tanh(x))


FUNCTIONS = [bench_f, branchy_f]


def eager_value_and_grad(f, x):
    with ad.lazy(False):
        v, g = ad.value_and_grad(lambda a: f(anp, a))(x)
    return float(v), np.asarray(g)


def _sum_close(got, want, x):
    assert abs(got - want) <= RTOL * (1 + np.abs(x).sum() * 4), (got, want)


@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_value_and_grad_match_eager_numpy(cp, f):
    x = np.random.default_rng(1).uniform(-2, 2, N)
    v, g = ad.value_and_grad(lambda a: f(anp, a))(cp.asarray(x))
    want_v, want_g = eager_value_and_grad(f, x)
    _sum_close(float(v), want_v, x)
    np.testing.assert_allclose(host(cp, g), want_g, rtol=RTOL, atol=1e-14)


def test_primal_sum_and_gradient_are_one_kernel(cp):
    """Enoki's fusion: the value, the partials and the adjoint arithmetic of the loss run in
    one launch (the stand-in counts launches)."""
    x = cp.asarray(np.random.default_rng(8).uniform(-2, 2, N))
    vg = ad.value_and_grad(lambda a: bench_f(anp, a))
    vg(x)
    kernels = _lazy.stats()["kernels"]
    launches = getattr(cp, "launches", None)
    vg(x)
    assert _lazy.stats()["kernels"] - kernels == 1
    if launches is not None:
        assert cp.launches - launches == 1


@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_reverse_and_forward_mode_match_central_differences(cp, f):
    rng = np.random.default_rng(2)
    x, d = rng.uniform(-2, 2, N), rng.normal(size=N)
    xd, dd = cp.asarray(x), cp.asarray(d)
    g = ad.grad(lambda a: f(anp, a))(xd)
    _, t = ad.jvp(lambda a: f(anp, a), (xd,), (dd,))
    h = 1e-6
    plus, minus = (float(f(anp, ad.Array(cp.asarray(x + s * h * d))).value) for s in (1, -1))
    fd = (plus - minus) / (2 * h)
    assert abs(float(host(cp, g) @ d) - fd) <= 1e-7 * (1 + abs(fd))
    assert abs(float(t) - fd) <= 1e-7 * (1 + abs(fd))


def test_backward_and_forward_on_arrays_stay_on_device(cp):
    x = np.random.default_rng(3).uniform(-1, 1, N)
    a = ad.Array(cp.asarray(x), requires_grad=True)
    y = anp.sin(a) * a + anp.exp(-a)
    ad.forward(a)
    np.testing.assert_allclose(host(cp, y.tangent), np.cos(x) * x + np.sin(x) - np.exp(-x),
                               rtol=RTOL)
    anp.sum(y * y).backward()
    want = 2 * (np.sin(x) * x + np.exp(-x)) * (np.cos(x) * x + np.sin(x) - np.exp(-x))
    np.testing.assert_allclose(host(cp, a.grad), want, rtol=RTOL)
    np.testing.assert_allclose(host(cp, y.value), np.sin(x) * x + np.exp(-x), rtol=RTOL)
    assert isinstance(y.numpy(), np.ndarray) and "device='cuda'" in repr(y)
    assert ad.whos([y]).evaluated_bytes >= y.size * 8  # diagnostics read device arrays too
    with pytest.raises(TypeError, match="numpy"):
        np.asarray(y)


def test_seeded_backward_and_vjp_take_device_cotangents(cp):
    rng = np.random.default_rng(7)
    x, w = rng.uniform(-1, 1, N), rng.normal(size=N)
    a = ad.Array(cp.asarray(x), requires_grad=True)
    (anp.tanh(a) * a).backward(seed=cp.asarray(w))
    want = w * ((1 - np.tanh(x) ** 2) * x + np.tanh(x))
    np.testing.assert_allclose(host(cp, a.grad), want, rtol=RTOL)
    out, pullback = ad.vjp(lambda v: anp.tanh(v) * v, cp.asarray(x))
    (g,) = pullback(cp.asarray(w))
    np.testing.assert_allclose(host(cp, g), want, rtol=RTOL)
    np.testing.assert_allclose(host(cp, out), np.tanh(x) * x, rtol=RTOL)


def test_nested_reverse_and_hvp(cp):
    x = np.linspace(-1.5, 1.5, 41)
    f = lambda a: anp.sum(anp.sin(a) * a)  # noqa: E731
    hv = ad.hvp(f, cp.asarray(x), cp.asarray(np.ones_like(x)))
    np.testing.assert_allclose(host(cp, hv), 2 * np.cos(x) - x * np.sin(x), rtol=RTOL, atol=1e-15)
    gg = ad.grad(lambda a: anp.sum(ad.grad(f)(a) ** 2))(cp.asarray(x))
    g1, g2 = np.sin(x) + x * np.cos(x), 2 * np.cos(x) - x * np.sin(x)
    np.testing.assert_allclose(host(cp, gg), 2 * g1 * g2, rtol=RTOL, atol=1e-15)


def test_sum_spread_over_lanes_and_mean(cp):
    x = np.random.default_rng(4).normal(size=N)
    a = ad.Array(cp.asarray(x))
    y = a * anp.sum(a * a) - anp.mean(a)
    np.testing.assert_allclose(host(cp, y.value), x * np.sum(x * x) - np.mean(x), rtol=RTOL)


def test_sums_of_lanes_that_read_only_one_number(cp):
    a = ad.Array(cp.asarray(np.linspace(0.0, 1.0, N)))
    assert float(anp.sum(a * 0.0 + 2.0)) == 2.0 * N
    one = ad.Array(cp.asarray(np.array([2.0])))
    assert float(anp.sum(anp.broadcast_to(one * 3.0, (N,)) * 1.5)) == 9.0 * N


def test_gradient_descent_loop_hits_the_kernel_cache(cp):
    """The iterations repeat the same operations: kernels are compiled in the first one only,
    and the result is the CPU lazy path's."""
    x0 = np.random.default_rng(5).uniform(-1, 1, N)
    loss = lambda v: anp.sum((v - 0.3) ** 2 * anp.cos(v) + 0.1 * v**4)  # noqa: E731
    vg = ad.value_and_grad(loss)

    def descend(p, steps, on_step=None):
        for _ in range(steps):
            _, g = vg(p)
            p = p - 0.05 * g
            ad.eval(p)
            if on_step:
                on_step()
        return p

    stats = _lazy.stats()
    compiled, built = [], []
    p = descend(ad.Array(cp.asarray(x0)), 6,
                lambda: (compiled.append(stats["compiled"]), built.append(len(getattr(
                    sys.modules["cupy"], "built", ())))))
    assert compiled[1:] == [compiled[0]] * 5, compiled
    assert built[1:] == [built[0]] * 5, built  # no kernel built after the first iteration
    assert built[0] >= 1 or not hasattr(sys.modules["cupy"], "built")
    want = descend(ad.Array(x0), 6).value
    np.testing.assert_allclose(host(cp, p.value), want, rtol=RTOL)


def test_data_dependent_gather_and_its_scatter_gradient(cp):
    rng = np.random.default_rng(6)
    th, u = rng.normal(size=50), rng.uniform(size=N)

    def f(m, t, uu):
        i = (m.floor(uu * 50)).astype(np.int64)
        g = m.take(t, i)
        return m.sum(g * g * uu)

    t = ad.Array(cp.asarray(th), requires_grad=True)
    y = f(anp, t, ad.Array(cp.asarray(u)))
    y.backward()
    _sum_close(float(y.value), f(np, th, u), th)
    idx = np.floor(u * 50).astype(np.int64)
    want = np.zeros(50)
    np.add.at(want, idx, 2 * th[idx] * u)
    np.testing.assert_allclose(host(cp, t.grad), want, rtol=RTOL)


def test_gather_out_of_range_names_the_array_and_the_lane(cp):
    th = ad.Array(cp.asarray(np.arange(5.0)), name="theta")
    u = ad.Array(cp.asarray(np.array([0.1, 0.5, 1.3, 0.2])))
    i = anp.floor(u * 5).astype(np.int64)  # lane 2: index 6
    with pytest.raises(IndexError, match=r"index 6 at position \(2,\) \(lane 2\) is out of range"
                                         r" for axis of size 5 of array 'theta' \(lazy evaluation"
                                         r" of the operation at .*test_lazy_cuda.py"):
        anp.take(th, i).value
    with pytest.raises(IndexError, match="index 9 at position .* of array 'theta'"):
        anp.take(th, np.array([0, 9]))  # host indices: checked on the host, as numpy's
    # the failed kernel left i pending in a scope that reopened: it is still usable
    acc = ad.Array(cp.asarray(np.zeros(5)), name="acc")
    with pytest.raises(IndexError, match=r"scatter_add: index 6 at position \(2,\) \(lane 2\)"
                                         r" is out of range for axis of size 5 of array 'acc'"):
        anp.scatter_add(acc, i, u * 2.0).value
    ok = anp.scatter_add(acc, anp.floor(u * 3).astype(np.int64), u * 2.0)
    np.testing.assert_allclose(host(cp, ok.value), [0.6, 1.0, 0.0, 2.6, 0.0], rtol=RTOL)


def test_mixing_numpy_and_cupy_names_both(cp):
    a = ad.Array(cp.asarray(np.ones(N)), name="on_device")
    b = ad.Array(np.ones(N), name="on_host")
    with pytest.raises(ad.DeviceMismatchError,
                       match=r"mul at .*test_lazy_cuda.py:\d+ mixes a CuPy array \(float64, shape"
                             r" \(300,\), 'on_device'\) with a numpy array \(float64, shape"
                             r" \(300,\), 'on_host'\)"):
        a * b
    with pytest.raises(ad.DeviceMismatchError, match="CuPy .* numpy"):
        anp.sin(a) + np.ones(N)
    # host scalars (numbers, 0-d arrays) go with device data
    y = a * np.float64(2.0) + np.array(1.0) + 3
    np.testing.assert_array_equal(host(cp, y.value), np.full(N, 6.0))


def test_what_is_not_on_the_device_raises_a_named_error(cp):
    x = cp.asarray(np.linspace(-1, 1, 8))
    a = ad.Array(x)
    with pytest.raises(ad.DeviceUnsupportedError, match="matmul on CuPy arrays"):
        a @ a
    with pytest.raises(ad.DeviceUnsupportedError, match="reduce_sum"):
        anp.sum(a.reshape(4, 2), axis=1)
    with pytest.raises(ad.DeviceUnsupportedError, match="checkpoint"):
        ad.grad(lambda v: anp.sum(ad.checkpoint(lambda w: anp.sin(w) * w, v)))(x)
    with pytest.raises(ad.DeviceUnsupportedError, match="hessian"):
        ad.hessian(lambda v: anp.sum(anp.sin(v)))(x)
    with pytest.raises(ad.DeviceUnsupportedError, match="jacobian"):
        ad.jacobian(anp.sin)(x)
    with pytest.raises(ad.DeviceUnsupportedError, match="batch_hessian"):
        ad.batch_hessian(lambda v: anp.sum(v * v, axis=1), x.reshape(4, 2))
    with pytest.raises(ad.DeviceUnsupportedError, match="checkpointed_loop"):
        ad.checkpointed_loop(lambda s, w: anp.sin(s) * w, a, 4, (ad.Array(x, requires_grad=True),),
                             snapshots=2)
    with pytest.raises(ad.DeviceUnsupportedError, match="eigh"):
        ad.eigh(ad.Array(cp.asarray(np.eye(2)[None]), requires_grad=True))
    with ad.lazy(False), pytest.raises(ad.DeviceUnsupportedError, match="lazy mode only"):
        a * 2.0
