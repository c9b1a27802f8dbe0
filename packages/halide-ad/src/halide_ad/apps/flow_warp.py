"""FlowNet 2.0 warping layer (Ilg et al. 2017; [P] section 5.1.2, Table 1): bilinear sampling
of a batch of images at a per-pixel absolute sampling grid ``warp`` in ``[-1, 1]``, with the
conventions of PyTorch's ``grid_sample(image, warp.permute(0, 2, 3, 1), "bilinear",
padding_mode="border", align_corners=False)``:

    ix = clamp(((warp(x, y, 0, n) + 1) w - 1) / 2, 0, w - 1)        (iy: channel 1, h)
    output(x, y, c, n) = bilinear(image, ix, iy), left corner min(floor(ix), w - 2)

The authors' code ([C], spec section 5.4) clamps ``0.5 (warp + 1) w`` to ``[0, w]`` and the
left corner to ``w - 2``, which extrapolates near the right and bottom edges; the border
convention above is grid_sample's and never extrapolates.
Inputs: ``image`` ``(n, c, h, w)``, ``warp`` ``(n, 2, h, w)`` (x then y), both float32 or both
float64. Output ``output``: ``(n, c, h, w)``. Gradients: ``adjoint_pipeline(hl, app, d_out,
("image", "warp"))`` (``_common``).
"""
from __future__ import annotations

import numpy as np

from ._common import App, bilinear, check_shape, float_type
from .spatial_transformer import gather_bilinear


def build(hl, image, warp):
    check_shape("image", image, 4, "(n, c, h, w)")
    check_shape("warp", warp, 4, "(n, 2, h, w)")
    n, c, h, w = np.shape(image)
    if np.shape(warp) != (n, 2, h, w):
        raise ValueError(f"warp must be ({n}, 2, {h}, {w}), got {np.shape(warp)}")
    if h < 2 or w < 2:
        raise ValueError(f"the image must be at least 2 x 2, got {h} x {w}")
    dt, t = float_type(hl, image, warp)
    image, warp = np.ascontiguousarray(image), np.ascontiguousarray(warp)
    x, y, ch, b = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("n")
    im, wp = hl.Buffer(image, name="image"), hl.Buffer(warp, name="warp")
    ix = hl.clamp(((wp[x, y, 0, b] + 1.0) * w - 1.0) * 0.5, 0.0, float(w - 1))
    iy = hl.clamp(((wp[x, y, 1, b] + 1.0) * h - 1.0) * 0.5, 0.0, float(h - 1))
    out = hl.Func("flow_warp")
    # the left corner at most w - 2 (weight 1 on the right one at ix = w - 1): every read is
    # inside the image, so no boundary wrapper (whose adjoint is a pass over the image)
    out[x, y, ch, b] = bilinear(hl, t, im, ix, iy, (ch, b), hi=(w - 2, h - 2))
    return App(hl, outputs={"output": out}, funcs={},
               vars={"x": x, "y": y, "c": ch, "n": b}, sizes={"output": [w, h, c, n]},
               buffers={"image": im, "warp": wp}, meta={"dtype": dt})


def torch_reference(torch, image, warp):
    """A pure-PyTorch per-pixel warp: the four corners gathered with ``torch.gather`` (whose
    backward scatter-adds), positions clamped into the image (border)."""
    n, c, h, w = image.shape
    ix = ((warp[:, 0] + 1) * w - 1) / 2
    iy = ((warp[:, 1] + 1) * h - 1) / 2
    return gather_bilinear(torch, image, ix, iy, border=True)


def torch_grid_sample(torch, image, warp):
    """The same operator as one ``grid_sample`` call (border padding, align_corners=False)."""
    return torch.nn.functional.grid_sample(image, warp.permute(0, 2, 3, 1), mode="bilinear",
                                           padding_mode="border", align_corners=False)
