"""torch_op calls that must be rejected, each with an error naming the problem."""

import numpy as np
import pytest

import halide_ad as hl

torch = pytest.importorskip("torch")

x, y = hl.Var("x"), hl.Var("y")


def _scale(img):
    out = hl.Func("scale")
    out[x, y] = img[x, y] * 2.0
    return out


def _func_form():
    img = hl.Buffer(np.zeros((3, 4), np.float32), "img")
    return hl.torch_op(_scale(img), inputs=[img]), img


def test_wrong_device():
    op = hl.torch_op(_scale)
    with pytest.raises(hl.FuncError, match="argument 0 is on device meta.*CPU tensors"):
        op(torch.empty(3, 4, device="meta"))


def test_wrong_dtype():
    op = hl.torch_op(_scale)
    with pytest.raises(hl.FuncError, match=r"argument 0 has dtype torch.complex64; supported"):
        op(torch.zeros(3, 4, dtype=torch.complex64))
    fop, _ = _func_form()
    with pytest.raises(hl.FuncError, match=r"argument 0 \(img\) has dtype float64, the pipeline"
                                           " reads float32"):
        fop(torch.zeros(3, 4, dtype=torch.float64))


def test_wrong_shape():
    fop, _ = _func_form()
    with pytest.raises(hl.FuncError, match=r"argument 0 \(img\) has 3 dimension\(s\), the"
                                           " pipeline reads 2"):
        fop(torch.zeros(2, 3, 4))
    with pytest.raises(hl.FuncError, match=r"expected 1 tensor\(s\), got 2"):
        fop(torch.zeros(3, 4), torch.zeros(3, 4))
    op = hl.torch_op(_scale, output_shape=(3, 4, 1))
    with pytest.raises(hl.FuncError, match=r"output shape \(3, 4, 1\) has 3 dimension\(s\),"
                                           " scale has 2"):
        op(torch.zeros(3, 4))


def test_bad_arguments():
    op = hl.torch_op(_scale)
    with pytest.raises(hl.FuncError, match="argument 0 is a ndarray, not a tensor"):
        op(np.zeros((3, 4)))
    with pytest.raises(hl.FuncError, match="the build function must return a Func, got int"):
        hl.torch_op(lambda img: 3)(torch.zeros(3, 4))
    img = hl.Buffer(np.zeros((3, 4), np.float32), "img")
    with pytest.raises(hl.FuncError, match="name the Buffers and Params it reads"):
        hl.torch_op(_scale(img))
    with pytest.raises(hl.FuncError, match="expected a Func or a function building one"):
        hl.torch_op(3)
