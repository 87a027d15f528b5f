"""Section 9, the changes since the previous version: which inputs and configuration keys
changed, whether the code did, each headline number as shown before and now, and the decision
before and now."""

from __future__ import annotations

import json

from pipeline.decision.measures import (
    MEAN_RATE,
    OUTPUT_TOKENS_PER_MONTH,
    PEAK_CONCURRENCY,
    PEAK_RATE,
    SHARED_PREFIX_RATIO,
)
from pipeline.decision.result import DecisionRecord
from pipeline.present.text import NOTHING, measurement, money
from pipeline.report.config import JsonDocument
from pipeline.report.sections.content import ReportContent
from pipeline.report.sections.summary import candidate_row
from pipeline.unknown import ResultModel

# The headline figures of each candidate the changes section compares, with their labels.
CANDIDATE_FIGURES = {
    "cost": "$ per 1M output tokens at the SLO",
    "benchmark_cost": "benchmark's own $ per 1M output tokens",
    "capacity": "capacity per replica",
    "gpus": "GPUs at peak",
    "monthly": "monthly cost",
    "payback": "switch pays back in",
}
# The workload's headline figures (decision record measurements) and their labels.
WORKLOAD_FIGURES = {
    MEAN_RATE.name: "mean arrival rate (req/s)",
    PEAK_RATE.name: "peak arrival rate (req/s)",
    PEAK_CONCURRENCY.name: "peak concurrency",
    OUTPUT_TOKENS_PER_MONTH.name: "output tokens per month",
    SHARED_PREFIX_RATIO.name: "shared-prefix ratio",
}


class InputChange(ResultModel):
    path: str
    change: str  # added, removed or changed


class SettingChange(ResultModel):
    key: str  # dotted, e.g. bench.prices.gpu_hour_usd.H100
    before: str
    now: str


class NumberChange(ResultModel):
    what: str
    before: str
    now: str


class Changes(ResultModel):
    against: str
    inputs: list[InputChange]
    configuration: list[SettingChange]
    code_changed: bool
    numbers: list[NumberChange]
    decision_before: str
    decision_now: str
    decision_changed: bool


def lineage(inputs: dict[str, str], derived: dict[str, str]) -> dict[str, str]:
    """Every file a version was made from, by one key: the input files as recorded, each
    upstream output as ``derived:<path>`` (what the appendix lists and the changes compare)."""
    return {**inputs, **{f"derived:{path}": digest for path, digest in derived.items()}}


def headline_figures(record: DecisionRecord) -> dict[str, str]:
    """Every headline number of a decision, as shown (so a change below the shown rounding is
    no change): each candidate's figures, the workload's, and what routing is worth."""
    out = {
        f"{label}, {c.name}": getattr(candidate_row(c), key)
        for c in record.candidates
        for key, label in CANDIDATE_FIGURES.items()
    }
    for c in record.candidates:
        out[f"benchmark's own monthly GPU cost, {c.name}"] = money(c.benchmark_monthly_cost_usd)
    for metric, label in WORKLOAD_FIGURES.items():
        out[label] = measurement(record.measured(metric))
    out["monthly value of prefix-aware routing"] = money(record.routing.monthly_usd_saved)
    return out


_NOT_SET = object()


def configuration_changes(before: object, now: object, key: str = "") -> list[SettingChange]:
    """Each configuration key whose value differs (nested sections by dotted key; a key added
    or removed shows "not set")."""
    if isinstance(before, dict) and isinstance(now, dict):
        return [
            change
            for name in sorted(set(before) | set(now), key=str)
            for change in configuration_changes(
                before.get(name, _NOT_SET), now.get(name, _NOT_SET), f"{key}.{name}".lstrip(".")
            )
        ]
    if before == now:
        return []
    return [SettingChange(key=key, before=_setting(before), now=_setting(now))]


def _setting(value: object) -> str:
    if value is _NOT_SET:
        return "not set"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _digests(manifest: JsonDocument, key: str) -> dict[str, str]:
    found = manifest.get(key)
    return {path: str(digest) for path, digest in found.items()} if isinstance(found, dict) else {}


def changes(inputs: ReportContent) -> Changes | None:
    """None: there is no previous version."""
    previous = inputs.previous
    if previous is None:
        return None
    before = lineage(_digests(previous.manifest, "inputs"), _digests(previous.manifest, "derived"))
    now = inputs.inputs
    inputs_changed = [
        InputChange(
            path=path,
            change="added" if path not in before else "removed" if path not in now else "changed",
        )
        for path in sorted(set(before) | set(now))
        if before.get(path) != now.get(path)
    ]
    old, new = previous.record, inputs.record
    figures_before, figures_now = headline_figures(old), headline_figures(new)
    numbers = [
        NumberChange(what=what, before=figures_before.get(what, NOTHING), now=shown)
        for what, shown in figures_now.items()
        if figures_before.get(what, NOTHING) != shown
    ]
    numbers += [
        NumberChange(what=what, before=shown, now=NOTHING)
        for what, shown in figures_before.items()
        if what not in figures_now
    ]
    return Changes(
        against=f"{previous.quarter} v{previous.version}",
        inputs=inputs_changed,
        configuration=configuration_changes(
            previous.manifest.get("configuration", {}), inputs.configuration
        ),
        code_changed=previous.manifest.get("code") != inputs.code,
        numbers=numbers,
        decision_before=old.recommendation.headline,
        decision_now=new.recommendation.headline,
        decision_changed=(old.recommendation.engine, old.recommendation.routing_layer)
        != (new.recommendation.engine, new.recommendation.routing_layer),
    )
