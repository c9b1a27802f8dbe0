"""The PCG loop's compiled dot product against numpy (every remainder length, both dtypes)."""

import numpy as np
import pytest
from lsq_opt._solver import _dot
from lsq_opt._solver._dot import _FAILED, BLAS_CALLER_THREAD_MAX, compiled_dot, dot


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("n", [64, 65, 95, 127, 1000, 100_003])
def test_dot_matches_numpy(dtype, rtol, n):
    rng = np.random.default_rng(n)
    a, b = rng.normal(size=n).astype(dtype), rng.normal(size=n).astype(dtype)
    got = compiled_dot(a, b)
    assert dtype not in _FAILED  # the compiled kernel ran, not the np.dot fallback
    assert got.dtype == dtype
    want = np.dot(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.sqrt(n))


def test_dot_leaves_small_vectors_to_numpy_and_compiles_large_ones(monkeypatch):
    """Up to BLAS_CALLER_THREAD_MAX float64 elements OpenBLAS stays on the calling thread and
    beats the kernel's call overhead; above, and for float32, the compiled kernel runs."""
    calls = []
    monkeypatch.setattr(_dot, "compiled_dot", lambda a, b: calls.append(a.size) or np.dot(a, b))
    for n in (100, BLAS_CALLER_THREAD_MAX, BLAS_CALLER_THREAD_MAX + 1):
        a = np.arange(n, dtype=np.float64)
        assert dot(a, a) == np.dot(a, a)
    assert calls == [BLAS_CALLER_THREAD_MAX + 1]
    small32 = np.arange(100, dtype=np.float32)  # float32 keeps the kernel's summation order
    dot(small32, small32)
    assert calls == [BLAS_CALLER_THREAD_MAX + 1, 100]


def test_solver_norms_and_dots_take_the_single_threaded_dot(monkeypatch):
    """The solvers' norms go through ``dot`` too (np.linalg.norm is a threaded BLAS dot above
    10^4 entries), with np.linalg.norm's value."""
    from lsq_opt._solver import vectors

    calls = []
    monkeypatch.setattr(vectors, "host_dot", lambda a, b: calls.append(a.size) or dot(a, b))
    ops = vectors.VectorOps(np)
    for dtype, rtol in ((np.float64, 1e-14), (np.float32, 1e-6)):
        v = np.random.default_rng(0).normal(size=BLAS_CALLER_THREAD_MAX + 7).astype(dtype)
        np.testing.assert_allclose(ops.norm(v), np.linalg.norm(v.astype(np.float64)), rtol=rtol)
    assert calls == [BLAS_CALLER_THREAD_MAX + 7] * 2
