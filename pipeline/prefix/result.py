"""What the prefix stage produces: the JSON summary (keys: ``docs/prefix.md``) and its frames.

:class:`PrefixSummary` is ``prefix_sharing.json`` as a typed model; it round-trips through JSON
(:meth:`PrefixResult.to_json` / :meth:`PrefixResult.from_json`) and the frames are written as
Parquet. The per-request replay is not kept: the summary holds its totals.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class PrefixResult:
    summary: PrefixSummary
    curve: pl.DataFrame
    sessions: pl.DataFrame

    def to_json(self) -> dict[str, Any]:
        return self.summary.model_dump()

    @classmethod
    def from_json(cls, summary: Any, curve: pl.DataFrame, sessions: pl.DataFrame) -> PrefixResult:
        return cls(summary=PrefixSummary.model_validate(summary), curve=curve, sessions=sessions)

    def shared_prefix_ratio(self) -> dict[int, float]:
        """The shared-prefix ratio (docs/decision-rules.md#prefix-sharing) per window W (tokens): the
        share of all requests whose first W tokens another request also starts with. Empty without content."""
        return {
            point.window_tokens: point.share
            for point in self.summary.curve
            if point.share is not None
        }
