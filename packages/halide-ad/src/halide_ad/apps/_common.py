"""Shared plumbing of the application pipelines: the ``App`` record and the schedule names.

Every app module has

* ``build(hl, inputs..., params...) -> App`` -- the algorithm, written against the Halide
  Python API subset that ``halide_ad`` copies; ``hl`` is either ``halide`` (Halide 21 from PyPI)
  or ``halide_ad``, so the same code defines the pipeline on both;
* ``schedule(app, name, **options)`` -- applies one of ``SCHEDULES`` to the app's Funcs;
* ``reference(inputs..., params...)`` -- an independent plain-numpy implementation.

Layout convention (the same for every app): a grey image is a numpy ``(h, w)`` array and a
multi-channel image a planar numpy ``(c, h, w)`` array. ``hl.Buffer(ndarray)`` reverses the
axes, so the pipeline sees ``img[x, y]`` / ``img[x, y, c]`` with ``x`` the last numpy axis, and
``np.asarray(f.realize([w, h, c]))`` comes back as ``(c, h, w)`` again.
"""
from __future__ import annotations

import numpy as np

#: the named schedules every app implements
#: * "inline": all default (pure Funcs inlined; Funcs with updates computed where Halide puts
#:   them by default, i.e. at the innermost loop of their consumer);
#: * "root":   every intermediate Func compute_root();
#: * "tiled":  outputs tiled + vectorised + parallel; intermediates compute_at the tile or
#:   compute_root (then vectorised / parallel themselves).
SCHEDULES = ("inline", "root", "tiled")


class App:
    """What ``build`` returns.

    Attributes: ``hl`` (the module used), ``outputs`` (name -> output Func, the first one is
    the main output, also ``output``), ``funcs`` (name -> intermediate Func), ``vars`` (name ->
    Var: the pure Vars plus the tile Vars ``xo, yo, xi, yi``), ``rdoms`` (name -> RDom),
    ``params`` (name -> hl.Param), ``buffers`` (name -> hl.Buffer; kept here so the numpy
    memory they wrap stays alive), ``sizes`` (output name -> the realize() sizes that cover
    the input) and ``meta`` (plain Python values the app was built with).
    """

    def __init__(self, hl, outputs, funcs, vars, sizes, rdoms=None, params=None,
                 buffers=None, meta=None):
        self.hl = hl
        self.outputs = dict(outputs)
        self.funcs = dict(funcs)
        self.vars = dict(vars)
        self.sizes = dict(sizes)
        self.rdoms = dict(rdoms or {})
        self.params = dict(params or {})
        self.buffers = dict(buffers or {})
        self.meta = dict(meta or {})
        self.schedule_name = None

    @property
    def output(self):
        return next(iter(self.outputs.values()))

    def func(self, name):
        """An output or intermediate Func by name."""
        if name in self.outputs:
            return self.outputs[name]
        return self.funcs[name]

    def realize(self, name=None, sizes=None):
        """Realize output ``name`` (default: the main one) and return a numpy copy.

        ``sizes`` defaults to ``self.sizes[name]`` (Halide order: x extent first).
        """
        name = name or next(iter(self.outputs))
        f = self.outputs[name]
        sz = list(self.sizes[name] if sizes is None else sizes)
        return np.array(np.asarray(f.realize(sz)), copy=True)

    def __repr__(self):
        return (f"App(outputs={list(self.outputs)}, funcs={list(self.funcs)}, "
                f"schedule={self.schedule_name!r})")


def check_schedule_name(name):
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; expected one of {SCHEDULES}")


def boundary(hl, buf, kind, value=0.0):
    """``hl.BoundaryConditions.<kind>(buf)``; ``constant_exterior`` takes ``value``."""
    bc = hl.BoundaryConditions
    if kind == "constant_exterior":
        return bc.constant_exterior(buf, hl.f32(value))
    if kind in ("repeat_edge", "mirror_image", "mirror_interior", "repeat_image"):
        return getattr(bc, kind)(buf)
    raise ValueError(f"unknown boundary condition {kind!r}")


#: numpy.pad mode of each Halide boundary condition
NUMPY_PAD_MODE = {
    "constant_exterior": "constant",
    "repeat_edge": "edge",
    "mirror_image": "symmetric",    # edge pixel repeated: c b a | a b c | c b a
    "mirror_interior": "reflect",   # edge pixel not repeated: c b | a b c | b a
    "repeat_image": "wrap",
}


# ---- the differentiable operators (spatial_transformer, flow_warp, bilateral_slice) ----------
def float_type(hl, *arrays):
    """``(numpy dtype, hl Type)`` shared by ``arrays``: all float32 or all float64."""
    kinds = {np.dtype(a.dtype) if hasattr(a, "dtype") else np.asarray(a).dtype for a in arrays}
    if len(kinds) != 1 or next(iter(kinds)) not in (np.float32, np.float64):
        raise ValueError("the inputs must all be float32 or all float64, got "
                         + ", ".join(sorted(str(k) for k in kinds)))
    dt = next(iter(kinds))
    return dt, hl.Float(8 * dt.itemsize)


def contiguous(a):
    """A numpy array made C-contiguous; a device array (CuPy) as it is (its Buffer handles
    the layout on the device)."""
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) or not hasattr(a, "shape") \
        else a


def shape(a) -> tuple:
    """``a``'s shape, numpy or device array (without a transfer)."""
    return tuple(a.shape) if hasattr(a, "shape") else np.shape(a)


def check_shape(name, a, ndim, what):
    if len(shape(a)) != ndim:
        raise ValueError(f"{name} must be {what}, got shape {shape(a)}")


def bilinear(hl, t, src, ix, iy, rest, hi=None):
    """Bilinear sample of ``src[ix, iy, *rest]`` at float coordinates (pixel centres at integer
    positions): the four corners ``x0 + {0, 1}`` x ``y0 + {0, 1}``, ``x0 = floor(ix)``, weighted
    by ``ix - x0`` (``iy`` alike). ``src`` supplies the boundary (it is read at ``x0 .. x0 + 1``);
    ``hi = (hx, hy)`` caps ``x0, y0`` (the weight of the far corner then reaches 1)."""
    x0, y0 = hl.i32(hl.floor(ix)), hl.i32(hl.floor(iy))
    if hi is not None:
        x0, y0 = hl.min(x0, hi[0]), hl.min(y0, hi[1])
    wx, wy = ix - hl.cast(t, x0), iy - hl.cast(t, y0)
    return ((src[(x0, y0) + rest] * (1.0 - wx) + src[(x0 + 1, y0) + rest] * wx) * (1.0 - wy)
            + (src[(x0, y0 + 1) + rest] * (1.0 - wx) + src[(x0 + 1, y0 + 1) + rest] * wx) * wy)


def adjoint_pipeline(hl, app, d_output, wrt, schedule=True, **options):
    """``(Pipeline, [Funcs], [numpy arrays])`` computing ``app.output`` and the adjoints of the
    input Buffers named in ``wrt`` (``app.buffers`` keys) for the output cotangent
    ``d_output`` (numpy, the output's shape), auto-scheduled with ``hl.auto_schedule(**options)``
    unless ``schedule`` is False. ``Pipeline.realize(arrays)``-style use: realize into
    ``[hl.Buffer(a) for a in arrays]``; the arrays come back in the order output, *wrt."""
    out = app.output
    d = hl.propagate_adjoints(out, d_output)
    funcs = [out] + [d[app.buffers[k]] for k in wrt]
    arrays = [np.empty(np.shape(d_output), np.asarray(d_output).dtype)]
    arrays += [np.empty_like(app.buffers[k].numpy()) for k in wrt]
    if schedule:
        hl.auto_schedule(funcs, {f: list(reversed(a.shape)) for f, a in zip(funcs, arrays)},
                         **options)
    return hl.Pipeline(funcs), funcs, arrays
