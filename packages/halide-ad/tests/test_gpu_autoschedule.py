"""``auto_schedule(target="gpu")`` (spec §4.3's GPU branches, AE-10 and AE-11's GPU rows) and
the GPU atomics it relies on, against the same algorithm on the CPU, unscheduled, and against
PyTorch. Each test runs twice (``gpu_backend``): through core_ad's host emulation of CUDA (the
generated CUDA compiled with g++, every thread of every launch run in turn; float64, so the
results match to rounding) and on a CUDA device (the gpu tier; atomics then add in any order,
which changes float sums by a few ulps). Timings at the paper's sizes:
``benchmarks/bench_gpu.py``."""
from __future__ import annotations

import numpy as np
import pytest

import halide_ad as hl
from halide_ad.apps import _common, bilateral_slice, conv_layer

torch = pytest.importorskip("torch")

x = hl.Var("x")


def _conv_gradients(gather, target, shape=(1, 2, 20, 18), co=2):
    """(d_input, d_weights, pipeline source) of the conv layer for a fixed cotangent; ``target``
    "gpu" (auto-scheduled) or None (unscheduled CPU)."""
    rng = np.random.default_rng(3)
    inp = rng.standard_normal(shape)
    w = rng.standard_normal((co, shape[1], 3, 3))
    app = conv_layer.build(hl, inp, w)
    dout = rng.standard_normal((shape[0], co, shape[2] - 2, shape[3] - 2))
    d = hl.propagate_adjoints(app.output, dout, scatter_to_gather=gather)
    funcs = [d[app.buffers["input"]], d[app.buffers["weights"]]]
    arrays = [np.empty_like(inp), np.empty_like(w)]
    if target is not None:
        hl.auto_schedule(funcs, {f: list(reversed(a.shape)) for f, a in zip(funcs, arrays)},
                         target=target)
    p = hl.Pipeline(funcs)
    p.realize([hl.Buffer(a) for a in arrays])
    ti = torch.tensor(inp, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(ti, tw).backward(torch.tensor(dout))
    return arrays, [ti.grad.numpy(), tw.grad.numpy()], p.ir()


@pytest.mark.parametrize("gather", [True, False], ids=["scatter_to_gather", "general_scatter"])
def test_gpu_conv_layer_gradients(gpu_backend, gather):
    """AE-10 at a small size: the input and weight gradients of a 3 x 3 conv layer on the GPU,
    as gathers and as general scatters with atomics, equal PyTorch's and the CPU's."""
    got, want, src = _conv_gradients(gather, "gpu")
    cpu, _, _ = _conv_gradients(gather, None)
    for g, c, t in zip(got, cpu, want):
        np.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(g, c, rtol=1e-11, atol=1e-11)
    atomics = src.count("atomicAdd((double*)&")
    assert atomics == (0 if gather else 2)  # the scatters of d_input and d_weights


def test_gpu_schedule_of_the_conv_layer_backward():
    """AE-11 (ii) on the GPU: the gathered input gradient in 16 x 16 x 4 tiles; the weight
    gradient (few points, long reductions) rfactored; the general scatter tiled over its
    two large RVars with atomics."""
    rng = np.random.default_rng(0)
    inp = rng.standard_normal((4, 8, 64, 64)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    dout = np.zeros((4, 8, 62, 62), np.float32)
    decisions = {}
    for gather in (True, False):
        app = conv_layer.build(hl, inp, w)
        d = hl.propagate_adjoints(app.output, dout, scatter_to_gather=gather)
        funcs = [d[app.buffers["input"]], d[app.buffers["weights"]]]
        decisions[gather] = hl.auto_schedule(funcs, {funcs[0]: [64, 64, 8, 4],
                                                     funcs[1]: [3, 3, 8, 8]}, target="gpu")
    s = decisions[True].stages
    assert s["input_d.update(0)"] == ["gpu_tile(_d0, _d1, _d3; 16 x 16 x 4)"]
    assert s["weights_d.update(0)"][0].startswith("rfactor(")
    assert any(k.startswith("weights_d_intm") for k in s)
    s = decisions[False].stages
    assert s["input_d.update(0)"][-1].endswith("16 x 16) with atomics")


def test_gpu_scalar_loss_is_rfactored(gpu_backend):
    """AE-11 (iii) on the GPU: a scalar sum over a large 2-D domain becomes partial sums in
    GPU tiles, the final sum a few atomic additions; the value is the numpy sum."""
    img = np.random.default_rng(4).random((40, 36))
    inp = hl.Buffer(img)
    r = hl.RDom([(0, 36), (0, 40)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += inp[r.x, r.y] * inp[r.x, r.y]
    s = hl.auto_schedule(loss, {loss: []}, target="gpu")
    assert s.stages["loss"] == ["gpu_single_thread()"]
    assert s.stages["loss.update(0)"][0].startswith("rfactor(r")
    assert len(s.rfactored) == 1
    np.testing.assert_allclose(np.asarray(loss.realize([])), (img ** 2).sum(), rtol=1e-12)


def test_gpu_histogram_uses_atomics(gpu_backend):
    """A scatter with few pure points (7 bins) and a large RDom runs its RVars on the GPU with
    atomic stores, and counts every pixel once."""
    img = np.random.default_rng(5).random((40, 36)).astype(np.float32)
    inp = hl.Buffer(img)
    r = hl.RDom([(0, 36), (0, 40)])
    count = hl.Func("count")
    count[x] = 0
    count[hl.clamp(hl.i32(inp[r.x, r.y] * 7), 0, 6)] += 1
    s = hl.auto_schedule(count, {count: [7]}, target="gpu")
    assert s.stages["count.update(0)"] == [f"gpu_tile({r.x.name()}, {r.y.name()}; 16 x 16) with"
                                           " atomics"]
    got = np.asarray(count.realize([7]))
    np.testing.assert_array_equal(got, np.bincount(np.clip((img * 7).astype(int), 0, 6).ravel(),
                                                   minlength=7))


def test_gpu_bilateral_slice_forward_and_gradients(gpu_backend):
    """The Table 1 bilateral slice's output and the adjoints of its grid (a scatter in z),
    guide and image, auto-scheduled for the GPU, equal the CPU's."""
    rng = np.random.default_rng(6)
    grid = rng.standard_normal((1, 2 * 3, 4, 3, 4))
    guide = rng.uniform(-0.05, 1.05, (1, 24, 32))
    image = rng.standard_normal((1, 2, 24, 32))
    d_out = rng.standard_normal((1, 2, 24, 32))
    results = []
    for target in ("gpu", None):
        app = bilateral_slice.build(hl, grid, guide, image)
        p, _, arrays = _common.adjoint_pipeline(hl, app, d_out, ("grid", "guide", "image"),
                                                schedule=target is not None, target=target)
        p.realize([hl.Buffer(a) for a in arrays])
        results.append(arrays)
    for g, c in zip(*results):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


def test_gpu_auto_schedule_bad_requests():
    f = hl.Func("f")
    f[x] = hl.f32(x)
    with pytest.raises(hl.ScheduleError, match="target must be 'cpu' or 'gpu', got 'tpu'"):
        hl.auto_schedule(f, {f: [64]}, target="tpu")
    with pytest.raises(hl.ScheduleError, match="a CUDA block holds at most 1024"):
        hl.auto_schedule(f, {f: [64]}, target="gpu", tile=(32, 16))


def _gpu_blur(inp_buf):
    blur = hl.Func("blur")
    c = hl.BoundaryConditions.repeat_edge(inp_buf)
    y = hl.Var("y")
    scale = hl.Param(hl.Float(64), "scale", 0.25)  # a Param on the device too
    blur[x, y] = (c[x - 1, y] + 2 * c[x, y] + c[x + 1, y]) * scale
    hl.auto_schedule(blur, {blur: [inp_buf.width(), inp_buf.height()]}, target="gpu")
    blur.scale = scale  # a Param lives as long as its owner keeps it
    return blur


def test_gpu_device_buffers_are_used_in_place(gpu_backend):
    """Device arrays (CuPy) as the input and output Buffers: the pipeline reads and writes
    them where they are; the result equals the CPU's on numpy arrays."""
    cp = gpu_backend
    img = np.random.default_rng(8).random((20, 37))
    want = np.asarray(_gpu_blur(hl.Buffer(img)).realize([37, 20]))
    np.testing.assert_allclose(want[:, 1:-1], (img[:, :-2] + 2 * img[:, 1:-1] + img[:, 2:]) / 4)
    inp = hl.Buffer(cp.asarray(img))
    out = hl.Buffer(cp.zeros((20, 37)))
    assert inp.on_device and out.on_device
    got = _gpu_blur(inp).realize([out])
    assert got.on_device and got.array() is out.array()
    np.testing.assert_allclose(cp.asnumpy(out.array()), want, rtol=1e-12, atol=1e-12)


def test_device_buffers_are_refused_by_cpu_pipelines_and_numpy(host_gpu):
    cp = host_gpu
    inp = hl.Buffer(cp.asarray(np.ones((4, 5))), name="frame")
    f = hl.Func("f")
    f[x] = inp[x, 0] * 2
    with pytest.raises(hl.FuncError, match="frame live.* on the GPU.*scheduled for the CPU"):
        f.realize([5])
    with pytest.raises(hl.FuncError, match="Buffer frame lives on the GPU"):
        inp.numpy()
