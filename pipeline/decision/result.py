"""The decision record: what the decision stage writes (``decision/decision.json``), what the
report renders and what a later quarter reads back to check its revisit triggers.

The pydantic models are the record's schema: :meth:`DecisionRecord.from_json` validates a
record (unknown keys, wrong types and a different ``schema_version`` are errors), and
:func:`record_schema` is the JSON Schema written beside it for auditors' tools.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.errors import InputFormatError
from pipeline.settings import validation_message

SCHEMA_VERSION = 1
Confidence = Literal["firm", "provisional", "tie"]
CandidateStatus = Literal["recommended", "runner-up", "viable", "excluded"]
TriggerStatus = Literal["fired", "not_fired", "unknown"]
Comparator = Literal[">", ">=", "<", "<=", "==", "!="]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recommendation(_Model):
    engine: str | None
    engine_name: str | None
    routing_layer: str | None
    runner_up: str | None
    confidence: Confidence
    confidence_reasons: list[str]
    state: Literal["decided", "revisit"]
    headline: str


class Candidate(_Model):
    engine: str
    name: str
    status: CandidateStatus
    reasons: list[str]
    benchmarked: bool
    benchmark: str | None
    capacity_rps: float | None = None  # per replica, at the SLO
    gpus_at_peak: int | None = None  # fleet for the workload's peak rate
    monthly_cost_mean_rate_usd: float | None = None  # GPU fleet at the workload's mean rate
    cost_per_1m_output_usd: float | None
    monthly_cost_usd: float | None  # GPU fleet at the workload's peak rate
    monthly_change_cost_usd: float | None
    monthly_total_usd: float | None
    switch_cost_usd: float | None
    payback_months: float | None
    flip_condition: str | None


class Rule(_Model):
    rule: str
    title: str
    source: str
    fired: bool | None
    evidence: dict[str, Any]
    effect: str


class Trigger(_Model):
    id: str
    metric: str
    comparator: Comparator
    threshold: Any
    value: Any
    why: str
    status: TriggerStatus


class TriggerCheck(_Model):
    """A previous record's trigger evaluated against this run's measurements."""

    id: str
    metric: str
    comparator: Comparator
    threshold: Any
    previous_value: Any
    value: Any
    why: str
    status: TriggerStatus


class Previous(_Model):
    workload: str
    as_of: str | None
    engine: str | None
    record_sha256: str
    triggers: list[TriggerCheck]
    fired: list[str]


class Routing(_Model):
    recommended: bool | None
    layer: str | None
    alternatives: list[str]
    routing: str | None
    replicas: int | None
    cache_tokens_per_replica: int | None
    cache_tokens_source: str
    prompt_tokens_saved_share: float | None
    monthly_prompt_tokens_saved: float | None
    monthly_usd_saved: float | None
    method: str
    reason: str


class Isolation(_Model):
    recommended: bool | None
    cross_tenant_share_of_hits: float | None
    hit_ratio_shared: float | None
    hit_ratio_isolated: float | None
    reason: str


class DecisionRecord(_Model):
    schema_version: Literal[1]
    workload: str
    as_of: str | None
    recommendation: Recommendation
    candidates: list[Candidate]
    rationale: list[Rule]
    routing: Routing
    isolation: Isolation
    triggers: list[Trigger]
    measurements: dict[str, Any]
    previous: Previous | None
    requirements: dict[str, Any]
    catalog: dict[str, Any]
    inputs: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any, where: str) -> DecisionRecord:
        """A record read back (a previous quarter's, or this run's for the report)."""
        if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
            raise InputFormatError(
                f"{where}: decision record schema_version {data.get('schema_version')!r} is not "
                f"{SCHEMA_VERSION}; re-run `enginefit decide` with this version"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InputFormatError(validation_message(exc, cls, where)) from exc


def record_schema() -> dict[str, Any]:
    """The JSON Schema of the decision record."""
    return DecisionRecord.model_json_schema()
