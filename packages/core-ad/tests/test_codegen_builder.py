"""The kernel-building layer (``core_ad.codegen.KernelModule`` and friends): entry points,
loops with vector body and scalar tail, reductions, masked stores, gathers, parallel_for."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
from core_ad import codegen, sym
from llvmlite import ir


def _table(*arrays):
    return (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])


def _axpy_module(name="axpy", scale=2.0):
    """y[i] = scale * x[i] + y[i] (vector main loop, scalar tail) and sum(x) (per-range
    partial sums), two entry points of one module."""
    x = sym.var("x")
    y = sym.var("y")
    mod = codegen.KernelModule(name)
    f = mod.range_function("axpy")
    b = f.builder
    xs, ys = f.pointer(0, np.float64), f.pointer(1, np.float64)
    W = codegen.host_vector_width(np.float64)

    def step(i, w):
        if w:
            xv, yv = codegen.dense_load(b, xs, i, w), codegen.dense_load(b, ys, i, w)
        else:
            xv, yv = b.load(b.gep(xs, [i])), b.load(b.gep(ys, [i]))
        out = codegen.emit(b, scale * x + y, {x: xv, y: yv})
        if w:
            codegen.dense_store(b, out, ys, i)
        else:
            b.store(out, b.gep(ys, [i]))

    codegen.vector_loop(b, f.start, f.end, W, step)
    f.ret()

    g = mod.range_function("partial_sum")
    b = g.builder
    xs, part = g.pointer(0, np.float64), g.pointer(1, np.float64)
    acc = b.alloca(ir.DoubleType())
    b.store(ir.Constant(ir.DoubleType(), 0.0), acc)

    def add(i, w):
        v = codegen.dense_load(b, xs, i, w) if w else b.load(b.gep(xs, [i]))
        b.store(b.fadd(b.load(acc), codegen.hsum(b, v)), acc)

    codegen.vector_loop(b, g.start, g.end, W, add)
    b.store(b.load(acc), b.gep(part, [g.start]))
    g.ret()
    return mod, W


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 8, 9, 17, 1000, 100_003])
def test_vector_loop_with_tail_and_two_entry_points(n):
    mod, W = _axpy_module()
    k = mod.compile()
    rng = np.random.default_rng(n)
    xs, ys = rng.normal(size=n), rng.normal(size=n)
    want = 2.0 * xs + ys
    t = _table(xs, ys)
    assert all(rc == 0 for rc in codegen.parallel_for(k["axpy"], n, (ctypes.addressof(t),),
                                                      align=W))
    np.testing.assert_allclose(ys, want, rtol=0, atol=1e-15)
    part = np.zeros(max(n, 1))
    t2 = _table(xs, part)
    codegen.parallel_for(k["partial_sum"], n, (ctypes.addressof(t2),), threads=2, align=W)
    np.testing.assert_allclose(part.sum(), xs.sum(), rtol=1e-12, atol=1e-12)


def test_equal_modules_compile_once_and_different_modules_do_not_clash():
    """Entry names repeat across modules (both have "axpy"); the symbols carry a hash of the
    module, so each module's callable runs its own code."""
    m1, _ = _axpy_module(scale=2.0)
    m2, _ = _axpy_module(scale=3.0)
    m1b, _ = _axpy_module(scale=2.0)
    k1, k2, k1b = m1.compile(), m2.compile(), m1b.compile()
    addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value
    assert addr(k1["axpy"]) == addr(k1b["axpy"]) != addr(k2["axpy"])
    xs, ys = np.ones(5), np.zeros(5)
    t = _table(xs, ys)
    k2["axpy"](0, 5, ctypes.addressof(t))
    np.testing.assert_array_equal(ys, 3.0)
    k1["axpy"](0, 5, ctypes.addressof(t))
    np.testing.assert_array_equal(ys, 5.0)


def test_typed_scalar_and_pointer_arguments():
    mod = codegen.KernelModule("typed")
    f = mod.function("fill", [codegen.Arg("out", np.float32, pointer=True),
                              codegen.Arg("n", np.int64), codegen.Arg("value", np.float32)])
    b = f.builder
    with codegen.loop(b, ir.Constant(ir.IntType(64), 0), f.arg("n")) as i:
        b.store(f.arg("value"), b.gep(f.arg("out"), [i]))
    f.ret()
    fill = mod.compile()["fill"]
    out = np.zeros(11, np.float32)
    assert fill(out.ctypes.data, 11, 2.5) == 0
    np.testing.assert_array_equal(out, 2.5)


def test_reductions_masked_store_and_gather():
    W = 8
    mod = codegen.KernelModule("lanes")
    f = mod.range_function("lanes")
    b = f.builder
    src, idx, out, red = (f.pointer(0, np.float32), f.pointer(1, np.int32),
                          f.pointer(2, np.float32), f.pointer(3, np.float32))
    zero = ir.Constant(ir.IntType(64), 0)
    v = codegen.dense_load(b, src, zero, W)
    ind = codegen.dense_load(b, idx, zero, W)
    g = codegen.gather(b, src, ind, offset=ir.Constant(ir.IntType(32), 1))
    codegen.dense_store(b, g, out, zero)
    mask = b.fcmp_ordered(">", v, codegen.splat(b, ir.Constant(ir.FloatType(), 0.0), W))
    codegen.masked_dense_store(b, v, out, ir.Constant(ir.IntType(64), W), mask)
    for k, r in enumerate((codegen.hsum, codegen.hmin, codegen.hmax)):
        b.store(r(b, v), b.gep(red, [ir.Constant(ir.IntType(64), k)]))
    f.ret()
    fn = mod.compile()["lanes"]
    rng = np.random.default_rng(3)
    s = rng.normal(size=W + 1).astype(np.float32)
    i = rng.integers(0, W, size=W).astype(np.int32)
    o = np.full(2 * W, -7.0, np.float32)
    r = np.zeros(3, np.float32)
    t = _table(s, i, o, r)
    assert fn(0, 1, ctypes.addressof(t)) == 0
    np.testing.assert_array_equal(o[:W], s[i + 1])
    np.testing.assert_array_equal(o[W:], np.where(s[:W] > 0, s[:W], -7.0))
    np.testing.assert_allclose(r, [s[:W].sum(), s[:W].min(), s[:W].max()], rtol=1e-6)


def test_parallel_for_ranges_are_aligned_and_per_thread_args():
    seen = []

    def fn(s, e, k):
        seen.append((s, e, k))
        return 0

    codegen.parallel_for(fn, 1001, lambda k: (k,), threads=2, chunks_per_thread=3, align=8)
    seen.sort()
    assert seen[0][0] == 0 and seen[-1][1] == 1001
    assert all(a[1] == b[0] for a, b in itertools.pairwise(seen))  # contiguous, no gaps
    assert all(s % 8 == 0 for s, _, _ in seen)
    assert sorted(k for _, _, k in seen) == list(range(len(seen)))
    seen.clear()
    codegen.parallel_for(fn, 100, (0,), threads=4, min_per_thread=60)
    assert seen == [(0, 100, 0)]  # too little work to split


def test_failure_status_and_duplicate_entry_names():
    mod = codegen.KernelModule("fails")
    f = mod.range_function("check", ints=True)
    b = f.builder
    limit = f.integer(0)
    with codegen.loop(b, f.start, f.end) as i:
        ok = b.function.append_basic_block("ok")
        b.cbranch(b.icmp_signed(">=", i, limit), f.fail_block(4), ok)
        b.position_at_end(ok)
    f.ret()
    with pytest.raises(ValueError, match="defined twice"):
        mod.range_function("check")
    fn = mod.compile()["check"]
    ints = np.array([10], np.int64)
    ptrs = (ctypes.c_void_p * 1)()
    assert fn(0, 10, ctypes.addressof(ptrs), ints.ctypes.data) == 0
    assert fn(0, 11, ctypes.addressof(ptrs), ints.ctypes.data) == 4


def _rows_module():
    """``grid(start, end, ptrs=[out], ints=[cols, bad])``: for each row in [start, end), the
    columns run on the thread pool from compiled code (``call_parallel``): out[row, j] = row *
    1000 + j, and column ``bad`` fails with status 5. The row reaches the body through the
    closure."""
    mod = codegen.KernelModule("rows")
    body = mod.range_function("columns", ints=True)
    cb = body.builder
    closure = cb.bitcast(body.arg("ptrs"), ir.LiteralStructType(
        [ir.IntType(64), ir.DoubleType().as_pointer()]).as_pointer())
    zero, one = ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 1)
    row, out = cb.load(cb.gep(closure, [zero, zero])), cb.load(cb.gep(closure, [zero, one]))
    cols, bad = body.integer(0), body.integer(1)
    with codegen.loop(cb, body.start, body.end) as j:
        ok = cb.function.append_basic_block("ok")
        cb.cbranch(cb.icmp_signed("==", j, bad), body.fail_block(5), ok)
        cb.position_at_end(ok)
        value = cb.sitofp(cb.add(cb.mul(row, ir.Constant(ir.IntType(64), 1000)), j),
                          ir.DoubleType())
        cb.store(value, cb.gep(out, [cb.add(cb.mul(row, cols), j)]))
    body.ret()

    f = mod.range_function("grid", ints=True)
    b = f.builder
    slot = b.alloca(ir.LiteralStructType([ir.IntType(64), ir.DoubleType().as_pointer()]))
    b.store(f.pointer(0, np.float64), b.gep(slot, [zero, one]))
    with codegen.loop(b, f.start, f.end) as i:
        b.store(i, b.gep(slot, [zero, zero]))
        rc = mod.call_parallel(b, body, b.bitcast(slot, ir.IntType(8).as_pointer().as_pointer()),
                               f.arg("ints"), f.integer(0))
        failed, done = b.function.append_basic_block("failed"), b.function.append_basic_block(
            "done")
        b.cbranch(b.icmp_signed("!=", rc, zero), failed, done)
        ir.IRBuilder(failed).ret(rc)
        b.position_at_end(done)
    f.ret()
    return mod.compile()["grid"]


def test_parallel_loop_called_from_compiled_code(monkeypatch):
    from core_ad._codegen.llvm import builder

    extents = []
    run = builder.parallel_for
    monkeypatch.setattr(builder, "parallel_for",
                        lambda fn, n, args, **kw: extents.append(n) or run(fn, n, args, **kw))
    grid = _rows_module()
    out = np.zeros((7, 301))
    ptrs = _table(out)
    ints = np.array([301, -1], np.int64)
    assert grid(0, 7, ctypes.addressof(ptrs), ints.ctypes.data) == 0
    np.testing.assert_array_equal(out, np.arange(7)[:, None] * 1000.0 + np.arange(301))
    assert extents == [301] * 7  # one pool run per row
    ints[1] = 250  # a failing column: its status stops the caller at the first row
    out[:] = 0
    assert grid(0, 7, ctypes.addressof(ptrs), ints.ctypes.data) == 5
    assert not out[1:].any()


def test_compile_ir_returns_several_addresses():
    mod, _ = _axpy_module(name="several")
    text, h = mod.ir_text()
    addrs, _ = codegen.compile_ir(text, f"several_direct_{h}",
                                  [f"axpy_{h}", f"partial_sum_{h}"])
    assert len(addrs) == 2 and all(addrs) and addrs[0] != addrs[1]


def test_map_ordered_keeps_order_bounds_the_window_and_nests_parallel_for():
    import threading
    import time

    from core_ad.codegen import map_ordered, parallel_for

    running, peak, lock = [0], [0], threading.Lock()

    def work(k):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        # a nested parallel_for from a pool thread: must not wait for helpers that never start
        out = np.zeros(64)
        parallel_for(lambda s, e: out.__setitem__(slice(s, e), k) or 0, 64, (), threads=2)
        time.sleep(0.002 * (k % 3))  # finish out of order
        with lock:
            running[0] -= 1
        return k, out.sum()

    got = list(map_ordered(work, range(12), window=2))
    assert [k for k, _ in got] == list(range(12))
    assert [s for _, s in got] == [64.0 * k for k in range(12)]
    assert peak[0] <= 2
    assert list(map_ordered(lambda k: k * k, range(5), window=1)) == [0, 1, 4, 9, 16]

    def failing(k):
        if k == 3:
            raise ValueError("item 3")
        return work(k)

    with pytest.raises(ValueError, match="item 3"):
        list(map_ordered(failing, range(12), window=2))
    assert running[0] == 0  # the call running beside the failed one was awaited
