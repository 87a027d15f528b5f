"""What prefix-aware routing buys (prompt tokens no longer prefilled, in money) and whether
untrusted tenants need an isolated cache, from the simulation's scenarios and curves.

Routing is judged at the replica count the workload's peak needs (the capacity stage's fleet;
the benchmark's only when the workload's capacity is unknown, and the record says so), and
priced through the fitted serving model (:func:`pipeline.capacity.compute.routing_value`:
prefill GPU time and p95 TTFT saved at that fleet and KV size) when there is one."""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.capacity.compute import routing_value as model_routing_value
from pipeline.capacity.compute import workload_requests
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.result import RoutingValue, ServingModel
from pipeline.decision.config import ROUTING_GAIN_MIN
from pipeline.decision.context import RuleContext, plain
from pipeline.decision.evidence import SECONDS_PER_MONTH, EngineBench
from pipeline.decision.result import Isolation, Routing
from pipeline.sim.result import ScenarioSummary
from pipeline.unknown import Unknown, is_known

PREFIX_ROUTINGS = ("cache-aware", "affinity", "bounded-affinity")


def routing_value(ctx: RuleContext, engine: str | None) -> Routing:
    scenarios = ctx.inputs.scenarios or []
    method = ""
    kv = ctx.requirements.kv_cache
    configured = sorted({s.cache_tokens for s in scenarios})
    if kv is not None:
        capacity: int | None = kv.tokens_per_replica()
        source = f"requirements.kv_cache: {capacity:,} tokens per replica (docs/decision-rules.md#kv-cache-sizing)"
    elif configured:
        capacity = configured[-1]
        source = f"simulation.cache_tokens (the largest configured, {capacity:,}); set requirements.kv_cache to size it from the hardware"
    else:
        capacity = None
        source = "unknown: no simulation"
    multi = [s for s in scenarios if s.replicas > 1]
    empty = Routing(
        recommended=None,
        layer=None,
        alternatives=[],
        routing=None,
        replicas=None,
        cache_tokens_per_replica=capacity,
        cache_tokens_source=source,
        prompt_tokens_saved_share=None,
        monthly_prompt_tokens_saved=None,
        monthly_usd_saved=None,
        method="",
        reason="",
    )
    title = "Prefix-aware routing"
    rule_source = "docs/decision-rules.md#routing-layer"
    if not multi or capacity is None:
        reason = (
            ctx.inputs.missing.get("simulation")
            or "no multi-replica scenario simulated (simulation.replicas)"
        )
        ctx.rule("routing", title, rule_source, None, f"unknown: {reason}")
        return empty.model_copy(update={"reason": f"unknown: {reason}"})
    bench = ctx.benches.get(engine) if engine else None
    fleet = bench.replicas_at_peak if bench else None
    fleet_source = _fleet_source(bench)
    empty = empty.model_copy(update={"fleet_replicas": fleet, "fleet_source": fleet_source})
    if fleet == 1:
        whose = "the workload's" if bench and bench.cost_basis == "workload" else "the benchmarked"
        reason = (
            f"one replica serves the workload's peak in {whose} fleet: there is nothing to route "
            "between (worth revisiting when the fleet grows)"
        )
        ctx.rule("routing", title, rule_source, False, reason, fleet_replicas_at_peak=fleet)
        return empty.model_copy(update={"recommended": False, "replicas": 1, "reason": reason})
    simulated = sorted({s.replicas for s in multi})
    # The simulated replica count nearest the fleet the recommendation would run (the largest
    # simulated when the fleet is unknown).
    replicas = min(simulated, key=lambda r: (abs(r - fleet), -r)) if fleet else simulated[-1]
    at_fleet = (
        f"the fleet's {fleet} replicas"
        if fleet == replicas
        else f"{replicas} replicas, the simulated count nearest the fleet's {fleet}"
        if fleet
        else f"{replicas} replicas (the largest simulated; the fleet size is unknown)"
    )
    at = [s for s in multi if s.replicas == replicas]
    hits: dict[str, float | None] = {}
    if capacity in configured:
        method = "simulated replay at that capacity (request lifetimes as configured)"
        for s in at:
            if s.cache_tokens == capacity and not s.tenant_isolation:
                hits[s.routing] = s.hit_tokens if is_known(s.hit_tokens) else None
        prompt = next((s.prompt_tokens for s in at), None)
    else:
        method = (
            "one-pass capacity curves at that capacity (instant lifetime; cache-aware not curved)"
        )
        prompt = next((s.prompt_tokens for s in at), None)
        hits = _curve_hits(ctx.inputs.curves, replicas, capacity)
    if not hits or hits.get("round-robin") is None or not prompt:
        unknown = next((s.hit_ratio.reason for s in at if isinstance(s.hit_ratio, Unknown)), None)
        reason = unknown or (
            f"no round-robin scenario at {replicas} replicas to compare with (simulation.routings)"
        )
        ctx.rule("routing", title, rule_source, None, f"unknown: {reason}")
        return empty.model_copy(
            update={"replicas": replicas, "reason": f"unknown: {reason}", "method": method}
        )
    known = {r: h for r, h in hits.items() if h is not None and r in PREFIX_ROUTINGS}
    if not known:
        reason = (
            "no prefix-aware routing simulated (add affinity or cache-aware to simulation.routings)"
        )
        ctx.rule("routing", title, rule_source, None, f"unknown: {reason}")
        return empty.model_copy(
            update={"replicas": replicas, "reason": f"unknown: {reason}", "method": method}
        )
    best = max(sorted(known), key=lambda r: known[r])
    round_robin: float = hits["round-robin"]  # type: ignore[assignment]
    share = (known[best] - round_robin) / prompt
    recommended = share >= ROUTING_GAIN_MIN
    layer, alternatives = _layer(ctx, engine) if recommended and engine else (None, [])
    priced = _priced(ctx, bench, round_robin / prompt, known[best] / prompt, capacity)
    if priced is not None:
        value, model_method = priced
        monthly_tokens: float | None = (
            share
            * (ctx.workload.mean_rate_rps or 0.0)
            * (ctx.workload.prompt_mean or 0.0)
            * SECONDS_PER_MONTH
        )
        monthly_usd: float | None = value.monthly_usd_saved
        money_method = model_method
    else:
        monthly_tokens, monthly_usd, money_method = _routing_money(ctx, engine, share)
        value = None
    reason = (
        f"{best} saves {share:.1%} of prompt tokens from prefill vs round-robin with "
        f"{capacity:,} cache tokens per replica at {at_fleet} (threshold "
        f"{ROUTING_GAIN_MIN:.0%})"
    )
    ctx.rule(
        "routing",
        title,
        rule_source,
        recommended,
        (
            f"recommend {layer}: "
            if layer
            else (
                "recommended, but no routing layer in the catalog serves this engine: "
                if recommended
                else "not worth a routing layer: "
            )
        )
        + reason,
        replicas=replicas,
        cache_tokens=capacity,
        hit_tokens=hits,
        prompt_tokens=prompt,
        saved_share=share,
    )
    return Routing(
        recommended=recommended,
        layer=layer,
        alternatives=alternatives,
        routing=best,
        replicas=replicas,
        cache_tokens_per_replica=capacity,
        cache_tokens_source=source,
        prompt_tokens_saved_share=plain(share),
        monthly_prompt_tokens_saved=plain(monthly_tokens),
        monthly_usd_saved=plain(monthly_usd),
        method=f"{method}; {money_method}",
        reason=reason,
        fleet_replicas=fleet,
        fleet_source=fleet_source,
        prefill_gpu_hours_saved_per_month=plain(value.prefill_gpu_hours_saved_per_month)
        if value
        else None,
        ttft_p95_ms_saved=_plain_known(value.ttft_p95_ms_saved) if value else None,
    )


def _plain_known(value: float | Unknown) -> float | None:
    return None if isinstance(value, Unknown) else plain(value)


def _fleet_source(bench: EngineBench | None) -> str:
    if bench is None:
        return "unknown: the recommended engine has no benchmark"
    if bench.replicas_at_peak is None:
        return "unknown: no fleet size for the recommended engine"
    if bench.cost_basis == "workload":
        return (
            f"{bench.replicas_at_peak} at the workload's peak from its own capacity, "
            f"{bench.capacity_rps:.3g} req/s per replica (capacity stage)"
        )
    return (
        f"{bench.replicas_at_peak} at the workload's peak from the benchmark's req/s: this "
        "workload's capacity is unknown"
    )


def _model_inputs(
    ctx: RuleContext, bench: EngineBench | None
) -> tuple[ServingModel, float, CapacityConfig] | None:
    """The fitted model, $/GPU-hour and capacity settings routing is priced with, when the
    capacity stage has them for this engine and the requests' lengths were read."""
    found = bench.capacity if bench else None
    cost = bench.workload_cost if bench else None
    result = ctx.inputs.capacity
    if (
        found is None
        or cost is None
        or result is None
        or ctx.inputs.lengths is None
        or ctx.workload.mean_rate_rps is None
        or ctx.workload.peak_rate_rps is None
        or not isinstance(found.serving_model, ServingModel)
    ):
        return None
    return found.serving_model, cost.gpu_hour_usd, CapacityConfig.model_validate(result.settings)


def _priced(
    ctx: RuleContext,
    bench: EngineBench | None,
    worse: float,
    better: float,
    kv_tokens: int | None,
) -> tuple[RoutingValue, str] | None:
    """Two cached-token shares priced through the fitted model at the fleet's replica count
    (prefill GPU time a month at the mean rate, p95 TTFT at the peak)."""
    inputs = _model_inputs(ctx, bench)
    if inputs is None or bench is None or kv_tokens is None or ctx.inputs.capacity is None:
        return None
    model, price, config = inputs
    assert ctx.inputs.lengths is not None and bench.replicas_at_peak is not None
    high = min(max(better, 0.0), 0.99)
    value = model_routing_value(
        model,
        workload_requests(ctx.inputs.lengths),
        cached_share_worse=min(max(worse, 0.0), high),
        cached_share_better=high,
        replicas=bench.replicas_at_peak,
        rate_rps=ctx.workload.peak_rate_rps or 0.0,
        mean_rate_rps=ctx.workload.mean_rate_rps or 0.0,
        gpu_hour_usd=price,
        kv_tokens=kv_tokens,
        slo=ctx.inputs.capacity.slo,
        config=config,
    )
    ttft = value.ttft_p95_ms_saved
    method = (
        f"through the fitted serving model at {bench.replicas_at_peak} replicas: prefill only "
        f"({value.formula})"
        + (f"; p95 TTFT {ttft:,.0f} ms lower at the peak" if isinstance(ttft, float) else "")
    )
    return value, method


def _curve_hits(
    curves: pl.DataFrame | None, replicas: int, capacity: int
) -> dict[str, float | None]:
    if curves is None or curves.is_empty():
        return {}
    rows = curves.filter((pl.col("replicas") == replicas) & (pl.col("cache_tokens") <= capacity))
    block = rows.get_column("block_size").min() if rows.height else None
    rows = rows.filter(pl.col("block_size") == block)
    best = rows.group_by("routing").agg(pl.col("hit_tokens").max()).sort("routing")
    return {r: (float(h) if h is not None else None) for r, h in best.iter_rows()}


def _routing_money(
    ctx: RuleContext, engine: str | None, share: float
) -> tuple[float | None, float | None, str]:
    w = ctx.workload
    if w.mean_rate_rps is None or w.prompt_mean is None:
        return None, None, "money unknown: no workload rate or prompt lengths"
    tokens = share * w.mean_rate_rps * w.prompt_mean * SECONDS_PER_MONTH
    bench = ctx.benches.get(engine) if engine else None
    if bench is None or bench.gpu_hour_usd is None or bench.gpu_count is None:
        return (
            tokens,
            None,
            "money unknown: the recommended engine has no benchmark with a GPU price",
        )
    gpus, price = bench.gpu_count, bench.gpu_hour_usd
    if bench.input_tokens_per_s is not None:
        seconds_per_token = gpus / bench.input_tokens_per_s
        method = (
            f"saved prompt tokens a month ÷ the benchmark's sustained prompt-token rate at its SLO "
            f"capacity ({bench.input_tokens_per_s:,.0f} tokens/s on {gpus} GPU) × ${price:g}/GPU-hour "
            "(an upper bound: every GPU-second at that point is counted as prefill)"
        )
    elif bench.ttft_per_prompt_token_ms is not None:
        seconds_per_token = bench.ttft_per_prompt_token_ms / 1000 * gpus
        method = (
            f"saved prompt tokens a month × fitted TTFT per prompt token "
            f"{bench.ttft_per_prompt_token_ms:.4g} ms × {gpus} GPU × ${price:g}/GPU-hour (an upper "
            "bound: prefill is batched, so a token costs at most its share of the TTFT)"
        )
    else:
        return tokens, None, "money unknown: no prompt-token rate or TTFT fit in the benchmark"
    return tokens, tokens * seconds_per_token / 3600 * price, method


def _layer(ctx: RuleContext, engine: str) -> tuple[str | None, list[str]]:
    """The first active catalog layer that adds prefix-aware routing for ``engine``, exact
    (KV-event-driven, as simulated) before approximate; the rest as alternatives."""
    fits = [
        (key, layer)
        for key, layer in ctx.catalog.layers.items()
        if engine in layer.engines
        and "prefix_aware_routing" in layer.adds
        and layer.status.state == "active"
    ]
    fits.sort(key=lambda kv: kv[1].prefix_routing != "exact")
    names = [key for key, _ in fits]
    return (names[0] if names else None), names[1:]


def isolation_advice(ctx: RuleContext, engine: str | None = None) -> Isolation:
    untrusted = ctx.requirements.untrusted_tenants
    cross = ctx.workload.cross_tenant_share
    title = "Untrusted tenants and a shared prefix cache"
    source = "docs/decision-rules.md#isolation"
    shared, isolated = _isolation_hit_ratios(ctx.inputs.scenarios or [])
    common = {
        "cross_tenant_share_of_hits": cross,
        "hit_ratio_shared": shared,
        "hit_ratio_isolated": isolated,
    }
    if untrusted is None:
        reason = "unknown: set requirements.untrusted_tenants"
        ctx.rule("isolation", title, source, None, reason)
        return Isolation(recommended=None, reason=reason, **plain(common))
    if not untrusted:
        ctx.rule(
            "isolation", title, source, False, "tenants are trusted: one shared cache", **common
        )
        return Isolation(recommended=False, reason="tenants are trusted", **plain(common))
    if cross is None:
        reason = "tenants are untrusted but the trace does not log tenants (or has no content): isolate to be safe; the cost is unknown"
        ctx.rule("isolation", title, source, None, reason, **common)
        return Isolation(recommended=True, reason=reason, **plain(common))
    if cross <= 0:
        ctx.rule(
            "isolation",
            title,
            source,
            False,
            "no prefix is reused across tenants: isolation costs nothing and changes nothing",
            **common,
        )
        return Isolation(recommended=False, reason="no cross-tenant reuse", **plain(common))
    cost = (
        f"hit ratio {shared:.1%} shared vs {isolated:.1%} isolated"
        if shared is not None and isolated is not None
        else "hit-rate cost unknown: set simulation.compare_isolation: true to replay with and without isolation"
    )
    priced: tuple[RoutingValue, str] | None = None
    if shared is not None and isolated is not None and shared >= isolated:
        bench = ctx.benches.get(engine) if engine else None
        priced = _priced(ctx, bench, isolated, shared, _kv_tokens(ctx))
    money: dict[str, Any] = {}
    if priced is not None:
        value, method = priced
        cost += f"; isolation costs about ${value.monthly_usd_saved:,.0f} a month of prefill"
        money = {
            "monthly_usd_cost": plain(value.monthly_usd_saved),
            "ttft_p95_ms_cost": _plain_known(value.ttft_p95_ms_saved),
            "method": method,
        }
    reason = f"{cross:.1%} of cache hits cross tenants: use a per-tenant cache salt or isolation ({cost})"
    ctx.rule("isolation", title, source, True, reason, **common, **money)
    return Isolation(recommended=True, reason=reason, **plain(common), **money)


def _kv_tokens(ctx: RuleContext) -> int | None:
    kv = ctx.requirements.kv_cache
    if kv is not None:
        return kv.tokens_per_replica()
    configured = sorted({s.cache_tokens for s in ctx.inputs.scenarios or []})
    return configured[-1] if configured else None


def _isolation_hit_ratios(
    scenarios: list[ScenarioSummary],
) -> tuple[float | None, float | None]:
    """Hit ratios of the same scenario with and without tenant isolation, when simulated."""

    def key(s: ScenarioSummary) -> tuple[int, int, int, str]:
        return (s.block_size, s.replicas, s.cache_tokens, s.routing)

    def ratio(s: ScenarioSummary) -> float | None:
        return s.hit_ratio if is_known(s.hit_ratio) else None

    shared = {key(s): ratio(s) for s in scenarios if not s.tenant_isolation}
    isolated = {key(s): ratio(s) for s in scenarios if s.tenant_isolation}
    common = sorted(set(shared) & set(isolated))
    if not common:
        return None, None
    k = common[-1]
    return shared[k], isolated[k]
