"""The cuda backend (``compile_problem(..., backend="cuda")``, :mod:`lsq_opt._compiler.cuda`)
in core_ad's four tiers (``packages/core-ad/tests/test_codegen_cuda.py``), which skip cleanly:

* **source** (always): every term of the example energies (Laplacian, ARAP image, ARAP mesh,
  optical flow with a SampledImage, intrinsic images with IRLS ``X.const()`` views) gets its ``f`` / ``fj`` kernel in float32 and float64, with
  the expected signature (one output per residual channel, plus one per partial); CuPy is never
  imported by the other backends; a missing CuPy is a named :class:`LsqCompileError`.
* **nvcc** (``nvcc`` on PATH): all those kernels in ONE translation unit compile to PTX.
* **host** (``g++``): the same sources compiled for the CPU
  (:mod:`core_ad._codegen.cuda.host_emulation`: a shim header for the CUDA built-ins, every
  thread of the grid run in turn), launched by the real ``CudaFunction`` through a stand-in
  ``cupy`` / ``cupyx`` whose arrays refuse to mix with numpy arrays -- so the whole cuda Plan
  (device mirrors, the lanes composition over ``xp``, uploads / downloads) runs as on a GPU.
  Its cost, residuals, J^T F, diag(J^T J), J^T J p and J equal the numpy-oracle Plan's
  (``backend="numpy"``); so do those of its ``device_problem()`` (the all-device loop's
  problem: device vectors in and out, the fused ``jtjp`` / ``grad`` kernels, generated per
  plan and compiled for the host on first launch); its fused ``linearize`` gives the oracle's F
  and J entries of every term and its fused ``cost`` the oracle's cost (float64 1e-12, float32
  1e-5), one kernel launch each, without the per-term lane kernels; short LM and GN solves take the oracle's
  iterates both with the all-device loop (the default) and over the host protocol
  (``device_loop=False``), and the device loop moves no n-vector between host and device
  inside its PCG iterations. The device PCG (scalars on the device,
  :mod:`lsq_opt._solver.device_pcg`) takes the host PCG's step, iteration count, stop reason
  (tolerance, Q tolerance, max iterations, breakdown, non-finite), residual norm and Q history
  for several check periods, synchronising exactly ceil(iterations / check period) + 1 times,
  once more with the Q test (transfers counted through the stand-in).
* **gpu** (``@pytest.mark.gpu``: CuPy and a CUDA device): the same checks on the device.

Tolerances (relative to the largest entry of the oracle's vector): float64 1e-12, float32 1e-4
(float32 transcendentals differ by a few ulp between glibc / CUDA and numpy, J^T J p sums
many of them, and the fused kernels' atomic sums run in a device-chosen order). LM / GN
iterates: 1e-9 / 1e-3 relative after 4 iterations (a PCG loop amplifies the rounding
differences of its products); final costs 1e-12 / 1e-5 relative. Device PCG against host PCG:
:data:`PCG_TOL`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from core_ad._codegen.cuda import launcher
from lsq_opt import LsqCompileError, compile_problem, solve
from lsq_opt._compiler import _Term
from lsq_opt._solver.device_pcg import KERNELS as PCG_KERNELS
from lsq_opt._solver.device_pcg import kernel_sources
from lsq_opt._solver.pcg import pcg
from lsq_opt._solver.vectors import VectorOps
from lsq_opt.examples import arap, cotangent, flow, intrinsic, laplacian, mesh

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
DTYPES = ("float64", "float32")
TOL = {"float64": 1e-12, "float32": 1e-4}


# --------------------------------------------------------------------------------------------
# the problems: small instances of the example energies


def laplacian_problem():
    _, noisy = laplacian.make_data((9, 7))
    return laplacian.energy(), dict(arrays={"A": noisy}, params={"w_fit": 0.1, "w_reg": 0.9})


def arap_image_problem():
    size = (12, 8)
    ur, mask, handles, targets = arap.make_data(size, bend_deg=30.0)
    return arap.energy(), dict(
        arrays={"UrShape": ur, "Mask": mask, "Offset": ur,
                "Constraints": arap._constraints(size, handles, targets),
                "Angle": np.zeros(size)},
        params={"w_fitSqrt": 3.0, "w_regSqrt": 1.0})


def arap_mesh_problem():
    V, _, (v0, v1), handles, targets = mesh.arap_setup(rings=4, segs=5)
    return mesh.arap_energy(), dict(
        arrays={"UrShape": V, "Constraints": mesh.constraints(len(V), handles, targets),
                "Offset": V.copy(), "Angle": np.zeros_like(V)},
        params={"w_fitSqrt": 2.0, "w_regSqrt": 1.0}, graphs={"G": {"v0": v0, "v1": v1}})


def flow_problem():
    I, I_hat, dx, dy = flow.make_pair((10, 8))
    return flow.energy(), dict(arrays={"I": I, "I_hat": I_hat, "I_hat_dx": dx, "I_hat_dy": dy},
                               params={"w_fit": 3.0, "w_reg": 0.5})


def intrinsic_problem():
    """IRLS: the L_p weights read ``r.const()``, a view refreshed from x at every linearize."""
    img, _, _ = intrinsic.make_data((8, 6))
    return intrinsic.energy(), dict(
        arrays={"i": img, "r": img.copy(), "s": np.zeros(img.shape[:2])},
        params=dict(intrinsic.PARAMS, pNorm=0.8))


PROBLEMS = {"laplacian": laplacian_problem, "arap_image": arap_image_problem,
            "arap_mesh": arap_mesh_problem, "flow": flow_problem, "intrinsic": intrinsic_problem}
_ENERGIES = {}


def problem(name):
    if name not in _ENERGIES:  # one Energy object per problem: the same kernels every time
        _ENERGIES[name] = PROBLEMS[name]()
    return _ENERGIES[name]


def kernel_terms(name, dtype):
    """The cuda backend's terms of a problem, built without a device (source generation only)."""
    energy, _ = problem(name)
    return [_Term(i, chans, np.dtype(dtype), "cuda") for i, chans in enumerate(energy.terms)]


_ALL = {}


def all_kernels():
    """``{(problem, dtype): [terms]}`` for every problem and dtype (built once)."""
    if not _ALL:
        for name in PROBLEMS:
            for dt in DTYPES:
                _ALL[(name, dt)] = kernel_terms(name, dt)
    return _ALL


def kernel_list():
    return [(fn.name, fn.source) for terms in all_kernels().values() for t in terms
            for fn in (t.f, t.fj)]


def plans(name, dtype):
    """(cuda Plan, numpy-oracle Plan) of a problem."""
    energy, kw = problem(name)
    return (compile_problem(energy, dtype=dtype, backend="cuda", **kw),
            compile_problem(energy, dtype=dtype, backend="numpy", **kw))


# --------------------------------------------------------------------------------------------
# source tier


def test_every_term_has_well_formed_f_and_fj_kernels():
    n = 0
    for (name, dt), terms in all_kernels().items():
        ctype = "double" if dt == "float64" else "float"  # the plan dtype of the float leaves
        for t in terms:
            for fn, n_out in ((t.f, t.K), (t.fj, t.K + t.K * t.R)):
                kind = "f" if fn is t.f else "fj"
                assert fn.backend == "cuda" and fn.name == f"lsq_term{t.index}_{kind}"
                src = fn.source
                assert f'extern "C" __global__ void {fn.name}(' in src, (name, dt, fn.name)
                assert "for (long long i = " in src  # the grid-stride loop
                assert len(re.findall(r"\* __restrict__ out\d+", src)) == n_out
                assert [v.name for v in fn.inputs] == [lf.name for lf in t.leaves]
                n_float = sum(lf.dtype.kind == "f" for lf in t.leaves)
                assert len(re.findall(rf"const {ctype}\* __restrict__ in\d+", src)) == n_float
                n += 1
    assert n == 2 * sum(len(terms) for terms in all_kernels().values())
    assert n >= 2 * 2 * (3 + 5 + 2 + 5)


def test_graph_and_stencil_terms_are_recognised():
    terms = all_kernels()[("arap_mesh", "float64")]
    assert [t.is_graph for t in terms] == [False, True]
    # 3 residual channels over the unknown reads Offset(v0), Offset(v1), Angle(v0), 3 channels each
    assert terms[1].K == 3 and terms[1].R == 3 + 3 + 3
    assert not any(t.is_graph for t in all_kernels()[("arap_image", "float64")])


def test_fused_kernels_are_refused_with_the_cuda_backend():
    energy, kw = problem("laplacian")
    with pytest.raises(ValueError, match="cuda backend composes lane kernels"):
        compile_problem(energy, backend="cuda", kernels="fused", **kw)


def test_missing_cupy_is_a_named_compile_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    energy, kw = problem("laplacian")
    with pytest.raises(LsqCompileError, match=r"backend='cuda' needs CuPy"):
        compile_problem(energy, backend="cuda", **kw)


def test_other_backends_do_not_import_cupy():
    code = ("import sys, numpy as np; from lsq_opt.examples import laplacian as l; "
            "from lsq_opt import compile_problem; _, a = l.make_data((5, 4)); "
            "p = [compile_problem(l.energy(), arrays={'A': a}, params={'w_fit': 1.0, "
            "'w_reg': 1.0}, backend=b) for b in ('numpy', 'llvm')]; "
            "[q.jtf(q.x0) for q in p]; assert 'cupy' not in sys.modules, 'cupy imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------------------------
# nvcc tier: every kernel of this file in one translation unit


def _ptx_entries(tmp_path, stem, text, timeout):
    """Compile the CUDA translation unit ``text`` to PTX with nvcc (sm_80): its kernel names."""
    src, ptx = tmp_path / f"{stem}.cu", tmp_path / f"{stem}.ptx"
    src.write_text(text)
    r = subprocess.run([NVCC, "--ptx", "-arch=sm_80", "-std=c++17", str(src), "-o", str(ptx)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return re.findall(r"\.entry\s+(\w+)\(", ptx.read_text())


def test_nvcc_compiles_every_kernel(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    from core_ad._codegen.cuda.host_emulation import translation_unit

    text, symbols = translation_unit(kernel_list())
    entries = set(_ptx_entries(tmp_path, "lsq_kernels", text, timeout=300))
    assert set(symbols.values()) <= entries, sorted(set(symbols.values()) - entries)


# --------------------------------------------------------------------------------------------
# the checks, shared by the host and gpu tiers


def _close(got, want, dtype, what):
    want = np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                               atol=TOL[dtype] * scale, err_msg=what)


def check_products(name, dtype):
    dev, ref = plans(name, dtype)
    assert dev.n == ref.n and dev.m == ref.m and dev.backend == "cuda"
    rng = np.random.default_rng(5)
    x = (ref.x0 + 0.05 * rng.standard_normal(ref.n)).astype(dtype)
    p = rng.standard_normal(ref.n).astype(dtype)
    for plan in (dev, ref):
        plan.linearize(x)
    label = f"{name} {dtype}"
    _close(dev.residuals(x), ref.residuals(x), dtype, f"{label}: residuals")
    _close(dev.cost(x), ref.cost(x), dtype, f"{label}: cost")
    _close(dev.cost(x * 1.01), ref.cost(x * 1.01), dtype, f"{label}: cost at a trial point")
    for what in ("jtf", "jtj_diag"):
        got = getattr(dev, what)(x)
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype) and got.shape == (ref.n,)
        _close(got, getattr(ref, what)(x), dtype, f"{label}: {what}")
    _close(dev.jtjp_linearized(p), ref.jtjp_linearized(p), dtype, f"{label}: jtjp")
    _close(dev.jtjp(x, 2 * p), ref.jtjp(x, 2 * p), dtype, f"{label}: jtjp(x, p)")
    _close(dev.jp(x, p), ref.jp(x, p), dtype, f"{label}: jp")
    Jd, Jr = dev.jacobian(x).toarray(), ref.jacobian(x).toarray()
    _close(Jd, Jr, dtype, f"{label}: jacobian")
    assert np.abs(Jr).sum() > 0 and np.abs(ref.jtf(x)).max() > 0  # the checks are not vacuous
    return dev, ref


def arap_mesh_self_loop_problem():
    """The ARAP mesh with a self-loop edge: two reads of one unknown channel through different
    slots hit one vertex, whose diag(J^T J) entry adds their partials before squaring."""
    energy, kw = problem("arap_mesh")
    G = kw["graphs"]["G"]
    graphs = {"G": {"v0": np.append(G["v0"], 3), "v1": np.append(G["v1"], 3)}}
    return energy, dict(kw, graphs=graphs)


def cotangent_problem():
    """A graph energy with edge attributes and excluded (boundary) vertices: the fused kernels
    map graph reads through the free-unknown map."""
    V, tris, boundary = cotangent.lattice_mesh(6, 5)
    v0, v1, w = cotangent.cotangent_weights(V, tris)
    return cotangent.energy(), dict(arrays={"A": V, "X": V, "Boundary": boundary},
                                    params={"w_fit": 0.3, "w_reg": 1.0},
                                    graphs={"Edges": {"v0": v0, "v1": v1, "w": w}})


# energies whose device-problem products are checked besides PROBLEMS
DEVICE_PRODUCT_PROBLEMS = {"arap_mesh_self_loop": arap_mesh_self_loop_problem,
                           "cotangent": cotangent_problem}


def check_device_products(name, dtype, xp):
    """The all-device problem's products equal the numpy oracle's (device vectors in and out)."""
    builder = DEVICE_PRODUCT_PROBLEMS.get(name)
    energy, kw = builder() if builder else problem(name)
    dev = compile_problem(energy, dtype=dtype, backend="cuda", **kw)
    ref = compile_problem(energy, dtype=dtype, backend="numpy", **kw)
    prob = dev.device_problem()
    assert prob.xp is xp and prob.n == ref.n and ref.device_problem() is None
    rng = np.random.default_rng(7)
    x = (ref.x0 + 0.05 * rng.standard_normal(ref.n)).astype(dtype)
    p = rng.standard_normal(ref.n).astype(dtype)
    xd, pd = xp.asarray(x), xp.asarray(p)
    ref.linearize(x)
    prob.linearize(xd)
    label = f"{name} {dtype} device problem"
    for what, got, want in (("jtf", prob.jtf(xd), ref.jtf(x)),
                            ("jtj_diag", prob.jtj_diag(xd), ref.jtj_diag(x)),
                            ("jtjp", prob.jtjp_linearized(pd), ref.jtjp_linearized(p)),
                            ("residuals", prob.residuals(xd), ref.residuals(x))):
        assert isinstance(got, xp.ndarray) and got.dtype == np.dtype(dtype), (label, what)
        _close(got.get(), want, dtype, f"{label}: {what}")
    _close(prob.cost(xd), ref.cost(x), dtype, f"{label}: cost")
    damping = rng.random(ref.n).astype(dtype)
    _close(prob.damped_jtjp_linearized(pd, xp.asarray(damping)).get(),
           ref.jtjp_linearized(p) + damping * p, dtype, f"{label}: J^T J p + D p")
    x2 = (x * 1.01).astype(dtype)  # a new point: jtjp(x, p) linearises there first
    _close(prob.jtjp(xp.asarray(x2), pd).get(), ref.jtjp(x2, p), dtype, f"{label}: jtjp(x, p)")
    assert np.abs(ref.jtj_diag(x)).max() > 0 and np.abs(ref.jtjp(x, p)).max() > 0
    return prob


EVALUATION_TOL = {"float64": 1e-12, "float32": 1e-5}


def check_device_evaluation(name, dtype, xp):
    """The device problem's fused ``linearize`` (F and the J entries of every term, the cache
    the product kernels read) and ``cost`` (at the linearisation point and at a trial point)
    equal the numpy oracle's; returns the device problem and a point."""
    builder = DEVICE_PRODUCT_PROBLEMS.get(name)
    energy, kw = builder() if builder else problem(name)
    dev = compile_problem(energy, dtype=dtype, backend="cuda", **kw)
    ref = compile_problem(energy, dtype=dtype, backend="numpy", **kw)
    prob = dev.device_problem()
    rng = np.random.default_rng(11)
    x = (ref.x0 + 0.05 * rng.standard_normal(ref.n)).astype(dtype)
    xd = xp.asarray(x)
    ref.linearize(x)
    prob.linearize(xd)
    label = f"{name} {dtype} fused evaluation"
    tol = EVALUATION_TOL[dtype]
    for t, (F, D), (Fr, Dr) in zip(ref.terms, prob.linearization, ref._linearize(x)):
        assert isinstance(F, xp.ndarray) and isinstance(D, xp.ndarray), label
        assert F.shape == Fr.shape and D.shape == Dr.shape and F.dtype == D.dtype == np.dtype(dtype)
        for what, got, want in (("F", F, Fr), ("J entries", D, Dr)):
            scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
            np.testing.assert_allclose(got.get(), want, rtol=0, atol=tol * scale,
                                       err_msg=f"{label}: term {t.index} {what}")
    for point in (x, (x * 1.01).astype(dtype)):
        np.testing.assert_allclose(prob.cost(xp.asarray(point)), ref.cost(point), rtol=tol,
                                   err_msg=f"{label}: cost")
    assert ref.cost(x) > 0 and any(np.abs(D).max() > 0 for _, D in ref._linearize(x) if D.size)
    return prob, xd


def check_lm_iterates(name, dtype, iterations=4, method="lm", device_loop=True):
    """A short solve of the cuda plan (all-device loop, or the host protocol) takes the numpy
    oracle's iterates, steps and PCG iteration counts (with the defaults' predicted stop and
    PCG decrease tolerance, which read CG's coefficients: the device loop records them)."""
    dev, ref = plans(name, dtype)
    runs = []
    for plan in (dev, ref):
        xs = []
        res = solve(plan, plan.x0, method=method, max_iterations=iterations, pcg_max_iterations=20,
                    device_loop=device_loop, callback=lambda entry, x: xs.append(np.copy(x)))
        runs.append((res, xs))
    (rd, xd), (rr, xr) = runs
    assert len(xd) == len(xr) >= 2, (len(xd), len(xr))
    tol = 1e-9 if dtype == "float64" else 1e-3
    for k, (a, b) in enumerate(zip(xd, xr)):
        scale = max(float(np.max(np.abs(b))), 1.0)
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale, err_msg=f"{name} {dtype} it {k}")
    assert [e.accepted for e in rd.log] == [e.accepted for e in rr.log]
    assert isinstance(rd.x, np.ndarray) and rd.x.dtype == np.dtype(dtype)
    assert rd.cost < rd.initial_cost and rd.preconditioner == rr.preconditioner == "jacobi"
    np.testing.assert_allclose(rd.cost, rr.cost, rtol=1e-12 if dtype == "float64" else 1e-5)
    assert [e.pcg_iterations for e in rd.log] == [e.pcg_iterations for e in rr.log]
    return dev


# --------------------------------------------------------------------------------------------
# host tier


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    """The term kernels in one unit; the fused product kernels (generated per bound plan) are
    compiled when first launched."""
    if GXX is None:
        pytest.skip("g++ is not available")
    from core_ad._codegen.cuda.host_emulation import HostKernels

    return HostKernels(kernel_list(), tmp_path_factory.mktemp("lsq_cuda_host"), compile_missing=True)


@pytest.fixture
def host_cupy(host_kernels, monkeypatch):
    """The stand-in ``cupy`` / ``cupyx`` (host-compiled kernels), installed for one test."""
    from core_ad._codegen.cuda.host_emulation import stand_in_cupy

    cp, cpx = stand_in_cupy(host_kernels)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cpx)
    monkeypatch.setattr(launcher, "_KERNELS", {})
    return cp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_host_products_equal_the_numpy_oracle(host_cupy, name, dtype):
    dev, _ = check_products(name, dtype)
    assert host_cupy.launches > 0
    assert set(host_cupy.built) <= {fn.name for t in dev.terms for fn in (t.f, t.fj)}
    # the linearisation lives on the device
    assert all(isinstance(F, host_cupy.ndarray) and isinstance(D, host_cupy.ndarray)
               for F, D in dev._lin)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*PROBLEMS, *DEVICE_PRODUCT_PROBLEMS])
def test_host_device_problem_products_equal_the_numpy_oracle(host_cupy, name, dtype):
    prob = check_device_products(name, dtype, host_cupy)
    x = prob._lin_x
    p = host_cupy.ones(prob.n, np.dtype(dtype))
    launches = host_cupy.launches
    prob.jtjp_linearized(p)
    assert host_cupy.launches - launches == 1, "J^T J p is one kernel launch"
    prob.linearize(x)
    launches = host_cupy.launches
    prob.jtf(x), prob.jtj_diag(x)
    assert host_cupy.launches - launches == 1, "J^T F and diag(J^T J) are one kernel launch"
    assert {"lsq_jtjp", "lsq_grad"} <= set(host_cupy.built)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*PROBLEMS, *DEVICE_PRODUCT_PROBLEMS])
def test_host_fused_linearize_and_cost_equal_the_numpy_oracle(host_cupy, name, dtype):
    prob, x = check_device_evaluation(name, dtype, host_cupy)
    launches = host_cupy.launches
    prob.linearize(x)
    assert host_cupy.launches - launches == 1, "linearize is one kernel launch"
    launches = host_cupy.launches
    prob.cost(x * 1.01)
    assert host_cupy.launches - launches == 1, "cost is one kernel launch (and one device sum)"
    assert {"lsq_linearize", "lsq_cost"} <= set(host_cupy.built)
    # the per-term lane kernels (the host protocol's composition) are not used
    assert not any(name.startswith("lsq_term") for name in host_cupy.built), host_cupy.built


@pytest.mark.parametrize("device_loop", [True, False], ids=["device_loop", "host_protocol"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["laplacian", "arap_image", "arap_mesh", "intrinsic"])
def test_host_lm_takes_the_oracle_iterates(host_cupy, name, dtype, device_loop):
    check_lm_iterates(name, dtype, device_loop=device_loop)
    # the device loop's PCG runs its generated kernels; the host protocol's PCG is numpy
    pcg_kernels = {k for k in host_cupy.built if k.startswith("lsq_pcg_")}
    assert pcg_kernels == (set(PCG_KERNELS) if device_loop else set()), pcg_kernels


@pytest.mark.parametrize("name", ["laplacian", "arap_mesh"])
def test_host_gn_takes_the_oracle_iterates(host_cupy, name):
    check_lm_iterates(name, "float64", method="gn")


def test_host_device_loop_moves_no_vector_per_iteration(host_cupy, monkeypatch):
    """In the all-device loop n-vectors cross between host and device only when a solve starts
    and ends (x0, the fixed values and free-index map, the result), never per PCG or LM
    iteration: their number does not grow with the iterations."""
    from core_ad._codegen.cuda.host_emulation import HostDeviceArray

    dev, _ = plans("arap_image", "float64")
    moved = []
    upload, download = host_cupy.asarray, HostDeviceArray.get

    def counting_upload(a, dtype=None):
        if not isinstance(a, HostDeviceArray) and np.size(a) >= dev.n:
            moved.append(("upload", np.shape(a)))
        return upload(a, dtype)

    def counting_download(a):
        if a.size >= dev.n:
            moved.append(("download", a.shape))
        return download(a)

    monkeypatch.setattr(host_cupy, "asarray", counting_upload)
    monkeypatch.setattr(HostDeviceArray, "get", counting_download)
    fixed = dict(pcg_max_iterations=20, function_tolerance=0.0, gradient_tolerance=0.0,
                 parameter_tolerance=0.0)
    solve(dev, dev.x0, max_iterations=1, **fixed)  # the data arrays' device mirrors, once
    counts = {}
    for iterations in (1, 5):
        moved.clear()
        res = solve(dev, dev.x0, max_iterations=iterations, **fixed)
        counts[iterations] = (list(moved), res.pcg_iterations)
    assert counts[5][1] >= counts[1][1] + 20, counts
    assert counts[5][0] == counts[1][0] and len(counts[1][0]) <= 4, counts


def spd_system(dtype, n=120, seed=3, shift=0.0):
    """A dense SPD ``A`` (indefinite with ``shift`` < 0), a right-hand side and the Jacobi
    preconditioner, as host arrays of ``dtype``."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((n, n))
    A = M @ M.T / n + np.diag(0.2 + 3 * rng.random(n)) + shift * np.eye(n)
    return A.astype(dtype), rng.standard_normal(n).astype(dtype), (1 / np.diag(A)).astype(dtype)


class Fetches:
    """Counts the device-to-host transfers of the stand-in (``get``, scalar conversions)."""

    def __init__(self, monkeypatch):
        from core_ad._codegen.cuda.host_emulation import HostDeviceArray

        self.count = 0
        for name in ("get", "item", "__float__", "__int__", "__bool__"):
            monkeypatch.setattr(HostDeviceArray, name, self._counting(getattr(HostDeviceArray, name)))

    def _counting(self, method):
        def call(array, *args):
            self.count += 1
            return method(array, *args)
        return call


def device_pcg_run(cp, A, b, minv, calls=None, **kw):
    """PCG on device vectors (``cp``: the stand-in or CuPy) of the system ``A``; ``calls``
    collects each product's direction (``cupy.asnumpy``: outside the stand-in's fetch count)."""
    Ad = cp.asarray(A)

    def apply_A(p):
        if calls is not None:
            calls.append(cp.asnumpy(p))
        return cp.dot(Ad, p)

    return pcg(apply_A, cp.asarray(b), None if minv is None else cp.asarray(minv), ops=VectorOps(cp),
               **kw)


def sync_points(iterations, check_every, max_iterations=100, decrease=False):
    """The iterations after which a device PCG that stops at ``iterations`` fetches its state:
    every ``check_every``, the cap, and (with a decrease tolerance) the host loop's decrease
    tests; it launches iterations up to the first of them at or after the stop."""
    from lsq_opt._solver.pcg import DECREASE_CHECK_EVERY, MIN_RITZ_ITERATIONS

    points = []
    for i in range(1, max_iterations + 1):
        if i % check_every == 0 or i == max_iterations or (
                decrease and i >= MIN_RITZ_ITERATIONS and i % DECREASE_CHECK_EVERY == 0):
            points.append(i)
            if i >= iterations:
                return points
    return points


def launched_products(iterations, check_every, max_iterations=100, reset_period=0, decrease=False):
    """The products a device PCG that stops after ``iterations`` launches: its iterations up to
    the next check (or the cap), plus their residual resets."""
    launched = sync_points(iterations, check_every, max_iterations, decrease)[-1]
    return launched + (launched // reset_period if reset_period else 0)


PCG_CASES = {
    "tolerance": dict(tolerance=1e-6),
    "q tolerance": dict(tolerance=1e-12, q_tolerance=1e-6, residual_reset_period=5),
    "max iterations": dict(tolerance=1e-14, max_iterations=17, residual_reset_period=3),
    "decrease tolerance": dict(tolerance=1e-14, decrease_tolerance=1e-5, residual_reset_period=5),
}
# device PCG against the host PCG, relative: the step (to its largest entry), the Q history, the
# final residual norm (of a converged solve: its own rounding is large). The host emulation
# rounds as numpy does; a GPU contracts a * x + y into FMAs and sums the dots in another order.
PCG_TOL = {"host": {"float64": (1e-12, 1e-9), "float32": (1e-5, 1e-2)},
           "gpu": {"float64": (1e-10, 1e-6), "float32": (1e-4, 5e-2)}}


def run_device_pcg(cp, case, dtype, check_every):
    """(device, host) PCG results on a stopping ``case`` of :data:`PCG_CASES`."""
    kw = PCG_CASES[case]
    A, b, minv = spd_system(dtype)
    ref = pcg(lambda p: A @ p, b, minv, **kw)
    assert ref.reason == case and ref.iterations >= 8, (ref.reason, ref.iterations)
    return device_pcg_run(cp, A, b, minv, check_every=check_every, **kw), ref


def check_device_pcg(got, ref, case, dtype, tier):
    """The device PCG took the host PCG's step, iteration count, stop reason, residual norm,
    Q history and CG coefficients (the remaining-decrease estimate)."""
    assert (got.iterations, got.reason) == (ref.iterations, ref.reason)
    tol, r_tol = PCG_TOL[tier][dtype]
    assert len(got.alphas) == len(got.betas) == len(ref.alphas) == got.iterations
    # float32 iterations run past that precision (tolerance 1e-14) differ by rounding: 2.5 %
    c_tol = r_tol if dtype == "float64" else 0.1
    np.testing.assert_allclose(got.alphas, ref.alphas, rtol=c_tol)
    np.testing.assert_allclose(got.betas, ref.betas, rtol=c_tol)
    np.testing.assert_allclose(got.remaining_decrease(), ref.remaining_decrease(), rtol=c_tol)
    np.testing.assert_allclose(got.x.get(), ref.x, rtol=0, atol=tol * float(np.abs(ref.x).max()))
    np.testing.assert_allclose(got.residual_norm, ref.residual_norm, rtol=r_tol)
    assert got.rhs_norm == pytest.approx(ref.rhs_norm, rel=tol)
    assert len(got.q_history) == len(ref.q_history) == (ref.iterations if case == "q tolerance" else 0)
    np.testing.assert_allclose(got.q_history, ref.q_history, rtol=tol)


@pytest.mark.parametrize("check_every", [1, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(PCG_CASES))
def test_host_device_pcg_takes_the_host_iterates(host_cupy, monkeypatch, case, dtype, check_every):
    """Device-resident scalars: the host loop's results, with one synchronisation per check
    (every check_every iterations, and the decrease tests, which fetch CG's coefficients as
    well), one for ||b|| and one for the coefficients at the end (+1 with the Q test: its history); the iterations launched after
    the stop change nothing."""
    fetches = Fetches(monkeypatch)
    got, ref = run_device_pcg(host_cupy, case, dtype, check_every)
    kw = PCG_CASES[case]
    shape = (ref.iterations, check_every, kw.get("max_iterations", 100))
    decrease = "decrease_tolerance" in kw
    points = sync_points(*shape, decrease)
    # a decrease test fetches CG's coefficients too
    tests = sum(1 for i in points if decrease and i >= 8 and i % 4 == 0)
    assert fetches.count == len(points) + tests + 2 + (case == "q tolerance"), fetches.count
    check_device_pcg(got, ref, case, dtype, "host")
    assert got.n_apply == launched_products(*shape, kw.get("residual_reset_period", 0), decrease)


def check_device_pcg_on_a_full_grid(cp, tol):
    """A system larger than the vector kernels' grid (every block's slot of every dot used, and
    a grid-stride loop wrapping around): a tridiagonal SPD operator, with residual resets and the
    Q test's dot."""
    from core_ad._codegen.cuda.launcher import BLOCK
    from lsq_opt._solver.device_pcg import PCG_GRID

    n = PCG_GRID * BLOCK + 777
    rng = np.random.default_rng(4)
    d, b = 2.2 + 3 * rng.random(n), rng.standard_normal(n)
    minv = 1 / d

    def tridiagonal(d):
        def apply_A(p):
            q = d * p
            q[1:] -= p[:-1]
            q[:-1] -= p[1:]
            return q
        return apply_A

    kw = dict(tolerance=1e-7, q_tolerance=1e-12, residual_reset_period=4)
    ref = pcg(tridiagonal(d), b, minv, **kw)
    got = pcg(tridiagonal(cp.asarray(d)), cp.asarray(b), cp.asarray(minv), ops=VectorOps(cp), **kw)
    assert (got.reason, got.iterations) == (ref.reason, ref.iterations) == ("tolerance", ref.iterations)
    assert ref.iterations >= 8
    np.testing.assert_allclose(got.x.get(), ref.x, rtol=0, atol=tol * np.abs(ref.x).max())
    np.testing.assert_allclose(got.q_history, ref.q_history, rtol=tol)


def test_host_device_pcg_on_a_full_grid(host_cupy):
    check_device_pcg_on_a_full_grid(host_cupy, PCG_TOL["host"]["float64"][0])


def test_host_device_pcg_synchronisations_do_not_grow_per_iteration(host_cupy, monkeypatch):
    """The default check period: a 40-iteration solve synchronises 12 times (once for ||b||,
    then every 4 iterations, and once for CG's coefficients), where the host loop's scalars
    would cost 80."""
    A, b, minv = spd_system("float64", n=200, seed=9)
    kw = dict(tolerance=1e-30, max_iterations=40)
    fetches = Fetches(monkeypatch)
    res = device_pcg_run(host_cupy, A, b, minv, **kw)
    assert (res.iterations, res.reason) == (40, "max iterations")
    assert fetches.count == 2 + 40 // 4


def check_device_pcg_breakdown_and_non_finite_stop(cp, check_every, tol):
    """p.Ap <= 0 (an indefinite system) stops with "breakdown", a non-finite product with
    "non-finite", at the host loop's iteration and step; the directions after the stop are
    the stopping one (the direction update is a no-op)."""
    A, b, minv = spd_system("float64", seed=5, shift=-0.7)
    ref = pcg(lambda p: A @ p, b, minv, tolerance=1e-12)
    assert ref.reason == "breakdown" and ref.iterations >= 8, (ref.reason, ref.iterations)
    calls: list = []
    got = device_pcg_run(cp, A, b, minv, calls=calls, tolerance=1e-12, check_every=check_every)
    assert (got.reason, got.iterations) == ("breakdown", ref.iterations)
    np.testing.assert_allclose(got.x.get(), ref.x, rtol=0, atol=tol * np.abs(ref.x).max())
    assert len(calls) == -(-(ref.iterations + 1) // check_every) * check_every == got.n_apply
    assert all(np.array_equal(c, calls[ref.iterations]) for c in calls[ref.iterations:])

    A, b, minv = spd_system("float64")
    for on_device in (False, True):
        n_calls = [0]
        Ad = cp.asarray(A) if on_device else A

        def apply_A(p, Ad=Ad, on_device=on_device):
            n_calls[0] += 1
            q = (cp.dot(Ad, p) if on_device else A @ p)
            if n_calls[0] == 3:
                q[5] = np.nan
            return q

        if on_device:
            got = pcg(apply_A, cp.asarray(b), cp.asarray(minv), tolerance=1e-12,
                      ops=VectorOps(cp), check_every=check_every)
        else:
            ref = pcg(apply_A, b, minv, tolerance=1e-12)
    assert (got.reason, got.iterations) == (ref.reason, ref.iterations) == ("non-finite", 2)
    np.testing.assert_allclose(got.x.get(), ref.x, rtol=0, atol=tol * np.abs(ref.x).max())
    assert got.residual_norm == pytest.approx(ref.residual_norm, rel=tol)


@pytest.mark.parametrize("check_every", [1, 4])
def test_host_device_pcg_breakdown_and_non_finite_stop(host_cupy, check_every):
    check_device_pcg_breakdown_and_non_finite_stop(host_cupy, check_every, PCG_TOL["host"]["float64"][0])


def test_host_device_pcg_edge_cases(host_cupy):
    A, b, minv = spd_system("float64")
    zero = device_pcg_run(host_cupy, A, np.zeros_like(b), minv)
    assert (zero.reason, zero.iterations, zero.n_apply) == ("zero rhs", 0, 0)
    b_inf = b.copy()
    b_inf[3] = np.inf
    assert device_pcg_run(host_cupy, A, b_inf, minv).reason == "non-finite"
    capped = device_pcg_run(host_cupy, A, b, minv, max_iterations=0)
    assert (capped.reason, capped.iterations) == ("max iterations", 0)
    plain = device_pcg_run(host_cupy, A, b, None, tolerance=1e-8)
    ref = pcg(lambda p: A @ p, b, None, tolerance=1e-8)
    assert (plain.reason, plain.iterations) == (ref.reason, ref.iterations) == ("tolerance", ref.iterations)
    with pytest.raises(ValueError, match="check_every must be a positive integer"):
        device_pcg_run(host_cupy, A, b, minv, check_every=0)
    with pytest.raises(TypeError, match="inverse diagonal preconditioner"):
        pcg(lambda p: p, host_cupy.asarray(b), lambda r: r, ops=VectorOps(host_cupy))


def test_host_device_lm_with_q_tolerance(host_cupy, monkeypatch):
    """LM with a fixed PCG tolerance (Q test on, residual resets every 10 iterations) on the
    device loop takes the oracle's iterates, PCG counts and reasons, checking PCG's state every
    iteration or every 4; the latter saves k - ceil(k / 4) synchronisations on a k-iteration
    PCG solve, and nothing else changes."""
    dev, ref = plans("arap_mesh", "float64")

    def run(plan, **kw):
        xs = []
        res = solve(plan, plan.x0, max_iterations=4, pcg_tolerance=1e-9, pcg_max_iterations=40,
                    predicted_stop=False,  # the Q test alone (no PCG decrease tolerance)
                    callback=lambda entry, x: xs.append(np.copy(x)), **kw)
        return res, xs

    rr, xr = run(ref)
    pcg_iterations = [e.pcg_iterations for e in rr.log]
    assert {e.pcg_reason for e in rr.log} == {"q tolerance"}, [e.pcg_reason for e in rr.log]
    assert max(pcg_iterations) > 10  # a residual reset happened
    fetches = Fetches(monkeypatch)
    syncs = {}
    for check_every in (1, 4):
        before = fetches.count
        rd, xd = run(dev, pcg_check_every=check_every)
        syncs[check_every] = fetches.count - before
        assert [e.pcg_reason for e in rd.log] == [e.pcg_reason for e in rr.log]
        assert [e.pcg_iterations for e in rd.log] == pcg_iterations
        for a, b in zip(xd, xr, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-9 * max(np.abs(b).max(), 1.0))
        np.testing.assert_allclose(rd.cost, rr.cost, rtol=1e-12)
    assert syncs[1] - syncs[4] == sum(k - -(-k // 4) for k in pcg_iterations), syncs


def test_host_device_loop_bad_input(host_cupy):
    dev, ref = plans("laplacian", "float64")
    with pytest.raises(ValueError, match="cannot precondition the all-device solver loop"):
        solve(dev, dev.x0, preconditioner="multigrid")
    with pytest.raises(ValueError, match="x0 has length"):
        solve(dev, dev.x0[:-1])
    prob = dev.device_problem()
    with pytest.raises(TypeError, match=r"must be a device array of shape"):
        prob.linearize(dev.x0)  # a numpy vector
    with pytest.raises(TypeError, match=r"must be a device array of shape"):
        prob.cost(host_cupy.asarray(dev.x0.astype(np.float32)))
    # the host protocol and a multigrid preconditioner: still available without the device loop
    res = solve(dev, dev.x0, preconditioner="multigrid", device_loop=False, max_iterations=2)
    assert res.preconditioner == "multigrid" and res.cost < res.initial_cost


def test_host_data_and_param_changes_reach_the_device(host_cupy):
    dev, ref = plans("laplacian", "float64")
    x = ref.x0 + 0.1
    _close(dev.jtf(x), ref.jtf(x), "float64", "before")
    launches = host_cupy.launches
    dev.jtf(x)
    assert host_cupy.launches == launches  # the linearisation is cached
    new = np.random.default_rng(1).random(ref.data["A"].shape[:2])
    for plan in (dev, ref):
        plan.set_array("A", new)
        plan.set_param("w_reg", 0.5)
    _close(dev.jtf(x), ref.jtf(x), "float64", "after set_array / set_param")
    _close(dev.cost(x), ref.cost(x), "float64", "cost after set_array / set_param")


def test_host_mixing_numpy_into_device_code_is_caught(host_cupy):
    """The stand-in is as strict as CuPy: a host array in a device expression fails."""
    a = host_cupy.zeros(3, np.float64)
    with pytest.raises(TypeError, match="numpy array cannot be mixed"):
        a + np.ones(3)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(a)


# --------------------------------------------------------------------------------------------
# gpu tier


@pytest.fixture(scope="module")
def cupy_dev():
    from core_ad._codegen.cuda.launcher import available

    if not available():
        pytest.skip("no CuPy with a usable CUDA device")
    import cupy

    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_gpu_products_equal_the_numpy_oracle(cupy_dev, name, dtype):
    dev, _ = check_products(name, dtype)
    assert all(isinstance(F, cupy_dev.ndarray) for F, _ in dev._lin)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*PROBLEMS, *DEVICE_PRODUCT_PROBLEMS])
def test_gpu_device_problem_products_equal_the_numpy_oracle(cupy_dev, name, dtype):
    check_device_products(name, dtype, cupy_dev)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*PROBLEMS, *DEVICE_PRODUCT_PROBLEMS])
def test_gpu_fused_linearize_and_cost_equal_the_numpy_oracle(cupy_dev, name, dtype):
    check_device_evaluation(name, dtype, cupy_dev)


@pytest.mark.gpu
@pytest.mark.parametrize("device_loop", [True, False], ids=["device_loop", "host_protocol"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["laplacian", "arap_image", "arap_mesh", "intrinsic"])
def test_gpu_lm_takes_the_oracle_iterates(cupy_dev, name, dtype, device_loop):
    check_lm_iterates(name, dtype, device_loop=device_loop)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["laplacian", "arap_mesh"])
def test_gpu_gn_takes_the_oracle_iterates(cupy_dev, name):
    check_lm_iterates(name, "float64", method="gn")


@pytest.mark.gpu
@pytest.mark.parametrize("check_every", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(PCG_CASES))
def test_gpu_device_pcg_takes_the_host_iterates(cupy_dev, case, dtype, check_every):
    check_device_pcg(*run_device_pcg(cupy_dev, case, dtype, check_every), case, dtype, "gpu")


@pytest.mark.gpu
def test_gpu_device_pcg_on_a_full_grid(cupy_dev):
    check_device_pcg_on_a_full_grid(cupy_dev, PCG_TOL["gpu"]["float64"][0])


@pytest.mark.gpu
@pytest.mark.parametrize("check_every", [1, 4])
def test_gpu_device_pcg_breakdown_and_non_finite_stop(cupy_dev, check_every):
    check_device_pcg_breakdown_and_non_finite_stop(cupy_dev, check_every, PCG_TOL["gpu"]["float64"][0])


@pytest.mark.gpu
def test_gpu_device_loop_multigrid_is_refused(cupy_dev):
    dev, _ = plans("laplacian", "float64")
    with pytest.raises(ValueError, match="cannot precondition the all-device solver loop"):
        solve(dev, dev.x0, preconditioner="jacobi+multigrid")


def test_nvcc_compiles_every_fused_kernel(host_cupy, tmp_path):
    """The all-device loop's kernels, generated per bound plan (products, linearize, cost) and
    per dtype (vector updates), compile with nvcc: the host tier runs them through g++ only."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    units = []
    for dtype in DTYPES:
        units += [source for _, source in kernel_sources(dtype)]
        for name in [*PROBLEMS, *DEVICE_PRODUCT_PROBLEMS]:
            builder = DEVICE_PRODUCT_PROBLEMS.get(name)
            energy, kw = builder() if builder else problem(name)
            k = compile_problem(energy, dtype=dtype, backend="cuda", **kw).device_problem().kernels
            units += [k.jtjp_source, k.grad_source, *k.sources.values()]
    # every unit defines its kernel under the same few names: number them apart
    text = "\n".join(re.sub(r"(__global__\s+void\s+)(\w+)", rf"\g<1>\g<2>_{i}", u)
                     for i, u in enumerate(units))
    entries = _ptx_entries(tmp_path, "lsq_fused", text, timeout=600)
    assert len(entries) == len(units)
