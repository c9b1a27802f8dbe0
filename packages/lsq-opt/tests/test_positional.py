"""Opt's positional binding (spec [D] 5): Fig. 33 written with the paper's binding indices
(0, 1, 2, 4, 5, 5, 6, 8; ``r_const`` shares ``r``'s index 5 and is its constant view) solves
exactly like the by-name intrinsic example; every mismatch between the positional values and
the declared indices is a named error."""

import numpy as np
import pytest

from lsq_opt import (Array, ComputedArray, Dim, Energy, LsqCompileError, Param, Unknown,
                     compile_problem, solve)
from lsq_opt._compiler.positional import PositionalBindingError
from lsq_opt.examples import intrinsic


def fig33_energy():
    """The listing of Fig. 33, binding indices exactly as printed."""
    return intrinsic.energy(intrinsic.FIG33_INDICES)


def _positional(img, p_norm=0.8):
    P = intrinsic.PARAMS
    W, H = img.shape[:2]
    return [P["w_fitSqrt"], P["w_regSqrtAlbedo"], P["w_regSqrtShading"], None, p_norm,
            img.copy(), img, None, np.zeros((W, H))]


def test_fig33_by_position_solves_like_the_by_name_example():
    img, _, _ = intrinsic.make_data((12, 8))
    by_pos = compile_problem(fig33_energy(), positional=_positional(img))
    by_name = intrinsic.plan_for(img, 0.8)
    assert by_pos.n == by_name.n
    np.testing.assert_array_equal(by_pos.x0, by_name.x0)
    kw = dict(method="gn", max_iterations=4, pcg_max_iterations=50, pcg_tolerance=1e-12,
              function_tolerance=0.0)
    a, b = solve(by_pos, by_pos.x0, **kw), solve(by_name, by_name.x0, **kw)
    assert a.cost < 0.5 * a.initial_cost  # IRLS made progress (the weights are refreshed)
    np.testing.assert_allclose(a.cost, b.cost, rtol=1e-12)
    np.testing.assert_allclose(a.x, b.x, rtol=1e-10, atol=1e-12)


def test_the_aliased_array_is_the_unknowns_constant_view_not_data():
    """Bound by position, r_const is not a data array holding r's initial values but the
    constant view of r, refreshed at every linearisation (the IRLS weights follow the iterate)."""
    img, _, _ = intrinsic.make_data((12, 8))
    plan = compile_problem(fig33_energy(), positional=_positional(img))
    assert "r_const" not in plan.data
    assert set(plan.views.values()) == {"r"}


def test_positional_and_by_name_mix_for_declarations_without_an_index():
    W = Dim("W")
    x = Unknown("x", (W,), index=0)
    target = Array("target", (W,))  # no index: by name
    w = Param("w", index=1)
    plan = compile_problem(Energy(w * (x(0) - target(0))), positional=[np.zeros(5), 2.0],
                           arrays={"target": np.arange(5.0)})
    res = solve(plan, plan.x0)
    np.testing.assert_allclose(res.x, np.arange(5.0), atol=1e-8)


def test_computed_arrays_keep_binding_indices_when_shifted():
    W = Dim("W")
    x = Unknown("x", (W,), index=0)
    d = Array("d", (W,), index=1)
    smooth = ComputedArray("smooth", (W,), 0.5 * (d(0) + d(1)))
    e = Energy(x(0) - smooth(1))  # reads d(1) and d(2) through the shifted expression
    data = np.arange(8.0) ** 2
    plan = compile_problem(e, positional=[np.zeros(8), data])
    res = solve(plan, plan.x0)
    expect = 0.5 * (data[1:-1] + data[2:])
    np.testing.assert_allclose(plan.vector_to_unknowns(res.x)["x"][:6], expect, atol=1e-8)


def _tiny(**idx):
    W = Dim("W")
    x = Unknown("x", (W,), index=idx.get("x", 0))
    a = Array("a", (W,), idx.get("a_ch", 1), index=idx.get("a", 1))
    w = Param("w", index=idx.get("w", 2))
    return Energy(w * (x(0) - a(0, 0)))


@pytest.mark.parametrize("values, match", [
    ([np.zeros(4), np.ones(4)], "nothing at binding index 2"),
    ([np.zeros(4), None, 1.0], "nothing at binding index 1"),
    ([np.zeros(4), np.ones(4), 1.0, 7.0], r"values at indices \[3\] bind nothing"),
])
def test_positional_values_must_match_the_declared_indices(values, match):
    with pytest.raises(PositionalBindingError, match=match):
        compile_problem(_tiny(), positional=values)


def test_positional_binding_errors_name_the_problem():
    values = [np.zeros(4), np.ones(4), 1.0]
    with pytest.raises(PositionalBindingError, match="'a' is bound twice"):
        compile_problem(_tiny(), positional=values, arrays={"a": np.ones(4)})
    with pytest.raises(PositionalBindingError, match="only an Array of the same dims and channels"):
        compile_problem(_tiny(a=0, a_ch=2), positional=[np.zeros(4), None, 1.0])
    with pytest.raises(PositionalBindingError, match="a Param and an array"):
        compile_problem(_tiny(w=1), positional=[np.zeros(4), np.ones(4)])
    W = Dim("W")
    two = Energy(Unknown("x", (W,), index=0)(0) - Unknown("y", (W,), index=0)(0))
    with pytest.raises(PositionalBindingError, match="declared by two unknowns"):
        compile_problem(two, positional=[np.zeros(4)])
    plain = Energy(Unknown("x", (W,))(0) - 1.0)
    with pytest.raises(PositionalBindingError, match="no declaration the energy reads has a binding"):
        compile_problem(plain, positional=[np.zeros(4)])
    with pytest.raises(TypeError, match="positional must be a list or tuple"):
        compile_problem(_tiny(), positional={0: np.zeros(4)})
    with pytest.raises(TypeError, match="binding index must be a non-negative integer"):
        Unknown("x", (W,), index=-1)
    with pytest.raises(TypeError, match="binding index must be a non-negative integer"):
        Param("w", index=1.5)
    assert issubclass(PositionalBindingError, LsqCompileError)
