"""What the prefix stage produces: the JSON summary (keys: ``docs/prefix.md``) and its frames.

:class:`PrefixSummary` is ``prefix_sharing.json`` as a typed model; it round-trips through JSON
(:meth:`PrefixResult.to_json` / :meth:`PrefixResult.from_json`) and the frames are written as
Parquet. The per-request replay is not kept: the summary holds its totals. The sessions (one
row per request) are a query, read only by whoever needs the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.unknown import ResultModel


class CurvePoint(ResultModel):
    """The sharing curve at one window W (shares null when no request has content)."""

    window_tokens: int
    window_blocks: int
    requests: int
    eligible: int
    sharing: int
    share: float | None
    share_eligible: float | None
    prompt_tokens: int
    prompt_tokens_eligible: int
    prompt_tokens_sharing: int
    token_share: float | None
    token_share_eligible: float | None


class ClassifyThresholds(ResultModel):
    short_window_tokens: int
    long_window_tokens: int
    no_sharing_below: float
    long_context_retention: float


class Classification(ResultModel):
    """The curve's shape (``unknown`` with its reason when no request has content)."""

    shape: str
    reason: str
    short_window_tokens: int | None
    long_window_tokens: int | None
    share_short: float | None
    share_long: float | None
    retention: float | None
    thresholds: ClassifyThresholds


class RetentionShare(ResultModel):
    max_age_s: float | None  # None: kept forever
    hit_tokens: int
    hit_share: float | None


class AgeBin(ResultModel):
    from_s: float
    to_s: float | None
    hit_tokens: int
    share_of_hits: float | None


class CrossTenant(ResultModel):
    hit_tokens_same_tenant: int
    hit_tokens_cross_tenant: int
    cross_tenant_share_of_hits: float | None
    isolated_hit_share: float | None


class RetentionNeeded(ResultModel):
    p50: float | None
    p90: float | None
    p99: float | None


class Reuse(ResultModel):
    """What an unbounded prefix cache could serve, by retention and across tenants (cross
    tenant: None when the trace logs no tenant)."""

    requests: int
    requests_with_hit: int
    prompt_tokens: int
    hit_tokens: int
    hit_share: float | None
    prompt_blocks: int
    hit_blocks: int
    block_hit_share: float | None
    by_retention: list[RetentionShare]
    age_bins: list[AgeBin]
    cross_tenant: CrossTenant | None
    retention_needed_s: RetentionNeeded


class SessionStats(ResultModel):
    requests: int
    sessions: int
    inferred: bool
    logged_requests: int
    inferred_requests: int
    turns_p50: float | None
    turns_p99: float | None
    turns_max: int | None
    multi_turn_sessions: int
    requests_in_multi_turn_sessions_share: float | None
    min_match_blocks: int


class PrefixSettingsUsed(ResultModel):
    min_session_match_blocks: int
    reuse_age_buckets_s: list[float]


class CurveEstimate(ResultModel):
    """The sharing curve sampled (``curve_hash_budget`` passed): the share of per-window
    hashes kept, how many there were, and each window's standard error of ``sharing``."""

    rate: float
    hashes: int
    hash_budget: int
    sharing_standard_errors: list[float]


class ReplayEstimate(ResultModel):
    """A replay sampled (``reuse_block_budget`` passed): the share of blocks kept at the end,
    the budget and the most distinct blocks it held."""

    rate: float
    blocks_budget: int
    blocks_kept: int


class ReuseEstimate(ResultModel):
    """The reuse potential estimated from sampled replays, with standard errors (shares, and
    requests for ``requests_with_hit``); ``by_retention`` follows ``reuse.by_retention``."""

    shared: ReplayEstimate | None
    same_tenant: ReplayEstimate | None
    hit_share_standard_error: float | None
    block_hit_share_standard_error: float | None
    requests_with_hit_standard_error: float | None
    by_retention_standard_errors: list[float] | None
    isolated_hit_share_standard_error: float | None


class RetentionEstimate(ResultModel):
    """How ``retention_needed_s`` was found when not exactly per request: ``basis`` "blocks"
    (each sampled hit block at its own age) or "requests" (each request at its deepest hit
    block's age), within ``relative_error`` (a sketch; 0 when every age was kept)."""

    basis: str
    relative_error: float


class SessionsEstimate(ResultModel):
    """Sessions closed early by the state budget (their turns are approximate)."""

    state_budget: int
    closed_early: int
    reopened: int


class PrefixEstimate(ResultModel):
    """What is estimated and how well; absent from the summary when every figure is exact."""

    curve: CurveEstimate | None = None
    reuse: ReuseEstimate | None = None
    retention_needed: RetentionEstimate | None = None
    sessions: SessionsEstimate | None = None


class PrefixSummary(ResultModel):
    schema_version: int
    block_size: int | None  # None: no request carries prefix hashes
    requests: int
    requests_hashes_known: int
    requests_hashes_unknown: int
    median_prompt_tokens: float | None
    curve: list[CurvePoint]
    classification: Classification
    reuse: Reuse
    sessions: SessionStats
    config: PrefixSettingsUsed
    estimate: PrefixEstimate | None = None


@dataclass(frozen=True)
class PrefixResult:
    summary: PrefixSummary
    curve: pl.DataFrame
    sessions: pl.LazyFrame
    # the files ``sessions`` reads, in order, when a large table's sessions were written as
    # they were found (the result's own file, removed with it, or a day-by-day analysis's kept
    # files, one a part): the stage copies them into place a row group at a time
    sessions_files: tuple[Path, ...] = ()

    def to_json(self) -> dict[str, Any]:
        # an exact result's file is the one it always was: no estimate key
        exact = self.summary.estimate is None
        return self.summary.model_dump(exclude={"estimate"} if exact else None)

    @classmethod
    def from_json(
        cls,
        summary: Any,
        curve: pl.DataFrame,
        sessions: pl.LazyFrame,
        sessions_files: tuple[Path, ...] = (),
    ) -> PrefixResult:
        return cls(PrefixSummary.model_validate(summary), curve, sessions, sessions_files)

    def shared_prefix_ratio(self) -> dict[int, float]:
        """The shared-prefix ratio (docs/decision-rules.md#prefix-sharing) per window W (tokens): the
        share of all requests whose first W tokens another request also starts with. Empty without content."""
        return {
            point.window_tokens: point.share
            for point in self.summary.curve
            if point.share is not None
        }
