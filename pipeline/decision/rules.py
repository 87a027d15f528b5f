"""The decision tree's rules in the order of docs/decision-rules.md (hardware, CUDA, local,
maintenance, features, concurrency, SLO, model churn, prefix sharing). Each excludes engines with
a reason, points the tree at engines (``ctx.branch``), and leaves one rationale entry: applied,
did not apply, or unknown with what to supply."""

from __future__ import annotations

from typing import Any

from pipeline.decision.catalog import cuda_major
from pipeline.decision.context import RuleContext, current_engine
from pipeline.decision.evidence import missing_features
from pipeline.present.text import quantity
from pipeline.thresholds import (
    CONCURRENCY_HIGH_MIN,
    CONCURRENCY_LOW_MAX,
    DATACENTER_WEIGHT_BITS,
    DATACENTER_WEIGHT_BYTES,
    HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH,
    PREFIX_HEAVY_SHARE,
    PREFIX_LIGHT_SHARE,
    TRT_MAX_CHANGES_PER_QUARTER,
    TRT_MAX_MODELS,
)

LOCAL_HARDWARE = {"cpu", "apple"}
LOCAL_ENGINES = ("llama.cpp", "ollama")


def uncovered(ctx: RuleContext, engine: str) -> list[str]:
    """The team's hardware ``engine`` does not run on (empty: all of it, or none is set)."""
    spec = ctx.catalog.engines[engine]
    return [t for t in ctx.requirements.hardware if not spec.runs_on(t)]


def hardware(ctx: RuleContext) -> None:
    wanted = ctx.requirements.hardware
    if not wanted:
        ctx.rule(
            "hardware",
            "Hardware the engine must run on",
            "docs/decision-rules.md#hardware",
            None,
            "unknown: set requirements.hardware (no engine excluded on hardware)",
        )
        return
    one_engine = ctx.requirements.one_engine_across_fleet
    excluded, partial = [], []
    for engine in ctx.states:
        spec = ctx.catalog.engines[engine]
        lacking = uncovered(ctx, engine)
        covered = [t for t in wanted if t not in lacking]
        if not covered:
            ctx.exclude(
                engine,
                f"hardware: runs on {', '.join(sorted(spec.hardware))}; none of your "
                f"hardware ({', '.join(wanted)})",
            )
            excluded.append(engine)
            continue
        if lacking:
            partial.append(engine)
            if one_engine:
                ctx.exclude(
                    engine,
                    f"hardware: runs on {', '.join(covered)} but not {', '.join(lacking)}, and "
                    "one engine must serve the whole fleet (requirements.one_engine_across_fleet)",
                )
                excluded.append(engine)
                continue
            ctx.states[engine].notes.append(
                f"serves only the {', '.join(covered)} part of the fleet "
                "(requirements.one_engine_across_fleet: false): costed on that hardware (its "
                "benchmark's); its fleet and monthly figures assume it carries the whole "
                "workload, the traffic's split across hardware not being an input; the "
                f"{', '.join(lacking)} part needs another engine"
            )
        weak = [
            spec.hardware_words(t)
            for t in covered
            if spec.hardware[t] != "full" or t in spec.hardware_notes
        ]
        if weak:
            ctx.states[engine].notes.append(f"support not first-class on {', '.join(weak)}")
    effect = f"excluded {', '.join(excluded)}" if excluded else "every engine runs on some of it"
    if partial and not one_engine:
        effect += (
            f"; {', '.join(partial)} run on only part of the fleet and stay in for that part "
            "(requirements.one_engine_across_fleet: false)"
        )
    ctx.rule(
        "hardware",
        "Hardware the engine must run on",
        "docs/decision-rules.md#hardware",
        bool(excluded),
        effect,
        hardware=list(wanted),
        one_engine_across_fleet=one_engine,
        excluded=excluded,
        partial_fleet=partial,
    )


def cuda(ctx: RuleContext) -> None:
    """The CUDA release each engine's latest version is built for, against the one the team's
    NVIDIA fleet runs (requirements.cuda_version). Compared by major release: CUDA's
    minor-version compatibility runs any 12.x build on any CUDA 12 driver."""
    title = "CUDA release the engine's current version needs"
    source = "docs/decision-rules.md#cuda"
    wanted = ctx.requirements.cuda_version
    hardware = ctx.requirements.hardware
    if hardware and "nvidia" not in hardware:
        ctx.rule("cuda", title, source, False, "no NVIDIA hardware: CUDA does not apply")
        return
    needs = {
        engine: ctx.catalog.engines[engine].current_cuda()
        for engine in ctx.states
        if ctx.catalog.engines[engine].runs_on("nvidia")
    }
    evidence: dict[str, Any] = {
        "cuda_version": wanted,
        "min_cuda": {e: n.min_cuda if n else None for e, n in needs.items()},
    }
    if wanted is None:
        ctx.rule(
            "cuda",
            title,
            source,
            None,
            "unknown: set requirements.cuda_version (the CUDA release your NVIDIA drivers "
            "support) to check each engine's builds against it",
            **evidence,
        )
        return
    excluded = []
    for engine, need in needs.items():
        if need is None or cuda_major(need.min_cuda) <= cuda_major(wanted):
            continue
        spec = ctx.catalog.engines[engine]
        driver = f", driver {need.min_driver} or later" if need.min_driver else ""
        ctx.exclude(
            engine,
            f"cuda: {spec.name} {spec.releases_last_6_months.latest} needs CUDA "
            f"{need.min_cuda}{driver} (from {need.since_version} on: {need.note}); your NVIDIA "
            f"fleet runs CUDA {wanted}: no current {spec.name}",
        )
        excluded.append(engine)
    unstated = sorted(e for e, need in needs.items() if need is None)
    effect = (
        f"excluded {', '.join(excluded)} (their current releases need a newer CUDA than {wanted})"
        if excluded
        else f"every engine's current release runs on CUDA {wanted}"
    )
    if unstated:
        effect += f"; the catalog states no CUDA requirement for {', '.join(unstated)}"
    ctx.rule("cuda", title, source, bool(excluded), effect, **evidence, excluded=excluded)


def is_local(ctx: RuleContext) -> bool | None:
    """A laptop, CPU, Apple or edge deployment (None: neither deployment nor hardware set)."""
    req = ctx.requirements
    if req.deployment is None and not req.hardware:
        return None
    return req.deployment == "local" or (bool(req.hardware) and set(req.hardware) <= LOCAL_HARDWARE)


def local(ctx: RuleContext) -> None:
    req = ctx.requirements
    local = is_local(ctx)
    if local is None:
        ctx.rule(
            "local",
            "Laptop, CPU, Apple or edge",
            "docs/decision-rules.md#local",
            None,
            "unknown: set requirements.deployment (datacenter or local) or requirements.hardware",
        )
        return
    if local:
        ctx.point(
            LOCAL_ENGINES,
            "a laptop, CPU, Apple or edge deployment ends at llama.cpp (Ollama runs its server)",
        )
    ctx.rule(
        "local",
        "Laptop, CPU, Apple or edge",
        "docs/decision-rules.md#local",
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
        "docs/decision-rules.md#maintenance",
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
            "docs/decision-rules.md#features",
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
        "docs/decision-rules.md#features",
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
    source = "docs/decision-rules.md#concurrency"
    if peak is None:
        reason = ctx.workload.unknown.get("shape", "no workload shape")
        ctx.rule("concurrency", title, source, None, f"unknown: {reason}")
        return
    label = " (estimated from a latency model)" if ctx.workload.concurrency_estimated else ""
    evidence = {"peak_concurrency": peak, "estimated": ctx.workload.concurrency_estimated}
    if peak <= low:
        _low_concurrency(ctx, f"peak {peak:g}{label} ≤ {low:g}", title, source, evidence)
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


def _low_concurrency(
    ctx: RuleContext, peak: str, title: str, source: str, evidence: dict[str, Any]
) -> None:
    """Little to batch points to llama.cpp / Ollama only where they are the better tool: local
    hardware (CPU, Apple, edge) or weights that fit the GPUs only narrower than
    ``DATACENTER_WEIGHT_BITS`` (FP8 and INT8 every datacenter engine serves); on datacenter GPUs
    that hold the weights that wide or wider, vLLM and SGLang serve one user well."""
    bits = f"{DATACENTER_WEIGHT_BITS} bits"
    local = is_local(ctx)
    kv = ctx.requirements.kv_cache
    fits = (
        None
        if kv is None
        else kv.weights_gib_per_gpu(DATACENTER_WEIGHT_BYTES) < (kv.usable_gib_per_gpu())
    )
    evidence = {**evidence, "local": local, "weights_fit_at_8_bits": fits}
    why = None
    if local:
        why = "on local hardware"
    elif kv is not None and not fits:
        at_8_bits = kv.weights_gib_per_gpu(DATACENTER_WEIGHT_BYTES)
        evidence |= {"weights_gib_per_gpu_at_8_bits": at_8_bits}
        why = (
            f"with weights that fit only below {bits} ({kv.model_params_billion:g}B parameters "
            f"at {bits} take {at_8_bits:.1f} GiB per GPU of {kv.usable_gib_per_gpu():.1f} GiB "
            "usable: requirements.kv_cache)"
        )
    if why is not None:
        ctx.point(LOCAL_ENGINES, f"{peak} {why} leads to llama.cpp / Ollama")
        effect = f"{peak} {why}: little to batch, look hard at llama.cpp / Ollama"
        ctx.rule("concurrency", title, source, True, effect, **evidence)
        return
    if local is False and fits:
        effect = (
            f"{peak} on datacenter GPUs that hold the weights at {bits} or wider: vLLM and SGLang "
            "serve one user well, so low concurrency alone does not point to llama.cpp / Ollama"
        )
        ctx.rule("concurrency", title, source, False, effect, **evidence)
        return
    missing = [
        *(["requirements.deployment or requirements.hardware"] if local is None else []),
        *([f"requirements.kv_cache (do the weights fit at {bits}?)"] if kv is None else []),
    ]
    effect = (
        f"unknown: {peak}; whether that points to llama.cpp / Ollama depends on the hardware and "
        f"on whether the weights fit only below {bits}: set {' and '.join(missing)}"
    )
    ctx.rule("concurrency", title, source, None, effect, **evidence)


def slo(ctx: RuleContext) -> None:
    source = "docs/decision-rules.md#slo"
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
    source = "docs/decision-rules.md#model-churn"
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
    trt = ctx.catalog.engines.get("tensorrt-llm")
    evidence["tensorrt_llm_change"] = trt.change.kind if trt else "unknown"
    if changes is not None and changes > TRT_MAX_CHANGES_PER_QUARTER:
        # A change restarts TensorRT-LLM like any engine (no build since its TensorRT backend
        # was removed), but a new architecture runs on it only once it implements it: churn
        # keeps the branch for stable models.
        fails.append(
            f"models change {changes:g} times a quarter (stable: ≤ "
            f"{TRT_MAX_CHANGES_PER_QUARTER:g}), and a model of a new architecture runs on "
            "TensorRT-LLM only once it implements it"
        )
    if volume is not None and volume < HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH:
        fails.append(f"{quantity(volume)} output tokens a month is not huge volume")
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
    ctx.point(
        ("tensorrt-llm",),
        "one or two stable models on one fixed NVIDIA SKU at huge volume lead to TensorRT-LLM",
    )
    ctx.rule(
        "model_churn",
        title,
        source,
        True,
        "TensorRT-LLM first, weighed against its model-change cost (cost rule)",
        **evidence,
    )


def _note_change_costs(ctx: RuleContext) -> None:
    """What a benchmarked engine's evidence and change cost leave out: a benchmark run on a
    backend the engine has since removed (it describes a deployment that can no longer be
    built), and the optional steps of a change (a quantisation step, support lag for a new
    architecture), said but not charged."""
    for engine, bench in ctx.benches.items():
        spec = ctx.catalog.engines[engine]
        if engine not in ctx.states:
            continue
        removed = spec.removed_backends.get(bench.backend or "")
        if removed is not None:
            ctx.states[engine].notes.append(
                f"its benchmark ran on the {bench.backend} backend, which no longer exists: "
                f"{removed.note} ({removed.since.isoformat()}); re-benchmark on "
                f"{removed.replaced_by}"
            )
        for step in spec.change.optional_steps:
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
    source = "docs/decision-rules.md#prefix-sharing"
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
        ctx.point(
            ("sglang", "vllm"),
            f"with {share:.0%} of requests sharing their first {window} tokens (more than "
            f"{PREFIX_HEAVY_SHARE:.0%}) it leads to SGLang, built around a radix prefix cache, "
            "then vLLM",
        )
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
    """Published SGLang-vs-vLLM figures from the catalog, marked secondary, estimates marked so
    (docs/decision-rules.md#published-margins)."""
    spec = ctx.catalog.engines.get("sglang")
    if spec is None:
        return {}
    return {f.condition: f.shown() for f in spec.secondary_figures if f.versus == "vllm"}


def tails(ctx: RuleContext) -> None:
    """The length tails (docs/decision-rules.md#tails): informative, they favour no engine here (every
    datacenter engine batches continuously and can chunk prefill; TensorRT-LLM's is off by
    default, which the features rule notes when long context is required)."""
    found = ctx.workload.tail_findings
    ctx.rule(
        "tails",
        "Length tails",
        "docs/decision-rules.md#tails",
        bool(found) if ctx.workload.prompt_p50 is not None else None,
        "; ".join(found) if found else "no long tail in prompt or output lengths",
        prompt_p50=ctx.workload.prompt_p50,
        prompt_p99=ctx.workload.prompt_p99,
        output_p50=ctx.workload.output_p50,
        output_p99=ctx.workload.output_p99,
    )


def default(ctx: RuleContext) -> None:
    share = ctx.workload.prefix_share
    sharing = (
        "prefix sharing is unknown"
        if share is None
        else f"{share:.0%} of requests share their first {ctx.workload.prefix_window_tokens} "
        f"tokens, not above {PREFIX_HEAVY_SHARE:.0%}"
    )
    ctx.point(
        ("vllm", "sglang"),
        f"without heavy prefix sharing ({sharing}) it ends at vLLM, SGLang's radix cache having "
        "little to reuse",
    )


RULES = (
    hardware,
    cuda,
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
