"""Every experiment's run at tiny sizes, end to end through ``reproduce``: it passes its
check, and results.json / index.html carry the paper's value next to ours."""

from __future__ import annotations

import json
import re

import apps


def test_every_experiment_reproduces_at_tiny_size(tiny_report):
    rc, out = tiny_report
    doc = json.loads((out / "results.json").read_text())
    failed = {n: [c for c in e["checks"] if c["passed"] is False]
              for n, e in doc["experiments"].items() if not e["passed"]}
    assert not failed, f"failed checks: {failed}"
    assert rc == 0
    assert list(doc["experiments"]) == list(apps.registry())


def test_results_carry_paper_and_measured_values(tiny_report):
    _, out = tiny_report
    doc = json.loads((out / "results.json").read_text())
    for name, e in doc["experiments"].items():
        assert e["paper"], f"{name}: no paper numbers"
        assert e["reference"], f"{name}: no thesis / paper reference"
        assert e["checks"], f"{name}: no checks"
        gated = [c for c in e["checks"] if c["passed"] is not None]
        assert gated, f"{name}: no check decides reproduced / failed"
        for c in e["checks"]:
            assert c["paper"] and c["ours"], f"{name}: check {c['name']} lacks a value"
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["tier"] == "tiny"


def test_report_links_and_images_resolve(tiny_report):
    _, out = tiny_report
    html = (out / "index.html").read_text()
    ids = set(re.findall(r'id="([^"]+)"', html))
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert len(srcs) >= len(apps.registry())  # at least one figure per experiment
    for src in srcs:
        data = (out / src).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", src
    for href in re.findall(r'href="([^"]+)"', html):
        if href.startswith("#"):
            assert href[1:] in ids, f"anchor {href} has no target"
        else:
            assert (out / href).is_file(), f"link {href} points nowhere"
    for name in apps.registry():
        assert f'id="{name}"' in html
