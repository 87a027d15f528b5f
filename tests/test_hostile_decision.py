"""Hostile inputs of the decision: a previous record whose triggers hold thresholds that are not
numbers, or that is dated after this decision, is one error naming the file and key; catalog
facts dated after the decision's date are never taken for fresh ones."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.commands.decision import configured_inputs
from pipeline.config import Config
from pipeline.decision import stage as decision_stage
from pipeline.errors import InputFormatError
from tests.conftest import REPO
from tests.decision_fixtures import AS_OF, configuration, decide_on, steady_traffic, sweep
from tests.test_decision_scenarios import one_stable_model

REQUIREMENTS = one_stable_model(changes_per_quarter=3)


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decided")
    decide_on(root, steady_traffic(), [sweep("vllm", 5)], REQUIREMENTS)
    return root


def _config(root: Path, **decision: Any) -> Config:
    results = sorted((root / "bench-results").iterdir())
    return configuration(root, REQUIREMENTS, results=results, decision=decision)


def _previous(decided: Path, tmp_path: Path, change: Any) -> Path:
    """This workload's record, changed by ``change(record)``, saved as a previous one."""
    record = json.loads((decided / "data" / "w" / "decision" / "decision.json").read_text())
    change(record)
    path = tmp_path / "previous.json"
    path.write_text(json.dumps(record))
    return path


def _first_ordering(record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return next((i, t) for i, t in enumerate(record["triggers"]) if t["comparator"] in "<=>")


@pytest.mark.parametrize("threshold", ["abc", "NaN", True])
def test_a_previous_threshold_that_is_not_a_number_is_refused(
    decided: Path, tmp_path: Path, threshold: object
) -> None:
    found: dict[str, Any] = {}

    def change(record: dict[str, Any]) -> None:
        i, trigger = _first_ordering(record)
        trigger["threshold"] = threshold
        found.update(trigger, index=i)

    path = _previous(decided, tmp_path, change)
    with pytest.raises(InputFormatError) as caught:
        decision_stage.read_previous(path)
    assert str(caught.value) == (
        f"{path}: triggers[{found['index']}].threshold: {threshold!r} is not a number, and "
        f"trigger {found['id']} compares {found['metric']} {found['comparator']} it; give the "
        "record as `enginefit decide` wrote it"
    )


def test_a_previous_value_that_is_not_a_number_is_refused(decided: Path, tmp_path: Path) -> None:
    found: dict[str, Any] = {}

    def change(record: dict[str, Any]) -> None:
        i, trigger = _first_ordering(record)
        trigger["value"] = "75"
        found.update(trigger, index=i)

    path = _previous(decided, tmp_path, change)
    with pytest.raises(InputFormatError) as caught:
        decision_stage.read_previous(path)
    assert str(caught.value).startswith(
        f"{path}: triggers[{found['index']}].value: '75' is not a number (or null)"
    )


def test_a_previous_record_dated_after_the_decision_is_refused(
    decided: Path, tmp_path: Path
) -> None:
    path = _previous(decided, tmp_path, lambda record: record.update(as_of="2026-11-30"))
    with pytest.raises(InputFormatError) as caught:
        configured_inputs(_config(decided), path)
    assert str(caught.value) == (
        f"{path}: a decision record as of 2026-11-30, after this decision's date {AS_OF}: give "
        "the record of an earlier decision, or set the report date (--as-of or bench.as_of)"
    )
    same_day = _previous(decided, tmp_path, lambda record: record.update(as_of=AS_OF))
    assert configured_inputs(_config(decided), same_day).previous is not None


def test_catalog_facts_dated_after_the_decision_are_not_fresh(
    decided: Path, tmp_path: Path
) -> None:
    """Every dated fact moved to the day after the decision's date (the catalog's edition with
    them): the decision could not have had that evidence, so its age is unknown, not 0."""
    text = (REPO / "pipeline" / "decision" / "engines.yaml").read_text()
    catalog = tmp_path / "engines.yaml"
    catalog.write_text(re.sub(r"evidence_date: \d{4}-\d\d-\d\d", "evidence_date: 2026-11-30", text))
    root = tmp_path / "copy"
    shutil.copytree(decided, root)
    config = _config(root, catalog=str(catalog))
    record = decision_stage.run(configured_inputs(config), config.requirements, config.decision)
    assert record.measured("catalog.oldest_fact_age_days") is None
    rule = next(r for r in record.rationale if r.rule == "catalog_age")
    assert rule.fired is None
    assert rule.effect.startswith(
        f"the oldest fact used is {record.measured('catalog.oldest_fact')}, evidence of "
        f"2026-11-30, after the decision's date {AS_OF}: its age at that date is unknown; give "
        "a report date on or after 2026-11-30 (--as-of or bench.as_of), or the catalog of that "
        "date (decision.catalog)"
    )
