"""The decision record's measurements: each a :class:`Measurement` (its value, unit and the
stage output it comes from), keyed by the :class:`Metric` it measures, one key per engine or
setting where the metric has a subject (``decision.gpu_hour_usd[vllm]``).

Revisit triggers compare these a quarter later, so the keys are the record's contract: every
module builds them from the constants here. On disk the record keeps its flat mapping (key →
value); unit and source follow from the key, so a record any version wrote reads back typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from pipeline.ledger import PREDICTION_ERROR as PREDICTION_ERROR_NAME
from pipeline.unknown import ResultModel

#: A measured value or threshold as the record holds it: a number, a flag, a name or date, a
#: list of names, a setting as canonical JSON text, or null (unknown).
MeasuredValue = JsonValue


class Measurement(ResultModel):
    value: MeasuredValue
    unit: str
    source: str


#: Every metric by name (each registers itself).
METRICS: dict[str, Metric] = {}


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    source: str

    def __post_init__(self) -> None:
        METRICS[self.name] = self

    def key(self, subject: str) -> str:
        """The key of this metric for one engine (or setting)."""
        return f"{self.name}[{subject}]"


def _metrics(source: str, *specs: tuple[str, str]) -> tuple[Metric, ...]:
    return tuple(Metric(name, unit, source) for name, unit in specs)


SHAPE = "shape/workload_shape.json"
BENCH = "bench/slo_capacity.parquet (the benchmark's own figures)"
DECISION = "the decision: the workload's own figures (capacity/capacity.json), else the benchmark's"
CATALOG = "the engine catalog"
REQUIREMENTS = "configuration: requirements"

(
    PEAK_CONCURRENCY,
    CONCURRENCY_ESTIMATED,
    MEAN_RATE,
    PEAK_RATE,
    OUTPUT_TOKENS_MEAN,
    OUTPUT_TOKENS_PER_MONTH,
    FEATURES_REQUIRED,
) = _metrics(
    SHAPE,
    ("shape.concurrency.peak", "requests in flight"),
    ("shape.concurrency.estimated", "yes/no"),
    ("shape.arrivals.mean_rate_rps", "req/s"),
    ("shape.arrivals.peak_rate_rps", "req/s"),
    ("shape.lengths.output_tokens.mean", "tokens"),
    ("shape.output_tokens_per_month", "tokens/month"),
    ("shape.features.required", "features"),
)
SHARED_PREFIX_RATIO = Metric("prefix.shared_prefix_ratio", "share", "prefix/prefix_sharing.json")
(
    CATALOG_AS_OF,
    CATALOG_AGE_DAYS,
    ENGINE_STATUS,
    MIN_CUDA_MAJOR,
    MISSING_FEATURES,
    OLDEST_FACT,
    OLDEST_FACT_DATE,
    OLDEST_FACT_AGE_DAYS,
    UNDATED_FACTS_USED,
) = _metrics(
    CATALOG,
    ("catalog.as_of", "date"),
    ("catalog.age_days", "days"),  # older records'
    ("catalog.status", "status"),
    ("catalog.min_cuda_major", "CUDA major version"),
    ("catalog.missing_features", "features"),
    ("catalog.oldest_fact", "catalog key"),
    ("catalog.oldest_fact_date", "date"),
    ("catalog.oldest_fact_age_days", "days"),
    ("catalog.undated_facts_used", "facts"),
)
(FIXED_SKU, MODEL_CHANGES_PER_QUARTER, SETTING) = _metrics(
    REQUIREMENTS,
    ("requirements.fixed_sku", "yes/no"),
    ("requirements.model_changes_per_quarter", "changes/quarter"),
    ("requirements.setting", "canonical JSON"),
)
(
    BENCH_COST_PER_1M_OUTPUT,
    BENCH_CAPACITY,
    BENCH_AGE_DAYS,
    BENCH_MONTHLY_GPU,
    BENCH_FLEET_CAPACITY,
) = _metrics(
    BENCH,
    ("bench.cost_per_1m_output_usd", "$/1M output tokens"),
    ("bench.capacity_rps", "req/s per replica"),
    ("bench.age_days", "days"),
    ("bench.monthly_gpu_usd", "$/month"),
    ("bench.fleet_capacity_rps", "req/s"),
)
(
    COST_BASIS,
    COST_PER_1M_OUTPUT,
    CAPACITY,
    REPLICAS_AT_PEAK,
    MONTHLY_GPU,
    MONTHLY_TOTAL,
    PAYBACK_MONTHS,
    GPU_HOUR_USD,
    FLEET_FRACTION_GPU,
    FLEET_CAPACITY,
    COST_GAP_TOP_TWO,
) = _metrics(
    DECISION,
    ("decision.cost_basis", "basis"),
    ("decision.cost_per_1m_output_usd", "$/1M output tokens"),
    ("decision.capacity_rps", "req/s per replica"),
    ("decision.replicas_at_peak", "replicas"),
    ("decision.monthly_gpu_usd", "$/month"),
    ("decision.monthly_total_usd", "$/month"),
    ("decision.payback_months", "months"),
    ("decision.gpu_hour_usd", "$/GPU-hour"),
    ("decision.fleet_fraction_gpu_usd", "$/month"),
    ("decision.fleet_capacity_rps", "req/s"),
    ("decision.cost_gap_top_two", "share"),
)
CAPACITY_CHECK = "capacity/capacity.json (predicted against measured on the workload's own traffic)"
(PREDICTION_ERROR, PREDICTED_CAPACITY, MEASURED_CAPACITY, PREDICTION_CHECK) = _metrics(
    CAPACITY_CHECK,
    (PREDICTION_ERROR_NAME, "share"),  # the ledger keeps this one, version by version
    ("capacity.predicted_rps", "req/s per replica"),
    ("capacity.measured_rps", "req/s per replica"),
    ("capacity.prediction_check", "sentence"),
)
#: A requirement's revisit trigger is named by this key (it watches :data:`SETTING`'s).
REQUIREMENT_CHANGED = Metric("requirements.changed", "setting", REQUIREMENTS)


def measured(key: str, value: MeasuredValue | Measurement) -> Measurement:
    """``value`` typed by the metric its key names; a key no version of this module knows (a
    record written by a later one) keeps its value, with the record as its source."""
    if isinstance(value, Measurement):
        return value
    metric = METRICS.get(key.split("[", 1)[0])
    if metric is None:
        return Measurement(value=value, unit="as recorded", source="the decision record")
    return Measurement(value=value, unit=metric.unit, source=metric.source)


def typed(raw: Mapping[str, MeasuredValue | Measurement]) -> dict[str, Measurement]:
    """A flat key → value mapping as read or built, each value typed by its key."""
    return {key: measured(key, value) for key, value in raw.items()}


def values(measurements: Mapping[str, Measurement]) -> dict[str, MeasuredValue]:
    """The flat key → value mapping the record file holds."""
    return {key: m.value for key, m in measurements.items()}
