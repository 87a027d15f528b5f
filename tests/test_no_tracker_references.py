"""Code and docs explain themselves without the project's issue tracker, which their reader cannot
look up: no "issue" or "task" followed by a number, no "see #N" or "(#N)", no "the issue".

An upstream project's issues and pull requests are sources and stay, named with their project: a
URL, ``owner/repo#N``, or the project's hyphenated name just before (``inference-perf issue #70``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("pipeline", "assets", "perf", "templates", "tests", "docs")
SCANNED_FILES = ("README.md", "pyproject.toml", "Makefile")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".j2", ".css", ".txt", ".sh", ""}
# third-party result files kept byte-for-byte, and this file, whose docstring names the patterns
NOT_SCANNED = (ROOT / "tests" / "data", Path(__file__).resolve())

TRACKER = re.compile(r"\b(?:issues?|tasks?) ?#?\d+|(?:\bsee ?|\()#\d+|\bthe issue\b", re.I)
# the text just before a match ends with an upstream project's name
UPSTREAM = re.compile(r"(?:https?://\S+|[\w.-]+/[\w.-]+|\b[\w.]+-[\w.-]+) $")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES]
    for folder in SCANNED:
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        ]
    return sorted(p for p in files if not any(p.is_relative_to(n) for n in NOT_SCANNED))


def tracker_references(text: str) -> list[str]:
    """Each line (numbered) holding a reference to the project's own tracker."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in TRACKER.finditer(line):
            if not UPSTREAM.search(line[: match.start()]):
                found.append(f"{number}: {line.strip()}")
    return found


def test_the_detector_tells_the_tracker_from_upstream_sources() -> None:
    own = ["Shape (issue 2, format d)::", "(issue 19)", "see #28", "Issues 21 and 22", "task 3"]
    own += ["The issue's case", "as (#4) said"]
    upstream = [
        "must never feed an SLO search (inference-perf issue #70)",
        "vllm-project/vllm#7062 asks for p90",
        "https://github.com/kubernetes-sigs/inference-perf/issues/70",
        'color: #555; font: "EF Sans"',
        "PR_NUMBER = 3; tissue 4",
    ]
    assert [bool(tracker_references(line)) for line in own] == [True] * len(own)
    assert [tracker_references(line) for line in upstream] == [[]] * len(upstream)


def test_no_file_references_the_project_tracker() -> None:
    files = scanned_files()
    assert ROOT / "pipeline" / "bench" / "readers" / "__init__.py" in files
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in files
        for where in tracker_references(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == [], "say the reason instead:\n" + "\n".join(found)
