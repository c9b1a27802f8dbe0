"""Default solver settings: they converge without tuning and say why they stopped."""
import contextlib
import io
import pathlib
import re

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from lsq_opt import Array, DenseProblem, Dim, Energy, Graph, SolverOptions, Unknown, compile_problem, solve
from lsq_opt._solver.adaptive import FIRST_BUDGET, MIN_BUDGET, JacobiThenMultigrid
from lsq_opt._solver.options import FORCING_INITIAL, FORCING_MAX, forcing_term
from lsq_opt._solver.problem import resolve_preconditioner
from lsq_opt.testing import spring_network

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
W, H, N = Dim("W"), Dim("H"), Dim("N")


def readme_snippet() -> str:
    text = README.read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def record_pcg_argument(monkeypatch, name) -> list:
    """Patch LM's pcg to record the keyword ``name`` of every call; the list of values."""
    import sys

    lm = sys.modules["lsq_opt._solver.levenberg_marquardt"]
    real_pcg, seen = lm.pcg, []

    def recording_pcg(*args, **kw):
        seen.append(kw[name])
        return real_pcg(*args, **kw)

    monkeypatch.setattr(lm, "pcg", recording_pcg)
    return seen


def test_readme_snippet_converges_and_says_why():
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(readme_snippet(), str(README), "exec"), scope)
    res = scope["res"]
    assert res.converged, res.termination_detail
    # the paper's fixed 10 x 10 settings (the old default) stop early on the same problem
    paper = solve(scope["plan"], scope["plan"].x0, options=SolverOptions.paper())
    assert paper.termination_reason == "max iterations" and paper.cost > res.cost * (1 + 1e-6)
    printed = out.getvalue()
    assert "converged:" in printed.splitlines()[-1]
    assert "done: converged" in printed  # the verbose report's last solver line
    # the solution is the minimiser to the function tolerance's resolution: within
    # function_tolerance / 10 of the cost a tightly solved run reaches, and the gradient J^T F
    # down by orders of magnitude from its start
    plan = scope["plan"]
    tight = solve(plan, plan.x0, function_tolerance=1e-15, gradient_tolerance=0.0,
                  predicted_stop=False, pcg_tolerance=1e-12, max_iterations=200)
    assert tight.cost <= res.cost <= tight.cost * (1 + 1e-7)
    assert np.max(np.abs(plan.jtf(res.x))) < 1e-2 * np.max(np.abs(plan.jtf(plan.x0)))


def smoothing_plan(w, h, weight=0.9):
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    E = Energy(0.1 * (X(0, 0) - A(0, 0)), weight * (X(0, 0) - X(1, 0)), weight * (X(0, 0) - X(0, 1)))
    image = np.random.default_rng(1).random((w, h))
    return compile_problem(E, arrays={"A": image})


def test_defaults_are_ceres_like_and_paper_preset_is_fixed():
    o = SolverOptions()
    assert (o.function_tolerance, o.gradient_tolerance, o.parameter_tolerance) == (1e-6, 1e-10, 1e-8)
    assert o.pcg_tolerance is None and o.pcg_max_iterations is None and o.preconditioner == "auto"
    p = SolverOptions.paper()
    assert (p.max_iterations, p.pcg_max_iterations, p.preconditioner) == (10, 10, "jacobi")
    with pytest.raises(TypeError, match="unknown solver option 'pcg_iters'.*pcg_max_iterations"):
        SolverOptions.from_kwargs(pcg_iters=3)


def test_auto_preconditioner_multigrid_on_large_grids_jacobi_elsewhere():
    opts = SolverOptions()
    assert resolve_preconditioner(smoothing_plan(80, 64), opts) == "jacobi+multigrid"
    assert resolve_preconditioner(smoothing_plan(40, 30), opts) == "jacobi"  # below 4096 unknowns
    X, A = Unknown("X", (N,)), Array("A", (N,))
    G = Graph("G", v0=N, v1=N)
    n = 5000
    plan = compile_problem(Energy(X(0) - A(0), X(G.v0) - X(G.v1)), arrays={"A": np.ones(n)},
                           graphs={"G": {"v0": np.arange(n - 1), "v1": np.arange(1, n)}})
    assert not plan.is_grid_energy
    assert resolve_preconditioner(plan, opts) == "jacobi"
    assert resolve_preconditioner(plan, SolverOptions(preconditioner="none")) == "none"


def test_forcing_term_tightens_on_an_exact_model_and_is_safeguarded():
    # linear problem: the new gradient equals the last PCG residual -> the minimum
    assert forcing_term(0.1, 1e-3, 1.0, 1e-3, 1e-8) == 1e-8
    # poor model: large |g_k| - |r| -> capped at FORCING_MAX
    assert forcing_term(0.1, 5.0, 1.0, 0.01, 1e-8) == FORCING_MAX
    # safeguard: after eta = 0.4, the next is at least 0.4 ** 1.618
    assert forcing_term(0.4, 1e-3, 1.0, 1e-3, 1e-8) == pytest.approx(0.4 ** 1.618)
    assert forcing_term(0.1, 1.0, 0.0, 0.0, 1e-8) == FORCING_INITIAL


def test_linear_grid_problem_two_steps_and_pcg_effort_adapts():
    plan = smoothing_plan(80, 64)
    # one preconditioner throughout, so that PCG counts compare (with "auto" the second,
    # tight system goes to multigrid: the first one's Jacobi rate predicts a failed probe)
    res = solve(plan, plan.x0, method="gn", preconditioner="jacobi", pcg_max_iterations=500)
    assert res.converged
    pcg = [e.pcg_iterations for e in res.log]
    # the first step stops at the 0.1 forcing term, the second solves (nearly) exactly
    assert pcg[1] > pcg[0]
    assert res.log[1].pcg_reason == "tolerance"


def test_max_iterations_report_says_not_converged():
    plan = smoothing_plan(40, 30)
    res = solve(plan, plan.x0, max_iterations=1)
    assert res.termination_reason == "max iterations"
    assert res.termination_detail.startswith("NOT converged: reached max_iterations = 1")
    assert "termination       : max iterations (NOT converged" in res.report()


def test_verbose_names_preconditioner_and_stop(capsys):
    plan = smoothing_plan(40, 30)
    solve(plan, plan.x0, verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert "preconditioner jacobi" in lines[0]
    assert lines[-2].startswith("LM done: converged:")
    assert lines[-1].startswith("linear system: auto: J^T J on ")


def laplacian_1d(n, shift):
    return (sp.diags([-np.ones(n - 1), (2 + shift) * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])).tocsr()


def test_jacobi_then_multigrid_keeps_jacobi_on_easy_systems():
    A = laplacian_1d(2000, shift=3.0)  # diagonally dominant: Jacobi-PCG converges in a few steps
    b = np.random.default_rng(0).normal(size=2000)
    auto = JacobiThenMultigrid()

    def never():
        raise AssertionError("multigrid built for an easy system")

    for _ in range(3):
        res = auto.solve(lambda p: A @ p, b, 1 / A.diagonal(), never, max_iterations=500, tolerance=1e-8)
        assert res.reason == "tolerance" and res.iterations < FIRST_BUDGET
    assert auto.describe() == ("jacobi+multigrid (multigrid on 0 of 3 systems, 0 without a Jacobi "
                               "probe and 0 probes extended by the predicted rate)")


def test_jacobi_then_multigrid_switches_on_hard_systems_and_backs_off_probing():
    A = laplacian_1d(2000, shift=1e-6)  # Jacobi-PCG needs ~n iterations
    b = np.random.default_rng(0).normal(size=2000)
    lu = spla.splu(A.tocsc())
    applies, built = [], []

    def apply_A(p):
        applies.append(1)
        return A @ p

    def exact():
        built.append(1)
        return lu.solve

    auto = JacobiThenMultigrid()
    res = auto.solve(apply_A, b, 1 / A.diagonal(), exact, max_iterations=500, tolerance=1e-10)
    assert res.reason == "tolerance" and len(built) == 1
    assert np.linalg.norm(A @ res.x - b) <= 1e-8 * np.linalg.norm(b)
    # the failed Jacobi probe (FIRST_BUDGET iterations) is counted in the solve's iterations
    assert res.iterations == FIRST_BUDGET + 1 and res.iterations == len(applies)
    # the next system goes to multigrid directly (the back-off); the one after that too, as the
    # failed probe's rate predicts that Jacobi cannot reach 1e-10 within the budget (a
    # predicted failure backs off like a failed probe: one more skip); then Jacobi is probed
    # again whatever the prediction, so the rate is measured afresh
    probes = []
    for _ in range(4):
        res = auto.solve(apply_A, b, 1 / A.diagonal(), exact, max_iterations=500, tolerance=1e-10)
        probes.append(res.iterations >= MIN_BUDGET)  # a probe's iterations are counted in
    assert probes == [False, False, False, True] and len(built) == 5
    assert auto.describe() == ("jacobi+multigrid (multigrid on 5 of 5 systems, 1 without a Jacobi "
                               "probe and 0 probes extended by the predicted rate)")


def test_jacobi_then_multigrid_skips_a_probe_its_rate_predicts_to_fail():
    """A loose first system (the forcing term's 0.1) solved by Jacobi measures its rate
    (iterations per decade); a tight second one (the forcing floor) that this rate says needs
    more than the budget goes to multigrid without the probe, as on a Poisson problem (here
    Jacobi-PCG takes 6 iterations to 0.5 and 135 to 1e-10)."""
    A = laplacian_1d(2000, shift=0.03)
    b = np.random.default_rng(0).normal(size=2000)
    lu = spla.splu(A.tocsc())
    auto = JacobiThenMultigrid()
    built = []
    first = auto.solve(lambda p: A @ p, b, 1 / A.diagonal(), lambda: built.append(1) or lu.solve,
                       max_iterations=500, tolerance=0.5)
    assert first.reason == "tolerance" and not built
    assert auto.rate * 10 > FIRST_BUDGET  # ten decades at this rate exceed the budget
    second = auto.solve(lambda p: A @ p, b, 1 / A.diagonal(), lambda: built.append(1) or lu.solve,
                        max_iterations=500, tolerance=1e-10)
    assert built == [1] and second.iterations == 1 and auto.predicted == 1


def test_jacobi_then_multigrid_extends_a_probe_that_failed_close_to_its_tolerance():
    """A probe that runs out of budget where its rate says the tolerance is at most one more
    budget away goes on with Jacobi (restarted on its residual) instead of building the
    multigrid hierarchy; the combined step solves the system to the tolerance and carries the
    true residual (b - A x) and every iteration."""
    A = laplacian_1d(2000, shift=0.03)  # Jacobi-PCG: 6 iterations to 0.5, ~135 to 1e-10
    b = np.random.default_rng(0).normal(size=2000)
    auto = JacobiThenMultigrid()
    auto.budget = 20

    def never():
        raise AssertionError("multigrid built for a system Jacobi was about to finish")

    res = auto.solve(lambda p: A @ p, b, 1 / A.diagonal(), never, max_iterations=500, tolerance=1e-2)
    assert res.reason == "tolerance" and res.iterations > 20 and auto.extended == 1
    np.testing.assert_allclose(res.residual, b - A @ res.x, atol=1e-10 * np.linalg.norm(b))
    assert np.linalg.norm(b - A @ res.x) <= 1e-2 * np.linalg.norm(b)
    assert res.rhs_norm == pytest.approx(np.linalg.norm(b))


class WorkClock:
    """A clock that advances by the work done (products, setups, V-cycles at fixed prices),
    plus, when ``spikes`` is set, a preemption of 100 setups' time after every ``spikes``-th
    reading: the timings a loaded machine gives."""

    def __init__(self, spikes=0):
        self.now, self.readings, self.spikes = 0.0, 0, spikes

    def __call__(self):
        self.readings += 1
        if self.spikes and self.readings % self.spikes == 0:
            self.now += 100.0 * SETUP
        return self.now


SETUP, PRODUCT, VCYCLE = 20.0, 1.0, 2.0


def run_choices(clock, systems):
    """Which systems the adaptive choice sent to multigrid, for a fixed sequence of easy and
    hard systems, timed by ``clock``."""
    A_easy, A_hard = laplacian_1d(400, shift=3.0), laplacian_1d(400, shift=1e-4)
    b = np.random.default_rng(0).normal(size=400)
    auto = JacobiThenMultigrid(clock=clock)
    choices = []
    for hard in systems:
        A = A_hard if hard else A_easy
        lu = spla.splu(A.tocsc())
        built = []

        def apply_A(p, A=A):
            clock.now += PRODUCT
            return A @ p

        def multigrid(lu=lu, built=built):
            clock.now += SETUP
            built.append(1)

            def cycle(r):
                clock.now += VCYCLE
                return lu.solve(r)
            return cycle

        auto.solve(apply_A, b, 1 / A.diagonal(), multigrid, max_iterations=500, tolerance=1e-8)
        choices.append(bool(built))
    return choices, auto.budget


def test_jacobi_then_multigrid_choices_survive_timing_spikes(monkeypatch):
    """The Jacobi / multigrid choice prices each kind of work by the low median of its recent
    timings, so preemptions that inflate some of them (every 7th clock reading jumps by 100
    setups) leave every choice and the final probe budget as they are without them. Priced
    by single timings (a window of one, as before), the same spikes change the choices."""
    import lsq_opt._solver.adaptive as adaptive

    systems = [True, True, False, False, False, False, True, True, True, False, False, False, False,
               True, True, False]
    quiet, quiet_budget = run_choices(WorkClock(), systems)
    noisy, noisy_budget = run_choices(WorkClock(spikes=7), systems)
    assert noisy == quiet and noisy_budget == quiet_budget
    assert sum(c for c, hard in zip(quiet, systems) if hard) >= 6
    assert any(not c for c, hard in zip(quiet, systems) if not hard)
    monkeypatch.setattr(adaptive, "PRICE_WINDOW", 1)
    single, single_budget = run_choices(WorkClock(spikes=7), systems)
    assert single != quiet and single_budget > 10 * quiet_budget  # a spiked setup's price


def test_lm_forcing_measures_the_undamped_model(monkeypatch):
    """On a linear problem the undamped model g + J^T J s predicts the next gradient exactly, so
    after a heavily damped first step the forcing term drops to its minimum (1e-8 in float64);
    the damped PCG residual g + (J^T J + D) s would keep it near the first step's 0.1."""
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(40, 10)), rng.normal(size=40)
    problem = DenseProblem(lambda x: A @ x - b, lambda x: A, 10)
    tolerances = record_pcg_argument(monkeypatch, "tolerance")
    res = solve(problem, np.zeros(10), initial_trust_region_radius=1e-2, max_iterations=3)
    assert res.log[0].accepted and tolerances[0] == FORCING_INITIAL
    assert tolerances[1] == 1e-8


def test_lm_reject_radius_caps_mu_at_the_step_curvature():
    from lsq_opt._solver import lm_reject_radius

    # damping along the step 1e-6 of its curvature at mu_used = 1e8: cap 1e8 * 1e-6 = 100
    assert lm_reject_radius(5e7, 1e8, 1e-6, 1.0) == pytest.approx(100.0)
    assert lm_reject_radius(5.0, 10.0, 2.0, 1.0) == 5.0  # damping already dominant: mu / nu stays
    for bad in ((0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))):
        assert lm_reject_radius(5e7, 1e8, *bad) == 5e7


def _rosenbrock():
    fun = lambda x: np.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])  # noqa: E731
    jac = lambda x: np.array([[-20.0 * x[0], 10.0], [-1.0, 0.0]])  # noqa: E731
    return DenseProblem(fun, jac, 2), fun, jac


def test_rejection_lowers_mu_to_the_rejected_steps_curvature():
    """Rosenbrock from (-1.2, 1) at mu0 = 1e8: the nearly undamped Gauss-Newton step goes to
    (1, -3.84) and is rejected. The default next mu is where the damping along that step equals
    its curvature (dense reference below), not mu0 / 2, which would repeat almost the same step;
    spec §4.3's rule alone (the paper preset's) is kept by the option."""
    problem, fun, jac = _rosenbrock()
    x0 = np.array([-1.2, 1.0])
    kw = dict(initial_trust_region_radius=1e8, pcg_tolerance=1e-15, pcg_max_iterations=10)
    res = solve(problem, x0, **kw)
    J = jac(x0)
    diag = (J * J).sum(0)
    s = (1 + np.sqrt(diag)) ** 2
    D = np.clip(diag, 1e-6 * s, 1e32 * s) / 1e8
    delta = np.linalg.solve(J.T @ J + np.diag(D), -J.T @ fun(x0))
    expected = 1e8 * (delta @ (D * delta)) / (delta @ (J.T @ J @ delta))
    assert not res.log[0].accepted and expected < 1e8 / 2
    assert res.log[1].mu == pytest.approx(expected, rel=1e-9)
    spec_rule = solve(problem, x0, reject_to_step_curvature=False, **kw)
    assert spec_rule.log[1].mu == 1e8 / 2
    # both reach the minimum (1, 1); the default with fewer rejected steps
    for r in (res, spec_rule):
        np.testing.assert_allclose(r.x, [1.0, 1.0], atol=1e-6)
    rejected = [sum(not e.accepted for e in r.log) for r in (res, spec_rule)]
    assert rejected[0] < rejected[1], rejected
    assert SolverOptions().reject_to_step_curvature and not SolverOptions.paper().reject_to_step_curvature


def test_rejected_step_stops_on_function_tolerance_only_when_the_model_expected_nothing():
    """Ceres stops on any step whose cost change is within function_tolerance; a rejected step
    the model expected a real decrease from is a bad step, not convergence. Here the Jacobian
    promises a decrease of ~0.5 per unit step and the cost barely moves: the first rejected
    step (|dc| ~ 1e-9) does not stop the solve; it ends once the model's own prediction is
    within the tolerance too (with the slope check off: this Jacobian is not the residual's
    derivative, and by default the solve stops at the first rejection, "no descent")."""
    fun = lambda x: np.array([1.0 + 1e-9 * x[0] ** 2])  # noqa: E731
    problem = DenseProblem(fun, lambda x: np.array([[-1.0]]), 1)
    default = solve(problem, np.zeros(1), max_iterations=200)
    assert default.termination_reason == "no descent" and len(default.log) == 1
    res = solve(problem, np.zeros(1), max_iterations=200, slope_check=False)
    first, last = res.log[0], res.log[-1]
    tiny = 1e-6 * 0.5
    assert not first.accepted and abs(first.cost_change) <= tiny < first.model_cost_change
    assert len(res.log) > 1 and res.termination_reason == "function tolerance"
    assert not last.accepted and abs(last.cost_change) <= tiny and last.model_cost_change <= tiny


def test_linear_problem_stops_after_the_exact_step_on_the_predicted_decrease():
    """LM on a linear least-squares problem: the second step's forcing term is at its floor
    (the model is exact), but its PCG stops once its own estimate of the model decrease left
    is below function_tolerance / 10 of the cost ("decrease tolerance"); that estimate (plus
    the model's error, round-off here) then says a third step could not gain more either: the
    solve stops there ("function tolerance", predicted) within function_tolerance / 10 of
    the cost the third step would have reached, with fewer PCG iterations and one solve less."""
    plan = smoothing_plan(80, 64)
    res = solve(plan, plan.x0)
    without = solve(plan, plan.x0, predicted_stop=False)
    assert res.termination_reason == "function tolerance"
    assert "the next step could change the cost by at most" in res.termination_detail
    assert res.iterations == 2 and without.iterations == 3
    assert res.log[1].pcg_reason == "decrease tolerance"
    assert res.log[1].pcg_iterations < without.log[1].pcg_iterations
    assert without.cost <= res.cost <= without.cost * (1 + 1e-7)
    assert not SolverOptions.paper().predicted_stop


def test_predicted_stop_does_not_end_a_nonlinear_solve_early():
    """On a non-quadratic energy (a Charbonnier-type regulariser) the model's error |dc - dm|
    keeps the predicted stop from firing before the plain function tolerance would."""
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    terms = [X(0, 0) - A(0, 0)]
    for off in ((1, 0), (0, 1)):
        d = X(0, 0) - X(*off)
        terms.append(0.4 * d * (d * d + 0.02 ** 2) ** -0.25)
    noisy = np.random.default_rng(2).random((48, 40))
    plan = compile_problem(Energy(*terms), arrays={"A": noisy, "X": noisy.copy()})
    res = solve(plan, plan.x0)
    without = solve(plan, plan.x0, predicted_stop=False)
    assert res.iterations == without.iterations and res.cost == without.cost


def test_damping_held_back_measures_what_the_damping_withheld():
    """A damped step solved exactly on an exact model still leaves the undamped model's
    decrease; ``damping_held_back`` estimates it: for ``D = c diag`` on a diagonal system it is
    that decrease (the undamped model's minus the damped step's, ``U c^2 / (1 + c)^2``) over
    ``1 + c``, and where a clamp dominates a low-curvature unknown it is ``1/2 s_i D_i s_i``.
    The predicted stop adds it to PCG's estimate."""
    from lsq_opt._solver.levenberg_marquardt import damping_held_back, next_step_decrease
    from lsq_opt._solver.pcg import pcg
    from lsq_opt._solver.vectors import VectorOps

    ops = VectorOps(np)
    diag = np.linspace(1.0, 4.0, 12)
    g = np.ones(12)
    for c in (1e-3, 0.5):
        s = -g / ((1 + c) * diag)
        undamped_gain = 0.5 * g @ (g / diag)
        damped_model = -(g @ s + 0.5 * s @ (diag * s))
        held = damping_held_back(c * diag, s, diag, ops)
        assert held == pytest.approx((undamped_gain - damped_model) / (1 + c), rel=1e-10)
    tiny = np.array([1e-9, 1.0])
    D = np.array([1e-3, 1e-3])
    s = np.array([1.0, 0.0])
    assert damping_held_back(D, s, tiny, ops) == pytest.approx(0.5 * 1e-3, rel=1e-5)
    A = 2.01 * np.eye(40) - np.eye(40, k=1) - np.eye(40, k=-1)
    res = pcg(lambda p: A @ p, np.ones(40), 1.0 / np.diag(A), max_iterations=100, tolerance=1e-12)
    assert next_step_decrease(res, 1.0, 1.0, 0.0) < 1e-20
    assert next_step_decrease(res, 1.0, 1.0, 0.25) == pytest.approx(0.25)
    # cheapest first: past the limit, the damping's share and the Ritz value are not computed
    assert next_step_decrease(res, 1.0, 0.5, lambda: pytest.fail("computed"), limit=0.1) == 0.5


def test_extended_step_length_is_the_parabolas_minimiser_capped():
    from lsq_opt._solver.levenberg_marquardt import EXTEND_MAX, extended_step_length

    def along(slope, curvature):  # cost(t) = 3 + slope t + curvature t^2 / 2: (cost, cost(1), slope)
        return 3.0, 3.0 + slope + 0.5 * curvature, slope

    assert extended_step_length(*along(-2.0, 1.0)) == pytest.approx(2.0, rel=1e-12)
    assert extended_step_length(*along(-2.0, 0.1)) == EXTEND_MAX  # t* = 20, capped
    assert extended_step_length(*along(-1.0, 2.0)) == 1.0  # t* = 0.5: the solved step is longer
    assert extended_step_length(*along(-1.0, -1.0)) == 1.0  # concave: no minimiser
    assert extended_step_length(*along(1.0, 1.0)) == 1.0  # not a descent direction
    assert extended_step_length(3.0, float("nan"), -1.0) == 1.0


def negative_curvature_problem(big=1e6):
    """r = (x, sqrt(big - x^2 / 2)): cost = x^2 / 4 + big / 2 is a parabola of curvature 1/2,
    while J^T J ~ 1: each Gauss-Newton step halves x (rho ~ 1.5)."""
    def fun(x):
        return np.array([x[0], np.sqrt(big - 0.5 * x[0] ** 2)])

    def jac(x):
        return np.array([[1.0], [-0.5 * x[0] / np.sqrt(big - 0.5 * x[0] ** 2)]])
    return DenseProblem(fun, jac, 1)


def test_step_extension_reaches_the_minimiser_of_a_quadratic_cost_in_one_step():
    prob = negative_curvature_problem()
    ext = solve(prob, np.array([8.0]), gradient_tolerance=1e-14, function_tolerance=1e-14)
    plain = solve(prob, np.array([8.0]), gradient_tolerance=1e-14, function_tolerance=1e-14,
                  step_extension=False)
    first = ext.log[0]
    assert first.accepted and first.rho > 1.4
    # the parabola through cost(x), g.d and cost(x + d) is the cost itself: its minimiser x = 0
    assert first.cost == pytest.approx(0.5e6, rel=1e-15)
    assert plain.log[0].cost - 0.5e6 == pytest.approx(0.25 * 4.0 ** 2, rel=1e-4)  # x = 8 -> ~4
    assert ext.converged and plain.converged
    assert ext.iterations < plain.iterations
    assert abs(ext.x[0]) < 1e-6 and ext.cost <= plain.cost


def test_step_extension_on_an_arap_mesh_same_minimum_fewer_iterations():
    from lsq_opt.examples import mesh as mesh_example

    plan = mesh_example.arap_plan(32, 16)[0]  # the benchmark size: 43 against 50 iterations
    fixed_cap = dict(pcg_max_iterations=100)  # without the cap's own rule (missed models)
    ext = solve(plan, plan.x0, **fixed_cap)
    plain = solve(plan, plan.x0, step_extension=False, **fixed_cap)
    assert ext.converged and plain.converged
    assert ext.cost <= plain.cost * (1 + 1e-6)
    assert ext.iterations < plain.iterations
    assert SolverOptions.paper().step_extension is False


def test_forcing_tightens_after_a_run_of_poorly_predicted_steps():
    from lsq_opt._solver.levenberg_marquardt import ForcingSequence
    from lsq_opt._solver.options import POOR_STEP_FORCING, POOR_STEP_RHO, POOR_STEP_RUN

    def tolerance_after(rhos):
        f = ForcingSequence(SolverOptions(), np.dtype(np.float64))
        for rho in rhos:
            f.step_taken(1.0, 0.01, rho)
            f.new_gradient(5.0)  # a poorly modelled gradient: Eisenstat-Walker says FORCING_MAX
        return f.tolerance()

    poor, good = 0.5 * POOR_STEP_RHO, 1.0
    assert tolerance_after([good] * 3) == FORCING_MAX
    assert tolerance_after([poor] * (POOR_STEP_RUN - 1)) == FORCING_MAX  # one mediocre step: no
    assert tolerance_after([poor] * POOR_STEP_RUN) == POOR_STEP_FORCING
    assert tolerance_after([poor] * POOR_STEP_RUN + [good]) == FORCING_MAX  # a good step resets
    # a fixed pcg_tolerance is never changed
    f = ForcingSequence(SolverOptions(pcg_tolerance=0.3), np.dtype(np.float64))
    for _ in range(3):
        f.step_taken(1.0, 0.01, poor)
        f.new_gradient(5.0)
    assert f.tolerance() == 0.3


def test_pcg_cap_shrinks_after_a_step_the_model_missed():
    from lsq_opt._solver.levenberg_marquardt import ForcingSequence
    from lsq_opt._solver.options import AUTO_PCG_MAX_ITERATIONS, MODEL_ERROR_PCG_CAP, MODEL_ERROR_RHO

    f = ForcingSequence(SolverOptions(), np.dtype(np.float64))
    assert f.max_iterations() == AUTO_PCG_MAX_ITERATIONS
    for rho, cap in ((1 + 2 * MODEL_ERROR_RHO, MODEL_ERROR_PCG_CAP), (1.0, AUTO_PCG_MAX_ITERATIONS),
                     (1 - 2 * MODEL_ERROR_RHO, MODEL_ERROR_PCG_CAP), (float("nan"), AUTO_PCG_MAX_ITERATIONS),
                     (1 + 0.5 * MODEL_ERROR_RHO, AUTO_PCG_MAX_ITERATIONS)):
        f.step_taken(1.0, 0.01, rho)
        assert f.max_iterations() == cap, rho
    # a cap the user set is never changed
    fixed = ForcingSequence(SolverOptions(pcg_max_iterations=80), np.dtype(np.float64))
    fixed.step_taken(1.0, 0.01, 2.0)
    assert fixed.max_iterations() == 80


def test_arap_mesh_takes_capped_solves_after_missed_steps_to_the_same_minimum(monkeypatch):
    import sys

    from lsq_opt.examples import mesh as mesh_example

    lm = sys.modules["lsq_opt._solver.levenberg_marquardt"]
    plan = mesh_example.arap_plan(32, 16)[0]
    caps = record_pcg_argument(monkeypatch, "max_iterations")
    res = solve(plan, plan.x0)
    caps = caps[:]  # the later solves record too
    assert res.converged, res.termination_detail
    missed, binding = False, 0
    for entry, cap in zip(res.log, caps):
        assert cap == (lm.MODEL_ERROR_PCG_CAP if missed else 100)
        binding += cap == lm.MODEL_ERROR_PCG_CAP and entry.pcg_reason == "max iterations"
        if entry.accepted:
            missed = abs(entry.rho - 1.0) > lm.MODEL_ERROR_RHO
    assert binding >= 3  # the cap cut solves short
    full = solve(plan, plan.x0, pcg_max_iterations=100)  # the full cap throughout
    assert res.cost == pytest.approx(full.cost, rel=1e-5)


def test_poor_step_forcing_ends_a_spring_network_crawl_at_the_same_minimum(monkeypatch):
    import sys

    lm = sys.modules["lsq_opt._solver.levenberg_marquardt"]
    plan = spring_network(12, 8)  # LM crawls on it with rho ~ 1/2
    mf = dict(linear_system="matrix_free")  # "auto"'s timed choices move the rounding
    tolerances = record_pcg_argument(monkeypatch, "tolerance")
    res = solve(plan, plan.x0, **mf)
    tolerances = tolerances[:]  # the later solves record too
    assert res.converged, res.termination_detail
    # every solve after a run of accepted poor steps asked for at most POOR_STEP_FORCING
    run, checked = 0, 0
    for entry, tol_next in zip(res.log, tolerances[1:]):
        if entry.accepted:
            run = run + 1 if entry.rho < lm.POOR_STEP_RHO else 0
            if run >= lm.POOR_STEP_RUN:
                assert tol_next <= lm.POOR_STEP_FORCING
                checked += 1
    assert checked > 5
    # the same minimum as tight inner solves, in fewer iterations than without the rule
    tight = solve(plan, plan.x0, pcg_tolerance=1e-10, **mf)
    assert res.cost == pytest.approx(tight.cost, rel=1e-5)
    monkeypatch.setattr(lm, "POOR_STEP_RUN", 10 ** 9)
    without = solve(plan, plan.x0, **mf)
    assert without.cost == pytest.approx(tight.cost, rel=1e-5)
    assert res.iterations < 0.8 * without.iterations  # measured: 59 against 85


def test_solves_without_the_timed_choices_are_repeatable():
    """The defaults pick the linear system ("auto") and, on large grids, Jacobi or multigrid
    by measured CPU prices; the choices change only rounding, but where LM crawls the
    iterates then part (a 40 x 25 spring network: 233 or 278 iterations from one script).
    With both fixed (README "Repeatable solves"), two solves agree to the bit."""
    plan = spring_network(12, 8)
    first, second = (solve(plan, plan.x0, linear_system="matrix_free", preconditioner="jacobi")
                     for _ in range(2))
    assert first.converged and first.iterations == second.iterations
    np.testing.assert_array_equal(first.x, second.x)
    assert first.cost == second.cost
