"""The two set-up commands install every workspace package the apps need, in dependency order:
a sibling left out (or named after a package that needs it) would be looked up on PyPI on a
fresh clone and not be found."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, Path]:
    dirs = {}
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "apps" / "pyproject.toml"]:
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        dirs[name] = pyproject.parent.relative_to(ROOT)
    return dirs


def _workspace_requirements(dist: str, dirs: dict[str, Path], seen: set[str]) -> set[str]:
    """``dist`` and every workspace distribution it depends on, transitively."""
    if dist in seen:
        return seen
    seen.add(dist)
    project = tomllib.loads((ROOT / dirs[dist] / "pyproject.toml").read_text())["project"]
    for req in project.get("dependencies", []):
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        if name in dirs:
            _workspace_requirements(name, dirs, seen)
    return seen


@pytest.mark.parametrize("script", ["reproduce", ".ci/run"])
def test_setup_commands_install_every_workspace_package_apps_needs(script):
    dirs = _package_dirs()
    assert all(name.startswith("difvis-") for name in dirs)
    order = re.findall(r"-e\s+\"?([\w./-]+?)(?:\[[^\]]*\])?\"?(?:\s|$)",
                       (ROOT / script).read_text())
    needed = _workspace_requirements("difvis-apps", dirs, set())
    missing = sorted(str(dirs[d]) for d in needed if str(dirs[d]) not in order)
    assert not missing, f"{script} does not install {missing}"
    # dependency order: pip does not find a sibling named after a package (with extras)
    # that needs it
    by_dir = {str(path): name for name, path in dirs.items()}
    for i, path in enumerate(order):
        later = {by_dir[p] for p in order[i + 1:]}
        deps = _workspace_requirements(by_dir[path], dirs, set()) - {by_dir[path]}
        assert not deps & later, f"{script} installs {path} before {sorted(deps & later)}"
