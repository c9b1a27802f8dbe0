"""AE-11: Opt's code optimisations (spec 5.4) as toggles of the fused kernels. Every setting
gives the products, cost and solver iterates of all-on to f64 rel 1e-12; the statistics of
applyJTJ drop with simplification; guarded loads are not executed when the guard is false."""
import ctypes
import os
import sys

import numpy as np
import pytest
from core_ad import codegen, sym
from llvmlite import ir

from lsq_opt import Optimizations, code_statistics, compile_problem, solve
from lsq_opt._compiler.optimize import MIN_GUARDED, emit_guarded
from lsq_opt.examples import shading
from lsq_opt.examples import mesh as mesh_example

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_solvers  # noqa: E402  (the benchmarks' ARAP image problem)

CONFIGS = [("all", Optimizations()), ("none", Optimizations.none())] + [
    (f"no_{name}", Optimizations(**{name: False}))
    for name in ("polynomial", "horner", "bounds", "conditional")]


def _plan(problem, opt):
    if problem == "shading":
        data, params, _ = shading.make_data((20, 16))
        return compile_problem(shading.energy(), arrays=data, params=params, optimizations=opt)
    if problem == "arap image":
        energy, data, params = bench_solvers.arap_problem(16)
        return compile_problem(energy, arrays=data, params=params, optimizations=opt)
    plan, _, _ = mesh_example.arap_plan(6, 8)
    plan.optimizations = opt  # before the fused kernels are built (on first use)
    return plan


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.fixture(scope="module")
def reference():
    out = {}
    for problem in ("shading", "arap image", "arap mesh"):
        plan = _plan(problem, Optimizations())
        rng = np.random.default_rng(0)
        x = np.asarray(plan.x0, float) + 0.01 * rng.standard_normal(plan.n)
        p = rng.standard_normal(plan.n)
        g, dg = plan.fused.grad(x)
        res = solve(plan, plan.x0, max_iterations=3)
        out[problem] = (x, p, plan.fused.jtjp(x, p), g.copy(), dg.copy(), plan.fused.cost(x), res.x)
    return out


@pytest.mark.parametrize("problem", ["shading", "arap image", "arap mesh"])
@pytest.mark.parametrize("label,opt", CONFIGS[1:], ids=[c[0] for c in CONFIGS[1:]])
def test_each_toggle_agrees_with_all_on(reference, problem, label, opt):
    x, p, jtjp, g, dg, cost, x_solved = reference[problem]
    plan = _plan(problem, opt)
    assert _rel(plan.fused.jtjp(x, p), jtjp) < 1e-12
    g2, dg2 = plan.fused.grad(x)
    assert _rel(g2, g) < 1e-12 and _rel(dg2, dg) < 1e-12
    assert abs(plan.fused.cost(x) - cost) <= 1e-12 * abs(cost)
    assert _rel(solve(plan, plan.x0, max_iterations=3).x, x_solved) < 1e-12


def test_statistics_drop_with_simplification():
    none = code_statistics(_plan("shading", Optimizations.none()))["grid0_jtjp"]
    poly = code_statistics(_plan("shading", Optimizations(horner=False, bounds=False,
                                                          conditional=False)))["grid0_jtjp"]
    full = code_statistics(_plan("shading", Optimizations()))["grid0_jtjp"]
    # one load per memory location instead of one per lane shift and term
    assert poly["loads"] < 0.6 * none["loads"]
    assert full["arith"] < poly["arith"] < none["arith"]
    assert full["selects"] < none["selects"]
    # what the CPU runs: LLVM's own GVN already shares the repeated loads, not the arithmetic
    none_o = code_statistics(_plan("shading", Optimizations.none()), optimized=True)["grid0_jtjp"]
    flat_o = code_statistics(_plan("shading", Optimizations(conditional=False)),
                             optimized=True)["grid0_jtjp"]
    full_o = code_statistics(_plan("shading", Optimizations()), optimized=True)["grid0_jtjp"]
    assert flat_o["arith"] < 0.95 * none_o["arith"] and flat_o["selects"] < 0.9 * none_o["selects"]
    # guards keep LLVM from sharing arithmetic across their blocks: less saved, still a saving
    assert flat_o["arith"] < full_o["arith"] < none_o["arith"]
    mesh_none = code_statistics(_plan("arap mesh", Optimizations.none()))["graph_0_jtjp"]
    mesh_full = code_statistics(_plan("arap mesh", Optimizations()))["graph_0_jtjp"]
    assert mesh_full["arith"] < mesh_none["arith"]
    assert mesh_full["selects"] == mesh_none["selects"] == 0  # no Select: no bounds gain


def test_guarded_loads_live_under_their_conditions():
    on = code_statistics(_plan("shading", Optimizations()))["grid0_jtjp"]
    off = code_statistics(_plan("shading", Optimizations(conditional=False)))["grid0_jtjp"]
    assert on["guards"] > 0 and on["guarded_loads"] > 0
    assert off["guards"] == off["guarded_loads"] == 0
    assert on["loads"] == off["loads"]  # moved under the guards, not duplicated


def _guarded_kernel(conditional):
    """out[i] = where(c[i], (poisoned gather at idx[i]) * polynomial(x[i]), 0)."""
    xv, c, idx = sym.var("x"), sym.var("c", "bool"), sym.var("i", "int64")
    buf = sym.buffer("buf")
    poly = xv
    for k in range(MIN_GUARDED):
        poly = poly * xv + float(k + 1)
    e = sym.where(c, sym.gather(buf, idx) * poly, 0.0)
    mod = codegen.KernelModule(f"test_guard_{conditional}")
    f = mod.range_function("k")
    b = f.builder
    px, pc, pi, pb, po = (f.pointer(0, np.float64), f.pointer(1, np.int8), f.pointer(2, np.int64),
                          f.pointer(3, np.float64), f.pointer(4, np.float64))
    lp = codegen.Loop(b, f.start, f.end, 1, "i")
    em = codegen.Emitter(b, math=codegen.VecMath(), on_bounds_error=lambda bld, fail: bld.ret(ir.Constant(ir.IntType(32), 1)))
    env = {xv: b.load(b.gep(px, [lp.i])),
           c: b.icmp_unsigned("!=", b.load(b.gep(pc, [lp.i])), ir.Constant(ir.IntType(8), 0)),
           idx: b.load(b.gep(pi, [lp.i])), buf: codegen.BufferArg(pb, ir.Constant(ir.IntType(64), 4))}
    (v,) = emit_guarded(em, b, [e], env, conditional=conditional)
    b.store(v, b.gep(po, [lp.i]))
    lp.close()
    b.ret(ir.Constant(ir.IntType(32), 0))
    return mod.compile()["k"]


@pytest.mark.parametrize("conditional", [True, False])
def test_a_poisoned_gather_under_a_false_condition_is_not_executed(conditional):
    fn = _guarded_kernel(conditional)
    n = 6
    x = np.linspace(0.1, 0.6, n)
    c = np.array([1, 0, 0, 1, 0, 1], np.int8)
    idx = np.where(c == 1, np.arange(n) % 4, 10**9).astype(np.int64)  # out of range where c is 0
    buf = np.arange(4, dtype=np.float64) + 1.0
    out = np.full(n, np.nan)
    ptrs = (ctypes.c_void_p * 5)(*[a.ctypes.data for a in (x, c, idx, buf, out)])
    status = [fn(k, k + 1, ptrs) for k in range(n)]
    if not conditional:  # the select form computes both branches: the bounds check fails
        assert status == [int(ci == 0) for ci in c]
        return
    assert status == [0] * n
    poly = x.copy()
    for k in range(MIN_GUARDED):
        poly = poly * x + (k + 1)
    np.testing.assert_allclose(out, np.where(c == 1, buf[idx % 4] * poly, 0.0), rtol=1e-14)


def test_options_are_checked():
    with pytest.raises(TypeError, match="Optimizations.horner must be a bool"):
        Optimizations(horner=1)
    data, params, _ = shading.make_data((12, 10))
    with pytest.raises(TypeError, match="optimizations must be an Optimizations"):
        compile_problem(shading.energy(), arrays=data, params=params, optimizations={"horner": 0})
    labels = [lab for lab, _ in Optimizations.ladder()]
    assert labels == ["none", "+polynomial", "+horner", "+bounds", "+conditional"]
    assert Optimizations.ladder()[-1][1] == Optimizations()


def test_default_leaves_conditional_execution_off_on_the_cpu_only():
    """The CPU default drops the guards (a paired A/B found them a consistent loss there, see
    benchmarks/RESULTS.md); the cuda backend keeps them; ``Optimizations()`` stays all-on."""
    data, params, _ = shading.make_data((12, 10))
    plan = compile_problem(shading.energy(), arrays=data, params=params)
    assert plan.optimizations == Optimizations(conditional=False)
    assert code_statistics(plan)["grid0_jtjp"]["guards"] == 0
    assert Optimizations.for_backend("numpy") == Optimizations(conditional=False)
    assert Optimizations.for_backend("cuda") == Optimizations()
    with pytest.raises(ValueError, match="backend must be 'llvm', 'numpy' or 'cuda', got 'gpu'"):
        Optimizations.for_backend("gpu")
