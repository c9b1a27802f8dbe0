"""Spatial transformer (Jaderberg et al. 2015; [P] section 5.1.1, Table 1): bilinear sampling
of a batch of feature maps through a per-image affine grid, with the conventions of PyTorch's
``affine_grid`` + ``grid_sample`` (bilinear, ``padding_mode="zeros"``, ``align_corners=False``):

    nx = (2x + 1) / w - 1,  ny = (2y + 1) / h - 1               output pixel, normalised
    sx(x, y, n) = theta[n, 0, 0] nx + theta[n, 0, 1] ny + theta[n, 0, 2]       (sy: row 1)
    ix = ((sx + 1) w - 1) / 2,  iy = ((sy + 1) h - 1) / 2       sampled position, pixels
    (clamped to [-1, w] x [-1, h], which bounds the reads and changes no value or gradient)
    output(x, y, c, n) = bilinear(constant_exterior(input, 0), ix, iy)

The sampling grid ``sx, sy`` is its own Func (as ``affine_grid``): the gradient then reduces
over the channels once per pixel before reaching ``theta``.
Inputs: ``image`` ``(n, c, h, w)``, ``theta`` ``(n, 2, 3)``, both float32 or both float64.
Output ``output``: ``(n, c, h, w)``. Gradients: ``adjoint_pipeline(hl, app, d_out,
("image", "theta"))`` (``_common``).
"""
from __future__ import annotations

import numpy as np

from ._common import App, bilinear, check_shape, float_type


def build(hl, image, theta):
    check_shape("image", image, 4, "(n, c, h, w)")
    check_shape("theta", theta, 3, "(n, 2, 3)")
    n, c, h, w = np.shape(image)
    if np.shape(theta) != (n, 2, 3):
        raise ValueError(f"theta must be ({n}, 2, 3) for {n} images, got {np.shape(theta)}")
    dt, t = float_type(hl, image, theta)
    image, theta = np.ascontiguousarray(image), np.ascontiguousarray(theta)
    x, y, ch, b = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("n")
    im, th = hl.Buffer(image, name="image"), hl.Buffer(theta, name="theta")   # th[col, row, n]
    nx = (2.0 * hl.cast(t, x) + 1.0) * (1.0 / w) - 1.0
    ny = (2.0 * hl.cast(t, y) + 1.0) * (1.0 / h) - 1.0
    sx, sy = hl.Func("sample_x"), hl.Func("sample_y")
    sx[x, y, b] = th[0, 0, b] * nx + th[1, 0, b] * ny + th[2, 0, b]
    sy[x, y, b] = th[0, 1, b] * nx + th[1, 1, b] * ny + th[2, 1, b]
    src = hl.BoundaryConditions.constant_exterior(im, hl.cast(t, 0))
    # clamping to [-1, w] changes nothing (every corner of a position outside it reads 0, so
    # do the corners of -1 and w, the weight of the inner one being 0) but bounds the reads
    ix = hl.clamp(((sx[x, y, b] + 1.0) * w - 1.0) * 0.5, -1.0, float(w))
    iy = hl.clamp(((sy[x, y, b] + 1.0) * h - 1.0) * 0.5, -1.0, float(h))
    out = hl.Func("spatial_transformer")
    out[x, y, ch, b] = bilinear(hl, t, src, ix, iy, (ch, b))
    return App(hl, outputs={"output": out}, funcs={"sample_x": sx, "sample_y": sy, "src": src},
               vars={"x": x, "y": y, "c": ch, "n": b}, sizes={"output": [w, h, c, n]},
               buffers={"image": im, "theta": th}, meta={"dtype": dt})


def torch_reference(torch, image, theta):
    """``grid_sample(image, affine_grid(theta))``: bilinear, zero padding,
    ``align_corners=False`` (differentiable in both arguments)."""
    F = torch.nn.functional
    grid = F.affine_grid(theta, list(image.shape), align_corners=False)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False)


def torch_gather(torch, image, theta):
    """The same operator with explicit index gathers (``torch.gather`` of the four corners;
    its backward is a scatter-add): the "scatter/gather" PyTorch baseline."""
    n, c, h, w = image.shape
    dt = image.dtype
    xs = (2 * torch.arange(w, dtype=dt, device=image.device) + 1) / w - 1
    ys = (2 * torch.arange(h, dtype=dt, device=image.device) + 1) / h - 1
    nx, ny = xs[None, None, :], ys[None, :, None]
    sx = theta[:, 0, 0, None, None] * nx + theta[:, 0, 1, None, None] * ny + theta[:, 0, 2, None, None]
    sy = theta[:, 1, 0, None, None] * nx + theta[:, 1, 1, None, None] * ny + theta[:, 1, 2, None, None]
    return gather_bilinear(torch, image, ((sx + 1) * w - 1) / 2, ((sy + 1) * h - 1) / 2,
                           border=False)


def gather_bilinear(torch, image, ix, iy, border):
    """Bilinear samples of ``image`` ``(n, c, h, w)`` at pixel positions ``ix, iy`` ``(n, h, w)``;
    corners outside the image read 0 (``border=False``) or the positions are first clamped
    into the image (``border=True``)."""
    n, c, h, w = image.shape
    if border:
        ix, iy = ix.clamp(0, w - 1), iy.clamp(0, h - 1)
    fx, fy = torch.floor(ix), torch.floor(iy)
    wx, wy = ix - fx, iy - fy
    x0, y0 = fx.long(), fy.long()
    flat = image.reshape(n, c, h * w)
    out = 0
    for dy, ky in ((0, 1 - wy), (1, wy)):
        for dx, kx in ((0, 1 - wx), (1, wx)):
            xx, yy = x0 + dx, y0 + dy
            inside = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
            idx = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).reshape(n, 1, h * w)
            v = torch.gather(flat, 2, idx.expand(n, c, h * w)).reshape(n, c, h, w)
            out = out + v * (kx * ky * inside)[:, None]
    return out
