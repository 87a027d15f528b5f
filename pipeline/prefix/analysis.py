"""The prefix-sharing analysis end to end: curve, classification, reuse and sessions.

Out of core: the request table is never held whole. One scan reads the per-request numbers
(arrival, prompt tokens and blocks, whether hashes are known, the ids that group caches);
then the hash chains stream by in arrival-order chunks, with the ids session inference reads,
through the session stream (:class:`pipeline.prefix.sessions.SessionStream`: the chunk's
sessions, and state carried to the next chunk), the curve's per-window hashes (exact under
``curve_hash_budget``, sampled past it) and the reuse replays, which keep only their tables (one
entry per distinct block) and a few numbers per request. When tenants are logged the same-tenant replay reads the
chains once more, after the shared replay's table is gone. Peak memory grows with the requests
and the distinct blocks, not with the blocks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.prefix.compute import (
    CURVE_SCHEMA,
    CurveCounter,
    analysis_block_size,
    classify_curve,
    new_replays,
    reuse_frame,
    reuse_groups,
    reuse_summary,
    stride_chains,
    table_block_size,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.hashmap import row_bits
from pipeline.prefix.replay import Replay
from pipeline.prefix.result import PrefixResult
from pipeline.prefix.sessions import (
    SESSIONS_SCHEMA,
    FlatLists,
    SessionStream,
    check_arrivals,
    check_min_blocks,
    flat_lists,
)

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)

# Hashes per streamed chunk of chains (16 MB; the rows per chunk follow from the mean prompt
# blocks, between MIN_ and MAX_CHUNK_ROWS).
CHUNK_HASHES = 1 << 21
MIN_CHUNK_ROWS = 1 << 10
MAX_CHUNK_ROWS = 1 << 18


def session_stats(sessions: pl.DataFrame, min_blocks: int) -> dict[str, Any]:
    """Sessions, turns per session (p50 / p99 / max) and whether the ids were inferred."""
    turns = sessions.group_by("session_id").agg(pl.len().alias("turns"))["turns"]
    inferred = int(sessions["session_inferred"].sum()) if sessions.height else 0
    return session_stats_of(turns, sessions.height, inferred, min_blocks)


def session_stats_of(
    turns: pl.Series, requests: int, inferred_requests: int, min_blocks: int
) -> dict[str, Any]:
    """:func:`session_stats` from the requests per session (``turns``, one entry a session)."""
    if requests == 0:
        return {
            "requests": 0,
            "sessions": 0,
            "inferred": False,
            "logged_requests": 0,
            "inferred_requests": 0,
            "turns_p50": None,
            "turns_p99": None,
            "turns_max": None,
            "multi_turn_sessions": 0,
            "requests_in_multi_turn_sessions_share": None,
            "min_match_blocks": min_blocks,
        }
    multi = turns.filter(turns > 1)
    return {
        "requests": requests,
        "sessions": turns.len(),
        "inferred": inferred_requests > 0,
        "logged_requests": requests - inferred_requests,
        "inferred_requests": inferred_requests,
        "turns_p50": float(turns.quantile(0.5, interpolation="nearest") or 0),
        "turns_p99": float(turns.quantile(0.99, interpolation="nearest") or 0),
        "turns_max": int(turns.max() or 0),  # type: ignore[arg-type]
        "multi_turn_sessions": multi.len(),
        "requests_in_multi_turn_sessions_share": int(multi.sum()) / requests,
        "min_match_blocks": min_blocks,
    }


def _per_request(requests: pl.LazyFrame) -> pl.DataFrame:
    """Every column the analysis needs but the hash chains and the ids of the sessions table.

    Id columns that are null throughout (the usual case for tenant, model and adapter, and for
    session ids of traces that do not log them) are not read: a null string still takes 16
    bytes a row in memory, and they group nothing."""
    ids = ["tenant", "model", "lora_adapter"]
    logged = requests.select(pl.col(ids).is_not_null().any()).collect().row(0, named=True)
    return requests.select(
        "arrival",
        pl.col("hashes_known").fill_null(False),
        "prompt_tokens",
        pl.col("prompt_blocks").fill_null(0).cast(pl.Int32),
        *[c for c in ids if logged[c]],
    ).collect()


# What session inference reads of a chunk beside its hash chains.
SESSION_COLUMNS = (
    "arrival",
    "session_id",
    "turn",
    "prompt_blocks",
    "hashes_known",
)


def _chunks(
    requests: pl.LazyFrame, n: int, rows: int, columns: tuple[str, ...] = ()
) -> Iterator[tuple[int, FlatLists, pl.DataFrame]]:
    """The hash chains in arrival order, ``rows`` requests at a time (with the first row of
    each chunk and its ``columns``), the next chunk read while the caller works on this one."""

    def read(start: int) -> tuple[FlatLists, pl.DataFrame]:
        # A slice of the scan reads only the row groups it overlaps (a streaming collect would
        # read ahead of the kernels without bound).
        chunk = requests.slice(start, rows).select("prefix_hashes", *columns).collect()
        return flat_lists(chunk["prefix_hashes"]), chunk.drop("prefix_hashes")

    row0 = 0
    with ThreadPoolExecutor(1) as reader:
        ahead = reader.submit(read, 0) if n else None
        while ahead is not None:
            native, chunk = ahead.result()
            stop = row0 + native.offsets.shape[0] - 1
            ahead = reader.submit(read, stop) if row0 < stop < n else None
            yield row0, native, chunk
            row0 = stop
    if row0 != n:
        raise RuntimeError(f"read {row0} hash chains for {n} requests")


def _chunk_rows(blocks: npt.NDArray[np.int32], factor: int) -> int:
    """Requests per chunk: about ``CHUNK_HASHES`` hashes when a request has ``blocks`` at the
    analysis block size (``factor`` times the table's) on average."""
    mean = float(blocks.mean()) * factor if blocks.shape[0] else 0.0
    return min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, int(CHUNK_HASHES / max(mean, 1.0))))


def _stream(
    requests: pl.LazyFrame,
    n: int,
    factor: int,
    known: npt.NDArray[np.bool_],
    chain_blocks: npt.NDArray[np.int32],
    sessions: SessionStream,
    counter: CurveCounter | None,
    shared: Replay,
) -> list[pl.DataFrame]:
    """Feed the hash chains, in arrival-order chunks, to session inference (at the table's
    block size), and at the analysis block size (``factor`` times it) to the curve and the
    shared replay; ``chain_blocks`` becomes exact chunk by chunk. Returns the chunks'
    sessions as codes (:meth:`SessionStream.feed_codes`)."""
    found: list[pl.DataFrame] = []

    def side(native: FlatLists, chunk: pl.DataFrame, row0: int, flat: FlatLists) -> None:
        """The chunk's work beside the shared replay (its own tables and arrays only)."""
        found.append(sessions.feed_codes(chunk, native))
        if counter is not None:
            counter.feed(row0, flat.offsets, flat.values, flat.nulls, chain_blocks)

    # The kernels and polars release the GIL: with two cores the next chunk is read, and the
    # side work done, beside the shared replay (one chunk ahead at most).
    parallel = (os.cpu_count() or 1) > 1
    with ThreadPoolExecutor(1) as worker:
        chunks = _chunks(requests, n, _chunk_rows(chain_blocks, factor), SESSION_COLUMNS)
        for row0, native, chunk in chunks:
            flat = stride_chains(native, factor)
            part = chain_blocks[row0 : row0 + flat.offsets.shape[0] - 1]
            np.minimum(part, np.diff(flat.offsets).astype(np.int32), out=part)
            part[~known[row0 : row0 + part.shape[0]]] = 0
            pending = worker.submit(side, native, chunk, row0, flat) if parallel else None
            if pending is None:
                side(native, chunk, row0, flat)
            shared.feed(row0, flat.offsets, flat.values)
            if pending is not None:
                pending.result()
            del native, flat, pending, chunk
    return found


def _replay_again(
    requests: pl.LazyFrame, n: int, factor: int, blocks: npt.NDArray[np.int32], replay: Replay
) -> None:
    """A second pass over the chains for one more replay (its table alone in memory)."""
    for row0, native, _ in _chunks(requests, n, _chunk_rows(blocks, factor)):
        flat = stride_chains(native, factor)
        replay.feed(row0, flat.offsets, flat.values)


def analyse(requests: pl.DataFrame | pl.LazyFrame, config: PrefixConfig) -> PrefixResult:
    """Curve, classification, reuse potential and sessions of a canonical table sorted by arrival
    (in memory or scanned: it is read in chunks either way).

    Sessions are inferred at the table's own block size; the curve and reuse at
    ``config.block_size`` when set (a multiple of the table's).
    """
    min_blocks = config.min_session_match_blocks
    check_min_blocks(min_blocks)
    lazy = requests.lazy()
    table = _per_request(lazy)
    check_arrivals(table["arrival"])
    block_size, factor = analysis_block_size(table_block_size(lazy), config.block_size)
    n = table.height
    shift = row_bits(n)
    known = table["hashes_known"].to_numpy().astype(np.bool_)
    n_known = int(np.count_nonzero(known))
    median_prompt = table.filter(pl.col("hashes_known"))["prompt_tokens"].median()
    prompt_tokens = table["prompt_tokens"].fill_null(0).cast(pl.Int64).to_numpy()
    arrival_us = table["arrival"].dt.epoch("us").to_numpy()
    native_blocks = table["prompt_blocks"].to_numpy()
    # full prompt blocks at the analysis block size: an upper bound until a chunk's chains
    # are read, then min(that, the chain's length), 0 for rows without known hashes
    chain_blocks = native_blocks // factor
    groups = reuse_groups(table, n, shift)
    del table

    sessions = SessionStream(
        min_blocks,
        gap_s=config.session_gap_s,
        budget=config.session_state_budget,
        expected=int(np.count_nonzero(known & (native_blocks >= min_blocks))),
    )
    max_prompt = int(prompt_tokens[known].max()) if n_known else 0
    counter = (
        CurveCounter(block_size, max_prompt, known, chain_blocks, config.curve_hash_budget)
        if n_known
        else None
    )
    shared, same = new_replays(
        arrival_us, known, chain_blocks, groups, shift, config.reuse_age_buckets_s
    )
    del groups

    parts = _stream(lazy, n, factor, known, chain_blocks, sessions, counter, shared)
    totals = sessions.finish()
    shared.close()
    if same is not None:
        # The same-tenant replay's table (one entry per distinct (block, tenant)) is about as
        # large as the shared one: a second pass, after the shared table is gone, keeps the
        # peak at one of them.
        _replay_again(lazy, n, factor, chain_blocks, same)
        same.close()

    # Count-only traces: no block structure, so no curve (and nothing can hit).
    curve = (
        counter.finish(prompt_tokens, chain_blocks)
        if counter is not None
        else pl.DataFrame(schema=CURVE_SCHEMA)
    )
    counter_rate = counter.rate if counter is not None else 1.0
    counter_errors = counter.standard_errors if counter is not None else []
    n_curve_hashes = counter.hashes if counter is not None else 0
    del counter
    classification = classify_curve(
        curve,
        float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
    )
    reuse = reuse_summary(
        reuse_frame(
            known,
            prompt_tokens,
            chain_blocks,
            shared,
            same,
            block_size,
            config.reuse_age_buckets_s,
        ),
        config.reuse_age_buckets_s,
    )
    del shared, same, prompt_tokens, chain_blocks, arrival_us, native_blocks, known

    if totals.closed_early or totals.reopened:
        log.warning(
            "prefix sessions: %d sessions closed early by session_state_budget %d, %d met "
            "again after closing: their turns are approximate",
            totals.closed_early,
            config.session_state_budget,
            totals.reopened,
        )
    if counter_rate < 1.0:
        log.warning(
            "prefix curve: %d per-window hashes exceed curve_hash_budget %d; the curve's "
            "sharing counts are a sampled estimate (rate %.4g, standard errors %s)",
            n_curve_hashes,
            config.curve_hash_budget,
            counter_rate,
            [round(e) for e in counter_errors],
        )
    # named now, after the replays' tables are gone (the codes are 13 bytes a request)
    sessions_frame = (
        sessions.frame(lazy.select("request_id").collect()["request_id"], pl.concat(parts))
        if parts
        else pl.DataFrame(schema=SESSIONS_SCHEMA)
    )
    del parts, sessions
    stats = session_stats_of(totals.turns, n, totals.inferred_requests, min_blocks)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "block_size": block_size if n_known else None,
        "requests": n,
        "requests_hashes_known": n_known,
        "requests_hashes_unknown": n - n_known,
        "median_prompt_tokens": float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
        "curve": curve.to_dicts(),
        "classification": classification,
        "reuse": reuse,
        "sessions": stats,
        "config": {
            "min_session_match_blocks": min_blocks,
            "reuse_age_buckets_s": list(config.reuse_age_buckets_s),
        },
    }
    return PrefixResult.from_json(summary, curve, sessions_frame)
