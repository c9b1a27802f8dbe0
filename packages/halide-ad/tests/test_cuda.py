"""The GPU path: CUDA source per GPU-scheduled definition. Without CuPy and a device the
kernels are still generated and (when nvcc is on PATH) compiled, so the source is checked on
every machine; running them needs a GPU (``-m gpu`` tests skip cleanly without one)."""

import re
import shutil
import subprocess

import halide_ad as hl
import numpy as np
import pytest
from core_ad import codegen

x, y, xi, yi = hl.Var("x"), hl.Var("y"), hl.Var("xi"), hl.Var("yi")


def assert_nvcc_compiles(source, tmp_path):
    f = tmp_path / "k.cu"
    f.write_text(source)
    r = subprocess.run(["nvcc", "-std=c++17", "-c", "-o", str(tmp_path / "k.o"), str(f)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]


def kernel_count(source):
    return len(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?halide_ad_k\d+\(',
                          source))


def _blur(img, gpu=True):
    inp = hl.Buffer(img)
    c = hl.BoundaryConditions.repeat_edge(inp)
    bx, b = hl.Func("bx"), hl.Func("b")
    bx[x, y] = (c[x - 1, y] + c[x, y] + c[x + 1, y]) / 3
    b[x, y] = (bx[x, y - 1] + bx[x, y] + bx[x, y + 1]) / 3
    r = hl.RDom([(0, 3)])
    b[x, y] += hl.f32(r.x) * bx[x, y]
    bx.compute_root()
    if gpu:
        bx.gpu_tile(x, y, xi, yi, 16, 16)
        b.gpu_tile(x, y, xi, yi, 16, 8)
        b.update(0).gpu_tile(x, y, xi, yi, 16, 8)
    return b


def test_gpu_schedule_generates_one_kernel_per_definition():
    p = hl.Pipeline(_blur(np.zeros((9, 11), np.float32)))
    src = p.ir()
    assert kernel_count(src) == 3
    assert src.count("__launch_bounds__(128)") == 2  # 16 x 8 threads
    assert "blockIdx.y" in src and "threadIdx.x" in src
    assert "gpu_block" in p.loop_nest()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_generated_cuda_compiles_with_nvcc(tmp_path):
    assert_nvcc_compiles(hl.Pipeline(_blur(np.zeros((9, 11), np.float32))).ir(), tmp_path)


def test_mixing_cpu_and_gpu_stages_is_refused():
    img = np.zeros((9, 11), np.float32)
    b = _blur(img)
    b.update(0).parallel(y)  # the update is back on the CPU... by its loop kinds
    b2 = hl.Func("b2")
    b2[x, y] = b[x, y]
    with pytest.raises(hl.ScheduleError, match="wholly on the GPU or on the CPU"):
        hl.Pipeline(b2).ir()


def test_host_gpu_blur_matches_cpu(host_gpu):
    img = np.random.default_rng(0).random((21, 18)).astype(np.float32)
    want = np.asarray(_blur(img, gpu=False).realize([18, 21]))
    got = np.asarray(_blur(img).realize([18, 21]))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert host_gpu.launches == 3


def _gpu_histogram_schedule(f, r):
    """On the GPU the RVars in 8 x 4 tiles: iterations that hit one bin run at once, so the
    stores are atomic."""
    f.gpu_tile(x, hl.Var("xo"), xi, 8)
    f.update(0).atomic().gpu_tile(r.x, r.y, "rxi", "ryi", 8, 4)


def test_host_gpu_scatter_over_rvars_is_atomic(host_gpu, histograms):
    img = np.random.default_rng(1).random((13, 19)).astype(np.float32)
    p = hl.Pipeline(list(histograms(img, 7, _gpu_histogram_schedule)))
    assert p.ir().count("atomicAdd((int*)&") == 1 and p.ir().count("atomicAdd((double*)&") == 1
    count, weight = map(np.asarray, p.realize([[7], [7]]))
    want_c, want_w = map(np.asarray, hl.Pipeline(list(histograms(img, 7))).realize(
        [[7], [7]]))
    np.testing.assert_array_equal(count, want_c)
    assert count.sum() == img.size
    np.testing.assert_allclose(weight, want_w, rtol=1e-12)


def test_gpu_loop_over_an_rvar_of_an_overwriting_update_is_refused(max_per_bin):
    top, r = max_per_bin(np.random.default_rng(1).random((13, 19)).astype(np.float32), 7)
    top.gpu_tile(x, hl.Var("xo"), xi, 8)
    top.update(0).atomic().gpu_tile(r.x, r.y, "rxi", "ryi", 8, 4)
    with pytest.raises(hl.ScheduleError, match=r"top.*may write one point of top.*top\(e\) ="):
        hl.Pipeline(top).ir()


def test_gpu_loops_over_rvars_need_atomic(histograms):
    img = np.random.default_rng(1).random((13, 19)).astype(np.float32)
    count, _ = histograms(img, 7)
    count.gpu_tile(x, hl.Var("xo"), xi, 8)
    count.update(0).gpu_tile(count.update(0)._definition().schedule.dims[0].name,
                             count.update(0)._definition().schedule.dims[1].name,
                             "rxi", "ryi", 8, 4)
    with pytest.raises(hl.ScheduleError, match=r"call atomic\(\) on the stage first"):
        hl.Pipeline(count).ir()


def test_host_gpu_single_thread_zero_dimensional_sum(host_gpu):
    img = np.random.default_rng(2).random((10, 12))
    inp = hl.Buffer(img)
    r = hl.RDom([(0, 12), (0, 10)])
    total = hl.Func("total")
    total[()] = hl.f64(0)
    total[()] += inp[r.x, r.y] ** 2
    total.gpu_single_thread()
    total.update(0).atomic().gpu_tile(r.x, r.y, "rxi", "ryi", 4, 4)
    src = hl.Pipeline(total).ir()
    assert "atomicAdd((double*)&" in src and kernel_count(src) == 2
    np.testing.assert_allclose(np.asarray(total.realize([])), (img ** 2).sum(), rtol=1e-12)


def test_gpu_single_thread_with_gpu_loops_is_refused():
    f = hl.Func("f")
    f[x] = hl.f32(x)
    f.gpu_tile(x, hl.Var("xo"), xi, 8)
    with pytest.raises(hl.ScheduleError, match="gpu_single_thread with GPU loops"):
        f.gpu_single_thread()


def test_without_a_device_realize_says_what_is_missing():
    if codegen.cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="needs CuPy and a CUDA device"):
        _blur(np.zeros((9, 11), np.float32)).realize([11, 9])


@pytest.mark.gpu
@pytest.mark.skipif(not codegen.cuda_available(), reason="no CUDA device (CuPy)")
def test_gpu_matches_cpu():
    img = np.random.default_rng(0).random((70, 45)).astype(np.float32)
    want = np.asarray(_blur(img, gpu=False).realize([45, 70]))
    got = np.asarray(_blur(img).realize([45, 70]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _bilateral_slice(gpu=True):
    """The Table 1 bilateral slice (``halide_ad.apps.bilateral_slice``) at 2 x 3 x 48 x 64 with
    a 2 x 8 x 5 x 3 x 4 grid; on the GPU its output's two definitions in 16 x 8 tiles, each
    thread looping over the channels and images (the sliced coefficients and the grid's
    boundary inlined). The grid's adjoint stays on the CPU: its repeat_edge part is a general
    scatter, which needs atomics the GPU path lacks (see ``_bilateral_slice_adjoints``)."""
    from halide_ad.apps import bilateral_slice

    rng = np.random.default_rng(5)
    grid = rng.standard_normal((2, 8, 5, 3, 4)).astype(np.float32)
    guide = rng.uniform(-0.05, 1.05, (2, 48, 64)).astype(np.float32)
    image = rng.standard_normal((2, 3, 48, 64)).astype(np.float32)
    app = bilateral_slice.build(hl, grid, guide, image)
    if gpu:
        v, out = app.vars, app.output
        for stage in (out, out.update(0)):  # channels and images serial in each thread
            stage.gpu_tile(v["x"], v["y"], xi, yi, 16, 8).reorder(v["z"], v["n"], xi, yi,
                                                                   v["x"], v["y"])
    return app


def test_bilateral_slice_gpu_schedule_generates_its_kernels():
    src = hl.Pipeline(_bilateral_slice().output).ir()
    assert kernel_count(src) == 2


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_bilateral_slice_cuda_compiles_with_nvcc(tmp_path):
    assert_nvcc_compiles(hl.Pipeline(_bilateral_slice().output).ir(), tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not codegen.cuda_available(), reason="no CUDA device (CuPy)")
def test_bilateral_slice_gpu_matches_cpu():
    want = _bilateral_slice(gpu=False).realize()
    got = _bilateral_slice().realize()
    # float32 sums of ~30 products of size ~1 that may cancel: nvcc contracts them into FMAs,
    # the CPU kernel does not, so errors are relative to the terms' scale (seen on an H100:
    # 1.4e-6 on an output of 2e-3), not to each output
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _bilateral_slice_adjoints(gpu=True):
    """The adjoints of the bilateral slice's guide and image (both gathers: pure over the
    pixels) for a random cotangent, and the sliced coefficients' adjoint they read, each
    definition in 16 x 8 GPU tiles of the pixels."""
    app = _bilateral_slice(gpu=False)
    g = np.random.default_rng(6).standard_normal((2, 2, 48, 64)).astype(np.float32)
    d = hl.propagate_adjoints(app.output, g)
    outs = [d[app.buffers["guide"]], d[app.buffers["image"]]]
    if gpu:
        for f in [d[app.funcs["coeff"]], *outs]:
            f.compute_root()
            rest = f.args()[2:]
            for stage in [f] + [f.update(i) for i in range(f.num_update_definitions())]:
                stage.gpu_tile("_d0", "_d1", xi, yi, 16, 8).reorder(*rest, xi, yi, "_d0", "_d1")
    return hl.Pipeline(outs), outs


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_bilateral_slice_adjoint_cuda_compiles_with_nvcc(tmp_path):
    p, _ = _bilateral_slice_adjoints()
    src = p.ir()
    assert kernel_count(src) >= 3
    assert_nvcc_compiles(src, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not codegen.cuda_available(), reason="no CUDA device (CuPy)")
def test_bilateral_slice_adjoint_gpu_matches_cpu():
    def realize(gpu):
        arrays = [np.empty((2, 48, 64), np.float32), np.empty((2, 3, 48, 64), np.float32)]
        _bilateral_slice_adjoints(gpu)[0].realize([hl.Buffer(a) for a in arrays])
        return arrays

    for a, b in zip(realize(True), realize(False)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
