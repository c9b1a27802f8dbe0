"""The repository explains itself: its documents cite only files a user of the repository has.

* No tracked Markdown or Python file points at the project's private planning files (the
  architecture and specification notes that lived outside the repository); the design is in
  ``docs/ARCHITECTURE.md`` and ``docs/design/*.md``, sources are cited by paper section.
* Every relative link in ``README.md``, ``docs/**/*.md`` and ``packages/*/README.md`` points to
  a file or folder that exists in the repository.

Fast (no imports of the packages; reads a few hundred small files).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Spelled in two pieces so that this file does not match its own patterns.
_SHARED = "shared" + "/"
_SPECS = "specs" + "/"
FORBIDDEN = [
    re.compile(r"(?<![\w-])" + re.escape(_SHARED) + r"(?:specs|seeds|hooks|[\w-]+\.md)"),
    re.compile(r"(?<![\w-])" + re.escape(_SPECS) + r"[\w.-]*\.md"),
    # the planning notes that lived beside them, cited by bare name
    re.compile(r"(?<![\w/-])(?:" + "PRACTICES" + r"|peers|peers-on-this-machine)\.md"),
]

# [text](target) and reference definitions "[label]: target".
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def _tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *patterns],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (e.g. an sdist)
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.split("\0") if p]


def _doc_files() -> list[Path]:
    files = _tracked("README.md", "docs/*.md", "docs/**/*.md", "packages/*/README.md")
    return sorted(set(files))


def test_no_reference_to_files_outside_the_repository():
    offenders = []
    for path in _tracked("*.md", "*.py"):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in FORBIDDEN):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, (
        "cite docs/ARCHITECTURE.md, docs/design/<package>.md or the paper section instead:\n"
        + "\n".join(offenders)
    )


def _relative_targets(text: str):
    text = FENCE.sub("", text)  # links inside code blocks are code, not links
    text = re.sub(r"`[^`\n]*`", "", text)  # nor are inline code spans
    for m in (*INLINE_LINK.finditer(text), *REF_LINK.finditer(text)):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")):
            continue  # http:, mailto:, anchors within the page
        yield target.split("#", 1)[0].split("?", 1)[0]


def test_relative_links_point_to_existing_files():
    docs = _doc_files()
    assert any(p.name == "ARCHITECTURE.md" for p in docs)
    broken = []
    for path in docs:
        for target in _relative_targets(path.read_text(encoding="utf-8")):
            if not target:
                continue
            resolved = (ROOT / target.lstrip("/")) if target.startswith("/") else (
                path.parent / target
            )
            resolved = resolved.resolve()
            if ROOT not in (resolved, *resolved.parents) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see [a](docs/x.md#sec) and [b](https://e.org) and [c](#top)", ["docs/x.md"]),
        ("[ref]: ../y.md\n", ["../y.md"]),
        ("```\n[a](nowhere.md)\n```\n`[b](code.md)`", []),
    ],
)
def test_link_extraction(text, expected):
    assert list(_relative_targets(text)) == expected


def test_forbidden_patterns_match_what_they_should():
    bad = [_SHARED + "ARCHITECTURE.md", "../" + _SHARED + _SPECS + "x.md", _SPECS + "core-ad.md",
           "see " + "PRACTICES" + ".md"]
    ok = ["docs/design/core-ad.md", "the shared/ memory", "e.reference"]
    assert all(any(p.search(s) for p in FORBIDDEN) for s in bad)
    assert not any(any(p.search(s) for p in FORBIDDEN) for s in ok)
