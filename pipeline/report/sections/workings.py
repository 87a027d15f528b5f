"""The auditor's appendix: how each headline number was computed — its formula with the
numbers put in, and each input with the file it came from and that file's short hash, so a
printed copy ties every figure to what the ledger recorded.

Nothing is recomputed for the document: the numbers are the decision record's and the capacity
stage's; the formula is shown with them filled in so a reader can redo the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.capacity.result import CandidateCapacity, WorkloadCost, WorkloadMix
from pipeline.costing import HOURS_PER_MONTH, HOURS_PER_WEEK, MONTHS_PER_QUARTER, SECONDS_PER_HOUR
from pipeline.decision.result import Candidate, DecisionRecord
from pipeline.present.text import UNKNOWN, measurement, money, number, share, usd
from pipeline.report.sections.content import ReportContent, capacities
from pipeline.unknown import ResultModel

#: Characters of a sha256 a printed input shows (the manifest holds the whole digest).
SHORT_HASH = 12


@dataclass(frozen=True)
class Sources:
    """Where the inputs of a number come from: the record's input files (path → sha256), the
    configuration's and the catalog's digests."""

    inputs: dict[str, str]
    configuration_sha256: str
    catalog_sha256: str

    def file(self, path: str) -> str:
        digest = self.inputs.get(path)
        return f"{path} {digest[:SHORT_HASH]}" if digest else f"{path} (not recorded)"

    def configuration(self, key: str) -> str:
        return f"configuration {key}, {self.configuration_sha256[:SHORT_HASH]}"

    def catalog(self, key: str) -> str:
        return f"engine catalog {key}, {self.catalog_sha256[:SHORT_HASH]}"


class Working(ResultModel):
    """A headline number, its formula with the numbers put in, and its sourced inputs."""

    number: str
    value: str
    formula: str
    inputs: list[str]


def _row(number_: str, value: str, formula: str, inputs: list[str]) -> Working:
    return Working(number=number_, value=value, formula=formula, inputs=inputs)


def _workload_rows(
    c: Candidate, cost: WorkloadCost, mix: WorkloadMix, capacity: float, src: Sources
) -> list[Working]:
    """Cost per 1M output tokens, replicas and the monthly GPU bill of one candidate carried
    to this workload (the capacity stage's figures)."""
    per_replica = cost.gpus // max(cost.replicas, 1)
    spare = " + 1 spare (N+1)" if cost.n_plus_one else ""
    capacity_in = f"capacity {capacity:.4g} req/s per replica: {src.file('capacity/capacity.json')}"
    price_in = f"${cost.gpu_hour_usd:g} per GPU-hour: {src.configuration('bench.prices')}"
    return [
        _row(
            f"{c.name}: cost per 1M output tokens, this workload",
            usd(c.cost_per_1m_output_usd),
            f"${cost.gpu_hour_usd:g} × {per_replica} GPU ÷ ({capacity:.4g} req/s × "
            f"{mix.output_tokens_mean:.1f} output tokens × {SECONDS_PER_HOUR:,.0f} s) × 10⁶",
            [
                capacity_in,
                price_in,
                f"mean output {mix.output_tokens_mean:.1f} tokens: "
                f"{src.file('capacity/capacity.json')}",
            ],
        ),
        _row(
            f"{c.name}: replicas at the peak",
            number(cost.replicas),
            f"⌈{mix.peak_rate_rps:.4g} req/s ÷ ({capacity:.4g} req/s × {cost.headroom:g} "
            f"headroom)⌉{spare}",
            [
                f"peak {mix.peak_rate_rps:.4g} req/s: {src.file('shape/workload_shape.json')}",
                capacity_in,
                f"headroom {cost.headroom:g}: {src.configuration('capacity.headroom')}",
            ],
        ),
        _row(
            f"{c.name}: GPU fleet a month",
            money(cost.monthly_cost_usd),
            f"{cost.replicas} replicas × {per_replica} GPU × ${cost.gpu_hour_usd:g} × "
            f"{HOURS_PER_MONTH:g} h",
            [price_in],
        ),
    ]


def _change_row(c: Candidate, record: DecisionRecord, src: Sources) -> Working | None:
    changes = record.requirements.get("model_changes_per_quarter")
    if c.monthly_change_cost_usd is None or not changes:
        return None
    per_change = c.monthly_change_cost_usd / (changes / MONTHS_PER_QUARTER)
    return _row(
        f"{c.name}: model changes a month",
        money(c.monthly_change_cost_usd),
        f"{measurement(changes)} changes a quarter ÷ {MONTHS_PER_QUARTER} × {money(per_change)} a "
        f"change (engineer hours ÷ {HOURS_PER_WEEK:g} × the engineer-week price, plus any build's "
        "GPU time)",
        [
            f"{measurement(changes)} changes a quarter: "
            f"{src.configuration('requirements.model_changes_per_quarter')}",
            "engineer-week "
            f"{money(record.requirements.get('engineer_week_usd'))}: "
            f"{src.configuration('requirements.engineer_week_usd')}",
            f"hours and build minutes per change: {src.catalog(f'engines.{c.engine}.change')}",
        ],
    )


def _payback_row(c: Candidate, src: Sources) -> Working | None:
    p = c.payback
    if p is None:
        return None
    value = {"months": f"{p.months:.1f} months" if p.months is not None else UNKNOWN}.get(
        p.status, p.status
    )
    weeks = f"{p.parallel_weeks:g}" if p.parallel_weeks is not None else UNKNOWN
    return _row(
        f"{c.name}: the switch pays back in",
        value,
        f"({money(p.switch_cost_usd)} migration + {money(p.parallel_run_usd)} of both engines "
        f"running for {weeks} weeks) ÷ {money(p.monthly_saving_usd)} saved a month",
        [
            "migration engineer-weeks: "
            f"{src.configuration('requirements.migration_engineer_weeks')} else "
            f"{src.catalog(f'engines.{c.engine}.migration_engineer_weeks')}",
            f"revalidation weeks: {src.configuration('decision.revalidation_weeks')}",
            p.reason,
        ],
    )


def headline_workings(
    record: DecisionRecord,
    capacities: dict[str, CandidateCapacity | None],
    mix: WorkloadMix | None,
    src: Sources,
) -> list[Working]:
    """One row per headline number: the recommended engine's and the runner-up's costs, fleet,
    model-change cost and payback, the tie band, routing's value and each flip threshold.
    ``capacities``: each candidate engine's capacity-stage result (None: not carried)."""
    rows: list[Working] = []
    shown = [c for c in record.candidates if c.status in ("recommended", "runner-up")]
    for c in shown:
        carried = capacities.get(c.engine)
        cost = carried.cost if carried is not None else None
        capacity = carried.workload_capacity_rps if carried is not None else None
        if isinstance(cost, WorkloadCost) and isinstance(capacity, float) and mix is not None:
            rows += _workload_rows(c, cost, mix, capacity, src)
        elif c.benchmark_cost_per_1m_output_usd is not None:
            rows.append(
                _row(
                    f"{c.name}: cost per 1M output tokens, the benchmark's own mix",
                    usd(c.benchmark_cost_per_1m_output_usd),
                    "GPUs × $/GPU-hour ÷ (output tokens/s at the SLO capacity × "
                    f"{SECONDS_PER_HOUR:,.0f}) × 10⁶ "
                    f"(this workload's own cost is unknown: {c.cost_note or 'not carried'})",
                    [f"the benchmark's capacity: {src.file('bench/slo_capacity.parquet')}"],
                )
            )
        rows += [r for r in (_change_row(c, record, src), _payback_row(c, src)) if r]
    ranking = record.ranking
    if ranking is not None:
        rows.append(
            _row(
                "Tie band",
                share(ranking.tie_band),
                f"max({share(ranking.margin, 0)} margin, "
                f"{share(ranking.noise) if ranking.noise is not None else 'unknown'} repeat-run "
                f"noise): set by the {ranking.tie_band_set_by}",
                [
                    f"margin: {src.configuration('requirements.cost_margin')}",
                    f"noise: {src.file('bench/slo_capacity.parquet')} ({ranking.noise_note})",
                ],
            )
        )
    routing = record.routing
    if routing.monthly_usd_saved is not None:
        rows.append(
            _row(
                "Prefix-aware routing saves a month",
                money(routing.monthly_usd_saved),
                routing.method,
                [
                    f"hit ratios: {src.file('simulation/scenarios.json')}",
                    f"fleet: {routing.fleet_source or UNKNOWN}",
                ],
            )
        )
    for flip in record.flips:
        if flip.threshold is None:
            continue
        rows.append(
            _row(
                f"Flip: {flip.axis} ({flip.direction})",
                f"{measurement(flip.threshold)} {flip.unit}",
                f"the decision re-run with only {flip.metric} moved from "
                f"{measurement(flip.today)}: the answer becomes {flip.engine} at this value "
                f"(searched {', '.join(measurement(v) for v in flip.searched)})",
                [f"today's value: {flip.metric} in the record's measurements"],
            )
        )
    return rows


def workings(inputs: ReportContent) -> list[Working]:
    """The auditor's appendix: each headline number's formula and sourced inputs."""
    record = inputs.record
    result = inputs.workload_capacity
    catalog_sha256 = str(record.catalog.get("sha256") or "")
    sources = Sources(record.inputs, inputs.configuration_sha256, catalog_sha256)
    return headline_workings(
        record,
        capacities(inputs.record, inputs.workload_capacity),
        result.mix if result else None,
        sources,
    )
