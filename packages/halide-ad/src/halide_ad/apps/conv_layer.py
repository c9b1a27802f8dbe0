"""A 2-D convolution layer (the paper's §4.2.1 / §5.6 benchmark: the backward pass of a 3 x 3,
16 -> 16 channel layer on a 16 x 16 x 256 x 256 input, with scatter-to-gather and as a general
scatter with atomics):

    output(x, y, co, n) = sum over (kx, ky, ci) of weights(kx, ky, ci, co)
                                                   * input(x + kx, y + ky, ci, n)

a "valid" convolution (the output is the input less ``k - 1`` in x and y). Inputs: ``input``
``(n, ci, h, w)``, ``weights`` ``(co, ci, kh, kw)``, both float32 or both float64. Output
``output``: ``(n, co, h - kh + 1, w - kw + 1)``. Gradients: ``adjoint_pipeline(hl, app, d_out,
("input", "weights"))`` (``_common``); ``torch_reference`` is the same layer in PyTorch.
"""
from __future__ import annotations


from ._common import App, check_shape, contiguous, float_type, shape


def build(hl, input, weights):
    check_shape("input", input, 4, "(n, ci, h, w)")
    check_shape("weights", weights, 4, "(co, ci, kh, kw)")
    n, ci, h, w = shape(input)
    co, wci, kh, kw = shape(weights)
    if wci != ci:
        raise ValueError(f"weights have {wci} input channels, the input has {ci}")
    if kh > h or kw > w:
        raise ValueError(f"a {kh} x {kw} kernel does not fit a {h} x {w} input")
    dt, t = float_type(hl, input, weights)
    inp, wb = (hl.Buffer(contiguous(input), name="input"),
               hl.Buffer(contiguous(weights), name="weights"))
    x, y, c, b = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("n")
    r = hl.RDom([hl.Range(0, kw), hl.Range(0, kh), hl.Range(0, ci)])
    out = hl.Func("conv_layer")
    out[x, y, c, b] = hl.cast(t, 0)
    out[x, y, c, b] += wb[r.x, r.y, r.z, c] * inp[x + r.x, y + r.y, r.z, b]
    return App(hl, outputs={"output": out}, funcs={}, vars={"x": x, "y": y, "c": c, "n": b},
               sizes={"output": [w - kw + 1, h - kh + 1, co, n]}, rdoms={"r": r},
               buffers={"input": inp, "weights": wb}, meta={"dtype": dt})


def torch_reference(torch, input, weights):
    """``torch.nn.functional.conv2d`` (a cross-correlation, as above) without padding."""
    return torch.nn.functional.conv2d(input, weights)
