"""LLVM backend error paths: each asserts the error type and that the message names the
problem (the input, the expected and given dtype or shape, the buffer, index and lane)."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from core_ad import Primitive, codegen, sym


def llvm(outputs, inputs, **kw):
    return sym.compile(outputs, inputs, backend="llvm", **kw)


@pytest.fixture(scope="module")
def fxy():
    x, y = sym.var("x"), sym.var("y", "float32")
    return llvm([sym.sin(x) * sym.astype(y, "float64")], [x, y]), x, y


# --------------------------------------------------------------------------------------------
# call-time errors


def test_wrong_dtype_names_input_expected_and_got(fxy):
    fn, _, _ = fxy
    with pytest.raises(TypeError, match=r"input 1 \('y'\): expected dtype float32, got float64"):
        fn(np.ones(3), np.ones(3))
    with pytest.raises(TypeError, match=r"input 0 \('x'\): expected dtype float64, got int64"):
        fn(np.arange(3), np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"input 0 \('x'\): expected dtype float64, got float32"):
        fn(np.float32(1.0), np.ones(3, np.float32))  # numpy scalars keep their dtype


def test_python_scalars_must_fit_the_leaf_kind():
    i, b = sym.var("i", "int32"), sym.var("b", "bool")
    fn = llvm([sym.astype(i, "float64"), sym.logical_not(b)], [i, b])
    with pytest.raises(TypeError, match=r"input 0 \('i'\): expected dtype int32, got a Python"
                                        r" float"):
        fn(1.5, True)
    with pytest.raises(TypeError, match=r"input 1 \('b'\): expected dtype bool, got a Python"
                                        r" int"):
        fn(1, 1)
    with pytest.raises(ValueError, match=r"input 0 \('i'\): the value 4294967296 does not fit"
                                         r" dtype int32"):
        fn(2**32, True)
    assert fn(3, True)[0] == 3.0  # weak Python scalars that fit are fine


def test_wrong_number_of_arguments(fxy):
    fn, _, _ = fxy
    with pytest.raises(TypeError, match=r"takes 2 arrays \(x, y\), got 3"):
        fn(np.ones(2), np.ones(2, np.float32), np.ones(2))
    with pytest.raises(TypeError, match=r"takes 2 arrays \(x, y\), got 0"):
        fn()


def test_lane_counts_must_match(fxy):
    fn, _, _ = fxy
    with pytest.raises(ValueError, match=r"lane counts do not match: input shapes do not"
                                         r" broadcast \(x: \(3,\), y: \(4,\)\)"):
        fn(np.ones(3), np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"x: \(1,\), y: \(4,\)"):  # no numpy broadcasting
        fn(np.ones(1), np.ones(4, np.float32))


def test_only_1d_lanes_or_0d_scalars(fxy):
    fn, _, _ = fxy
    with pytest.raises(ValueError, match=r"input 0 \('x'\): expected a 1-D array of lanes or a"
                                         r" 0-d scalar, got shape \(2, 3\)"):
        fn(np.ones((2, 3)), np.ones(3, np.float32))


def test_reversed_and_misaligned_arrays(fxy):
    """(Lanes may be strided, test_codegen_strided.py; not reversed.)"""
    fn, _, _ = fxy
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is not a strided lane array \(stride"
                                         r" -8 bytes for itemsize 8\).*ascontiguousarray"):
        fn(np.ones(4)[::-1], np.ones(4, np.float32))
    raw = np.zeros(8 * 5 + 1, np.uint8)
    mis = raw[1:].view(np.float64)
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is not aligned"):
        fn(mis, np.ones(5, np.float32))


def test_buffers_must_be_1d():
    b, i = sym.buffer("tbl"), sym.var("i", "int64")
    fn = llvm([sym.gather(b, i)], [b, i])
    with pytest.raises(ValueError, match=r"input 0 \('tbl'\) is a buffer: expected a 1-D array,"
                                         r" got shape \(2, 2\)"):
        fn(np.ones((2, 2)), np.array([0]))
    with pytest.raises(ValueError, match=r"input 0 \('tbl'\) is a buffer: expected a 1-D array,"
                                         r" got a scalar"):
        fn(1.0, np.array([0]))


@pytest.fixture(scope="module")
def gather_fn():
    b, i = sym.buffer("verts"), sym.var("i", "int64")
    x = sym.var("x")
    return llvm([sym.gather(b, i) * x], [b, i, x])


@pytest.mark.parametrize("n, lane", [(3, 1), (1003, 2), (1003, 1001), (200_003, 150_007)])
def test_out_of_range_gather_names_buffer_index_and_lane(gather_fn, n, lane):
    """In the vector loop, the remainder loop, and the second thread's range."""
    idx = np.zeros(n, np.int64)
    idx[lane] = 7
    idx[-1] = 9  # a later bad lane: the first one is reported
    with pytest.raises(IndexError, match=rf"gather: index 7 at lane {lane} is out of range for"
                                         r" buffer 'verts' of length 7"):
        gather_fn(np.zeros(7), idx, np.ones(n), num_threads=2)


def test_negative_gather_index(gather_fn):
    with pytest.raises(IndexError, match=r"index -1 at lane 0 .*'verts'"):
        gather_fn(np.zeros(7), np.array([-1, 0]), np.ones(2))


def test_out_of_range_scatter_leaves_the_callers_buffer_alone():
    acc, i, x = sym.buffer("acc"), sym.var("i", "int32"), sym.var("x")
    fn = llvm([sym.scatter_add(acc, i, x)], [acc, i, x])
    buf = np.zeros(5)
    idx = np.array([0, 1, 2, 3, 4, 5, 0], np.int32)
    with pytest.raises(IndexError, match=r"scatter_add: index 5 at lane 5 is out of range for"
                                         r" buffer 'acc' of length 5"):
        fn(buf, idx, np.ones(7))
    np.testing.assert_array_equal(buf, 0.0)


def test_num_threads_must_be_positive(fxy, monkeypatch):
    fn, _, _ = fxy
    args = (np.ones(3), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="num_threads must be a positive integer, got 0"):
        fn(*args, num_threads=0)
    monkeypatch.setenv("CORE_AD_NUM_THREADS", "many")
    with pytest.raises(ValueError, match=r"CORE_AD_NUM_THREADS must be a positive integer, got"
                                         r" 'many'"):
        fn(*args)


# --------------------------------------------------------------------------------------------
# compile-time errors


def test_unknown_and_invalid_options():
    x = sym.var("x")
    with pytest.raises(TypeError, match=r"unknown option 'vectorise' for backend 'llvm';"
                                        r" expected one of libmvec, scatter, vectorize"):
        llvm([x], [x], vectorise=False)
    with pytest.raises(ValueError, match=r"option scatter='locks' is invalid; expected one of"
                                         r" 'auto', 'partials', 'atomic'"):
        llvm([x], [x], scatter="locks")
    with pytest.raises(TypeError, match=r"the numpy backend takes no options, got \['scatter'\]"):
        sym.compile([x], [x], backend="numpy", scatter="atomic")


def test_primitive_without_lowering_is_rejected_by_name():
    prim = Primitive("test_cg_nolower", lambda a: a + 1.0, partials=lambda a, o, w: (None,),
                     elementwise=True, extra={"out_dtype": np.float64})
    x = sym.var("x")
    with pytest.raises(NotImplementedError, match=r"primitive 'test_cg_nolower' has no LLVM"
                                                  r" lowering.*register_lowering"):
        llvm([sym.call(prim, x)], [x])
    assert isinstance(codegen.Unsupported("m"), NotImplementedError)


def test_unsupported_dtype_is_named():
    z = sym.var("z", "complex128")
    with pytest.raises(NotImplementedError, match="dtype complex128 is not supported by the"
                                                  " LLVM backend"):
        llvm([z * 2.0], [z])
    assert sym.compile([z * 2.0], [z]).backend == "numpy"  # the default falls back


def test_buffer_outputs_and_scatter_operands():
    b, i, x = sym.buffer("t"), sym.var("i", "int64"), sym.var("x")
    with pytest.raises(NotImplementedError, match="buffer 't' cannot be an output"):
        llvm([b], [b])
    with pytest.raises(ValueError, match="only be an output"):
        llvm([sym.scatter_add(b, i, x) * 2.0], [b, i, x])


def test_register_lowering_twice_is_an_error():
    with pytest.raises(ValueError, match="'sin' already has an LLVM lowering"):
        codegen.register_lowering("sin", lambda em, node, args: args[0])


def test_cuda_backend_is_not_available_yet():
    x = sym.var("x")
    if "cuda" in codegen.available_backends():
        pytest.skip("a CUDA backend is registered and available here")
    with pytest.raises(NotImplementedError, match="backend 'cuda'"):
        sym.compile([x], [x], backend="cuda")


# --------------------------------------------------------------------------------------------
# emitter misuse


def _builder():
    mod = ir.Module(name="emit_err")
    fn = ir.Function(mod, ir.FunctionType(ir.DoubleType(), [ir.DoubleType()]), "f")
    return ir.IRBuilder(fn.append_basic_block("entry")), fn


def test_emitter_needs_every_leaf_value():
    b, fn = _builder()
    x, y = sym.var("x"), sym.var("y")
    with pytest.raises(ValueError, match="no value given for leaf 'y'"):
        codegen.emit(b, x * y, {x: fn.args[0]})


def test_emitter_checks_leaf_value_types():
    b, fn = _builder()
    x32 = sym.var("x", "float32")
    with pytest.raises(TypeError, match=r"leaf 'x' \(float32\) needs float values, got double"):
        codegen.emit(b, x32 * 2.0, {x32: fn.args[0]})


def test_emitter_gather_needs_a_bounds_callback_that_terminates():
    b, fn = _builder()
    buf, i = sym.buffer("tbl"), sym.var("i", "int64")
    arg = codegen.BufferArg(ir.Constant(ir.DoubleType().as_pointer(), None),
                            ir.Constant(ir.IntType(64), 3))
    env = {buf: arg, i: ir.Constant(ir.IntType(64), 1)}
    with pytest.raises(ValueError, match="needs on_bounds_error"):
        codegen.emit(b, sym.gather(buf, i), env)
    b, fn = _builder()
    with pytest.raises(ValueError, match="on_bounds_error must terminate the error block"):
        codegen.emit(b, sym.gather(buf, i), env, on_bounds_error=lambda bld, f: None)
