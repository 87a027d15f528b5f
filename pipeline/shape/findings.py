"""Place a workload on the decision's axes (docs/shape.md, "Findings thresholds"), each finding
with the numbers behind it.

Rules (thresholds: constants of :mod:`pipeline.thresholds`, or the ``shape`` config section):

* **concurrency** — peak concurrency ≤ ``CONCURRENCY_LOW_MAX``: ``concurrency.low`` (little
  to batch; llama.cpp / Ollama territory); ≥ ``CONCURRENCY_HIGH_MIN``: ``concurrency.high``
  (vLLM / SGLang; Ollama is out); otherwise ``concurrency.moderate``. Estimated when the sweep
  used the latency model.
* **output tail** — p99/p50 of output tokens ≥ ``long_tail_ratio`` ("p99 ≫ p50"):
  ``output_tail.long`` (continuous batching is not optional: head-of-line blocking); below it:
  ``output_tail.short``; no output logged: ``output_tail.unknown``.
* **prompt tail** — p99/p50 of prompt tokens ≥ ``long_tail_ratio``: ``prompt_tail.long``
  (long-context scheduling / chunked prefill is the bottleneck, not the engine); else
  ``prompt_tail.short``.
* **features** — ``features.seen`` lists the required features in use (structured output,
  tools, LoRA adapters, prompts ≥ ``LONG_CONTEXT_TOKENS``) with their shares; ``features.none``
  otherwise. Flags the trace does not log are named as not logged.
* **data caveats** — ``timestamps.quantised`` when arrivals are bucketed; ``arrivals.bursty``
  when the inter-arrival CV or the index of dispersion at the finest supported window is
  ≥ ``BURSTY`` (Poisson gives 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.shape.config import ShapeConfig
from pipeline.thresholds import (
    BURSTY,
    CONCURRENCY_HIGH_MIN,
    CONCURRENCY_LOW_MAX,
    LONG_CONTEXT_TOKENS,
    tokens_k,
)


@dataclass(frozen=True)
class Finding:
    axis: str
    id: str
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)
    estimated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _concurrency(conc: dict[str, Any], cfg: ShapeConfig) -> Finding:
    peak = conc["peak"]
    est = bool(conc["estimated"])
    numbers: dict[str, Any] = {
        "peak_concurrency": peak,
        "mean_concurrency": conc.get("mean"),
        "low_max": CONCURRENCY_LOW_MAX,
        "high_min": CONCURRENCY_HIGH_MIN,
    }
    if est:
        numbers["latency_model"] = conc.get("latency_model")
    qual = " (estimated from the latency model)" if est else ""
    if peak <= CONCURRENCY_LOW_MAX:
        return Finding(
            "concurrency",
            "concurrency.low",
            f"Peak concurrency {peak}{qual} ≤ {CONCURRENCY_LOW_MAX:g}: little to batch; "
            "look hard at llama.cpp / Ollama.",
            numbers,
            est,
        )
    if peak >= CONCURRENCY_HIGH_MIN:
        return Finding(
            "concurrency",
            "concurrency.high",
            f"Peak concurrency {peak}{qual} ≥ {CONCURRENCY_HIGH_MIN:g}: vLLM or SGLang; "
            "Ollama is out.",
            numbers,
            est,
        )
    return Finding(
        "concurrency",
        "concurrency.moderate",
        f"Peak concurrency {peak}{qual} is between {CONCURRENCY_LOW_MAX:g} and "
        f"{CONCURRENCY_HIGH_MIN:g}: some batching; benchmark both a server engine and "
        "llama.cpp.",
        numbers,
        est,
    )


def _tail(name: str, dist: dict[str, Any], cfg: ShapeConfig) -> Finding:
    axis = f"{name}_tail"
    ratio = dist.get("p99_over_p50")
    numbers = {
        "p50": dist.get("p50"),
        "p99": dist.get("p99"),
        "max": dist.get("max"),
        "p99_over_p50": ratio,
        "threshold": cfg.long_tail_ratio,
    }
    if dist.get("count", 0) == 0:
        return Finding(
            axis, f"{axis}.unknown", f"{name.capitalize()} tokens are not logged.", numbers
        )
    p50, p99 = dist["p50"], dist["p99"]
    long_tail = (ratio is None and p99 > 0) or (ratio is not None and ratio >= cfg.long_tail_ratio)
    shown = "∞" if ratio is None else f"{ratio:.1f}"
    if not long_tail:
        return Finding(
            axis,
            f"{axis}.short",
            f"{name.capitalize()} p99/p50 = {shown} ({p99:g}/{p50:g}) < {cfg.long_tail_ratio:g}: "
            "no long tail.",
            numbers,
        )
    consequence = (
        "continuous batching is not optional (head-of-line blocking)."
        if name == "output"
        else "long-context scheduling (chunked prefill) is the bottleneck, not the engine."
    )
    return Finding(
        axis,
        f"{axis}.long",
        f"{name.capitalize()} p99/p50 = {shown} ({p99:g}/{p50:g}) ≥ {cfg.long_tail_ratio:g}: "
        f"{consequence}",
        numbers,
    )


def _arrivals(arrivals: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    quant = arrivals["quantisation"]
    unsupported = sorted(k for k, v in arrivals["windows"].items() if not v["supported"])
    if quant["quantised"]:
        out.append(
            Finding(
                "data",
                "timestamps.quantised",
                f"Arrival timestamps are bucketed to ~{quant['quantum_s']:g} s "
                f"({quant['distinct_timestamps']:,} distinct values); inter-arrival CV and "
                f"{', '.join(unsupported) or 'no'} windows are not reported.",
                {
                    "quantum_s": quant["quantum_s"],
                    "distinct_timestamps": quant["distinct_timestamps"],
                    "tie_share": quant["tie_share"],
                    "unsupported_windows": unsupported,
                },
            )
        )
    cv = arrivals["inter_arrival"].get("cv")
    supported = [v for v in arrivals["windows"].values() if v["supported"]]
    finest = min(supported, key=lambda v: v["window_s"]) if supported else None
    iod = finest["index_of_dispersion"] if finest else None
    if (cv is not None and cv >= BURSTY) or (iod is not None and iod >= BURSTY):
        evidence = []
        if cv is not None:
            evidence.append(f"inter-arrival CV {cv:.2f}")
        if finest is not None:
            evidence.append(f"index of dispersion {iod:.1f} at {finest['window_s']:g} s")
        out.append(
            Finding(
                "concurrency",
                "arrivals.bursty",
                f"Arrivals are clearly burstier than Poisson ({'; '.join(evidence)}; "
                f"threshold {BURSTY:g}): size for the peak rate, not the mean.",
                {
                    "inter_arrival_cv": cv,
                    "index_of_dispersion": iod,
                    "window_s": finest["window_s"] if finest else None,
                    "threshold": BURSTY,
                    "mean_rate_rps": arrivals.get("mean_rate_rps"),
                    "peak_rate_rps": finest.get("peak_rate_rps") if finest else None,
                },
            )
        )
    return out


def _features(shape: dict[str, Any]) -> Finding:
    """Which required features the traffic uses (structured output, LoRA, long context,
    tools), with shares; a feature the trace cannot log is reported as unknown."""
    f = shape.get("features", {})
    long_context = f"long_context_{tokens_k(LONG_CONTEXT_TOKENS)}_share"
    long_ctx = shape["lengths"].get("long_context", {}).get(f">={LONG_CONTEXT_TOKENS}", {})
    numbers: dict[str, Any] = {
        "structured_output_share": f.get("structured_output", {}).get("share_of_logged"),
        "tools_share": f.get("tools", {}).get("share_of_logged"),
        "lora_adapter_share": f.get("lora_adapter", {}).get("share"),
        "lora_adapters": f.get("lora_adapter", {}).get("distinct_adapters"),
        long_context: long_ctx.get("share"),
    }
    labels = {
        "structured_output_share": "structured output",
        "tools_share": "tools",
        "lora_adapter_share": "LoRA adapters",
        long_context: f"prompts ≥ {tokens_k(LONG_CONTEXT_TOKENS)} tokens",
    }
    seen = [f"{labels[k]} {numbers[k]:.1%}" for k in labels if (numbers[k] or 0) > 0]
    unknown = [labels[k] for k in ("structured_output_share", "tools_share") if numbers[k] is None]
    message = ("Features in use: " + ", ".join(seen)) if seen else "No required feature seen"
    if unknown:
        message += f" (not logged: {', '.join(unknown)})"
    return Finding("features", "features.seen" if seen else "features.none", message + ".", numbers)


def place_on_axes(shape: dict[str, Any], cfg: ShapeConfig) -> list[Finding]:
    """Findings for a computed shape (the dict of ``workload_shape.json`` without findings)."""
    return [
        _concurrency(shape["concurrency"], cfg),
        _tail("output", shape["lengths"]["output_tokens"], cfg),
        _tail("prompt", shape["lengths"]["prompt_tokens"], cfg),
        _features(shape),
        *_arrivals(shape["arrivals"]),
    ]
