"""Strict names and clear errors at the solver's entry (each of these was silent before)."""
import numpy as np
import pytest
from lsq_opt import (Array, Dim, Energy, Graph, LsqCompileError, Param, SolverOptions, Unknown,
                     compile_problem,
                     solve, sqrt)

W, H, N = Dim("W"), Dim("H"), Dim("N")


def fit_energy():
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    return Energy(Param("w") * (X(0, 0) - A(0, 0)), X(0, 0) - X(1, 0))


def test_misspelled_initial_value_is_an_error_naming_expected_names():
    with pytest.raises(LsqCompileError) as ei:
        compile_problem(fit_energy(), arrays={"A": np.ones((5, 4)), "x": np.ones((5, 4))},
                        params={"w": 1.0})
    msg = str(ei.value)
    assert "'x'" in msg and "'A'" in msg and "'X'" in msg


def test_unused_param_and_graph_are_errors():
    with pytest.raises(LsqCompileError, match=r"params \['W_fit'\].*expected names: \['w'\]"):
        compile_problem(fit_energy(), arrays={"A": np.ones((5, 4))}, params={"w": 1.0, "W_fit": 2.0})
    with pytest.raises(LsqCompileError, match=r"graphs \['G'\] are not read"):
        compile_problem(fit_energy(), arrays={"A": np.ones((5, 4))}, params={"w": 1.0},
                        graphs={"G": {"v0": np.zeros(2, int)}})


def test_ignore_unused_binds_a_shared_dict():
    plan = compile_problem(fit_energy(), arrays={"A": np.ones((5, 4)), "B": np.zeros(3)},
                           params={"w": 1.0, "other": 2.0}, ignore_unused=True)
    assert plan.n == 20


def test_nonfinite_initial_cost_names_term_and_pixel():
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    data = np.ones((6, 5))
    data[3, 2] = -4.0  # sqrt of a negative: nan in term 1 at pixel (3, 2)
    plan = compile_problem(Energy(X(0, 0) - A(0, 0), sqrt(A(0, 0)) * X(0, 0) + 1.0),
                           arrays={"A": data})
    with pytest.raises(ValueError, match=r"residual term 1 channel 0 is nan at pixel \(3, 2\)"):
        solve(plan, plan.x0)


def test_nonfinite_initial_cost_names_graph_edge():
    X = Unknown("X", (N,))
    G = Graph("G", v0=N, v1=N)
    x0 = np.ones(6)
    x0[4] = np.inf
    plan = compile_problem(Energy(X(G.v0) - X(G.v1)), arrays={"X": x0},
                           graphs={"G": {"v0": np.array([0, 1, 2, 3]), "v1": np.array([1, 2, 4, 5])}})
    with pytest.raises(ValueError, match=r"residual term 0 channel 0 is -?inf at edge 2 of graph 'G' "
                                         r"\(slots \{'v0': 2, 'v1': 4\}\)"):
        solve(plan, plan.x0)


@pytest.mark.parametrize("method", ["lm", "gn"])
@pytest.mark.parametrize("stop", [np.True_, 1, "yes"])
def test_callback_result_by_truth_value(method, stop):
    X, A = Unknown("X", (W, H)), Array("A", (W, H))
    plan = compile_problem(Energy(X(0, 0) - A(0, 0), 3.0 * (X(0, 0) - X(1, 0))),
                           arrays={"A": np.random.default_rng(0).random((9, 7))})
    res = solve(plan, plan.x0, method=method, callback=lambda entry, x: stop)
    assert res.termination_reason == "user callback" and res.iterations == 1
    res = solve(plan, plan.x0, method=method, callback=lambda entry, x: np.False_)
    assert res.termination_reason != "user callback"


def test_options_passed_as_the_method_are_a_named_error():
    plan = compile_problem(fit_energy(), arrays={"A": np.ones((5, 4))}, params={"w": 1.0})
    with pytest.raises(TypeError, match=r"method must be 'lm' or 'gn', got SolverOptions "
                                        r"\(options go by keyword"):
        solve(plan, plan.x0, SolverOptions(verbose=True))
    with pytest.raises(ValueError, match="unknown method 'newton'"):
        solve(plan, plan.x0, "newton")
