"""Section 5's capacity and cost for this workload, per benchmarked candidate: the serving
model fitted on its benchmark in one line, its error on each point, how far this workload is
from what was measured, the capacity with its band and how it moves, the fleet and the
workload's prices beside the benchmark's."""

from __future__ import annotations

from pipeline.capacity.present import cache_sentence, capacity_words, transfer_sentence
from pipeline.capacity.result import CandidateCapacity, PointError, ServingModel
from pipeline.decision.result import Candidate
from pipeline.present.text import NOTHING, UNKNOWN, money, number, usd
from pipeline.report.sections.content import ReportContent, capacities
from pipeline.unknown import ResultModel, Unknown


class PointFit(ResultModel):
    """One benchmark point: measured against predicted (ms), the statistics the fitted
    model's error is shown on."""

    point: str
    rate: str
    ttft_p95: str
    itl_p99: str


class Moved(ResultModel):
    """The capacity with one input moved."""

    moved: str
    capacity: str
    change: str


class CostFact(ResultModel):
    label: str
    workload: str
    benchmark: str


class CandidateCost(ResultModel):
    engine: str
    basis: str
    note: str | None
    model: str | None
    errors: list[PointFit]
    transfer: str | None
    arrivals: str | None
    cache: str | None
    binding: str | None
    sensitivity: list[Moved]
    facts: list[CostFact]


class WorkloadCost(ResultModel):
    rows: list[CandidateCost]
    slo: str | None
    method: str | None


def workload_cost(inputs: ReportContent) -> WorkloadCost:
    result = inputs.workload_capacity
    carried = capacities(inputs.record, inputs.workload_capacity)
    rows = []
    for c in inputs.record.candidates:
        if not c.benchmarked:
            continue
        capacity = carried[c.engine]
        model = capacity.serving_model if capacity else None
        fitted = model if isinstance(model, ServingModel) else None
        rows.append(
            CandidateCost(
                engine=c.name,
                basis=c.cost_basis or UNKNOWN,
                note=c.cost_note if c.cost_basis != "workload" else None,
                model=_model_line(fitted) if fitted else None,
                errors=_errors(fitted) if fitted else [],
                transfer=transfer_sentence(capacity) if capacity else c.transfer,
                arrivals=capacity.arrivals.description if capacity and capacity.arrivals else None,
                cache=cache_sentence(capacity) if capacity else None,
                binding=capacity_words(capacity)["capacity_binding"] if capacity else None,
                sensitivity=_sensitivity(capacity),
                facts=_facts(c),
            )
        )
    return WorkloadCost(
        rows=rows,
        slo=result.slo.describe() if result else None,
        method=result.candidates[0].capacity_method if result and result.candidates else None,
    )


def _facts(c: Candidate) -> list[CostFact]:
    """The workload's figures beside the benchmark's (a figure the workload's cost basis does
    not give is unknown; one the benchmark has no counterpart for is —)."""
    band = c.workload_capacity_band_rps
    own = c.cost_basis == "workload"
    rows = [
        (
            "Capacity per replica at the SLO",
            number(c.workload_capacity_rps, 2, "req/s")
            + (f" ({number(band[0], 2)}–{number(band[1], 2)})" if band else ""),
            number(c.capacity_rps, 2, "req/s"),
        ),
        ("Replicas at the workload's peak", number(c.replicas) if own else UNKNOWN, NOTHING),
        (
            "Monthly GPU cost at the peak",
            money(c.monthly_cost_usd) if own else UNKNOWN,
            money(c.benchmark_monthly_cost_usd),
        ),
        (
            "$ per 1M output tokens (all-in)",
            usd(c.cost_per_1m_output_usd) if own else UNKNOWN,
            usd(c.benchmark_cost_per_1m_output_usd),
        ),
        ("$ per 1M output tokens (decode share)", usd(c.cost_per_1m_output_decode_usd), NOTHING),
        ("$ per 1M input tokens (prefill)", usd(c.cost_per_1m_input_usd), NOTHING),
        ("$ per 1M cached input tokens", usd(c.cost_per_1m_cached_input_usd), NOTHING),
        (
            "$ per 1M output tokens, the sized fleet at the mean rate",
            usd(c.fleet_cost_per_1m_output_usd),
            NOTHING,
        ),
    ]
    return [CostFact(label=label, workload=w, benchmark=b) for label, w, b in rows]


def _sensitivity(capacity: CandidateCapacity | None) -> list[Moved]:
    """How the candidate's capacity moves with one input moved, one row each."""
    return [
        Moved(
            moved=v.description,
            capacity=number(v.capacity_rps, 2, "req/s"),
            change=NOTHING if isinstance(v.change, Unknown) else f"{v.change:+.0%}",
        )
        for v in (capacity.sensitivity if capacity else [])
    ]


def _model_line(model: ServingModel) -> str:
    """The fitted step-time model in one line, in ms."""
    k = model.coefficients
    return (
        f"step = {k.overhead_s * 1e3:.3g} ms + {k.prefill_s_per_token * 1e3:.3g} ms per "
        f"uncached prompt token + {k.decode_s_per_request * 1e3:.3g} ms per decoding request + "
        f"{k.context_s_per_token * 1e6:.3g} µs per context token read; fitted on "
        f"{model.points_used} load points of {model.deployment.describe()} "
        f"(prefill split: {model.prefill_split_basis}; context: {model.context_basis}; "
        f"spread {model.residual_spread:.1%})"
    )


def _errors(model: ServingModel) -> list[PointFit]:
    def versus(key: str, e: PointError) -> str:
        measured, predicted, error = e.measured.get(key), e.predicted.get(key), e.error.get(key)
        if measured is None or isinstance(measured, Unknown):
            return f"{UNKNOWN} vs {number(predicted, 1)} ms"
        return f"{number(measured, 1)} vs {number(predicted, 1)} ms" + (
            f" ({error:+.0%})" if isinstance(error, float) else ""
        )

    return [
        PointFit(
            point=e.point_id.rsplit("/", 1)[-1],
            rate=number(e.rate_rps, 2, "req/s"),
            ttft_p95=versus("ttft_p95", e),
            itl_p99=versus("itl_p99", e),
        )
        for e in model.point_errors
    ]
