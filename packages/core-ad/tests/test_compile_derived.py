"""sym.compile_derived: a derived kernel found in a later process without deriving it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from core_ad import sym

SRC = os.path.join(os.path.dirname(__file__), "..", "src")

# f = sin(x) exp(y) + x^2 y; outputs f, df/dx, d2f/dxdy
_CODE = """
import sys
import numpy as np
from core_ad import sym
calls = []
x, y = sym.var("x"), sym.var("y")
f = sym.sin(x) * sym.exp(y) + x * x * y

def derive(values):
    calls.append(1)
    if sys.argv[1] == "no-derive":
        raise AssertionError("derived again")
    (g,) = values
    dx = sym.grad(g, [x])[0]
    return [g, dx, sym.grad(dx, [y])[0]]

k = sym.compile_derived([f], [x, y], derive, tag="f, df/dx, d2f/dxdy")
a, b = np.linspace(-1, 1, 37), np.linspace(0, 2, 37)
out = np.stack(k(a, b))
want = np.stack([np.sin(a) * np.exp(b) + a * a * b, np.cos(a) * np.exp(b) + 2 * a * b,
                 np.cos(a) * np.exp(b) + 2 * a])
assert np.allclose(out, want, rtol=1e-13, atol=1e-13), out - want
assert np.array_equal(k.call_stacked(np.stack([a, b])), out)
assert len(calls) == (0 if sys.argv[1] == "no-derive" else 1), calls
if sys.argv[1] == "no-derive":  # a 0-d input needs another variant: derived on first use
    sys.argv[1] = "derive"
    s = k(np.float64(0.5), b)
    assert np.allclose(s[1], np.cos(0.5) * np.exp(b) + b)
    assert len(calls) == 1
    assert k.program is not None
    plain = sym.compile(derive([f]), [x, y])  # the same code, linked once in the process
    assert np.array_equal(np.stack(plain(a, b)), out)
print("ok", len(calls))
"""


def _run(cache, *modes):
    env = dict(os.environ, CORE_AD_CACHE_DIR=str(cache),
               PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for mode in modes:
        r = subprocess.run([sys.executable, "-c", _CODE, mode], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr


def test_a_later_process_loads_the_derived_kernel_without_deriving(tmp_path):
    """The first process derives, compiles and writes the index entry; the second links the
    machine code without calling ``derive`` (it raises there) and gets the same values, until
    it asks for a variant that is not in the cache (a 0-d input), which derives then; a plain
    compile of the derived program then shares the linked code."""
    _run(tmp_path, "derive", "no-derive")
    assert len(list(tmp_path.glob("derived_*.json"))) == 1


def test_a_missing_object_file_derives_again(tmp_path):
    _run(tmp_path, "derive")
    for obj in tmp_path.glob("*.o"):
        obj.unlink()
    _run(tmp_path, "derive", "no-derive")  # compiled again, then found again


def test_one_kernel_per_derivation_in_a_process_and_tags_keep_derivations_apart(
        monkeypatch, tmp_path):
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path))
    x = sym.var("cd_x")
    f = sym.exp(x) * x
    calls = []

    def first_derivative(values):
        calls.append("d1")
        return [sym.grad(values[0], [x])[0]]

    def second_derivative(values):
        calls.append("d2")
        return [sym.hessian(values[0], [x])[0][0]]

    k1 = sym.compile_derived([f], [x], first_derivative, tag="d/dx")
    assert sym.compile_derived([f], [x], first_derivative, tag="d/dx") is k1
    k2 = sym.compile_derived([f], [x], second_derivative, tag="d2/dx2")
    assert calls == ["d1", "d2"]
    a = np.linspace(-1, 1, 9)
    np.testing.assert_allclose(k1(a)[0], (1 + a) * np.exp(a), rtol=1e-14)
    np.testing.assert_allclose(k2(a)[0], (2 + a) * np.exp(a), rtol=1e-14)


_CACHED_ONLY = """
import sys
from core_ad import sym
x, y = sym.var("x"), sym.var("y")
f = sym.sin(x) * sym.exp(y) + x * x * y
k = sym.compile_derived([f], [x, y], lambda v: 1 / 0, tag="f, df/dx, d2f/dxdy",
                        cached_only=True)
print("none" if k is None else k.call_stacked(__import__("numpy").ones((2, 3)))[1][0])
"""


def test_cached_only_never_derives(monkeypatch, tmp_path):
    """``cached_only=True`` gives None without calling ``derive`` until the kernel exists (in
    this process, or in the disk cache for a later one), then that kernel; None with the
    numpy backend or with the cache off."""
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path))
    x = sym.var("cd_cached_only")
    f = sym.cos(x) * x
    calls = []

    def derive(values):
        calls.append(1)
        return [values[0], sym.grad(values[0], [x])[0]]

    assert sym.derived_cache_enabled() and not sym.derived_cache_enabled("numpy")
    assert sym.compile_derived([f], [x], derive, tag="f, f'", cached_only=True) is None
    assert calls == []
    k = sym.compile_derived([f], [x], derive, tag="f, f'")
    assert sym.compile_derived([f], [x], derive, tag="f, f'", cached_only=True) is k
    assert calls == [1]
    assert sym.compile_derived([f], [x], derive, tag="f, f'", backend="numpy",
                               cached_only=True) is None
    monkeypatch.setenv("CORE_AD_CACHE_DIR", "off")
    assert not sym.derived_cache_enabled()
    assert sym.compile_derived([f * x], [x], derive, tag="f, f'", cached_only=True) is None
    # a later process: None on an empty cache, the kernel once a process compiled it
    env = dict(os.environ, CORE_AD_CACHE_DIR=str(tmp_path / "later"),
               PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = []
    for code, mode in ((_CACHED_ONLY, ""), (_CODE, "derive"), (_CACHED_ONLY, "")):
        r = subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.split()[-1])
    assert outs[0] == "none"
    assert float(outs[2]) == pytest.approx(np.cos(1.0) * np.e + 2.0, rel=1e-14)


def test_the_numpy_backend_and_a_disabled_cache_compile_as_usual(monkeypatch):
    monkeypatch.setenv("CORE_AD_CACHE_DIR", "off")
    x = sym.var("cd_y")
    calls = []

    def derive(values):
        calls.append(1)
        return [values[0], sym.grad(values[0], [x])[0]]

    a = np.linspace(0, 1, 5)
    for backend in ("numpy", "llvm"):
        k = sym.compile_derived([sym.sin(x)], [x], derive, tag="f, f'", backend=backend)
        np.testing.assert_allclose(k(a)[1], np.cos(a), rtol=1e-14)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="compile_derived"):
        sym.compile_derived([sym.sin(x)], [], derive, tag="f, f'", backend="llvm")


def test_the_index_key_hashes_the_symbolic_engine(tmp_path):
    """An edit to a derivative rule changes the fingerprint in every index key, so an entry
    never serves what an older engine derived."""
    from core_ad._codegen import derived

    src = os.path.dirname(os.path.dirname(os.path.abspath(derived.__file__)))
    copy = tmp_path / "core_ad"
    copy.mkdir()
    shutil.copytree(os.path.join(src, "_sym"), copy / "_sym",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("_rules.py", "_primitives.py"):
        shutil.copy(os.path.join(src, name), copy / name)
    before = derived._engine_fingerprint(str(copy))
    assert derived.ENGINE_VERSION == "core_ad-sym-" + before
    with open(copy / "_sym" / "diff.py", "a") as f:
        f.write("\n# an edit\n")
    assert derived._engine_fingerprint(str(copy)) != before


def test_kernels_with_buffers_or_lane_sums_are_not_indexed(monkeypatch, tmp_path):
    """A loaded kernel's outputs are dtype stand-ins, so derivations whose kernels scatter,
    sum over lanes or read buffers compile as usual and write no index entry."""
    monkeypatch.setenv("CORE_AD_CACHE_DIR", str(tmp_path))
    x = sym.var("cd_z")
    k = sym.compile_derived([x * x], [x], lambda v: [sym.lane_sum(sym.grad(v[0], [x])[0])],
                            tag="sum of f'")
    np.testing.assert_allclose(k(np.arange(4.0))[0], 12.0)
    assert not list(tmp_path.glob("derived_*.json"))
