"""Programs that must fail, each with a named error that says what is wrong (Halide keeps
these apart in test/error; so do we)."""

import halide_ad as hl
import numpy as np
import pytest

x, y = hl.Var("x"), hl.Var("y")


def _input(w=8, h=6):
    return hl.Buffer(np.zeros((h, w), np.float32), name="input")


def test_reading_outside_an_input_buffer_names_buffer_dimension_and_ranges():
    inp = _input()
    f = hl.Func("f")
    f[x, y] = inp[x + 1, y] + inp[x, y - 2]
    with pytest.raises(hl.BoundsError) as e:
        f.realize([8, 6])
    msg = str(e.value)
    assert "input" in msg and "dimension 0" in msg and "[0, 8]" in msg and "[0, 7]" in msg


def test_reading_outside_in_y_reports_dimension_1():
    inp = _input()
    f = hl.Func("f")
    f[x, y] = inp[x, y - 2]
    with pytest.raises(hl.BoundsError, match=r"dimension 1\) in \[-2, 3\].*\[0, 5\]"):
        f.realize([8, 6])


def test_unbounded_data_dependent_index_is_refused():
    lut = _input(4, 1)
    idx = hl.Buffer(np.zeros((3, 3), np.float32), name="idx")
    f = hl.Func("f")
    f[x, y] = lut[hl.i32(idx[x, y] * 3), 0]
    with pytest.raises(hl.BoundsError, match="cannot bound coordinate 0 of Buffer input"):
        f.realize([3, 3])


def test_undefined_func():
    g, f = hl.Func("g"), hl.Func("f")
    with pytest.raises(hl.FuncError, match="Func g is used but never defined"):
        f[x] = g[x] + 1


def test_wrong_argument_count():
    g, f = hl.Func("g"), hl.Func("f")
    g[x, y] = x + y
    with pytest.raises(hl.FuncError, match="g takes 2 argument"):
        f[x] = g[x]


def test_buffer_wrong_dimension_count():
    inp = _input()
    with pytest.raises(hl.FuncError, match="input has 2 dimension"):
        inp[x, y, 0]


def test_update_type_mismatch():
    f = hl.Func("f")
    f[x] = hl.f32(0)
    with pytest.raises(hl.FuncError, match="type mismatch.*Float\\(64\\).*Float\\(32\\)"):
        f[x] = hl.f64(x)


def test_float_coordinate_is_refused():
    g, f = hl.Func("g"), hl.Func("f")
    g[x] = x
    with pytest.raises(hl.FuncError, match="coordinates must be integers"):
        f[x] = g[hl.f32(x)]


def test_first_definition_must_be_pure():
    f = hl.Func("f")
    with pytest.raises(hl.FuncError, match="must be pure"):
        f[x + 1] = 0


def test_pure_var_at_another_position_in_an_update():
    f = hl.Func("f")
    f[x, y] = 0
    with pytest.raises(hl.FuncError, match="pure Var 'y' must appear at its own position"):
        f[y, x] = 1


def test_self_reference_with_shifted_pure_var():
    f = hl.Func("f")
    f[x] = x
    with pytest.raises(hl.FuncError, match="Halide's rule"):
        f[x] = f[x - 1] + 1


def test_scheduling_a_var_the_func_does_not_have():
    f = hl.Func("f")
    f[x, y] = x + y
    with pytest.raises(hl.ScheduleError, match="f has no dimension 'z'"):
        f.vectorize(hl.Var("z"), 8)
    with pytest.raises(hl.ScheduleError, match="no dimension 'q'"):
        f.parallel(hl.Var("q"))


def test_parallel_reduction_dimension_needs_rfactor_or_atomic():
    f = hl.Func("f")
    r = hl.RDom([(0, 10)])
    f[x] = 0
    f[x] += r.x
    with pytest.raises(hl.ScheduleError, match="cannot parallelize the reduction dimension.*rfactor"):
        f.update(0).parallel(r.x)
    with pytest.raises(hl.ScheduleError, match="update\\(3\\) does not exist"):
        f.update(3)


def test_inlining_a_func_with_updates():
    g, f = hl.Func("g"), hl.Func("f")
    g[x] = 0
    g[x] += 1
    g.compute_inline()
    f[x] = g[x]
    with pytest.raises(hl.ScheduleError, match="cannot be inlined"):
        f.realize([4])


def test_compute_at_a_loop_the_consumer_does_not_have():
    g, f = hl.Func("g"), hl.Func("f")
    g[x, y] = x + y
    f[x, y] = g[x, y]
    g.compute_at(f, hl.Var("xo"))
    with pytest.raises(hl.ScheduleError, match="has no loop 'xo'"):
        f.realize([4, 4])


def test_compute_at_with_another_user_outside():
    g, f, h = hl.Func("g"), hl.Func("f"), hl.Func("h")
    g[x] = x
    f[x] = g[x]
    h[x] = g[x] + f[x]
    g.compute_at(f, x)
    f.compute_root()
    with pytest.raises(hl.ScheduleError, match="also used by h"):
        h.realize([4])


def test_param_without_value():
    p = hl.Param(hl.Float(32), "gain")
    f = hl.Func("f")
    f[x] = hl.f32(x) * p
    with pytest.raises(hl.FuncError, match="Param gain has no value"):
        f.realize([4])


def test_realize_with_wrong_number_of_sizes():
    f = hl.Func("f")
    f[x, y] = x
    with pytest.raises(hl.FuncError, match="2 dimension\\(s\\), got 1 size"):
        f.realize([4])


def test_realize_with_per_output_sizes_of_the_wrong_count_or_shape():
    f, g = hl.Func("f"), hl.Func("g")
    f[x, y] = x
    g[x] = x
    p = hl.Pipeline([f, g])
    with pytest.raises(hl.FuncError, match="1 size lists for 2 outputs \\(f, g\\)"):
        p.realize([[4, 3]])
    with pytest.raises(hl.FuncError, match="one list of extents or one list per output"):
        p.realize([[4, 3], 5])
    with pytest.raises(hl.FuncError, match="g has 1 dimension\\(s\\), got 2 size"):
        p.realize([[4, 3], [4, 3]])


def test_scatter_outside_the_realized_output():
    h = hl.Func("h")
    r = hl.RDom([(0, 10)])
    h[x] = 0
    h[r.x + 5] += 1
    with pytest.raises(hl.BoundsError, match="outside the realized range"):
        h.realize([10])


def test_select_with_even_argument_count():
    with pytest.raises(hl.ExprError, match="select takes"):
        hl.select(x < 1, 1, x < 2, 2)


def test_vectorize_without_constant_extent():
    f = hl.Func("f")
    f[x] = x
    f.vectorize(x)
    with pytest.raises(hl.ScheduleError, match="not a constant"):
        f.realize([16])


def test_output_sharing_memory_with_an_input():
    a = np.zeros((4, 5), np.float32)
    inp = hl.Buffer(a, name="img")
    f = hl.Func("f")
    f[x, y] = inp[x, y] + 1
    with pytest.raises(hl.FuncError, match="shares memory with the input img"):
        f.realize(hl.Buffer(a))


def test_reorder_storage_must_name_every_dimension_once():
    f = hl.Func("f")
    f[x, y] = x + y
    for bad in ((x,), (x, x), (x, y, hl.Var("z"))):
        with pytest.raises(hl.ScheduleError, match="f.reorder_storage: name each of its"):
            f.reorder_storage(*bad)
