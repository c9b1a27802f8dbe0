"""The compiled per-lane symmetric eigen-solver (cyclic Jacobi) and its derivative rules."""

import shutil
import subprocess

import core_ad as ad
import core_ad.numpy as anp
import numpy as np
import pytest
from core_ad._codegen import eigh as kernels


def _sym_batch(rng, B, n, dtype=np.float64):
    H = rng.standard_normal((B, n, n))
    return (H + np.swapaxes(H, 1, 2)).astype(dtype)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_matches_numpy_eigh(n, dtype, tol):
    # tol: a few hundred ulps of ||H|| (Jacobi is accurate to the working precision)
    rng = np.random.default_rng(n)
    H = _sym_batch(rng, 37, n, dtype)  # 37 lanes: not a multiple of the vector width
    lam, E = ad.eigh(H)
    _check_decomposition(H, lam, E, tol)


def _check_decomposition(H, lam, E, tol):
    """``lam`` ascending eigenvalues of sym(H) within ``tol * ||H||``, ``E`` orthonormal
    eigenvector columns reconstructing sym(H)."""
    n = H.shape[1]
    assert lam.dtype == H.dtype and E.dtype == H.dtype
    Hs = H.astype(np.float64)
    Hs = 0.5 * (Hs + np.swapaxes(Hs, 1, 2))
    ref = np.linalg.eigh(Hs)[0]
    scale = max(np.abs(ref).max(), 1.0)
    np.testing.assert_allclose(lam, ref, atol=tol * scale, rtol=0)
    rec = np.einsum("bij,bj,bkj->bik", E.astype(np.float64), lam.astype(np.float64),
                    E.astype(np.float64))
    np.testing.assert_allclose(rec, Hs, atol=10 * tol * scale, rtol=0)
    EtE = np.einsum("bji,bjk->bik", E.astype(np.float64), E.astype(np.float64))
    np.testing.assert_allclose(EtE, np.broadcast_to(np.eye(n), EtE.shape), atol=10 * tol)
    assert (np.diff(lam, axis=1) >= 0).all()


def test_symmetric_part_degenerate_and_padded_lanes():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((5, 4, 4))  # not symmetric: the symmetric part is decomposed
    lam, _ = ad.eigh(A)
    np.testing.assert_allclose(lam, np.linalg.eigh(0.5 * (A + np.swapaxes(A, 1, 2)))[0],
                               atol=1e-12)
    D = np.broadcast_to(np.diag([3.0, 1.0, 3.0, -2.0]), (3, 4, 4)).copy()
    lam, E = ad.eigh(D)  # already diagonal, repeated eigenvalue: sorted, no rotation
    np.testing.assert_array_equal(lam, np.broadcast_to([-2.0, 1.0, 3.0, 3.0], (3, 4)))
    np.testing.assert_allclose(np.abs(np.einsum("bji,bjk->bik", E, E)), np.eye(4)[None] + 0 * E)
    lam, E = ad.eigh(np.zeros((0, 3, 3)))
    assert lam.shape == (0, 3) and E.shape == (0, 3, 3)


def test_thread_count_does_not_change_results():
    H = _sym_batch(np.random.default_rng(2), 4096, 6)
    a = kernels.eigh_cpu(H, threads=1)
    b = kernels.eigh_cpu(H, threads=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_larger_n_falls_back_on_numpy():
    H = _sym_batch(np.random.default_rng(3), 3, 20)
    np.testing.assert_allclose(ad.eigh(H)[0], np.linalg.eigh(H)[0], atol=1e-12)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match=r"square matrices \(B, n, n\)"):
        ad.eigh(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="square"):
        ad.eigh(np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="float32 or float64"):
        ad.eigh(np.zeros((2, 3, 3), np.int64))


# ---- derivatives: central differences in float64 ------------------------------------------
# Eigenvalues here are well separated (random symmetric 4x4), so lam and E are smooth; the
# Jacobi kernel is deterministic, so E's column signs are a continuous function of H near the
# point and finite differences of E itself are meaningful. Tolerances: check_grads' defaults
# (rtol 1e-5, atol 1e-6 relative to the largest entry) for eps = 6e-6 steps.

def _eig_outputs(H):
    lam, E = ad.eigh(H)
    return lam, E


def test_eigenvalue_and_eigenvector_derivatives_forward_and_reverse():
    H = _sym_batch(np.random.default_rng(4), 2, 4)
    ad.check_grads(_eig_outputs, (H,), order=1, modes=("fwd", "rev"))


def test_second_order_through_eigh():
    # second order: Hessians of a scalar of the eigenvalues and eigenvectors
    rng = np.random.default_rng(5)
    H = _sym_batch(rng, 1, 3)
    w = rng.standard_normal((1, 3))
    P = rng.standard_normal((1, 3, 3))

    def f(H):
        lam, E = ad.eigh(H)
        return anp.sum(w * lam * lam) + anp.sum(P * E * E)

    ad.check_grads(f, (H,), order=2, modes=("fwd", "rev"))


def test_transpose_identity():
    rng = np.random.default_rng(6)
    H = _sym_batch(rng, 3, 5)
    v = rng.standard_normal(H.shape)
    wl, wE = rng.standard_normal((3, 5)), rng.standard_normal((3, 5, 5))
    _, (tl, tE) = ad.jvp(_eig_outputs, (H,), (v,))
    _, pull = ad.vjp(_eig_outputs, H)
    (ct,) = pull((wl, wE))
    lhs = np.sum(tl * wl) + np.sum(tE * wE)
    np.testing.assert_allclose(lhs, np.sum(v * ct), rtol=1e-10)


def test_eigh_in_batch_hessian_matches_traced_reference():
    # a lane-wise function through eigh: the largest eigenvalue of [[x0, x1], [x1, x2]]
    def f(x):
        H = anp.stack([anp.stack([x[:, 0], x[:, 1]], axis=-1),
                       anp.stack([x[:, 1], x[:, 2]], axis=-1)], axis=-2)
        return ad.eigh(H)[0][:, 1]

    x = np.random.default_rng(7).standard_normal((4, 3))
    g, Hs = ad.batch_hessian(f, x)
    a, b, c = x[:, 0], x[:, 1], x[:, 2]
    r = np.sqrt(((a - c) / 2) ** 2 + b * b)
    np.testing.assert_allclose(g[:, 0], 0.5 + (a - c) / (4 * r), rtol=1e-10)
    np.testing.assert_allclose(g[:, 1], b / r, rtol=1e-10)
    np.testing.assert_allclose(Hs, np.swapaxes(Hs, 1, 2), atol=1e-12)


# ---- CUDA: the source compiles; it runs where a device is present --------------------------

def test_cuda_variant_choice_and_bad_variant():
    assert kernels.cuda_variant(2) == "lane" and kernels.cuda_variant(16) == "group"
    assert kernels.cuda_variant(16, "lane") == "lane"
    with pytest.raises(ValueError, match="variant must be one of"):
        kernels.cuda_source(4, "float64", "warp")
    # the group kernel never lets a matrix's threads straddle two warps
    assert kernels.cuda_launch_shape(11, 1000, "group") == (-(-1000 // 8), 128)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("variant", kernels.CUDA_VARIANTS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_source_compiles_with_nvcc(tmp_path, dtype, variant):
    src, name = kernels.cuda_source(16, dtype, variant)
    path = tmp_path / "eigh.cu"
    path.write_text(src)
    r = subprocess.run(["nvcc", "-ptx", str(path), "-o", str(tmp_path / "eigh.ptx")],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert name in (tmp_path / "eigh.ptx").read_text()


def test_cuda_kernel_matches_cpu():
    from core_ad import codegen

    if not codegen.cuda_available():
        pytest.skip("no CUDA device")
    import cupy

    H = _sym_batch(np.random.default_rng(8), 300, 7)
    lam, _ = ad.eigh(cupy.asarray(H))
    np.testing.assert_allclose(cupy.asnumpy(lam), np.linalg.eigh(H)[0], atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", kernels.CUDA_VARIANTS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_cuda_variants_every_size(variant, dtype, tol):
    """Both CUDA layouts, every n, lane counts that leave the last block part-filled,
    non-symmetric input, a diagonal batch with a repeated eigenvalue and a zero matrix."""
    from core_ad import codegen

    if not codegen.cuda_available():
        pytest.skip("no CUDA device")
    import cupy

    rng = np.random.default_rng(9)
    for n in range(1, kernels.MAX_N + 1):
        H = rng.standard_normal((517, n, n)).astype(dtype)
        H[0] = np.diag(np.arange(n) % 3)
        H[1] = 0
        lam, E = kernels.eigh_cuda(cupy.asarray(H), variant)
        _check_decomposition(H, cupy.asnumpy(lam), cupy.asnumpy(E), tol)
