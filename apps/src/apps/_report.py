"""OUT/index.html (jinja2, static, no server) and OUT/results.json from the outcomes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import numpy as np


def machine_info(executor: str, tier: str, total_s: float) -> dict:
    import importlib.metadata as md

    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("difvis-apps", "difvis-core-ad", "difvis-halide-ad", "difvis-lsq-opt", "difvis-h2mc",
                 "difvis-edge-rt", "numpy", "scipy", "llvmlite", "halide", "ray"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": platform.node(), "platform": platform.platform(), "cpu": cpu,
            "cores": os.cpu_count(), "load_average": load,
            "python": platform.python_version(), "versions": versions, "commit": commit,
            "executor": executor, "tier": tier, "total_s": round(total_s, 2)}


def _headline(exp, outcome):
    """The check the summary shows: the experiment's ``headline`` (name prefix) if it ran,
    else the first gated one."""
    named = [c for c in outcome.checks if exp.headline and c.name.startswith(exp.headline)]
    if named:
        return named[0]
    gated = [c for c in outcome.checks if c.passed is not None]
    return (gated or outcome.checks or [None])[0]


def summary_rows(exps, results) -> list[dict]:
    rows = []
    for name, (outcome, secs) in results.items():
        c = _headline(exps[name], outcome)
        rows.append({"name": name, "title": exps[name].title,
                     "reference": exps[name].reference,
                     "paper": c.paper if c else "-", "ours": c.ours if c else "-",
                     "verdict": "reproduced" if outcome.passed else "FAILED",
                     "seconds": float(secs)})
    return rows


def _plain(x):
    """JSON-ready copy: numpy scalars/arrays to Python, NaN/inf to strings."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def _atomic_write(path: Path, data: bytes):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(out_dir: Path, exps, results, info) -> None:
    import jinja2

    fig_dir = out_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    sections = []
    doc = {"machine": info, "experiments": {}}
    for name, (outcome, secs) in results.items():
        exp = exps[name]
        figs = []
        for f in outcome.figures:
            rel = f"figures/{name}-{f.name}.png"
            _atomic_write(out_dir / rel, f.png)
            figs.append({"src": rel, "caption": f.caption, "name": f.name})
        sections.append({"exp": exp, "outcome": outcome, "seconds": secs, "figures": figs,
                         "verdict": "reproduced" if outcome.passed else "FAILED"})
        doc["experiments"][name] = _plain({
            "title": exp.title, "reference": exp.reference, "paper": exp.paper,
            "check": exp.check, "tier": info["tier"], "size": exp.sizes[info["tier"]],
            "passed": outcome.passed, "seconds": secs,
            "checks": [dataclasses.asdict(c) | {"verdict": c.verdict} for c in outcome.checks],
            "numbers": outcome.numbers, "tables": [dataclasses.asdict(t)
                                                   for t in outcome.tables],
            "figures": [f["src"] for f in figs], "notes": outcome.notes})
    env = jinja2.Environment(loader=jinja2.PackageLoader("apps", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(
        sections=sections, summary=summary_rows(exps, results), machine=info)
    _atomic_write(out_dir / "results.json", json.dumps(doc, indent=1).encode())
    _atomic_write(out_dir / "index.html", html.encode())
