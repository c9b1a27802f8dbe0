"""Every experiment's run at tiny sizes, end to end through ``reproduce``: it passes its
check, results.json / index.html carry the paper's value next to ours, and the report loads
in a real headless browser (Debian's Chromium, installed here when missing and we may): no
image fails to decode and every in-page link has a target. One file, so that the session's
tiny report is built once when the suite runs in several processes (pytest-xdist's loadfile
keeps a file's tests in one)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

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


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]

# Appended to a copy of the page: after load, list images that did not decode and anchors
# whose #target is missing, into the DOM that --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const bad = [];
  for (const im of document.images) if (!im.complete || im.naturalWidth === 0) bad.push('img:' + im.getAttribute('src'));
  for (const a of document.querySelectorAll('a[href^="#"]')) if (!document.getElementById(a.getAttribute('href').slice(1))) bad.push('link:' + a.getAttribute('href'));
  const p = document.createElement('pre'); p.id = 'probe-result';
  p.textContent = 'PROBE images=' + document.images.length + ' bad=[' + bad.join(',') + ']';
  document.body.appendChild(p);
});
</script>"""


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True,
                       timeout=900)
        exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Chromium is not installed and cannot be installed here")
    return exe


def test_report_loads_in_headless_chromium(tiny_report, tmp_path):
    exe = chromium()
    _, out = tiny_report
    page = out / "probe.html"
    page.write_text((out / "index.html").read_text().replace("</body>", PROBE + "</body>"))
    try:
        r = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                            "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                           capture_output=True, text=True, timeout=180)
    finally:
        page.unlink()
    line = [s for s in r.stdout.splitlines() if '<pre id="probe-result">' in s]
    assert line, f"the page did not load (rc {r.returncode}): {r.stderr[-2000:]}"
    assert "bad=[]" in line[0], line[0]
    n_images = int(line[0].split("images=")[1].split()[0])
    assert n_images >= 10
