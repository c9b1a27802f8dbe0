"""Strided lanes in the LLVM backend: lane inputs that are columns of a row-major (N, width)
block, read in place, and ``out=`` arrays (strided or not) the kernel writes.

Every result is compared bitwise with the same kernel on contiguous copies: the strided
variant runs the same operations, only its loads and stores differ. Lane counts cover the
vector loop, the staged tail (1003 = 62 x 16 + 11) and a second thread's range."""

from __future__ import annotations

import numpy as np
import pytest

from core_ad import sym

SIZES = [1, 2, 5, 16, 1003, 70_001]


def llvm(outputs, inputs, **kw):
    return sym.compile(outputs, inputs, backend="llvm", **kw)


@pytest.fixture(scope="module", params=["float32", "float64"])
def mixed(request):
    """A kernel over floats, an int and a bool, with float, bool and int outputs."""
    dt = request.param
    x, y = sym.var("x", dt), sym.var("y", dt)
    i, b = sym.var("i", "int32"), sym.var("b", "bool")
    outputs = [x * y + 1.0, sym.sqrt(x * x + y), sym.where(b, x, y * sym.astype(i, dt)), x > y,
               i + 3]
    return llvm(outputs, [x, y, i, b]), dt


def _inputs(n, dt, rng):
    """The four inputs as columns of row-major blocks, and contiguous copies of them."""
    block = rng.random((n, 5)).astype(dt)
    ints = rng.integers(-9, 9, (n, 3)).astype(np.int32)
    bools = rng.random((n, 2)) > 0.5
    strided = [block[:, 1], block[:, 4], ints[:, 2], bools[:, 1]]
    return strided, [np.ascontiguousarray(a) for a in strided]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_inputs_give_the_contiguous_results(mixed, n, threads):
    fn, dt = mixed
    strided, contiguous = _inputs(n, dt, np.random.default_rng(n))
    want = fn(*contiguous, num_threads=threads)
    got = fn(*strided, num_threads=threads)
    assert fn.last_call["strided"] == (n > 1)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_out_writes_columns_of_blocks_and_nothing_else(mixed, n, threads):
    fn, dt = mixed
    strided, contiguous = _inputs(n, dt, np.random.default_rng(n + 1))
    want = fn(*contiguous, num_threads=threads)
    floats = np.full((n, 4), -7.0, dt)
    flags = np.zeros((n, 2), bool)
    ints = np.full(n, -5, np.int32)  # a contiguous out array beside strided ones
    out = [floats[:, 0], floats[:, 3], floats[:, 1], flags[:, 1], ints]
    got = fn(*strided, num_threads=threads, out=out)
    assert all(g is o for g, o in zip(got, out))
    for w, o in zip(want, out):
        np.testing.assert_array_equal(o, w)
    assert (floats[:, 2] == -7.0).all() and not flags[:, 0].any()  # the other columns


def test_scalar_loop_and_scatter_kernels_read_strided_lanes():
    """The scalar loop (``vectorize=False``) and the vector loop with a scalar remainder (a
    kernel with a scatter_add output) load strided lanes too."""
    x, i, buf = sym.var("x"), sym.var("i", "int64"), sym.buffer("acc")
    scalar = llvm([sym.exp(x) * 2.0], [x], vectorize=False)
    scatter = llvm([sym.scatter_add(buf, i, x * x), x + 1.0], [x, i, buf])
    rng = np.random.default_rng(3)
    block = rng.random((1003, 3))
    index = rng.integers(0, 10, (1003, 2))
    np.testing.assert_array_equal(scalar(block[:, 2])[0],
                                  scalar(np.ascontiguousarray(block[:, 2]))[0])
    want = scatter(np.ascontiguousarray(block[:, 1]), np.ascontiguousarray(index[:, 0]),
                   np.zeros(10), num_threads=1)
    got = scatter(block[:, 1], index[:, 0], np.zeros(10), num_threads=1)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


def test_a_broadcast_view_is_a_lane_input_of_stride_zero():
    x, y = sym.var("x"), sym.var("y")
    fn = llvm([x * y], [x, y])
    y_lanes = np.random.default_rng(0).random(1003)
    got = fn(np.broadcast_to(np.float64(3.0), (1003,)), y_lanes)[0]
    np.testing.assert_array_equal(got, 3.0 * y_lanes)


def test_numpy_backend_out_matches():
    x, y = sym.var("x"), sym.var("y")
    outputs = [x * y, x - y]
    fast, ref = llvm(outputs, [x, y]), sym.compile(outputs, [x, y], backend="numpy")
    block = np.random.default_rng(1).random((101, 2))
    for fn in (fast, ref):
        out = np.zeros((101, 3))
        fn(block[:, 0], block[:, 1], out=[out[:, 2], out[:, 0]])
        np.testing.assert_array_equal(out[:, 2], block[:, 0] * block[:, 1])
        np.testing.assert_array_equal(out[:, 0], block[:, 0] - block[:, 1])
    with pytest.raises(ValueError, match=r"out=: expected 2 arrays \(one per output\), got 1"):
        ref(block[:, 0], block[:, 1], out=[np.zeros(101)])


# --------------------------------------------------------------------------------------------
# bad arguments


@pytest.fixture(scope="module")
def fxy():
    x, y = sym.var("x"), sym.var("y")
    return llvm([x * y, x + y], [x, y])


def test_out_needs_one_array_per_output_of_the_lanes_and_dtype(fxy):
    x, y = np.ones(4), np.ones(4)
    with pytest.raises(ValueError, match=r"out=: expected 2 arrays \(one per output\), got 1"):
        fxy(x, y, out=[np.zeros(4)])
    with pytest.raises(ValueError, match=r"out\[1\]: expected a 1-D array of 4 lanes, got"
                                         r" \(5,\)"):
        fxy(x, y, out=[np.zeros(4), np.zeros(5)])
    with pytest.raises(TypeError, match=r"out\[0\]: expected dtype float64, got float32"):
        fxy(x, y, out=[np.zeros(4, np.float32), np.zeros(4)])
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"out\[0\] must be writable and aligned"):
        fxy(x, y, out=[frozen, np.zeros(4)])
    with pytest.raises(ValueError, match=r"out\[1\]: stride -8 bytes is not a positive"):
        fxy(x, y, out=[np.zeros(4), np.zeros(4)[::-1]])


def test_out_must_not_overlap_an_input(fxy):
    block = np.ones((6, 3))
    with pytest.raises(ValueError, match=r"out=: the outputs overlap input 1 \('y'\)"):
        fxy(np.ones(6), block[:, 0], out=[block[:, 1], block[:, 2]])


def test_out_takes_lane_outputs_only():
    x, i, buf = sym.var("x"), sym.var("i", "int64"), sym.buffer("acc")
    fn = llvm([sym.lane_sum(x), x * 2.0], [x, i, buf])
    with pytest.raises(ValueError, match=r"scatter_add or lane_sum outputs; out= takes lane"):
        fn(np.ones(3), np.zeros(3, np.int64), np.zeros(2), out=[np.zeros(3), np.zeros(3)])


def test_negative_strides_and_strided_buffers_are_refused():
    x, i, buf = sym.var("x"), sym.var("i", "int64"), sym.buffer("tbl")
    fn = llvm([sym.gather(buf, i) * x], [x, i, buf])
    idx = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is not a strided lane array \(stride"
                                         r" -8 bytes"):
        fn(np.ones(4)[::-1], idx, np.ones(3))
    with pytest.raises(ValueError, match=r"input 2 \('tbl'\) is not contiguous \(stride 16"
                                         r" bytes.*ascontiguousarray"):
        fn(np.ones(4), idx, np.ones(6)[::2])
