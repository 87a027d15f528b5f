"""The ``prefix`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from pipeline.settings import BlockSize, Fraction, PositiveInt, PositiveSecondsList, Section


class PrefixConfig(Section):
    """Options of the prefix-sharing analysis (see ``docs/prefix.md``).

    min_session_match_blocks
        Fewest full prompt blocks a request must extend before it counts as continuing an
        earlier request's conversation (session inference).
    reuse_age_buckets_s
        Retention times (seconds, strictly ascending) at which the reuse potential is also
        reported: the prompt tokens a cache that keeps a block this long after its last use
        could serve.
    classify_short_window_tokens, classify_long_window_tokens
        Windows (tokens) whose sharing ratios classify the curve's shape; the long window is
        capped at the median prompt so that at least half of the requests can reach it.
    no_sharing_below
        Shared-prefix ratio at the short window below which the shape is "no sharing".
    long_context_retention
        Ratio share(long) / share(short) at or above which the shape is "long shared context".
    block_size
        Analyse at this coarser block size (a multiple of the table's; ``None`` = the table's).
    """

    min_session_match_blocks: PositiveInt
    reuse_age_buckets_s: PositiveSecondsList
    classify_short_window_tokens: PositiveInt
    classify_long_window_tokens: PositiveInt
    no_sharing_below: Fraction
    long_context_retention: Fraction
    block_size: BlockSize | None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        buckets = list(self.reuse_age_buckets_s)
        if buckets != sorted(set(buckets)):
            raise ValueError(f"reuse_age_buckets_s must be strictly ascending, got {buckets}")
        if self.classify_long_window_tokens <= self.classify_short_window_tokens:
            raise ValueError(
                "classify_long_window_tokens must exceed classify_short_window_tokens "
                f"({self.classify_long_window_tokens} <= {self.classify_short_window_tokens})"
            )
        return self
