"""core_ad.interop with PyTorch: a compiled core_ad kernel as a torch.autograd.Function.

Spec core-ad.md 1.14 (the Enoki <-> PyTorch bridge, section 2.3 item 5: atan2(1, 2) = 0.4636,
d/dy = 0.4, d/dx = -0.2) and F10 (conversion to and from external tensor types).

Tolerances (float64 unless stated):
* the same formula evaluated by the kernel and by torch ops, and their gradients: rtol 1e-12
  (a few roundings of well-conditioned arithmetic, possibly summed in another order);
* torch.autograd.gradcheck / gradgradcheck: their defaults (eps 1e-6, atol 1e-5, rtol 1e-3);
* float32: rtol 1e-6 (a few float32 roundings, eps = 1.2e-7), plus atol 1e-6 where terms of
  size ~1 cancel.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import core_ad as ad  # noqa: E402
import core_ad.numpy as anp  # noqa: E402
from core_ad import interop, sym  # noqa: E402
from core_ad.interop import from_torch, to_torch, torch_function  # noqa: E402

F64 = torch.float64
RTOL = 1e-12


def close(a, b, rtol=RTOL, atol=0.0):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.fixture(scope="module", params=[None, "numpy"], ids=["default-backend", "numpy"])
def kernel(request):
    """Two inputs over lanes, one 0-d parameter broadcast to every lane, two outputs with
    transcendentals: ``(exp(p x) sin(y), tanh(x y) + log1p(p^2) / (1 + x^2))``. Built with
    sym.compile's default backend and with the numpy one: the bridge must not depend on it."""
    x, y, p = sym.var("x"), sym.var("y"), sym.var("p")
    outs = [sym.exp(p * x) * sym.sin(y), sym.tanh(x * y) + sym.log1p(p * p) / (1.0 + x * x)]
    return torch_function(outs, [x, y, p], backend=request.param)


def kernel_ref(X, Y, P):
    return torch.exp(P * X) * torch.sin(Y), torch.tanh(X * Y) + torch.log1p(P * P) / (1 + X * X)


def rand(*shape, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, dtype=F64, generator=g) * 2 - 1).requires_grad_(requires_grad)


# --------------------------------------------------------------------------------------------
# the Enoki example


def test_enoki_atan2_example():
    y, x = sym.var("y"), sym.var("x")
    f = torch_function(sym.arctan2(y, x), [y, x])
    ty = torch.tensor(1.0, dtype=F64, requires_grad=True)
    tx = torch.tensor(2.0, dtype=F64, requires_grad=True)
    out = f(ty, tx)
    assert isinstance(out, torch.Tensor) and out.shape == () and out.dtype == F64
    loss = out * 1.0
    loss.backward()
    close(out, np.arctan2(1.0, 2.0))
    assert round(out.item(), 4) == 0.4636
    # d/dy atan2(y, x) = x / (x^2 + y^2) = 0.4, d/dx = -y / (x^2 + y^2) = -0.2
    close(ty.grad, 0.4)
    close(tx.grad, -0.2)


# --------------------------------------------------------------------------------------------
# gradients


def test_values_and_gradients_match_torch_autograd(kernel):
    X, Y, P = rand(9, seed=1), rand(9, seed=2), torch.tensor(0.7, dtype=F64, requires_grad=True)
    a, b = kernel(X, Y, P)
    ra, rb = kernel_ref(X, Y, P)
    close(a, ra)
    close(b, rb)
    w1, w2 = rand(9, seed=3, requires_grad=False), rand(9, seed=4, requires_grad=False)
    g = torch.autograd.grad((a * w1).sum() + (b * w2).sum(), (X, Y, P))
    r = torch.autograd.grad((ra * w1).sum() + (rb * w2).sum(), (X, Y, P))
    for gi, ri in zip(g, r):
        assert gi.shape == ri.shape
        close(gi, ri)


def test_gradcheck_multi_input_multi_output_with_broadcast_scalar(kernel):
    X, Y = rand(6, seed=5), rand(6, seed=6)
    P = torch.tensor(0.4, dtype=F64, requires_grad=True)  # 0-d, broadcast to all lanes
    assert torch.autograd.gradcheck(kernel, (X, Y, P))
    # a 2-D lane shape from a (3, 1) and a (4,) input: both are reduced back
    assert torch.autograd.gradcheck(kernel, (rand(3, 1, seed=7), rand(4, seed=8), P))


def test_gradgradcheck_double_backward(kernel):
    """The VJP is itself a differentiable kernel: create_graph=True works."""
    X, Y = rand(4, seed=9), rand(4, seed=10)
    P = torch.tensor(-0.3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(kernel, (X, Y, P))


def test_broadcast_scalar_parameter_gets_the_sum_over_lanes():
    x, p = sym.var("x"), sym.var("p")
    f = torch_function(sym.sin(p * x), [x, p])
    X = rand(5, seed=11, requires_grad=False)
    P = torch.tensor(1.3, dtype=F64, requires_grad=True)
    out = f(X, P)
    assert out.shape == (5,)
    out.sum().backward()
    assert P.grad.shape == ()
    # d/dp sum_i sin(p x_i) = sum_i x_i cos(p x_i): the per-lane cotangents, summed
    close(P.grad, (X * torch.cos(1.3 * X)).sum())
    # torch's engine would also sum an expandable gradient itself: check that the Function's
    # own backward returns the reduced one
    out = f(X, P)  # kept alive: torch may free a node's saved tensors with its output
    node = out.grad_fn
    with torch.no_grad():
        _, gx, gp = node.apply(torch.ones(5, dtype=F64))
    assert gx is None and gp.shape == ()  # X does not require grad
    close(gp, P.grad)
    # with per-lane weights as grad_output
    w = rand(5, seed=12, requires_grad=False)
    (g,) = torch.autograd.grad(f(X, P), P, grad_outputs=w)
    close(g, (w * X * torch.cos(1.3 * X)).sum())


def test_inputs_without_requires_grad_get_none(kernel):
    X, Y = rand(3, seed=13), rand(3, seed=14, requires_grad=False)
    P = torch.tensor(0.2, dtype=F64)  # no requires_grad
    a, b = kernel(X, Y, P)
    (a.sum() + b.sum()).backward()
    assert X.grad is not None and Y.grad is None and P.grad is None
    # nothing requires grad: plain tensors out, no graph
    a, b = kernel(X.detach(), Y, P)
    assert not a.requires_grad and a.grad_fn is None


def test_integer_input_and_mixed_dtypes():
    """An int64 input carries no derivative; a float32 parameter in a float64 kernel gets a
    float32 gradient."""
    x, n, s = sym.var("x"), sym.var("n", "int64"), sym.var("s", "float32")
    f = torch_function(x * n + s * x, [x, n, s])  # s promoted to float64 implicitly
    X = rand(4, seed=15)
    N = torch.tensor([1, 2, 3, 4])
    S = torch.tensor(0.5, dtype=torch.float32, requires_grad=True)
    out = f(X, N, S)
    assert out.dtype == F64
    out.sum().backward()
    close(X.grad, N.double() + 0.5)
    assert S.grad.dtype == torch.float32
    close(S.grad, X.detach().sum().float(), rtol=1e-6)
    # the Function's backward itself returns float32 (not relying on the engine's cast)
    out = f(X, N, S)  # kept alive, as above
    node = out.grad_fn
    with torch.no_grad():
        _, gx, gn, gs = node.apply(torch.ones(4, dtype=F64))
    assert gx.dtype == F64 and gn is None and gs.dtype == torch.float32


def test_float32_kernel():
    x, p = sym.var("x", "float32"), sym.var("p", "float32")
    f = torch_function([sym.exp(-p * x) * 2.0, sym.sqrt(x)], [x, p])
    X = torch.linspace(0.5, 2.0, 8, requires_grad=True)
    P = torch.tensor(0.75, requires_grad=True)
    a, b = f(X, P)
    assert a.dtype == torch.float32 and b.dtype == torch.float32
    (a.sum() + b.sum()).backward()
    Xr, Pr = X.detach().clone().requires_grad_(), P.detach().clone().requires_grad_()
    ((torch.exp(-Pr * Xr) * 2.0).sum() + torch.sqrt(Xr).sum()).backward()
    close(a, torch.exp(-P * X) * 2.0, rtol=1e-6)
    assert X.grad.dtype == torch.float32 and P.grad.dtype == torch.float32
    close(X.grad, Xr.grad, rtol=1e-6, atol=1e-6)  # terms of size ~1 cancel: absolute too
    close(P.grad, Pr.grad, rtol=1e-6)


def test_torch_func_grad_and_vmap(kernel):
    """torch.func transforms: per-sample gradients with vmap(grad(...))."""
    X, Y = rand(4, 6, seed=16, requires_grad=False), rand(6, seed=17, requires_grad=False)
    Ps = torch.tensor([0.1, -0.4, 0.9], dtype=F64)

    def loss(fn):
        return lambda P, X: sum(o.sum() for o in fn(X, Y, P))

    got = torch.vmap(torch.func.grad(loss(kernel)), in_dims=(0, None))(Ps, X)
    ref = torch.vmap(torch.func.grad(loss(kernel_ref)), in_dims=(0, None))(Ps, X)
    close(got, ref)
    got = torch.vmap(torch.func.grad(loss(kernel), argnums=1), in_dims=(None, 0))(Ps[0], X)
    ref = torch.vmap(torch.func.grad(loss(kernel_ref), argnums=1), in_dims=(None, 0))(Ps[0], X)
    assert got.shape == X.shape
    close(got, ref, atol=1e-15)


# --------------------------------------------------------------------------------------------
# memory: no copies for contiguous CPU tensors


def test_forward_is_zero_copy_for_contiguous_tensors(kernel, monkeypatch):
    seen = {}
    real = kernel.compiled_forward

    def spy(*arrays):
        seen["args"] = arrays
        seen["outs"] = real(*arrays)
        return seen["outs"]

    monkeypatch.setattr(kernel, "compiled_forward", spy)
    X, Y = rand(8, seed=18), rand(8, seed=19)
    P = torch.tensor(0.5, dtype=F64, requires_grad=True)
    a, b = kernel(X, Y, P)
    for arr, t in zip(seen["args"], (X, Y, P)):
        assert isinstance(arr, np.ndarray)
        assert np.shares_memory(arr, t.detach().numpy())
    # results are handed back without a copy either
    assert np.shares_memory(seen["outs"][0], a.detach().numpy())
    assert np.shares_memory(seen["outs"][1], b.detach().numpy())
    # a non-contiguous tensor is copied once (documented), and still gives the right values
    base = rand(8, 2, seed=20)
    Xs = base[:, 0]
    assert not Xs.is_contiguous()
    a2, _ = kernel(Xs, Y, P)
    assert not np.shares_memory(seen["args"][0], base.detach().numpy())
    assert seen["args"][0].flags.c_contiguous
    close(a2, kernel_ref(Xs, Y, P)[0])


def test_expanded_cotangent_reaches_the_vjp_as_a_scalar(kernel, monkeypatch):
    """``.sum()`` sends back a stride-0 expansion of 1.0: it is passed as one 0-d value, not
    materialised, and the gradients are still right."""
    vf = kernel.vjp_function
    seen = []
    real = vf.compiled_forward

    def spy(*arrays):
        seen.append(arrays)
        return real(*arrays)

    monkeypatch.setattr(vf, "compiled_forward", spy)
    X, Y = rand(6, seed=23), rand(6, seed=24)
    P = torch.tensor(0.5, dtype=F64, requires_grad=True)
    a, b = kernel(X, Y, P)
    (a.sum() + 2.0 * b.sum()).backward()
    (cot_a, cot_b) = seen[-1][3:]
    assert cot_a.shape == () and cot_b.shape == ()
    assert float(cot_a) == 1.0 and float(cot_b) == 2.0
    Xr, Yr, Pr = (t.detach().clone().requires_grad_() for t in (X, Y, P))
    ra, rb = kernel_ref(Xr, Yr, Pr)
    (ra.sum() + 2.0 * rb.sum()).backward()
    for t, r in zip((X, Y, P), (Xr, Yr, Pr)):
        close(t.grad, r.grad)


def test_identity_output_does_not_alias_its_input():
    x = sym.var("x")
    f = torch_function([x, x * 2.0], [x])
    X = rand(3, seed=21)
    a, _ = f(X)
    assert not np.shares_memory(a.detach().numpy(), X.detach().numpy())
    close(a, X)


def test_to_torch_and_from_torch_share_memory():
    arr = ad.Array(np.arange(4.0), requires_grad=True)
    t = to_torch(arr)
    assert isinstance(t, torch.Tensor) and t.dtype == F64 and not t.requires_grad
    t[0] = 10.0
    assert arr.value[0] == 10.0  # one buffer
    assert to_torch(np.ones(2, np.float32), requires_grad=True).requires_grad
    src = torch.arange(6.0, dtype=F64).reshape(2, 3).requires_grad_()
    back = from_torch(src)
    assert isinstance(back, ad.Array) and back.requires_grad and back.shape == (2, 3)
    assert np.shares_memory(back.value, src.detach().numpy())
    assert not from_torch(src, requires_grad=False).requires_grad
    # the Array is a core_ad leaf: core_ad gradients work on it
    ad.backward(anp.sum(back * back))
    close(back.grad, 2 * src.detach())
    with pytest.raises(TypeError, match="torch.Tensor"):
        from_torch(np.ones(3))


# --------------------------------------------------------------------------------------------
# a training loop


def test_adam_fits_a_parameter_of_a_kernel():
    """Fit the decay rate of y = a exp(-k t) with torch.optim.Adam; the kernel is core_ad's."""
    t, a, k = sym.var("t"), sym.var("a"), sym.var("k")
    model = torch_function(a * sym.exp(-k * t), [t, a, k])
    T = torch.linspace(0.0, 3.0, 64, dtype=F64)
    data = 2.0 * torch.exp(-1.3 * T)
    A = torch.tensor(1.0, dtype=F64, requires_grad=True)
    K = torch.tensor(0.2, dtype=F64, requires_grad=True)
    opt = torch.optim.Adam([A, K], lr=0.1)
    losses = []
    for _ in range(50):
        opt.zero_grad()
        loss = ((model(T, A, K) - data) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]
    assert abs(K.item() - 1.3) < abs(0.2 - 1.3) / 2


# --------------------------------------------------------------------------------------------
# errors


def test_wrong_dtype_names_the_input_and_both_dtypes(kernel):
    X = torch.rand(3, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"input 0 \('x'\).*torch\.float32.*float64"):
        kernel(X, rand(3), torch.tensor(0.1, dtype=F64))


def test_wrong_arity(kernel):
    with pytest.raises(TypeError, match=r"takes 3 inputs \(x: float64, y: float64, p: float64\)"
                       r", got 2"):
        kernel(rand(3), rand(3))


def test_non_tensor_input(kernel):
    with pytest.raises(TypeError, match=r"input 2 \('p'\) must be a torch.Tensor, got float"):
        kernel(rand(3), rand(3), 0.5)


def test_non_broadcasting_shapes(kernel):
    with pytest.raises(ValueError, match=r"do not broadcast.*x: \(3,\).*y: \(4,\)"):
        kernel(rand(3), rand(4), torch.tensor(0.1, dtype=F64))


def test_tensor_on_another_device(kernel):
    # the meta device exists in every torch build: the same check as for CUDA tensors
    X = torch.empty(3, dtype=F64, device="meta")
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is on device meta.*'cuda' backend"):
        kernel(X, rand(3), torch.tensor(0.1, dtype=F64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensor(kernel):
    X = torch.rand(3, dtype=F64, device="cuda")
    with pytest.raises(ValueError, match="CUDA tensors need the 'cuda' backend"):
        kernel(X, rand(3), torch.tensor(0.1, dtype=F64))


# --------------------------------------------------------------------------------------------
# gpu tier: backend="cuda" on CUDA tensors


@pytest.fixture(scope="module")
def cuda_kernel():
    from core_ad import codegen

    if not (torch.cuda.is_available() and codegen.cuda_available()):
        pytest.skip("needs CuPy and a CUDA device visible to torch")
    x, y, p = sym.var("x"), sym.var("y"), sym.var("p")
    outs = [sym.exp(p * x) * sym.sin(y), sym.tanh(x * y) + sym.log1p(p * p) / (1.0 + x * x)]
    return torch_function(outs, [x, y, p], backend="cuda")


def _cuda_inputs(shape=(4, 5)):
    X, Y = rand(*shape, seed=21), rand(*shape, seed=22)
    P = torch.tensor(0.7, dtype=F64, requires_grad=True)
    return [t.detach().cuda().requires_grad_() for t in (X, Y, P)]


@pytest.mark.gpu
def test_gpu_values_and_gradients_match_torch(cuda_kernel):
    X, Y, P = _cuda_inputs()
    a, b = cuda_kernel(X, Y, P)
    assert a.device == X.device and a.shape == (4, 5)
    ra, rb = kernel_ref(X, Y, P)
    close(a.cpu(), ra.cpu())
    close(b.cpu(), rb.cpu())
    w = torch.rand(4, 5, dtype=F64, device="cuda")
    got = torch.autograd.grad((a * w).sum() + b.sum(), [X, Y, P])
    want = torch.autograd.grad((ra * w).sum() + rb.sum(), [X, Y, P])
    for g, r in zip(got, want):
        assert g.device == X.device and g.shape == r.shape
        close(g.cpu(), r.cpu())  # P: the per-lane cotangents summed to a 0-d gradient


@pytest.mark.gpu
def test_gpu_gradcheck_and_second_order(cuda_kernel):
    X, Y, P = _cuda_inputs((3,))
    assert torch.autograd.gradcheck(lambda *t: cuda_kernel(*t), (X, Y, P))
    assert torch.autograd.gradgradcheck(lambda *t: cuda_kernel(*t), (X, Y, P))


@pytest.mark.gpu
def test_gpu_broadcast_and_non_contiguous_inputs(cuda_kernel):
    X, Y, P = _cuda_inputs((4, 5))
    Xt = X.detach().t().contiguous().t().requires_grad_()  # (4, 5) with transposed strides
    Y1 = Y.detach()[:1].requires_grad_()  # (1, 5): broadcast along the first axis
    a, _ = cuda_kernel(Xt, Y1, P)
    ra, _ = kernel_ref(Xt, Y1, P)
    close(a.cpu(), ra.cpu())
    (gy,) = torch.autograd.grad(a.sum(), [Y1])
    (ry,) = torch.autograd.grad(ra.sum(), [Y1])
    assert gy.shape == (1, 5)
    close(gy.cpu(), ry.cpu())


@pytest.mark.gpu
def test_gpu_bad_devices_are_named(cuda_kernel):
    X, Y, P = _cuda_inputs((3,))
    with pytest.raises(ValueError, match=r"input 2 \('p'\) is on device cpu.*\.cuda\(\)"):
        cuda_kernel(X, Y, P.detach().cpu())


def test_bad_construction():
    x = sym.var("x")
    with pytest.raises(TypeError, match="input 0 must be a var or leaf, got a Apply node"):
        torch_function(sym.exp(x), [sym.exp(x)])
    with pytest.raises(ValueError, match="not among the inputs"):
        torch_function(sym.exp(x) + sym.var("q"), [x])
    with pytest.raises(ValueError, match="unknown backend"):
        torch_function(sym.exp(x), [x], backend="nonexistent")


# --------------------------------------------------------------------------------------------
# construction details


def test_backend_none_defers_to_sym_compile_default(monkeypatch):
    calls = []
    real = sym.compile

    def recording(outputs, inputs, **kw):
        calls.append(kw)
        return real(outputs, inputs, **kw)

    monkeypatch.setattr(sym, "compile", recording)
    x = sym.var("x")
    f = torch_function(sym.sin(x), [x])
    assert calls == [{}, {}]  # forward and VJP, both with sym.compile's own default
    assert f.compiled_forward is not None and f.compiled_vjp is not None
    calls.clear()
    torch_function(sym.sin(x), [x], backend="numpy")
    assert calls == [{"backend": "numpy"}, {"backend": "numpy"}]


def test_compiled_callables_are_built_once(kernel, monkeypatch):
    def fail(*a, **k):
        raise AssertionError("sym.compile called again")

    kernel.vjp_function  # the VJP kernel for backward: built once, cached  # noqa: B018
    monkeypatch.setattr(sym, "compile", fail)
    X = rand(3, seed=22)
    for _ in range(2):
        a, b = kernel(X, rand(3), torch.tensor(0.1, dtype=F64))
        (a.sum() + b.sum()).backward()


def test_importing_core_ad_interop_does_not_import_torch_or_jax():
    code = (
        "import sys, core_ad, core_ad.interop, core_ad._interop.torch_bridge,"
        " core_ad._interop.jax_bridge;"
        " assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": ":".join(sys.path)}, timeout=60)
    assert r.returncode == 0, r.stderr


def test_public_names():
    assert set(interop.__all__) >= {"torch_function", "jax_function", "to_torch", "from_torch"}
