"""core_ad.interop with JAX: a compiled core_ad kernel as a jax.custom_vjp function running
through jax.pure_callback (spec core-ad.md 1.14, F10).

64-bit types are enabled for this module only (a module fixture restores the setting).

Tolerances (float64):
* kernel versus the same formula in jax.numpy, values and gradients (jax's own autodiff):
  rtol 1e-12, atol 1e-15 (a few roundings, possibly summed in another order);
* jitted versus un-jitted: the same host code computes both, rtol 1e-12;
* jax.test_util.check_grads: its float64 default (atol = rtol = 1e-5 for order 1; eps 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from core_ad import sym  # noqa: E402
from core_ad.interop import jax_function  # noqa: E402

RTOL = 1e-12


@pytest.fixture(scope="module", autouse=True)
def x64():
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", prev)


def close(a, b, rtol=RTOL, atol=1e-15):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def kernel(x64):
    """``(exp(p x) sin(y), tanh(x y) + log1p(p^2) / (1 + x^2))`` over lanes, p 0-d."""
    x, y, p = sym.var("x"), sym.var("y"), sym.var("p")
    outs = [sym.exp(p * x) * sym.sin(y), sym.tanh(x * y) + sym.log1p(p * p) / (1.0 + x * x)]
    return jax_function(outs, [x, y, p])


def kernel_ref(X, Y, P):
    return jnp.exp(P * X) * jnp.sin(Y), jnp.tanh(X * Y) + jnp.log1p(P * P) / (1 + X * X)


def data(n=7, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.uniform(-1, 1, n)), jnp.asarray(rng.uniform(-1, 1, n))


def loss_of(fn):
    def loss(P, X, Y):
        a, b = fn(X, Y, P)
        return jnp.sum(a * a) + jnp.sum(jnp.sin(b))

    return loss


# --------------------------------------------------------------------------------------------


def test_enoki_atan2_example():
    y, x = sym.var("y"), sym.var("x")
    f = jax_function(sym.arctan2(y, x), [y, x])
    val = f(1.0, 2.0)
    assert val.shape == () and val.dtype == jnp.float64
    close(val, np.arctan2(1.0, 2.0))
    assert round(float(val), 4) == 0.4636
    dy, dx = jax.grad(f, argnums=(0, 1))(1.0, 2.0)
    close(dy, 0.4)
    close(dx, -0.2)


def test_jit_grad_agrees_with_eager_and_with_jax_autodiff(kernel):
    X, Y = data()
    P = jnp.float64(0.6)
    loss, ref = loss_of(kernel), loss_of(kernel_ref)
    close(loss(P, X, Y), ref(P, X, Y))
    g_jit = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(P, X, Y)
    g_eager = jax.grad(loss, argnums=(0, 1, 2))(P, X, Y)
    g_ref = jax.grad(ref, argnums=(0, 1, 2))(P, X, Y)
    for a, b, c in zip(g_jit, g_eager, g_ref):
        assert a.shape == c.shape and a.dtype == c.dtype
        close(a, b)
        close(a, c)


def test_check_grads(kernel):
    X, Y = data(5, seed=1)
    check_grads(kernel, (X, Y, jnp.float64(0.3)), order=1, modes=["rev"])
    # reverse over reverse: the VJP is itself a custom_vjp kernel
    check_grads(kernel, (X, Y, jnp.float64(0.3)), order=2, modes=["rev"])


def test_numpy_backend_gives_the_same_gradients(kernel):
    """The bridge does not depend on sym.compile's backend (the default may be LLVM)."""
    x, y, p = sym.var("x"), sym.var("y"), sym.var("p")
    outs = [sym.exp(p * x) * sym.sin(y), sym.tanh(x * y) + sym.log1p(p * p) / (1.0 + x * x)]
    knp = jax_function(outs, [x, y, p], backend="numpy")
    X, Y = data(5, seed=5)
    P = jnp.float64(0.3)
    ref = jax.grad(loss_of(kernel_ref), argnums=(0, 1, 2))(P, X, Y)
    for fn in (kernel, knp):
        for a, b in zip(jax.grad(loss_of(fn), argnums=(0, 1, 2))(P, X, Y), ref):
            close(a, b)
    check_grads(knp, (X, Y, P), order=1, modes=["rev"])


def test_second_order_matches_jax(kernel):
    X, Y = data(5, seed=2)
    P = jnp.float64(-0.4)
    h = jax.grad(jax.grad(loss_of(kernel)))(P, X, Y)
    close(h, jax.grad(jax.grad(loss_of(kernel_ref)))(P, X, Y))


def test_broadcast_scalar_parameter_is_summed():
    x, p = sym.var("x"), sym.var("p")
    f = jax_function(sym.sin(p * x), [x, p])
    X, _ = data(6, seed=3)
    out = f(X, 1.3)
    assert out.shape == (6,)
    g = jax.grad(lambda P: jnp.sum(f(X, P)))(1.3)
    assert jnp.shape(g) == ()
    close(g, jnp.sum(X * jnp.cos(1.3 * X)))
    # a (3, 1) input against a (4,) input: lane shape (3, 4), each reduced to its shape
    A = jnp.linspace(0.1, 0.3, 3).reshape(3, 1)
    B = jnp.linspace(-1, 1, 4)
    ga, gb = jax.grad(lambda a, b: jnp.sum(f(a, b) ** 2), argnums=(0, 1))(A, B)
    ra, rb = jax.grad(lambda a, b: jnp.sum(jnp.sin(a * b) ** 2), argnums=(0, 1))(A, B)
    assert ga.shape == (3, 1) and gb.shape == (4,)
    close(ga, ra)
    close(gb, rb)


def test_multiple_outputs_and_vmap(kernel):
    X, Y = data(5, seed=4)
    Ps = jnp.array([0.1, -0.5, 0.8])
    a, b = jax.vmap(kernel, in_axes=(None, None, 0))(X, Y, Ps)
    ra, rb = jax.vmap(kernel_ref, in_axes=(None, None, 0))(X, Y, Ps)
    assert a.shape == (3, 5)
    close(a, ra)
    close(b, rb)
    per_sample = jax.vmap(jax.grad(loss_of(kernel)), in_axes=(0, None, None))(Ps, X, Y)
    close(per_sample, jax.vmap(jax.grad(loss_of(kernel_ref)), in_axes=(0, None, None))(Ps, X, Y))
    Xs = jnp.stack([X, 2 * X])
    gx = jax.vmap(jax.grad(loss_of(kernel), argnums=1), in_axes=(None, 0, None))(0.2, Xs, Y)
    rx = jax.vmap(jax.grad(loss_of(kernel_ref), argnums=1), in_axes=(None, 0, None))(0.2, Xs, Y)
    close(gx, rx)


def test_jitted_training_step():
    """Gradient descent on y = a exp(-k t) inside one jitted step: the loss decreases, and the
    iterates equal those of the same loop on the jax.numpy formula."""
    t, a, k = sym.var("t"), sym.var("a"), sym.var("k")
    model = jax_function(a * sym.exp(-k * t), [t, a, k])
    T = jnp.linspace(0.0, 3.0, 64)
    target = 2.0 * jnp.exp(-1.3 * T)

    def make_step(fn):
        def loss(params):
            return jnp.mean((fn(T, params[0], params[1]) - target) ** 2)

        @jax.jit
        def step(params):
            value, g = jax.value_and_grad(loss)(params)
            return params - 0.5 * g, value

        return step

    step = make_step(model)
    ref_step = make_step(lambda t, a, k: a * jnp.exp(-k * t))
    params = ref = jnp.array([1.0, 0.5])
    losses = []
    for _ in range(20):
        params, value = step(params)
        ref, _ = ref_step(ref)
        losses.append(float(value))
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert losses[-1] < 0.1 * losses[0]
    close(params, ref, rtol=1e-10)  # 20 iterations compound the 1e-16 differences


def test_integer_input_has_no_cotangent():
    x, n = sym.var("x"), sym.var("n", "int64")
    f = jax_function(x * sym.astype(n, "float64"), [x, n])
    N = jnp.arange(1, 4)
    g = jax.grad(lambda X: jnp.sum(f(X, N)))(jnp.ones(3))
    close(g, [1.0, 2.0, 3.0])


def test_mixed_dtypes():
    """A float32 parameter of a float64 kernel gets a float32 cotangent (custom_vjp checks)."""
    x, s = sym.var("x"), sym.var("s", "float32")
    f = jax_function(sym.exp(s * x), [x, s])  # s promoted to float64 implicitly
    X = jnp.linspace(0.0, 1.0, 4)
    S = jnp.float32(0.5)
    gx, gs = jax.grad(lambda a, b: jnp.sum(f(a, b)), argnums=(0, 1))(X, S)
    assert gx.dtype == jnp.float64 and gs.dtype == jnp.float32
    close(gs, jnp.sum(X * jnp.exp(0.5 * X)), rtol=1e-6)


def test_float32_kernel():
    x = sym.var("x", "float32")
    f = jax_function(sym.exp(x) * 2.0, [x])
    X = jnp.linspace(0, 1, 4, dtype=jnp.float32)
    g = jax.jit(jax.grad(lambda v: jnp.sum(f(v))))(X)
    assert g.dtype == jnp.float32
    close(g, 2 * jnp.exp(X), rtol=1e-6)


# --------------------------------------------------------------------------------------------
# errors


def test_wrong_dtype(kernel):
    X, Y = data(3)
    with pytest.raises(TypeError, match=r"input 0 \('x'\) has dtype float32.*'x' is float64"):
        kernel(X.astype(jnp.float32), Y, 0.1)


def test_wrong_arity(kernel):
    X, Y = data(3)
    with pytest.raises(TypeError, match=r"takes 3 inputs .* got 2"):
        kernel(X, Y)


def test_non_array_input(kernel):
    X, Y = data(3)
    with pytest.raises(TypeError, match=r"input 2 \('p'\) must be a JAX or numpy array"):
        kernel(X, Y, "0.1")


def test_x64_disabled_is_reported():
    x = sym.var("x")
    f = jax_function(sym.exp(x), [x])
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(TypeError, match="64-bit types disabled"):
            f(jnp.ones(2))
    finally:
        jax.config.update("jax_enable_x64", True)
