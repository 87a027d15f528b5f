"""What binds a replica's capacity on a workload (docs/capacity.md, "what binds").

Just above the capacity the replica fails the SLO. Whatever held it back there is tried
relaxed, one limit at a time, in the run that failed: the KV pool doubled (when an arrived
request waited for KV memory), the running-request limit doubled (when one waited for a
slot), the prefill budget doubled (when prompt tokens waited for a step's budget) or halved
(when p99 ITL failed: a step carrying a full budget of prompt tokens is what a decode waits
through). The first relaxation that lets the rate pass names the binding limit. When none does,
the clause that failed does: p99 ITL (the decoding batch's steps are too long) or p95 TTFT /
a growing queue (``ttft_queueing``: the replica does not serve requests as fast as they come).
"""

from __future__ import annotations

from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.result import BindingLimit, ServingModel, Slo
from pipeline.capacity.search import RequestSample, RunStats, run_stats, simulate_at
from pipeline.unknown import Unknown

#: Rates above the capacity tried for the first that fails (the search's bracket is 1 %).
ABOVE = (1.02, 1.1, 1.25)


def _stats(
    model: ServingModel,
    sample: RequestSample,
    rate: float,
    limits: SchedulingLimits,
    kv_tokens: int,
    slo: Slo,
    config: CapacityConfig,
) -> tuple[RunStats, int, int, int]:
    run = simulate_at(model.coefficients, sample, rate, limits=limits, kv_tokens=kv_tokens)
    stats = run_stats(
        run, sample.output, rate, config, slo.ttft_p95_ms, model.coefficients.request_latency_s
    )
    return stats, run.kv_blocked_steps, run.batch_blocked_steps, run.budget_full_steps


def binding_limit(
    model: ServingModel,
    sample: RequestSample,
    capacity_rps: float,
    slo: Slo,
    kv_tokens: int,
    config: CapacityConfig,
) -> BindingLimit | Unknown:
    """The limit binding the capacity ``capacity_rps`` (module docstring)."""
    limits = model.limits
    for factor in ABOVE:
        rate = capacity_rps * factor
        stats, kv_blocked, batch_blocked, budget_full = _stats(
            model, sample, rate, limits, kv_tokens, slo, config
        )
        if not stats.meets(slo):
            break
    else:
        return Unknown(reason=f"every rate up to {ABOVE[-1]:.0%} of the capacity meets the SLO")
    itl = stats.itl_p99_ms if slo.itl_definition == "per-gap" else stats.tpot_p99_ms
    itl_word = "p99 ITL" if slo.itl_definition == "per-gap" else "p99 TPOT"
    itl_fails = itl > slo.itl_p99_ms
    ttft_fails = stats.ttft_p95_ms > slo.ttft_p95_ms or stats.queue_growing
    at = f"at {rate:.3g} req/s"
    budget, batch = limits.budget, limits.batch
    relaxations: list[tuple[BindingLimit, SchedulingLimits, int]] = []
    if kv_blocked:
        relaxations.append(
            (
                BindingLimit(
                    limit="kv_pool",
                    description=f"the KV pool ({kv_tokens:,} tokens a replica) holds arrived "
                    f"requests back {at}; a pool twice as large would meet the SLO",
                ),
                limits,
                kv_tokens * 2,
            )
        )
    if batch_blocked:
        relaxations.append(
            (
                BindingLimit(
                    limit="running_requests",
                    description=f"the running-request limit ({batch:,}) holds arrived requests "
                    f"back {at}; twice the limit would meet the SLO",
                ),
                limits.moved(batch=batch * 2),
                kv_tokens,
            )
        )
    if itl_fails and budget >= 2:
        relaxations.append(
            (
                BindingLimit(
                    limit="prefill_budget",
                    description=f"steps carrying up to {budget:,} prompt tokens push {itl_word} "
                    f"to {itl:,.1f} ms (limit {slo.itl_p99_ms:g}) {at}; half the prefill budget "
                    "would meet the SLO",
                ),
                limits.moved(budget=budget // 2),
                kv_tokens,
            )
        )
    if ttft_fails and budget_full:
        relaxations.append(
            (
                BindingLimit(
                    limit="prefill_budget",
                    description=f"prompts wait for the {budget:,}-token prefill budget: p95 TTFT "
                    f"{stats.ttft_p95_ms:,.0f} ms (limit {slo.ttft_p95_ms:g}) {at}; twice the "
                    "budget would meet the SLO",
                ),
                limits.moved(budget=budget * 2),
                kv_tokens,
            )
        )
    for named, relaxed, pool in relaxations:
        if _stats(model, sample, rate, relaxed, pool, slo, config)[0].meets(slo):
            return named
    if itl_fails and (
        not ttft_fails or itl / slo.itl_p99_ms >= stats.ttft_p95_ms / slo.ttft_p95_ms
    ):
        return BindingLimit(
            limit="itl",
            description=f"the decoding batch's steps push {itl_word} to {itl:,.1f} ms (limit "
            f"{slo.itl_p99_ms:g}) {at}",
        )
    queue = "; the queue grows" if stats.queue_growing else ""
    return BindingLimit(
        limit="ttft_queueing",
        description=f"queueing pushes p95 TTFT to {stats.ttft_p95_ms:,.0f} ms (limit "
        f"{slo.ttft_p95_ms:g}) {at}{queue}",
    )
