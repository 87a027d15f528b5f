"""Pure predicates over a shape result; each returns the list of problems (empty = pass)."""

from __future__ import annotations

from typing import Any

LATENCY_KEYS = ("ttft_base_ms", "ttft_per_prompt_token_ms", "tpot_ms", "source")


def estimates_labelled(shape: dict[str, Any]) -> list[str]:
    """Every estimated concurrency figure carries its latency model and says so."""
    c = shape["concurrency"]
    if not c["estimated"]:
        if c["durations_estimated"] or c["latency_model"] is not None:
            return ["concurrency says exact but some durations were estimated"]
        return []
    problems = []
    model = c.get("latency_model") or {}
    missing = [k for k in LATENCY_KEYS if k not in model]
    if missing:
        problems.append(f"estimated concurrency lacks latency-model parameters {missing}")
    if not str(c["label"]).startswith("estimated"):
        problems.append(f"estimated concurrency is labelled {c['label']!r}")
    unlabelled = [
        f["id"]
        for f in shape["findings"]
        if f["axis"] == "concurrency" and f["id"].startswith("concurrency.") and not f["estimated"]
    ]
    if unlabelled:
        problems.append(f"findings {unlabelled} rest on estimated concurrency but are not flagged")
    return problems


def unsupported_have_reasons(shape: dict[str, Any]) -> list[str]:
    """Every statistic the timestamps cannot support says why, and carries no number."""
    a = shape["arrivals"]
    items = {
        **{f"window {k}": v for k, v in a["windows"].items()},
        "inter-arrival": a["inter_arrival"],
    }
    return [
        f"{name}: unsupported without a reason or still carrying numbers"
        for name, item in items.items()
        if not item["supported"]
        and (not item.get("reason") or "peak_rate_rps" in item or "cv" in item)
    ]
