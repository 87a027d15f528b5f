"""The engine catalog: what each engine and each layer above engines is, runs on, supports and
costs to change, with sources (data in ``engines.yaml``, validated here).

The catalog is data, not code: a team points ``decision.catalog`` at its own copy to add or
correct an engine. Loading is strict (:class:`pipeline.settings.Section`): an unknown key, a
missing field, a bad date, a source key that is not defined, or an engine a layer names that
the catalog does not hold is a :class:`~pipeline.errors.ConfigError` naming the file and key.
Engines named elsewhere (requirements, benchmark manifests) are resolved through
:meth:`Catalog.engine_key`, which knows each engine's aliases.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Self, cast, get_args

from pydantic import Field, Strict, ValidationError, model_validator

from pipeline.errors import ConfigError
from pipeline.settings import (
    ConfigDate,
    NonNegative,
    NonNegativeInt,
    PositiveInt,
    Section,
    load_yaml,
    validation_message,
)

HardwareTarget = Literal[
    "nvidia", "amd", "intel-gpu", "cpu", "apple", "tpu", "gaudi", "ascend", "neuron"
]
HardwareSupport = Literal["full", "partial", "plugin"]
Feature = Literal["structured_output", "lora", "tool_calls", "long_context"]
FEATURES: tuple[str, ...] = get_args(Feature)
FeatureLevel = Literal["full", "limited", "unsupported"]
# Where a routing layer runs (and where a team's platform is): Kubernetes, a Ray cluster, or
# plain hosts / VMs without an orchestrator.
Orchestrator = Literal["kubernetes", "ray", "none"]
# The gateway in front of the fleet: a Kubernetes Gateway API implementation with the Gateway API
# Inference Extension (its endpoint picker is where llm-d-style schedulers plug in), another
# HTTP or API gateway, or none.
Gateway = Literal["inference-extension", "other", "none"]
LayerCapability = Literal[
    "prefix_aware_routing", "disaggregation", "autoscaling", "kv_offload", "multi_model"
]
Sources = Annotated[tuple[str, ...], Strict(False)]
Text = Annotated[str, Field(min_length=1)]


class FeatureSupport(Section):
    support: FeatureLevel
    note: str


class PrefixCache(Section):
    mechanism: Text
    block_tokens: PositiveInt | None
    note: Text
    sources: Sources


class ChangeCost(Section):
    """What a model or configuration change costs: ``build_minutes`` of GPU time per build (0
    unless ``kind`` is ``rebuild``) and ``engineer_hours`` of people's time per change."""

    kind: Literal["restart", "rebuild", "load-on-request"]
    build_minutes: NonNegative
    engineer_hours: NonNegative
    estimate: bool
    note: Text
    sources: Sources


class Status(Section):
    state: Literal["active", "maintenance"]
    since: ConfigDate | None
    note: str
    sources: Sources


class Releases(Section):
    count: NonNegativeInt
    estimate: bool
    note: str
    sources: Sources


class Estimate(Section):
    value: NonNegative
    estimate: bool


class SecondaryFigure(Section):
    """A published comparison, always presented as secondary (vendor-authored or second-hand)."""

    claim: Text
    versus: Text
    condition: Text
    margin: float | None
    sources: Sources


class Engine(Section):
    name: Text
    aliases: Sources
    design_bet: Text
    prefix_cache: PrefixCache
    hardware: dict[HardwareTarget, HardwareSupport]
    hardware_sources: Sources
    features: dict[Feature, FeatureSupport]
    feature_sources: Sources
    change: ChangeCost
    front_end: Text
    status: Status
    releases_last_6_months: Releases
    migration_engineer_weeks: Estimate
    choose_for: Text
    secondary_figures: Annotated[tuple[SecondaryFigure, ...], Strict(False)]
    licence: Text
    as_of: ConfigDate
    # docs/decision-rules.md#concurrency: at a peak of 10 or more Ollama is out.
    out_at_peak_concurrency: PositiveInt | None = None

    @model_validator(mode="after")
    def _every_feature_stated(self) -> Self:
        missing = [f for f in FEATURES if f not in self.features]
        if missing:
            raise ValueError(f"features must state every one of {FEATURES}; missing {missing}")
        return self

    def support(self, feature: str) -> FeatureSupport:
        """How this engine supports ``feature`` (one of :data:`FEATURES`)."""
        return self.features[cast(Feature, feature)]

    def runs_on(self, target: str) -> bool:
        return target in self.hardware

    def sources(self) -> set[str]:
        keys = {*self.prefix_cache.sources, *self.hardware_sources, *self.feature_sources}
        keys |= {*self.change.sources, *self.status.sources, *self.releases_last_6_months.sources}
        return keys | {s for figure in self.secondary_figures for s in figure.sources}


class Layer(Section):
    """A router or orchestrator above engines: never ranked against engines."""

    name: Text
    adds: Annotated[tuple[LayerCapability, ...], Strict(False)]
    prefix_routing: Literal["exact", "approximate", "none"]
    engines: Sources
    # Where it runs, and the gateway it plugs into (null: it brings its own front end).
    runs_on: Annotated[tuple[Orchestrator, ...], Strict(False), Field(min_length=1)]
    needs_gateway: Gateway | None
    note: Text
    status: Status
    licence: Text
    sources: Sources
    as_of: ConfigDate


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", name.strip().lower()).strip("-")


class Catalog(Section):
    schema_version: Literal[1]
    as_of: ConfigDate
    sources: dict[str, Text]
    engines: dict[str, Engine]
    layers: dict[str, Layer]

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        for key, engine in self.engines.items():
            unknown = sorted(engine.sources() - set(self.sources))
            if unknown:
                raise ValueError(f"engines.{key} cites undefined sources {unknown}")
            for figure in engine.secondary_figures:
                if figure.versus not in self.engines:
                    raise ValueError(f"engines.{key}: secondary figure versus unknown engine")
        for key, layer in self.layers.items():
            unknown = sorted({*layer.sources, *layer.status.sources} - set(self.sources))
            if unknown:
                raise ValueError(f"layers.{key} cites undefined sources {unknown}")
            strangers = [e for e in layer.engines if e not in self.engines]
            if strangers:
                raise ValueError(f"layers.{key} names engines the catalog lacks: {strangers}")
        seen: dict[str, str] = {}
        for key, engine in self.engines.items():
            for alias in {_normalised(key), *(_normalised(a) for a in engine.aliases)}:
                if seen.setdefault(alias, key) != key:
                    raise ValueError(f"alias {alias!r} names both {seen[alias]} and {key}")
        return self

    def engine_key(self, name: str) -> str | None:
        """The catalog key of an engine named by its key or an alias (case and punctuation
        ignored: ``TensorRT_LLM`` is ``tensorrt-llm``), else None."""
        wanted = _normalised(name)
        for key, engine in self.engines.items():
            if wanted == _normalised(key) or wanted in {_normalised(a) for a in engine.aliases}:
                return key
        return None

    def require_engine(self, name: str, where: str) -> str:
        """:meth:`engine_key`, or an error naming ``where`` (file and key) and the known names."""
        key = self.engine_key(name)
        if key is None:
            raise ConfigError(
                f"{where}: unknown engine {name!r}; the engine catalog knows "
                f"{', '.join(sorted(self.engines))} (add it to your own catalog: decision.catalog)"
            )
        return key


BUNDLED = "engines.yaml"


@cache
def _bundled_text() -> str:
    return resources.files("pipeline.decision").joinpath(BUNDLED).read_text(encoding="utf-8")


def catalog_sha256(path: Path | None = None) -> str:
    """sha256 of the catalog file ``load_catalog(path)`` reads (the record cites it)."""
    data = path.read_bytes() if path is not None else _bundled_text().encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog at ``path``, else the bundled one; strict (see the module docstring)."""
    where = str(path) if path is not None else f"pipeline/decision/{BUNDLED}"
    try:
        text = path.read_text(encoding="utf-8") if path is not None else _bundled_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: engine catalog not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read the engine catalog ({exc})") from exc
    raw = load_yaml(text, where)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the catalog must be a mapping (schema_version, engines, …)")
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, Catalog, where)) from exc
