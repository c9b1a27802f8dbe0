"""custom_derivative rules that must be rejected, each with an error naming the problem."""

import numpy as np
import pytest

import halide_ad as hl

x, y = hl.Var("x"), hl.Var("y")


def _stage():
    a = hl.Buffer(np.linspace(0.1, 1.0, 12).reshape(3, 4), "a")
    k = hl.Buffer(np.ones(2), "k")
    f = hl.Func("f")
    f[x, y] = hl.log(1.0 + hl.exp(a[x, y])) * k[hl.i32(0)]
    return f, a, k


def _loss(f):
    r = hl.RDom([(0, 4), (0, 3)])
    loss = hl.Func("loss")
    loss[()] = hl.f64(0)
    loss[()] += f[r.x, r.y]
    return loss


def _func(name, dims):
    g = hl.Func(name)
    g[tuple(hl.Var(f"v{i}") for i in range(dims))] = hl.f64(0)
    return g


def test_adjoint_of_wrong_dimensions_names_input_and_dimensions():
    f, a, k = _stage()
    g1 = _func("one_d", 1)
    hl.custom_derivative(f, adjoint=lambda d: {a: g1, k: None})
    with pytest.raises(hl.FuncError, match="custom adjoint of Func f gives a 1-dimensional Func"
                                           " for Buffer a, which has 2 dimension"):
        hl.propagate_adjoints(_loss(f))


def test_tangent_of_wrong_dimensions():
    f, a, k = _stage()
    g1 = _func("one_d", 1)
    hl.custom_derivative(f, tangent=lambda t: g1)
    with pytest.raises(hl.FuncError, match="custom tangent of Func f gives a 1-dimensional"):
        hl.propagate_tangents(f, {a: np.ones((3, 4))})


def test_adjoint_missing_an_input_or_naming_another():
    f, a, k = _stage()
    g2 = _func("g2", 2)
    hl.custom_derivative(f, adjoint=lambda d: {a: g2})
    with pytest.raises(hl.FuncError, match="returns no adjoint for Buffer k, which f reads"):
        hl.propagate_adjoints(_loss(f))
    other = hl.Buffer(np.ones((3, 4)), "other")
    hl.custom_derivative(f, adjoint=lambda d: {a: g2, k: None, other: g2})
    with pytest.raises(hl.FuncError, match="for Buffer other, which f does not read; it reads"
                                           " Buffer a, Buffer k"):
        hl.propagate_adjoints(_loss(f))


def test_adjoint_must_return_a_dict_of_funcs():
    f, a, k = _stage()
    hl.custom_derivative(f, adjoint=lambda d: [d])
    with pytest.raises(hl.FuncError, match=r"must return a dict \{input: Func\}, got list"):
        hl.propagate_adjoints(_loss(f))
    hl.custom_derivative(f, adjoint=lambda d: {a: np.ones((3, 4)), k: None})
    with pytest.raises(hl.FuncError, match="must give a Func for Buffer a, got ndarray"):
        hl.propagate_adjoints(_loss(f))


def test_declared_inputs_must_cut_every_path():
    f, a, k = _stage()
    g = hl.Func("g")
    g[x, y] = f[x, y] * a[x, y]
    with pytest.raises(hl.FuncError, match="g depends on Buffer a other than through the"
                                           " declared inputs"):
        hl.custom_derivative(g, adjoint=lambda d: {}, inputs=[f])
    other = hl.Buffer(np.ones(2), "other")
    with pytest.raises(hl.FuncError, match="does not depend on the declared input Buffer other"):
        hl.custom_derivative(g, adjoint=lambda d: {}, inputs=[a, k, other])


def test_bad_arguments():
    f, a, k = _stage()
    with pytest.raises(hl.FuncError, match="give an adjoint, a tangent or both"):
        hl.custom_derivative(f)
    with pytest.raises(hl.FuncError, match="adjoint must be a function, got dict"):
        hl.custom_derivative(f, adjoint={a: f})
    with pytest.raises(hl.FuncError, match="expected a Func, got Buffer"):
        hl.custom_derivative(a, adjoint=lambda d: {})


def test_no_per_update_adjoint_with_a_custom_rule():
    f, a, k = _stage()
    f[x, y] = f[x, y] * 2.0
    g2 = _func("g2", 2)
    hl.custom_derivative(f, adjoint=lambda d: {a: g2, k: None})
    d = hl.propagate_adjoints(_loss(f))
    d[f]
    with pytest.raises(hl.FuncError, match=r"Func f has a custom adjoint: only d\[f\]"):
        d[f, 0]
