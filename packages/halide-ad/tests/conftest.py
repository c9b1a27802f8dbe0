"""Fixtures shared by halide_ad's tests."""

import shutil
import sys

import halide_ad as hl
import pytest
from core_ad import codegen


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("host emulation of CUDA needs g++")
    from core_ad._codegen.cuda.host_emulation import HostKernels

    return HostKernels([], tmp_path_factory.mktemp("halide_host"), compile_missing=True)


@pytest.fixture
def host_gpu(host_kernels, monkeypatch):
    """GPU pipelines run by core_ad's host emulation of CUDA (g++ on the CPU: every thread of
    every launch in turn, atomics as plain additions), so the GPU path's code and host side
    are checked on machines without a device."""
    from core_ad._codegen.cuda import launcher
    from core_ad._codegen.cuda.host_emulation import stand_in_cupy

    cp, cpx = stand_in_cupy(host_kernels, block=None)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cpx)
    monkeypatch.setattr(launcher, "_KERNELS", {})
    monkeypatch.setattr(codegen, "cuda_available", lambda: True)
    return cp


@pytest.fixture(params=["host", pytest.param("device", marks=pytest.mark.gpu)])
def gpu_backend(request):
    """Each GPU test twice: through the host emulation (every machine with g++) and on a CUDA
    device (the gpu tier; skipped without CuPy and a device)."""
    if request.param == "host":
        return request.getfixturevalue("host_gpu")
    if not codegen.cuda_available():
        pytest.skip("no CUDA device (CuPy)")
    import cupy

    return cupy


def _build_histograms(img, bins, schedule=None):
    """A histogram of ``img`` (values in [0, 1)) and a weighted one (float64), the image's
    pixels as the RDom (``r``); ``schedule(f, r)`` schedules each of the two Funcs."""
    x = hl.Var("x")
    inp = hl.Buffer(img)
    r = hl.RDom([(0, img.shape[1]), (0, img.shape[0])])
    b = hl.clamp(hl.i32(inp[r.x, r.y] * bins), 0, bins - 1)
    count, weight = hl.Func("count"), hl.Func("weight")
    count[x] = 0
    count[b] += 1
    weight[x] = hl.f64(0)
    weight[b] = weight[b] + hl.f64(inp[r.x, r.y]) * 2 - 1
    if schedule is not None:
        for f in (count, weight):
            schedule(f, r)
    return count, weight


@pytest.fixture
def histograms():
    """``histograms(img, bins, schedule=None) -> (count, weight)``: two scatters whose
    iterations hit shared bins (the atomics tests' pipeline)."""
    return _build_histograms


def _build_max_per_bin(img, bins):
    """``(top, r)``: the largest value of ``img`` per bin, a max scatter (not an addition:
    atomics must refuse it)."""
    x = hl.Var("x")
    inp = hl.Buffer(img)
    r = hl.RDom([(0, img.shape[1]), (0, img.shape[0])])
    top = hl.Func("top")
    top[x] = hl.f32(0)
    b = hl.clamp(hl.i32(inp[r.x, r.y] * bins), 0, bins - 1)
    top[b] = hl.max(top[b], inp[r.x, r.y])
    return top, r


@pytest.fixture
def max_per_bin():
    return _build_max_per_bin
