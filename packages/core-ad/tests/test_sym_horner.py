"""sym.horner: greedy multivariate Horner factoring, conditions as boolean factors."""
import numpy as np
import pytest

from core_ad import sym


def _ops(e, name):
    return sum(1 for n in sym.toposort(e) if isinstance(n, sym.Apply) and n.prim.name == name)


def _agree(a, b, vars_, rtol=1e-13):
    f = sym.compile([a, b], vars_, backend="numpy")
    rng = np.random.default_rng(0)
    va, vb = f(*rng.standard_normal((len(vars_), 200)))
    np.testing.assert_allclose(va, vb, rtol=rtol, atol=1e-13)


def test_pulls_out_the_most_shared_factor_with_its_smallest_power():
    x, y, z = sym.var("x"), sym.var("y"), sym.var("z")
    e = x**2 * y + x**3 * z + x * y * z + 4.0 * y
    h = sym.horner(e)
    _agree(e, h, [x, y, z])
    assert _ops(h, "mul") + _ops(h, "pow") < _ops(e, "mul") + _ops(e, "pow")
    # x is in three monomials, y in three: the first seen (x) goes out, at power 1, twice
    assert _ops(h, "pow") == 0
    assert sym.to_str(h) == "((4.0 * y) + (x * ((((x * z) + y) * x) + (y * z))))"


def test_shared_conditions_are_tested_once():
    x, y, z, a = (sym.var(n) for n in "xyza")
    c = a > 0
    terms = [sym.where(c, x * y, 0.0), sym.where(c, y * z, 0.0), 2.0 * sym.where(c, x, 0.0),
             sym.where(sym.logical_and(c, x > 0), z, 0.0), z]
    e = sum(terms[1:], terms[0])
    assert _ops(e, "select") == 4
    h = sym.horner(e, numeric=False)
    assert _ops(h, "select") == 2 and _ops(h, "gt") == 2  # c once, then x > 0 inside it
    _agree(e, h, [x, y, z, a])
    # conditions off and numeric off: nothing to do
    assert sym.horner(e, numeric=False, conditions=False) is e


def test_conditions_win_over_float_factors():
    x, y, a = sym.var("x"), sym.var("y"), sym.var("a")
    c = a > 0
    e = sym.where(c, x * y, 0.0) + sym.where(c, x, 0.0) + x * a
    h = sym.horner(e)
    _agree(e, h, [x, y, a])
    # the outermost factoring is by the condition, although x is in all three terms
    assert sym.to_str(h) == "(select(gt(a, 0.0), (x * (1.0 + y)), 0.0) + (a * x))"
    assert _ops(h, "select") == 1


def test_whole_dag_and_lists():
    x, y = sym.var("x"), sym.var("y")
    inner = x * y + x
    e1 = sym.exp(inner) * y + sym.exp(inner) * x
    out = sym.horner([e1, inner])
    assert isinstance(out, list) and len(out) == 2
    _agree(e1, out[0], [x, y])
    _agree(inner, out[1], [x, y])
    assert _ops(out[0], "exp") == 1


def test_factored_masked_term_is_zero_not_nan_where_false():
    x, a = sym.var("x"), sym.var("a")
    e = sym.log(x) * sym.where(a > 0, x, 0.0) + sym.where(a > 0, x * x, 0.0)
    h = sym.horner(e)
    f = sym.compile([e, h], [x, a], backend="numpy")
    with np.errstate(invalid="ignore"):
        ve, vh = f(np.array([-1.0, 2.0]), np.array([-1.0, 1.0]))
    assert np.isnan(ve[0]) and vh[0] == 0.0
    assert vh[1] == pytest.approx(ve[1], rel=1e-15)


def test_rejects_non_expressions():
    with pytest.raises(TypeError):
        sym.horner("x")
