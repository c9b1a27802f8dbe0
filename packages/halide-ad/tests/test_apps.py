"""The application pipelines of ``halide_ad.apps`` against their numpy references, under
every named schedule, and the schedules against each other.

Backend: ``halide_ad`` by default; ``HALIDE_AD_TEST_BACKEND=halide`` runs the same pipelines
on Halide 21 (``pip install halide==21.0.0``; skipped when it does not import), which is how
the pipelines and references were validated:

    HALIDE_AD_TEST_BACKEND=halide python -m pytest packages/halide-ad/tests/test_apps.py

Sizes are small (about 70 x 45, deliberately not multiples of the 64 x 32 tiles or of the
vector width 8, so tails are exercised). In the slow tier (``-m slow``): the all-inline
bilateral grid and local-Laplacian pyramid (fully inlined they are huge expressions: Halide
21 takes ~10 s and ~30 s to compile them) and a deeper pyramid (levels=8, J=3). The default
tier takes ~20 s under Halide 21 and ~20 s of CPU under halide_ad (mostly compilation).

Tolerances (outputs are float32, references float64; values are O(1) unless stated):

* blur: 2e-7 absolute. The [1 2 1]/4 weights are exact, so only the rounding of two
  3-term sums remains (a few ulp of values < 1).
* conv2d (5 x 3 kernel, taps <= 1): 2e-6 absolute: 15 float32 products and sums.
* gamma: 2e-6 relative + 1e-7 absolute for float32 ``pow``; the loss is a serial float32
  sum of ~9e3 positive terms, whose rounding error grows ~sqrt(n) eps (bound n eps = 6e-4):
  1e-4 relative.
* histogram: counts exact; cdf and the equalised image 1e-6 relative (one float32 division).
* upsample: 1e-5 absolute: the sample position ``u = (x + 0.5) / f - 0.5`` is rounded to
  float32 (ulp(u) <= 4e-6 for u < 64), which perturbs the lerp weights by that much.
* bilateral_grid: 1e-5 absolute on the normalised output (grid sums of 16 to 64 samples,
  three [1 4 6 4 1] passes with values up to ~1e5, a trilinear lerp and a ratio, all float32).
* local_laplacian: 2e-5 absolute: float32 exp, 2-3 pyramid levels of 4-tap filters and lerps.

Schedules against each other: integer outputs must be identical; float outputs must agree
to ``SCHEDULE_RTOL = 1e-6`` of the output's magnitude (a few ulp); upsample to 1e-5
absolute (its float32 sample position, see above, is itself rounded differently per
schedule). They are not required to be bit-identical because Halide 21 itself is not: its
simplifier re-associates float arithmetic differently once a Func is inlined, and LLVM may
contract a*b+c into an FMA in vectorised loops but not in scalar ones (Halide 21's tiled
upsample differs from its root one by 8 ulp).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

BACKEND = os.environ.get("HALIDE_AD_TEST_BACKEND", "halide_ad")
APPS_DIR = Path(__file__).resolve().parents[1] / "src" / "halide_ad" / "apps"

if BACKEND == "halide":
    hl = pytest.importorskip("halide", reason="HALIDE_AD_TEST_BACKEND=halide needs halide==21")
elif BACKEND == "halide_ad":
    try:
        hl = importlib.import_module("halide_ad")
    except ModuleNotFoundError as e:  # the package itself is absent (not a broken import)
        if e.name != "halide_ad":
            raise
        pytest.skip("halide_ad is not installed", allow_module_level=True)
else:
    raise RuntimeError(f"HALIDE_AD_TEST_BACKEND must be 'halide_ad' or 'halide', "
                       f"not {BACKEND!r}")


def _load_apps():
    """``halide_ad.apps``; for the Halide backend loaded from its directory so that the
    check against Halide 21 does not need (or import) the rest of halide_ad."""
    if BACKEND == "halide_ad":
        return importlib.import_module("halide_ad.apps")
    name = "_halide_ad_apps_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, APPS_DIR / "__init__.py", submodule_search_locations=[str(APPS_DIR)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


apps = _load_apps()
SCHEDULES = apps.SCHEDULES
SCHEDULE_RTOL = 1e-6
W, H = 70, 45


# ---------------------------------------------------------------------------- the cases
def _rng(seed):
    return np.random.default_rng(seed)


def _gamma(shape):
    def make():
        rng = _rng(1)
        img = rng.uniform(-0.05, 1.0, shape).astype(np.float32)    # a few < 0: max(., 0)
        tgt = rng.uniform(0.0, 1.0, shape).astype(np.float32)
        args, kw = (img, tgt), {"gamma": 2.2}
        out, loss = apps.gamma.reference(*args, **kw)
        return args, kw, {"gamma": (out, {"rtol": 2e-6, "atol": 1e-7}),
                          "loss": (np.float64(loss), {"rtol": 1e-4, "atol": 0})}
    return make


def _blur():
    img = _rng(2).random((H, W), dtype=np.float32)
    return (img,), {}, {"blur_y": (apps.blur.reference(img), {"rtol": 0, "atol": 2e-7})}


def _conv2d(bc):
    def make():
        rng = _rng(3)
        img = rng.random((H, W), dtype=np.float32)
        kernel = rng.uniform(-1, 1, (3, 5)).astype(np.float32)     # (kh, kw): not square
        ref = apps.conv2d.reference(img, kernel, bc=bc)
        return (img, kernel), {"bc": bc}, {"output": (ref, {"rtol": 0, "atol": 2e-6})}
    return make


def _histogram(kind):
    def make():
        rng = _rng(4)
        if kind == "uint8":
            img = rng.integers(0, 256, (H, W)).astype(np.uint8)
            kw = {"nbins": 256}
        else:
            img = rng.uniform(-0.1, 1.1, (H, W)).astype(np.float32)  # clamped bins too
            kw = {"nbins": 64}
        hist, cdf, eq = apps.histogram.reference(img, **kw)
        tol = {"rtol": 1e-6, "atol": 0}
        return (img,), kw, {"hist": (hist, {"rtol": 0, "atol": 0}), "cdf": (cdf, tol),
                            "equalized": (eq, tol)}
    return make


def _upsample(shape, factor):
    def make():
        img = _rng(5).random(shape, dtype=np.float32)
        ref = apps.upsample.reference(img, factor=factor)
        return (img,), {"factor": factor}, {"output": (ref, {"rtol": 0, "atol": 1e-5})}
    return make


def _bilateral():
    img = _rng(6).random((H, W), dtype=np.float32)
    kw = {"s_sigma": 8, "r_sigma": 0.1}
    ref = apps.bilateral_grid.reference(img, **kw)
    return (img,), kw, {"bilateral_grid": (ref, {"rtol": 0, "atol": 1e-5})}


def _local_laplacian(levels, J):
    def make():
        y, x = np.mgrid[0:H, 0:W]
        rng = _rng(7)
        img = (0.5 + 0.3 * np.sin(x / 7.0) * np.cos(y / 5.0)
               + 0.1 * rng.standard_normal((H, W))).clip(0, 1).astype(np.float32)
        kw = {"levels": levels, "J": J, "alpha": 1.0, "beta": 0.8}
        ref = apps.local_laplacian.reference(img, **kw)
        return (img,), kw, {"output": (ref, {"rtol": 0, "atol": 2e-5})}
    return make


# name -> (app module, input maker, options). Options: "schedules" (default all),
# "slow" (schedules run only in the slow tier), "sched_atol" (absolute tolerance between
# schedules, default SCHEDULE_RTOL x the output's magnitude).
CASES = {
    "gamma-grey": ("gamma", _gamma((H, W)), {}),
    "gamma-rgb": ("gamma", _gamma((3, H, W)), {}),
    "blur": ("blur", _blur, {}),
    # the boundary conditions are schedule-independent: all three schedules for the first,
    # the tiled one (tails on all four sides) for the others
    **{f"conv2d-{bc}": ("conv2d", _conv2d(bc), {} if k == 0 else {"schedules": ("tiled",)})
       for k, bc in enumerate(apps.conv2d.BOUNDARIES)},
    "histogram-float": ("histogram", _histogram("float"), {}),
    "histogram-uint8": ("histogram", _histogram("uint8"), {}),
    # the sample position u is float32; an FMA-contracted (x + 0.5) * (1/f) - 0.5 in one
    # schedule and not in another moves the lerp weight by up to ulp(u) ~ 4e-6
    "upsample-grey-x2": ("upsample", _upsample((24, 35), 2), {"sched_atol": 1e-5}),
    "upsample-rgb-x3": ("upsample", _upsample((3, 17, 23), 3), {"sched_atol": 1e-5}),
    # all-inline: Halide 21 needs ~10 s to compile the fully inlined grid (run time is ms)
    "bilateral_grid": ("bilateral_grid", _bilateral, {"slow": ("inline",)}),
    # all-inline pyramids blow up exponentially in expression size: Halide 21 compiles the
    # inlined J=2 pipeline in ~40 s and J=3 not within minutes; J=2 is checked inline in
    # the slow tier, J=3 (levels=8) under root and tiled in the slow tier (~20 s)
    "local_laplacian-L4-J2": ("local_laplacian", _local_laplacian(4, 2),
                              {"slow": ("inline",)}),
    "local_laplacian-L8-J3": ("local_laplacian", _local_laplacian(8, 3),
                              {"schedules": ("root", "tiled"), "slow": ("root", "tiled")}),
}
# "inline" recomputes a Func with updates at its consumer's innermost loop (Halide's
# default); these outputs would be quadratic then, and are checked under root/tiled only.
SKIP_INLINE = {("histogram", "equalized"), ("histogram", "cdf")}


def _schedules(case):
    return CASES[case][2].get("schedules", SCHEDULES)


def _params(per_schedule):
    out = []
    for case, (_, _, opt) in CASES.items():
        slow = opt.get("slow", ())
        if per_schedule:
            for s in _schedules(case):
                marks = [pytest.mark.slow] if s in slow else []
                out.append(pytest.param(case, s, marks=marks, id=f"{case}-{s}"))
        else:
            marks = [pytest.mark.slow] if slow else []
            out.append(pytest.param(case, marks=marks, id=case))
    return out


@functools.cache
def _case(case):
    return CASES[case][1]()


@functools.cache
def _realized(case, sched):
    """``{output name: numpy array}`` of ``case`` under schedule ``sched``."""
    app_name = CASES[case][0]
    mod = getattr(apps, app_name)
    args, kw, expected = _case(case)
    out = {}
    for name in expected:
        if sched == "inline" and (app_name, name) in SKIP_INLINE:
            continue
        # each output realized as its own pipeline, from fresh Funcs
        app = mod.build(hl, *args, **kw)
        mod.schedule(app, sched)
        out[name] = app.realize(name)
    return out


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("case,sched", _params(per_schedule=True))
def test_against_numpy(case, sched):
    _, _, expected = _case(case)
    got = _realized(case, sched)
    assert got, "nothing was realized"
    for name, arr in got.items():
        ref, tol = expected[name]
        assert arr.shape == np.shape(ref), (name, arr.shape, np.shape(ref))
        if np.issubdtype(np.asarray(ref).dtype, np.integer):
            assert np.issubdtype(arr.dtype, np.integer), (name, arr.dtype)
            np.testing.assert_array_equal(arr, ref, err_msg=f"{case}/{sched}/{name}")
        else:
            assert arr.dtype == np.float32, (name, arr.dtype)
            assert np.all(np.isfinite(arr)), f"{case}/{sched}/{name}: non-finite values"
            np.testing.assert_allclose(arr, ref, err_msg=f"{case}/{sched}/{name}", **tol)


@pytest.mark.parametrize("case", _params(per_schedule=False))
def test_schedules_agree(case):
    scheds = _schedules(case)
    if len(scheds) < 2:
        pytest.skip("one schedule only")
    results = {s: _realized(case, s) for s in scheds}
    ref_sched = "root" if "root" in results else scheds[0]
    base = results[ref_sched]
    sched_atol = CASES[case][2].get("sched_atol")
    for sched, got in results.items():
        for name, arr in got.items():
            b = base[name]
            if np.issubdtype(arr.dtype, np.integer):
                np.testing.assert_array_equal(arr, b, err_msg=f"{case}: {sched} vs {ref_sched}")
            else:
                scale = max(float(np.max(np.abs(b))), 1e-30)
                tol = SCHEDULE_RTOL * scale if sched_atol is None else sched_atol
                diff = float(np.max(np.abs(arr.astype(np.float64) - b)))
                assert diff <= tol, (f"{case}/{name}: {sched} vs {ref_sched} differ by "
                                     f"{diff:.3g} (scale {scale:.3g})")


def test_layout_convention():
    """``hl.Buffer`` reverses the numpy axes; realize([w, h, c]) comes back as (c, h, w)."""
    img = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    app = apps.gamma.build(hl, img, gamma=1.0)
    assert app.sizes["gamma"] == [5, 3, 2]
    out = app.realize("gamma")
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out, img, rtol=1e-6)


def test_params_and_rebuild():
    """A Param's value is read at realize time; changing it changes the output."""
    img = _rng(8).random((H, W), dtype=np.float32)
    app = apps.gamma.build(hl, img, gamma=1.0)
    apps.gamma.schedule(app, "tiled")
    np.testing.assert_allclose(app.realize("gamma"), img, rtol=1e-6)
    app.params["g"].set(2.0)
    np.testing.assert_allclose(app.realize("gamma"), img.astype(np.float64) ** 2, rtol=2e-6)


def test_unknown_schedule():
    app = apps.blur.build(hl, np.zeros((8, 8), np.float32))
    with pytest.raises(ValueError):
        apps.blur.schedule(app, "autoschedule")
