"""torch_op: pipelines as torch.autograd Functions (gradcheck in float64, zero-copy CPU
tensors, an nn.Module training loop)."""

import numpy as np
import pytest

import halide_ad as hl

torch = pytest.importorskip("torch")

x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")


def blur(img, k):
    """A 3-tap horizontal blur with learnable taps ``k`` of a (c, h, w) image, repeat-edge."""
    cl = hl.BoundaryConditions.repeat_edge(img)
    out = hl.Func("blur")
    out[x, y, c] = cl[x - 1, y, c] * k[0] + cl[x, y, c] * k[1] + cl[x + 1, y, c] * k[2]
    return out


def gamma(img, g):
    """img ** g with a scalar (0-d tensor, a Param) exponent."""
    out = hl.Func("gamma")
    out[x, y] = hl.pow(img[x, y], g)
    return out


def test_gradcheck_float64():
    op = hl.torch_op(blur)
    gen = torch.Generator().manual_seed(0)
    img = torch.rand(2, 5, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.rand(3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(op, (img, k), eps=1e-6, atol=1e-8, rtol=1e-7)
    gop = hl.torch_op(gamma)
    im2 = (0.2 + torch.rand(4, 6, dtype=torch.float64, generator=gen)).requires_grad_()
    g = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gop, (im2, g), eps=1e-6, atol=1e-8, rtol=1e-7)


def test_forward_matches_torch_and_reuses_one_pipeline():
    op = hl.torch_op(blur)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        img = torch.rand(3, 4, 9, generator=gen)
        k = torch.rand(3, generator=gen)
        padded = torch.nn.functional.pad(img, (1, 1), mode="replicate")
        want = sum(k[i] * padded[..., i:i + 9] for i in range(3))
        torch.testing.assert_close(op(img, k), want, rtol=1e-6, atol=1e-6)
    assert len(op._signatures) == 1  # same signature: built and compiled once


def test_zero_copy_on_contiguous_cpu_tensors():
    op = hl.torch_op(blur)
    img = torch.rand(2, 4, 6, dtype=torch.float64, requires_grad=True)
    k = torch.rand(3, dtype=torch.float64, requires_grad=True)
    out = op(img, k)
    sig = next(iter(op._signatures.values()))
    assert np.shares_memory(sig.inputs[0].numpy(), img.detach().numpy())
    assert np.shares_memory(sig.inputs[1].numpy(), k.detach().numpy())
    grad = torch.rand_like(out)
    out.backward(grad)
    _, seed, _ = next(iter(sig.backward.values()))
    assert np.shares_memory(seed.numpy(), grad.numpy())


def test_func_form_and_integer_inputs_get_no_gradient():
    img = hl.Buffer(np.zeros((4, 6)), "img")
    lut_index = hl.Buffer(np.zeros((4, 6), np.int32), "index")
    lut = hl.Buffer(np.zeros(5), "lut")
    out = hl.Func("lookup")
    out[x, y] = img[x, y] * lut[hl.clamp(lut_index[x, y], 0, 4)]
    op = hl.torch_op(out, inputs=[img, lut_index, lut])
    gen = torch.Generator().manual_seed(2)
    a = torch.rand(4, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    idx = torch.randint(0, 5, (4, 6), dtype=torch.int32, generator=gen)
    table = torch.rand(5, dtype=torch.float64, generator=gen, requires_grad=True)
    res = op(a, idx, table)
    torch.testing.assert_close(res, a * table[idx.long()], rtol=1e-14, atol=0)
    res.sum().backward()
    torch.testing.assert_close(a.grad, table[idx.long()].detach(), rtol=1e-14, atol=0)
    want = torch.zeros(5, dtype=torch.float64).index_add_(0, idx.long().flatten(),
                                                          a.detach().flatten())
    torch.testing.assert_close(table.grad, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t, v: op(t, idx, v), (a, table))


class BlurModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = torch.nn.Parameter(torch.tensor([0.0, 1.0, 0.0]))
        self.op = hl.torch_op(blur)

    def forward(self, img):
        return self.op(img, self.k)


def test_training_loop_fits_blur_weights():
    """Recover the taps of a known blur by Adam on the MSE of the output (float32)."""
    gen = torch.Generator().manual_seed(3)
    true_k = torch.tensor([0.25, 0.5, 0.15])
    imgs = [torch.rand(3, 16, 20, generator=gen) for _ in range(4)]
    targets = [hl.torch_op(blur)(im, true_k) for im in imgs]
    model = BlurModel()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for step in range(150):
        im, tgt = imgs[step % 4], targets[step % 4]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(im), tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-3 * losses[0]
    torch.testing.assert_close(model.k.detach(), true_k, rtol=0, atol=1e-2)


def test_scheduled_app_as_a_torch_op_matches_torch_conv2d():
    """The conv2d application (an RDom over the kernel, tiled + vectorised + parallel) wrapped
    as an op by its output Func and Buffers (float32, as the app), against torch's conv2d:
    outputs and both gradients to 1e-5 relative."""
    from halide_ad import apps

    gen = torch.Generator().manual_seed(4)
    img = torch.rand(20, 36, generator=gen, requires_grad=True)
    ker = torch.rand(3, 5, generator=gen, requires_grad=True)
    app = apps.conv2d.build(hl, img.detach().numpy(), ker.detach().numpy())
    apps.conv2d.schedule(app, "tiled", tile=(16, 8), vec=4)
    op = hl.torch_op(app.outputs["output"], inputs=[app.buffers["img"], app.buffers["kernel"]])
    wgt = torch.rand(20, 36, generator=gen)
    (op(img, ker) * wgt).sum().backward()
    got = [op(img, ker).detach(), img.grad.clone(), ker.grad.clone()]
    img.grad, ker.grad = None, None
    # a true convolution, zero exterior: torch's conv2d is a correlation with the flipped kernel
    ref = torch.nn.functional.conv2d(img[None, None], ker.flip(0, 1)[None, None],
                                     padding=(1, 2))[0, 0]
    (ref * wgt).sum().backward()
    for g, w in zip(got, [ref.detach(), img.grad, ker.grad]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item())


def test_custom_derivative_inside_a_torch_op():
    """A max-stabilised softmax (its max reduction has no automatic adjoint) with a custom
    adjoint, as an op: equal to torch.softmax, and gradcheck passes in float64."""
    def softmax(a):
        w = a.dim(0).extent()
        r = hl.RDom([(0, w)])
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

        def adjoint(d):
            dot = hl.Func("dot")
            dot[y] = hl.f64(0)
            dot[y] += d[r.x, y] * sm[r.x, y]
            da = hl.Func("da")
            da[x, y] = sm[x, y] * (d[x, y] - dot[y])
            return {a: da}

        return hl.custom_derivative(sm, adjoint=adjoint, inputs=[a])

    op = hl.torch_op(softmax)
    gen = torch.Generator().manual_seed(5)
    a = (torch.randn(3, 5, dtype=torch.float64, generator=gen) * 3).requires_grad_()
    torch.testing.assert_close(op(a), torch.softmax(a, dim=1), rtol=1e-14, atol=1e-15)
    assert torch.autograd.gradcheck(op, (a,), eps=1e-6, atol=1e-8, rtol=1e-7)
