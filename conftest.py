"""Test distribution under pytest-xdist (``.ci/run`` runs the suite on every core).

Each test file runs in one worker, so its module fixtures and the kernels its tests compile
(h2mc's Hessian kernels take seconds to minutes on an empty cache) are built once, not by
two workers at once; the files sharing the session's tiny report run in the same worker too.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = "tiny_report" if "tiny_report" in item.fixturenames else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
