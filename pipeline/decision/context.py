"""What every decision rule shares: the inputs, each engine's standing while the rules run,
the context they read and write (rationale entries, exclusions, the decision tree's branch),
and the evidence's JSON form."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline.bench.result import BenchResult
from pipeline.capacity.result import CapacityResult
from pipeline.decision.catalog import Catalog
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.decision.evidence import EngineBench, Workload
from pipeline.decision.result import DecisionRecord, Rule
from pipeline.prefix.result import PrefixSummary
from pipeline.shape.result import ShapeMetrics
from pipeline.sim.result import ScenarioSummary
from pipeline.unknown import Unknown


@dataclass(frozen=True)
class DecisionInputs:
    """Everything the decision reads; an absent stage output is None with its reason in
    ``missing`` (stage name → why)."""

    workload_name: str
    shape: ShapeMetrics | None
    prefix: PrefixSummary | None
    scenarios: list[ScenarioSummary] | None
    curves: pl.DataFrame | None
    bench: BenchResult | None
    fits: pl.DataFrame | None
    catalog: Catalog
    catalog_source: str
    as_of: dt.date | None
    peak_window: str
    # Days a benchmark stays current (bench.max_age_days): when the bench stage had no report
    # date to measure its age from, the decision measures it from its own.
    max_age_days: int
    digests: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    previous: DecisionRecord | None = None
    # The capacity stage's result (None: missing, its reason in ``missing["capacity"]``) and
    # the workload's prompt and output tokens per request, which price routing through it.
    capacity: CapacityResult | None = None
    lengths: pl.DataFrame | None = None


@dataclass(frozen=True)
class Finding:
    """One thing the ranking found, as a code with the engines it is about, its numbers and
    any upstream text it carries (``details``); ``finding_text`` in
    :mod:`pipeline.decision.present` says what each code's fields hold and phrases it."""

    code: str
    engines: tuple[str, ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)
    details: tuple[str, ...] = ()


@dataclass
class EngineState:
    """One engine's standing while the rules run."""

    excluded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class RuleContext:
    inputs: DecisionInputs
    requirements: Requirements
    settings: DecisionConfig
    workload: Workload
    benches: dict[str, EngineBench]
    required: tuple[str, ...]
    states: dict[str, EngineState]
    branch: list[str] = field(default_factory=list)  # engines the decision tree points to
    # Why the tree points to each engine in ``branch`` (the first rule that did), a clause a
    # tie-break names when the tree's order decides.
    pointed: dict[str, str] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    # False: the rules' rationale entries are not kept, for a re-decision that reads only the
    # outcome (a flip search or a map cell re-decides hundreds of times).
    recording: bool = True

    @property
    def catalog(self) -> Catalog:
        return self.inputs.catalog

    def name(self, engine: str) -> str:
        return self.catalog.engines[engine].name

    def exclude(self, engine: str, reason: str) -> None:
        self.states[engine].excluded.append(reason)

    def point(self, engines: tuple[str, ...], why: str) -> None:
        """The tree points to ``engines`` in this order (after those it already points to);
        ``why`` is the condition, said once for the group."""
        for engine in engines:
            if engine not in self.branch:
                self.branch.append(engine)
                self.pointed[engine] = why

    def viable(self) -> list[str]:
        return [e for e, s in self.states.items() if not s.excluded]

    def rule(
        self,
        rule: str,
        title: str,
        source: str,
        fired: bool | None,
        effect: str,
        **evidence: Any,
    ) -> None:
        if not self.recording:
            return
        self.rules.append(
            Rule(
                rule=rule,
                title=title,
                source=source,
                fired=fired,
                evidence=plain(evidence),
                effect=effect,
            )
        )


def plain(value: Any) -> Any:
    """JSON-ready, with floats rounded to 6 significant digits so records stay readable and
    byte-stable."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def known_plain(value: float | Unknown) -> float | None:
    """:func:`plain` of a known value; None for an unknown one."""
    return None if isinstance(value, Unknown) else plain(value)


def current_engine(ctx: RuleContext) -> str | None:
    name = ctx.requirements.current_engine
    return None if name is None else ctx.catalog.require_engine(name, "requirements.current_engine")
