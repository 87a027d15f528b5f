"""The prefix-sharing analysis end to end: curve, classification, reuse and sessions.

Out of core, and nothing kept per request of the whole table: a few aggregate queries read what
must be known first (row count, block size, arrival span, how many requests have each count of
prompt blocks and of prompt tokens, the distinct ids that group caches); then the requests
stream by in arrival-order chunks with their hash chains, through the session stream
(:class:`pipeline.prefix.sessions.SessionStream`: the chunk's sessions, and state carried to the
next chunk), the curve counter (exact under ``curve_hash_budget``, sampled past it) and the
shared replay (exact under ``reuse_block_budget`` distinct blocks; past it the pass stops
replaying and the chains are read again for a sampled replay), each chunk's per-request results
summed as it passes. When tenants are logged the same-tenant replay reads the chains once more,
after the shared replay's table is gone. Up to ``SESSIONS_IN_MEMORY_MAX`` requests the chunks'
sessions are kept as codes (13 bytes a request) and named at the end, so the sessions file is
the one it always was; past it (given a folder) each chunk's sessions are named and written to a
file there as they come. What is estimated, and how well, is the summary's ``estimate`` key.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow.parquet as pq

from pipeline.prefix.cache_rules import NAMESPACE_COLUMNS, hit_limit_blocks
from pipeline.prefix.compute import (
    CURVE_SCHEMA,
    KNOWN_BLOCK_SIZES,
    CurveCounter,
    analysis_block_size,
    classify_curve,
    one_block_size,
    stride_chains,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.replay import Replay
from pipeline.prefix.result import PrefixResult
from pipeline.prefix.reuse import (
    HitTotals,
    PromptTotals,
    RetentionAges,
    ReuseGroups,
    estimate_hits,
    estimate_same_tenant,
    reuse_frame,
    summary_of,
)
from pipeline.prefix.sessions import (
    SESSIONS_SCHEMA,
    FlatLists,
    SessionStream,
    check_arrivals,
    check_min_blocks,
    flat_lists,
)
from pipeline.shape.sketch import RELATIVE_ERROR
from pipeline.store import reserve_beside

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)

# Hashes per streamed chunk of chains (16 MB; the rows per chunk follow from the mean prompt
# blocks, between MIN_ and MAX_CHUNK_ROWS).
CHUNK_HASHES = 1 << 21
MIN_CHUNK_ROWS = 1 << 10
MAX_CHUNK_ROWS = 1 << 18
# Requests whose sessions are kept in memory until the end (as codes, then named: 60-70 bytes a
# request at the end); past it, given a folder, they are written to a file chunk by chunk.
SESSIONS_IN_MEMORY_MAX = 1 << 24
# A sampled replay after an exact one stopped starts at a rate that fills this share of the
# budget with the distinct blocks projected from the part replayed (it halves when it is more).
SAMPLED_FILL = 0.7
# Integer weight of a sampled block's age in the retention percentiles, per 1 / rate.
_AGE_WEIGHT = 1024


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


# What session inference reads of a chunk beside its hash chains.
SESSION_COLUMNS = (
    "arrival",
    "session_id",
    "turn",
    "prompt_blocks",
    "hashes_known",
)
# What the replays read beside the chains (and the group columns).
REPLAY_COLUMNS = ("arrival", "prompt_blocks", "hashes_known", "prompt_tokens")


@dataclass(frozen=True)
class _Plan:
    """What the passes need to know before the chains are read (aggregate queries only)."""

    n: int
    n_known: int
    block_size: int
    factor: int  # the analysis block size over the table's
    t0_us: int  # first arrival (µs since the epoch): the replays store arrivals after it
    time_bits: int
    max_prompt: int
    median_prompt: float | None
    # full prompt blocks at the analysis block size (an upper bound of the chains') and how many
    # known requests have each
    reach: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
    registering: int  # known requests with at least min_session_match_blocks table blocks
    chunk_rows: int
    groups: ReuseGroups


def _median(values: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> float | None:
    """The median of integers given as distinct values and counts (the middle two's mean)."""
    n = int(counts.sum())
    if n == 0:
        return None
    order = np.argsort(values)
    cum = np.cumsum(counts[order])
    low = values[order][int(np.searchsorted(cum, (n - 1) // 2, side="right"))]
    high = values[order][int(np.searchsorted(cum, n // 2, side="right"))]
    return (float(low) + float(high)) / 2


# Rows per slice of the columns that plan the passes (a few small ones: ~20 MB a slice). Not
# one query over the scan: polars' streaming engine reads a scan ahead of what it aggregates,
# so its memory grows with the table.
PLAN_ROWS = 1 << 18
_PLAN_COLUMNS = (
    "arrival",
    "hashes_known",
    "prompt_blocks",
    "prompt_tokens",
    "block_size",
    "tenant",
    *NAMESPACE_COLUMNS,
)


def slices(
    lazy: pl.LazyFrame, columns: tuple[str, ...], rows: int = PLAN_ROWS
) -> Iterator[pl.DataFrame]:
    """The table's ``columns`` in slices of ``rows`` rows, each read alone (one empty slice
    for an empty table)."""
    n = int(lazy.select(pl.len()).collect().item())
    for start in range(0, max(n, 1), rows):
        yield lazy.slice(start, rows).select(columns).collect()


def _plan(lazy: pl.LazyFrame, config: PrefixConfig) -> _Plan:
    known = pl.col("hashes_known").fill_null(False)
    heads, by_blocks, by_tokens, sizes, pairs, tenants = [], [], [], [], [], []
    for part in slices(lazy, _PLAN_COLUMNS):
        heads.append(
            part.select(
                pl.len().alias("n"),
                known.sum().cast(pl.Int64).alias("known"),
                pl.col("arrival").null_count().alias("nulls"),
                pl.col("arrival").min().dt.epoch("us").alias("t0"),
                pl.col("arrival").max().dt.epoch("us").alias("t1"),
                pl.col("prompt_tokens").filter(known).max().cast(pl.Int64).alias("max_prompt"),
            )
        )
        by_blocks.append(
            part.group_by(
                pl.col("prompt_blocks").fill_null(0).cast(pl.Int64), known.alias("known")
            ).agg(pl.len().cast(pl.Int64).alias("n"))
        )
        by_tokens.append(
            part.filter(known & pl.col("prompt_tokens").is_not_null())
            .group_by(pl.col("prompt_tokens").cast(pl.Int64))
            .agg(pl.len().cast(pl.Int64).alias("n"))
        )
        sizes.append(part.select(KNOWN_BLOCK_SIZES)["block_size"])
        pairs.append(part.select(NAMESPACE_COLUMNS).unique())
        tenants.append(part["tenant"].unique())
        del part
    head = (
        pl.concat(heads)
        .select(
            pl.col("n", "known", "nulls").sum(),
            pl.col("t0").min(),
            pl.col("t1", "max_prompt").max(),
        )
        .row(0, named=True)
    )
    if head["nulls"]:
        check_arrivals(
            lazy.select("arrival").filter(pl.col("arrival").is_null()).collect()["arrival"]
        )
    block_size, factor = analysis_block_size(one_block_size(pl.concat(sizes)), config.block_size)
    counts = pl.concat(by_blocks).group_by("prompt_blocks", "known").agg(pl.col("n").sum())
    tokens = pl.concat(by_tokens).group_by("prompt_tokens").agg(pl.col("n").sum())
    n = int(head["n"])
    t0, t1 = head["t0"] or 0, head["t1"] or 0
    groups = ReuseGroups.of(pl.concat(pairs).unique(), pl.concat(tenants))
    time_bits = max(1, int(t1 - t0).bit_length())
    groups.check(time_bits)
    reached = counts.filter(pl.col("known"))
    values, how_many = reached["prompt_blocks"].to_numpy(), reached["n"].to_numpy()
    # mean full prompt blocks over every row, at the analysis block size (times the factor)
    strided = int(((counts["prompt_blocks"] // factor) * counts["n"]).sum())
    mean = strided * factor / n if n else 0.0
    return _Plan(
        n=n,
        n_known=int(head["known"] or 0),
        block_size=block_size,
        factor=factor,
        t0_us=int(t0),
        time_bits=time_bits,
        max_prompt=int(head["max_prompt"] or 0),
        median_prompt=_median(tokens["prompt_tokens"].to_numpy(), tokens["n"].to_numpy()),
        reach=(values // factor, how_many),
        registering=int(how_many[values >= config.min_session_match_blocks].sum()),
        chunk_rows=min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, int(CHUNK_HASHES / max(mean, 1.0)))),
        groups=groups,
    )


@dataclass(frozen=True)
class _Arrays:
    """A chunk's chains at the analysis block size and its per-request arrays."""

    flat: FlatLists
    known: npt.NDArray[np.bool_]
    prompt_tokens: npt.NDArray[np.int64]
    chain_blocks: npt.NDArray[np.int32]  # full prompt blocks the chain holds; 0 when not known
    limit: npt.NDArray[np.int64]  # most leading blocks that may hit
    time_us: npt.NDArray[np.int64]  # arrival after the first request
    namespace: npt.NDArray[np.int64]  # empty: one namespace
    tenant: npt.NDArray[np.int64] | None


def _arrays(chunk: pl.DataFrame, native: FlatLists, plan: _Plan) -> _Arrays:
    flat = stride_chains(native, plan.factor)
    known = chunk["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    blocks = chunk["prompt_blocks"].fill_null(0).cast(pl.Int32).to_numpy() // plan.factor
    chain_blocks = np.minimum(blocks, np.diff(flat.offsets).astype(np.int32))
    chain_blocks[~known] = 0
    prompt_tokens = chunk["prompt_tokens"].fill_null(0).cast(pl.Int64).to_numpy()
    namespace, tenant = plan.groups.codes(chunk)
    return _Arrays(
        flat=flat,
        known=known,
        prompt_tokens=prompt_tokens,
        chain_blocks=chain_blocks,
        limit=hit_limit_blocks(prompt_tokens, plan.block_size),
        time_us=chunk["arrival"].dt.epoch("us").to_numpy() - plan.t0_us,
        namespace=namespace,
        tenant=tenant,
    )


def _chunks(
    requests: pl.LazyFrame, plan: _Plan, columns: tuple[str, ...]
) -> Iterator[tuple[FlatLists, pl.DataFrame, _Arrays]]:
    """The requests in arrival order, ``plan.chunk_rows`` at a time: the hash chains (at the
    table's block size), the chunk's ``columns`` and its arrays (the next chunk read while the
    caller works on this one)."""
    n, rows = plan.n, plan.chunk_rows
    wanted = tuple(dict.fromkeys((*columns, *REPLAY_COLUMNS, *plan.groups.columns)))

    def read(start: int) -> tuple[FlatLists, pl.DataFrame]:
        # A slice of the scan reads only the row groups it overlaps (a streaming collect would
        # read ahead of the kernels without bound).
        chunk = requests.slice(start, rows).select("prefix_hashes", *wanted).collect()
        return flat_lists(chunk["prefix_hashes"]), chunk.drop("prefix_hashes")

    row0 = 0
    last_us: int | None = None
    with ThreadPoolExecutor(1) as reader:
        ahead = reader.submit(read, 0) if n else None
        while ahead is not None:
            native, chunk = ahead.result()
            stop = row0 + native.offsets.shape[0] - 1
            ahead = reader.submit(read, stop) if row0 < stop < n else None
            check_arrivals(chunk["arrival"], last_us)
            last_us = int(chunk["arrival"].dt.epoch("us")[-1])
            yield native, chunk, _arrays(chunk, native, plan)
            row0 = stop
    if row0 != n:
        raise RuntimeError(f"read {row0} hash chains for {n} requests")


class _Sessions:
    """Each chunk's sessions: kept as codes and named at the end, or, with a ``path``, named and
    written there chunk by chunk (``request_id`` then comes with each chunk)."""

    def __init__(self, stream: SessionStream, path: Path | None) -> None:
        self.stream = stream
        self.path = path
        self.codes: list[pl.DataFrame] = []
        self.writer: pq.ParquetWriter | None = None

    def feed(self, chunk: pl.DataFrame, native: FlatLists) -> None:
        codes = self.stream.feed_codes(chunk, native)
        if self.path is None:
            self.codes.append(codes)
            return
        table = self.stream.frame(chunk["request_id"], codes).to_arrow()
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        self.writer.write_table(table)

    def frame(self, requests: pl.LazyFrame) -> pl.LazyFrame:
        """Every chunk's sessions, in arrival order (named now when kept as codes)."""
        if self.path is not None:
            if self.writer is not None:
                self.writer.close()
            return pl.scan_parquet(self.path)
        if not self.codes:
            return pl.DataFrame(schema=SESSIONS_SCHEMA).lazy()
        ids = requests.select("request_id").collect()["request_id"]
        frame = self.stream.frame(ids, pl.concat(self.codes))
        self.codes = []
        return frame.lazy()


def _first_pass(
    lazy: pl.LazyFrame,
    plan: _Plan,
    sessions: _Sessions,
    counter: CurveCounter | None,
    shared: Replay,
    prompt: PromptTotals,
    hits: HitTotals,
) -> int:
    """The chains in arrival-order chunks through the sessions (at the table's block size), the
    curve and the shared replay (at the analysis block size), their totals summed; returns the
    requests the replay had seen when it stopped over its budget (0: it did not)."""
    columns = (*SESSION_COLUMNS, *(("request_id",) if sessions.path else ()))
    buckets = hits.age_buckets_s
    stopped_at = 0
    seen = 0

    def side(native: FlatLists, chunk: pl.DataFrame, c: _Arrays) -> None:
        """The chunk's work beside the shared replay (its own state only)."""
        sessions.feed(chunk, native)
        if counter is not None:
            flat = c.flat
            counter.feed(
                flat.offsets, flat.values, flat.nulls, c.known, c.chain_blocks, c.prompt_tokens
            )

    # The kernels and polars release the GIL: with two cores the next chunk is read, and the
    # side work done, beside the shared replay (one chunk ahead at most).
    parallel = (os.cpu_count() or 1) > 1
    with ThreadPoolExecutor(1) as worker:
        for native, chunk, c in _chunks(lazy, plan, columns):
            pending = worker.submit(side, native, chunk, c) if parallel else None
            if pending is None:
                side(native, chunk, c)
            prompt.add(c.known, c.prompt_tokens, c.chain_blocks, c.limit)
            seen += int(c.known.shape[0])
            if not shared.overflowed:
                flat = c.flat
                hit, age, within = shared.feed(
                    flat.offsets, flat.values, c.chain_blocks, c.known, c.time_us, c.namespace
                )
                if shared.overflowed:
                    # its sums are replaced by the sampled replay's: let the ages go now
                    stopped_at = seen
                    hits.retention = RetentionAges()
                else:
                    hits.add(
                        reuse_frame(
                            c.known,
                            c.prompt_tokens,
                            c.chain_blocks,
                            hit,
                            age,
                            within,
                            None,
                            plan.block_size,
                            buckets,
                        )
                    )
            if pending is not None:
                pending.result()
            del native, chunk, c, pending
    return stopped_at


def _sampled_rate(replay: Replay, stopped_at: int, n: int) -> float:
    """The rate a sampled replay starts at after ``replay`` stopped over its budget having seen
    ``stopped_at`` of ``n`` requests: the distinct blocks projected to the whole table."""
    assert replay.budget is not None
    projected = replay.keys_max * n / max(stopped_at, 1)
    return min(0.5, SAMPLED_FILL * replay.budget / max(projected, 1.0))


def _sampled_pass(
    lazy: pl.LazyFrame,
    plan: _Plan,
    replay: Replay,
    group: Callable[[_Arrays], npt.NDArray[np.int64]],
    hits: HitTotals | None,
) -> None:
    """A sampled replay over the chains; the ages of its held blocks to ``hits.retention``."""
    for _, _, c in _chunks(lazy, plan, ()):
        flat = c.flat
        ages, weight = replay.feed_sampled(
            flat.offsets, flat.values, c.chain_blocks, c.limit, c.known, c.time_us, group(c)
        )
        if hits is not None and ages.shape[0]:
            weights = np.full(ages.shape[0], round(_AGE_WEIGHT * weight), np.int64)
            hits.retention.add(ages / 1e6, weights)
    replay.close()


def _same_tenant_pass(lazy: pl.LazyFrame, plan: _Plan, replay: Replay, hits: HitTotals) -> int:
    """The same-tenant replay, exact: its hit tokens to ``hits``; returns the requests it had
    seen when it stopped over its budget (0: it did not)."""
    total = 0
    seen = 0
    for _, _, c in _chunks(lazy, plan, ()):
        assert c.tenant is not None
        flat = c.flat
        hit, _, _ = replay.feed(
            flat.offsets, flat.values, c.chain_blocks, c.known, c.time_us, c.tenant
        )
        seen += int(c.known.shape[0])
        if replay.overflowed:
            return seen
        tokens = np.minimum(hit.astype(np.int64), c.limit) * plan.block_size
        total += int(tokens[c.known].sum())
    replay.close()
    hits.add_same_tenant(total)
    return 0


def _replay_estimate(replay: Replay) -> dict[str, Any] | None:
    if not replay.sampled:
        return None
    assert replay.budget is not None
    return {"rate": replay.rate, "blocks_budget": replay.budget, "blocks_kept": replay.keys_max}


def analyse(
    requests: pl.DataFrame | pl.LazyFrame, config: PrefixConfig, spill: Path | None = None
) -> PrefixResult:
    """Curve, classification, reuse potential and sessions of a canonical table sorted by arrival
    (in memory or scanned: it is read in chunks either way).

    Sessions are inferred at the table's own block size; the curve and reuse at
    ``config.block_size`` when set (a multiple of the table's). ``spill``: where the sessions
    file of more than ``SESSIONS_IN_MEMORY_MAX`` requests may be written as it is made (a path
    beside it is used; None: kept in memory).
    """
    min_blocks = config.min_session_match_blocks
    check_min_blocks(min_blocks)
    lazy = requests.lazy()
    plan = _plan(lazy, config)
    n, n_known, block_size = plan.n, plan.n_known, plan.block_size
    buckets = config.reuse_age_buckets_s
    buckets_us = np.array([t * 1e6 for t in buckets], dtype=np.float64)

    stream = SessionStream(
        min_blocks,
        gap_s=config.session_gap_s,
        budget=config.session_state_budget,
        expected=plan.registering,
    )
    spilled = reserve_beside(spill) if spill is not None and n > SESSIONS_IN_MEMORY_MAX else None
    sessions = _Sessions(stream, spilled)
    counter = (
        CurveCounter(block_size, plan.max_prompt, plan.reach, config.curve_hash_budget)
        if n_known
        else None
    )
    budget = config.reuse_block_budget
    shared = Replay(plan.time_bits, buckets_us, with_age=True, budget=budget)
    prompt = PromptTotals()
    hits = HitTotals(buckets)
    stopped_at = _first_pass(lazy, plan, sessions, counter, shared, prompt, hits)
    totals = stream.finish()
    shared.close()
    errors: dict[str, Any] = {}
    if stopped_at:
        # Over its budget: the chains again, for a sampled replay sized from what it had seen.
        rate = _sampled_rate(shared, stopped_at, n)
        shared = Replay(plan.time_bits, buckets_us, with_age=True, budget=budget, rate=rate)
        hits = HitTotals(buckets)
        _sampled_pass(lazy, plan, shared, lambda c: c.namespace, hits)
        errors = estimate_hits(hits, prompt, shared, block_size)
    same: Replay | None = None
    if plan.groups.tenants is not None:
        # The same-tenant replay's table (one entry per distinct (block, tenant)) is about as
        # large as the shared one: a pass of its own, after the shared table is gone, keeps the
        # peak at one of them. Sampled from the start when the shared one had to be.
        no_buckets = np.zeros(0, np.float64)
        same = Replay(1, no_buckets, with_age=False, budget=budget, rate=min(1.0, shared.rate))
        stopped = 0 if same.sampled else _same_tenant_pass(lazy, plan, same, hits)
        if stopped:
            rate = _sampled_rate(same, stopped, n)
            same = Replay(1, no_buckets, with_age=False, budget=budget, rate=rate)
        if same.sampled:
            _sampled_pass(lazy, plan, same, _tenant_codes, None)
            errors["isolated_hit_share_standard_error"] = estimate_same_tenant(
                hits, prompt, same, block_size
            )

    # Count-only traces: no block structure, so no curve (and nothing can hit).
    curve = counter.finish() if counter is not None else pl.DataFrame(schema=CURVE_SCHEMA)
    classification = classify_curve(curve, plan.median_prompt)
    reuse = summary_of(prompt, hits)
    estimate = _estimate(config, counter, shared, same, hits, errors, totals)
    # named now, with only the summaries left (the names are the largest thing kept in memory)
    del hits, counter, shared, same
    sessions_frame = sessions.frame(lazy)
    stats = session_stats_of(totals.turns, n, totals.inferred_requests, min_blocks)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "block_size": block_size if n_known else None,
        "requests": n,
        "requests_hashes_known": n_known,
        "requests_hashes_unknown": n - n_known,
        "median_prompt_tokens": plan.median_prompt,
        "curve": curve.to_dicts(),
        "classification": classification,
        "reuse": reuse,
        "sessions": stats,
        "config": {
            "min_session_match_blocks": min_blocks,
            "reuse_age_buckets_s": list(config.reuse_age_buckets_s),
        },
        **({"estimate": estimate} if estimate else {}),
    }
    result = PrefixResult.from_json(summary, curve, sessions_frame, spilled)
    if spilled is not None:
        # the file goes with the result (stage.write copies it into place)
        weakref.finalize(result, spilled.unlink, missing_ok=True)
    return result


def _tenant_codes(c: _Arrays) -> npt.NDArray[np.int64]:
    assert c.tenant is not None
    return c.tenant


def _estimate(
    config: PrefixConfig,
    counter: CurveCounter | None,
    shared: Replay,
    same: Replay | None,
    hits: HitTotals,
    errors: dict[str, Any],
    totals: Any,
) -> dict[str, Any]:
    """What is estimated and how well (empty when every figure is exact); each part is also
    logged as a warning."""
    estimate: dict[str, Any] = {}
    if counter is not None and counter.rate < 1.0:
        estimate["curve"] = {
            "rate": counter.rate,
            "hashes": counter.hashes,
            "hash_budget": config.curve_hash_budget,
            "sharing_standard_errors": counter.standard_errors,
        }
        log.warning(
            "prefix curve: %d per-window hashes exceed curve_hash_budget %d; the curve's "
            "sharing counts are a sampled estimate (rate %.4g, standard errors %s)",
            counter.hashes,
            config.curve_hash_budget,
            counter.rate,
            [round(e) for e in counter.standard_errors],
        )
    sampled_same = same is not None and same.sampled
    if shared.sampled or sampled_same:
        estimate["reuse"] = {
            "shared": _replay_estimate(shared),
            "same_tenant": _replay_estimate(same) if same is not None else None,
            "hit_share_standard_error": errors.get("hit_share_standard_error"),
            "block_hit_share_standard_error": errors.get("block_hit_share_standard_error"),
            "requests_with_hit_standard_error": errors.get("requests_with_hit_standard_error"),
            "by_retention_standard_errors": errors.get("by_retention_standard_errors"),
            "isolated_hit_share_standard_error": errors.get("isolated_hit_share_standard_error"),
        }
        log.warning(
            "prefix reuse: more distinct blocks than reuse_block_budget %d; the reuse potential "
            "is a sampled estimate (rate %.4g, hit share standard error %s)",
            config.reuse_block_budget,
            shared.rate if shared.sampled else same.rate if same is not None else 1.0,
            errors.get("hit_share_standard_error"),
        )
    sketched = hits.retention.sketch is not None
    if shared.sampled or sketched:
        estimate["retention_needed"] = {
            "basis": "blocks" if shared.sampled else "requests",
            "relative_error": RELATIVE_ERROR if sketched else 0.0,
        }
    if totals.closed_early or totals.reopened:
        estimate["sessions"] = {
            "state_budget": config.session_state_budget,
            "closed_early": totals.closed_early,
            "reopened": totals.reopened,
        }
        log.warning(
            "prefix sessions: %d sessions closed early by session_state_budget %d, %d met "
            "again after closing: their turns are approximate",
            totals.closed_early,
            config.session_state_budget,
            totals.reopened,
        )
    return estimate
