"""Programs propagate_adjoints must reject, each with an error naming the problem."""

import numpy as np
import pytest

import halide_ad as hl

x = hl.Var("x")


def _loss(f, n):
    r = hl.RDom([(0, n)])
    loss = hl.Func("loss")
    loss[()] = hl.f32(0)
    loss[()] += f[r.x]
    return loss


def test_scan_reading_ahead_is_rejected_naming_func_and_update():
    """f(r) = f(r + 1) ... reads points a later iteration overwrites (the forward scan
    f(r) = f(r - 1) ... is reversible: test_acceptance's AE-5 cases)."""
    a = hl.Buffer(np.ones(6, np.float32), "a")
    f = hl.Func("suffix")
    f[x] = a[x]
    r = hl.RDom([(0, 5)])
    f[r.x] = f[r.x + 1] * 0.5 + a[r.x]
    with pytest.raises(hl.FuncError, match=r"update 0 of Func suffix.*Rewrite"):
        hl.propagate_adjoints(_loss(f, 6))


def test_non_additive_in_place_reduction_is_rejected():
    a = hl.Buffer(np.ones(6, np.float32), "a")
    f = hl.Func("prod")
    f[x] = hl.f32(1)
    r = hl.RDom([(0, 6)])
    f[x] = f[x] * a[r.x]
    with pytest.raises(hl.FuncError, match="Func prod"):
        hl.propagate_adjoints(_loss(f, 3))


def test_func_not_in_pipeline():
    a = hl.Buffer(np.ones(6, np.float32), "a")
    f, g = hl.Func("f"), hl.Func("elsewhere")
    f[x] = a[x] * 2.0
    g[x] = a[x] * 3.0
    d = hl.propagate_adjoints(_loss(f, 6))
    with pytest.raises(hl.FuncError, match="elsewhere is not in the pipeline"):
        d[g]


def test_integer_func_has_no_adjoint():
    a = hl.Buffer(np.ones(6, np.float32), "a")
    idx = hl.Func("index")
    idx[x] = hl.i32(a[x] * 2.0)
    f = hl.Func("f")
    f[x] = a[hl.clamp(idx[x], 0, 5)] * a[x]
    d = hl.propagate_adjoints(_loss(f, 6))
    with pytest.raises(hl.FuncError, match=r"Func index is Int\(32\)-valued"):
        d[idx]


def test_non_scalar_output_needs_adjoint_buffer():
    a = hl.Buffer(np.ones(6, np.float32), "a")
    f = hl.Func("f")
    f[x] = a[x]
    with pytest.raises(hl.FuncError, match="needs an adjoint buffer"):
        hl.propagate_adjoints(f)
    with pytest.raises(hl.FuncError, match="2 dimensions, f has 1"):
        hl.propagate_adjoints(f, np.ones((2, 6), np.float32))


def test_integer_output_rejected():
    a = hl.Buffer(np.ones(6, np.int32), "a")
    f = hl.Func("count")
    f[x] = a[x] + 1
    with pytest.raises(hl.FuncError, match="count must have one float value"):
        hl.propagate_adjoints(f, np.ones(6, np.float32))
