"""Application pipelines written once against the Halide Python API.

Each module's ``build(hl, ...)`` takes the Halide-like module as its first argument, so the
same code defines the pipeline on ``halide_ad`` and on Halide 21 (``import halide``):

    import halide_ad as hl                  # or: import halide as hl
    from halide_ad.apps import blur
    app = blur.build(hl, img)               # img: numpy float32 (h, w)
    blur.schedule(app, "tiled")             # "inline" | "root" | "tiled"
    out = app.realize()                     # numpy (h, w)
    ref = blur.reference(img)               # independent numpy implementation

Modules: ``gamma``, ``blur``, ``conv2d``, ``histogram``, ``upsample``, ``bilateral_grid``,
``local_laplacian``; and the differentiable operators of the paper's Table 1,
``spatial_transformer``, ``flow_warp`` and ``bilateral_slice``, and ``conv_layer`` (the
paper's gather-versus-atomics benchmark) (batched ``(n, c, h, w)``
tensors; ``build`` plus PyTorch references; gradients via ``_common.adjoint_pipeline``). Layout: grey images are numpy ``(h, w)``, colour images planar numpy
``(c, h, w)``; the pipelines index them as ``img[x, y]`` / ``img[x, y, c]`` because
``hl.Buffer(ndarray)`` reverses the axes. See ``_common`` for the ``App`` record.

Nothing here imports ``halide`` or ``halide_ad``: the module is an argument.
"""
from . import (
    bilateral_grid,
    bilateral_slice,
    blur,
    conv2d,
    conv_layer,
    flow_warp,
    gamma,
    histogram,
    local_laplacian,
    spatial_transformer,
    upsample,
)
from ._common import SCHEDULES, App

APPS = ("gamma", "blur", "conv2d", "histogram", "upsample", "bilateral_grid",
        "local_laplacian")

OPERATORS = ("spatial_transformer", "flow_warp", "bilateral_slice")

__all__ = ["APPS", "OPERATORS", "SCHEDULES", "App", "bilateral_grid", "bilateral_slice", "blur",
           "conv2d", "conv_layer", "flow_warp", "gamma", "histogram", "local_laplacian",
           "spatial_transformer", "upsample"]
