"""Shared fixtures of the cross-package integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_report(tmp_path_factory):
    """Every experiment at its tiny size through ``reproduce`` (in-process executor):
    ``(exit status, output folder)``. Run once per test session."""
    from apps.cli import main

    out = tmp_path_factory.mktemp("report")
    rc = main(["--tier", "tiny", "--out", str(out), "--no-progress"])
    return rc, out
