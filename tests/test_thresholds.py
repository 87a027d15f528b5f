"""Every rule's threshold is written once, in pipeline/thresholds.py: no other module defines one
again, compares against its value typed as a number, or types it into a sentence ("~50%",
"1,024 tokens", "32k", "8 bits"); sentences are formatted from the constants."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import polars as pl
import pytest

from pipeline import thresholds
from pipeline.prefix import compute as prefix_compute
from pipeline.prefix.compute import classify_curve
from pipeline.shape import findings
from tests.conftest import REPO

THRESHOLDS = REPO / "pipeline" / "thresholds.py"
VALUES: dict[str, float] = {
    name: value
    for name, value in vars(thresholds).items()
    if name.isupper() and isinstance(value, (int, float))
}


def _number(value: float) -> str:
    return re.escape(f"{value:g}")


def typed_forms(name: str, value: float) -> list[re.Pattern[str]]:
    """How a sentence would type the threshold ``name`` by hand, in any module: a share
    ("50%", "~50 %"), a token count in the thousands ("1,024", "32k"), bits, days."""
    if "_TOKENS" in name and value >= 1000:
        whole = int(value)
        forms = [rf"(?<![\d,.]){whole:,}(?![\d,])", rf"(?<![\d,.]){whole}(?![\d,])"]
        if whole % 1024 == 0:
            forms.append(rf"(?<![\d.]){thresholds.tokens_k(whole)}\b")
        return [re.compile(f) for f in forms]
    if name.endswith("_BITS"):
        return [re.compile(rf"(?<![\d.]){int(value)}[ -]bits?\b")]
    if name.endswith("_DAYS"):
        return [re.compile(rf"(?<![\d.]){int(value)} days\b")]
    if 0 < value < 1:
        return [re.compile(rf"(?<![\d.]){round(value * 100)}\s?%")]
    return []


def compared_forms(value: float) -> list[re.Pattern[str]]:
    """A ratio or count typed into a comparison ("≥ 10", "p99/p50 ≤ 1.05"): looked for only in
    the modules that read the threshold, where it would sit beside its use."""
    return [re.compile(rf"[≤≥<>]\s?{re.escape(f'{value:g}')}(?![\d.])")]


def _sources() -> list[Path]:
    return sorted(p for p in (REPO / "pipeline").rglob("*.py") if p != THRESHOLDS)


def typed_in_text(path: Path, tree: ast.Module) -> list[str]:
    """Strings (sentences, docstrings) in ``path`` that type a threshold's value."""
    used = _imported_thresholds(tree)
    forms = [
        (name, form)
        for name, value in VALUES.items()
        for form in typed_forms(name, value)
        + (compared_forms(value) if name in used and value >= 1 else [])
    ]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            hits: dict[str, list[str]] = {}
            for name, form in forms:
                hit = form.search(node.value)
                if hit:
                    hits.setdefault(hit.group(0), []).append(name)
            found += [
                f"{path.name}:{node.lineno}: {text!r} ({', '.join(names)})"
                for text, names in hits.items()
            ]
    return found


def _imported_thresholds(tree: ast.AST) -> dict[str, float]:
    return {
        alias.name: VALUES[alias.name]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.thresholds"
        for alias in node.names
        if alias.name in VALUES
    }


def _is_number(node: ast.AST) -> bool:
    """A number typed in code that could be a threshold: a float, or a whole number above the
    small counts (0, 1, 2) code compares with for other reasons."""
    if not isinstance(node, ast.Constant):
        return False
    return type(node.value) is float or (type(node.value) is int and node.value > 2)


def typed_in_code(path: Path, tree: ast.Module) -> list[str]:
    """In ``path``: a threshold defined again (a module-level name of pipeline/thresholds.py,
    or, in a module that reads thresholds, a module-level number equal to one it reads), or a
    comparison against the value of a threshold it reads typed as a number."""
    used = _imported_thresholds(tree)
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else ""
            value = getattr(node, "value", None)
            again = name in VALUES
            copied = value is not None and _is_number(value) and value.value in used.values()  # type: ignore[attr-defined]
            if again or copied:
                found.append(f"{path.name}:{node.lineno}: {name} defined beside its use")
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            numbers = [n for n in (node.left, *node.comparators) if _is_number(n)]
            for n in numbers:
                if n.value in used.values():  # type: ignore[attr-defined]
                    found.append(f"{path.name}:{node.lineno}: compared with {n.value!r}")  # type: ignore[attr-defined]
    return found


def test_the_detectors_find_what_they_look_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from pipeline.thresholds import PREFIX_HEAVY_SHARE\n"
        "PREFIX_LIGHT_SHARE = 0.3\n"
        "HIGH = 0.5\n"
        "def f(share):\n"
        '    """Above ~50 % of 1,024 tokens, prompts of 32k tokens, 8-bit weights."""\n'
        "    return share > 0.5\n"
    )
    tree = ast.parse(sample.read_text())
    assert typed_in_code(sample, tree) == [
        "sample.py:2: PREFIX_LIGHT_SHARE defined beside its use",
        "sample.py:3: HIGH defined beside its use",
        "sample.py:6: compared with 0.5",
    ]
    assert typed_in_text(sample, tree) == [
        "sample.py:5: '8-bit' (DATACENTER_WEIGHT_BITS)",
        "sample.py:5: '1,024' (PREFIX_WINDOW_TOKENS)",
        "sample.py:5: '50 %' (PREFIX_HEAVY_SHARE, LONG_CONTEXT_RETENTION)",
        "sample.py:5: '32k' (LONG_CONTEXT_TOKENS)",
    ]


def test_thresholds_are_not_typed_beside_their_uses() -> None:
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += typed_in_code(path, tree) + typed_in_text(path, tree)
    assert found == [], "read these from pipeline/thresholds.py and format sentences from them"


def test_sentences_follow_the_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence changes with its threshold (what the detectors above cannot see)."""
    shape = {"features": {}, "lengths": {"long_context": {">=65536": {"share": 0.25}}}}
    monkeypatch.setattr(findings, "LONG_CONTEXT_TOKENS", 65536)
    found = findings._features(shape)
    assert found.message.startswith("Features in use: prompts ≥ 64k tokens 25.0% (")
    assert found.numbers["long_context_64k_share"] == 0.25
    curve = pl.DataFrame(
        {"window_tokens": [256, 1024], "eligible": [10, 10], "share_eligible": [0.25, 0.05]}
    )
    assert classify_curve(curve, 2000)["shape"] == "short system prompt"  # 25% ≥ 20%
    monkeypatch.setattr(prefix_compute, "PREFIX_LIGHT_SHARE", 0.3)
    classified = classify_curve(curve, 2000)
    assert (classified["shape"], classified["reason"]) == (
        "no sharing",
        "share at 256 tokens 25.0% < 30%",
    )
