"""The engine catalog: what each engine and each layer above engines is, runs on, supports,
needs and costs to change, with sources (data in ``engines.yaml``, validated here).

The catalog is data, not code: a team points ``decision.catalog`` at its own copy to add or
correct an engine. Loading is strict (:class:`pipeline.settings.Section`): an unknown key, a
missing field, a bad date, an evidence date after the catalog's ``as_of``, a source key that is
not defined, or an engine a layer names that the catalog does not hold is a
:class:`~pipeline.errors.ConfigError` naming the file and key. Engines named elsewhere
(requirements, benchmark manifests) are resolved through :meth:`Catalog.engine_key`, which knows
each engine's aliases.

Every fact carries its sources and its own ``evidence_date``: the date of the upstream source
it rests on (a release, a merged change, a dated page), or, for a page or file that carries no
date of its own, the date it was read (the source's ``read``). ``undated`` is allowed for a
team's own catalog but counts as the oldest evidence there is: a decision's catalog-age trigger
reads the oldest fact the decision used (:meth:`Catalog.facts_used`, :func:`oldest_fact`), so an
undated fact makes it fire until someone dates it.

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
from typing import Annotated, Any, Literal, Protocol, Self, cast, get_args

from pydantic import BeforeValidator, Field, PrivateAttr, Strict, ValidationError, model_validator

from pipeline.capacity.limits import EngineDefaults
from pipeline.capacity.prior import gpu_peaks
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
from pipeline.unknown import Unknown

HardwareTarget = Literal[
    "nvidia", "amd", "intel-gpu", "cpu", "apple", "tpu", "gaudi", "ascend", "neuron"
]
HardwareSupport = Literal["full", "partial", "plugin"]
Feature = Literal[
    "structured_output",
    "lora",
    "tool_calls",
    "long_context",
    "speculative_decoding",
    # Serving one model instance across several machines (tensor / pipeline parallelism over
    # the network).
    "multi_node",
    # Prefill and decode on separate instances, the KV cache moved between them.
    "pd_disaggregation",
    # Mixture-of-experts layers sharded by expert across GPUs (all-to-all dispatch).
    "expert_parallelism",
    # KV-cache blocks moved to host memory or storage and back, beyond GPU memory.
    "kv_offload",
]
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
# A CUDA version as a team or an engine states it: the major release, or major.minor.
CUDA_VERSION = re.compile(r"^\d{1,3}(\.\d{1,3})?$")


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


# The date of the upstream source a fact rests on (or the day it was read, for a source with
# no date of its own); None (written ``undated``) counts as the oldest evidence there is.
EvidenceDate = Annotated[dt.date | None, BeforeValidator(_evidence_date)]


def evidence_text(date: dt.date | None) -> str:
    return UNDATED if date is None else date.isoformat()


def _cuda(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not CUDA_VERSION.match(value.strip()):
        raise ValueError(f"{value!r} is not a CUDA version (a major release such as 13, or 12.8)")
    return value.strip()


CudaVersion = Annotated[str, BeforeValidator(_cuda)]


def cuda_major(version: str) -> int:
    """The major release of a CUDA version (``12.8`` → 12): CUDA's minor-version compatibility
    lets anything built for a 12.x toolkit run on any CUDA 12 driver (525 or later), so the
    major release is what a team's drivers and an engine's builds must share."""
    return int(version.split(".")[0])


@cache  # the catalog's few version strings, compared on every re-decision of a flip search
def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A release's order: its numbers, then final after any pre-release of the same numbers
    (``1.4.0rc1`` < ``1.4.0``; ``0.5.19`` < ``0.5.20``; llama.cpp's ``b10488`` is 10488)."""
    match = re.match(r"^\D*(\d+(?:\.\d+)*)(?:[.\-]?(a|b|rc|dev|post)\.?(\d+))?", version.strip())
    if match is None:
        return ((), 1, 0)
    numbers = tuple(int(n) for n in match.group(1).split("."))
    kind, serial = match.group(2), int(match.group(3) or 0)
    return (numbers, 2 if kind == "post" else 0 if kind else 1, serial)


class Source(Section):
    """An upstream source: where it is (a URL, with the commit or version read), its own date,
    and, for a source without a date of its own, the day it was read."""

    cite: Text
    url: Text
    date: EvidenceDate
    read: ConfigDate | None = None

    @model_validator(mode="after")
    def _dated_or_read(self) -> Self:
        if self.date is None and self.read is None:
            raise ValueError(
                "a source without a date of its own needs the day it was read (read: YYYY-MM-DD)"
            )
        return self


class FeatureSupport(Section):
    support: FeatureLevel
    note: str
    evidence_date: EvidenceDate
    # The feature's own sources (else the engine's feature_sources).
    sources: Sources = ()


class HardwareNote(Section):
    """What support of one hardware target amounts to when it is not the whole story (a plugin
    in beta, basic serving only, a few GPU models), with its own source and date."""

    note: Text
    sources: Sources
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


class RemovedBackend(Section):
    """A serving backend the engine no longer has: a benchmark manifest that names it is read,
    and said to describe a deployment that can no longer be built."""

    since: ConfigDate
    replaced_by: Text
    note: Text
    sources: Sources
    evidence_date: EvidenceDate


class CudaRequirement(Section):
    """The oldest CUDA release an engine's builds need from one of its versions on (until a
    later entry), and the NVIDIA driver that release needs."""

    since_version: Text
    min_cuda: CudaVersion
    min_driver: str | None
    note: Text
    sources: Sources
    evidence_date: EvidenceDate


class Status(Section):
    state: Literal["active", "maintenance"]
    since: ConfigDate | None
    note: str
    sources: Sources
    evidence_date: EvidenceDate


class Releases(Section):
    count: NonNegativeInt
    estimate: bool
    latest: Text
    note: str
    sources: Sources
    evidence_date: EvidenceDate


class Estimate(Section):
    """A figure and where it comes from (``estimate``: a judgement, not a measurement)."""

    value: NonNegative
    estimate: bool
    sources: Sources
    evidence_date: EvidenceDate


class SecondaryFigure(Section):
    """A published comparison, always presented as secondary (vendor-authored or second-hand).
    ``estimate``: the margin is a reading of such figures, not a published number, and
    ``confirm_with`` says what would confirm it."""

    claim: Text
    versus: Text
    condition: Text
    margin: float | None
    estimate: bool
    sources: Sources
    evidence_date: EvidenceDate
    confirm_with: str | None = None

    @model_validator(mode="after")
    def _estimates_say_how_to_confirm(self) -> Self:
        if self.estimate and not self.confirm_with:
            raise ValueError(
                "an estimated margin needs confirm_with: what would confirm it (a benchmark of "
                "both engines on your traffic, a publication)"
            )
        return self

    def shown(self) -> str:
        """The claim as every output shows it: an estimate says it is one and how to confirm it."""
        if not self.estimate:
            return self.claim
        return f"{self.claim} (an estimate, not a published figure; {self.confirm_with})"


class SchedulingDefault(Section):
    """One row of an engine's scheduling defaults: the per-step token budget, the running-request
    limit and chunked prefill the server starts with when not told otherwise, on GPUs with at
    least ``min_gpu_memory_gib`` and under ``max_gpu_memory_gib`` of memory whose names contain
    none of ``except_gpus`` (the first matching row applies)."""

    min_gpu_memory_gib: NonNegative | None = None
    max_gpu_memory_gib: NonNegative | None = None
    except_gpus: Sources = ()
    max_num_batched_tokens: PositiveInt
    max_num_seqs: PositiveInt
    enable_chunked_prefill: bool

    def matches(self, gpu_type: str, memory_gib: float | None) -> bool:
        """Whether this row applies to ``gpu_type`` (its memory: ``memory_gib``, None unknown:
        only a row without a memory bound applies)."""
        name = _normalised(gpu_type).replace("-", "")
        if any(_normalised(g).replace("-", "") in name for g in self.except_gpus):
            return False
        bounded = self.min_gpu_memory_gib is not None or self.max_gpu_memory_gib is not None
        if memory_gib is None:
            return not bounded
        low, high = self.min_gpu_memory_gib, self.max_gpu_memory_gib
        return (low is None or memory_gib >= low) and (high is None or memory_gib < high)


class Scheduling(Section):
    """An engine's scheduling defaults by GPU (the capacity stage's limits when neither the
    benchmark's manifest nor its result file states them)."""

    defaults: Annotated[tuple[SchedulingDefault, ...], Strict(False), Field(min_length=1)]
    note: Text
    sources: Sources
    evidence_date: EvidenceDate

    def default_for(self, gpu_type: str, memory_gib: float | None) -> SchedulingDefault | None:
        return next((row for row in self.defaults if row.matches(gpu_type, memory_gib)), None)


@dataclass(frozen=True)
class Fact:
    """One catalog fact a decision used: its key in the catalog and its evidence date."""

    key: str
    evidence_date: dt.date | None

    def age_days(self, as_of: dt.date) -> int | None:
        return None if self.evidence_date is None else (as_of - self.evidence_date).days


@dataclass(frozen=True)
class FactRecord:
    """One fact of the catalog with what it rests on: its sources and its evidence date."""

    key: str
    sources: tuple[str, ...]
    evidence_date: dt.date | None


class _Evidenced(Protocol):
    """A catalog entry that cites its sources and dates its evidence."""

    @property
    def sources(self) -> tuple[str, ...]: ...

    @property
    def evidence_date(self) -> dt.date | None: ...


def _record(key: str, fact: _Evidenced) -> FactRecord:
    return FactRecord(key, fact.sources, fact.evidence_date)


class Engine(Section):
    name: Text
    aliases: Sources
    design_bet: Text
    prefix_cache: PrefixCache
    hardware: dict[HardwareTarget, HardwareSupport]
    hardware_sources: Sources
    hardware_evidence_date: EvidenceDate
    # Targets whose support needs a word (a beta plugin, basic serving, some GPU models only).
    hardware_notes: dict[HardwareTarget, HardwareNote] = Field(default_factory=dict)
    features: dict[Feature, FeatureSupport]
    feature_sources: Sources
    change: ChangeCost
    # The serving backends a benchmark manifest may name (``backend``), and those the engine
    # has removed (a manifest naming one is read and said to be out of date).
    backends: Sources = ()
    removed_backends: dict[str, RemovedBackend] = Field(default_factory=dict)
    # The CUDA release the engine's builds need, from a version on (NVIDIA hardware).
    cuda: Annotated[tuple[CudaRequirement, ...], Strict(False)] = ()
    front_end: Text
    status: Status
    releases_last_6_months: Releases
    migration_engineer_weeks: Estimate
    choose_for: Text
    secondary_figures: Annotated[tuple[SecondaryFigure, ...], Strict(False)]
    licence: Text
    # docs/decision-rules.md#concurrency: at a peak of 10 or more Ollama is out.
    out_at_peak_concurrency: PositiveInt | None = None
    # The server's default per-step token budget and running-request limit (docs/capacity.md).
    scheduling: Scheduling | None = None

    @model_validator(mode="after")
    def _every_feature_stated(self) -> Self:
        missing = [f for f in FEATURES if f not in self.features]
        if missing:
            raise ValueError(f"features must state every one of {FEATURES}; missing {missing}")
        strangers = sorted(set(self.hardware_notes) - set(self.hardware))
        if strangers:
            raise ValueError(f"hardware_notes name targets not in hardware: {strangers}")
        both = sorted(set(self.backends) & set(self.removed_backends))
        if both:
            raise ValueError(f"backends {both} are listed both as current and as removed")
        return self

    def support(self, feature: str) -> FeatureSupport:
        """How this engine supports ``feature`` (one of :data:`FEATURES`)."""
        return self.features[cast(Feature, feature)]

    def runs_on(self, target: str) -> bool:
        return target in self.hardware

    def hardware_words(self, target: str) -> str:
        """``target`` with its support level and note when it is not plain full support."""
        level = self.hardware[cast(HardwareTarget, target)]
        note = self.hardware_notes.get(cast(HardwareTarget, target))
        said: list[str] = [] if level == "full" else [level]
        said += [note.note] if note else []
        return f"{target} ({'; '.join(said)})" if said else target

    def change_cost(self) -> ChangeCost:
        """The cost of one model change."""
        return self.change

    def migration_weeks(self) -> float:
        """Engineer-weeks to migrate to this engine."""
        return self.migration_engineer_weeks.value

    def change_summary(self) -> str:
        """What a model change costs, in words."""
        return self.change.note

    def cuda_for(self, version: str) -> CudaRequirement | None:
        """The CUDA requirement that applies to ``version`` (the entry with the latest
        ``since_version`` not after it), None when the catalog states none."""
        applying = [c for c in self.cuda if version_key(c.since_version) <= version_key(version)]
        return max(applying, key=lambda c: version_key(c.since_version), default=None)

    def current_cuda(self) -> CudaRequirement | None:
        """The CUDA requirement of the engine's latest release."""
        return self.cuda_for(self.releases_last_6_months.latest)

    def sources(self) -> set[str]:
        return {s for record in self.fact_records("") for s in record.sources}

    def facts(self, key: str, features: tuple[str, ...], hardware: tuple[str, ...]) -> list[Fact]:
        """The facts of this engine (catalog key ``key``) a decision reads: hardware (and the
        notes on the team's ``hardware``, every note when it is not known), the CUDA release
        its latest version needs, status, the required ``features``, the change cost, release
        cadence and migration weeks (tie-breaks and payback)."""
        at = f"engines.{key}"
        out = [
            Fact(f"{at}.hardware", self.hardware_evidence_date),
            Fact(f"{at}.status", self.status.evidence_date),
            Fact(f"{at}.releases_last_6_months", self.releases_last_6_months.evidence_date),
            Fact(f"{at}.migration_engineer_weeks", self.migration_engineer_weeks.evidence_date),
            Fact(f"{at}.change", self.change.evidence_date),
        ]
        out += [
            Fact(f"{at}.hardware_notes.{t}", n.evidence_date)
            for t, n in sorted(self.hardware_notes.items())
            if not hardware or t in hardware
        ]
        cuda = self.current_cuda()
        if cuda is not None:
            out.append(Fact(f"{at}.cuda[{self.cuda.index(cuda)}]", cuda.evidence_date))
        out += [Fact(f"{at}.features.{f}", self.support(f).evidence_date) for f in features]
        return out

    def fact_records(self, key: str) -> list[FactRecord]:
        """Every fact of this engine (catalog key ``key``) with its sources and evidence date:
        what validation checks and a catalog's completeness test reads."""
        at = f"engines.{key}."
        optional_steps = enumerate(self.change.optional_steps)
        return [
            _record(at + "prefix_cache", self.prefix_cache),
            FactRecord(at + "hardware", self.hardware_sources, self.hardware_evidence_date),
            _record(at + "status", self.status),
            _record(at + "releases_last_6_months", self.releases_last_6_months),
            _record(at + "migration_engineer_weeks", self.migration_engineer_weeks),
            _record(at + "change", self.change),
            *(_record(f"{at}hardware_notes.{t}", n) for t, n in self.hardware_notes.items()),
            *(
                FactRecord(f"{at}features.{f}", s.sources or self.feature_sources, s.evidence_date)
                for f, s in self.features.items()
            ),
            *(_record(f"{at}change.optional_steps[{i}]", step) for i, step in optional_steps),
            *(_record(f"{at}removed_backends.{b}", r) for b, r in self.removed_backends.items()),
            *(_record(f"{at}cuda[{i}]", c) for i, c in enumerate(self.cuda)),
            *(
                _record(f"{at}secondary_figures[{i}]", f)
                for i, f in enumerate(self.secondary_figures)
            ),
            *([_record(at + "scheduling", self.scheduling)] if self.scheduling is not None else []),
        ]


class Layer(Section):
    """A router or orchestrator above engines: never ranked against engines."""

    name: Text
    adds: Annotated[tuple[LayerCapability, ...], Strict(False)]
    prefix_routing: Literal["exact", "approximate", "none"]
    engines: Sources
    # Engines the layer serves only with a caveat (early development, a subset of features):
    # such a layer is offered for them after the layers that serve them fully.
    engine_notes: dict[str, str] = Field(default_factory=dict)
    # Where it runs, and the gateway it plugs into (null: it brings its own front end).
    runs_on: Annotated[tuple[Orchestrator, ...], Strict(False), Field(min_length=1)]
    needs_gateway: Gateway | None
    note: Text
    status: Status
    licence: Text
    sources: Sources
    evidence_date: EvidenceDate

    @model_validator(mode="after")
    def _notes_name_its_engines(self) -> Self:
        strangers = sorted(set(self.engine_notes) - set(self.engines))
        if strangers:
            raise ValueError(f"engine_notes name engines the layer does not serve: {strangers}")
        return self

    def fact_records(self, key: str) -> list[FactRecord]:
        at = f"layers.{key}"
        return [_record(at, self), _record(f"{at}.status", self.status)]


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", name.strip().lower()).strip("-")


def _schema_version(value: Any) -> Any:
    if value == 1:
        raise ValueError(
            "a schema 1 catalog has no evidence dates: give every fact an evidence_date and "
            "its sources, set schema_version: 3 (see pipeline/decision/engines.yaml)"
        )
    if value == 2:
        raise ValueError(
            "a schema 2 catalog predates per-fact sources, CUDA requirements and the "
            "multi_node, pd_disaggregation, expert_parallelism and kv_offload features: give "
            "migration_engineer_weeks its sources, each engine one change (change_by_backend "
            "is gone: list backends and removed_backends), a latest release under "
            "releases_last_6_months, every feature, and set schema_version: 3 (see "
            "pipeline/decision/engines.yaml)"
        )
    return value


class Catalog(Section):
    schema_version: Annotated[Literal[3], BeforeValidator(_schema_version)]
    # The date the catalog was compiled (reviewed as a whole); each fact's own evidence date
    # is what ages.
    as_of: ConfigDate
    sources: dict[str, Source]
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
        for key, layer in self.layers.items():
            unknown = sorted({*layer.sources, *layer.status.sources} - set(self.sources))
            if unknown:
                raise ValueError(f"layers.{key} cites undefined sources {unknown}")
            strangers = [e for e in layer.engines if e not in self.engines]
            if strangers:
                raise ValueError(f"layers.{key} names engines the catalog lacks: {strangers}")
        for record in self.fact_records():
            self._not_after_as_of(f"{record.key}.evidence_date", record.evidence_date)
        for name, source in self.sources.items():
            self._not_after_as_of(f"sources.{name}.date", source.date)
            self._not_after_as_of(f"sources.{name}.read", source.read)
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

    def fact_records(self) -> list[FactRecord]:
        """Every fact of every engine and layer, with its sources and evidence date."""
        out = [r for key, engine in self.engines.items() for r in engine.fact_records(key)]
        return out + [r for key, layer in self.layers.items() for r in layer.fact_records(key)]

    def engine_key(self, name: str) -> str | None:
        """The catalog key of an engine named by its key or an alias (case and punctuation
        ignored: ``TensorRT_LLM`` is ``tensorrt-llm``), else None."""
        return self._by_name.get(_normalised(name))

    def scheduling_defaults(self, engine: str, gpu_type: str) -> EngineDefaults | None:
        """The scheduling defaults of ``engine`` on ``gpu_type`` (its memory from the GPU
        datasheet table) with what they cite, or None when the catalog has none (the capacity
        stage's :class:`~pipeline.capacity.limits.SchedulingCatalog`)."""
        key = self.engine_key(engine)
        scheduling = self.engines[key].scheduling if key is not None else None
        if key is None or scheduling is None:
            return None
        peaks = gpu_peaks(gpu_type)
        row = scheduling.default_for(
            gpu_type, None if isinstance(peaks, Unknown) else peaks.memory_gib
        )
        if row is None:
            return None
        cited = ", ".join(
            source.url if not isinstance(source := self.sources[name], str) else source
            for name in scheduling.sources
        )
        return EngineDefaults(
            max_num_batched_tokens=row.max_num_batched_tokens,
            max_num_seqs=row.max_num_seqs,
            enable_chunked_prefill=row.enable_chunked_prefill,
            detail=f"{self.engines[key].name} on {gpu_type}, engine catalog ({cited})",
        )

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
        hardware: tuple[str, ...] = (),
        layers: tuple[str, ...] = (),
    ) -> list[Fact]:
        """The facts a decision over ``engines`` used (see :meth:`Engine.facts`; ``hardware``:
        the team's, empty when unknown) and those of the routing ``layers`` it recommends."""
        out = [fact for key in engines for fact in self.engines[key].facts(key, features, hardware)]
        return out + [Fact(f"layers.{key}", self.layers[key].evidence_date) for key in layers]


def oldest_fact(facts: list[Fact]) -> Fact | None:
    """The fact with the oldest evidence: an undated one first (no date counts as the oldest
    evidence there is), else the oldest date (ties: the first key); None when there is none."""
    undated = [f for f in facts if f.evidence_date is None]
    if undated:
        return min(undated, key=lambda f: f.key)
    return min(facts, key=lambda f: (f.evidence_date, f.key), default=None)


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
