"""The capacity result for people: one sentence a VP can read per candidate, and small tables.

The sentence names what the benchmark measured, how far the team's traffic is from it and the
capacity with its band, e.g. "Measured at 205-token prompts; your prompts are 34× longer:
capacity 2.7 req/s per replica (2.2–3.1)". An unknown figure reads "unknown — <reason>",
never 0.
"""

from __future__ import annotations

from typing import Any

from pipeline.capacity.compute import FLEET_COUNT_TOLERANCE
from pipeline.capacity.fit import NOT_COMPARABLE
from pipeline.capacity.result import (
    CandidateCapacity,
    CapacityResult,
    CapacityVariant,
    FleetCache,
    PredictionCheck,
    ServingModel,
)
from pipeline.present.tables import markdown_table
from pipeline.present.text import UNKNOWN, unknown_text
from pipeline.unknown import Unknown

#: The binding limit as the sentence names it.
BINDING_WORDS = {
    "ttft_queueing": "TTFT queueing",
    "prefill_budget": "the prefill budget",
    "itl": "p99 ITL",
    "kv_pool": "the KV pool",
    "running_requests": "the running-request limit",
}


def _rate(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _length_phrase(ratio: float, what: str) -> str:
    if 0.95 <= ratio <= 1.05:
        return f"your {what} are about as long"
    if ratio > 1:
        return f"your {what} are {ratio:.2g}× longer"
    return f"your {what} are {1 / ratio:.2g}× shorter"


def transfer_sentence(candidate: CandidateCapacity) -> str:
    """One sentence: where the model was measured, how far the workload is, the capacity."""
    model, capacity = candidate.serving_model, candidate.workload_capacity_rps
    if isinstance(model, Unknown):
        return f"{candidate.candidate}: capacity {unknown_text(model)}"
    measured = f"Measured at {model.bench_prompt_tokens_mean:,.0f}-token prompts"
    transfer = candidate.transfer
    if isinstance(transfer, Unknown):
        distance = unknown_text(transfer)
    else:
        distance = _length_phrase(transfer.prompt_ratio, "prompts")
        if not 0.8 <= transfer.output_ratio <= 1.25:
            distance += " and " + _length_phrase(transfer.output_ratio, "answers")
    if isinstance(capacity, Unknown):
        return f"{measured}; {distance}: capacity {unknown_text(capacity)}"
    band = candidate.workload_capacity_band_rps
    band_text = "" if isinstance(band, Unknown) else f" ({_rate(band[0])}–{_rate(band[1])})"
    sentence = f"{measured}; {distance}: capacity {_rate(capacity)} req/s per replica{band_text}"
    if not isinstance(candidate.binding, Unknown):
        sentence += f", bound by {BINDING_WORDS[candidate.binding.limit]}"
    bursts = burstiness_phrase(candidate)
    if bursts:
        sentence += f", {bursts}"
    if candidate.provisional_reason:
        sentence += f" — provisional: {candidate.provisional_reason}"
    return sentence


def _change(value: float | Unknown) -> str:
    return UNKNOWN if isinstance(value, Unknown) else f"{value:+.0%}"


def burstiness_phrase(candidate: CandidateCapacity) -> str:
    """What the traffic's own arrivals do to the capacity against Poisson ones ("" when the
    search's arrivals were Poisson), e.g. "with the traffic's bursts (Poisson arrivals: 3.4,
    +26 %)"."""
    poisson = candidate.variant("poisson")
    arrivals = candidate.arrivals
    if poisson is None or arrivals is None or arrivals.kind == "poisson":
        return ""
    figure = poisson.capacity_rps
    text = UNKNOWN if isinstance(figure, Unknown) else _rate(figure)
    return f"with the traffic's bursts (Poisson arrivals: {text}, {_change(poisson.change)})"


def cache_sentence(candidate: CandidateCapacity) -> str:
    """Which replay gave the cached tokens, and how the fleet size settled ("" when the
    workload's own cached tokens were searched with)."""
    fleet = candidate.fleet_cache
    if fleet is None:
        return ""
    if isinstance(fleet, Unknown):
        return f"Cached tokens: none taken ({fleet.reason})"
    return f"Cached tokens: {fleet.description}. {fleet_passes(fleet)}"


def fleet_passes(fleet: FleetCache) -> str:
    """The fixed point in words: each pass's replicas, cached share and what it needed."""
    steps = "; ".join(
        (
            f"{s.replicas} replica(s): {s.cached_share:.1%} cached"
            if s.replicas
            else f"the simulated scenarios' {s.cached_share:.1%}"
        )
        + ", capacity "
        + (
            UNKNOWN
            if isinstance(s.capacity_rps, Unknown)
            else f"{_rate(s.capacity_rps)} req/s → {s.replicas_needed} replica(s)"
        )
        for s in fleet.steps
    )
    last = fleet.steps[-1]
    verdict = (
        "stopped: no rate meets the SLO"
        if isinstance(last.capacity_rps, Unknown)
        else "settled"
        if fleet.settled and last.replicas_needed == last.replicas
        else f"settled within {FLEET_COUNT_TOLERANCE:.0%} of the count (the pass at "
        f"{last.replicas} needs {last.replicas_needed}, the same routing; not replayed again)"
        if fleet.settled
        else f"did not settle (the count alternated): the pass at {fleet.replicas} replica(s), "
        "which needs the most, is kept"
    )
    return f"Fleet and cache {verdict}: {steps}."


def prediction_sentence(check: PredictionCheck | Unknown) -> str:
    """Predicted against measured in one sentence, e.g. "predicted 4.1 req/s per replica by the
    model fitted on A without this workload's own traffic; measured 3.6 req/s on it (B): error
    +14.0 %"; an unknown side reads "unknown — <reason>"."""
    if isinstance(check, Unknown):
        return f"predicted against measured: {unknown_text(check)}"
    return (
        f"predicted {_rate(check.predicted_rps)} req/s per replica by the model fitted on "
        f"{', '.join(check.fitted_from)} without this workload's own traffic; measured "
        f"{_rate(check.measured_rps)} req/s on it ({check.measured_from}): error "
        f"{check.error:+.1%}"
    )


def sensitivity_sentence(candidate: CandidateCapacity) -> str:
    """How the capacity moves with each input moved alone ("" when there is none)."""
    return "; ".join(
        f"{v.description}: {_variant_rate(v)} ({_change(v.change)})" for v in candidate.sensitivity
    )


def capacity_words(candidate: CandidateCapacity) -> dict[str, Any]:
    """The decision record's words on a candidate's capacity: its arrivals, the Poisson figure
    beside it, the cache replay, what binds it and the sensitivity (None where there is nothing
    to say)."""
    poisson = candidate.variant("poisson")
    binding = candidate.binding
    return {
        "capacity_arrivals": candidate.arrivals.description if candidate.arrivals else None,
        "capacity_poisson_rps": poisson.capacity_rps
        if poisson is not None and not isinstance(poisson.capacity_rps, Unknown)
        else None,
        "capacity_cache": cache_sentence(candidate) or None,
        "capacity_binding": None
        if isinstance(binding, Unknown)
        else f"{BINDING_WORDS[binding.limit]}: {binding.description}",
        "capacity_sensitivity": sensitivity_sentence(candidate) or None,
    }


def _variant_rate(variant: CapacityVariant) -> str:
    figure = variant.capacity_rps
    return UNKNOWN if isinstance(figure, Unknown) else f"{_rate(figure)} req/s"


def sensitivity_table(result: CapacityResult) -> str:
    """One row per candidate and moved input: the capacity and its change."""
    rows = [
        {
            "candidate": c.candidate,
            "moved": v.description,
            "capacity_rps": _figure(v.capacity_rps),
            "change": _change(v.change),
        }
        for c in result.candidates
        for v in c.sensitivity
    ]
    return markdown_table(rows, headers={"capacity_rps": "capacity req/s"})


def _figure(value: Any) -> Any:
    """A table cell: an unknown is the bare word (its reason is in the sentence above)."""
    return UNKNOWN if isinstance(value, Unknown) else value


def candidates_table(result: CapacityResult) -> str:
    """One row per candidate: capacity, band, basis, fleet and the workload's prices."""
    rows = []
    for c in result.candidates:
        cost = c.cost
        band = c.workload_capacity_band_rps
        rows.append(
            {
                "candidate": c.candidate,
                "capacity_rps": _figure(c.workload_capacity_rps),
                "band_rps": _figure(band) if isinstance(band, Unknown) else list(band),
                "basis": c.capacity_basis,
                "replicas": UNKNOWN if isinstance(cost, Unknown) else cost.replicas,
                "monthly_usd": UNKNOWN if isinstance(cost, Unknown) else cost.monthly_cost_usd,
                "monthly_band_usd": UNKNOWN
                if isinstance(cost, Unknown)
                else list(cost.monthly_cost_band_usd),
                "out_per_1m": UNKNOWN if isinstance(cost, Unknown) else cost.cost_per_1m_output_usd,
                "in_per_1m": UNKNOWN
                if isinstance(cost, Unknown)
                else _figure(cost.cost_per_1m_input_usd),
                "all_in_out_per_1m": UNKNOWN
                if isinstance(cost, Unknown)
                else cost.all_in_cost_per_1m_output_usd,
                "benchmark_out_per_1m": _figure(c.benchmark_cost_per_1m_output_usd),
            }
        )
    return markdown_table(
        rows,
        headers={
            "capacity_rps": "capacity req/s",
            "band_rps": "band req/s",
            "monthly_usd": "$/month",
            "monthly_band_usd": "$/month band",
            "out_per_1m": "$/1M output",
            "in_per_1m": "$/1M input",
            "all_in_out_per_1m": "$/1M output (all-in)",
            "benchmark_out_per_1m": "benchmark $/1M output",
        },
    )


def measured_text(value: Unknown) -> str:
    """A statistic the fit is not compared on: "not comparable" (the file's figure measures
    something else) or unknown (the file lacks it)."""
    return NOT_COMPARABLE if value.reason.startswith(NOT_COMPARABLE) else UNKNOWN


def model_errors_table(model: ServingModel) -> str:
    """The fitted model against every point it was fitted on (predicted ÷ measured − 1)."""
    rows = []
    for e in model.point_errors:
        row: dict[str, Any] = {"point": e.point_id.rsplit("/", 1)[-1], "rate_rps": e.rate_rps}
        for key, value in e.error.items():
            row[key] = measured_text(value) if isinstance(value, Unknown) else f"{value:+.1%}"
        rows.append(row)
    return markdown_table(rows)


def model_lines(candidate: CandidateCapacity) -> list[str]:
    """What the fitted model of ``candidate`` rests on: its limits and their sources, what binds
    the capacity, the self-check, and any coefficient raised to its physical floor."""
    model = candidate.serving_model
    if not isinstance(model, ServingModel):
        return []
    check = model.self_check
    lines = [
        f"{candidate.candidate}:",
        f"- limits: {model.limits.describe()}",
        f"- model shape: {model.model_shape}",
        "- self-check: "
        + (
            f"passed ({check.points_checked} point(s) within ±{check.tolerance:.0%}"
            + (f"; worst {check.worst}" if check.worst else "")
            + ")"
            if check.passed
            else f"failed: {check.reason}"
        ),
    ]
    if not isinstance(candidate.binding, Unknown):
        lines.append(f"- what binds: {candidate.binding.description}")
    if candidate.budget_sensitivity:
        lines.append(f"- prefill budget: {candidate.budget_sensitivity}")
    lines += [f"- set to its physical floor: {floored}" for floored in model.floored]
    return lines


def render_text(result: CapacityResult) -> str:
    """What ``enginefit capacity`` prints: the SLO and mix, one sentence per candidate, the
    candidates table and each fitted model's error on its own points."""
    mix = result.mix
    mean = mix.mean_rate_rps
    lines = [
        f"Capacity for workload {result.workload} at {result.slo.describe()}",
        f"Mix: {mix.requests:,} requests, mean prompt {mix.prompt_tokens_mean:,.0f} tokens "
        + (
            "(cached: each candidate's fleet, below)"
            if any(isinstance(c.fleet_cache, FleetCache) for c in result.candidates)
            else f"({mix.cached_prompt_share:.1%} cached)"
        )
        + f", mean output {mix.output_tokens_mean:,.0f}; "
        f"peak {mix.peak_rate_rps:.4g} req/s, mean "
        + (unknown_text(mean) if isinstance(mean, Unknown) else f"{mean:.4g} req/s"),
        *(f"{name}: {text}" for name, text in sorted(result.sources.items())),
        "",
    ]
    if not result.candidates:
        lines.append("No benchmarked deployment to carry to this workload.")
    for candidate in result.candidates:
        lines.append(f"- {candidate.candidate}: {transfer_sentence(candidate)}")
        cache = cache_sentence(candidate)
        if cache:
            lines.append(f"  {cache}")
        if candidate.prediction_check is not None:
            lines.append(f"  {prediction_sentence(candidate.prediction_check)}")
    if result.candidates:
        lines += ["", candidates_table(result)]
    if any(c.sensitivity for c in result.candidates):
        lines += [
            "",
            "How each capacity moves with one input moved (the same requests, the rest held):",
            sensitivity_table(result),
        ]
    for candidate in result.candidates:
        if isinstance(candidate.serving_model, ServingModel):
            lines += [
                "",
                *model_lines(candidate),
                f"Fitted model of {candidate.candidate} against its points "
                "(predicted ÷ measured − 1):",
                model_errors_table(candidate.serving_model),
            ]
    if result.notes:
        lines += ["", "Notes:", *(f"- {note}" for note in result.notes)]
    return "\n".join(lines)
