"""The engine catalog: what each engine and each layer above engines is, runs on, supports and
costs to change, with sources (data in ``engines.yaml``, validated here).

The catalog is data, not code: a team points ``decision.catalog`` at its own copy to add or
correct an engine. Loading is strict (:class:`pipeline.settings.Section`): an unknown key, a
missing field, a bad date, an evidence date after the catalog's ``as_of``, a source key that is
not defined, or an engine a layer names that the catalog does not hold is a
:class:`~pipeline.errors.ConfigError` naming the file and key. Engines named elsewhere
(requirements, benchmark manifests) are resolved through :meth:`Catalog.engine_key`, which knows
each engine's aliases.

Every fact carries its own ``evidence_date``: the date of the upstream source it rests on, or
``undated`` when that source has no date (a team estimate, a file copy of unknown commit). A
decision's catalog-age trigger reads the oldest dated fact the decision used
(:meth:`Catalog.facts_used`), not the date the catalog was compiled.

A file is read and parsed once per content: loading the same bytes again returns the parsed
catalog (a large team catalog is not parsed again by every command step that needs it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self, cast, get_args

from pydantic import BeforeValidator, Field, PrivateAttr, Strict, ValidationError, model_validator

from pipeline.errors import ConfigError, os_reason
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
Feature = Literal["structured_output", "lora", "tool_calls", "long_context", "speculative_decoding"]
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
UNDATED = "undated"


def _evidence_date(value: Any) -> Any:
    if value == UNDATED:
        return None
    if value is None:
        raise ValueError(f"give the source's date (YYYY-MM-DD) or {UNDATED!r}")
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{value!r} is neither an ISO date (YYYY-MM-DD) nor {UNDATED!r}")


# The date of the upstream source a fact rests on; None (written ``undated``) when the source
# has none. Required on every fact, so an undated fact is said, never assumed current.
EvidenceDate = Annotated[dt.date | None, BeforeValidator(_evidence_date)]


def evidence_text(date: dt.date | None) -> str:
    return UNDATED if date is None else date.isoformat()


class Source(Section):
    """An upstream source: where it is (a URL, with the commit or version read) and its date."""

    cite: Text
    url: Text
    date: EvidenceDate


class FeatureSupport(Section):
    support: FeatureLevel
    note: str
    evidence_date: EvidenceDate


class PrefixCache(Section):
    mechanism: Text
    block_tokens: PositiveInt | None
    note: Text
    sources: Sources
    evidence_date: EvidenceDate


class OptionalStep(Section):
    """A cost some changes carry and others do not (a quantisation step, a wait for support of
    a new architecture): listed beside the change cost and said, never charged by default."""

    what: Text
    gpu_minutes: NonNegative | None
    engineer_hours: NonNegative | None
    note: Text
    sources: Sources
    evidence_date: EvidenceDate


class ChangeCost(Section):
    """What a model or configuration change costs: ``build_minutes`` of GPU time per build (0
    unless ``kind`` is ``rebuild``) and ``engineer_hours`` of people's time per change."""

    kind: Literal["restart", "rebuild", "load-on-request"]
    build_minutes: NonNegative
    engineer_hours: NonNegative
    estimate: bool
    note: Text
    sources: Sources
    evidence_date: EvidenceDate
    optional_steps: Annotated[tuple[OptionalStep, ...], Strict(False)] = ()


class Status(Section):
    state: Literal["active", "maintenance"]
    since: ConfigDate | None
    note: str
    sources: Sources
    evidence_date: EvidenceDate


class Releases(Section):
    count: NonNegativeInt
    estimate: bool
    note: str
    sources: Sources
    evidence_date: EvidenceDate


class Estimate(Section):
    """A figure; ``by_backend`` gives it per serving backend when the backend changes it
    (``value`` then stands when the backend is not known)."""

    value: NonNegative
    estimate: bool
    evidence_date: EvidenceDate
    by_backend: dict[str, NonNegative] | None = None


class SecondaryFigure(Section):
    """A published comparison, always presented as secondary (vendor-authored or second-hand).
    ``estimate``: the margin is the team's reading of such figures, not a published number."""

    claim: Text
    versus: Text
    condition: Text
    margin: float | None
    estimate: bool
    sources: Sources
    evidence_date: EvidenceDate

    def shown(self) -> str:
        """The claim as every output shows it: an estimate says it is one."""
        return f"{self.claim} (estimate: no primary source)" if self.estimate else self.claim


@dataclass(frozen=True)
class Fact:
    """One catalog fact a decision used: its key in the catalog and its evidence date."""

    key: str
    evidence_date: dt.date | None

    def age_days(self, as_of: dt.date) -> int | None:
        return None if self.evidence_date is None else (as_of - self.evidence_date).days


class Engine(Section):
    name: Text
    aliases: Sources
    design_bet: Text
    prefix_cache: PrefixCache
    hardware: dict[HardwareTarget, HardwareSupport]
    hardware_sources: Sources
    hardware_evidence_date: EvidenceDate
    features: dict[Feature, FeatureSupport]
    feature_sources: Sources
    # One change cost, or one per serving backend when the backend decides it (TensorRT-LLM:
    # no engine build on its PyTorch backend, a build per model on its TensorRT one); the
    # deployment's backend is its benchmark manifest's ``backend``, unknown when not given.
    change: ChangeCost | None
    change_by_backend: dict[str, ChangeCost] | None = None
    # The backend the engine's server runs when none is chosen (said, never assumed).
    default_backend: str | None = None
    front_end: Text
    status: Status
    releases_last_6_months: Releases
    migration_engineer_weeks: Estimate
    choose_for: Text
    secondary_figures: Annotated[tuple[SecondaryFigure, ...], Strict(False)]
    licence: Text
    # docs/decision-rules.md#concurrency: at a peak of 10 or more Ollama is out.
    out_at_peak_concurrency: PositiveInt | None = None

    @model_validator(mode="after")
    def _every_feature_stated(self) -> Self:
        missing = [f for f in FEATURES if f not in self.features]
        if missing:
            raise ValueError(f"features must state every one of {FEATURES}; missing {missing}")
        if (self.change is None) == (self.change_by_backend is None):
            raise ValueError("give either change or change_by_backend (one per backend)")
        backends = self.change_by_backend or {}
        if self.default_backend is not None and self.default_backend not in backends:
            raise ValueError(
                f"default_backend {self.default_backend!r} is not one of change_by_backend's "
                f"{sorted(backends)}"
            )
        weeks = self.migration_engineer_weeks.by_backend
        if weeks is not None and set(weeks) != set(backends):
            raise ValueError(
                f"migration_engineer_weeks.by_backend must name change_by_backend's backends "
                f"{sorted(backends)}; got {sorted(weeks)}"
            )
        return self

    def support(self, feature: str) -> FeatureSupport:
        """How this engine supports ``feature`` (one of :data:`FEATURES`)."""
        return self.features[cast(Feature, feature)]

    def runs_on(self, target: str) -> bool:
        return target in self.hardware

    def change_cost(self, backend: str | None) -> ChangeCost | None:
        """The cost of one model change on ``backend``; None when it depends on a backend that
        is not known."""
        if self.change is not None:
            return self.change
        return (self.change_by_backend or {}).get(backend or "")

    def migration_weeks(self, backend: str | None) -> float:
        """Engineer-weeks to migrate to this engine on ``backend`` (the engine's own figure when
        it has none per backend or the backend is not known)."""
        weeks = self.migration_engineer_weeks
        return (weeks.by_backend or {}).get(backend or "", weeks.value)

    def change_summary(self) -> str:
        """What a model change costs, in words (per backend when the backend decides it)."""
        if self.change is not None:
            return self.change.note
        return " ".join(
            f"{name} backend: {change.note}"
            for name, change in sorted((self.change_by_backend or {}).items())
        )

    def _changes(self) -> list[ChangeCost]:
        return [self.change] if self.change else list((self.change_by_backend or {}).values())

    def sources(self) -> set[str]:
        keys = {*self.prefix_cache.sources, *self.hardware_sources, *self.feature_sources}
        keys |= {*self.status.sources, *self.releases_last_6_months.sources}
        for change in self._changes():
            keys |= {*change.sources, *(s for step in change.optional_steps for s in step.sources)}
        return keys | {s for figure in self.secondary_figures for s in figure.sources}

    def facts(self, key: str, features: tuple[str, ...], backend: str | None) -> list[Fact]:
        """The facts of this engine (catalog key ``key``) a decision reads: hardware, status,
        the required ``features``, the change cost on ``backend`` (every backend's when it is
        unknown), release cadence and migration weeks (tie-breaks and payback)."""
        at = f"engines.{key}"
        out = [
            Fact(f"{at}.hardware", self.hardware_evidence_date),
            Fact(f"{at}.status", self.status.evidence_date),
            Fact(f"{at}.releases_last_6_months", self.releases_last_6_months.evidence_date),
            Fact(f"{at}.migration_engineer_weeks", self.migration_engineer_weeks.evidence_date),
        ]
        out += [Fact(f"{at}.features.{f}", self.support(f).evidence_date) for f in features]
        if self.change is not None:
            out.append(Fact(f"{at}.change", self.change.evidence_date))
        else:
            chosen = self.change_cost(backend)
            for name, change in sorted((self.change_by_backend or {}).items()):
                if chosen is None or change is chosen:
                    out.append(Fact(f"{at}.change_by_backend.{name}", change.evidence_date))
        return out

    def dated_facts(self, key: str) -> list[tuple[str, dt.date | None]]:
        """Every dated field of this engine (catalog key ``key``), for validation."""
        at = f"engines.{key}"
        out: list[tuple[str, dt.date | None]] = [
            (f"{at}.prefix_cache.evidence_date", self.prefix_cache.evidence_date),
            (f"{at}.hardware_evidence_date", self.hardware_evidence_date),
            (f"{at}.status.evidence_date", self.status.evidence_date),
            (
                f"{at}.releases_last_6_months.evidence_date",
                self.releases_last_6_months.evidence_date,
            ),
            (
                f"{at}.migration_engineer_weeks.evidence_date",
                self.migration_engineer_weeks.evidence_date,
            ),
        ]
        out += [
            (f"{at}.features.{f}.evidence_date", s.evidence_date) for f, s in self.features.items()
        ]
        changes = (
            {"change": self.change}
            if self.change
            else {f"change_by_backend.{b}": c for b, c in (self.change_by_backend or {}).items()}
        )
        for name, change in changes.items():
            out.append((f"{at}.{name}.evidence_date", change.evidence_date))
            out += [
                (f"{at}.{name}.optional_steps[{i}].evidence_date", step.evidence_date)
                for i, step in enumerate(change.optional_steps)
            ]
        out += [
            (f"{at}.secondary_figures[{i}].evidence_date", figure.evidence_date)
            for i, figure in enumerate(self.secondary_figures)
        ]
        return out


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
    evidence_date: EvidenceDate


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", name.strip().lower()).strip("-")


def _schema_version(value: Any) -> Any:
    if value == 1:
        raise ValueError(
            "a schema 1 catalog has no evidence dates: give every fact an evidence_date (a "
            "date or 'undated'), set schema_version: 2 (see pipeline/decision/engines.yaml)"
        )
    return value


class Catalog(Section):
    schema_version: Annotated[Literal[2], BeforeValidator(_schema_version)]
    # The date the catalog was compiled (reviewed as a whole); each fact's own evidence date
    # is what ages.
    as_of: ConfigDate
    sources: dict[str, Text | Source]
    engines: dict[str, Engine]
    layers: dict[str, Layer]
    # Normalised key or alias → engine key, built once at validation (a lookup per name a
    # benchmark or requirement gives must not scan the catalog).
    _by_name: dict[str, str] = PrivateAttr(default_factory=dict)
    _sha256: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        for key, engine in self.engines.items():
            unknown = sorted(engine.sources() - set(self.sources))
            if unknown:
                raise ValueError(f"engines.{key} cites undefined sources {unknown}")
            for figure in engine.secondary_figures:
                if figure.versus not in self.engines:
                    raise ValueError(f"engines.{key}: secondary figure versus unknown engine")
            for where, date in engine.dated_facts(key):
                self._not_after_as_of(where, date)
        for key, layer in self.layers.items():
            unknown = sorted({*layer.sources, *layer.status.sources} - set(self.sources))
            if unknown:
                raise ValueError(f"layers.{key} cites undefined sources {unknown}")
            strangers = [e for e in layer.engines if e not in self.engines]
            if strangers:
                raise ValueError(f"layers.{key} names engines the catalog lacks: {strangers}")
            self._not_after_as_of(f"layers.{key}.evidence_date", layer.evidence_date)
            self._not_after_as_of(f"layers.{key}.status.evidence_date", layer.status.evidence_date)
        for name, source in self.sources.items():
            if isinstance(source, Source):
                self._not_after_as_of(f"sources.{name}.date", source.date)
        by_name: dict[str, str] = {}
        for key, engine in self.engines.items():
            for alias in {_normalised(key), *(_normalised(a) for a in engine.aliases)}:
                if by_name.setdefault(alias, key) != key:
                    raise ValueError(f"alias {alias!r} names both {by_name[alias]} and {key}")
        self._by_name = by_name
        return self

    def _not_after_as_of(self, where: str, date: dt.date | None) -> None:
        if date is not None and date > self.as_of:
            raise ValueError(
                f"{where} {date.isoformat()} is after the catalog's as_of "
                f"{self.as_of.isoformat()}: evidence cannot postdate the catalog"
            )

    @property
    def sha256(self) -> str:
        """sha256 of the bytes this catalog was parsed from (the record cites it)."""
        return self._sha256

    def engine_key(self, name: str) -> str | None:
        """The catalog key of an engine named by its key or an alias (case and punctuation
        ignored: ``TensorRT_LLM`` is ``tensorrt-llm``), else None."""
        return self._by_name.get(_normalised(name))

    def require_engine(self, name: str, where: str) -> str:
        """:meth:`engine_key`, or an error naming ``where`` (file and key) and the known names."""
        key = self.engine_key(name)
        if key is None:
            raise ConfigError(
                f"{where}: unknown engine {name!r}; the engine catalog knows "
                f"{', '.join(sorted(self.engines))} (add it to your own catalog: decision.catalog)"
            )
        return key

    def facts_used(
        self,
        engines: list[str],
        features: tuple[str, ...],
        backends: dict[str, str | None],
        layers: tuple[str, ...] = (),
    ) -> list[Fact]:
        """The facts a decision over ``engines`` used (see :meth:`Engine.facts`; ``backends``:
        each engine's deployment backend, None when unknown) and those of the routing
        ``layers`` it recommends."""
        out = [
            fact
            for key in engines
            for fact in self.engines[key].facts(key, features, backends.get(key))
        ]
        return out + [Fact(f"layers.{key}", self.layers[key].evidence_date) for key in layers]


def oldest_fact(facts: list[Fact]) -> Fact | None:
    """The fact with the oldest evidence date (ties: the first key), None when none is dated."""
    dated = [f for f in facts if f.evidence_date is not None]
    return min(dated, key=lambda f: (f.evidence_date, f.key)) if dated else None


BUNDLED = "engines.yaml"


@cache
def _bundled_bytes() -> bytes:
    return resources.files("pipeline.decision").joinpath(BUNDLED).read_bytes()


def _bundled_text() -> str:
    return _bundled_bytes().decode("utf-8")


# Parsed catalogs by the sha256 of their bytes: a catalog read again unchanged (the
# configuration check, the decision, the report, in one process) is not parsed again.
_PARSED: dict[str, Catalog] = {}


def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog at ``path``, else the bundled one; strict (see the module docstring).
    Read once per call; parsed once per content."""
    where = str(path) if path is not None else f"pipeline/decision/{BUNDLED}"
    try:
        data = path.read_bytes() if path is not None else _bundled_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: engine catalog not found") from exc
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the engine catalog ({os_reason(exc)})") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest in _PARSED:
        return _PARSED[digest]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: cannot read the engine catalog ({exc})") from exc
    raw = load_yaml(text, where, large=True)  # a team's catalog may hold thousands of engines
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the catalog must be a mapping (schema_version, engines, …)")
    try:
        catalog = Catalog.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, Catalog, where)) from exc
    catalog._sha256 = digest
    _PARSED[digest] = catalog
    return catalog
