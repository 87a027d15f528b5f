"""Whole-table prefix analyses, the references the tests hold the stage's chunked pass to.

The stage (:func:`pipeline.prefix.analysis.analyse`) feeds the curve counter, the reuse
replays and the session parent search chunk by chunk out of core; these feed the same code one
chunk holding the whole table, so a hand-computed expectation can be checked without writing
Parquet, and the chunked pass compared against one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.prefix.compute import (
    CurveCounter,
    analysis_block_size,
    table_block_size,
)
from pipeline.prefix.replay import Replay
from pipeline.prefix.reuse import ReuseGroups, reuse_frame
from pipeline.prefix.sessions import (
    DEFAULT_MIN_SESSION_MATCH_BLOCKS,
    ParentSearch,
    check_arrivals,
    flat_lists,
)


def coarsen(requests: pl.DataFrame, factor: int) -> pl.DataFrame:
    """The same table at block size ``factor × block_size`` (every ``factor``-th chain hash)."""
    if factor == 1:
        return requests
    return requests.with_columns(
        pl.col("prefix_hashes").list.gather_every(factor, offset=factor - 1),
        (pl.col("prompt_blocks") // factor).cast(pl.Int32),
        (pl.col("block_size") * factor).cast(pl.Int32),
    )


def at_block_size(requests: pl.DataFrame, block_size: int | None) -> tuple[pl.DataFrame, int]:
    """The table coarsened to ``block_size`` (or as is), and the block size used."""
    size, factor = analysis_block_size(table_block_size(requests), block_size)
    return coarsen(requests, factor), size


@dataclass(frozen=True)
class _Chains:
    """A whole table's columns as the chunked consumers read them."""

    known: npt.NDArray[np.bool_]
    prompt_tokens: npt.NDArray[np.int64]
    chain_blocks: npt.NDArray[np.int32]  # min(prompt_blocks, chain length); 0 when not known
    offsets: npt.NDArray[np.int64]
    values: npt.NDArray[np.uint64]
    nulls: npt.NDArray[np.bool_]


def _chains(requests: pl.DataFrame) -> _Chains:
    known = requests["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    flat = flat_lists(requests["prefix_hashes"])
    pb = np.minimum(
        requests["prompt_blocks"].fill_null(0).cast(pl.Int32).to_numpy(),
        np.diff(flat.offsets).astype(np.int32),
    )
    pb[~known] = 0
    return _Chains(
        known=known,
        prompt_tokens=requests["prompt_tokens"].fill_null(0).cast(pl.Int64).to_numpy(),
        chain_blocks=pb,
        offsets=flat.offsets,
        values=flat.values,
        nulls=flat.nulls,
    )


def sharing_curve(requests: pl.DataFrame, block_size: int) -> pl.DataFrame:
    """The shared-prefix ratio at every window of the grid (one row per window)."""
    chains = _chains(requests)
    max_prompt = int(chains.prompt_tokens[chains.known].max()) if chains.known.any() else 0
    reach = np.unique(chains.chain_blocks[chains.known].astype(np.int64), return_counts=True)
    counter = CurveCounter(block_size, max_prompt, reach)
    counter.feed(
        chains.offsets,
        chains.values,
        chains.nulls,
        chains.known,
        chains.chain_blocks,
        chains.prompt_tokens,
    )
    return counter.finish()


def reuse_per_request(
    requests: pl.DataFrame,
    block_size: int,
    age_buckets_s: tuple[float, ...] = (60.0, 600.0, 3600.0),
) -> pl.DataFrame:
    """Per request (in input order, which must be arrival order): the columns of
    :func:`pipeline.prefix.reuse.reuse_frame`, from one exact replay of the whole table."""
    chains = _chains(requests)
    arrival_us = requests["arrival"].dt.epoch("us").to_numpy()
    time_us = arrival_us - (arrival_us.min() if arrival_us.size else 0)
    shift = max(1, int(time_us.max() if time_us.size else 0).bit_length())
    namespace, tenant = ReuseGroups.of_table(requests).codes(requests)
    buckets_us = np.array([t * 1e6 for t in age_buckets_s], dtype=np.float64)
    shared = Replay(shift, buckets_us, with_age=True)
    hit, age, within = shared.feed(
        chains.offsets, chains.values, chains.chain_blocks, chains.known, time_us, namespace
    )
    same_hit = None
    if tenant is not None:
        same = Replay(1, np.zeros(0, np.float64), with_age=False)
        same_hit, _, _ = same.feed(
            chains.offsets, chains.values, chains.chain_blocks, chains.known, time_us, tenant
        )
    return reuse_frame(
        chains.known,
        chains.prompt_tokens,
        chains.chain_blocks,
        hit,
        age,
        within,
        same_hit,
        block_size,
        age_buckets_s,
    )


def infer_parents(
    requests: pl.DataFrame, *, min_blocks: int = DEFAULT_MIN_SESSION_MATCH_BLOCKS
) -> pl.Series:
    """Row index of the request each request continues (null when it starts a conversation).

    Every request with known hashes is searched (logged session ids are ignored here); see
    :func:`pipeline.prefix.sessions.infer_sessions` for how logged ids take precedence.
    """
    check_arrivals(requests["arrival"])
    known = requests["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    pb = requests["prompt_blocks"].fill_null(0).cast(pl.Int32).to_numpy()
    search = ParentSearch(pb, known, known, max(1, min_blocks))
    flat = flat_lists(requests["prefix_hashes"])
    search.feed(0, flat.offsets, flat.values)
    return pl.Series("parent", search.close(), dtype=pl.Int64).replace(-1, None)
