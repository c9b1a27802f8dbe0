"""The report loads in a real headless browser (Debian's Chromium, installed here when
missing and we may): no image fails to decode and every in-page link has a target."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

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
