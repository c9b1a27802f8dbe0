"""Spec AE-9: matrix-free vs materialised linear systems. ``solve(..., linear_system=...)``
serves PCG's J^T J p from the generated kernels ("matrix_free"), from J assembled as a sparse
matrix ("jacobian": two sparse products) or from J^T J formed by SpGEMM ("jtj"). On every
example energy the PCG iterates of the three agree to float64 1e-10 over 20 iterations, and
whole LM solves take the same iterates."""

import time

import numpy as np
import pytest
import scipy.sparse as sp

from lsq_opt import DenseProblem, compile_problem, solve
from lsq_opt._solver.materialized import (BUILD_PRIOR_PRODUCTS, MaterializedProblem, gram_matrix, jtj_pays,
                                          with_linear_system)
from lsq_opt._solver.pcg import pcg
from lsq_opt._solver.problem import call_linearize, jtjp_operator
from lsq_opt.examples import (arap, cotangent, embedded, flow, intrinsic, laplacian, mesh,
                              poisson, robust, volumetric)

FORMS = ("matrix_free", "jacobian", "jtj")


def _laplacian():
    _, noisy = laplacian.make_data((9, 7))
    return compile_problem(laplacian.energy(), arrays={"A": noisy},
                           params={"w_fit": 0.1, "w_reg": 0.9})


def _poisson():
    target, source, mask = poisson.make_data((10, 8))
    return compile_problem(poisson.energy(target.shape[-1]),
                           arrays={"X": target, "T": source, "M": mask})


def _arap_image():
    size = (12, 8)
    ur, mask, handles, targets = arap.make_data(size, bend_deg=30.0)
    return compile_problem(arap.energy(), arrays={
        "UrShape": ur, "Mask": mask, "Offset": ur, "Angle": np.zeros(size),
        "Constraints": arap._constraints(size, handles, targets)},
        params={"w_fitSqrt": 3.0, "w_regSqrt": 1.0})


def _arap_mesh():
    V, _, (v0, v1), handles, targets = mesh.arap_setup(rings=4, segs=5)
    return compile_problem(mesh.arap_energy(), arrays={
        "UrShape": V, "Constraints": mesh.constraints(len(V), handles, targets),
        "Offset": V.copy(), "Angle": np.zeros_like(V)},
        params={"w_fitSqrt": 2.0, "w_regSqrt": 1.0}, graphs={"G": {"v0": v0, "v1": v1}})


def _flow():
    I, I_hat, dx, dy = flow.make_pair((10, 8))
    return compile_problem(flow.energy(), arrays={"I": I, "I_hat": I_hat, "I_hat_dx": dx,
                                                  "I_hat_dy": dy},
                           params={"w_fit": 3.0, "w_reg": 0.5})


def _intrinsic():
    img, _, _ = intrinsic.make_data((8, 6))
    return compile_problem(intrinsic.energy(), arrays={"i": img, "r": img.copy(),
                                                       "s": np.zeros(img.shape[:2])},
                           params=dict(intrinsic.PARAMS, pNorm=0.8))


def _cotangent():
    V, tris, boundary = cotangent.lattice_mesh(6, 5, seed=0)
    noisy = V + 0.05 * np.random.default_rng(1).standard_normal(V.shape) * (boundary == 0)[:, None]
    return cotangent.make_plan(V, tris, boundary, noisy)


def _embedded():
    V, tris = mesh.tube_mesh(4, 5)
    v0, v1 = mesh.directed_edges(tris)
    handles = np.concatenate([np.arange(5), np.arange(15, 20)])
    return embedded.make_plan(V, v0, v1, handles, V[handles] + [0.3, -0.2, 0.5])


def _robust():
    V, edges, constraints, normals, _, _ = robust.make_data(5, 4)
    return robust.make_plan(V, edges, constraints, normals)


def _volumetric():
    U = volumetric.grid((3, 5, 3))
    handles = np.zeros(U.shape[:3], bool)
    handles[:, 0, :] = handles[:, -1, :] = True
    return volumetric.make_plan(U, handles, U[handles] + [0.2, 0.0, -0.1])


PLANS = {"laplacian": _laplacian, "poisson": _poisson, "arap_image": _arap_image,
         "arap_mesh": _arap_mesh, "flow": _flow, "intrinsic": _intrinsic,
         "cotangent": _cotangent, "embedded": _embedded, "robust": _robust,
         "volumetric": _volumetric}


def _start(plan):
    """A point away from the initial guess, so that non-linear terms have a non-trivial J."""
    rng = np.random.default_rng(7)
    return plan.x0 + 0.05 * rng.standard_normal(plan.n)


@pytest.mark.parametrize("name", PLANS)
def test_pcg_iterates_agree_across_linear_systems(name):
    plan = PLANS[name]()
    x = _start(plan)
    b = -plan.jtf(x)
    m_inv = 1.0 / np.maximum(plan.jtj_diag(x), 1e-12)
    steps = {}
    for form in FORMS:
        prob = with_linear_system(plan, form)
        call_linearize(prob, x)
        apply_A = jtjp_operator(prob, x)  # the operator the solvers' PCG gets
        steps[form] = [pcg(apply_A, b, m_inv, max_iterations=k, tolerance=0.0).x
                       for k in (1, 5, 10, 20)]
    for form in FORMS[1:]:
        for k, (got, want) in enumerate(zip(steps[form], steps["matrix_free"])):
            scale = np.abs(want).max()
            assert np.abs(got - want).max() <= 1e-10 * scale, (name, form, k)


@pytest.mark.parametrize("form", FORMS[1:])
def test_lm_solves_take_the_same_iterates(form):
    plan = _arap_mesh()
    kw = dict(max_iterations=6, pcg_max_iterations=20)
    want = solve(plan, plan.x0, **kw)
    got = solve(plan, plan.x0, linear_system=form, **kw)
    assert got.iterations == want.iterations
    np.testing.assert_allclose(got.x, want.x, rtol=0, atol=1e-9 * np.abs(want.x).max())
    assert got.cost == pytest.approx(want.cost, rel=1e-10)


def test_unknown_linear_system_is_a_named_error():
    with pytest.raises(ValueError, match="linear_system must be one of"):
        solve(_laplacian(), _laplacian().x0, linear_system="dense")


def test_materialised_forms_refuse_device_vectors():
    class Device:
        n, dtype, xp = 3, np.float64, object()

    with pytest.raises(ValueError, match="assembles J with scipy on the host"):
        MaterializedProblem(Device(), "jtj")


# ---------------------------------------------------------------- linear_system="auto"
def test_jtj_pays_rule():
    # before the first build: priced at BUILD_PRIOR_PRODUCTS matrix-free products
    assert not jtj_pays(0, 1e-3, None, None)
    assert not jtj_pays(BUILD_PRIOR_PRODUCTS, 1e-3, None, None)
    assert jtj_pays(BUILD_PRIOR_PRODUCTS + 1, 1e-3, None, None)
    # measured: 20 products of 1 ms vs a 10 ms build plus 20 products of 0.1 ms
    assert jtj_pays(20, 1e-3, 10e-3, 1e-4)
    assert not jtj_pays(20, 1e-3, 20e-3, 1e-4)
    assert not jtj_pays(20, 1e-4, 1e-3, 1e-4)  # the sparse product is no cheaper
    assert not jtj_pays(5, None, None, None)  # nothing measured yet


class _Priced:
    """``plan`` with a matrix-free product and a Jacobian slowed down by the given seconds: the
    prices the "auto" rule measures, made far apart so that machine load cannot flip it."""

    def __init__(self, plan, product_s=0.0, jacobian_s=0.0):
        self.plan, self.product_s, self.jacobian_s = plan, product_s, jacobian_s

    def __getattr__(self, name):
        return getattr(self.plan, name)

    def jtjp_linearized(self, p):
        time.sleep(self.product_s)
        return self.plan.jtjp_linearized(p)

    def jacobian(self, x):
        time.sleep(self.jacobian_s)
        return self.plan.jacobian(x)

    def jtj_matrix(self, x):  # the "jtj" form's build (the plan's own assembly)
        time.sleep(self.jacobian_s)
        return self.plan.jtj_matrix(x)


def test_auto_picks_jtj_for_expensive_products_and_matches_it():
    plan = _arap_mesh()
    x0 = _start(plan)
    plan.jacobian(x0)  # compiles J's kernels: the first build's price would include that
    kw = dict(max_iterations=6, function_tolerance=0.0, pcg_tolerance=1e-12)  # long PCG solves
    got = solve(_Priced(plan, product_s=2e-3), x0, **kw)
    assert got.linear_system.startswith("auto: J^T J on ")
    used = int(got.linear_system.split("J^T J on ")[1].split(" of ")[0])
    # every linearisation: the first switches part-way, once its generated products have cost
    # as much as the prior price of a build (the ski rental within a linearisation)
    assert used == got.iterations + 1 and "(1 switched part-way" in got.linear_system, got.linear_system
    ref = solve(plan, x0, linear_system="jtj", **kw)
    assert got.iterations == ref.iterations
    np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=1e-8 * np.abs(ref.x).max())
    np.testing.assert_allclose(got.cost, ref.cost, rtol=1e-9)


class _Preempted(_Priced):
    """``plan`` whose every ``every``-th matrix-free product takes ``pause_s`` longer: what a
    wall-clock measurement sees when the process is preempted on a shared machine."""

    def __init__(self, plan, pause_s, every):
        super().__init__(plan)
        self.pause_s, self.every, self.calls = pause_s, every, 0

    def jtjp_linearized(self, p):
        self.calls += 1
        if self.calls % self.every == 0:
            time.sleep(self.pause_s)
        return self.plan.jtjp_linearized(p)


def test_auto_prices_are_medians_robust_to_preempted_measurements():
    """One product in eight paused for 40 ms (a preemption) made the mean price of a ~0.1 ms
    product ~5 ms, so "auto" built J^T J (milliseconds) on every linearisation; the median
    price stays the product's own, and the builds stop after the one probe."""
    plan = _arap_mesh()
    x0 = _start(plan)
    plan.jacobian(x0)  # compiles J's kernels: the first build's price would include that
    prob = with_linear_system(_Preempted(plan, pause_s=0.04, every=8), "auto")
    got = solve(prob, x0, max_iterations=8, function_tolerance=0.0)
    assert prob._price("free") < 0.02  # the products' own time, not the pauses
    assert prob.linearisations["jtj"] <= 1, got.linear_system  # at most the one probe
    prob._add("free", 10.0)  # one more outlier moves the median by one sample
    assert prob._price("free") < 0.02


def test_auto_keeps_matrix_free_when_building_costs_more():
    plan = _arap_mesh()
    x0 = _start(plan)
    prob = with_linear_system(_Priced(plan, jacobian_s=0.2), "auto")
    got = solve(prob, x0, max_iterations=6, function_tolerance=0.0, linear_system="matrix_free")
    assert prob.linearisations["jtj"] <= 1  # at most the one probe
    ref = solve(plan, x0, max_iterations=6, function_tolerance=0.0, linear_system="matrix_free")
    np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=1e-8 * np.abs(ref.x).max())


def test_auto_passes_through_problems_it_cannot_materialise():
    class NoJacobian:
        def __init__(self, plan):
            self.plan = plan

        def __getattr__(self, name):
            if name == "jacobian":
                raise AttributeError(name)
            return getattr(self.plan, name)

    prob = NoJacobian(_laplacian())
    assert with_linear_system(prob, "auto") is prob
    assert solve(prob, prob.x0).linear_system == "matrix_free"


def test_jtj_form_uses_the_plans_stencil_assembly_on_grids():
    """``"jtj"`` takes J^T J from the problem's own ``jtj_matrix`` where it has one (a plan on
    one grid: generated stencil planes into a cached pattern, ~20x cheaper than J plus SpGEMM)
    and it equals J^T J of the assembled J; a problem without one gets SpGEMM."""
    plan = _poisson()
    x = plan.x0 + 0.01 * np.random.default_rng(0).standard_normal(plan.n)
    calls = []
    own = plan.jtj_matrix
    plan.jtj_matrix = lambda x_: calls.append(1) or own(x_)
    system = MaterializedProblem(plan, "jtj")
    system.linearize(x)
    J = plan.jacobian(x)
    p = np.random.default_rng(1).standard_normal(plan.n)
    expected = J.T @ (J @ p)
    assert calls == [1]
    np.testing.assert_allclose(system.jtjp_linearized(p), expected, rtol=1e-12,
                               atol=1e-12 * np.abs(expected).max())
    del plan.jtj_matrix
    dense = DenseProblem(plan.residuals, plan.jacobian, plan.n)
    via_spgemm = MaterializedProblem(dense, "jtj")
    via_spgemm.linearize(x)
    np.testing.assert_allclose(via_spgemm.jtjp_linearized(p), expected, rtol=1e-12,
                               atol=1e-12 * np.abs(expected).max())


def test_auto_switches_to_jtj_part_way_through_a_mispredicted_linearisation():
    """A linearisation that starts matrix-free (the previous one took few products) builds
    J^T J once its generated products have cost as much as a build, and serves the rest of
    its products from it: the same operator, so PCG's iterates are those of matrix-free."""
    plan = _arap_mesh()
    x0 = _start(plan)
    plan.jacobian(x0)
    system = with_linear_system(_Priced(plan, product_s=2e-3), "auto")
    call_linearize(system, x0)
    rng = np.random.default_rng(3)
    ps = [rng.standard_normal(plan.n) for _ in range(BUILD_PRIOR_PRODUCTS + 3)]
    got = [system.jtjp_linearized(p) for p in ps]
    assert system.switched == 1 and system.linearisations == {"matrix_free": 0, "jtj": 1}
    for p, out in zip(ps, got):
        expected = plan.jtjp(x0, p)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-10 * np.abs(expected).max())


def test_auto_prices_the_assembly_not_the_stencil_kernels_compile():
    """On a fresh grid plan the first J^T J build compiles the stencil kernel (~0.3 s); "auto"
    has the plan compile it (``prepare_jtj_matrix``) before timing the build, so the price is
    the assembly's and the build happens again where it pays."""
    plan = _poisson()
    assert "jtjs" not in plan.fused.grids[0].fns
    system = with_linear_system(_Priced(plan, product_s=2e-3), "auto")
    call_linearize(system, plan.x0)
    rng = np.random.default_rng(4)
    for _ in range(BUILD_PRIOR_PRODUCTS + 2):
        system.jtjp_linearized(rng.standard_normal(plan.n))
    assert system.switched == 1 and "jtjs" in plan.fused.grids[0].fns
    assert system._price("build") < 0.1  # the assembly alone: milliseconds


def test_gram_matrix_equals_the_normal_matrix():
    J = sp.random(60, 25, density=0.15, random_state=3, format="csr")
    A = gram_matrix(J)
    assert A.format == "csr"
    np.testing.assert_allclose(A.toarray(), J.toarray().T @ J.toarray(), rtol=1e-14, atol=1e-14)
