"""Each package installs alone from a clone: `tools/wheelhouse` builds the wheels, and a fresh
virtual environment installs one distribution with its siblings resolved from that folder
(the README's "Installing one package"), then uses it."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# distribution -> a few lines that import it and compute something with it
USES = {
    "difvis-lsq-opt": """
import numpy as np
from lsq_opt import Array, Dim, Energy, Unknown, compile_problem, solve
W, H = Dim("W"), Dim("H")
X, A = Unknown("X", (W, H)), Array("A", (W, H))
plan = compile_problem(Energy(X(0, 0) - A(0, 0), 0.5 * (X(0, 0) - X(1, 0))),
                       arrays={"A": np.random.default_rng(0).random((16, 12))})
assert solve(plan, plan.x0).converged
""",
    "difvis-halide-ad": """
import numpy as np
import halide_ad as hl
x, y = hl.Var("x"), hl.Var("y")
inp = hl.Buffer(np.arange(12.0).reshape(3, 4))
f = hl.Func("f")
f[x, y] = inp[x, y] * 2.0
assert np.allclose(np.asarray(f.realize([4, 3])), np.arange(12.0).reshape(3, 4) * 2)
""",
    "difvis-h2mc": """
import numpy as np
import h2mc
assert h2mc.ess(np.random.default_rng(0).normal(size=(400, 4))) > 100
""",
}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run([str(ROOT / "tools" / "wheelhouse"), str(out)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, capture_output=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(USES))
def test_one_package_installs_alone_and_runs(dist, wheelhouse, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--find-links", str(wheelhouse), dist],
                   check=True, capture_output=True)
    listed = subprocess.run([str(py), "-m", "pip", "list"], check=True, capture_output=True,
                            text=True).stdout
    assert dist in listed and "difvis-apps" not in listed  # only what it needs came along
    run = subprocess.run([str(py), "-c", USES[dist]], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
