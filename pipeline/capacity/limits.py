"""A deployment's scheduling limits and where each came from (docs/capacity.md, "limits").

The simulated replica is bounded by the engine's per-step token budget (vLLM
``max_num_batched_tokens``), its running-request limit (``max_num_seqs``) and whether a long
prompt may be split over steps (chunked prefill). Benchmark files rarely say them and teams set
them, so each limit is taken, in order, from:

1. the configuration (``capacity.token_budget`` / ``max_batch`` / ``chunked_prefill``: the
   team's own override, for every deployment);
2. the benchmark manifest's ``engine_args`` (docs/bench.md);
3. what the result file records (SGLang's ``server_info``, vLLM ``--metadata``);
4. the engine catalog's defaults for the engine on that GPU (``pipeline/decision/engines.yaml``,
   ``scheduling``, with their sources): ``default`` when the manifest has an ``engine_args``
   block that leaves the limit out (the deployment was started without it: the engine's
   default is what it ran), else ``catalog`` (an assumption the data can contradict);
5. an assumption said as one (vLLM's H100 defaults), which the fit then checks;

and the token budget may then be replaced by the one the benchmark's p99 ITL shows
(``fitted``, :mod:`pipeline.capacity.fit`). The record keeps the source of each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pipeline.capacity.config import CapacityConfig
from pipeline.unknown import ResultModel

LimitSource = Literal[
    "configuration", "manifest", "result file", "default", "catalog", "fitted", "assumed"
]
#: When nothing states a limit: vLLM's OpenAI-server defaults on an H100 (the most benchmarked
#: deployment), said as an assumption.
ASSUMED_BUDGET = 8192
ASSUMED_MAX_BATCH = 1024
#: KV bytes per element by the engines' ``kv_cache_dtype`` names (``auto``: the model's own).
KV_DTYPE_BYTES = {
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "q8_0": 1.0,
    "fp4": 0.5,
    "nvfp4": 0.5,
    "q4_0": 0.5,
}
#: Weight bytes per parameter by the manifest's ``quantization`` (its words, case ignored).
WEIGHT_BYTES = (
    ("fp4", 0.5),
    ("int4", 0.5),
    ("awq", 0.5),
    ("gptq", 0.5),
    ("w4", 0.5),
    ("q4", 0.5),
    ("fp8", 1.0),
    ("int8", 1.0),
    ("w8", 1.0),
    ("q8", 1.0),
    ("bf16", 2.0),
    ("fp16", 2.0),
    ("float16", 2.0),
    ("bfloat16", 2.0),
)


class Limit(ResultModel):
    """One limit's value and where it came from (``detail``: which file, key or source)."""

    value: bool | int | str | None
    source: LimitSource
    detail: str


class SchedulingLimits(ResultModel):
    """The limits the simulated replica runs with (module docstring)."""

    token_budget: Limit
    max_batch: Limit
    chunked_prefill: Limit
    kv_cache_tokens: Limit  # the benchmarked replica's KV pool (value None: not stated)
    tensor_parallel_size: Limit
    kv_cache_dtype: Limit
    #: The per-step budgets the benchmark's p99 ITL agrees with: (lowest, highest; None: any
    #: larger one); None when the data were not checked.
    budget_range: tuple[int, int | None] | None = None

    @property
    def budget(self) -> int:
        return int(self.token_budget.value or ASSUMED_BUDGET)

    @property
    def batch(self) -> int:
        return int(self.max_batch.value or ASSUMED_MAX_BATCH)

    @property
    def chunked(self) -> bool:
        return self.chunked_prefill.value is not False

    def budget_stated(self) -> bool:
        """The budget comes from the team or the deployment itself, not from an assumption."""
        return self.token_budget.source in ("configuration", "manifest", "result file", "default")

    def with_budget(
        self, budget: int, source: LimitSource, detail: str, budget_range: tuple[int, int | None]
    ) -> SchedulingLimits:
        return self.model_copy(
            update={
                "token_budget": Limit(value=budget, source=source, detail=detail),
                "budget_range": budget_range,
            }
        )

    def moved(self, budget: int | None = None, batch: int | None = None) -> SchedulingLimits:
        """The same limits with the prefill budget and/or the running-request limit set to
        another value (their sources kept): a limit relaxed or moved to see what it does."""
        update = {}
        if budget is not None:
            update["token_budget"] = self.token_budget.model_copy(update={"value": budget})
        if batch is not None:
            update["max_batch"] = self.max_batch.model_copy(update={"value": batch})
        return self.model_copy(update=update)

    def describe(self) -> str:
        """One line: each limit and its source."""
        chunked = "on" if self.chunked else "off"
        return (
            f"prefill budget {self.budget:,} tokens a step ({_said(self.token_budget)}), at most "
            f"{self.batch:,} requests running ({_said(self.max_batch)}), chunked prefill "
            f"{chunked} ({_said(self.chunked_prefill)})"
        )


def _said(limit: Limit) -> str:
    return f"{limit.source}: {limit.detail}" if limit.detail else limit.source


@dataclass(frozen=True)
class EngineDefaults:
    """The engine catalog's defaults for one engine on one GPU, and what they cite."""

    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    detail: str  # the engine, the catalog note's gist and its sources


class SchedulingCatalog(Protocol):
    """Where an engine's scheduling defaults come from (the engine catalog,
    ``pipeline.decision.catalog.Catalog``, given by the caller: the decision reads this stage)."""

    def scheduling_defaults(self, engine: str, gpu_type: str) -> EngineDefaults | None: ...


def _first(
    name: str,
    options: list[tuple[LimitSource, Mapping[str, Any], str]],
    fallback: tuple[Any, LimitSource, str],
) -> Limit:
    for source, values, detail in options:
        if values.get(name) is not None:
            return Limit(value=values[name], source=source, detail=detail)
    value, source, detail = fallback
    return Limit(value=value, source=source, detail=detail)


def resolve_limits(
    *,
    manifest_args: Mapping[str, Any] | None,
    recorded_args: Mapping[str, Any],
    defaults: EngineDefaults | None,
    config: CapacityConfig,
    manifest_file: str | None,
    gpu_count: int,
) -> SchedulingLimits:
    """Each limit from the first source that states it (module docstring). ``manifest_args``
    None: the manifest has no ``engine_args`` block; {}: it has one that overrides nothing."""
    team = {
        "max_num_batched_tokens": config.token_budget,
        "max_num_seqs": config.max_batch,
        "enable_chunked_prefill": config.chunked_prefill,
    }
    catalog: dict[str, Any] = (
        {
            "max_num_batched_tokens": defaults.max_num_batched_tokens,
            "max_num_seqs": defaults.max_num_seqs,
            "enable_chunked_prefill": defaults.enable_chunked_prefill,
        }
        if defaults is not None
        else {}
    )
    where = f"engine_args in {manifest_file}" if manifest_file else "engine_args"
    started_with_defaults = manifest_args is not None
    options: list[tuple[LimitSource, Mapping[str, Any], str]] = [
        ("configuration", team, "capacity section"),
        ("manifest", manifest_args or {}, where),
        ("result file", recorded_args, "the server arguments the result file records"),
        (
            "default" if started_with_defaults else "catalog",
            catalog,
            (f"the engine's default ({where} leaves it out); " if started_with_defaults else "")
            + (defaults.detail if defaults else ""),
        ),
    ]
    unstated = "nothing states it and the engine catalog has no default for this engine"
    return SchedulingLimits(
        token_budget=_first(
            "max_num_batched_tokens",
            options,
            (ASSUMED_BUDGET, "assumed", f"{unstated}: vLLM's H100 default assumed"),
        ),
        max_batch=_first(
            "max_num_seqs",
            options,
            (ASSUMED_MAX_BATCH, "assumed", f"{unstated}: vLLM's H100 default assumed"),
        ),
        chunked_prefill=_first(
            "enable_chunked_prefill", options, (True, "assumed", f"{unstated}: on assumed")
        ),
        kv_cache_tokens=_first(
            "kv_cache_tokens", options[1:3], (None, "assumed", "not stated: unknown")
        ),
        tensor_parallel_size=_first(
            "tensor_parallel_size",
            options[1:3],
            (gpu_count, "assumed", "not stated: every GPU of the replica"),
        ),
        kv_cache_dtype=_first(
            "kv_cache_dtype", options[1:3], ("auto", "assumed", "not stated: the model's own")
        ),
    )


def kv_bytes(limits: SchedulingLimits) -> float | None:
    """Bytes a cached K or V element takes under the deployment's ``kv_cache_dtype`` (None:
    ``auto`` or a name not known, so the model's own width)."""
    return KV_DTYPE_BYTES.get(str(limits.kv_cache_dtype.value).lower())


def weight_bytes(quantization: str | None) -> float | None:
    """Bytes a parameter takes under the manifest's ``quantization`` (None: not said or not
    recognised, so the model's own width)."""
    if not quantization:
        return None
    text = quantization.casefold()
    return next((width for word, width in WEIGHT_BYTES if word in text), None)
