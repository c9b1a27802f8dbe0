"""Error reporting: type and message content."""

import numpy as np
import pytest
from core_ad import sym
from lsq_opt._compiler import LsqCompileError, compile_problem
from lsq_opt._language import Array, Dim, Energy, Graph, Param, Unknown

W, H, N = Dim("W"), Dim("H"), Dim("N")


def test_undeclared_leaf_is_named():
    X = Unknown("X", (W, H))
    bogus = sym.leaf("Q", (0, 0))
    with pytest.raises(LsqCompileError, match="'Q'"):
        compile_problem(Energy(X(0, 0) - bogus), sizes={"W": 4, "H": 3})


def test_unbound_array_is_named():
    X = Unknown("X", (W, H))
    A = Array("Aimg", (W, H))
    with pytest.raises(LsqCompileError, match="'Aimg'.*not bound"):
        compile_problem(Energy(X(0, 0) - A(0, 0)), sizes={"W": 4, "H": 3})


def test_unbound_param_and_unknown_size():
    X = Unknown("X", (W, H))
    with pytest.raises(LsqCompileError, match="'w'"):
        compile_problem(Energy(Param("w") * X(0, 0)), sizes={"W": 4, "H": 3})
    with pytest.raises(LsqCompileError, match="'H'"):
        compile_problem(Energy(X(0, 0) * 1.0), sizes={"W": 4})


def test_mismatched_image_sizes_name_both_shapes():
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    with pytest.raises(ValueError) as ei:
        compile_problem(Energy(X(0, 0) - A(0, 0)),
                        arrays={"X": np.zeros((17, 13)), "A": np.zeros((17, 12))})
    msg = str(ei.value)
    assert "(17, 12)" in msg and "(17, 13)" in msg and "'A'" in msg
    with pytest.raises(ValueError, match="mismatched"):
        compile_problem(Energy(X(0, 0) - A(0, 0)), sizes={"W": 5, "H": 5}, arrays={"A": np.zeros((5, 4))})
    Y = Unknown("Y", (W, H), 2)
    with pytest.raises(ValueError):
        compile_problem(Energy(Y(0, 0) - A(0, 0)), arrays={"A": np.zeros((5, 4)), "Y": np.zeros((5, 4, 3))})


def test_graph_index_out_of_range():
    X = Unknown("X", N)
    G = Graph("Edges", v0=N, v1=N)
    e = Energy(X(G.v0) - X(G.v1))
    with pytest.raises(IndexError) as ei:
        compile_problem(e, sizes={"N": 5}, graphs={"Edges": {"v0": np.array([0, 1, 2]), "v1": np.array([1, 7, 3])}})
    msg = str(ei.value)
    assert "'Edges'" in msg and "edge 1" in msg and "7" in msg
    with pytest.raises(IndexError, match="edge 0.*-1"):
        compile_problem(e, sizes={"N": 5}, graphs={"Edges": {"v0": np.array([-1]), "v1": np.array([1])}})
    Y = Unknown("Y", (W, H))
    T = Graph("T", a=(W, H), b=(W, H))
    with pytest.raises(IndexError, match="'T'.*edge 1"):
        compile_problem(Energy(Y(T.a) - Y(T.b)), sizes={"W": 3, "H": 2},
                        graphs={"T": {"a": np.array([[0, 0], [2, 2]]), "b": np.array([[1, 1], [0, 1]])}})
    with pytest.raises(LsqCompileError, match="'Edges'.*not bound"):
        compile_problem(e, sizes={"N": 5})


def test_domain_errors():
    X = Unknown("X", (W, H))
    Xn = Unknown("Xn", N)
    G = Graph("G", v=N)
    with pytest.raises(LsqCompileError, match="multiple domains"):
        compile_problem(Energy(X(0, 0) - Xn(G.v)), sizes={"W": 2, "H": 2, "N": 3}, graphs={"G": {"v": np.arange(3)}})
    with pytest.raises(LsqCompileError, match="reads no array"):
        compile_problem(Energy(Param("w") * 2.0), params={"w": 1.0})
    with pytest.raises(TypeError, match="offsets"):
        X(0)
    with pytest.raises(TypeError, match="integers"):
        X(0.5, 0)


def test_nonfinite_cost_honest():
    X = Unknown("X", (W, H))
    A = Array("A", (W, H))
    A_ = np.ones((4, 3))
    A_[1, 1] = np.inf
    plan = compile_problem(Energy(X(0, 0) - A(0, 0)), arrays={"A": A_})
    assert plan.cost(plan.x0) == np.inf
    with pytest.raises(ValueError, match="shape"):
        plan.residuals(np.zeros(5))
