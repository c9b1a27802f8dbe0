"""PathSpace.compile_kernels' worker processes (h2mc._kernel_build)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from core_ad import sym
from edge_rt import scenes
from h2mc import PathSpace, _kernel_build, _pathspace
from h2mc._kernel_build import build_in_workers, default_workers


def test_missing_derivative_kernels_are_built_in_workers(monkeypatch, tmp_path):
    """On an empty disk cache, ``compile_kernels(workers=2)`` has two worker processes build
    the kernels and loads them here: this process derives no Hessian (``sym.hessian`` raises
    here), and every kernel a render uses is there and evaluates to finite numbers on traced
    paths. A second path space then finds them all in the cache, workers or not."""
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path))
    scene = scenes.cornell_box((8, 8))
    ps = PathSpace(scene, max_length=2, min_length=2)
    with monkeypatch.context() as m:
        m.setattr(sym, "hessian", lambda *a, **k: pytest.fail("derived in this process"))
        ps.compile_kernels(derivatives=True, workers=2)
        assert {k[:3] for k in ps._kernels} == {(kind, *t) for t in ps.techniques
                                                for kind in ("value", "hessian")}
        u = np.random.default_rng(0).random((8192, ps.dim))
        paths = ps.trace(u)
        for key in ps.techniques:
            lanes, params = paths.structure[key]
            out = ps._kernel("hessian", *key).call_stacked(
                ps._kernel_inputs(u, key, lanes, params))
            lit = paths.contrib[lanes, ps.techniques.index(key)].sum(1) > 0
            assert lit.any() and np.isfinite(out[:, lit]).all()
        again = PathSpace(scene, max_length=2, min_length=2)
        again.compile_kernels(derivatives=True)
        assert set(again._kernels) == set(ps._kernels)


def test_failed_tasks_and_workers_that_cannot_start_cost_only_time(monkeypatch, tmp_path):
    """A task that fails in a worker is answered and the next one built, here by a fresh
    worker (a worker over its memory bound, 0 here, retires after each task); workers that
    cannot start build nothing, and compile_kernels then builds every kernel itself."""
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("H2MC_KERNEL_WORKER_RETIRE_MB", "0")
    scene = scenes.cornell_box((8, 8))
    recipe = PathSpace(scene, max_length=2, min_length=2)._recipe
    done = []
    built = build_in_workers(recipe, [("value", 9, 1), ("value", 2, 1)], 1, on_built=done.append)
    assert built == done == [("value", 2, 1)]
    monkeypatch.setenv("H2MC_KERNEL_WORKER_RETIRE_MB", "lots")
    with pytest.raises(ValueError, match="H2MC_KERNEL_WORKER_RETIRE_MB"):
        build_in_workers(recipe, [("value", 2, 1)], 1)
    monkeypatch.delenv("H2MC_KERNEL_WORKER_RETIRE_MB")
    monkeypatch.setattr(_kernel_build.sys, "executable", sys.executable + "-missing")
    assert build_in_workers(recipe, [("value", 2, 0), ("value", 2, 1)], 2) == []
    ps = PathSpace(scene, max_length=2, min_length=2)
    ps.compile_kernels(derivatives=True, workers=2)
    assert {k[0] for k in ps._kernels} == {"value", "hessian"}


@pytest.mark.parametrize("backend, cache", [("numpy", None), (None, "off")])
def test_no_workers_where_their_kernels_could_not_be_found(monkeypatch, tmp_path, backend,
                                                          cache):
    """With the numpy backend or core_ad's disk cache off, this process could not load what
    workers built: compile_kernels builds everything here and starts none."""
    monkeypatch.setenv("CORE_AD_CACHE_DIR", cache or str(tmp_path))
    monkeypatch.setattr(_pathspace, "build_in_workers",
                        lambda *a, **k: pytest.fail("workers started"))
    ps = PathSpace(scenes.cornell_box((8, 8)), max_length=2, min_length=2, backend=backend)
    ps.compile_kernels(derivatives=True, workers=2)
    assert {k[0] for k in ps._kernels} == {"value", "hessian"}


def test_default_workers_fit_the_cores_and_the_memory(monkeypatch):
    monkeypatch.setattr(_kernel_build.os, "sched_getaffinity", lambda pid: set(range(64)),
                        raising=False)
    monkeypatch.setattr(_kernel_build, "_available_memory", lambda: None)
    assert default_workers() == _kernel_build.WORKERS_MAX
    monkeypatch.setattr(_kernel_build, "_available_memory",
                        lambda: 2 * _kernel_build.WORKER_MEMORY + 1)
    assert default_workers() == 2
    monkeypatch.setattr(_kernel_build, "_available_memory", lambda: 0)
    assert default_workers() == 1
