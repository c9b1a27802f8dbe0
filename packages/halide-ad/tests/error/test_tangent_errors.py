"""Programs propagate_tangents must reject, each with an error naming the problem."""

import numpy as np
import pytest

import halide_ad as hl

x = hl.Var("x")


def _pipeline():
    a = hl.Buffer(np.ones(6), "a")
    f = hl.Func("f")
    f[x] = a[x] * 2.0
    return f, a


def test_tangent_of_wrong_shape_names_buffer_and_shapes():
    f, a = _pipeline()
    with pytest.raises(hl.FuncError, match=r"tangent of Buffer a has numpy shape \(5,\).*\(6,\)"):
        hl.propagate_tangents(f, {a: np.ones(5)})


def test_tangent_func_of_wrong_dimensions():
    f, a = _pipeline()
    g = hl.Func("g2d")
    g[x, hl.Var("y")] = hl.f64(0)
    with pytest.raises(hl.FuncError, match="Func of 2 dimensions, the Buffer has 1"):
        hl.propagate_tangents(f, {a: g})


def test_tangent_for_an_input_the_output_does_not_read():
    f, _ = _pipeline()
    other = hl.Buffer(np.ones(3), "other")
    with pytest.raises(hl.FuncError, match="does not read Buffer other"):
        hl.propagate_tangents(f, {other: np.ones(3)})
    p = hl.Param(hl.Float(64), "unused", 1.0)
    with pytest.raises(hl.FuncError, match="does not use Param unused"):
        hl.propagate_tangents(f, {p: 1.0})


def test_tangents_are_keyed_by_inputs():
    f, a = _pipeline()
    with pytest.raises(hl.FuncError, match="keyed by input Buffers and Params, got Func"):
        hl.propagate_tangents(f, {f: np.ones(6)})
    with pytest.raises(hl.FuncError, match="must be a dict"):
        hl.propagate_tangents(f, [np.ones(6)])


def test_integer_inputs_and_outputs_have_no_tangent():
    ia = hl.Buffer(np.ones(6, np.int32), "counts")
    f = hl.Func("f")
    f[x] = hl.f64(ia[x]) * 2.0
    with pytest.raises(hl.FuncError, match=r"Buffer counts is Int\(32\): it has no tangent"):
        hl.propagate_tangents(f, {ia: np.ones(6)})
    g = hl.Func("count")
    g[x] = ia[x] + 1
    with pytest.raises(hl.FuncError, match="count must have one float value"):
        hl.propagate_tangents(g, {})


def test_update_index_out_of_range():
    f, a = _pipeline()
    t = hl.propagate_tangents(f, {a: np.ones(6)})
    with pytest.raises(hl.FuncError, match="Func f has 0 update"):
        t[f, 0]


def test_integer_func_and_func_outside_the_pipeline_have_no_tangent():
    a = hl.Buffer(np.linspace(0.0, 1.0, 6), "a")
    idx = hl.Func("index")
    idx[x] = hl.i32(a[x] * 4.0)
    f = hl.Func("f")
    f[x] = a[hl.clamp(idx[x], 0, 5)] * a[x]
    elsewhere = hl.Func("elsewhere")
    elsewhere[x] = a[x]
    t = hl.propagate_tangents(f, {a: np.ones(6)})
    with pytest.raises(hl.FuncError, match=r"Func index is Int\(32\)-valued"):
        t[idx]
    with pytest.raises(hl.FuncError, match="elsewhere is not in the pipeline of f"):
        t[elsewhere]


def test_tuple_func_is_rejected_naming_it():
    a = hl.Buffer(np.ones(6), "a")
    pair = hl.Func("pair")
    pair[x] = (a[x] * 2.0, a[x] + 1.0)
    f = hl.Func("f")
    f[x] = pair[x][0] * pair[x][1]
    with pytest.raises(hl.FuncError, match="Func pair is a Tuple"):
        hl.propagate_tangents(f, {a: np.ones(6)})
