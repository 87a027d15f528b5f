"""The decision record: what the decision stage writes (``decision/decision.json``), what the
report renders and what a later quarter reads back to check its revisit triggers.

The pydantic models are the record's schema: :meth:`DecisionRecord.from_json` validates a
record (unknown keys, wrong types and a different ``schema_version`` are errors), and
:func:`record_schema` is the JSON Schema written beside it for auditors' tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from pipeline.costing import PaybackEnd, monthly_bill
from pipeline.decision.measures import MeasuredValue, Measurement, measured, typed, values
from pipeline.errors import InputFormatError
from pipeline.settings import validation_message

#: 2: candidates carry the workload's own capacity and cost (capacity stage) beside the
#: benchmark's; routing and isolation are priced through the fitted serving model.
#: 3: the recommendation carries the tenant isolation it needs (what to do, its hit-rate and
#: dollar cost at the fleet); routing says how its layer was chosen for the team's platform;
#: the ranking says what it compared and what set the tie band (``ranking``); payback is typed
#: (months, never, unknown with the reason: ``payback``); a flip per axis (``flips``); the
#: capacity band carried into replicas, monthly cost, cost per 1M and payback (optional keys).
SCHEMA_VERSION: Literal[3] = 3
#: Versions :meth:`DecisionRecord.from_json` reads: an older record (version 1: the
#: benchmark's costs) still serves as ``--previous`` (its triggers are evaluated against this
#: run).
READABLE_VERSIONS = (1, 2, 3)
CostBasis = Literal["workload", "benchmark"]
Confidence = Literal["firm", "provisional", "tie"]
CandidateStatus = Literal["recommended", "runner-up", "viable", "excluded"]
TriggerStatus = Literal["fired", "not_fired", "unknown"]
Comparator = Literal[">", ">=", "<", "<=", "==", "!="]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# In memory a typed Measurement; on disk its bare value, as records have always held it (the
# unit and source follow from the metric's key).
BARE = PlainSerializer(lambda m: m.value, return_type=MeasuredValue)


def _any_json(title: str) -> WithJsonSchema:
    """The JSON Schema these fields have always had: any JSON value."""
    return WithJsonSchema({"title": title})


def _measured_by_metric(data: Any, *fields: str) -> Any:
    """A trigger's values as read (bare) typed by the metric it watches."""
    if isinstance(data, dict) and isinstance(data.get("metric"), str):
        return data | {f: measured(data["metric"], data[f]) for f in fields if f in data}
    return data


class IsolationAdvice(_Model):
    """Isolation the recommendation needs (untrusted tenants reusing each other's cached
    prefixes): what to do and what it costs at the fleet's replica count (None: unknown,
    ``cost`` says why)."""

    action: str
    replicas: int | None  # the simulated replica count the hit ratios compare at
    hit_ratio_shared: float | None
    hit_ratio_isolated: float | None
    monthly_usd_cost: float | None
    cost: str


class Recommendation(_Model):
    engine: str | None
    engine_name: str | None
    routing_layer: str | None
    runner_up: str | None
    confidence: Confidence
    confidence_reasons: list[str]
    state: Literal["decided", "revisit"]
    headline: str
    isolation: IsolationAdvice | None = None  # None: none needed, or whether is unknown


class Payback(_Model):
    """How long choosing this engine takes to pay for itself: ``months`` (with the figure),
    ``never`` (it saves nothing a month) or ``unknown`` (an input is missing; ``reason`` says
    which). ``switch`` (from the engine running today, ``against``): the cost counts the
    migration work and running both engines side by side through the migration and
    revalidation weeks. ``choice`` (a new deployment, against the other of the top two): the
    cost is the extra adoption work over ``against``'s."""

    status: Literal["months", "never", "unknown"]
    months: float | None = None
    reason: str
    kind: Literal["switch", "choice"] = "switch"
    against: str | None = None
    switch_cost_usd: float | None = None  # the migration's engineer time
    parallel_run_usd: float | None = None  # the new fleet's bill while both run
    parallel_weeks: float | None = None
    monthly_saving_usd: float | None = None
    #: With a capacity band on either bill: the saving at worst and at best, and the payback
    #: soonest and latest ("never" at an end that saves nothing a month).
    monthly_saving_band_usd: tuple[float, float] | None = None
    months_band: tuple[PaybackEnd, PaybackEnd] | None = None


class Candidate(_Model):
    """One engine. Costs are the workload's own (``cost_basis: workload``: the capacity stage's
    serving model carried to this workload's mix) or, where its capacity is unknown, the
    benchmark's (``cost_basis: benchmark``, ``cost_note`` says why)."""

    engine: str
    name: str
    status: CandidateStatus
    reasons: list[str]
    benchmarked: bool
    benchmark: str | None
    capacity_rps: float | None = None  # the benchmark's measured capacity per replica at the SLO
    gpus_at_peak: int | None = None  # fleet for the workload's peak rate
    monthly_cost_mean_rate_usd: float | None = None  # GPU fleet at the workload's mean rate
    # All-in: a replica's hour ÷ the output tokens it serves an hour at its SLO capacity
    # (docs/decision-rules.md#cost-formula), for this workload's mix when ``cost_basis`` is ``workload``.
    cost_per_1m_output_usd: float | None
    monthly_cost_usd: float | None  # GPU fleet at the workload's peak rate
    monthly_change_cost_usd: float | None
    monthly_total_usd: float | None
    switch_cost_usd: float | None
    flip_condition: str | None
    # None: no switch to pay back (nothing runs today, or this engine does).
    payback: Payback | None = None
    payback_months: float | None = None  # versions 1 and 2 only (``inf`` was written null)
    cost_basis: CostBasis | None = None  # None: no cost at all
    cost_note: str | None = None  # why the costs are the benchmark's, or provisional
    workload_capacity_rps: float | None = None  # per replica at the SLO, this workload's mix
    workload_capacity_band_rps: tuple[float, float] | None = None
    capacity_band_basis: str | None = None  # what the band is made of, in a sentence
    # The band carried through: replicas at peak (fewest, most), the GPU fleet's monthly
    # cost and the all-in cost per 1M output tokens at the band's ends (None: no band).
    replicas_band: tuple[int, int] | None = None
    monthly_cost_band_usd: tuple[float, float] | None = None
    cost_per_1m_output_band_usd: tuple[float, float] | None = None
    capacity_basis: Literal["measured", "transferred"] | None = None
    transfer: str | None = None  # how far the workload is from the benchmark, in a sentence
    provisional_reason: str | None = None
    replicas: int | None = None  # replicas at the workload's peak (the decision's fleet)
    # The workload's price sheet: GPU time split by the model's prefill, cached-context and
    # decode shares (the three × their tokens add up to the replica's hour).
    cost_per_1m_output_decode_usd: float | None = None
    cost_per_1m_input_usd: float | None = None
    cost_per_1m_cached_input_usd: float | None = None
    fleet_cost_per_1m_output_usd: float | None = None  # sized fleet's bill ÷ output at mean rate
    benchmark_cost_per_1m_output_usd: float | None = None  # the bench stage's own figure
    benchmark_monthly_cost_usd: float | None = None  # the bench stage's fleet at the peak
    # How the capacity search's requests arrived, the same search with Poisson arrivals, which
    # cache replay gave the cached tokens (and how the fleet size settled), what binds the
    # capacity and how it moves with one input moved (the capacity stage's words).
    capacity_arrivals: str | None = None
    capacity_poisson_rps: float | None = None
    capacity_cache: str | None = None
    capacity_binding: str | None = None
    capacity_sensitivity: str | None = None

    def monthly_bill(self) -> float | None:
        """What it costs a month (:func:`pipeline.costing.monthly_bill`)."""
        return monthly_bill(self.monthly_total_usd, self.monthly_cost_usd)

    def monthly_bill_band(self) -> tuple[float, float] | None:
        """:meth:`monthly_bill` at the capacity band's ends (None: no band)."""
        band = self.monthly_cost_band_usd
        if band is None:
            return None
        change = self.monthly_change_cost_usd if self.monthly_total_usd is not None else 0.0
        return band[0] + (change or 0.0), band[1] + (change or 0.0)


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
    threshold: Annotated[MeasuredValue, _any_json("Threshold")]  # in the metric's unit
    value: Annotated[Measurement, BARE, _any_json("Value")]
    why: str
    status: TriggerStatus

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        return _measured_by_metric(data, "value")


class TriggerCheck(_Model):
    """A previous record's trigger evaluated against this run's measurements."""

    id: str
    metric: str
    comparator: Comparator
    threshold: Annotated[MeasuredValue, _any_json("Threshold")]
    previous_value: Annotated[Measurement, BARE, _any_json("Previous Value")]
    value: Annotated[Measurement, BARE, _any_json("Value")]
    why: str
    status: TriggerStatus

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        return _measured_by_metric(data, "previous_value", "value")


class Previous(_Model):
    workload: str
    as_of: str | None
    engine: str | None
    record_sha256: str
    triggers: list[TriggerCheck]
    fired: list[str]


class Routing(_Model):
    recommended: bool | None
    layer: str | None  # chosen for the team's platform (requirements.platform)
    alternatives: list[str]  # the other layers that fit (all of them when none was chosen)
    routing: str | None
    replicas: int | None
    cache_tokens_per_replica: int | None
    cache_tokens_source: str
    prompt_tokens_saved_share: float | None
    monthly_prompt_tokens_saved: float | None
    monthly_usd_saved: float | None
    method: str
    reason: str
    fleet_replicas: int | None = None  # replicas the workload's peak needs (the fleet judged)
    fleet_source: str | None = None  # where that count comes from
    prefill_gpu_hours_saved_per_month: float | None = None
    ttft_p95_ms_saved: float | None = None
    layer_choice: str | None = None  # why this layer, or what to set to choose one
    # With the fleet size unknown: the saving over the simulated replica counts (low, high),
    # what it comes to a month, and the fewest replicas at which it clears the threshold.
    prompt_tokens_saved_share_range: list[float] | None = None
    monthly_prompt_tokens_saved_range: list[float] | None = None
    monthly_usd_saved_range: list[float] | None = None
    worth_from_replicas: int | None = None


class Isolation(_Model):
    recommended: bool | None
    cross_tenant_share_of_hits: float | None
    hit_ratio_shared: float | None
    hit_ratio_isolated: float | None
    reason: str
    monthly_usd_cost: float | None = None  # prefill GPU time isolation adds a month
    ttft_p95_ms_cost: float | None = None
    method: str | None = None
    action: str | None = None  # what to do, when isolation is recommended
    replicas: int | None = None  # the simulated replica count the hit ratios compare at
    fleet_replicas: int | None = None  # replicas the workload's peak needs


class Ranking(_Model):
    """What the cost ranking compared and when a gap is a tie."""

    basis: str | None  # the compared figure (None: nothing priced)
    basis_note: str  # why this figure (fleet rounding kept out of the comparison)
    values: dict[str, float]
    gap: float | None  # top two, as a share of the cheaper one
    margin: float  # requirements.cost_margin
    noise: float | None  # the two benchmarks' repeat-run noise (None: not repeated)
    noise_note: str
    tie_band: float  # the larger of margin and noise
    tie_band_set_by: Literal["margin", "noise"]
    #: The compared figure at each engine's capacity band ends (engines whose cost is the
    #: benchmark's own have none), and whether the top two's bands overlap: a tie (None:
    #: not both have a band).
    value_bands: dict[str, tuple[float, float]] = Field(default_factory=dict)
    bands_overlap: bool | None = None


class AxisFlip(_Model):
    """Where on one axis the decision changes, found by re-deciding with only that input
    moved (the decision is a pure function): ``threshold`` is the first value, moving
    ``direction`` from ``today``, at which the recommended engine becomes ``engine``; None:
    no flip within ``searched`` (or the input is unknown: ``reason``)."""

    axis: str
    metric: str  # the measurement a revisit trigger watches
    unit: str  # tokens/month, changes/quarter, share, $/GPU-hour, $/1M output tokens, hardware
    direction: Literal["up", "down", "change"]
    today: Any
    threshold: Any
    engine: str | None  # the answer past the threshold
    searched: list[Any]  # the range searched (a list of changes for hardware)
    reason: str | None = None


class DecisionRecord(_Model):
    schema_version: Literal[1, 2, 3]
    workload: str
    as_of: str | None
    recommendation: Recommendation
    candidates: list[Candidate]
    rationale: list[Rule]
    routing: Routing
    isolation: Isolation
    triggers: list[Trigger]
    measurements: Annotated[
        dict[str, Measurement],
        PlainSerializer(values, return_type=dict[str, MeasuredValue]),
        WithJsonSchema({"additionalProperties": True, "type": "object"}),
    ]
    previous: Previous | None
    requirements: dict[str, Any]
    catalog: dict[str, Any]
    inputs: dict[str, str]
    ranking: Ranking | None = None
    flips: list[AxisFlip] = []

    @field_validator("measurements", mode="before")
    @classmethod
    def _typed_measurements(cls, raw: Any) -> Any:
        return typed(raw) if isinstance(raw, dict) else raw

    def measured(self, key: str) -> MeasuredValue:
        """A measurement's value (None: not measured)."""
        found = self.measurements.get(key)
        return None if found is None else found.value

    def to_json(self) -> dict[str, Any]:
        """The record as written. An older record read back dumps only what its file held
        (the fields later versions added are left out), so its digest is the file's."""
        if self.schema_version < SCHEMA_VERSION:
            return self.model_dump(mode="json", exclude_unset=True)
        legacy = {"candidates": {"__all__": {"payback_months"}}}
        return self.model_dump(mode="json", exclude=legacy)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: Any, where: str) -> DecisionRecord:
        """A record read back (a previous quarter's, or this run's for the report). An older
        version is read as is: a version-1 record's candidates have no workload figures and
        its triggers name the benchmark's metrics, which this version still measures; a
        version-2 record has no isolation in its recommendation."""
        if isinstance(data, dict) and data.get("schema_version") not in READABLE_VERSIONS:
            raise InputFormatError(
                f"{where}: decision record schema_version {data.get('schema_version')!r} is not "
                f"one of {', '.join(map(str, READABLE_VERSIONS))}; re-run `enginefit decide` "
                "with this version"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InputFormatError(validation_message(exc, cls, where)) from exc


def record_schema() -> dict[str, Any]:
    """The JSON Schema of the decision record."""
    return DecisionRecord.model_json_schema()
