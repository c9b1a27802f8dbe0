"""Shape from shading (spec 3.5, Fig. 26): AE-1 routine correctness, AE-10 (ComputedArray
annotation does not change the iterates) and the example's check.

AE-1 instances (16x16, 17x13) use the example's synthetic frame with extra random invalid
depth pixels (Exclude + the DepthValid conditions), random 0/1 edge masks and random unknowns
(noise of 5 mm, so the |X(0,0) - X(n)| < 0.01 continuity flags take both values). The FD
Jacobian uses 4-point central differences with h = 1e-4; x is chosen so that no continuity
flag flips within the stencil (every neighbour difference is >= 1e-3 away from the 0.01
threshold; the other conditions read only data, and ``sqLength > 0`` holds at all positive
depths), so every entry is compared. Tolerances: FD rel 1e-6 (entries > 1e-8, plus 1e-10
absolute for the FD's rounding); products against the FD Jacobian within 1e-6 of the same
product over |J|; against the numpy reference backend f64 1e-12, f32 1e-4."""

import numpy as np
from lsq_opt.testing import fd_jacobian, rel_check
import pytest
from lsq_opt import compile_problem, solve
from lsq_opt.examples import shading
from lsq_opt.examples._image import read_png_size

H_FD = 1e-4
MARGIN = 1e-3
SIZES = [(16, 16), (17, 13)]
THRE = shading.DEPTH_DISCONTINUITY_THRE


def instance(size, seed=0):
    rng = np.random.default_rng(seed)
    data, params, truth = shading.make_data(size, seed)
    D = data["D_i"].copy()
    D[rng.random(size) < 0.12] = 0.0  # extra invalid (excluded) pixels
    data = dict(data, D_i=D, X=D.copy(),
                edgeMaskR=(rng.random(size) > 0.2).astype(float),
                edgeMaskC=(rng.random(size) > 0.2).astype(float))
    params = dict(params, w_g=1.0, w_s=2.0)  # shading entries as large as the others
    return data, params


def safe_x(plan, rng, scale=0.005):
    """x0 + noise, redrawn at pixels whose neighbour differences are near the 0.01 threshold."""
    x = plan.x0 + rng.normal(scale=scale, size=plan.n)
    free = np.zeros(plan.n_full, bool)
    free[plan.free_idx] = True
    free = free.reshape(plan.vector_to_unknowns(x)["X"].shape)
    for _ in range(200):
        X = plan.vector_to_unknowns(x)["X"]
        bad = np.zeros(X.shape, bool)
        for axis in (0, 1):
            d = np.abs(np.abs(np.diff(X, axis=axis)) - THRE) < MARGIN
            lo = [slice(None)] * 2
            lo[axis] = slice(0, -1)
            hi = [slice(None)] * 2
            hi[axis] = slice(1, None)
            bad[tuple(lo)] |= d
            bad[tuple(hi)] |= d
        bad &= free
        if not bad.any():
            return x
        Xn = X.copy()
        Xn[bad] = plan.vector_to_unknowns(plan.x0)["X"][bad] + rng.normal(scale=scale, size=int(bad.sum()))
        x = plan.unknowns_to_vector({"X": Xn})
    raise AssertionError("could not place x away from the continuity threshold")


def scaled_check(a, b, scale, rel=1e-6):
    err = np.abs(np.asarray(a) - np.asarray(b))
    assert np.all(err <= rel * scale + 1e-12), np.max(err / (scale + 1e-300))


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def ae1(request):
    size = request.param
    data, params = instance(size)
    plans = {(k, np.dtype(dt).name): compile_problem(shading.energy(), arrays=data, params=params,
                                                     dtype=dt, backend=b)
             for k, b in (("fused", "llvm"), ("numpy", "numpy")) for dt in (np.float64, np.float32)}
    rng = np.random.default_rng(7)
    x = safe_x(plans["fused", "float64"], rng)
    return size, data, params, plans, x, rng


def test_ae1_instance_exercises_masks_and_conditions(ae1):
    size, data, params, plans, x, _ = ae1
    plan = plans["fused", "float64"]
    D = data["D_i"]
    assert 0 < plan.n < D.size and plan.n == int((D > 0).sum())  # Exclude removed invalid pixels
    X = plan.vector_to_unknowns(x)["X"]
    diffs = np.abs(np.diff(X[D > 0]))
    assert (diffs < THRE).any() and (diffs > THRE).any()  # both continuity outcomes occur
    F = plan.residuals(x)
    W, H = size
    for t in range(4):  # every residual template is active somewhere
        assert np.abs(F[t * W * H: (t + 1) * W * H]).max() > 0


def test_ae1_residuals_equal_numpy_transcription(ae1):
    _, data, params, plans, x, _ = ae1
    plan = plans["fused", "float64"]
    X = plan.vector_to_unknowns(x)["X"]
    F_np = np.concatenate([r.ravel() for r in shading.residuals_numpy(X, data, params)])
    np.testing.assert_allclose(plan.residuals(x), F_np, rtol=1e-12, atol=1e-14)
    assert plan.cost(x) == pytest.approx(0.5 * F_np @ F_np, rel=1e-12)


def test_ae1_against_finite_differences(ae1):
    _, _, _, plans, x, rng = ae1
    plan = plans["fused", "float64"]
    F = plan.residuals(x)
    Jfd = fd_jacobian(plan, x, h=H_FD)
    J = plan.jacobian(x).toarray()
    rel_check(J, Jfd)
    aJ = np.abs(Jfd)
    assert plan.cost(x) == pytest.approx(0.5 * F @ F, rel=1e-14)
    scaled_check(plan.jtf(x), Jfd.T @ F, aJ.T @ np.abs(F))
    scaled_check(plan.jtj_diag(x), (Jfd * Jfd).sum(0), (aJ * aJ).sum(0))
    p = rng.normal(size=plan.n)
    scaled_check(plan.jtjp(x, p), Jfd.T @ (Jfd @ p), aJ.T @ (aJ @ np.abs(p)))


def test_ae1_float64_against_numpy_reference(ae1):
    _, _, _, plans, x, rng = ae1
    fused, ref = plans["fused", "float64"], plans["numpy", "float64"]
    p, q = rng.normal(size=fused.n), rng.normal(size=fused.n)
    assert fused.cost(x) == pytest.approx(ref.cost(x), rel=1e-12)
    np.testing.assert_allclose(fused.jtf(x), ref.jtf(x), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(fused.jtj_diag(x), ref.jtj_diag(x), rtol=1e-12, atol=1e-13)
    jtjp = fused.jtjp(x, p)
    np.testing.assert_allclose(jtjp, ref.jtjp(x, p), rtol=1e-12, atol=1e-12)
    J = ref.jacobian(x)
    np.testing.assert_allclose(fused.jacobian(x).toarray(), J.toarray(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(jtjp, J.T @ (J @ p), rtol=1e-12, atol=1e-12)  # applyJTJ = J^T (J p)
    assert q @ jtjp == pytest.approx(p @ fused.jtjp(x, q), rel=1e-12)  # symmetry


def test_ae1_float32_against_numpy_reference(ae1):
    _, _, _, plans, x, rng = ae1
    fused, ref = plans["fused", "float32"], plans["numpy", "float32"]
    x32 = x.astype(np.float32)
    p = rng.normal(size=fused.n).astype(np.float32)
    assert fused.jtf(x32).dtype == np.float32
    assert fused.cost(x32) == pytest.approx(ref.cost(x32), rel=1e-4)
    for a, b in [(fused.jtf(x32), ref.jtf(x32)), (fused.jtj_diag(x32), ref.jtj_diag(x32)),
                 (fused.jtjp(x32, p), ref.jtjp(x32, p))]:
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
    # and the float32 plan tracks the float64 one to float32 accuracy
    f64 = plans["fused", "float64"]
    assert fused.cost(x32) == pytest.approx(f64.cost(x32.astype(np.float64)), rel=1e-4)


# ----------------------------------------------------------------------------- AE-10
def test_ae10_computed_arrays_give_the_same_iterates():
    """B_I and valid as ComputedArrays vs the expressions written inline: same GN and LM iterates."""
    data, params, _ = shading.make_data((24, 18), seed=3)
    # the numpy composition of the per-term LLVM kernels (the fused kernels are checked
    # against it above; generating two fused plans here would only add compile time)
    a = compile_problem(shading.energy(annotated=True), arrays=data, params=params, kernels="lanes")
    b = compile_problem(shading.energy(annotated=False), arrays=data, params=params, kernels="lanes")
    for method in ("gn", "lm"):
        kw = dict(method=method, max_iterations=4, pcg_max_iterations=10, function_tolerance=0.0,
                  gradient_tolerance=0.0, parameter_tolerance=0.0)
        ra, rb = solve(a, a.x0, **kw), solve(b, b.x0, **kw)
        assert len(ra.log) == len(rb.log) == 4
        np.testing.assert_allclose([e.cost for e in ra.log], [e.cost for e in rb.log], rtol=1e-9)
        np.testing.assert_allclose(ra.x, rb.x, rtol=1e-9)
        assert ra.cost < 0.5 * ra.initial_cost


def test_ae10_check_has_teeth():
    """Inlining B_I(1,0) with the box test left at the centre (the listing's literal
    InBoundsExpanded(0,0,1), which is only right for the ComputedArray evaluated at (0,0))
    changes the energy, so the comparison above can tell the two apart."""
    data, params, _ = shading.make_data((24, 18), seed=3)
    a = compile_problem(shading.energy(annotated=True), arrays=data, params=params, kernels="lanes")
    bad = compile_problem(shading.energy(annotated=False, shift_box=False), arrays=data, params=params,
                          kernels="lanes")
    assert abs(a.cost(a.x0) - bad.cost(bad.x0)) > 1e-6 * a.cost(a.x0)


# ----------------------------------------------------------------------------- the example
def test_example_refines_depth(tmp_path):
    r = shading.run(size=(40, 30), out_dir=str(tmp_path))
    assert r["finite"] and r["monotone_accepted_costs"]
    for m, res in r["methods"].items():
        assert res["cost"] < 0.1 * r["initial_cost"], m
        assert res["rms_depth_err_refined"] < 0.75 * r["rms_depth_err_input"], m
    assert read_png_size(r["png"])[1] > 30


def test_make_data_explains_intensity():
    """The intensity is the SH shading of the true depth: B_I vanishes up to the smoothing of
    I, and the true depth has a far lower shading residual than the noisy input."""
    data, params, truth = shading.make_data((64, 48))
    with_truth = shading.residuals_numpy(truth, data, params)
    with_input = shading.residuals_numpy(data["D_i"], data, params)
    e_truth = sum(float((r ** 2).sum()) for r in with_truth[1:3])
    e_input = sum(float((r ** 2).sum()) for r in with_input[1:3])
    assert e_truth < 0.05 * e_input
    assert (data["D_i"] == 0).any() and (data["edgeMaskR"] == 0).any()


def test_inbounds_expanded():
    """InBoundsExpanded(dx, dy, e): the whole (2e+1)^2 box around centre + (dx, dy) is inside."""
    from lsq_opt import Array, Dim, Energy, InBoundsExpanded, Select, Unknown
    W, H = Dim("W"), Dim("H")
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    plan = compile_problem(Energy(Select(InBoundsExpanded(1, 0, 2), X(0, 0) - A(0, 0), 0.0)),
                           arrays={"A": np.ones((9, 7))})
    F = plan.residuals(np.zeros(plan.n)).reshape(9, 7)
    i, j = np.meshgrid(np.arange(9), np.arange(7), indexing="ij")
    inside = (i + 1 - 2 >= 0) & (i + 1 + 2 < 9) & (j - 2 >= 0) & (j + 2 < 7)
    np.testing.assert_array_equal(F, np.where(inside, -1.0, 0.0))
    with pytest.raises(TypeError, match="InBoundsExpanded"):
        InBoundsExpanded(0, 0.5, 1)
    with pytest.raises(ValueError, match="extent"):
        InBoundsExpanded(0, 0, -1)
