"""The ``prefix`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import model_validator

from pipeline.settings import BlockSize, PositiveSecondsList, Section, between

# A session match needs this many blocks at most: past it no prompt of any trace chains.
MAX_SESSION_MATCH_BLOCKS = 100_000


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
    """

    min_session_match_blocks: Annotated[int, between(1, MAX_SESSION_MATCH_BLOCKS)]
    reuse_age_buckets_s: PositiveSecondsList
    block_size: BlockSize | None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        buckets = list(self.reuse_age_buckets_s)
        if buckets != sorted(set(buckets)):
            raise ValueError(f"reuse_age_buckets_s must be strictly ascending, got {buckets}")
        return self
