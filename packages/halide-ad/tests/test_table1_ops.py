"""The Table 1 operators of ``halide_ad.apps`` (spatial_transformer, flow_warp,
bilateral_slice; acceptance experiment AE-12) at reduced sizes, auto-scheduled:

* float32 forward against the PyTorch references (``affine_grid`` + ``grid_sample``; a
  per-pixel gather warp; the paper's gather-based bilateral slice) to 1e-5, and the
  gradients of every input for a random cotangent against torch autograd to 1e-4, both
  normwise relative (``max |a - b| / max |b|``): the computations are the same float32
  expressions up to association, a few ulp per term;
* float64 central differences (spec section 8 protocol) on 1 x 2 x 16 x 16 images: the loss
  ``L = sum(output * g)``; 20 random coordinates of each gradient with
  ``h = 1e-6 max(1, |theta|)``, passing if ``|ad - fd| <= 1e-5 max(|fd|, 1e-3 m)`` (``m`` the
  largest sampled ``|fd|``), and 3 random unit directions with relative error <= 1e-6. Inputs
  stay away from kinks (no sample on a clamp edge; random positions hit a floor boundary within
  h with probability ~1e-6 per pixel, and the seeds are fixed). The operators are bilinear or
  trilinear in their inputs away from kinks, so the truncation error is ~0 and the
  rounding error ~ eps |L| / h ~ 1e-9.

One pipeline is compiled per operator and dtype; finite differences perturb the numpy arrays
that the Buffers wrap and realize again.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import halide_ad as hl
from halide_ad.apps import _common, bilateral_slice, flow_warp, spatial_transformer

torch = pytest.importorskip("torch")

OPS = {
    "spatial_transformer": (spatial_transformer, ("image", "theta"),
                            spatial_transformer.torch_reference),
    "flow_warp": (flow_warp, ("image", "warp"), flow_warp.torch_reference),
    "bilateral_slice": (bilateral_slice, ("grid", "guide", "image"),
                        bilateral_slice.torch_reference),
}


def _inputs(op, dtype, small):
    """Random inputs; ``small``: the 1 x 2 x 16 x 16 finite-difference size, away from kinks."""
    rng = np.random.default_rng(7)
    n, c, h, w = (1, 2, 16, 16) if small else (2, 3, 20, 24)
    if op == "spatial_transformer":
        theta = np.array([[0.9, 0.3, 0.1], [-0.25, 1.1, -0.05]]) + 0.05 * rng.standard_normal(
            (n, 2, 3))                       # rotated and shifted: some samples fall outside
        arrays = (rng.standard_normal((n, c, h, w)), theta)
    elif op == "flow_warp":
        lim = 0.9 if small else 1.1          # beyond 1: the border clamp is exercised
        arrays = (rng.standard_normal((n, c, h, w)), rng.uniform(-lim, lim, (n, 2, h, w)))
    else:
        ci, co, gd, cell = (2, 1, 4, 4) if small else (3, 2, 5, 8)
        if not small:
            h, w = 24, 32
        lo, hi = (0.05, 0.95) if small else (-0.05, 1.05)   # the guide clamp outside [0, 1]
        arrays = (rng.standard_normal((n, co * (ci + 1), gd, h // cell, w // cell)),
                  rng.uniform(lo, hi, (n, h, w)), rng.standard_normal((n, ci, h, w)))
    return [np.ascontiguousarray(a, dtype=dtype) for a in arrays]


@functools.cache
def _compiled(op, dtype, small):
    """(app, Pipeline, Buffers, result arrays, cotangent) for ``op``, auto-scheduled."""
    mod, wrt, _ = OPS[op]
    app = mod.build(hl, *_inputs(op, dtype, small))
    g = np.random.default_rng(3).standard_normal(list(reversed(app.sizes["output"])))
    g = g.astype(dtype)
    p, _, arrays = _common.adjoint_pipeline(hl, app, g, wrt)
    bufs = [hl.Buffer(a) for a in arrays]
    p.realize(bufs)
    return app, p, bufs, arrays, g


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("op", list(OPS))
def test_forward_and_gradients_match_torch(op):
    _, wrt, ref = OPS[op]
    app, _, _, arrays, g = _compiled(op, np.float32, False)
    leaves = [torch.tensor(app.buffers[k].numpy(), requires_grad=True) for k in wrt]
    out = ref(torch, *leaves)          # wrt lists the inputs in the references' order
    out.backward(torch.from_numpy(g))
    assert arrays[0].dtype == np.float32 and arrays[0].shape == tuple(out.shape)
    assert _rel(arrays[0], out.detach().double().numpy()) <= 1e-5
    for k, leaf, got in zip(wrt, leaves, arrays[1:]):
        assert got.shape == tuple(leaf.shape), k
        assert _rel(got, leaf.grad.double().numpy()) <= 1e-4, k


@pytest.mark.parametrize("op", list(OPS))
def test_gradients_match_float64_central_differences(op):
    _, wrt, _ = OPS[op]
    app, p, bufs, arrays, g = _compiled(op, np.float64, True)
    grads = [a.copy() for a in arrays[1:]]

    def loss():
        p.realize(bufs)
        return float(np.sum(arrays[0] * g))

    rng = np.random.default_rng(11)
    for k, grad in zip(wrt, grads):
        a = app.buffers[k].numpy()   # the array the Buffer wraps: perturbed in place
        orig = a.copy()
        pick = rng.choice(a.size, min(20, a.size), replace=False)
        ad, fd = [], []
        for flat in pick:
            idx = np.unravel_index(int(flat), a.shape)
            h = 1e-6 * max(1.0, abs(orig[idx]))
            a[idx] = orig[idx] + h
            lp = loss()
            a[idx] = orig[idx] - h
            lm = loss()
            a[idx] = orig[idx]
            ad.append(grad[idx])
            fd.append((lp - lm) / (2 * h))
        ad, fd = np.array(ad), np.array(fd)
        m = np.max(np.abs(fd))
        assert m > 0, k
        bad = np.abs(ad - fd) > 1e-5 * np.maximum(np.abs(fd), 1e-3 * m)
        assert not bad.any(), (k, ad[bad], fd[bad])
        for _ in range(3):
            v = rng.standard_normal(a.shape)
            v /= np.linalg.norm(v)
            h = 1e-6 * max(1.0, float(np.max(np.abs(orig))))
            a[...] = orig + h * v
            lp = loss()
            a[...] = orig - h * v
            lm = loss()
            a[...] = orig
            want, got = (lp - lm) / (2 * h), float(np.sum(grad * v))
            assert abs(got - want) <= 1e-6 * abs(want), (k, got, want)


@pytest.mark.parametrize("schedule", [False, True])
def test_image_gradient_at_exact_pixel_centres_matches_torch(schedule):
    """A transposing, shrinking theta puts samples exactly on pixel centres (ix = 2.0, or
    5.999999999999998 after rounding), where ``floor`` decides which two corners a sample
    reaches. The image adjoint is continuous there, so every schedule must agree with torch:
    unscheduled, the sampling grid is inlined into each corner's scatter, and each must
    round its coordinates alike (they once rounded differently: a sample reached a pixel
    twice, or not at all)."""
    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, 2, 16, 16))
    theta = np.array([[[0.1, 0.9, 0.05], [0.95, -0.1, 0.0]]])
    app = spatial_transformer.build(hl, image, theta)
    g = rng.standard_normal((1, 2, 16, 16))
    p, _, arrays = _common.adjoint_pipeline(hl, app, g, ("image",), schedule=schedule)
    p.realize([hl.Buffer(a) for a in arrays])
    leaf = torch.tensor(image, requires_grad=True)
    spatial_transformer.torch_reference(torch, leaf, torch.tensor(theta)).backward(
        torch.from_numpy(g))
    assert _rel(arrays[1], leaf.grad.numpy()) <= 1e-12


def test_bad_inputs_are_refused():
    img = np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(ValueError, match="theta must be"):
        spatial_transformer.build(hl, img, np.zeros((2, 2, 3), np.float32))
    with pytest.raises(ValueError, match="must all be float32 or all float64"):
        spatial_transformer.build(hl, img, np.zeros((1, 2, 3), np.float64))
    with pytest.raises(ValueError, match=r"warp must be \(1, 2, 8, 8\)"):
        flow_warp.build(hl, img, np.zeros((1, 2, 8, 7), np.float32))
    with pytest.raises(ValueError, match="image must be"):
        flow_warp.build(hl, img[0], np.zeros((1, 2, 8, 8), np.float32))
    guide = np.zeros((1, 8, 8), np.float32)
    with pytest.raises(ValueError, match="multiple of ci"):
        bilateral_slice.build(hl, np.zeros((1, 4, 2, 2, 2), np.float32), guide, img)
    with pytest.raises(ValueError, match="integer cell size"):
        bilateral_slice.build(hl, np.zeros((1, 3, 2, 3, 3), np.float32), guide, img)


def test_bilateral_slice_grid_adjoint_is_a_partial_gather():
    """Listing 1: the adjoint of the (boundary-wrapped) grid has one update per trilinear
    corner, pure in the cell's x and y, the channel and the image (each cell gathers the
    pixels of its preimage, race-free), scattering only in z (the guide's bin); auto_schedule
    loops over the channels innermost, as the scattered z does not depend on them, and runs
    the cells of a row inside their windows' rows."""
    app = bilateral_slice.build(hl, *_inputs("bilateral_slice", np.float32, False))
    d = hl.propagate_adjoints(app.output, np.ones(list(reversed(app.sizes["output"])),
                                                  np.float32))
    d_src = d[app.funcs["src"]]
    names = [v.name() for v in d_src.args()]
    updates = d_src.definitions()[1:]
    assert len(updates) == 8
    for u in updates:
        assert u.pure_var_names() == names[:2] + names[3:]
    d_grid = d[app.buffers["grid"]]
    s = hl.auto_schedule([d_grid], {d_grid: list(reversed(app.buffers["grid"].numpy().shape))})
    done = [s.stages[f"{s.key(d_src)}.update({k})"] for k in range(8)]
    assert all(any(d.startswith(f"reorder({names[3]} innermost") for d in ds) for ds in done), \
        done
    assert all(ds[0].startswith(f"{names[0]} between") for ds in done), done


def _passes(nest):
    """{Func: (top-level loop nests, the Funcs stored in them)} of a ``loop_nest()`` text."""
    out, name = {}, None
    for line in nest.splitlines():
        if line.startswith("produce "):
            name = line[len("produce "):-1]
            out[name] = [0, set()]
        elif line.startswith("  ") and line[2] != " " and line.split()[0] in (
                "for", "parallel", "vectorized", "unrolled"):
            out[name][0] += 1
        elif line.rstrip().endswith(") = ..."):
            out[name][1].add(line.strip().split("(")[0])
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("op", ["spatial_transformer", "flow_warp"])
def test_gather_adjoint_is_one_fused_pass(op):
    """The adjoint of a bilinear gather: the four corner scatters into d_input, and the
    coordinate-gradient updates (of one Func, or of one Func per coordinate), run as ONE
    loop pass over the output domain after the initialising passes, not one pass per call
    site; ``fuse=False`` keeps one pass per update."""
    mod, wrt, _ = OPS[op]
    app = mod.build(hl, *_inputs(op, np.float32, False))
    g = np.ones(list(reversed(app.sizes["output"])), np.float32)
    # Func: (its updates, the Funcs whose updates run in its fused pass)
    want = {"spatial_transformer": {"image_constant_exterior_1_d": (4, ()), "theta_d": (6, ()),
                                    "sample_x_1_d": (1, ("sample_y_1_d",))},
            "flow_warp": {"image_d": (4, ()), "warp_d": (2, ())}}[op]
    for fuse in (False, True):
        p, _, _ = _common.adjoint_pipeline(hl, app, g, wrt, fuse=fuse)
        passes = _passes(p.loop_nest())
        for name, (k, others) in want.items():
            loops, stored = passes[name]
            assert loops == (2 if fuse else 1 + k), (name, passes)
            assert stored == ({name, *others} if fuse else {name}), (name, passes)
        for other in (o for _, os in want.values() for o in os):
            assert passes[other][0] == (1 if fuse else 2), (other, passes)
