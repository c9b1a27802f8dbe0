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
``local_laplacian``. Layout: grey images are numpy ``(h, w)``, colour images planar numpy
``(c, h, w)``; the pipelines index them as ``img[x, y]`` / ``img[x, y, c]`` because
``hl.Buffer(ndarray)`` reverses the axes. See ``_common`` for the ``App`` record.

Nothing here imports ``halide`` or ``halide_ad``: the module is an argument.
"""
from . import (
    bilateral_grid,
    blur,
    conv2d,
    gamma,
    histogram,
    local_laplacian,
    upsample,
)
from ._common import SCHEDULES, App

APPS = ("gamma", "blur", "conv2d", "histogram", "upsample", "bilateral_grid",
        "local_laplacian")

__all__ = ["APPS", "SCHEDULES", "App", "bilateral_grid", "blur", "conv2d", "gamma",
           "histogram", "local_laplacian", "upsample"]
