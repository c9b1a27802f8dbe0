"""The LLVM backend (``sym.compile(..., backend="llvm")``) against the numpy reference backend.

Tolerances (and why):

* exact (``assert_array_equal``): arithmetic, comparisons, selects, rounding, casts,
  ``sqrt``/``rsqrt``, min/max/clamp, gathers -- the same IEEE operations in the same order
  (n-ary sums and products are folded in the numpy backend's order);
* transcendentals and ``pow``: within :data:`~core_ad._codegen.llvm.vecmath.ULP_BOUNDS` ulp of
  numpy's result (4 ulp in float64 and in float32, i.e. < 4.8e-7 relative in float32; the
  measured table is in the vecmath docstring): libmvec / libm versus numpy's own math;
* scatter_add: 1e-12 relative in float64 (summation order differs from ``np.add.at`` once
  lanes are split between threads), exact for integers, 1e-5 of the bin's absolute sum in
  float32.

Lane counts are chosen so that both the vector main loop and the scalar remainder run
(1003 = 250 x 4 + 3 = 125 x 8 + 3). Kernels are compiled once per module (fixtures) and the
kernel cache is shared, to keep the file fast.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from llvmlite import ir

from core_ad import Primitive, codegen, sym
from core_ad._codegen import cache as kcache
from core_ad import _accuracy as accuracy
from core_ad._codegen.llvm import vecmath
from core_ad._codegen.llvm.jit import jit
from core_ad._sym.expr import freeze_params
from core_ad._sym.simplify import CORE_PRIMITIVES, _node

N = 1003
FLOATS = ("float64", "float32")
LANEWISE = sorted((p for p in CORE_PRIMITIVES if p.elementwise), key=lambda p: p.name)
BY_NAME = {p.name: p for p in LANEWISE}
TRANSCENDENTAL = set(vecmath.MATH_FUNCTIONS) | {"pow"}
SRC = os.path.join(os.path.dirname(__file__), os.pardir, "src")


def llvm(outputs, inputs, **kw):
    return sym.compile(outputs, inputs, backend="llvm", **kw)


def ref(outputs, inputs):
    return sym.compile(outputs, inputs, backend="numpy")


def _raw(pname, *args, **params):
    """The node ``pname(*args)`` exactly (no simplification: sub stays sub, neg stays neg)."""
    prim = BY_NAME[pname]
    return _node(prim, tuple(sym.as_expr(a) for a in args), freeze_params(params, pname), params)


# --------------------------------------------------------------------------------------------
# every lane-wise primitive of the registry, float32 and float64


def close_scaled(got, want, mag, ulps, dt=None):
    """|got - want| <= ulps * eps * mag per lane: the error bound of a compound expression
    whose terms have absolute sum ``mag`` (cancellation makes plain relative error useless)."""
    dt = np.dtype(dt or want.dtype)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = ulps * np.finfo(dt).eps * np.asarray(mag, np.float64)
    bad = ~(err <= bound)
    assert not bad.any(), (got[bad][:5], want[bad][:5], (err / np.maximum(bound, 1e-300))[bad][:5])


def _vars(dt):
    other = "float32" if dt == "float64" else "float64"
    return dict(
        r=sym.var("r", dt), s=sym.var("s", dt), u=sym.var("u", dt), p=sym.var("p", dt),
        c=sym.var("c", "bool"), d=sym.var("d", "bool"), i=sym.var("i", "int64"),
        j=sym.var("j", "int32"), buf=sym.buffer("buf", dt), other=other,
    )


def _cases(dt):
    """(primitive name, node) covering every lane-wise primitive with in-domain operands."""
    V = _vars(dt)
    r, s, u, p, c, d, i, j, buf = (V[k] for k in "r s u p c d i j buf".split())
    k = lambda v: sym.const(v, dt)  # noqa: E731
    cases = [
        ("add", _raw("add", r, s)), ("add", _raw("add", r, s, u)),
        ("sub", _raw("sub", r, s)), ("neg", _raw("neg", r)), ("identity", _raw("identity", r)),
        ("stop_gradient", _raw("stop_gradient", r)),
        ("mul", _raw("mul", r, s)), ("mul", _raw("mul", r, s, u)), ("div", _raw("div", r, p)),
        ("safe_mul", _raw("safe_mul", r, s)),
        ("pow", _raw("pow", p, s)), ("pow", _raw("pow", r, k(2))), ("pow", _raw("pow", r, k(3))),
        ("pow", _raw("pow", r, k(4))), ("pow", _raw("pow", p, k(0.5))),
        ("pow", _raw("pow", p, k(-1))), ("pow", _raw("pow", p, k(-2))),
        ("pow", _raw("pow", p, k(2.5))),
        ("exp", _raw("exp", r)), ("expm1", _raw("expm1", r)), ("log", _raw("log", p)),
        ("log1p", _raw("log1p", p)), ("sqrt", _raw("sqrt", p)), ("rsqrt", _raw("rsqrt", p)),
        ("sin", _raw("sin", r)), ("cos", _raw("cos", r)), ("tan", _raw("tan", u)),
        ("asin", _raw("asin", u)), ("acos", _raw("acos", u)), ("atan", _raw("atan", r)),
        ("sinh", _raw("sinh", r)), ("cosh", _raw("cosh", r)), ("tanh", _raw("tanh", r)),
        ("erf", _raw("erf", r)), ("abs", _raw("abs", r)), ("atan2", _raw("atan2", r, s)),
        ("maximum", _raw("maximum", r, s)), ("minimum", _raw("minimum", r, s)),
        ("clamp", _raw("clamp", r, u, p)), ("sign", _raw("sign", r)),
        ("floor", _raw("floor", r)), ("ceil", _raw("ceil", r)), ("round", _raw("round", r)),
        ("trunc", _raw("trunc", r)),
        ("floor_divide", _raw("floor_divide", r, s)), ("mod", _raw("mod", r, s)),
        ("floor_divide", _raw("floor_divide", i, j)), ("mod", _raw("mod", j, j)),
        ("mod", _raw("mod", i, i)),
        ("lt", _raw("lt", r, s)), ("le", _raw("le", r, s)), ("gt", _raw("gt", r, s)),
        ("ge", _raw("ge", r, s)), ("eq", _raw("eq", r, s)), ("ne", _raw("ne", r, s)),
        ("logical_and", _raw("logical_and", c, d)), ("logical_or", _raw("logical_or", c, d)),
        ("logical_not", _raw("logical_not", c)), ("isfinite", _raw("isfinite", r)),
        ("isnan", _raw("isnan", r)),
        ("cast", _raw("cast", r, dtype=np.dtype("int32"))),
        ("cast", _raw("cast", r, dtype=np.dtype("int64"))),
        ("cast", _raw("cast", r, dtype=np.dtype("bool"))),
        ("cast", _raw("cast", j, dtype=np.dtype(dt))),
        ("convert", _raw("convert", r, dtype=np.dtype(V["other"]))),
        ("select", _raw("select", c, r, s)),
        ("lane_gather", _raw("lane_gather", buf, j, name="buf")),
        ("lane_gather", _raw("lane_gather", buf, i, name="buf")),
        ("lane_scatter_add", _raw("lane_scatter_add", buf, j, r, name="buf")),
        ("lane_sum", _raw("lane_sum", r)),
    ]
    inputs = [V[k] for k in "r s u p c d i j buf".split()]
    return cases, inputs


def _inputs(dt, n=N, seed=0):
    rng = np.random.default_rng(seed)
    r = rng.uniform(-3, 3, n)
    r[:9] = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 1.5][:n]
    s = rng.uniform(-3, 3, n)
    s[::7] = r[::7]  # ties for comparisons, maximum, minimum
    u = rng.uniform(-0.99, 0.99, n)
    p = np.exp(rng.uniform(np.log(0.05), np.log(10.0), n))
    c = rng.random(n) < 0.5
    d = rng.random(n) < 0.5
    buf = rng.normal(size=37).astype(dt)
    i = rng.integers(0, 37, n).astype(np.int64)
    j = rng.integers(0, 37, n).astype(np.int32)
    return [r.astype(dt), s.astype(dt), u.astype(dt), p.astype(dt), c, d, i, j, buf]


class Table:
    """Every case of one dtype, compiled in two kernels: the cases with 64-bit values (4
    lanes per vector on AVX2) and the rest (8 lanes per vector in float32)."""

    def __init__(self, dt):
        self.dt = dt
        self.cases, self.inputs = _cases(dt)
        wide = lambda n: any(m.dtype.itemsize >= 8 and m.op != "buffer"  # noqa: E731
                             for m in sym.toposort(n) if isinstance(m, sym.Expr))
        groups = {True: [], False: []}
        for k, (_, node) in enumerate(self.cases):
            groups[wide(node)].append(k)
        arrays = _inputs(dt)
        self.got, self.want = {}, {}
        self.kernels = []
        for ks in groups.values():
            if not ks:
                continue
            outs = [self.cases[k][1] for k in ks]
            fn = llvm(outs, self.inputs)
            self.kernels.append(fn)
            got = fn(*arrays, num_threads=1)
            want = ref(outs, self.inputs)(*arrays)
            for k, g, w in zip(ks, got, want):
                self.got[k], self.want[k] = g, w


_TABLES: dict = {}


def table(dt) -> Table:
    if dt not in _TABLES:
        _TABLES[dt] = Table(dt)
    return _TABLES[dt]


def test_every_lanewise_primitive_has_a_lowering():
    missing = [p.name for p in LANEWISE if codegen.lowering_for(p) is None]
    assert not missing, f"lane-wise primitives without an LLVM lowering: {missing}"
    # ... and a case in the agreement table below
    covered = {name for name, _ in _cases("float64")[0]}
    assert covered == set(BY_NAME), set(BY_NAME) ^ covered


def _check_case(tab, k):
    name, node = tab.cases[k]
    g, w = tab.got[k], tab.want[k]
    assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype)
    if name in ("lane_scatter_add", "lane_sum"):  # summation orders differ
        np.testing.assert_allclose(g, w, rtol=1e-12 if tab.dt == "float64" else 1e-5,
                                   err_msg=name)
    elif name in TRANSCENDENTAL:
        err = vecmath.ulp_error(g, w)
        assert err.max() <= vecmath.ULP_BOUNDS[tab.dt], (name, tab.dt, err.max())
    else:
        np.testing.assert_array_equal(g, w, err_msg=f"{name} {tab.dt}")


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_primitive_matches_numpy(name, dt):
    tab = table(dt)
    ks = [k for k, (nm, _) in enumerate(tab.cases) if nm == name]
    assert ks
    for k in ks:
        _check_case(tab, k)


def test_kernels_are_vector_code_calling_libmvec():
    """The main loop is explicit vector code at the host ISA's width (<4 x double> / <8 x float>
    on AVX2, <8 x double> / <16 x float> on AVX-512), with libmvec calls of that width."""
    isa = vecmath.host_isa() or "b"
    w64, w32 = vecmath.ISA_WIDTHS[isa]
    f64 = table("float64").kernels[0]
    f32 = [k for k in table("float32").kernels if k.width == w32]
    assert f64.width == w64 and f"<{w64} x double>" in f64.ir
    assert f32 and f"<{w32} x float>" in f32[0].ir
    if vecmath.libmvec_available() and isa in ("d", "e"):
        assert f"_ZGV{isa}N{w64}v_sin" in f64.ir and f"_ZGV{isa}N{w64}vv_atan2" in f64.ir
        assert f"_ZGV{isa}N{w32}v_sinf" in f32[0].ir and f"_ZGV{isa}N{w32}vv_powf" in f32[0].ir
        assert ("zmm" if isa == "e" else "ymm") in f64.assembly()
    assert '@"sin"(' in f64.ir  # the scalar remainder calls libm


@pytest.mark.parametrize("lanes, dtype, variant", [
    (8, np.float32, "_ZGVdN8vv_powf"),    # AVX2's 8 lanes, not a padded 16-lane AVX-512 call
    (4, np.float32, "_ZGVbN4vv_powf"),    # SSE's
    (4, np.float64, "_ZGVdN4vv_pow"),
    (32, np.float32, "_ZGVeN16vv_powf"),  # wider than every variant: split into 16-lane calls
])
def test_vector_calls_take_the_variant_of_their_width(lanes, dtype, variant):
    """On an AVX-512 host, a vector narrower than the host's variant calls the narrower ISA's
    variant of exactly its width (a Halide-style ``vectorize(x, 8)`` of float32)."""
    if not vecmath.libmvec_available("e"):
        pytest.skip("libmvec is not available")
    from llvmlite import ir

    ft = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    vt = ir.VectorType(ft, lanes)
    module = ir.Module("widths")
    fn = ir.Function(module, ir.FunctionType(vt, [vt, vt]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(vecmath.VecMath(isa="e").call(b, "pow", list(fn.args), dtype))
    text = str(module)
    assert variant in text
    assert len({name for name in ("_ZGVeN16vv_powf", "_ZGVdN8vv_powf", "_ZGVbN4vv_powf",
                                  "_ZGVdN4vv_pow") if f'@"{name}"(' in text}) == 1


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.5, 1.5, 3e9, -3e9, 1e20,
           -7.25, 1e-310]


@pytest.mark.parametrize("dt", FLOATS)
def test_exact_primitives_on_special_values(dt):
    """NaN, infinities, signed zeros, ties, out-of-range casts: bit-for-bit numpy results."""
    x, y = sym.var("x", dt), sym.var("y", dt)
    names2 = "add sub mul div maximum minimum safe_mul lt le gt ge eq ne".split()
    names1 = "neg abs sign floor ceil round trunc isfinite isnan sqrt rsqrt".split()
    outs = [_raw(n, x, y) for n in names2] + [_raw(n, x) for n in names1]
    outs += [_raw("cast", x, dtype=np.dtype(t)) for t in
             "int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool".split()]
    outs += [_raw("clamp", x, y, sym.const(1.0, dt)), _raw("select", _raw("gt", x, y), x, y)]
    a = np.array(SPECIAL, dt)
    xs = np.repeat(a, len(a))
    ys = np.tile(a, len(a))  # every pair
    with np.errstate(all="ignore"):
        want = ref(outs, [x, y])(xs, ys)
    got = llvm(outs, [x, y])(xs, ys)
    for o, g, w in zip(outs, got, want):
        np.testing.assert_array_equal(g, w, err_msg=f"{o.prim.name} {dt}")
    # ties give the second operand, as numpy's maximum / minimum; sign(-0) is +0
    tie = xs == ys
    for k in (names2.index("maximum"), names2.index("minimum")):
        assert np.array_equal(np.signbit(got[k][tie]), np.signbit(ys[tie]))
    assert not np.signbit(got[len(names2) + names1.index("sign")][xs == 0]).any()


@pytest.mark.parametrize("it", ["int32", "int64", "uint8"])
def test_integer_arithmetic_matches_numpy(it):
    a, b = sym.var("a", it), sym.var("b", it)
    e = sym.var("e", it)
    signed = np.dtype(it).kind == "i"
    outs = [a + b, a * b, _raw("sub", a, b), _raw("abs", a), _raw("sign", a),
            sym.maximum(a, b), sym.minimum(a, b), sym.clamp(a, b, sym.const(5, it)),
            a < b, sym.eq(a, b), a / b, _raw("pow", a, e), sym.astype(a, "float32"),
            sym.floor(a), sym.where(a > b, a, b)]
    if signed:
        outs.append(_raw("neg", a))
    rng = np.random.default_rng(4)
    lo = -20 if signed else 0
    av = rng.integers(lo, 20, 203).astype(it)
    bv = rng.integers(1, 20, 203).astype(it)
    ev = rng.integers(0, 12, 203).astype(it)
    with np.errstate(all="ignore"):
        want = ref(outs, [a, b, e])(av, bv, ev)
    got = llvm(outs, [a, b, e])(av, bv, ev)
    for o, g, w in zip(outs, got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w, err_msg=f"{o!r} {it}")


@pytest.mark.parametrize("ft", FLOATS)
@pytest.mark.parametrize("it", ["int32", "int64"])
def test_in_range_float_to_int_cast_is_a_plain_truncation_with_the_same_values(ft, it):
    """``astype(..., in_range=True)`` drops the range checks (no ``fptosi.sat``, no compare
    against the int's bounds) and gives numpy's values on in-range operands and NaN (INT_MIN);
    an operand that breaks the promise still gives some int (frozen, never poison)."""
    x = sym.var("x", ft)
    hinted, plain = sym.astype(x, it, in_range=True), sym.astype(x, it)
    assert hinted is not plain and hinted.params["in_range"]
    values = np.array([0.0, -0.0, 0.5, -0.5, 1.99, -1.99, 1e6, -1e6, 3e4 + 0.25, np.nan,
                       *np.random.default_rng(8).uniform(-1e6, 1e6, 41)], dtype=ft)
    fn = llvm([hinted, plain], [x])
    got_hinted, got_plain = fn(values)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got_hinted, values.astype(it))
    np.testing.assert_array_equal(got_hinted, got_plain)
    ir_text = llvm([hinted], [x]).ir
    assert "freeze" in ir_text and "fptosi" in ir_text and "fptosi.sat" not in ir_text
    assert "fcmp oge" not in ir_text and "fcmp oge" in llvm([plain], [x]).ir  # range checks
    (broken,) = llvm([hinted], [x])(np.array([1e30, -np.inf, np.inf], dtype=ft))
    assert broken.dtype == np.dtype(it)


def test_integer_pow_with_negative_exponent_truncates():
    a, e = sym.var("a", "int64"), sym.var("e", "int64")
    fn = llvm([sym.pow(a, e)], [a, e])
    (got,) = fn(np.array([1, -1, -1, 2, -3, 0, 7]), np.array([-3, -3, -2, -1, -2, 3, 2]))
    np.testing.assert_array_equal(got, [1, -1, 1, 0, 0, 0, 49])


# --------------------------------------------------------------------------------------------
# lane counts, broadcasting, NaN-safety


@pytest.mark.parametrize("dt", FLOATS)
def test_lane_counts_that_are_not_multiples_of_the_vector_width(dt):
    x, y = sym.var("x", dt), sym.var("y", dt)
    e = sym.sin(x) * sym.exp(-x * x) + x**3 + sym.log1p(x * x) + y
    fn, fr = llvm([e, x > y], [x, y]), ref([e, x > y], [x, y])
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 1023):
        xs, ys = rng.normal(size=(2, n)).astype(dt)
        got, want = fn(xs, ys), fr(xs, ys)
        assert got[0].shape == (n,) and got[0].dtype == np.dtype(dt)
        x64, y64 = xs.astype(float), ys.astype(float)
        mag = (np.abs(np.sin(x64) * np.exp(-x64 * x64)) + np.abs(x64**3)
               + np.log1p(x64 * x64) + np.abs(y64))
        close_scaled(got[0], want[0], mag, 16)  # 5 roundings and 3 functions of <= 4 ulp
        np.testing.assert_array_equal(got[1], want[1])


def test_zero_lanes():
    x, i, b = sym.var("x"), sym.var("i", "int64"), sym.buffer("acc")
    fn = llvm([sym.sin(x), sym.scatter_add(b, i, x), sym.const(2.0), x], [x, i, b])
    acc = np.arange(4.0)
    s, out, k, xo = fn(np.zeros(0), np.zeros(0, np.int64), acc)
    assert s.shape == k.shape == xo.shape == (0,)
    np.testing.assert_array_equal(out, acc)
    assert out is not acc


def test_scalars_broadcast_to_every_lane_and_scalar_calls_give_0d():
    x, p = sym.var("x"), sym.var("p", "float32")
    e = sym.sin(p * sym.astype(x, "float32")) + p
    fn, fr = llvm([e, x * 2.0, sym.const(1.5)], [x, p]), ref([e, x * 2.0, sym.const(1.5)], [x, p])
    xs = np.linspace(-2, 2, 37)
    for pv in (np.float32(1.3), np.array(1.3, np.float32), 1.3):
        got, want = fn(xs, pv), fr(xs, pv)
        for g, w in zip(got, want):
            assert g.shape == (37,)
            np.testing.assert_allclose(g, w, rtol=1e-6)
    out = fn(0.5, 1.3)
    assert all(o.shape == () for o in out)
    np.testing.assert_allclose(out[0], fr(0.5, 1.3)[0], rtol=1e-6)
    assert fn.last_call["variant"] == (False, False)  # one lane: no broadcast variant needed


@pytest.mark.parametrize("dt", FLOATS)
def test_where_gradient_is_nan_safe_in_compiled_code(dt):
    x = sym.var("x", dt)
    g = sym.grad(sym.where(x > 0, sym.sqrt(x), 0.0), [x])[0]
    fn = llvm([g], [x])
    np.testing.assert_array_equal(fn(np.array([-1.0, 0.0, 4.0], dt))[0], [0.0, 0.0, 0.25])
    xs = np.tile(np.array([-1.0, 0.0, 4.0], dt), 11)  # 33 lanes: vector loop and remainder
    np.testing.assert_array_equal(fn(xs)[0], np.tile([0.0, 0.0, 0.25], 11))


def test_outputs_are_fresh_arrays():
    x = sym.var("x")
    fn = llvm([x, x, sym.sin(x)], [x])
    xs = np.arange(5.0)
    a, b, _ = fn(xs)
    assert a is not xs and b is not a
    a[0] = 99.0
    assert xs[0] == 0.0 and b[0] == 0.0


# --------------------------------------------------------------------------------------------
# threads and scatter_add


def test_one_and_two_threads_give_identical_results():
    x, y = sym.var("x"), sym.var("y")
    e = sym.sin(x) * sym.exp(-x * x) + sym.arctan2(y, x) + x**3
    fn = llvm([e, sym.grad(e, [x])[0]], [x, y])
    rng = np.random.default_rng(6)
    xs, ys = rng.normal(size=(2, 200_003))
    one = fn(xs, ys, num_threads=1)
    for t in (2, 3):  # 3 threads on 2 cores: more ranges than workers
        many = fn(xs, ys, num_threads=t)
        assert fn.last_call["threads"] == t
        for a, b in zip(one, many):
            np.testing.assert_array_equal(a, b)  # bitwise: lane ranges are vector-aligned
    want = ref([e], [x, y])(xs, ys)[0]
    mag = np.abs(np.sin(xs) * np.exp(-xs * xs)) + np.abs(np.arctan2(ys, xs)) + np.abs(xs**3)
    close_scaled(one[0], want, mag, 16)


def test_chunked_threads_report_the_first_bad_lane_and_sum_deterministically():
    """Without scatters the threads take chunks of lanes in turn: an out-of-range gather is
    reported at its first lane whichever thread met it, and a lane_sum adds its per-chunk
    partials in chunk order (the same value on every call)."""
    b, i, x = sym.buffer("table"), sym.var("i", "int64"), sym.var("x")
    fn = llvm([sym.gather(b, i) * x, sym.lane_sum(x * x)], [b, i, x])
    n = 400_000
    idx = np.zeros(n, np.int64)
    idx[[150_001, 390_000]] = 7  # in different chunks
    with pytest.raises(IndexError, match="index 7 at lane 150001 .* 'table'"):
        fn(np.arange(7.0), idx, np.ones(n), num_threads=2)
    xs = np.random.default_rng(2).normal(size=n)
    sums = {float(fn(np.arange(7.0), np.zeros(n, np.int64), xs, num_threads=2)[1])
            for _ in range(5)}
    assert len(sums) == 1 and fn.last_call["threads"] == 2
    assert abs(sums.pop() - math.fsum(xs * xs)) <= 4 * np.finfo(float).eps * np.sum(xs * xs)


def test_kernels_called_from_every_pool_worker_do_not_deadlock():
    """Each pool worker calls a multi-threaded kernel (lane chunks, and a scatter's one range
    per thread): the helpers it queues cannot start (every worker is busy), so the caller
    takes every range itself and cancels them (codegen.parallel_for)."""
    from core_ad._codegen.llvm.runtime import cpu_count, thread_pool

    x, b, i = sym.var("x"), sym.buffer("acc"), sym.var("i", "int64")
    fn = llvm([sym.sin(x) * 2.0], [x])
    scatter = llvm([sym.scatter_add(b, i, x)], [b, i, x], scatter="partials")
    xs = np.linspace(0.0, 1.0, 300_000)
    idx = np.arange(xs.size) % 7
    futs = [thread_pool().submit(fn, xs, num_threads=2) for _ in range(cpu_count())]
    futs += [thread_pool().submit(scatter, np.zeros(7), idx, xs, num_threads=2)
             for _ in range(cpu_count())]
    want = np.bincount(idx, xs, minlength=7)
    for k, f in enumerate(futs):
        got = f.result(timeout=60)[0]
        if k < cpu_count():
            np.testing.assert_allclose(got, np.sin(xs) * 2.0, rtol=1e-15)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12)


def test_num_threads_from_the_environment(monkeypatch):
    x = sym.var("x")
    fn = llvm([sym.sin(x)], [x])
    xs = np.linspace(0, 1, 200_000)
    monkeypatch.setenv("CORE_AD_NUM_THREADS", "1")
    fn(xs)
    assert fn.last_call["threads"] == 1
    monkeypatch.setenv("CORE_AD_NUM_THREADS", "2")
    fn(xs)
    assert fn.last_call["threads"] == 2


@pytest.mark.parametrize("mode", ["partials", "atomic", "auto"])
@pytest.mark.parametrize("threads", [1, 2])
def test_scatter_add_matches_add_at(mode, threads):
    b, i, x = sym.buffer("acc"), sym.var("i", "int64"), sym.var("x")
    v = sym.sin(x) * 2.0 + 1.0
    fn = llvm([sym.scatter_add(b, i, v), v], [b, i, x], scatter=mode)
    rng = np.random.default_rng(7)
    n = 100_003
    idx = rng.integers(0, 1000, n)
    xs = rng.normal(size=n)
    acc0 = rng.normal(size=1000)
    out, vals = fn(acc0, idx, xs, num_threads=threads)
    want = acc0.copy()
    np.add.at(want, idx, vals)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    assert fn.last_call["threads"] == threads
    assert fn.last_call["atomic"] == (threads == 2 and mode == "atomic")


@pytest.mark.parametrize("mode", ["partials", "atomic"])
def test_scatter_add_integer_and_float32_buffers(mode):
    rng = np.random.default_rng(8)
    n = 70_001
    idx = rng.integers(0, 50, n).astype(np.int32)
    bi, bf, i = sym.buffer("cnt", "int64"), sym.buffer("w", "float32"), sym.var("i", "int32")
    x = sym.var("x", "float32")
    fn = llvm([sym.scatter_add(bi, i, sym.const(1, "int64")), sym.scatter_add(bf, i, x)],
              [bi, bf, i, x], scatter=mode)
    xs = rng.random(n).astype(np.float32)
    for t in (1, 2):
        cnt, w = fn(np.zeros(50, np.int64), np.zeros(50, np.float32), idx, xs, num_threads=t)
        np.testing.assert_array_equal(cnt, np.bincount(idx, minlength=50))
        want = np.zeros(50)
        np.add.at(want, idx, xs.astype(np.float64))
        assert w.dtype == np.float32
        assert np.all(np.abs(w - want) <= 1e-5 * want)


def test_gather_and_scatter_match_numpy_backend():
    rng = np.random.default_rng(9)
    table_, acc = sym.buffer("table"), sym.buffer("acc")
    i, v = sym.var("i", "int32"), sym.var("x")
    outs = [sym.gather(table_, i) * v, sym.scatter_add(acc, i, v * v),
            sym.gather(table_, sym.astype(sym.gather(table_, i) > 0, "int32"))]
    args = (rng.normal(size=50), np.ones(50), rng.integers(0, 50, 1001).astype(np.int32),
            rng.normal(size=1001))
    got = llvm(outs, [table_, acc, i, v])(*args)
    want = ref(outs, [table_, acc, i, v])(*args)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    np.testing.assert_array_equal(got[2], want[2])
    assert got[1].shape == (50,)


# --------------------------------------------------------------------------------------------
# the kernel cache, compile time, the debug flag, the on-disk object cache


def test_second_compile_returns_the_cached_kernel():
    x, y = sym.var("cx"), sym.var("cy")
    e = sym.exp(sym.sin(x) * y) + sym.tanh(x - y)
    t0 = time.perf_counter()
    first = llvm([e], [x, y])
    t1 = time.perf_counter()
    second = llvm([e], [x, y])
    t2 = time.perf_counter()
    print(f"first compile {1e3 * (t1 - t0):.1f} ms, cached {1e6 * (t2 - t1):.1f} us")
    assert second is first  # identity, not timing
    assert first.compile_time > 0
    # a structurally equal graph built again, the inputs given as a tuple: the same kernel
    e2 = sym.exp(sym.sin(sym.var("cx")) * sym.var("cy")) + sym.tanh(sym.var("cx") - sym.var("cy"))
    assert llvm(e2, (sym.var("cx"), sym.var("cy"))) is first
    # other options, other inputs or another output list: another kernel
    assert llvm([e], [x, y], vectorize=False) is not first
    assert llvm([e], [y, x]) is not first
    assert llvm([e, x], [x, y]) is not first


def test_structural_key_depends_on_structure_dtypes_and_constants():
    x, y = sym.var("kx"), sym.var("ky")

    def key(outs, ins, **opts):
        prog = sym.cse(outs)
        return kcache.structural_key(prog, outs, ins, "llvm", tuple(sorted(opts.items())))

    base = key([x * 2.0 + y], [x, y])
    assert base == key([x * 2.0 + y], [x, y])
    assert base != key([x * 3.0 + y], [x, y])  # constant value
    assert base != key([x * 2.0 - y], [x, y])  # primitive
    assert base != key([x * 2.0 + y], [y, x])  # input order
    x32 = sym.var("kx", "float32")
    assert base != key([sym.astype(x32, "float64") * 2.0 + y], [x32, y])  # leaf dtype
    assert base != key([x * 2.0 + y], [x, y], vectorize=False)  # options
    # renaming a var changes the structural key but not the code key
    z = sym.var("kz")
    p1, p2 = sym.cse([x * 2.0 + y]), sym.cse([z * 2.0 + y])
    assert kcache.code_key(p1, [x * 2.0 + y], [x, y]) == kcache.code_key(p2, [z * 2.0 + y],
                                                                         [z, y])
    assert key([x * 2.0 + y], [x, y]) != key([z * 2.0 + y], [z, y])


def test_debug_flag_prints_compile_time(monkeypatch, capfd):
    monkeypatch.setenv("CORE_AD_DEBUG", "1")
    x = sym.var("dbg_x")
    fn = llvm([sym.cosh(x) * 3.25], [x])
    err = capfd.readouterr().err
    assert "core_ad llvm: kernel" in err and "ms" in err and fn.key[:12] in err
    assert fn.compile_time > 0


def _two_processes(code, cache_dir, modes):
    """Run ``code`` (``sys.argv[1]`` = mode) in one fresh process per mode, sharing the disk
    cache ``cache_dir``; the completed processes, each checked to have succeeded."""
    env = dict(os.environ, CORE_AD_CACHE_DIR=str(cache_dir), CORE_AD_DEBUG="1",
               PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = [subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True,
                           text=True, timeout=120) for mode in modes]
    for r in runs:
        assert r.returncode == 0, r.stderr
    return runs


def test_disk_object_cache_is_used_by_a_second_process(tmp_path):
    code = (
        "import numpy as np\n"
        "from core_ad import sym\n"
        "x = sym.var('disk_x')\n"
        "fn = sym.compile([sym.sin(x) * 7.5 + sym.exp(x)], [x], backend='llvm')\n"
        "v = fn(np.linspace(0, 1, 11))[0]\n"
        "assert abs(v[3] - (np.sin(0.3) * 7.5 + np.exp(0.3))) < 1e-14\n"
    )
    runs = _two_processes(code, tmp_path, ("first", "second"))
    assert list(tmp_path.glob("*.o")), "no object file was written"
    assert " compiled in " in runs[0].stderr
    assert " disk cache in " in runs[1].stderr


def test_llvm_cpu_level_compiles_for_that_level_with_its_own_cache_keys(tmp_path):
    """CORE_AD_LLVM_CPU=x86-64-v3 gives AVX2 code (4 float64 lanes, ymm registers, libmvec's
    'd' variants) on any host that has AVX2, under code keys of its own: the host's objects
    in the same disk cache are not reused for it, nor its objects for the host."""
    code = (
        "import os, sys\n"
        "if sys.argv[1] != 'host':\n"
        "    os.environ['CORE_AD_LLVM_CPU'] = sys.argv[1]\n"
        "import numpy as np\n"
        "from core_ad import codegen, sym\n"
        "x = sym.var('level_x')\n"
        "fn = sym.compile([sym.sin(x) * 2.5 + sym.exp(x)], [x], backend='llvm')\n"
        "v = fn(np.linspace(0, 1, 11))[0]\n"
        "assert abs(v[3] - (np.sin(0.3) * 2.5 + np.exp(0.3))) < 1e-14\n"
        "asm = fn.assembly()\n"
        "print(codegen.host_signature().split('|')[1], fn.width, 'zmm' in asm, 'ymm' in asm)\n"
    )
    if not vecmath._host_features().get("avx2") or "CORE_AD_LLVM_CPU" in os.environ:
        pytest.skip("needs an AVX2 host compiling for itself")
    runs = _two_processes(code, tmp_path, ("x86-64-v3", "host", "x86-64-v3"))
    level, host, again = (r.stdout.split() for r in runs)
    assert level == again == ["x86-64-v3", "4", "False", "True"]
    assert host[0] != "x86-64-v3"
    assert " compiled in " in runs[0].stderr and " compiled in " in runs[1].stderr
    assert " disk cache in " in runs[2].stderr


def test_llvm_cpu_names_a_level_the_host_can_run(monkeypatch):
    from core_ad._codegen.llvm import jit as jit_module

    with pytest.raises(jit_module.TargetCPUError, match="expected one of x86-64, x86-64-v2"):
        jit_module.target_cpu("haswell")
    monkeypatch.setattr(jit_module.llvm, "get_host_cpu_features",
                        lambda: {"sse2": True, "avx": True, "avx2": False, "fma": False})
    with pytest.raises(jit_module.TargetCPUError, match="lacks .*avx2.*fma"):
        jit_module.target_cpu("x86-64-v3")
    monkeypatch.setenv("CORE_AD_LLVM_CPU", "")
    assert jit_module.target_cpu()[1]["sse2"]  # unset or empty: the host's own features


def test_disk_cache_is_on_by_default_in_the_user_cache_and_can_be_turned_off(
        monkeypatch, tmp_path):
    from core_ad._codegen.llvm.jit import Jit

    monkeypatch.delenv("CORE_AD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Jit.cache_dir() == os.path.join(str(tmp_path), "core_ad", "kernels")
    for off in ("off", "0", "", "false"):
        monkeypatch.setenv("CORE_AD_CACHE_DIR", off)
        assert Jit.cache_dir() is None
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path / "mine"))
    assert Jit.cache_dir() == str(tmp_path / "mine")


def test_code_keys_hash_the_code_generators_sources(tmp_path):
    """An edit to the emitter changes the fingerprint in every code key, so the disk cache
    cannot serve machine code an older generator built."""
    import shutil

    from core_ad._codegen import cache

    src = os.path.dirname(os.path.abspath(cache.__file__))
    copy = tmp_path / "_codegen"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = cache._generator_fingerprint(str(copy))
    assert cache.CODEGEN_VERSION == "core_ad-llvm-" + before
    with open(copy / "llvm" / "emitter.py", "a") as f:
        f.write("\n# an edit\n")
    assert cache._generator_fingerprint(str(copy)) != before


def test_a_disk_cache_hit_builds_no_ir_and_keeps_bounds_checks(tmp_path):
    """The second process links the object file without building the IR (the kernel builder
    is disabled there); the saved metadata keeps the bounds check's message, and ``.ir`` is
    built on demand."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import pytest\n"
        "from core_ad import sym\n"
        "from core_ad._codegen.llvm import kernel\n"
        "build, refusing = kernel.build_kernel, [sys.argv[1] == 'load']\n"
        "def guarded(*a, **k):\n"
        "    assert not refusing[0], 'IR built on a disk cache hit'\n"
        "    return build(*a, **k)\n"
        "kernel.build_kernel = guarded\n"
        "b, i, x = sym.buffer('disk_table'), sym.var('disk_i', 'int64'), sym.var('disk_y')\n"
        "fn = sym.compile([sym.gather(b, i) * sym.cos(x)], [b, i, x], backend='llvm')\n"
        "t, xs = np.arange(5.0), np.linspace(0, 1, 40)\n"
        "idx = np.arange(40) % 5\n"
        "assert np.allclose(fn(t, idx, xs)[0], t[idx] * np.cos(xs), rtol=1e-14)\n"
        "idx[17] = 9\n"
        "with pytest.raises(IndexError, match=\"index 9 at lane 17 .* 'disk_table'\"):\n"
        "    fn(t, idx, xs)\n"
        "refusing[0] = False\n"
        "assert 'define' in fn.ir\n"
    )
    runs = _two_processes(code, tmp_path, ("compile", "load"))
    assert list(tmp_path.glob("*.json")), "no kernel metadata was written"
    assert " disk cache in " in runs[1].stderr


# --------------------------------------------------------------------------------------------
# options: scalar-only loops, no libmvec


@pytest.mark.parametrize("opts", [{"vectorize": False}, {"libmvec": False}])
def test_scalar_loop_and_libm_fallback_agree(opts):
    x, y = sym.var("x"), sym.var("y", "float32")
    outs = [sym.sin(x) + sym.pow(sym.abs(x) + 0.5, x), sym.erf(y) * sym.arctan(y)]
    fn = llvm(outs, [x, y], **opts)
    w64 = vecmath.ISA_WIDTHS[vecmath.host_isa() or "b"][0]
    if opts.get("libmvec") is False:
        assert "_ZGV" not in fn.ir and f"<{w64} x double>" in fn.ir
    if opts.get("vectorize") is False:
        assert fn.width == 1 and f"<{w64} x double>" not in fn.ir
    rng = np.random.default_rng(10)
    xs = rng.normal(size=301)
    ys = rng.normal(size=301).astype(np.float32)
    got, want = fn(xs, ys), ref(outs, [x, y])(xs, ys)
    close_scaled(got[0], want[0], np.abs(np.sin(xs)) + (np.abs(xs) + 0.5) ** xs, 16)
    assert vecmath.ulp_error(got[1], want[1]).max() <= 8


def test_vecmath_accuracy_table_bounds():
    """Re-measure the docstring table (fewer points): every function within ULP_BOUNDS."""
    acc = accuracy.measure_accuracy(1 << 14)
    bad = {k: v for k, v in acc.items() if v > vecmath.ULP_BOUNDS[k[1]]}
    assert not bad, bad
    assert len(acc) == 4 * len(vecmath.MATH_FUNCTIONS)


# --------------------------------------------------------------------------------------------
# the default backend, user primitives


def test_llvm_is_the_default_backend():
    x = sym.var("x")
    assert codegen.default_backend() == "llvm"
    assert sym.compile([sym.sin(x)], [x]).backend == "llvm"
    assert "llvm" in codegen.available_backends()


def _user_primitive(lowering=None):
    extra = {"out_dtype": np.float64}
    if lowering is not None:
        extra["llvm_lowering"] = lowering
    return Primitive("test_cg_softplus", lambda x: np.log1p(np.exp(x)),
                     partials=lambda args, out, wrt: (None,), elementwise=True, extra=extra)


def test_user_primitive_with_a_lowering_compiles_and_without_falls_back_to_numpy():
    def lower(em, node, args):
        (xv,) = args
        e = em.math.call(em.b, "exp", [xv], node.dtype)
        return em.math.call(em.b, "log1p", [e], node.dtype)

    x = sym.var("x")
    xs = np.linspace(-3, 3, 41)
    with_low = sym.call(_user_primitive(lower), x) * 2.0
    fn = sym.compile([with_low], [x])
    assert fn.backend == "llvm"
    assert vecmath.ulp_error(fn(xs)[0], 2 * np.log1p(np.exp(xs))).max() <= 8
    without = sym.call(_user_primitive(), x) * 2.0
    fb = sym.compile([without], [x])  # the default falls back to the reference backend
    assert fb.backend == "numpy"
    np.testing.assert_allclose(fb(xs)[0], 2 * np.log1p(np.exp(xs)), rtol=1e-14)


# --------------------------------------------------------------------------------------------
# the emitter API, from a hand-written loop nest


def _jit_function(module, name, restype, argtypes):
    # the disk cache is keyed by the module name: name the module by its content, or an
    # object that an older emitter made for this test would be served instead
    text = str(module)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    addr, _ = jit().compile(text, f"{name}_{digest}", name)
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


@pytest.mark.parametrize("width", [None, 4])
def test_emit_with_grad_in_a_hand_written_loop(width):
    """A sibling's loop: for k in range(0, n, W): out[k] = f(x[k], y[k]), grad f, Hessian."""
    x, y = sym.var("ex"), sym.var("ey")
    f = sym.sin(x * y) + x**2 * sym.exp(-y)
    d = ir.DoubleType()
    vt = d if width is None else ir.VectorType(d, width)
    step = 1 if width is None else width
    mod = ir.Module(name=f"emit_test_{width}")
    dp = d.as_pointer()
    name = f"emit_test_{width}"
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [dp, dp, dp, ir.IntType(64)]), name)
    xp, yp, op, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    head, body, done = (fn.append_basic_block(s) for s in ("head", "body", "done"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(ir.IntType(64))
    k.add_incoming(ir.IntType(64)(0), entry)
    b.cbranch(b.icmp_signed("<", k, n), body, done)
    b.position_at_end(body)

    def load(p):
        return b.load(b.bitcast(b.gep(p, [k]), vt.as_pointer()), align=8)

    val, grads, hess = codegen.emit_with_grad(b, f, [x, y], {x: load(xp), y: load(yp)},
                                              hessian=True)
    for m, v in enumerate([val, *grads, hess[0][0], hess[0][1], hess[1][1]]):
        dst = b.gep(op, [b.add(b.mul(ir.IntType(64)(m), n), k)])
        b.store(v, b.bitcast(dst, vt.as_pointer()), align=8)
    k.add_incoming(b.add(k, ir.IntType(64)(step)), b.block)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    cf = _jit_function(mod, name, None, [ctypes.c_void_p] * 3 + [ctypes.c_int64])
    rng = np.random.default_rng(11)
    xs, ys = rng.normal(size=(2, 64))
    out = np.zeros((6, 64))
    cf(xs.ctypes.data, ys.ctypes.data, out.ctypes.data, 64)
    H = sym.hessian(f, [x, y])
    outs = [f, *sym.grad(f, [x, y]), H[0][0], H[0][1], H[1][1]]
    # the same emitter in sym.compile's kernel: the same instructions, bit for bit
    kern = llvm(outs, [x, y], vectorize=width is not None)
    for g, w in zip(out, kern(xs, ys)):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(out, ref(outs, [x, y])(xs, ys)):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)


def test_emitter_gather_with_bounds_callback():
    """A gather in a hand-written scalar loop: the callback returns the failing index."""
    buf, i = sym.buffer("tbl"), sym.var("ti", "int64")
    e = sym.gather(buf, i) * 2.0
    i64 = ir.IntType(64)
    mod = ir.Module(name="emit_gather_test")
    dp = ir.DoubleType().as_pointer()
    fn = ir.Function(mod, ir.FunctionType(i64, [dp, i64, i64]), "emit_gather_test")
    bp, ln, idx = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def on_error(bld, failure):
        assert failure.node.prim.name == "lane_gather" and failure.ordinal == 0
        bld.ret(bld.sub(i64(-1000), failure.index))

    v = codegen.emit(b, e, {buf: codegen.BufferArg(bp, ln), i: idx}, on_bounds_error=on_error)
    b.ret(b.fptosi(v, i64))
    cf = _jit_function(mod, "emit_gather_test", ctypes.c_int64,
                       [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64])
    tbl = np.array([1.0, 5.0, 7.0])
    assert cf(tbl.ctypes.data, 3, 1) == 10
    assert cf(tbl.ctypes.data, 3, 3) == -1003
    assert cf(tbl.ctypes.data, 3, -2) == -998


def test_emitter_c_semantics_only_on_request():
    from llvmlite import ir

    x, y = sym.var("x", "float32"), sym.var("y", "float32")
    texts = []
    for flag in (False, True):
        m = ir.Module()
        fn = ir.Function(m, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 2), "f")
        b = ir.IRBuilder(fn.append_basic_block())
        em = codegen.Emitter(b, c_semantics=flag)
        b.ret(em.emit(sym.maximum(x, y), {x: fn.args[0], y: fn.args[1]}))
        texts.append(str(m))
    assert "fcmp uno" in texts[0]  # numpy: a NaN operand propagates
    assert "fcmp uno" not in texts[1]  # one compare and select


def test_c_semantics_float_to_int_is_defined_for_every_input():
    # saturating conversion: NaN and out-of-range values give a defined integer, so a clamp
    # of the result is a real bound (halide_ad's data-dependent indices rely on it)
    x = sym.var("x", "float32")
    m = ir.Module()
    fn = ir.Function(m, ir.FunctionType(ir.IntType(32), [ir.FloatType()]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    em = codegen.Emitter(b, c_semantics=True)
    b.ret(em.emit(sym.clamp(sym.astype(x, "int32"), 0, 255), {x: fn.args[0]}))
    addr, _ = codegen.compile_ir(str(m), "c_semantics_fptosi_test", "f")
    f = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_float)(addr)
    got = [f(v) for v in (float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 7.9, -2.5)]
    assert got == [0, 255, 0, 255, 0, 7, 0]


@pytest.mark.parametrize("src", ["float32", "float64"])
@pytest.mark.parametrize("dst", ["int32", "int64"])
def test_c_semantics_vector_float_to_int_saturates_like_the_scalar_conversion(src, dst):
    # the vector form is built from compares and selects (x86 scalarises llvm.fptosi.sat on
    # vectors); it must give the scalar intrinsic's value in every lane
    x = sym.var("x", src)
    vals = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 7.9, -2.5, 2147483520.0,
                     -2147483648.0, 1e19, -1e19, 0.0, -0.0, 0.5, -0.99, 123456.7], src)
    fty = ir.FloatType() if src == "float32" else ir.DoubleType()
    ity = ir.IntType(np.dtype(dst).itemsize * 8)
    m = ir.Module()
    scalar = ir.Function(m, ir.FunctionType(ity, [fty]), "scalar")
    b = ir.IRBuilder(scalar.append_basic_block())
    b.ret(codegen.Emitter(b, c_semantics=True).emit(sym.astype(x, dst), {x: scalar.args[0]}))
    vec_t = ir.VectorType(fty, 8)
    vector = ir.Function(m, ir.FunctionType(ir.VoidType(), [vec_t.as_pointer(),
                                                            ir.VectorType(ity, 8).as_pointer()]),
                         "vector")
    b = ir.IRBuilder(vector.append_basic_block())
    v = b.load(vector.args[0], align=1)
    b.store(codegen.Emitter(b, 8, c_semantics=True).emit(sym.astype(x, dst), {x: v}),
            vector.args[1], align=1)
    b.ret_void()
    (fs, fv), _ = codegen.compile_ir(str(m), f"c_semantics_vec_fptosi_{src}_{dst}",
                                     ["scalar", "vector"])
    ct = ctypes.c_float if src == "float32" else ctypes.c_double
    cit = ctypes.c_int32 if dst == "int32" else ctypes.c_int64
    scalar_fn = ctypes.CFUNCTYPE(cit, ct)(fs)
    want = np.array([scalar_fn(float(v)) for v in vals], dst)
    vector_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(fv)
    got = np.empty(len(vals), dst)
    for k in range(0, len(vals), 8):
        chunk, out = np.ascontiguousarray(vals[k:k + 8]), np.empty(8, dst)
        vector_fn(chunk.ctypes.data, out.ctypes.data)
        got[k:k + 8] = out
    np.testing.assert_array_equal(got, want)
    assert want[0] == 0 and want[1] == np.iinfo(dst).max and want[2] == np.iinfo(dst).min

def test_floor_divide_and_mod_by_constants_match_numpy():
    # powers of two take the shift / mask path; the others the guarded sdiv path
    a, u = sym.var("a", "int32"), sym.var("u", "uint8")
    outs = [a // 8, a % 8, a // 1, a % 1, u // 4, u % 4, a // -8, a % -8, a // 3, a % 3]
    f = sym.compile(outs, [a, u], backend="llvm")
    A = np.arange(-40, 40, dtype=np.int32)
    U = np.arange(80).astype(np.uint8)
    want = [A // 8, A % 8, A // 1, A % 1, U // 4, U % 4, A // -8, A % -8, A // 3, A % 3]
    for got, ref in zip(f(A, U), want):
        np.testing.assert_array_equal(got, ref)


def _rational_module(name):
    d = ir.DoubleType()
    mod = ir.Module(name=name)
    fn = ir.Function(mod, ir.FunctionType(d, [d]), name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    (x,) = fn.args
    x2 = b.fmul(x, x)
    num = b.fsub(b.fmul(b.fadd(x2, d(1.5)), x), d(2.0))
    b.ret(b.fdiv(num, b.fadd(x2, d(3.0))))
    return mod


def test_very_large_kernels_get_fast_code_generation_with_the_same_bits(monkeypatch):
    """Modules over FAST_CODEGEN_LINES are compiled to machine code at -O0 (a huge kernel's -O3
    code generation grows faster than its size); the results are the same bits."""
    from core_ad._codegen.llvm import jit as jit_module

    addr, times = jit().compile(str(_rational_module("rational_o3")), "rational_o3",
                                "rational_o3")
    assert times["codegen_level"] == 3
    monkeypatch.setattr(jit_module, "FAST_CODEGEN_LINES", 0)
    fast_addr, fast_times = jit().compile(str(_rational_module("rational_o0")), "rational_o0",
                                          "rational_o0")
    assert fast_times["codegen_level"] == 0
    f, g = (ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(a) for a in (addr, fast_addr))
    for x in np.random.default_rng(0).normal(size=200) * 10.0:
        assert f(x) == g(x) == ((x * x + 1.5) * x - 2.0) / (x * x + 3.0)


@pytest.mark.parametrize("vectorize", [True, False])
def test_large_programs_split_into_functions_give_the_same_bits(monkeypatch, vectorize):
    """A program of more than SPLIT_OPS operations is emitted as internal functions of
    PART_OPS operations (values crossing a part go through stack slots): same bits as one
    function, with float, bool and integer values crossing parts, n-ary products reusing a
    shorter one, a 0-d input broadcast, a lane_sum, and outputs that are an input, a constant
    and one value twice."""
    from core_ad._codegen import llvm as llvm_pkg
    from core_ad._codegen.llvm import kernel as kernel_module

    monkeypatch.setenv("CORE_AD_CACHE_DIR", "off")
    x, y, s = sym.var("x"), sym.var("y"), sym.var("s")
    k = sym.var("k", dtype="int64")
    e, outs = x, []
    for i in range(12):
        big = e > y
        e = sym.where(big, sym.sin(e * y + i), e * s - x * y * s) + sym.astype(k + i, "float64")
        outs.append(x * y * s * e)
    outs += [e, sym.lane_sum(e * e), x, sym.as_expr(2.0) + 0.0 * x, outs[3]]
    rng = np.random.default_rng(0)
    args = (rng.normal(size=N), rng.normal(size=N), np.float64(0.7),
            rng.integers(-5, 5, size=N))

    def compiled():
        kcache.KERNELS.clear()
        llvm_pkg._CODE.clear()
        return llvm(outs, [x, y, s, k], vectorize=vectorize)

    whole = compiled()
    assert ".part" not in whole.ir
    monkeypatch.setattr(kernel_module, "SPLIT_OPS", 20)
    monkeypatch.setattr(kernel_module, "PART_OPS", 7)
    split = compiled()
    assert split.ir.count("define internal void") >= 10
    assert re.search(r"x i1>?\]", split.ir) and re.search(r"x i64>?\]", split.ir)  # slots
    for a, b in zip(whole(*args), split(*args)):
        np.testing.assert_array_equal(a, b)
    block = np.stack(args[:2], axis=1)  # x and y as strided columns: the strided variant
    for a, b in zip(whole(*args), split(block[:, 0], block[:, 1], *args[2:])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(split(*args), ref(outs, [x, y, s, k])(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_call_stacked_matches_separate_arrays_and_names_bad_input():
    """``fn.call_stacked(block)`` runs a kernel of one dtype on the rows of one (n_in, N)
    array and returns (n_out, N): the same bits as ``fn(*rows)`` on 1 and several threads
    and on a block whose rows are a slice; wrong shapes, dtypes, layouts and kernels that take
    separate arrays are named errors."""
    xs = [sym.var(f"s{i}") for i in range(6)]
    outs = [sym.sin(xs[i]) * xs[(i + 1) % 6] + 1.0 for i in range(5)] + [xs[0]]
    fn = llvm(outs, xs)
    # rows contiguous, not C order; enough lanes for 3 threads
    block = np.random.default_rng(0).normal(size=(8, 20 * N))[1:7]
    want = np.stack(fn(*[np.ascontiguousarray(r) for r in block]))
    for threads in (1, 3):
        np.testing.assert_array_equal(fn.call_stacked(block, num_threads=threads), want)
        assert fn.last_call["threads"] == threads
    assert fn.call_stacked(block[:, :0]).shape == (6, 0)
    with pytest.raises(ValueError, match=r"expected shape \(6, N\)"):
        fn.call_stacked(block[:5])
    with pytest.raises(TypeError, match="expected dtype float64, got float32"):
        fn.call_stacked(block.astype(np.float32))
    with pytest.raises(ValueError, match="rows must be contiguous"):
        fn.call_stacked(np.asfortranarray(block))
    with pytest.raises(TypeError, match="a 2-D numpy array"):
        fn.call_stacked(block.tolist())
    i = sym.var("i", dtype="int64")
    with pytest.raises(TypeError, match="several dtypes"):
        llvm([xs[0] * 2.0], [xs[0], i]).call_stacked(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="scatter_add or lane_sum"):
        llvm([sym.lane_sum(xs[0])], [xs[0]]).call_stacked(np.zeros((1, 3)))
