"""core_ad.sym error paths: every error names what went wrong (type and message checked)."""

from __future__ import annotations

import numpy as np
import pytest

from core_ad import _rules as R
from core_ad import sym
from core_ad._primitives import Primitive, bind


@pytest.fixture
def xy():
    return sym.var("x"), sym.var("y")


# --------------------------------------------------------------------------------------------
# non-IR operands


@pytest.mark.parametrize(
    "bad, name",
    [("foo", "str"), ([1.0, 2.0], "list"), ({"a": 1}, "dict"), (object(), "object")],
)
def test_non_ir_operands_name_their_type(bad, name, xy):
    x, _ = xy
    with pytest.raises(TypeError, match=rf"type {name}\b"):
        sym.exp(bad)
    with pytest.raises(TypeError, match=rf"type {name}\b"):
        sym.add(x, bad)
    with pytest.raises(TypeError, match=rf"type {name}\b"):
        x * bad
    with pytest.raises(TypeError, match=rf"type {name}\b"):
        bad - x
    with pytest.raises(TypeError, match=rf"type {name}\b"):
        R.exp(R.add(x, bad))  # the rule table's math on an Expr reaches the same check


def test_arrays_are_not_scalars(xy):
    x, _ = xy
    with pytest.raises(TypeError, match=r"per-lane scalars.*shape \(3,\)"):
        sym.exp(np.ones(3))
    with pytest.raises(TypeError, match=r"per-lane scalars.*shape \(2, 2\)"):
        x + np.ones((2, 2))
    with pytest.raises(TypeError, match=r"shape \(3,\)"):
        sym.const(np.ones(3))
    assert sym.is_const(x * np.float64(0.0), 0)  # numpy scalars and 0-d arrays are fine
    assert sym.is_const(sym.exp(np.array(0.0)), 1)


def test_structural_primitive_is_rejected(xy):
    x, y = xy
    with pytest.raises(TypeError, match=r"primitive 'reduce_sum' is not lane-wise; symbolic"
                                        r" expressions are per-lane scalars"):
        bind(R.reduce_sum_p, x, axes=(), keepdims=False)
    with pytest.raises(TypeError, match=r"primitive 'matmul' is not lane-wise"):
        sym.call(R.matmul_p, x, y)
    with pytest.raises(TypeError, match=r"primitive 'take' is not lane-wise"):
        bind(R.take_p, x, indices=np.array([0]), axis=0, name=None)


def test_truth_value_is_refused(xy):
    x, y = xy
    with pytest.raises(TypeError, match=r"truth value of a symbolic expression.*sym\.where"):
        bool(x > y)
    with pytest.raises(TypeError, match="truth value"):
        if x < 1:  # noqa: SIM108 - the point of the test
            pass


def test_nodes_are_immutable(xy):
    x, _ = xy
    e = sym.sin(x)
    with pytest.raises(AttributeError, match="immutable"):
        e.args = (x,)
    with pytest.raises(AttributeError, match="immutable"):
        x.dtype = np.float32
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(e)


def test_leaf_and_var_arguments():
    with pytest.raises(TypeError, match="not hashable"):
        sym.leaf("X", {"a": 1})
    with pytest.raises(TypeError, match="kind must be a non-empty string"):
        sym.leaf(3, (0, 0))
    with pytest.raises(TypeError, match="name must be a string, got int"):
        sym.var(3)
    with pytest.raises(TypeError, match="data type"):
        sym.var("x", "not-a-dtype")


def test_call_arguments(xy):
    x, _ = xy
    with pytest.raises(TypeError, match="expected a Primitive, got str"):
        sym.call("exp", x)
    prim = Primitive("test_err_unhashable", lambda a, table: a, elementwise=True,
                     partials=lambda args, out, wrt, table: (None,))
    with pytest.raises(TypeError, match=r"parameter table=.* of type set is not hashable"):
        sym.call(prim, x, table={1, 2})
    opaque = Primitive("test_err_opaque", lambda a: a.no_such_method(), elementwise=True,
                       partials=lambda args, out, wrt: (None,))
    with pytest.raises(TypeError, match=r"test_err_opaque: cannot apply.*out_dtype"):
        sym.call(opaque, x)
    assert sym.call(opaque, x, out_dtype="float32").dtype == np.float32


def test_constant_folding_error():
    with pytest.raises(ValueError, match=r"pow: constant folding failed: Integers to negative"):
        sym.pow(sym.const(2), sym.const(-1))


def test_no_derivative_rule(xy):
    x, _ = xy
    prim = Primitive("test_err_norule", lambda a: a, elementwise=True)  # differentiable, no rule
    c = sym.call(prim, sym.sin(x))
    with pytest.raises(TypeError, match=r"primitive 'test_err_norule' has no derivative rule"):
        sym.diff(c, x)
    with pytest.raises(TypeError, match=r"'test_err_norule' has no derivative rule"):
        sym.grad(c * 2, x)
    assert sym.is_const(sym.diff(c * 2, c), 2)  # the call node itself is fine as a variable


# --------------------------------------------------------------------------------------------
# derivative arguments


def test_diff_arguments(xy):
    x, y = xy
    with pytest.raises(TypeError, match="with respect to a constant"):
        sym.diff(x, sym.const(1.0))
    with pytest.raises(TypeError, match="got str"):
        sym.diff(x, "x")
    with pytest.raises(TypeError, match="got dict"):
        sym.grad(x, {"x": x})
    with pytest.raises(ValueError, match="appears twice"):
        sym.grad(x * y, [x, x])
    with pytest.raises(ValueError, match="2 variables but 1 tangents"):
        sym.jvp(x * y, [x, y], [1.0])
    with pytest.raises(ValueError, match="2 outputs but 1 cotangents"):
        sym.vjp([x, y], [x], [1.0])
    with pytest.raises(TypeError, match="type str"):
        sym.jvp(x * y, [x], ["a"])


# --------------------------------------------------------------------------------------------
# cycles (constructed by force) are reported, not a RecursionError


@pytest.fixture
def cycle(xy):
    x, _ = xy
    a = sym.sin(x)
    b = sym.cos(a)
    old = a.args
    object.__setattr__(a, "args", (b,))  # a -> b -> a
    try:
        yield a, b, x
    finally:
        object.__setattr__(a, "args", old)


def test_cycle_is_reported(cycle):
    a, b, x = cycle
    assert issubclass(sym.SymbolicCycleError, ValueError)
    with pytest.raises(sym.SymbolicCycleError, match="cycle"):
        sym.toposort(b)
    with pytest.raises(sym.SymbolicCycleError, match="cycle"):
        sym.diff(b, x)
    with pytest.raises(sym.SymbolicCycleError, match="cycle"):
        sym.grad(b, x)
    with pytest.raises(sym.SymbolicCycleError, match="cycle"):
        sym.compile([b], [x])
    with pytest.raises(sym.SymbolicCycleError, match="cycle"):
        sym.free_leaves(b)
    with pytest.raises(sym.SymbolicCycleError):
        repr(b)


# --------------------------------------------------------------------------------------------
# compile


def test_compile_input_must_be_a_leaf(xy):
    x, y = xy
    with pytest.raises(TypeError, match=r"input 1 must be a var or leaf, got a Apply node"):
        sym.compile([x * y], [x, sym.exp(y)])
    with pytest.raises(TypeError, match=r"input 0 must be a var or leaf, got an object of type"
                                        r" str"):
        sym.compile([x], ["x"])
    with pytest.raises(TypeError, match=r"input 0 must be a var or leaf, got a Const"):
        sym.compile([x], [sym.const(1.0)])
    with pytest.raises(ValueError, match=r"input 'x' is listed twice"):
        sym.compile([x], [x, x])
    with pytest.raises(TypeError, match="inputs must be a list"):
        sym.compile([x], {"x": x})


def test_compile_missing_inputs_are_named(xy):
    x, y = xy
    X01 = sym.leaf("X", (0, 1))
    with pytest.raises(ValueError, match=r"not among the inputs: ") as err:
        sym.compile([x * y + X01], [x])
    assert str(err.value).split("inputs: ")[1] in ("y, X(0, 1)", "X(0, 1), y")


def test_compile_call_errors(xy):
    x, y = xy
    fn = sym.compile([x * y], [x, y])
    with pytest.raises(ValueError, match=r"input shapes do not broadcast \(x: \(3,\), y: \(4,\)\)"):
        fn(np.ones(3), np.ones(4))
    with pytest.raises(TypeError, match=r"takes 2 arrays \(x, y\), got 3"):
        fn(1.0, 2.0, 3.0)
    with pytest.raises(TypeError, match=r"takes 2 arrays \(x, y\), got 1"):
        fn(1.0)


def test_compile_backends(xy):
    x, _ = xy
    from core_ad._codegen.cuda import available

    if not available():  # no CuPy / CUDA device here: asking for it says so
        with pytest.raises(NotImplementedError, match="backend 'cuda' is not available here"):
            sym.compile([x], [x], backend="cuda")
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        sym.compile([x], [x], backend="jax")


def test_substitute_keys(xy):
    x, _ = xy
    with pytest.raises(TypeError, match="keys must be expressions, got str"):
        sym.substitute(x, {"x": 1.0})
