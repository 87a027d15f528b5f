"""Every stage folder has the one shape (the same files with the same names, or its package
docstring says why one is missing) and one type-naming pattern."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
STAGES = {
    "ingest": "Ingest",
    "shape": "Shape",
    "prefix": "Prefix",
    "sim": "Sim",
    "bench": "Bench",
    "capacity": "Capacity",
    "decision": "Decision",
    "report": "Report",
    "loadtest": "Loadtest",
    "whatif": "Whatif",
}
# The decision's result keeps its domain name: it is the title of the published
# decision.schema.json.
RESULT_NAMES = {"decision": "DecisionRecord"}
SHAPE = ("config", "compute", "result", "present", "checks", "stage")


def _classes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_has_the_shape_or_says_why_not(stage: str) -> None:
    folder = PIPELINE / stage
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    doc = " ".join(doc.split())
    assert doc, f"{stage}/__init__.py has no docstring"
    missing = [
        name
        for name in SHAPE
        if not (folder / f"{name}.py").is_file() and f"no ``{name}.py``" not in doc
    ]
    assert missing == [], f"{stage}/ lacks {missing} and its docstring does not say why"
    assert (PIPELINE / "commands" / f"{stage}.py").is_file(), f"{stage} has no command module"


@pytest.mark.parametrize("stage", STAGES)
def test_package_init_re_exports_nothing(stage: str) -> None:
    tree = ast.parse((PIPELINE / stage / "__init__.py").read_text(encoding="utf-8"))
    assert [type(node).__name__ for node in tree.body] == ["Expr"], stage


@pytest.mark.parametrize("stage", STAGES)
def test_stage_types_follow_one_naming_pattern(stage: str) -> None:
    folder, prefix = PIPELINE / stage, STAGES[stage]
    if (folder / "config.py").is_file():
        assert f"{prefix}Config" in _classes(folder / "config.py")
    assert RESULT_NAMES.get(stage, f"{prefix}Result") in _classes(folder / "result.py")
    everywhere = set().union(*(_classes(p) for p in folder.rglob("*.py")))
    assert f"{prefix}Inputs" in everywhere
    other_patterns = sorted(
        c for c in everywhere if re.fullmatch(r"\w+(Settings|Sources|Input)", c)
    )
    assert other_patterns == [], f"{stage}/: {other_patterns} (use <Stage>Config / <Stage>Inputs)"
