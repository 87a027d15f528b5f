"""What prefix-aware routing buys (prompt tokens no longer prefilled, in money) and whether
untrusted tenants need an isolated cache, from the simulation's scenarios and curves.

Routing is judged at the replica count the workload's peak needs (the capacity stage's fleet;
the benchmark's only when the workload's capacity is unknown, and the record says so), and
priced through the fitted serving model (:func:`pipeline.capacity.compute.routing_value`:
prefill GPU time and p95 TTFT saved at that fleet and KV size) when there is one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline.capacity.compute import routing_value as model_routing_value
from pipeline.capacity.compute import workload_requests
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.result import RoutingValue, ServingModel
from pipeline.costing import SECONDS_PER_HOUR, SECONDS_PER_MONTH
from pipeline.decision.catalog import Layer
from pipeline.decision.context import RuleContext, known_plain, plain
from pipeline.decision.evidence import EngineBench
from pipeline.decision.result import Isolation, IsolationAdvice, Routing
from pipeline.present.text import money, quantity
from pipeline.present.text import share as share_words
from pipeline.sim.config import PREFIX_ROUTINGS
from pipeline.sim.present import curve_sampling_brief
from pipeline.sim.result import ScenarioSummary
from pipeline.thresholds import ROUTING_GAIN_MIN
from pipeline.unknown import Unknown, is_known


def routing_value(ctx: RuleContext, engine: str | None, runner_up: str | None = None) -> Routing:
    """What prefix-aware routing saves at the fleet ``engine`` needs, and the layer that adds it
    on the team's platform (``runner_up``: a layer that also serves it keeps a switch cheap)."""
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

    def unknown(reason: str, **update: Any) -> Routing:
        ctx.rule("routing", title, rule_source, None, f"unknown: {reason}")
        return empty.model_copy(update={"reason": f"unknown: {reason}", **update})

    if ctx.requirements.deployment == "local":
        reason = (
            "a local deployment runs one replica on one machine: there is nothing to route between"
        )
        ctx.rule("routing", title, rule_source, False, reason)
        return empty.model_copy(update={"recommended": False, "reason": reason})
    if not multi or capacity is None:
        return unknown(
            ctx.inputs.missing.get("simulation")
            or "no multi-replica scenario simulated (simulation.replicas)"
        )
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
    hits, prompt, method = _hits_at(ctx, multi, replicas, capacity, configured)
    at = [s for s in multi if s.replicas == replicas]
    if not hits or hits.get("round-robin") is None or not prompt:
        unknown_hits = next(
            (s.hit_ratio.reason for s in at if isinstance(s.hit_ratio, Unknown)), None
        )
        reason = unknown_hits or (
            f"no round-robin scenario at {replicas} replicas to compare with (simulation.routings)"
        )
        return unknown(reason, replicas=replicas, method=method)
    saving = _saving(hits, prompt)
    if saving is None:
        return unknown(
            "no prefix-aware routing simulated (add affinity or cache-aware to simulation.routings)",
            replicas=replicas,
            method=method,
        )
    best, share = saving
    # With the fleet unknown, the saving at every simulated replica count bounds what routing
    # is worth: the recommendation stands on the largest count's (a fleet routes between
    # several replicas), with the range said.
    shares = (
        {replicas: share}
        if fleet is not None
        else {
            r: found[1]
            for r in simulated
            if (found := _saving(*_hits_at(ctx, multi, r, capacity, configured)[:2])) is not None
        }
    )
    spread = (min(shares.values()), max(shares.values()))
    worth_from = min((r for r, s in shares.items() if s >= ROUTING_GAIN_MIN), default=None)
    recommended = share >= ROUTING_GAIN_MIN
    choice = _layer(ctx, engine, runner_up) if recommended and engine else None
    layer = choice.layer if choice else None
    round_robin: float = hits["round-robin"]  # type: ignore[assignment]
    priced = _priced(ctx, bench, round_robin / prompt, (round_robin / prompt) + share, capacity)
    if priced is not None:
        value, model_method = priced
        monthly_tokens: float | None = _monthly_tokens(ctx, share)
        monthly_usd: float | None = value.monthly_usd_saved
        money_method = model_method
    else:
        monthly_tokens, monthly_usd, money_method = _routing_money(ctx, engine, share)
        value = None
    tokens_range = [_monthly_tokens(ctx, s) for s in spread] if fleet is None else None
    usd_range = [_routing_money(ctx, engine, s)[1] for s in spread] if fleet is None else None
    reason = (
        f"{best} saves {share:.1%} of prompt tokens from prefill vs round-robin with "
        f"{capacity:,} cache tokens per replica at {at_fleet} (threshold "
        f"{ROUTING_GAIN_MIN:.0%})"
    )
    if fleet is None:
        reason += (
            f"; the fleet size is unknown ({fleet_source}): over the simulated "
            f"{', '.join(str(r) for r in sorted(shares))} replicas it saves "
            f"{_range_words(spread, share_words)} of prompt tokens"
            + (
                f", {_range_words(tokens_range, quantity)} tokens a month"
                if tokens_range and None not in tokens_range
                else ""
            )
            + (
                f" (about {_range_words(usd_range, money)} a month)"
                if usd_range and None not in usd_range
                else ""
            )
            + (
                f", at least {ROUTING_GAIN_MIN:.0%} from {worth_from} replicas on"
                if worth_from is not None
                else ""
            )
        )
    if choice is not None:
        effect = (f"recommend {layer}: " if layer else "recommended; ") + f"{choice.why}; {reason}"
    elif recommended:
        effect = f"recommended (no engine to route for yet); {reason}"
    else:
        effect = f"not worth a routing layer: {reason}"
    ctx.rule(
        "routing",
        title,
        rule_source,
        recommended,
        effect,
        replicas=replicas,
        cache_tokens=capacity,
        hit_tokens=hits,
        prompt_tokens=prompt,
        saved_share=share,
        saved_share_by_replicas={str(r): s for r, s in sorted(shares.items())},
    )
    return Routing(
        recommended=recommended,
        layer=layer,
        alternatives=choice.alternatives if choice else [],
        layer_choice=choice.why if choice else None,
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
        prompt_tokens_saved_share_range=plain(list(spread)) if fleet is None else None,
        monthly_prompt_tokens_saved_range=plain(tokens_range)
        if tokens_range and None not in tokens_range
        else None,
        monthly_usd_saved_range=plain(usd_range) if usd_range and None not in usd_range else None,
        worth_from_replicas=worth_from if fleet is None else None,
        prefill_gpu_hours_saved_per_month=plain(value.prefill_gpu_hours_saved_per_month)
        if value
        else None,
        ttft_p95_ms_saved=known_plain(value.ttft_p95_ms_saved) if value else None,
    )


def _hits_at(
    ctx: RuleContext,
    multi: list[ScenarioSummary],
    replicas: int,
    capacity: int,
    configured: list[int],
) -> tuple[dict[str, float | None], int | None, str]:
    """Cached prompt tokens per routing at ``replicas`` and ``capacity`` cache tokens a
    replica (the simulated replay when that capacity was simulated, else the one-pass curves),
    the prompt tokens replayed, and how they were found."""
    at = [s for s in multi if s.replicas == replicas]
    prompt = next((s.prompt_tokens for s in at), None)
    if capacity in configured:
        hits: dict[str, float | None] = {
            s.routing: s.hit_tokens if is_known(s.hit_tokens) else None
            for s in at
            if s.cache_tokens == capacity and not s.tenant_isolation
        }
        return hits, prompt, "simulated replay at that capacity (request lifetimes as configured)"
    sampled = curve_sampling_brief(ctx.inputs.curves) if ctx.inputs.curves is not None else None
    return (
        _curve_hits(ctx.inputs.curves, replicas, capacity),
        prompt,
        "one-pass capacity curves at that capacity (instant lifetime; cache-aware not curved)"
        + (f", {sampled}" if sampled else ""),
    )


def _saving(hits: dict[str, float | None], prompt: int | None) -> tuple[str, float] | None:
    """The best prefix-aware routing and the share of prompt tokens it saves from prefill
    against round-robin; None when either is not known."""
    round_robin = hits.get("round-robin")
    known = {r: h for r, h in hits.items() if h is not None and r in PREFIX_ROUTINGS}
    if round_robin is None or not prompt or not known:
        return None
    best = max(sorted(known), key=lambda r: known[r])
    return best, (known[best] - round_robin) / prompt


def _monthly_tokens(ctx: RuleContext, share: float) -> float | None:
    w = ctx.workload
    if w.mean_rate_rps is None or w.prompt_mean is None:
        return None
    return share * w.mean_rate_rps * w.prompt_mean * SECONDS_PER_MONTH


def _range_words(
    bounds: list[float | None] | tuple[float, float] | None, form: Callable[[float], str]
) -> str:
    """``low–high`` written by ``form`` (one figure when they are equal)."""
    assert bounds is not None
    low, high = (form(b) for b in bounds if b is not None)
    return low if low == high else f"{low}–{high}"


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
    tokens = _monthly_tokens(ctx, share)
    if tokens is None:
        return None, None, "money unknown: no workload rate or prompt lengths"
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
    return tokens, tokens * seconds_per_token / SECONDS_PER_HOUR * price, method


@dataclass(frozen=True)
class LayerChoice:
    """The routing layer chosen for the team's platform (None: not chosen), the others that
    fit, and why, or what to set to choose."""

    layer: str | None
    alternatives: list[str]
    why: str


def _where(layer: Layer, engine: str | None = None) -> str:
    places = " or ".join(ORCHESTRATOR_WORDS[o] for o in layer.runs_on)
    gateway = f", behind {GATEWAY_WORDS[layer.needs_gateway]}" if layer.needs_gateway else ""
    caveat = f"; {layer.engine_notes[engine]}" if engine in layer.engine_notes else ""
    return f"{layer.name} ({layer.prefix_routing} prefix routing; on {places}{gateway}{caveat})"


def _layer(ctx: RuleContext, engine: str, runner_up: str | None) -> LayerChoice:
    """The active catalog layer that adds prefix-aware routing for ``engine`` on the team's
    platform (requirements.platform): one that runs on its orchestrator and plugs into its
    gateway where it needs one; then one using the gateway the team already runs, exact
    (KV-event-driven, as simulated) before approximate, and one that also serves the runner-up
    (a later switch keeps its router). With the platform unknown, or a tie, none is chosen:
    the fitting layers are listed and the record says what to set."""
    fits = [
        (key, layer)
        for key, layer in ctx.catalog.layers.items()
        if engine in layer.engines
        and "prefix_aware_routing" in layer.adds
        and layer.status.state == "active"
    ]
    # A layer serving the engine only with a caveat (early development) comes after the
    # layers that serve it fully, then exact (KV-event-driven) before approximate.
    fits.sort(key=lambda kv: (engine in kv[1].engine_notes, kv[1].prefix_routing != "exact"))
    name = ctx.name(engine)
    if not fits:
        return LayerChoice(None, [], f"no routing layer in the catalog adds it to {name}")
    listed = "; ".join(_where(layer, engine) for _, layer in fits)
    platform = ctx.requirements.platform
    if platform.orchestrator is None:
        return LayerChoice(
            None,
            [k for k, _ in fits],
            "the layer depends on your platform: set requirements.platform (orchestrator, "
            f"gateway) to choose among {listed}",
        )
    on = [(k, layer) for k, layer in fits if platform.orchestrator in layer.runs_on]
    where = ORCHESTRATOR_WORDS[platform.orchestrator]
    if not on:
        return LayerChoice(
            None, [k for k, _ in fits], f"no layer for {name} runs on {where}: {listed}"
        )
    if platform.gateway is None and any(layer.needs_gateway for _, layer in on):
        return LayerChoice(
            None,
            [k for k, _ in on],
            "whether a layer can use your gateway decides: set requirements.platform.gateway "
            f"to choose among {'; '.join(_where(layer, engine) for _, layer in on)}",
        )
    usable = [(k, layer) for k, layer in on if layer.needs_gateway in (None, platform.gateway)]
    if not usable:
        return LayerChoice(
            None,
            [k for k, _ in on],
            f"the layers for {name} on {where} need a gateway you do not run "
            f"(requirements.platform.gateway: {platform.gateway}): {listed}",
        )

    def rank(layer: Layer) -> tuple[bool, bool, bool, bool]:
        return (
            engine in layer.engine_notes,
            layer.needs_gateway is None,
            layer.prefix_routing != "exact",
            runner_up is not None and runner_up not in layer.engines,
        )

    usable.sort(key=lambda kv: rank(kv[1]))
    key, best = usable[0]
    rest = [k for k, _ in usable[1:]]
    equal = [layer for _, layer in usable if rank(layer) == rank(best)]
    if len(equal) > 1:
        return LayerChoice(
            None,
            [k for k, _ in usable],
            f"{' and '.join(layer.name for layer in equal)} fit your platform equally "
            f"({'; '.join(_where(layer, engine) for layer in equal)}): choose between them",
        )
    why = [f"runs on {where}"]
    if best.needs_gateway:
        why.append(f"plugs into your gateway ({GATEWAY_WORDS[best.needs_gateway]})")
    if best.prefix_routing == "exact":
        why.append("routes on the engines' KV events (exact, as simulated)")
    if runner_up is not None and runner_up in best.engines:
        why.append(f"also serves {ctx.name(runner_up)}, so a switch keeps the router")
    if engine in best.engine_notes:
        why.append(f"though for {name}: {best.engine_notes[engine]}")
    return LayerChoice(key, rest, f"{best.name} {', '.join(why)}")


ORCHESTRATOR_WORDS = {"kubernetes": "Kubernetes", "ray": "a Ray cluster", "none": "plain hosts"}
GATEWAY_WORDS = {
    "inference-extension": "a Gateway API Inference Extension gateway",
    "other": "another HTTP gateway",
    "none": "no gateway",
}


ISOLATION_ACTION = (
    "isolate the prefix cache per tenant: a per-request cache salt carrying the tenant, or "
    "separate replicas per tenant"
)


def isolation_advice(
    ctx: RuleContext, engine: str | None, routing: Routing
) -> tuple[Isolation, IsolationAdvice | None]:
    """Whether untrusted tenants need an isolated prefix cache, and what it costs: the hit
    ratios with and without isolation at the replica count nearest the fleet's (the routing
    it would run), priced through the fitted serving model at that fleet, else through the
    benchmark's prompt-token rate (an upper bound). The advice is what the recommendation
    carries (None: no isolation needed, or whether is unknown)."""
    untrusted = ctx.requirements.untrusted_tenants
    cross = ctx.workload.cross_tenant_share
    title = "Untrusted tenants and a shared prefix cache"
    source = "docs/decision-rules.md#isolation"
    bench = ctx.benches.get(engine) if engine else None
    fleet = bench.replicas_at_peak if bench else None
    ran = routing.routing if routing.recommended else "round-robin"
    shared, isolated, replicas = _isolation_hit_ratios(
        ctx.inputs.scenarios or [], fleet, ran, _kv_tokens(ctx)
    )
    common = {
        "cross_tenant_share_of_hits": cross,
        "hit_ratio_shared": shared,
        "hit_ratio_isolated": isolated,
        "replicas": replicas,
        "fleet_replicas": fleet,
    }
    if untrusted is None:
        reason = "unknown: set requirements.untrusted_tenants"
        ctx.rule("isolation", title, source, None, reason)
        return Isolation(recommended=None, reason=reason, **plain(common)), None
    if not untrusted:
        ctx.rule(
            "isolation", title, source, False, "tenants are trusted: one shared cache", **common
        )
        return Isolation(recommended=False, reason="tenants are trusted", **plain(common)), None
    if cross is not None and cross <= 0:
        ctx.rule(
            "isolation",
            title,
            source,
            False,
            "no prefix is reused across tenants: isolation costs nothing and changes nothing",
            **common,
        )
        return Isolation(recommended=False, reason="no cross-tenant reuse", **plain(common)), None
    at = _replicas_words(replicas, fleet)
    if shared is None or isolated is None:
        cost = "hit-rate cost unknown: " + (
            "the trace logs no tenants or no prompt content"
            if cross is None
            else "set simulation.compare_isolation: true to replay with and without isolation"
        )
    else:
        cost = f"hit ratio {shared:.1%} shared vs {isolated:.1%} isolated at {at}"
    money: dict[str, Any] = {}
    if shared is not None and isolated is not None and shared >= isolated:
        money = _isolation_money(ctx, bench, engine, shared, isolated)
        usd = money.get("monthly_usd_cost")
        cost += (
            f"; about ${usd:,.0f} a month of prefill" if usd is not None else f"; {money['method']}"
        )
    if cross is None:
        reason = f"tenants are untrusted but the trace does not log tenants (or has no content): isolate to be safe ({cost})"
        ctx.rule("isolation", title, source, None, reason, **common, **money)
    else:
        reason = f"{cross:.1%} of cache hits cross tenants: {ISOLATION_ACTION} ({cost})"
        ctx.rule("isolation", title, source, True, reason, **common, **money)
    isolation = Isolation(
        recommended=True, reason=reason, action=ISOLATION_ACTION, **plain(common), **plain(money)
    )
    advice = IsolationAdvice(
        action=ISOLATION_ACTION,
        replicas=replicas,
        hit_ratio_shared=isolation.hit_ratio_shared,
        hit_ratio_isolated=isolation.hit_ratio_isolated,
        monthly_usd_cost=isolation.monthly_usd_cost,
        cost=cost,
    )
    return isolation, advice


def _replicas_words(replicas: int | None, fleet: int | None) -> str:
    if replicas is None:
        return "an unknown replica count"
    count = f"{replicas} replica{'s' if replicas != 1 else ''}"
    if fleet is None:
        return f"{count} (the largest simulated; the fleet size is unknown)"
    return (
        count if fleet == replicas else f"{count}, the simulated count nearest the fleet's {fleet}"
    )


def _isolation_money(
    ctx: RuleContext, bench: EngineBench | None, engine: str | None, shared: float, isolated: float
) -> dict[str, Any]:
    """The prefill isolation adds a month: through the fitted serving model at the fleet's
    replica count when there is one, else the benchmark's prompt-token rate (an upper bound)."""
    priced = _priced(ctx, bench, isolated, shared, _kv_tokens(ctx))
    if priced is not None:
        value, method = priced
        return {
            "monthly_usd_cost": value.monthly_usd_saved,
            "ttft_p95_ms_cost": known_plain(value.ttft_p95_ms_saved),
            "method": method,
        }
    _, usd, method = _routing_money(ctx, engine, shared - isolated)
    return {"monthly_usd_cost": usd, "method": method}


def _kv_tokens(ctx: RuleContext) -> int | None:
    kv = ctx.requirements.kv_cache
    if kv is not None:
        return kv.tokens_per_replica()
    configured = sorted({s.cache_tokens for s in ctx.inputs.scenarios or []})
    return configured[-1] if configured else None


def _isolation_hit_ratios(
    scenarios: list[ScenarioSummary], fleet: int | None, routing: str | None, kv: int | None
) -> tuple[float | None, float | None, int | None]:
    """Hit ratios of the same scenario with and without tenant isolation, when simulated, and
    its replica count: the one nearest the fleet (several when the fleet has several; the
    largest when the fleet is unknown), at
    the cache size of a replica (else the largest simulated) and ``routing`` (else
    round-robin, else any)."""

    def key(s: ScenarioSummary) -> tuple[int, int, int, str]:
        return (s.replicas, s.cache_tokens, s.block_size, s.routing)

    def ratio(s: ScenarioSummary) -> float | None:
        return s.hit_ratio if is_known(s.hit_ratio) else None

    shared = {key(s): ratio(s) for s in scenarios if not s.tenant_isolation}
    isolated = {key(s): ratio(s) for s in scenarios if s.tenant_isolation}
    common = set(shared) & set(isolated)
    if not common:
        return None, None, None
    counts = sorted({k[0] for k in common})
    if fleet and fleet > 1:
        # A fleet of several replicas routes between them: one replica is not like it.
        counts = [c for c in counts if c > 1] or counts
    replicas = min(counts, key=lambda r: (abs(r - fleet), -r)) if fleet else counts[-1]
    common = {k for k in common if k[0] == replicas}
    sizes = sorted({k[1] for k in common})
    size = kv if kv in sizes else sizes[-1]
    common = {k for k in common if k[1] == size}
    routings = {k[3] for k in common}
    chosen = next((r for r in (routing, "round-robin") if r in routings), min(routings))
    k = max(k for k in common if k[3] == chosen)
    return shared[k], isolated[k], replicas
