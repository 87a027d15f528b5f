"""The ``prefix`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import model_validator

from pipeline.settings import (
    SECONDS_PER_YEAR,
    BlockSize,
    PositiveSecondsList,
    Section,
    between,
)

# A session match needs this many blocks at most: past it no prompt of any trace chains.
MAX_SESSION_MATCH_BLOCKS = 100_000
# A state budget (entries of 8-16 bytes) past 2^40 is past any machine's memory.
MAX_BUDGET = 1 << 40


class PrefixConfig(Section):
    """Options of the prefix-sharing analysis (see ``docs/prefix.md``).

    min_session_match_blocks
        Fewest full prompt blocks a request must extend before it counts as continuing an
        earlier request's conversation (session inference).
    reuse_age_buckets_s
        Retention times (seconds, strictly ascending) at which the reuse potential is also
        reported: the prompt tokens a cache that keeps a block this long after its last use
        could serve.
    block_size
        Analyse at this coarser block size (a multiple of the table's; ``None`` = the table's).
    session_gap_s
        A request continues an earlier one only within this many seconds of it (``None``: at
        any distance); an inferred conversation idle this long is closed.
    session_state_budget
        Entries (parent-table keys and open sessions) session inference carries from chunk to
        chunk before it closes the least recently active sessions early.
    curve_hash_budget
        Per-window hashes the sharing curve keeps exactly; past it the curve is a sampled
        estimate (``docs/prefix.md``).
    reuse_block_budget
        Distinct blocks the reuse replay keeps exactly; past it the reuse potential is a
        sampled estimate (``docs/prefix.md``).
    """

    min_session_match_blocks: Annotated[int, between(1, MAX_SESSION_MATCH_BLOCKS)]
    reuse_age_buckets_s: PositiveSecondsList
    block_size: BlockSize | None
    session_gap_s: Annotated[float, between(0, SECONDS_PER_YEAR, low_open=True)] | None
    session_state_budget: Annotated[int, between(1, MAX_BUDGET)]
    curve_hash_budget: Annotated[int, between(1, MAX_BUDGET)]
    reuse_block_budget: Annotated[int, between(1, MAX_BUDGET)]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        buckets = list(self.reuse_age_buckets_s)
        if buckets != sorted(set(buckets)):
            raise ValueError(f"reuse_age_buckets_s must be strictly ascending, got {buckets}")
        return self
