"""PCG (spec §4.4) and the LM inner-loop rules (spec §4.3: Q early exit, residual reset)."""
import numpy as np
import pytest
import scipy.sparse as sp

from lsq_opt._solver import inverse_diagonal, pcg


def _spd(n, seed, cond_scale=1.0):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, n))
    A = B @ B.T + n * np.eye(n)
    if cond_scale != 1.0:
        s = np.logspace(0, np.log10(cond_scale), n)
        rng.shuffle(s)
        A = (s[:, None] * A) * s[None, :]
    return A, rng.standard_normal(n)


@pytest.mark.parametrize("precond", ["jacobi", "none", "ceres"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pcg_matches_dense_solve_f64(precond, seed):
    A, b = _spd(30, seed)
    m_inv = inverse_diagonal(np.diag(A).copy(), precond)
    res = pcg(lambda p: A @ p, b, m_inv, max_iterations=500, tolerance=1e-14)
    ref = np.linalg.solve(A, b)
    # tolerance: f64 relative 1e-10 (spec §9)
    assert np.linalg.norm(res.x - ref) <= 1e-10 * np.linalg.norm(ref)
    assert res.reason == "tolerance"
    assert res.x.dtype == np.float64


def test_jacobi_reduces_iterations_on_badly_scaled_system():
    A, b = _spd(60, 3, cond_scale=1e4)
    ref = np.linalg.solve(A, b)
    plain = pcg(lambda p: A @ p, b, None, max_iterations=5000, tolerance=1e-10)
    jac = pcg(lambda p: A @ p, b, inverse_diagonal(np.diag(A).copy()), max_iterations=5000, tolerance=1e-10)
    assert jac.reason == "tolerance"
    assert np.linalg.norm(jac.x - ref) <= 1e-8 * np.linalg.norm(ref)
    # Jacobi undoes the diagonal scaling: expect a large drop (measured ~30 vs >>100)
    assert jac.iterations * 3 < plain.iterations, (jac.iterations, plain.iterations)


def test_pcg_float32():
    A, b = _spd(20, 4)
    A32, b32 = A.astype(np.float32), b.astype(np.float32)
    res = pcg(lambda p: A32 @ p, b32, inverse_diagonal(np.diag(A32).copy()), max_iterations=200, tolerance=1e-6)
    assert res.x.dtype == np.float32
    ref = np.linalg.solve(A, b)
    # f32 relative 1e-4 (spec §9)
    assert np.linalg.norm(res.x - ref) <= 1e-4 * np.linalg.norm(ref)


def test_inverse_diagonal_forms():
    d = np.array([4.0, 0.0, 1.0])
    np.testing.assert_array_equal(inverse_diagonal(d, "jacobi"), [0.25, 1.0, 1.0])  # zero guard
    np.testing.assert_array_equal(inverse_diagonal(d, "none"), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(inverse_diagonal(d, "ceres"), [1 / 9, 1.0, 0.25])
    np.testing.assert_allclose(inverse_diagonal(d, "modified_ceres"), [0.2, 1.0, 0.5])
    with pytest.raises(ValueError):
        inverse_diagonal(d, "bogus")


def test_zero_rhs_returns_zero_step():
    A, _ = _spd(5, 0)
    res = pcg(lambda p: A @ p, np.zeros(5), None, max_iterations=10)
    assert res.iterations == 0 and res.reason == "zero rhs" and not res.x.any()


def _reference_pcg(A, b, m_inv, max_it, q_tol, reset):
    """Direct transcription of spec §4.4 + §4.3 (Q test, residual reset), independent of pcg()."""
    x = np.zeros_like(b); r = b.copy(); z = m_inv * r; p = z.copy(); rho_old = r @ z
    Q0 = 0.0
    for i in range(1, max_it + 1):
        q = A @ p
        alpha = rho_old / (p @ q)
        x = x + alpha * p
        if reset and i % reset == 0:
            r = b - A @ x
        else:
            r = r - alpha * q
        z = m_inv * r
        rho_new = z @ r
        p = z + (rho_new / rho_old) * p
        rho_old = rho_new
        Q1 = 0.5 * x @ (r + b)
        if i * (Q1 - Q0) / Q1 < q_tol:
            return x, i
        Q0 = Q1
    return x, max_it


def test_q_early_exit_and_reset_match_transcription():
    A, b = _spd(80, 5, cond_scale=1e3)
    m_inv = inverse_diagonal(np.diag(A).copy())
    for q_tol in (1e-1, 1e-2, 1e-4):
        ref_x, ref_it = _reference_pcg(A, b, m_inv, 200, q_tol, 10)
        res = pcg(lambda p: A @ p, b, m_inv, max_iterations=200, tolerance=0.0,
                  q_tolerance=q_tol, residual_reset_period=10)
        assert res.reason == "q tolerance"
        assert res.iterations == ref_it
        np.testing.assert_allclose(res.x, ref_x, rtol=1e-12, atol=1e-14 * np.abs(ref_x).max())
    # looser q tolerance stops earlier
    its = [pcg(lambda p: A @ p, b, m_inv, max_iterations=200, tolerance=0.0, q_tolerance=q).iterations
           for q in (1e-1, 1e-4)]
    assert its[0] < its[1]


def test_residual_reset_every_10_iterations():
    A, b = _spd(50, 6, cond_scale=1e3)
    calls = []

    def apply_A(p):
        calls.append(p.copy())
        return A @ p

    res = pcg(apply_A, b, None, max_iterations=35, tolerance=0.0, residual_reset_period=10)
    assert res.iterations == 35 and res.reason == "max iterations"
    # 35 iterations + explicit r = b - A x at i = 10, 20, 30
    assert res.n_apply == len(calls) == 38
    # after the reset the residual really is b - A x (up to roundoff)
    np.testing.assert_allclose(np.linalg.norm(b - A @ res.x), res.residual_norm, rtol=1e-6)
    res0 = pcg(A.__matmul__, b, None, max_iterations=35, tolerance=0.0, residual_reset_period=0)
    assert res0.n_apply == 35


def _laplacian_system(n=30):
    """A 2-D Laplacian plus a random diagonal on an n x n grid, and a random right side."""
    lap = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (n, n))
    A = (sp.kron(lap, sp.eye(n)) + sp.kron(sp.eye(n), lap)
         + sp.diags(np.random.default_rng(0).uniform(1e-3, 1.0, n * n))).tocsr()
    return A, np.random.default_rng(1).normal(size=n * n)


def test_remaining_decrease_bounds_the_model_decrease_left():
    """``PCGResult.remaining_decrease`` estimates ``1/2 r.A^-1 r`` (what the quadratic model could
    still fall below the returned step) from CG's own coefficients: ``1/2 r.M^-1 r`` over the
    smallest Ritz value. On a 2-D Laplacian plus a random diagonal it lies above the exact value
    (measured ~4x) at every tolerance, and it is nan for too short a run."""
    A, b = _laplacian_system()
    dense = A.toarray()
    for tol in (1e-2, 1e-4, 1e-8):
        res = pcg(lambda p: A @ p, b, 1.0 / A.diagonal(), max_iterations=1000, tolerance=tol)
        r = b - A @ res.x
        exact = 0.5 * r @ np.linalg.solve(dense, r)
        assert exact <= res.remaining_decrease() <= 20 * exact, (tol, exact, res.remaining_decrease())
    short = pcg(lambda p: A @ p, b, 1.0 / A.diagonal(), max_iterations=3, tolerance=0.0)
    assert np.isnan(short.remaining_decrease())


def test_decrease_tolerance_stops_once_the_gain_left_is_below_it():
    """``decrease_tolerance``: PCG stops ("decrease tolerance") once its estimate of the model
    decrease left is at most the tolerance; the exact decrease left, ``1/2 r.A^-1 r``, is then
    below it too (the estimate lies above it), and the run is shorter than one to a tight
    residual tolerance."""
    A, b = _laplacian_system()
    dense = A.toarray()
    full = pcg(lambda p: A @ p, b, 1.0 / A.diagonal(), max_iterations=1000, tolerance=1e-12)
    optimum = 0.5 * b @ np.linalg.solve(dense, b)
    for fraction in (1e-3, 1e-6):
        res = pcg(lambda p: A @ p, b, 1.0 / A.diagonal(), max_iterations=1000, tolerance=1e-12,
                  decrease_tolerance=fraction * optimum)
        r = b - A @ res.x
        left = 0.5 * r @ np.linalg.solve(dense, r)
        assert res.reason == "decrease tolerance" and res.iterations < full.iterations
        assert left <= fraction * optimum, (fraction, left / optimum)
        assert res.remaining_decrease() <= fraction * optimum


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_fused_update_matches_numpy(n):
    """One compiled pass for ``x += a p; r -= a q; z = m r`` and the dots ``z.r``, ``r.r``:
    the same vectors as numpy's element-wise ops (exactly) and the dots to rounding, at sizes
    below, at and off the SIMD width (float64; float32 keeps numpy and the compiled dot)."""
    dtype, tol = np.float64, 1e-13
    from lsq_opt._solver._fused_update import PCGUpdate

    rng = np.random.default_rng(n)
    x, r, p, q, m = (rng.standard_normal(n).astype(dtype) for _ in range(5))
    z = np.empty(n, dtype)
    alpha = dtype(0.37)
    x_ref, r_ref = x + alpha * p, r - alpha * q
    z_ref = m * r_ref
    update = PCGUpdate.bind(x, r, z, p, m)
    rz, rr = update(q, alpha)
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(r, r_ref)
    np.testing.assert_array_equal(z, z_ref)
    scale = float(np.abs(z_ref * r_ref).sum())
    assert abs(float(rz) - float(np.dot(z_ref.astype(np.float64), r_ref))) <= tol * scale
    assert float(rr) == pytest.approx(float(np.dot(r_ref.astype(np.float64), r_ref)), rel=tol)


def test_fused_update_declines_what_it_cannot_take():
    from lsq_opt._solver._fused_update import PCGUpdate

    v = np.ones(16)
    assert PCGUpdate.bind(v, v.copy(), v.copy(), np.ones(32)[::2], v.copy()) is None  # strided
    assert PCGUpdate.bind(v, v.copy(), v.copy(), v.copy(), np.ones(8)) is None  # length
    assert PCGUpdate.bind(*(np.ones(16, np.int64) for _ in range(5))) is None  # dtype
    assert PCGUpdate.bind(*(np.ones(16, np.float32) for _ in range(5))) is None  # see the module
    update = PCGUpdate.bind(v, v.copy(), v.copy(), v.copy(), v.copy())
    assert update(np.ones(32)[::2], 0.5) is None and np.all(v == 1.0)


def test_pcg_with_the_fused_update_takes_numpys_iterates(monkeypatch):
    """The fused pass changes only the dots' summation order: PCG's step, residual and
    iteration count equal the numpy path's to rounding, with residual resets in between."""
    from lsq_opt._solver._fused_update import PCGUpdate

    A, b = _spd(300, 5, cond_scale=100.0)
    kw = dict(max_iterations=200, tolerance=1e-10, residual_reset_period=10)
    fused = pcg(lambda p: A @ p, b, inverse_diagonal(np.diag(A)), **kw)
    monkeypatch.setattr(PCGUpdate, "bind", classmethod(lambda cls, *a: None))
    plain = pcg(lambda p: A @ p, b, inverse_diagonal(np.diag(A)), **kw)
    assert fused.iterations == plain.iterations and fused.reason == plain.reason == "tolerance"
    np.testing.assert_allclose(fused.x, plain.x, rtol=1e-9, atol=1e-12 * np.abs(plain.x).max())
    np.testing.assert_allclose(fused.residual, b - A @ fused.x, atol=1e-8 * np.linalg.norm(b))
