"""The decision tree's rules in DOMAIN.md's order (hardware, local, maintenance, features,
concurrency, SLO, model churn, prefix sharing). Each excludes engines with a reason, points the
tree at engines (``ctx.branch``), and leaves one rationale entry: applied, did not apply, or
unknown with what to supply."""

from __future__ import annotations

from typing import Any

from pipeline.decision.catalog import ChangeCost
from pipeline.decision.config import (
    HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH,
    PREFIX_HEAVY_SHARE,
    PREFIX_LIGHT_SHARE,
    TRT_MAX_CHANGES_PER_QUARTER,
    TRT_MAX_MODELS,
)
from pipeline.decision.context import RuleContext, current_engine
from pipeline.decision.costing import deployment_backend
from pipeline.decision.evidence import missing_features
from pipeline.shape.config import CONCURRENCY_HIGH_MIN, CONCURRENCY_LOW_MAX

LOCAL_HARDWARE = {"cpu", "apple"}


def hardware(ctx: RuleContext) -> None:
    wanted = ctx.requirements.hardware
    if not wanted:
        ctx.rule(
            "hardware",
            "Hardware the engine must run on",
            "DOMAIN.md decision tree: hardware first",
            None,
            "unknown: set requirements.hardware (no engine excluded on hardware)",
        )
        return
    excluded = []
    for engine in ctx.states:
        spec = ctx.catalog.engines[engine]
        covered = [t for t in wanted if spec.runs_on(t)]
        if not covered:
            ctx.exclude(
                engine,
                f"hardware: runs on {', '.join(sorted(spec.hardware))}; none of your "
                f"hardware ({', '.join(wanted)})",
            )
            excluded.append(engine)
            continue
        lacking = [t for t in wanted if t not in covered]
        weak = [f"{t} ({spec.hardware[t]})" for t in covered if spec.hardware[t] != "full"]
        if lacking:
            ctx.states[engine].notes.append(f"does not run on {', '.join(lacking)}")
        if weak:
            ctx.states[engine].notes.append(f"support not first-class on {', '.join(weak)}")
    ctx.rule(
        "hardware",
        "Hardware the engine must run on",
        "DOMAIN.md decision tree: hardware first; ENGINE_FACTS.md section 1",
        bool(excluded),
        f"excluded {', '.join(excluded)}" if excluded else "every engine runs on some of it",
        hardware=list(wanted),
        excluded=excluded,
    )


def local(ctx: RuleContext) -> None:
    req = ctx.requirements
    local = req.deployment == "local" or (
        bool(req.hardware) and set(req.hardware) <= LOCAL_HARDWARE
    )
    if req.deployment is None and not req.hardware:
        ctx.rule(
            "local",
            "Laptop, CPU, Apple or edge",
            "DOMAIN.md decision tree: laptop/CPU/Apple/edge → llama.cpp",
            None,
            "unknown: set requirements.deployment (datacenter or local) or requirements.hardware",
        )
        return
    if local:
        ctx.branch += ["llama.cpp", "ollama"]
    ctx.rule(
        "local",
        "Laptop, CPU, Apple or edge",
        "DOMAIN.md decision tree: laptop/CPU/Apple/edge → llama.cpp",
        local,
        "llama.cpp first" if local else "datacenter serving: not the llama.cpp branch",
        deployment=req.deployment,
        hardware=list(req.hardware),
    )


def maintenance(ctx: RuleContext) -> None:
    current = current_engine(ctx)
    stopped = [e for e in ctx.states if ctx.catalog.engines[e].status.state == "maintenance"]
    for engine in stopped:
        status = ctx.catalog.engines[engine].status
        since = f" since {status.since.isoformat()}" if status.since else ""
        if engine == current:
            ctx.states[engine].notes.append(
                f"running today, in maintenance mode{since}: keep it running and plan the migration"
            )
        ctx.exclude(engine, f"maintenance mode{since}: not for a new deployment")
    effect = f"excluded {', '.join(stopped)} for a new deployment" if stopped else "none"
    if current in stopped:
        effect += f"; {ctx.name(current)} runs today: keep it running while migrating"
    ctx.rule(
        "maintenance",
        "Engines in maintenance mode",
        "DOMAIN.md: TGI is in maintenance mode, plan a migration to vLLM/SGLang",
        bool(stopped),
        effect,
        maintenance={e: ctx.catalog.engines[e].status.note for e in stopped},
        current_engine=current,
    )


def features(ctx: RuleContext) -> None:
    required = ctx.required
    if not required:
        ctx.rule(
            "features",
            "Required features",
            "DOMAIN.md: required features seen in the traffic",
            False,
            "no feature required (none configured, none seen in the traffic)",
            configured=list(ctx.requirements.features),
            seen=list(ctx.workload.features_seen),
        )
        return
    excluded = []
    for engine in ctx.states:
        spec = ctx.catalog.engines[engine]
        lacking = missing_features(engine, ctx.catalog, required)
        if lacking:
            ctx.exclude(engine, f"features: lacks {', '.join(lacking)}")
            excluded.append(engine)
        for feature in required:
            support = spec.support(feature)
            if support.support == "limited":
                ctx.states[engine].notes.append(f"{feature} limited: {support.note}")
    ctx.rule(
        "features",
        "Required features",
        "DOMAIN.md: required features seen in the traffic",
        bool(excluded),
        f"required {', '.join(required)}"
        + (f"; excluded {', '.join(excluded)}" if excluded else "; every engine supports them"),
        configured=list(ctx.requirements.features),
        seen=list(ctx.workload.features_seen),
        excluded=excluded,
    )


def concurrency(ctx: RuleContext) -> None:
    peak = ctx.workload.peak_concurrency
    low = CONCURRENCY_LOW_MAX
    high = CONCURRENCY_HIGH_MIN
    title = "Peak concurrency"
    source = "DOMAIN.md: peak concurrency ≤ 2 → llama.cpp / Ollama; ≥ 10 → vLLM or SGLang"
    if peak is None:
        reason = ctx.workload.unknown.get("shape", "no workload shape")
        ctx.rule("concurrency", title, source, None, f"unknown: {reason}")
        return
    label = " (estimated from a latency model)" if ctx.workload.concurrency_estimated else ""
    evidence = {"peak_concurrency": peak, "estimated": ctx.workload.concurrency_estimated}
    if peak <= low:
        ctx.branch += [e for e in ("llama.cpp", "ollama") if e not in ctx.branch]
        ctx.rule(
            "concurrency",
            title,
            source,
            True,
            f"peak {peak:g}{label} ≤ {low:g}: little to batch, look hard at llama.cpp / Ollama",
            **evidence,
        )
        return
    out = []
    if peak >= high:
        for engine in ctx.states:
            limit = ctx.catalog.engines[engine].out_at_peak_concurrency
            if limit is not None and peak >= limit:
                ctx.exclude(
                    engine,
                    f"concurrency: out at a peak of {limit} or more; this workload peaks at "
                    f"{peak:g}{' (estimated)' if ctx.workload.concurrency_estimated else ''}",
                )
                out.append(engine)
    ctx.rule(
        "concurrency",
        title,
        source,
        peak >= high,
        f"peak {peak:g}{label} ≥ {high:g}: vLLM or SGLang"
        + (f"; excluded {', '.join(out)}" if out else "")
        if peak >= high
        else f"peak {peak:g}{label} between {low:g} and {high:g}: no engine favoured",
        **evidence,
    )


def slo(ctx: RuleContext) -> None:
    source = "DOMAIN.md: compare cost per 1M tokens at your SLO"
    if not ctx.benches:
        reason = ctx.inputs.missing.get("bench") or "no benchmark results"
        ctx.rule("slo", "SLO met in the benchmark", source, None, f"unknown: {reason}")
        return
    never = [e for e, b in ctx.benches.items() if b.slo_never_met]
    unjudged = [e for e, b in ctx.benches.items() if b.capacity_rps is None and not b.slo_never_met]
    for engine in never:
        ctx.exclude(
            engine, f"slo: never met the SLO in its benchmark ({ctx.benches[engine].candidate})"
        )
    met = [e for e in ctx.benches if e not in never and e not in unjudged]
    parts = [f"excluded {', '.join(never)} (never met it)"] if never else []
    if unjudged:
        parts.append(f"{', '.join(unjudged)}: capacity at the SLO unknown (see the bench findings)")
    if met:
        parts.append(f"{', '.join(met)} met it up to a measured load")
    ctx.rule(
        "slo",
        "SLO met in the benchmark",
        source,
        bool(never),
        "; ".join(parts),
        capacity={e: b.capacity_rps for e, b in ctx.benches.items()},
        capacity_status={e: b.capacity_status for e, b in ctx.benches.items()},
    )


def model_churn(ctx: RuleContext) -> None:
    req = ctx.requirements
    title = "One or two stable models on a fixed NVIDIA fleet at huge volume"
    source = (
        "DOMAIN.md decision tree: model churn → TensorRT-LLM, weigh kernel gain against "
        "rebuild cost"
    )
    models = sorted(set(req.models) | set(ctx.workload.models))
    volume = ctx.workload.output_tokens_per_month
    unknown = []
    if not req.hardware:
        unknown.append("requirements.hardware")
    if req.fixed_sku is None:
        unknown.append("requirements.fixed_sku")
    if req.model_changes_per_quarter is None:
        unknown.append("requirements.model_changes_per_quarter")
    if volume is None:
        unknown.append("the workload's rate and output lengths (shape stage)")
    evidence: dict[str, Any] = {
        "hardware": list(req.hardware),
        "fixed_sku": req.fixed_sku,
        "models": models,
        "model_changes_per_quarter": req.model_changes_per_quarter,
        "output_tokens_per_month": volume,
        "high_volume_output_tokens_per_month": HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH,
    }
    nvidia_only = set(req.hardware) == {"nvidia"}
    fails = []
    if req.hardware and not nvidia_only:
        fails.append("hardware is not NVIDIA only")
    if req.fixed_sku is False:
        fails.append("the fleet is not one fixed SKU")
    if models and len(models) > TRT_MAX_MODELS:
        fails.append(f"{len(models)} models served (> {TRT_MAX_MODELS})")
    changes = req.model_changes_per_quarter
    _note_change_costs(ctx)
    backend, change = _trt_change(ctx)
    evidence["tensorrt_llm_backend"] = backend or "unknown"
    evidence["tensorrt_llm_change"] = change.kind if change else "unknown"
    if changes is not None and changes > TRT_MAX_CHANGES_PER_QUARTER:
        # Churn rules TensorRT-LLM out only where a change rebuilds an engine (its TensorRT
        # backend); on its PyTorch backend a change is a restart, costed like any other.
        if change is None:
            unknown.append(
                "TensorRT-LLM's serving backend (backend: pytorch or tensorrt in its benchmark "
                "manifest; only tensorrt rebuilds an engine per model change)"
            )
        elif change.kind == "rebuild":
            fails.append(
                f"models change {changes:g} times a quarter (stable: ≤ "
                f"{TRT_MAX_CHANGES_PER_QUARTER:g}) and its {backend} backend rebuilds an engine "
                "per change"
            )
    if volume is not None and volume < HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH:
        fails.append(f"{volume:,.0f} output tokens a month is not huge volume")
    if fails:
        ctx.rule(
            "model_churn",
            title,
            source,
            False,
            "not the TensorRT-LLM branch: " + "; ".join(fails),
            **evidence,
        )
        return
    if unknown:
        ctx.rule(
            "model_churn", title, source, None, "unknown: set " + ", ".join(unknown), **evidence
        )
        return
    ctx.branch += [e for e in ("tensorrt-llm",) if e not in ctx.branch]
    ctx.rule(
        "model_churn",
        title,
        source,
        True,
        "TensorRT-LLM first, weighed against its model-change cost"
        + (f" on its {backend} backend" if backend else "")
        + " (cost rule)",
        **evidence,
    )


def _trt_change(ctx: RuleContext) -> tuple[str | None, ChangeCost | None]:
    """TensorRT-LLM's deployment backend (its benchmark manifest's) and what a model change
    costs on it; None for either when it is not known."""
    spec = ctx.catalog.engines.get("tensorrt-llm")
    if spec is None:
        return None, None
    backend = deployment_backend(ctx, "tensorrt-llm")
    return backend, spec.change_cost(backend)


def _note_change_costs(ctx: RuleContext) -> None:
    """What a benchmarked engine's change cost leaves out: unknown when it hangs on a backend
    its manifest does not name (never assumed); the optional steps its backend lists (a
    quantisation step, support lag for a new architecture), said but not charged."""
    for engine, bench in ctx.benches.items():
        spec = ctx.catalog.engines[engine]
        if engine not in ctx.states:
            continue
        change = spec.change_cost(bench.backend)
        if change is None:
            ctx.states[engine].notes.append(
                "model-change cost unknown: its benchmark manifest does not name the serving "
                f"backend ({', '.join(sorted(spec.change_by_backend or {}))}); the server's "
                f"default is {spec.default_backend or 'not stated'}: set backend in the manifest"
            )
            continue
        for step in change.optional_steps:
            figures = [
                f"{value:g} {unit}"
                for value, unit in (
                    (step.gpu_minutes, "GPU-minutes"),
                    (step.engineer_hours, "engineer-hours"),
                )
                if value is not None
            ]
            ctx.states[engine].notes.append(
                f"not charged per model change: {step.what}"
                + (f" ({' and '.join(figures)})" if figures else "")
                + f": {step.note}"
            )


def prefix(ctx: RuleContext) -> None:
    share = ctx.workload.prefix_share
    title = "Shared-prefix ratio"
    source = (
        "DOMAIN.md: shared-prefix ratio > ~50% → benchmark SGLang against vLLM on your traffic; "
        "< ~20% → published SGLang-vs-vLLM margins do not apply"
    )
    if share is None:
        reason = ctx.workload.unknown.get("prefix_share") or ctx.workload.unknown.get(
            "prefix", "no prefix analysis"
        )
        ctx.rule("prefix", title, source, None, f"unknown: {reason}")
        return
    evidence: dict[str, Any] = {
        "shared_prefix_ratio": share,
        "window_tokens": ctx.workload.prefix_window_tokens,
        "curve_shape": ctx.workload.prefix_shape,
    }
    window = ctx.workload.prefix_window_tokens
    reported = _secondary_margins(ctx)
    if reported:
        evidence["reported_margins_secondary"] = reported
    if share > PREFIX_HEAVY_SHARE:
        ctx.branch += [e for e in ("sglang", "vllm") if e not in ctx.branch]
        ctx.rule(
            "prefix",
            title,
            source,
            True,
            f"{share:.0%} of requests share their first {window} tokens (> "
            f"{PREFIX_HEAVY_SHARE:.0%}): SGLang or vLLM plus cache-aware routing; "
            "benchmark both on your traffic (published SGLang margins are secondary and no "
            "substitute)",
            **evidence,
        )
        return
    if share < PREFIX_LIGHT_SHARE and "sglang" in ctx.states:
        ctx.states["sglang"].notes.append(
            f"published margins over vLLM do not apply: only {share:.0%} of requests share their "
            f"first {window} tokens"
        )
    ctx.rule(
        "prefix",
        title,
        source,
        False,
        f"{share:.0%} share their first {window} tokens: "
        + (
            "little sharing, nothing to gain from a radix cache"
            if share < PREFIX_LIGHT_SHARE
            else "moderate sharing"
        ),
        **evidence,
    )


def _secondary_margins(ctx: RuleContext) -> dict[str, str]:
    """SGLang-vs-vLLM figures from the catalog, marked secondary, estimates marked so."""
    spec = ctx.catalog.engines.get("sglang")
    if spec is None:
        return {}
    return {f.condition: f.shown() for f in spec.secondary_figures if f.versus == "vllm"}


def tails(ctx: RuleContext) -> None:
    """DOMAIN.md's length rows: informative, they favour no engine here (every datacenter
    engine batches continuously and chunks prefill)."""
    found = ctx.workload.tail_findings
    ctx.rule(
        "tails",
        "Length tails",
        "DOMAIN.md: p99 output ≫ p50 → continuous batching is not optional; p99 prompt ≫ p50 → "
        "long-context scheduling (chunked prefill) is the bottleneck, not the engine",
        bool(found) if ctx.workload.prompt_p50 is not None else None,
        "; ".join(found) if found else "no long tail in prompt or output lengths",
        prompt_p50=ctx.workload.prompt_p50,
        prompt_p99=ctx.workload.prompt_p99,
        output_p50=ctx.workload.output_p50,
        output_p99=ctx.workload.output_p99,
    )


def default(ctx: RuleContext) -> None:
    ctx.branch += [e for e in ("vllm", "sglang") if e not in ctx.branch]


RULES = (
    hardware,
    local,
    maintenance,
    features,
    concurrency,
    slo,
    model_churn,
    prefix,
    tails,
    default,
)
