"""The GPU path: CUDA source per GPU-scheduled definition. Without CuPy and a device the
kernels are still generated and (when nvcc is on PATH) compiled, so the source is checked on
every machine; running them needs a GPU (``-m gpu`` tests skip cleanly without one)."""

import shutil
import subprocess

import halide_ad as hl
import numpy as np
import pytest
from core_ad import codegen

x, y, xi, yi = hl.Var("x"), hl.Var("y"), hl.Var("xi"), hl.Var("yi")


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
    assert src.count('extern "C" __global__ void halide_ad_k') == 3
    assert "blockIdx.y" in src and "threadIdx.x" in src
    assert "gpu_block" in p.loop_nest()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_generated_cuda_compiles_with_nvcc(tmp_path):
    src = hl.Pipeline(_blur(np.zeros((9, 11), np.float32))).ir()
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run(["nvcc", "-std=c++17", "-c", "-o", str(tmp_path / "k.o"), str(f)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]


def test_mixing_cpu_and_gpu_stages_is_refused():
    img = np.zeros((9, 11), np.float32)
    b = _blur(img)
    b.update(0).parallel(y)  # the update is back on the CPU... by its loop kinds
    b2 = hl.Func("b2")
    b2[x, y] = b[x, y]
    with pytest.raises(hl.ScheduleError, match="wholly on the GPU or on the CPU"):
        hl.Pipeline(b2).ir()


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
