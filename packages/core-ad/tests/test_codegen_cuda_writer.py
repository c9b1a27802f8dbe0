"""codegen.CudaWriter, the CUDA side of the kernel-building layer: the source it writes, run
through the host emulation (g++) and compiled by nvcc where it is installed."""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from core_ad import codegen
from core_ad._codegen.cuda.host_emulation import HostKernels

PARAMS = [("const long long n", "lanes"), ("const double* __restrict__ x", "values"),
          ("const long long* __restrict__ bin", "bin of each lane"),
          ("const long long nbins", "bins"), ("double* __restrict__ hist", "histogram"),
          ("double* __restrict__ sq", "x squared, per lane"),
          ("unsigned long long* __restrict__ err", "error slot {site, lane, index}")]


def histogram_source() -> str:
    w = codegen.CudaWriter()
    with w.kernel("hist", PARAMS):
        with w.grid_stride_loop("i", "n"):
            w.line("sq[i] = x[i] * x[i];")
            with w.if_("x[i] != 0.0"):
                w.checked("bin[i]", "nbins", 1, "i", w.atomic_add("hist[ix]", "x[i]"))
    return w.source()


def test_writes_kernel_loop_checked_atomic_source():
    src = histogram_source()
    assert src.startswith(codegen.CUDA_PREAMBLE)
    assert 'extern "C" __global__ void hist(' in src
    assert "    const long long n,  // lanes" in src
    assert "i += (long long)blockDim.x * gridDim.x" in src
    assert "if (ix < 0 || ix >= nbins) core_ad_fail(err, 1ULL, i, ix);" in src
    assert "else core_ad_atomic_add(&hist[ix], x[i]);" in src
    assert src.count("{") == src.count("}")


def test_unclosed_blocks_are_refused():
    w = codegen.CudaWriter(preamble=False)
    with pytest.raises(RuntimeError, match="1 block"):
        with w.block("if (1)"):
            w.source()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    src = histogram_source()
    kernels = HostKernels([("hist", src)], tmp_path_factory.mktemp("writer"))
    return kernels, kernels.function("hist", src)


def _launch(host, x, bins, nbins, grid=2, block=3):
    kernels, fn = host
    hist, sq = np.zeros(nbins), np.zeros_like(x)
    err = np.zeros(3, np.uint64)
    ptr = ctypes.c_void_p
    kernels.launch(fn, grid, block, [ctypes.c_longlong(x.size), ptr(x.ctypes.data),
                                     ptr(bins.ctypes.data), ctypes.c_longlong(nbins),
                                     ptr(hist.ctypes.data), ptr(sq.ctypes.data),
                                     ptr(err.ctypes.data)])
    return hist, sq, err


def test_grid_stride_loop_and_atomics_cover_every_lane(host):
    rng = np.random.default_rng(0)
    x = rng.normal(size=23)  # more lanes than the 6 threads launched
    bins = rng.integers(0, 4, 23)
    hist, sq, err = _launch(host, x, bins, 4)
    np.testing.assert_array_equal(sq, x * x)
    np.testing.assert_allclose(hist, np.bincount(bins, weights=x, minlength=4), rtol=1e-14)
    assert err.tolist() == [0, 0, 0]


def test_out_of_range_index_is_recorded_not_written(host):
    x = np.ones(8)
    bins = np.array([0, 1, 2, 7, 1, 0, -1, 2])
    hist, _, err = _launch(host, x, bins, 3)
    # site 1 and one failing (lane, index): whichever thread got there first
    site, lane, index = err.astype(np.int64).tolist()
    assert site == 1 and (lane, index) in {(3, 7), (6, -1)}
    np.testing.assert_array_equal(hist, [2.0, 2.0, 2.0])  # lanes 3 and 6 wrote nothing


def test_nvcc_compiles_the_written_kernel(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    (tmp_path / "k.cu").write_text(histogram_source())
    r = subprocess.run([nvcc, "--ptx", "-arch=sm_80", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.ptx")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "atom.global.add.f64" in (tmp_path / "k.ptx").read_text()


def scale_source(ctype: str) -> str:
    w = codegen.CudaWriter()
    with w.kernel("scale", [("const long long n", ""), (f"const {ctype} a", "by value"),
                            (f"{ctype}* __restrict__ y", "")]):
        with w.grid_stride_loop("i", "n"):
            w.line("y[i] *= a;")
    return w.source()


def test_stand_in_cupy_compiles_run_time_kernels_and_passes_float_scalars(tmp_path):
    """A kernel generated after the unit was built (compile_missing), launched through the
    stand-in RawKernel with numpy float scalars by value, as CuPy passes them."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    from core_ad._codegen.cuda.host_emulation import stand_in_cupy

    strict = tmp_path / "strict"
    strict.mkdir()
    with pytest.raises(KeyError, match="not in the host library"):
        HostKernels([], strict).function("scale", scale_source("double"))
    cp, _ = stand_in_cupy(HostKernels([], tmp_path, compile_missing=True))
    for dtype, ctype in ((np.float64, "double"), (np.float32, "float")):
        y = cp.asarray(np.arange(5, dtype=dtype))
        cp.RawKernel(scale_source(ctype), "scale")((1,), (256,), (np.int64(5), dtype(2.5), y))
        np.testing.assert_array_equal(cp.asnumpy(y), np.arange(5, dtype=dtype) * dtype(2.5))
    with pytest.raises(TypeError, match="numpy.int64 / float32 / float64"):
        cp.RawKernel(scale_source("double"), "scale")((1,), (256,), (np.int64(5), 2.5, y))
    a = cp.zeros(3, np.float64)
    cp.add.at(a, cp.asarray(np.array([0, 2, 0])), cp.asarray(np.array([1.0, 2.0, 3.0])))
    np.testing.assert_array_equal(cp.asnumpy(a), [4.0, 0.0, 2.0])  # repeated indices add
