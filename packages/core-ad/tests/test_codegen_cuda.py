"""CUDA code generation (``core_ad._codegen.cuda``), in four tiers that skip cleanly:

* **source** (always): a kernel for every lane-wise primitive of the rule table in float32,
  float64, int32 and int64, random expression DAGs, gather / scatter_add; the compile-time and
  call-time errors.
* **nvcc** (when ``nvcc`` is on PATH): every generated kernel of this file in ONE translation
  unit, compiled with ``nvcc --ptx -arch=sm_80 -std=c++17``; the PTX must hold every entry.
* **host** (when ``g++`` is present): the same sources compiled for the CPU with a small shim
  header standing in for the CUDA built-ins (``blockIdx`` / ``threadIdx`` are globals and every
  thread of the launch grid runs in turn, so the grid-stride loop is exercised; atomics become
  plain read-modify-writes), called through the real ``CudaFunction.__call__`` with a
  stand-in ``cupy`` module whose ``RawKernel`` runs them (the reusable part lives in
  :mod:`core_ad._codegen.cuda.host_emulation`). This checks the generated code's
  *semantics* (casts, spellings, constants, NaN-safety, bounds checks, error decoding) and the
  launcher against the numpy backend without a GPU; only NVRTC and the device are left out.
* **gpu** (``@pytest.mark.gpu``: CuPy and a CUDA device): the real thing.

Tolerances: on the host, arithmetic / comparisons / selects / casts / gathers are compared
exactly (the same IEEE operations run on both sides); transcendentals within 16 ulp in float64
(numpy's SIMD math and glibc each err by a few ulp) and 1e-5 relative in float32. On a GPU:
float64 arithmetic 1e-12 relative, transcendentals 16 ulp, float32 1e-5 (nvcc contracts a*b+c
into FMAs). Random DAGs: 1e-12 (float64) / 1e-4 (float32) relative, as rounding differences
compound through ~30 operations. scatter_add: 1e-12 relative (atomic accumulation order
differs from ``np.add.at``).
"""

from __future__ import annotations

import functools
import random
import re
import shutil
import string
import subprocess
import sys
import uuid

import numpy as np
import pytest

from core_ad import Primitive, sym
from core_ad._codegen.cuda import compile_cuda, cuda_source, launcher, spell
from core_ad._codegen.cuda.host_emulation import HostDeviceArray, HostKernels, stand_in_cupy
from core_ad._codegen.cuda.writer import PREAMBLE
from core_ad._sym.expr import freeze_params
from core_ad._sym.simplify import CORE_PRIMITIVES, _node

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
LANEWISE = sorted((p for p in CORE_PRIMITIVES if p.elementwise), key=lambda p: p.name)
FLOATS = ("float32", "float64")
INTS = ("int32", "int64")

# lane-wise primitives computed by the same IEEE operations in C and numpy: exact on the host
EXACT = set(
    "add sub mul neg div identity safe_mul sqrt rsqrt maximum minimum clamp sign floor ceil round"
    " trunc abs lt le gt ge eq ne logical_and logical_or logical_not isfinite isnan cast convert"
    " select lane_gather lane_scatter_add".split()
)
F64_ULP = np.finfo(np.float64).eps


# --------------------------------------------------------------------------------------------
# the kernels of this file (built once; the nvcc and host tiers compile them all together)


class Case:
    def __init__(self, key, outputs, inputs, values, prim=None, dtype=None):
        self.key = key
        self.fn = compile_cuda(outputs, inputs, name=f"k_{key}")
        self.outputs, self.inputs = outputs, inputs
        self.values = values  # rng -> list of numpy arrays, one per input
        self.prim, self.dtype = prim, dtype

    def reference(self, arrays):
        return sym.compile(self.outputs, self.inputs, backend="numpy")(*arrays)


def _arity(prim):
    if prim.variadic:
        return 3
    fields = [int(f) for _, f, _, _ in string.Formatter().parse(prim.cspell or "") if f]
    return max(fields) + 1 if fields else 1


SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.25, 1e-3, 10.0, np.inf, -np.inf, np.nan]


def _lane_values(leaf, rng, n, prim):
    dt = leaf.dtype
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if leaf.name == "k":  # an index into the 7-element buffers
        return rng.integers(0, 7, n).astype(dt)
    if dt.kind in "iu":
        lo = 0 if prim is not None and prim.name == "pow" else -5  # numpy: no negative powers
        return rng.integers(lo, 6, n).astype(dt)
    base = np.array(SPECIAL + list(rng.normal(size=n - len(SPECIAL)) * 3))
    return rng.permutation(base).astype(dt)


CAST_TARGETS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _cast_values(dtype):
    """Lanes for float -> integer casts: NaN, infinities, the int32 / int64 / uint limits and
    values beyond them, negative values for unsigned targets, fractions of both signs."""
    edges = [2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 1, -2.0 ** 31 - 1, 2.0 ** 32 + 5, 3e9, -3e9,
             2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e30, -1e30, 300.5, -129.75, 65535.9, 70000.0]

    def make(rng):
        base = SPECIAL + edges + list(rng.normal(size=24) * 1e3)
        return [rng.permutation(np.array(base)).astype(dtype)]

    return make


def _values_for(inputs, prim=None, n=64):
    def make(rng):
        out = []
        for v in inputs:
            if v.kind == "buffer":
                out.append((rng.normal(size=7) * 4).astype(v.dtype))
            else:
                out.append(_lane_values(v, rng, n, prim))
        return out

    return make


def primitive_node(prim, dtype):
    """``prim`` applied to fresh leaves of ``dtype`` without simplification (so that every
    primitive really appears in its kernel): (node, leaves), or None where numpy has no such
    operation (e.g. logical ops are bool-only)."""
    T = np.dtype(dtype)
    name = prim.name
    params = {}
    if name in ("logical_and", "logical_or", "logical_not"):  # truthiness of any dtype
        args = [sym.var(c, "bool" if T == np.int32 else T) for c in "pq"[: _arity(prim)]]
    elif name == "select":
        args = [sym.var("p", "bool"), sym.var("a", T), sym.var("b", T)]
    elif name == "cast":
        args, params = [sym.var("a", T)], {"dtype": np.dtype(np.int32 if T.kind == "f" else
                                                              np.float64)}
    elif name == "convert":
        if T.kind != "f":
            return None
        args = [sym.var("a", T)]
        params = {"dtype": np.dtype(np.float64 if T == np.float32 else np.float32)}
    elif name == "lane_gather":
        args, params = [sym.buffer("tab", T), sym.var("k", "int64")], {"name": "tab"}
    elif name == "lane_scatter_add":
        args = [sym.buffer("acc", T), sym.var("k", "int64"), sym.var("a", T)]
        params = {"name": "acc"}
    elif name == "lane_sum":
        if T.kind != "f":
            return None
        args = [sym.var("a", T)]
    else:
        args = [sym.var(c, T) for c in "abc"[: _arity(prim)]]
    try:
        node = _node(prim, tuple(args), freeze_params(params, name), params)
    except TypeError:  # numpy refuses this dtype
        return None
    return node, args


def _random_dag(seed, dtype, n_ops=30):
    """A seeded random DAG over x, y, z (dtype) and an int32 k, with three outputs."""
    rnd = random.Random(seed)
    x, y, z = (sym.var(c, dtype) for c in "xyz")
    k = sym.var("k", "int32")
    unary = [
        sym.sin, sym.cos, sym.tanh, sym.erf, sym.arctan, lambda a: -a,
        lambda a: sym.exp(sym.tanh(a)),
        lambda a: sym.sqrt(sym.abs(a) + 0.25),
        lambda a: sym.log1p(a * a),
        lambda a: a * sym.astype(k, dtype),
    ]
    binary = [
        lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
        lambda a, b: a / (1.5 + b * b), sym.maximum, sym.minimum, sym.arctan2,
        lambda a, b: sym.where(a > b, a, b * 0.5),
        lambda a, b: sym.where(k > 1, a, b),
        lambda a, b: sym.clamp(a, -1.0, 1.0 + b * b),
    ]
    pool = [x, y, z]
    for _ in range(n_ops):
        recent = pool[-6:]
        if rnd.random() < 0.4:
            e = rnd.choice(unary)(rnd.choice(recent))
        else:
            e = rnd.choice(binary)(rnd.choice(recent), rnd.choice(pool))
        if isinstance(e, sym.Expr) and not isinstance(e, sym.Const):
            pool.append(e)
    return pool[-3:], [x, y, z, k]


def _dag_values(rng, n=257):
    return [rng.normal(size=n) * 2, rng.normal(size=n) * 2, rng.normal(size=n) * 2,
            rng.integers(0, 4, n).astype(np.int32)]


_USER_PRIMS = {}


def _user_prim(kind):
    """Throwaway primitives, applied with sym.call and never registered (so that the global
    registry, which other test files check, is left alone)."""
    if kind not in _USER_PRIMS:
        tag = uuid.uuid4().hex[:8]
        if kind == "nocspell":
            p = Primitive(f"cuda_test_nocspell_{tag}", lambda a: a * 2.0, elementwise=True,
                          differentiable=False)
        elif kind == "badcspell":
            p = Primitive(f"cuda_test_badcspell_{tag}", lambda a: a * 2.0, elementwise=True,
                          differentiable=False, cspell="({0} + {2})")
        else:
            p = Primitive(f"cuda_test_triple_exp_{tag}", lambda a: 3 * np.exp(a),
                          elementwise=True, differentiable=False, cspell="(3 * exp({0}))")
        _USER_PRIMS[kind] = p
    return _USER_PRIMS[kind]


@functools.cache
def cases() -> dict:
    out = {}
    for prim in LANEWISE:
        for dt in FLOATS + INTS:
            made = primitive_node(prim, dt)
            if made is None:
                continue
            node, args = made
            key = f"{prim.name}_{dt}"
            out[key] = Case(key, [node], args, _values_for(args, prim), prim, np.dtype(dt))
    for dt in FLOATS:
        for seed in range(2):
            outs, ins = _random_dag(seed, dt)
            key = f"dag{seed}_{dt}"
            out[key] = Case(key, outs, ins, _dag_values, dtype=np.dtype(dt))
        # gather and scatter_add through the public sym API
        b, acc = sym.buffer("table", dt), sym.buffer("acc", dt)
        for idt in ("int32", "int64"):
            i, x = sym.var("i", idt), sym.var("x", dt)
            key = f"gs_{dt}_{idt}"
            out[key] = Case(key, [sym.gather(b, i) * x, sym.scatter_add(acc, i, x * x)],
                            [b, acc, i, x], None, dtype=np.dtype(dt))
        # constants: float literals, inf / nan bit patterns, the most negative int64
        x, k = sym.var("x", dt), sym.var("k", "int64")
        consts = [x * 0.1 + sym.const(np.inf, dt), x * sym.const(np.nan, dt),
                  x - sym.const(-np.inf, dt), x * sym.const(np.float32(3.4028235e38), dt),
                  k + sym.const(np.iinfo(np.int64).min, "int64"),
                  x + sym.const(np.finfo(dt).tiny, dt) * 0.5]
        key = f"consts_{dt}"
        out[key] = Case(key, consts, [x, k], None, dtype=np.dtype(dt))
    for idt in ("int32", "int64"):
        acc, i = sym.buffer("acc", idt), sym.var("i", "int64")
        v = sym.var("v", idt)
        key = f"scatter_int_{idt}"
        out[key] = Case(key, [sym.scatter_add(acc, i, v)], [acc, i, v], None)
    x = sym.var("x")
    g = sym.grad(sym.where(x > 0, sym.sqrt(x), 0.0), [x])[0]
    out["nan_safe_grad"] = Case("nan_safe_grad", [g], [x], None)
    b, i = sym.buffer("verts"), sym.var("i", "int64")
    out["verts"] = Case("verts", [sym.gather(b, i), sym.scatter_add(b, i, 1.0)], [b, i], None)
    x, y = sym.var("x"), sym.var("y")
    out["mixed_shapes"] = Case("mixed_shapes", [x * y + 1.0, sym.const(2.0), x], [x, y], None)
    for dt in FLOATS:  # float -> every integer width, on values C leaves undefined too
        x = sym.var("x", dt)
        key = f"casts_{dt}"
        out[key] = Case(key, [sym.astype(x, t) for t in CAST_TARGETS], [x], _cast_values(dt))
    x = sym.var("x", "float32")
    out["grid_stride"] = Case("grid_stride", [x * 2.0], [x], None)
    for dt in FLOATS:
        x = sym.var("x", dt)
        key = f"user_prim_{dt}"
        out[key] = Case(key, [sym.call(_user_prim("triple_exp"), x)], [x], _values_for([x]))
    return out


def _prim_cases():
    return [c for c in cases().values() if c.prim is not None]


# --------------------------------------------------------------------------------------------
# source tier


def test_every_lanewise_primitive_has_a_kernel_in_each_float_dtype():
    names = {c.prim.name for c in _prim_cases()}
    missing = [p.name for p in LANEWISE if p.name not in names]
    assert not missing, f"no kernel generated for {missing}"
    for dt in FLOATS:
        got = {c.prim.name for c in _prim_cases() if c.dtype == np.dtype(dt)}
        assert got == {p.name for p in LANEWISE}, (dt, {p.name for p in LANEWISE} - got)
    for c in _prim_cases():
        src = c.fn.source
        assert f'extern "C" __global__ void k_{c.key}(' in src
        assert "for (long long i = " in src  # the grid-stride loop
        assert "unsigned long long* __restrict__ err" in src


def test_float32_kernels_use_float32_math_and_literals():
    c_funcs = re.compile(r"\b([a-z][a-z0-9]*)\(")
    checked = 0
    for c in _prim_cases():
        if c.dtype.kind != "f":
            continue
        body = c.fn.source.split("#endif")[-1]
        for f in c_funcs.findall(c.prim.cspell or ""):
            if c.prim.name in ("isfinite", "isnan"):
                continue  # spelled arithmetically
            if c.dtype == np.float32:
                assert f + "f(" in body, (c.key, f)
                assert re.search(rf"\b{f}\(", body) is None, (c.key, f)
            else:
                assert re.search(rf"\b{f}\(", body) and f + "f(" not in body, (c.key, f)
            checked += 1
    assert checked >= 2 * 20
    src32 = cases()["consts_float32"].fn.source
    assert "0.1f" in src32 and "__int_as_float((int)0x7f800000U)" in src32
    src64 = cases()["consts_float64"].fn.source
    assert "0.1;" in src64 and "__longlong_as_double((long long)0x7ff0000000000000ULL)" in src64
    assert "(-9223372036854775807LL - 1)" in src64


def test_select_and_safe_mul_spellings():
    src = cases()["nan_safe_grad"].fn.source
    assert re.search(r"\(v_t\d+ \? v_c\d+ : v_c\d+\)", src)  # select as ?:
    assert re.search(r"\(\(v_t\d+\) == 0 \? 0 : \(v_t\d+\) \* \(v_t\d+\)\)", src)  # safe_mul


def test_random_dags_generate_and_are_deterministic():
    for dt in FLOATS:
        for seed in range(2):
            outs, ins = _random_dag(seed, dt)
            again = cuda_source(*_random_dag(seed, dt), name=f"k_dag{seed}_{dt}")
            assert cuda_source(outs, ins, name=f"k_dag{seed}_{dt}") == again
            assert again == cases()[f"dag{seed}_{dt}"].fn.source
            assert again.count("const ") > 20


def test_spell_is_the_scalar_emitter():
    from core_ad import _rules as R

    assert spell(R.exp_p, ["a"], ["float32"], "float32") == "expf(a)"
    assert spell(R.add_p, ["a", "b", "c"], ["float64"] * 3, "float64") == "(a + b + c)"
    # numpy promotion: int / int is float64, int64 < float32 compares in float64
    assert spell(R.div_p, ["i", "j"], ["int32"] * 2, "float64") == "(((double)i) / ((double)j))"
    assert spell(R.lt_p, ["i", "x"], ["int64", "float32"], "bool") == "(((double)i) < ((double)x))"
    assert spell(R.maximum_p, ["i", "j"], ["int32"] * 2, "int32") == "((i) > (j) ? (i) : (j))"
    # a cse node: a float square is the exact product (as numpy and the LLVM backend), other
    # powers the library's pow
    from core_ad.codegen import c_spell_node

    x, k = sym.var("x", "float32"), sym.var("k")
    assert c_spell_node(sym.pow(x, 2.0), ["a", "b"]) == "(a * a)"
    assert c_spell_node(sym.pow(x, k), ["a", "b"]) == spell(R.pow_p, ["a", "b"],
                                                           ["float32", "float64"], "float64")


# --------------------------------------------------------------------------------------------
# compile-time and call-time errors (no GPU needed)


def test_unsupported_primitive_is_named_at_compile_time():
    x = sym.var("x")
    p = _user_prim("nocspell")
    with pytest.raises(NotImplementedError, match=rf"primitive '{p.name}' has no C spelling"):
        compile_cuda([sym.call(p, x) + 1.0], [x])
    q = _user_prim("badcspell")
    with pytest.raises(NotImplementedError, match=rf"{q.name}.*refers to \{{2\}}"):
        cuda_source([sym.call(q, x)], [x])


def test_unsupported_dtypes_and_misused_buffers():
    z = sym.var("z", "complex128")
    with pytest.raises(TypeError, match="complex128 .* not supported"):
        cuda_source([z * 2.0], [z])
    h = sym.var("h", "float16")
    with pytest.raises(TypeError, match="float16"):
        cuda_source([h], [h])
    b, i, x = sym.buffer("b", "int8"), sym.var("i", "int64"), sym.var("x", "int8")
    with pytest.raises(NotImplementedError, match="scatter_add into buffer .* int8"):
        cuda_source([sym.scatter_add(b, i, x)], [b, i, x])
    t, y = sym.buffer("t"), sym.var("y")
    with pytest.raises(TypeError, match=r"buffer\['t'\].* per-lane operand of add"):
        cuda_source([t + y], [t, y])
    with pytest.raises(ValueError, match="whole buffer"):
        cuda_source([t], [t])
    with pytest.raises(ValueError, match="not among the inputs"):
        cuda_source([y * 2.0], [x])
    with pytest.raises(ValueError, match="only be an output"):
        cuda_source([sym.scatter_add(t, i, y) * 2.0], [t, i, y])
    with pytest.raises(ValueError, match="not a C identifier"):
        cuda_source([y], [y], name="bad name")


def test_host_arrays_and_scalars_are_rejected_with_type_error():
    x, y = sym.var("x"), sym.var("y")
    fn = compile_cuda([x * y], [x, y])
    with pytest.raises(TypeError, match=r"input 0 \('x'\) is a numpy array.*CuPy"):
        fn(np.ones(3), np.ones(3))
    with pytest.raises(TypeError, match=r"input 1 \('y'\) is a Python float"):
        fn(HostDeviceArray(np.ones(3)), 2.0)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        fn(np.ones(3))


def test_registry_hooks():
    from core_ad._codegen import cuda

    c = cases()["gs_float64_int64"]
    opts = cuda.check_options({"name": c.fn.name})
    assert opts == (("name", c.fn.name),) and cuda.check_options({}) == (("name",
                                                                          "core_ad_kernel"),)
    fn = cuda.compile_program(sym.cse(c.outputs), c.outputs, c.inputs, opts, None)
    assert isinstance(fn, cuda.CudaFunction) and fn.backend == "cuda"
    assert fn.source == c.fn.source
    with pytest.raises(TypeError, match="unknown option 'fast'"):
        cuda.check_options({"fast": True})
    with pytest.raises(ValueError, match="not a C identifier"):
        cuda.check_options({"name": "1x"})
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert cuda.available() is False


def test_importing_core_ad_does_not_import_cupy():
    code = ("import sys, core_ad, core_ad.sym, core_ad._codegen.cuda as c; "
            "from core_ad import sym; x = sym.var('x'); c.compile_cuda([sym.exp(x)], [x]); "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": ":".join(sys.path)})
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------------------------
# nvcc tier: everything in one translation unit


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    d = tmp_path_factory.mktemp("cuda_ptx")
    src = d / "all.cu"
    src.write_text("\n".join(c.fn.source for c in cases().values()))
    r = subprocess.run([NVCC, "--ptx", "-arch=sm_80", "-std=c++17", str(src), "-o",
                        str(d / "all.ptx")], capture_output=True, text=True, timeout=300)
    return r, (d / "all.ptx").read_text() if r.returncode == 0 else ""


def test_nvcc_compiles_every_kernel(ptx):
    r, text = ptx
    assert r.returncode == 0, r.stderr[-4000:]
    entries = set(re.findall(r"\.entry\s+(\w+)\(", text))
    want = {c.fn.name for c in cases().values()}
    assert want <= entries, sorted(want - entries)
    compiled = {c.prim.name for c in _prim_cases() if c.fn.name in entries}
    assert compiled == {p.name for p in LANEWISE}
    # gather / scatter kernels use the atomics and the bounds check
    gs = cases()["gs_float64_int64"].fn.name
    body = text.split(f".entry {gs}(")[1].split(".entry")[0]
    assert "atom.global.add.f64" in body and "atom.global.cas.b64" in body


# --------------------------------------------------------------------------------------------
# host tier: the generated code run on the CPU through CudaFunction.__call__

@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    if GXX is None:
        pytest.skip("g++ is not available")
    return HostKernels([(c.fn.name, c.fn.source) for c in cases().values()],
                       tmp_path_factory.mktemp("cuda_host"))


@pytest.fixture
def host(host_kernels, monkeypatch):
    """Installs a stand-in ``cupy`` whose RawKernel runs the host-compiled kernel; returns
    ``run(case_or_fn, arrays) -> tuple of numpy arrays``."""
    fake, fakex = stand_in_cupy(host_kernels)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupyx", fakex)
    monkeypatch.setattr(launcher, "_KERNELS", {})

    def run(fn, arrays):
        fn = fn.fn if isinstance(fn, Case) else fn
        # wrapped without a copy: the outputs must not alias the inputs
        res = fn(*[HostDeviceArray(np.asarray(a)) for a in arrays])
        assert isinstance(res, tuple) and len(res) == len(fn.outputs)
        return tuple(r.host for r in res)

    run.built = fake.built
    return run


def _tolerance(case, where):
    dt = case.outputs[0].dtype  # the result's dtype (int operands of sin give float64)
    if dt.kind != "f":
        return 0.0
    if case.prim.name in EXACT:
        if where == "host":
            return 0.0
        return 1e-5 if dt == np.float32 else 1e-12
    return 1e-5 if dt == np.float32 else 16 * F64_ULP


def _compare(got, want, rtol, label):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (label, g.shape, w.shape, g.dtype)
        if rtol == 0.0:
            np.testing.assert_array_equal(g, w, err_msg=label)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=0, equal_nan=True, err_msg=label)


def _check_primitives(run, where):
    rng = np.random.default_rng(1)
    n = 0
    for c in _prim_cases():
        arrays = c.values(rng)
        want = c.reference(arrays)
        got = run(c, arrays)
        _compare(got, want, _tolerance(c, where), c.key)
        n += 1
    return n


def test_host_every_primitive_matches_numpy(host):
    n = _check_primitives(host, "host")
    assert n == len(_prim_cases()) and n > 2 * len(LANEWISE)


def _check_dags(run, rtol64=1e-12, rtol32=1e-4):
    rng = np.random.default_rng(2)
    for dt in FLOATS:
        for seed in range(2):
            c = cases()[f"dag{seed}_{dt}"]
            arrays = _dag_values(rng)
            arrays[:3] = [a.astype(dt) for a in arrays[:3]]
            want = c.reference(arrays)
            got = run(c, arrays)
            rtol = rtol32 if dt == "float32" else rtol64
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=c.key)


def test_host_random_dags_match_numpy(host):
    _check_dags(host)


def _check_casts(run):
    """float -> integer casts give the LLVM backend's values (numpy's on x86: truncation, and
    NaN / out of range -> the minimum integer, before narrowing), never the device's
    saturation: a NaN-derived index must fail the bounds check, not read element 0."""
    for dt in FLOATS:
        c = cases()[f"casts_{dt}"]
        (x,) = c.values(np.random.default_rng(3))
        want = sym.compile(c.outputs, c.inputs, backend="llvm")(x)
        got = run(c, [x])
        for t, g, w in zip(CAST_TARGETS, got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"{dt} -> {t}")
        nan = np.isnan(x)
        assert (got[CAST_TARGETS.index("int32")][nan] == np.iinfo(np.int32).min).all()
        assert (got[CAST_TARGETS.index("int64")][nan] == np.iinfo(np.int64).min).all()


def test_host_float_to_integer_casts(host):
    _check_casts(host)


def test_host_constants(host):
    for dt in FLOATS:
        c = cases()[f"consts_{dt}"]
        arrays = [np.array([1.0, -2.0, 0.0], dt), np.array([0, 1, -1], np.int64)]
        _compare(host(c, arrays), c.reference(arrays), 0.0, c.key)


def test_host_nan_safe_select_gradient(host):
    (g,) = host(cases()["nan_safe_grad"], [np.array([-1.0, 0.0, 4.0])])
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.25])


def _check_gather_scatter(run, rtol64, rtol32):
    rng = np.random.default_rng(3)
    for dt in FLOATS:
        for idt in ("int32", "int64"):
            c = cases()[f"gs_{dt}_{idt}"]
            table = rng.normal(size=50).astype(dt)
            acc = rng.normal(size=50).astype(dt)
            idx = rng.integers(0, 50, size=1000).astype(idt)
            x = rng.normal(size=1000).astype(dt)
            y, out = run(c, [table, acc, idx, x])
            np.testing.assert_array_equal(y, table[idx] * x)
            ref = acc.copy()
            np.add.at(ref, idx, x * x)
            rtol = rtol32 if dt == "float32" else rtol64
            np.testing.assert_allclose(out, ref, rtol=rtol, err_msg=c.key)
            np.testing.assert_array_equal(acc, acc.copy())  # the input buffer is untouched
    for idt in ("int32", "int64"):
        c = cases()[f"scatter_int_{idt}"]
        idx = rng.integers(0, 5, 100)
        v = rng.integers(-9, 10, 100).astype(idt)
        (out,) = run(c, [np.zeros(5, idt), idx, v])
        ref = np.zeros(5, idt)
        np.add.at(ref, idx, v)
        np.testing.assert_array_equal(out, ref)


def test_host_gather_and_scatter_add_match_numpy(host):
    _check_gather_scatter(host, 1e-12, 1e-5)


def _check_out_of_range(run):
    c = cases()["verts"]
    with pytest.raises(IndexError, match=r"gather: index 7 at position \(1,\) \(lane 1\) is out"
                                         r" of range for axis of size 7 of array 'verts'"):
        run(c, [np.zeros(7), np.array([0, 7, 1])])
    with pytest.raises(IndexError, match=r"index -1 at position \(0,\)"):
        run(c, [np.zeros(7), np.array([-1, 0])])
    with pytest.raises(IndexError, match=r"index 9 at position \(1, 0\) .* 'verts'"):
        run(c, [np.zeros(9), np.array([[0, 1], [9, 2]])])
    y, acc = run(c, [np.arange(3.0), np.array([2, 2, 0])])
    np.testing.assert_array_equal(y, [2.0, 2.0, 0.0])
    np.testing.assert_array_equal(acc, [1.0, 1.0, 4.0])


def test_host_out_of_range_index_raises(host):
    _check_out_of_range(host)


def test_host_zero_d_inputs_and_lane_shapes(host):
    c = cases()["mixed_shapes"]
    x = np.arange(6.0).reshape(2, 3)
    r0, r1, r2 = host(c, [x, np.array(2.0)])
    np.testing.assert_array_equal(r0, x * 2 + 1)
    np.testing.assert_array_equal(r1, np.full((2, 3), 2.0))
    np.testing.assert_array_equal(r2, x)
    assert r2.ctypes.data != x.ctypes.data
    s = host(c, [np.array(3.0), np.array(2.0)])
    assert [a.shape for a in s] == [(), (), ()] and float(s[0]) == 7.0
    e = host(c, [np.zeros(0), np.array(2.0)])
    assert [a.shape for a in e] == [(0,)] * 3


def _check_grid_stride(run, monkeypatch):
    monkeypatch.setattr(launcher, "MAX_GRID", 3)  # far fewer threads than lanes
    n = launcher.BLOCK * 3 * 5 + 7
    (y,) = run(cases()["grid_stride"], [np.arange(n, dtype=np.float32)])
    np.testing.assert_array_equal(y, np.arange(n, dtype=np.float32) * 2)


def test_host_grid_stride_loop_covers_every_lane(host, monkeypatch):
    _check_grid_stride(host, monkeypatch)


def test_host_call_checks(host):
    fn = cases()["mixed_shapes"].fn
    with pytest.raises(TypeError, match=r"input 1 \('y'\) must have dtype float64, got float32"):
        host(fn, [np.ones(3), np.ones(3, np.float32)])
    with pytest.raises(ValueError, match=r"lane-count mismatch.*\(3,\).*\(4,\)"):
        host(fn, [np.ones(3), np.ones(4)])
    with pytest.raises(ValueError, match="not C-contiguous"):
        host(fn, [np.ones(6)[::2], np.ones(3)])
    g = cases()["verts"].fn
    with pytest.raises(ValueError, match="buffer input 0 .* must be 1-D"):
        host(g, [np.zeros((2, 2)), np.array([0])])


def test_host_user_primitive_with_cspell(host):
    for dt in FLOATS:
        c = cases()[f"user_prim_{dt}"]
        assert ("expf(" in c.fn.source) == (dt == "float32")
        arrays = c.values(np.random.default_rng(4))
        _compare(host(c, arrays), c.reference(arrays), 1e-5 if dt == "float32" else 4e-15,
                 c.key)


def test_kernels_are_compiled_lazily_and_cached_by_source(host):
    c = cases()["nan_safe_grad"]
    assert host.built == []  # compile_cuda did not compile anything
    fn2 = compile_cuda(c.outputs, c.inputs, name=c.fn.name)  # same source: same kernel
    host(c, [np.ones(2)])
    host(fn2, [np.ones(2)])
    host(c, [np.ones(2)])
    assert host.built == [c.fn.name]
    assert fn2.kernel is c.fn.kernel
    assert fn2.kernel.options == ("-std=c++17",)


# --------------------------------------------------------------------------------------------
# gpu tier


@pytest.fixture(scope="module")
def cupy_dev():
    from core_ad._codegen.cuda.launcher import available

    if not available():
        pytest.skip("no CuPy with a usable CUDA device")
    import cupy

    return cupy


@pytest.fixture
def gpu(cupy_dev):
    def run(fn, arrays):
        fn = fn.fn if isinstance(fn, Case) else fn
        res = fn(*[cupy_dev.asarray(np.asarray(a)) for a in arrays])
        assert isinstance(res, tuple) and all(isinstance(r, cupy_dev.ndarray) for r in res)
        return tuple(cupy_dev.asnumpy(r) for r in res)

    return run


@pytest.mark.gpu
def test_gpu_every_primitive_matches_numpy(gpu):
    assert _check_primitives(gpu, "gpu") == len(_prim_cases())


@pytest.mark.gpu
def test_gpu_random_dags_match_numpy(gpu):
    _check_dags(gpu)


@pytest.mark.gpu
def test_gpu_float_to_integer_casts(gpu):
    _check_casts(gpu)


@pytest.mark.gpu
def test_gpu_nan_safe_select_gradient(gpu):
    (g,) = gpu(cases()["nan_safe_grad"], [np.array([-1.0, 0.0, 4.0])])
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.25])


@pytest.mark.gpu
def test_gpu_gather_and_scatter_add(gpu):
    _check_gather_scatter(gpu, 1e-12, 1e-5)


@pytest.mark.gpu
def test_gpu_out_of_range_gather_raises(gpu):
    _check_out_of_range(gpu)


@pytest.mark.gpu
def test_gpu_call_checks(gpu, cupy_dev):
    fn = cases()["mixed_shapes"].fn
    with pytest.raises(TypeError, match="must have dtype float64, got float32"):
        fn(cupy_dev.ones(3), cupy_dev.ones(3, dtype=cupy_dev.float32))
    with pytest.raises(ValueError, match="lane-count mismatch"):
        fn(cupy_dev.ones(3), cupy_dev.ones(4))
    with pytest.raises(ValueError, match="not C-contiguous"):
        fn(cupy_dev.ones(6)[::2], cupy_dev.ones(3))
    with pytest.raises(TypeError, match="numpy array"):
        fn(np.ones(3), cupy_dev.ones(3))
    r = gpu(fn, [np.arange(4.0), np.array(3.0)])
    np.testing.assert_array_equal(r[0], np.arange(4.0) * 3 + 1)


@pytest.mark.gpu
def test_gpu_grid_stride_loop_covers_every_lane(gpu, monkeypatch):
    _check_grid_stride(gpu, monkeypatch)


def test_preamble_is_guarded_for_several_kernels_per_unit():
    assert PREAMBLE.startswith("#ifndef CORE_AD_CUDA_PREAMBLE")
    assert PREAMBLE.rstrip().endswith("#endif  // CORE_AD_CUDA_PREAMBLE")
