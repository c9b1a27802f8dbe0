"""Language tests: declarations, reads as core_ad leaves, vectors, conditions, Energy."""

import numpy as np
import pytest
from core_ad import sym
from lsq_opt._language import (
    All,
    Array,
    Dim,
    Energy,
    Exclude,
    Graph,
    InBounds,
    InBoundsRef,
    Index,
    IndexRef,
    Param,
    ParamRef,
    Read,
    Rotate2D,
    Select,
    Stencil,
    Unknown,
    Vec,
    decode_leaf,
    eq,
    greatereq,
    mul,
    sqrt,
)

W, H, N = Dim("W"), Dim("H"), Dim("N")


def test_stencil_reads_are_hash_consed_leaves():
    X = Unknown("X", (W, H))
    a, b = X(0, 1), X(0, 1)
    assert a is b
    assert isinstance(a, sym.Expr) and a.kind == "X"
    assert X(0, 1) is not X(1, 0)
    d = decode_leaf(X(2, -1))
    assert d == Read("X", "unknown", ("W", "H"), 1, 0, offset=(2, -1))
    A = Array("A", (W, H))
    assert decode_leaf(A(0, 0)).role == "array"
    # same name, different declaration -> different leaves (self-describing keys)
    assert Unknown("X", (W, H), 2)(0, 0)[0] is not X(0, 0)


def test_channels_and_vectors():
    Y = Unknown("Y", (W, H), 3)
    v = Y(1, 0)
    assert isinstance(v, Vec) and len(v) == 3
    assert v[2] is Y(1, 0, 2)
    assert v(1) is Y(1, 0, 1)
    assert decode_leaf(v[2]).channel == 2
    w = (v - Y(0, 0)) * 2.0 + 1.0
    assert isinstance(w, Vec) and len(w) == 3
    assert sym.free_leaves(w[1]) == [Y(1, 0, 1), Y(0, 0, 1)] or set(sym.free_leaves(w[1])) == {Y(1, 0, 1), Y(0, 0, 1)}
    assert isinstance(2.0 * v, Vec) and isinstance(1 - v, Vec)
    p = Param("p")
    assert isinstance(v * p, Vec) and isinstance(mul(p, v), Vec)
    assert isinstance(sqrt(v), Vec)
    with pytest.raises(ValueError):
        _ = v + Unknown("Z", (W, H), 2)(0, 0)
    with pytest.raises(IndexError):
        Y(0, 0, 3)


def test_rotate2d_values():
    U = Array("U", (W, H), 2)
    T = Unknown("T", (W, H))
    r = Rotate2D(T(0, 0), U(0, 0))
    env = {T(0, 0): np.array([0.3]), U(0, 0)[0]: np.array([1.0]), U(0, 0)[1]: np.array([2.0])}
    got = [float(sym.evaluate(c, env)[0]) for c in r]
    c, s = np.cos(0.3), np.sin(0.3)
    assert got == pytest.approx([c * 1 - s * 2, s * 1 + c * 2])


def test_params_inbounds_index_and_select():
    p = Param("w")
    assert decode_leaf(p) == ParamRef("w")
    ib = InBounds(1, 0)
    assert ib.dtype == np.bool_ and decode_leaf(ib) == InBoundsRef((1, 0))
    assert decode_leaf(Index(1)) == IndexRef(1)
    X = Unknown("X", (W, H))
    M = Array("M", (W, H))
    cond = InBounds(1, 0) * eq(M(1, 0), 0)
    s = Select(cond, X(0, 0) - X(1, 0), 0)
    assert s.dtype == np.float64
    env = {X(0, 0): np.array([3.0, 3.0]), X(1, 0): np.array([1.0, 1.0]), InBounds(1, 0): np.array([True, False]),
           M(1, 0): np.array([0.0, 0.0])}
    np.testing.assert_array_equal(sym.evaluate(s, env), [2.0, 0.0])
    # vector condition broadcast (spec 10.4) and All
    C = Array("C", (W, H), 2)
    v = Select(greatereq(C(0, 0), 0), C(0, 0), -1.0)
    assert isinstance(v, Vec) and len(v) == 2
    assert All(greatereq(C(0, 0), 0)).dtype == np.bool_
    # numeric conditions are "non-zero = true"
    assert Select(M(0, 0), 1.0, 2.0).dtype == np.float64


def test_graph_reads():
    X = Unknown("X", N, 3)
    G = Graph("Edges", vertex0=N, vertex1=N)
    r = X(G.vertex0) - X(G.vertex1)
    assert isinstance(r, Vec)
    leaves = {decode_leaf(lf) for lf in sym.free_leaves(r[1])}
    assert Read("X", "unknown", ("N",), 3, 1, graph="Edges", slot="vertex0") in leaves
    assert Read("X", "unknown", ("N",), 3, 1, graph="Edges", slot="vertex1") in leaves
    T = Graph("T", ["a", "b", "c"], (W, H))
    assert set(T.slots) == {"a", "b", "c"}
    with pytest.raises(AttributeError, match="no vertex slot"):
        _ = G.vertex2
    with pytest.raises(ValueError, match="does not match"):
        Unknown("Q", (W, H))(G.vertex0)


def test_energy_flattening_and_exclude():
    X = Unknown("X", (W, H), 2)
    A = Array("A", (W, H))
    e = Energy(X(0, 0) - A(0, 0), X(0, 0)[0] * 2.0, Exclude(eq(A(0, 0), 1)))
    assert [len(t) for t in e.terms] == [2, 1]
    assert len(e.excludes) == 1
    e2 = e + Energy(X(1, 0)[1] - A(0, 0))
    assert len(e2.terms) == 3 and len(e2.excludes) == 1
    assert Stencil([(1, 0), [0, 1]]) == [(1, 0), (0, 1)]
    with pytest.raises(TypeError, match="bool"):
        Energy(eq(A(0, 0), 0))
    with pytest.raises(TypeError):
        Energy("x")


def test_a_user_energy_as_written():
    """The Fig. 3 listing, as a user writes it (see the report / package docs)."""
    W_, H_ = Dim("W"), Dim("H")
    X = Unknown("X", (W_, H_))
    A = Array("A", (W_, H_))
    w_fit, w_reg = 0.1, 0.9
    E = Energy(w_fit * (X(0, 0) - A(0, 0)),
               w_reg * (X(0, 0) - X(1, 0)),
               w_reg * (X(0, 0) - X(0, 1)))
    assert len(E.terms) == 3
    reg = E.terms[1][0]
    assert sym.diff(reg, X(1, 0)) is sym.const(-0.9) or float(sym.evaluate(sym.diff(reg, X(1, 0)), {})) == -0.9


def test_scalar_weight_on_the_left_of_a_vector_residual():
    # The paper writes w_regSqrt * (vector residual); the scalar defers to the vector type.
    from lsq_opt import Dim, Param, Unknown, Vec

    W, H = Dim("W"), Dim("H")
    U = Unknown("U", (W, H), channels=2)
    w = Param("w")
    left, right = w * U(0, 0), U(0, 0) * w
    assert isinstance(left, Vec)
    assert all(a is b for a, b in zip(left.items, right.items))
