"""Section 2: the SLO, what the team requires (each requirement in words) and the GPU prices."""

from __future__ import annotations

from typing import Any

from pipeline.decision.config import KvCacheSizing
from pipeline.present.text import UNKNOWN, measurement, money, number, share
from pipeline.report.sections.content import ReportContent
from pipeline.unknown import ResultModel

#: Each requirement in words; a key not listed reads as its name with spaces.
REQUIREMENT_LABELS = {
    "deployment": "Where it runs",
    "hardware": "Hardware the fleet has",
    "gpu_types": "GPU types",
    "fixed_sku": "One fixed GPU type for the whole fleet",
    "models": "Models served",
    "model_changes_per_quarter": "Model changes a quarter",
    "features": "Features required",
    "current_engine": "Engine running today",
    "untrusted_tenants": "Tenants who must not share a cache",
    "cost_margin": "Cost gap below which two engines tie",
    "engineer_week_usd": "Cost of an engineer-week",
    "migration_engineer_weeks": "Migration effort (engineer-weeks)",
    "kv_cache": "KV cache per replica",
}


class Requirement(ResultModel):
    key: str
    value: str


class Price(ResultModel):
    gpu: str
    price: str


class Requirements(ResultModel):
    rows: list[Requirement]
    slo: str
    prices: list[Price]


def requirement_value(key: str, value: Any) -> str:
    """A requirement's value (as the record holds it) as a reader says it: yes/no, lists joined,
    money and shares in their units, the KV-cache sizing as one sentence."""
    if value in (None, [], {}):
        return f"{UNKNOWN} (not stated)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "cost_margin":
        return share(float(value), 0)
    if key == "engineer_week_usd":
        return money(float(value))
    if key == "kv_cache" and isinstance(value, dict):
        return (
            f"{measurement(value['model_params_billion'])} B parameters at "
            f"{measurement(value['weight_bytes'])} bytes each, {value['layers']} layers, "
            f"{value['kv_heads']} KV heads of {value['head_dim']}, on "
            f"{value['gpus_per_replica']} × {measurement(value['gpu_memory_gib'])} GiB GPU(s) at "
            f"{share(value['memory_utilization'], 0)} use: "
            f"{number(KvCacheSizing.model_validate(value).tokens_per_replica())} tokens"
        )
    if isinstance(value, dict):
        return ", ".join(f"{k}: {measurement(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(measurement(v) for v in value)
    return measurement(value)


def requirements(inputs: ReportContent) -> Requirements:
    return Requirements(
        rows=[
            Requirement(
                key=REQUIREMENT_LABELS.get(key, key.replace("_", " ").capitalize()),
                value=requirement_value(key, value),
            )
            for key, value in inputs.record.requirements.items()
        ],
        slo=inputs.slo,
        prices=[
            Price(gpu=gpu, price=money(price, 2) + "/GPU-hour")
            for gpu, price in inputs.prices.configured_rows()
        ],
    )
