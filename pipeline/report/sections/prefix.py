"""Section 4, prefix sharing, cache and routing: how much prompts share, what each simulated
cache and routing would hit, what prefix-aware routing buys and whether tenants need isolating."""

from __future__ import annotations

from pipeline.prefix.present import estimate_note
from pipeline.present.text import UNKNOWN, money, number, share
from pipeline.report.sections.content import Figure, ReportContent, figures
from pipeline.sim.result import ScenarioSummary
from pipeline.unknown import ResultModel, is_known

NO_CONTENT = (
    "The traces carry request lengths but no prompt content (nor prefix hashes), so how much "
    "prompts share, what a prefix cache would hit and what routing would buy cannot be measured "
    "here: they are unknown, not zero. A trace with prompt token ids or hashed prompt blocks "
    "answers them."
)


class SimulatedScenario(ResultModel):
    replicas: int
    routing: str
    cache: str
    hit: str
    imbalance: str


class RoutingValue(ResultModel):
    reason: str
    layer: str | None
    capacity: str
    money: str | None
    method: str


class Prefix(ResultModel):
    classification: str
    shape: str
    reuse: str
    scenarios: list[SimulatedScenario]
    routing: RoutingValue
    isolation: str
    no_content: str | None  # without prompt content there is no curve: say so, no empty axes
    figures: list[Figure]
    curve_note: str | None = None  # a sampled capacity curve's rate and error
    estimate_note: str | None = None  # a sampled prefix curve's or reuse share's rate and error
    shed_note: str | None = None  # the scenarios whose replicas could not carry the traffic


def shed_note(ordered: list[ScenarioSummary]) -> str | None:
    """Which scenarios shed requests (an overloaded replica's, past the request timeout), so a
    reader knows their hit ratio is the served traffic's."""
    shed = [s for s in ordered if s.shed_requests]
    if not shed:
        return None
    where = "; ".join(
        f"{s.replicas} replica(s), {s.routing}, {number(s.cache_tokens, unit='tokens')}: "
        f"{number(s.shed_requests)} of {number(s.requests)} ({share(s.shed_requests / s.requests)})"
        for s in shed
    )
    return (
        "Some simulated fleets cannot carry this traffic: requests their overloaded replica "
        "would have finished later than the request timeout (simulation.request_timeout_s) "
        "after they arrived are shed, and their prompt tokens count as not cached. Shed: "
        f"{where}."
    )


def prefix(inputs: ReportContent) -> Prefix:
    found = inputs.prefix
    ordered = sorted(
        inputs.scenarios, key=lambda s: (s.replicas, s.cache_tokens, s.routing, s.tenant_isolation)
    )
    routing = inputs.record.routing
    content_free = found is None or found.block_size is None
    return Prefix(
        classification=found.classification.reason if found else UNKNOWN,
        shape=found.classification.shape if found else UNKNOWN,
        reuse=share(found.reuse.hit_share if found else None),
        scenarios=[
            SimulatedScenario(
                replicas=s.replicas,
                routing=s.routing + (" (isolated)" if s.tenant_isolation else ""),
                cache=number(s.cache_tokens, unit="tokens"),
                hit=share(s.hit_ratio if is_known(s.hit_ratio) else None),
                imbalance=number(s.prefill_imbalance, 2),
            )
            for s in ordered
        ],
        routing=RoutingValue(
            reason=routing.reason or UNKNOWN,
            layer=routing.layer and inputs.catalog.layers[routing.layer].name,
            capacity=routing.cache_tokens_source,
            money=f"about {number(routing.monthly_prompt_tokens_saved)} prompt tokens a month no "
            f"longer prefilled, worth up to {money(routing.monthly_usd_saved)} a month"
            if routing.monthly_usd_saved is not None
            else None,
            method=routing.method,
        ),
        isolation=inputs.record.isolation.reason,
        no_content=NO_CONTENT if content_free else None,
        figures=[] if content_free else figures(inputs, ("prefix_curve", "hit_ratio", "imbalance")),
        curve_note=None if content_free else inputs.curve_note,
        estimate_note=estimate_note(found) if found is not None and not content_free else None,
        shed_note=None if content_free else shed_note(ordered),
    )
