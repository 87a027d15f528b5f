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

import datetime as dt
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
    curve_rate,
    one_block_size,
    stride_chains,
    window_grid,
    window_reach,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.replay import Replay, power_of_two_rate
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
from pipeline.present.text import sample_rate as sample_rate_text
from pipeline.resume import DayPasses, Pass, RequestChunks
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
class TableSummary:
    """What the passes must know before the chains are read, of a table or of a part of one
    (a day's: summaries merge, :meth:`merged`): row and known counts, the arrival span, the
    longest known prompt, how many requests have each count of full prompt blocks and each
    prompt length, and the distinct block sizes, (model, adapter) pairs and tenants."""

    n: int
    known: int
    t0_us: int | None
    t1_us: int | None
    max_prompt: int
    blocks: pl.DataFrame  # prompt_blocks (0 for null), known, n
    tokens: pl.DataFrame  # prompt_tokens of known requests, n
    sizes: pl.Series  # the known requests' block sizes
    pairs: pl.DataFrame  # distinct (model, lora_adapter)
    tenants: pl.Series  # distinct tenants

    @classmethod
    def of(cls, lazy: pl.LazyFrame) -> TableSummary:
        """The summary of a table read in slices (a null arrival is refused, naming it)."""
        known = pl.col("hashes_known").fill_null(False)
        found = []
        for part in slices(lazy, _PLAN_COLUMNS):
            head = part.select(
                pl.len().alias("n"),
                known.sum().cast(pl.Int64).alias("known"),
                pl.col("arrival").null_count().alias("nulls"),
                pl.col("arrival").min().dt.epoch("us").alias("t0"),
                pl.col("arrival").max().dt.epoch("us").alias("t1"),
                # the longest prompt, at least its full blocks (a table that bypassed ingest may
                # hold more blocks than tokens): every window a request reaches is on the grid
                pl.max_horizontal(
                    pl.col("prompt_tokens").cast(pl.Int64),
                    pl.col("prompt_blocks").cast(pl.Int64) * pl.col("block_size").cast(pl.Int64),
                )
                .filter(known)
                .max()
                .alias("max_prompt"),
            ).row(0, named=True)
            if head["nulls"]:
                check_arrivals(
                    lazy.select("arrival").filter(pl.col("arrival").is_null()).collect()["arrival"]
                )
            found.append(
                cls(
                    n=int(head["n"]),
                    known=int(head["known"] or 0),
                    t0_us=head["t0"],
                    t1_us=head["t1"],
                    max_prompt=int(head["max_prompt"] or 0),
                    blocks=part.group_by(
                        pl.col("prompt_blocks").fill_null(0).cast(pl.Int64), known.alias("known")
                    ).agg(pl.len().cast(pl.Int64).alias("n")),
                    tokens=part.filter(known & pl.col("prompt_tokens").is_not_null())
                    .group_by(pl.col("prompt_tokens").cast(pl.Int64))
                    .agg(pl.len().cast(pl.Int64).alias("n")),
                    sizes=part.select(KNOWN_BLOCK_SIZES)["block_size"],
                    pairs=part.select(NAMESPACE_COLUMNS).unique(),
                    tenants=part["tenant"].unique(),
                )
            )
            del part
        return cls.merged(found)

    @classmethod
    def merged(cls, summaries: list[TableSummary]) -> TableSummary:
        """One summary of the tables (or parts) ``summaries`` summarise (at least one)."""
        starts = [s.t0_us for s in summaries if s.t0_us is not None]
        ends = [s.t1_us for s in summaries if s.t1_us is not None]
        return cls(
            n=sum(s.n for s in summaries),
            known=sum(s.known for s in summaries),
            t0_us=min(starts) if starts else None,
            t1_us=max(ends) if ends else None,
            max_prompt=max(s.max_prompt for s in summaries),
            blocks=pl.concat([s.blocks for s in summaries])
            .group_by("prompt_blocks", "known")
            .agg(pl.col("n").sum()),
            tokens=pl.concat([s.tokens for s in summaries])
            .group_by("prompt_tokens")
            .agg(pl.col("n").sum()),
            sizes=pl.concat([s.sizes for s in summaries]).unique(),
            pairs=pl.concat([s.pairs for s in summaries]).unique(),
            tenants=pl.concat([s.tenants for s in summaries]).unique(),
        )


# Bits of arrival time the shared replay stores at least (2^44 µs: 203 days), so that a quarter
# growing by days keeps its packed table's layout (the key of a pass kept between days); the
# (model, adapter) namespaces then have 19 bits (``ReuseGroups.check``).
MIN_TIME_BITS = 44


@dataclass(frozen=True)
class _Plan:
    """What the passes need to know before the chains are read (a :class:`TableSummary`)."""

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
    chunk_rows: int | None  # None: each part's own (from its mean prompt)
    groups: ReuseGroups

    def rows_of(self, part: pl.LazyFrame) -> int:
        """Rows per chunk of ``part`` (:attr:`chunk_rows`, or from the part's mean prompt)."""
        if self.chunk_rows is not None:
            return self.chunk_rows
        strided = pl.col("prompt_blocks").fill_null(0).cast(pl.Int64) // self.factor
        mean = part.select(strided.mean()).collect().item()
        return _chunk_rows(float(mean or 0.0) * self.factor)

    def pass_facts(self, config: PrefixConfig, about: dict[str, Any]) -> dict[str, Any]:
        """What a pass kept between days depends on beyond its days (the key of
        :meth:`pipeline.resume.DayPasses.carried`): the settings, the table's facts its line
        names (:meth:`about`), the groups' numbering itself and the prompts' width (the first
        pass's curve adds its rate; its windows are widened as longer prompts come,
        :meth:`CurveCounter.widen`)."""
        return {
            "settings": config.model_dump(mode="json"),
            "groups": self.groups.digest(),
            "wide_prompts": self.max_prompt >= 2**31,
            **about,
        }

    def about(self) -> dict[str, Any]:
        """The whole table's facts a kept pass depends on, as its line names them when they
        changed: block sizes, first arrival, whether a curve is counted, the groups, the
        arrival bits."""
        return {
            "block size": self.block_size,
            "analysis block size factor": self.factor,
            "first arrival": dt.datetime.fromtimestamp(self.t0_us / 1e6, dt.UTC).isoformat(),
            "hashes known": self.n_known > 0,
            "namespaces": self.groups.namespace_count,
            "tenants": self.groups.tenant_count,
            "arrival time bits": self.time_bits,
        }


def _chunk_rows(mean_blocks: float) -> int:
    return min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, int(CHUNK_HASHES / max(mean_blocks, 1.0))))


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


def plan_of(summary: TableSummary, config: PrefixConfig, *, by_parts: bool = False) -> _Plan:
    """The passes' plan of a table ``summary`` summarises; ``by_parts``: its parts are read
    as days (each part chunked by its own mean prompt, so a day's chunks never depend on the
    others)."""
    block_size, factor = analysis_block_size(one_block_size(summary.sizes), config.block_size)
    counts = summary.blocks
    n = summary.n
    t0, t1 = summary.t0_us or 0, summary.t1_us or 0
    groups = ReuseGroups.of(summary.pairs, summary.tenants)
    time_bits = max(MIN_TIME_BITS, int(t1 - t0).bit_length())
    groups.check(time_bits)
    reached = counts.filter(pl.col("known"))
    values, how_many = reached["prompt_blocks"].to_numpy(), reached["n"].to_numpy()
    # mean full prompt blocks over every row, at the analysis block size (times the factor)
    strided = int(((counts["prompt_blocks"] // factor) * counts["n"]).sum())
    mean = strided * factor / n if n else 0.0
    tokens = summary.tokens
    return _Plan(
        n=n,
        n_known=summary.known,
        block_size=block_size,
        factor=factor,
        t0_us=int(t0),
        time_bits=time_bits,
        max_prompt=summary.max_prompt,
        median_prompt=_median(tokens["prompt_tokens"].to_numpy(), tokens["n"].to_numpy()),
        reach=(values // factor, how_many),
        registering=int(how_many[values >= config.min_session_match_blocks].sum()),
        chunk_rows=None if by_parts else _chunk_rows(mean),
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


@dataclass
class _Order:
    """The last arrival a pass has read (µs), so that its next chunk, or day, is checked to
    come after it."""

    last_us: int | None = None

    def check(self, arrival: pl.Series) -> None:
        check_arrivals(arrival, self.last_us)
        self.last_us = int(arrival.dt.epoch("us")[-1])


def _chunks(
    parts: Iterable[pl.LazyFrame], plan: _Plan, columns: tuple[str, ...], order: _Order
) -> Iterator[tuple[FlatLists, pl.DataFrame, _Arrays, bool]]:
    """The requests of ``parts`` (each a table or part of one, in arrival order) in chunks
    (:meth:`_Plan.rows_of`): the hash chains (at the table's block size), the chunk's
    ``columns``, its arrays and whether it ends its part (the next chunk read while the
    caller works on this one)."""
    wanted = tuple(dict.fromkeys((*columns, *REPLAY_COLUMNS, *plan.groups.columns)))

    def spans() -> Iterator[tuple[pl.LazyFrame, int, int, bool]]:
        for part in parts:
            n = int(part.select(pl.len()).collect().item())
            rows = plan.rows_of(part) if n else 1
            for start in range(0, n, rows):
                yield part, start, min(rows, n - start), start + rows >= n

    def read(part: pl.LazyFrame, start: int, rows: int) -> tuple[FlatLists, pl.DataFrame]:
        # A slice of the scan reads only the row groups it overlaps (a streaming collect would
        # read ahead of the kernels without bound).
        chunk = part.slice(start, rows).select("prefix_hashes", *wanted).collect()
        if chunk.height != rows:
            raise RuntimeError(f"read {chunk.height} hash chains for {rows} requests")
        return flat_lists(chunk["prefix_hashes"]), chunk.drop("prefix_hashes")

    todo = spans()
    with ThreadPoolExecutor(1) as reader:
        span = next(todo, None)
        ahead = reader.submit(read, *span[:3]) if span is not None else None
        while ahead is not None and span is not None:
            native, chunk = ahead.result()
            ends = span[3]
            span = next(todo, None)
            ahead = reader.submit(read, *span[:3]) if span is not None else None
            order.check(chunk["arrival"])
            yield native, chunk, _arrays(chunk, native, plan), ends


class _Sessions:
    """Each chunk's sessions: kept as codes and named at the end, or, with a ``path``, named and
    written there chunk by chunk (``request_id`` then comes with each chunk)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.codes: list[pl.DataFrame] = []
        self.writer: pq.ParquetWriter | None = None

    @property
    def wants_ids(self) -> bool:
        return self.path is not None

    # files kept beside a pass (none: the result's own file, or codes in memory)
    kept_files: tuple[str, ...] = ()
    fresh_files: tuple[str, ...] = ()

    def feed(self, stream: SessionStream, chunk: pl.DataFrame, native: FlatLists) -> None:
        codes = stream.feed_codes(chunk, native)
        if self.path is None:
            self.codes.append(codes)
            return
        table = stream.frame(chunk["request_id"], codes).to_arrow()
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        self.writer.write_table(table)

    def part_done(self) -> None:
        """A part of the table read (nothing to do: one file, or codes, for the table)."""

    def frame(self, stream: SessionStream, requests: pl.LazyFrame) -> pl.LazyFrame:
        """Every chunk's sessions, in arrival order (named now when kept as codes)."""
        if self.path is not None:
            if self.writer is not None:
                self.writer.close()
            return pl.scan_parquet(self.path)
        if not self.codes:
            return pl.DataFrame(schema=SESSIONS_SCHEMA).lazy()
        ids = requests.select("request_id").collect()["request_id"]
        frame = stream.frame(ids, pl.concat(self.codes))
        self.codes = []
        return frame.lazy()


class SessionSink(Protocol):
    """Where the first pass's sessions go, chunk by chunk (:class:`_Sessions`, or a day's
    parts' files, :class:`pipeline.prefix.days.DaySessions`)."""

    @property
    def wants_ids(self) -> bool: ...

    # the files kept beside the first pass (named relative to its folder), and those of them
    # this process wrote
    @property
    def kept_files(self) -> Sequence[str]: ...

    @property
    def fresh_files(self) -> Sequence[str]: ...

    def feed(self, stream: SessionStream, chunk: pl.DataFrame, native: FlatLists) -> None: ...

    def part_done(self) -> None: ...


class _Pass:
    """What every pass over the chains carries: the plan it reads them by, the requests it
    has seen and the last arrival it read (so that a later day is checked to come after it).
    A pass that can be kept between days (:class:`pipeline.resume.Feedable`: what it reads of
    ``plan`` is in its key, :meth:`_Plan.pass_facts`)."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.seen = 0
        self.order = _Order()

    @property
    def requests(self) -> int:
        return self.seen

    def chunks(
        self, chunks: RequestChunks, columns: tuple[str, ...] = ()
    ) -> Iterator[tuple[FlatLists, pl.DataFrame, _Arrays, bool]]:
        """:func:`_chunks` of ``chunks``' parts, in this pass's order."""
        return _chunks(chunks(), self.plan, columns, self.order)


class _FirstPass(_Pass):
    """The chains in arrival-order chunks through the sessions (at the table's block size),
    the curve and the shared replay (at the analysis block size), their totals summed. Past
    its budget the shared replay stops (:attr:`stopped_at`: the requests it had seen) and the
    rest goes on."""

    def __init__(self, plan: _Plan, config: PrefixConfig, sessions: SessionSink) -> None:
        super().__init__(plan)
        self.stream = SessionStream(
            config.min_session_match_blocks,
            gap_s=config.session_gap_s,
            budget=config.session_state_budget,
            expected=plan.registering,
        )
        self.sessions = sessions
        self.counter = (
            CurveCounter(plan.block_size, plan.max_prompt, plan.reach, config.curve_hash_budget)
            if plan.n_known
            else None
        )
        buckets = config.reuse_age_buckets_s
        buckets_us = np.array([t * 1e6 for t in buckets], dtype=np.float64)
        self.shared = Replay(
            plan.time_bits, buckets_us, with_age=True, budget=config.reuse_block_budget
        )
        self.prompt = PromptTotals()
        self.hits = HitTotals(buckets)
        self.stopped_at = 0

    @property
    def kept_files(self) -> tuple[str, ...]:
        return tuple(self.sessions.kept_files)

    @property
    def fresh_files(self) -> tuple[str, ...]:
        return tuple(self.sessions.fresh_files)

    def feed(self, chunks: RequestChunks) -> None:
        plan, counter, shared, hits = self.plan, self.counter, self.shared, self.hits
        columns = (*SESSION_COLUMNS, *(("request_id",) if self.sessions.wants_ids else ()))
        buckets = hits.age_buckets_s

        def side(native: FlatLists, chunk: pl.DataFrame, c: _Arrays, ends: bool) -> None:
            """The chunk's work beside the shared replay (its own state only)."""
            self.sessions.feed(self.stream, chunk, native)
            if ends:
                self.sessions.part_done()
            if counter is not None:
                flat = c.flat
                counter.feed(
                    flat.offsets, flat.values, flat.nulls, c.known, c.chain_blocks, c.prompt_tokens
                )

        # The kernels and polars release the GIL: with two cores the next chunk is read, and
        # the side work done, beside the shared replay (one chunk ahead at most).
        parallel = (os.cpu_count() or 1) > 1
        with ThreadPoolExecutor(1) as worker:
            for native, chunk, c, ends in self.chunks(chunks, columns):
                pending = worker.submit(side, native, chunk, c, ends) if parallel else None
                if pending is None:
                    side(native, chunk, c, ends)
                self.prompt.add(c.known, c.prompt_tokens, c.chain_blocks, c.limit)
                self.seen += int(c.known.shape[0])
                if not shared.overflowed:
                    flat = c.flat
                    hit, age, within = shared.feed(
                        flat.offsets, flat.values, c.chain_blocks, c.known, c.time_us, c.namespace
                    )
                    if shared.overflowed:
                        # its sums are replaced by the sampled replay's: let the ages go now
                        self.stopped_at = self.seen
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


def _sampled_rate(replay: Replay, stopped_at: int, n: int) -> float:
    """The rate a sampled replay starts at after ``replay`` stopped over its budget having seen
    ``stopped_at`` of ``n`` requests: the power of two nearest to the share that fills
    SAMPLED_FILL of the budget with the distinct blocks projected to the whole table (at most
    1/2; a power of two, so that a table growing by days keeps it until the table doubles; a
    rate whose sample does not fit halves as it goes)."""
    assert replay.budget is not None
    projected = replay.keys_max * n / max(stopped_at, 1)
    return power_of_two_rate(SAMPLED_FILL * replay.budget / max(projected, 1.0))


class _SampledPass(_Pass):
    """A sampled replay over the chains (:meth:`Replay.feed_sampled`), grouped by namespace
    or by (namespace, tenant); with ``hits``, the ages of its held blocks to their
    ``retention``."""

    def __init__(self, plan: _Plan, replay: Replay, *, tenant: bool, hits: HitTotals | None):
        super().__init__(plan)
        self.replay = replay
        self.tenant = tenant
        self.hits = hits

    def feed(self, chunks: RequestChunks) -> None:
        for _, _, c, _ in self.chunks(chunks):
            flat = c.flat
            group = _tenant_codes(c) if self.tenant else c.namespace
            ages, weight = self.replay.feed_sampled(
                flat.offsets, flat.values, c.chain_blocks, c.limit, c.known, c.time_us, group
            )
            self.seen += int(c.known.shape[0])
            if self.hits is not None and ages.shape[0]:
                weights = np.full(ages.shape[0], round(_AGE_WEIGHT * weight), np.int64)
                self.hits.retention.add(ages / 1e6, weights)


class _SameTenantPass(_Pass):
    """The same-tenant replay, exact: its hit tokens in :attr:`total`; past its budget it
    stops (:attr:`stopped_at`: the requests it had seen)."""

    def __init__(self, plan: _Plan, replay: Replay) -> None:
        super().__init__(plan)
        self.replay = replay
        self.total = 0
        self.stopped_at = 0

    def feed(self, chunks: RequestChunks) -> None:
        if self.replay.overflowed:
            return
        for _, _, c, _ in self.chunks(chunks):
            flat = c.flat
            hit, _, _ = self.replay.feed(
                flat.offsets, flat.values, c.chain_blocks, c.known, c.time_us, _tenant_codes(c)
            )
            self.seen += int(c.known.shape[0])
            if self.replay.overflowed:
                self.stopped_at = self.seen
                return
            tokens = np.minimum(hit.astype(np.int64), c.limit) * self.plan.block_size
            self.total += int(tokens[c.known].sum())


def _replay_estimate(replay: Replay) -> dict[str, Any] | None:
    if not replay.sampled:
        return None
    assert replay.budget is not None
    return {"rate": replay.rate, "blocks_budget": replay.budget, "blocks_kept": replay.keys_max}


@dataclass(frozen=True)
class _WholeTable:
    """Every pass started and fed the whole table (nothing kept): what
    :meth:`pipeline.resume.DayPasses.carried` does with nothing to carry on."""

    chunks: RequestChunks

    def carried(
        self,
        name: str,
        label: str,
        made_of: dict[str, Any],
        about: dict[str, Any],
        kind: type[Pass],
        start: Callable[[Path], Pass],
        placed: Callable[[Pass, Path], None] | None = None,
    ) -> Pass:
        streamed = start(Path())
        streamed.feed(self.chunks)
        return streamed


# The passes' names where they are kept between days (pipeline.prefix.days).
FIRST, SHARED_SAMPLED, SAME_TENANT, SAME_TENANT_SAMPLED = (
    "first",
    "shared-sampled",
    "same-tenant",
    "same-tenant-sampled",
)
PASS_NAMES = (FIRST, SHARED_SAMPLED, SAME_TENANT, SAME_TENANT_SAMPLED)


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
    check_min_blocks(config.min_session_match_blocks)
    lazy = requests.lazy()
    plan = plan_of(TableSummary.of(lazy), config)
    spilled = (
        reserve_beside(spill) if spill is not None and plan.n > SESSIONS_IN_MEMORY_MAX else None
    )
    sink = _Sessions(spilled)
    summary, curve, first = analysed(plan, config, _WholeTable(lambda: [lazy]), lambda _: sink)
    sessions_frame = sink.frame(first.stream, lazy)
    result = PrefixResult.from_json(
        summary, curve, sessions_frame, () if spilled is None else (spilled,)
    )
    if spilled is not None:
        # the file goes with the result (stage.write copies it into place)
        weakref.finalize(result, spilled.unlink, missing_ok=True)
    return result


def analysed(
    plan: _Plan,
    config: PrefixConfig,
    passes: DayPasses | _WholeTable,
    sink: Callable[[Path], SessionSink],
    placed: Callable[[_FirstPass, Path], None] | None = None,
) -> tuple[dict[str, Any], pl.DataFrame, _FirstPass]:
    """The summary (but the sessions file) and the curve of the table ``plan`` plans, its
    passes run by ``passes`` (``sink``: where the first pass, started in a folder, writes the
    sessions; ``placed``: a first pass read back told its folder); returns the first pass
    too, whose sink holds the sessions (its other state released)."""
    min_blocks = config.min_session_match_blocks
    n, n_known, block_size = plan.n, plan.n_known, plan.block_size
    buckets = config.reuse_age_buckets_s
    buckets_us = np.array([t * 1e6 for t in buckets], dtype=np.float64)
    budget = config.reuse_block_budget
    windows = np.array(window_grid(block_size, plan.max_prompt), np.int64) // block_size
    hashes = sum(window_reach(windows, plan.reach))
    rate_now = curve_rate(hashes, config.curve_hash_budget)
    about = plan.about()
    facts = plan.pass_facts(config, about)

    first = passes.carried(
        FIRST,
        "prefix sharing",
        {**facts, "pass": FIRST, "curve_rate": rate_now},
        {"curve sample rate": sample_rate_text(rate_now), **about},
        _FirstPass,
        lambda folder: _FirstPass(plan, config, sink(folder)),
        placed,
    )
    totals = first.stream.finish()
    counter, shared, hits = first.counter, first.shared, first.hits
    shared.close()
    errors: dict[str, Any] = {}
    if first.stopped_at:
        # Over its budget: the chains again, for a sampled replay sized from what it had seen.
        rate = _sampled_rate(shared, first.stopped_at, n)
        sampled = passes.carried(
            SHARED_SAMPLED,
            "prefix sharing's sampled replay",
            {**facts, "pass": SHARED_SAMPLED, "rate": rate},
            {**about, "reuse sample rate": sample_rate_text(rate)},
            _SampledPass,
            lambda _: _SampledPass(
                plan,
                Replay(plan.time_bits, buckets_us, with_age=True, budget=budget, rate=rate),
                tenant=False,
                hits=HitTotals(buckets),
            ),
        )
        shared = sampled.replay
        shared.close()
        assert sampled.hits is not None
        hits = sampled.hits
        errors = estimate_hits(hits, first.prompt, shared, block_size)
    prompt = first.prompt
    same: Replay | None = None
    if plan.groups.tenants is not None:
        same, sampled_same = _same_tenant(plan, config, passes, facts, about, shared.rate, hits)
        if sampled_same:
            errors["isolated_hit_share_standard_error"] = estimate_same_tenant(
                hits, prompt, same, block_size
            )

    # Count-only traces: no block structure, so no curve (and nothing can hit).
    curve = counter.finish() if counter is not None else pl.DataFrame(schema=CURVE_SCHEMA)
    classification = classify_curve(curve, plan.median_prompt)
    reuse = summary_of(prompt, hits)
    estimate = _estimate(config, counter, hashes, shared, same, hits, errors, totals)
    # let the tables go before the sessions are named (the largest thing then kept in memory)
    first.counter = None
    first.shared = Replay(1, np.zeros(0), with_age=False)
    del hits, counter, shared, same
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
    return summary, curve, first


def _same_tenant(
    plan: _Plan,
    config: PrefixConfig,
    passes: DayPasses | _WholeTable,
    facts: dict[str, Any],
    about: dict[str, Any],
    shared_rate: float,
    hits: HitTotals,
) -> tuple[Replay, bool]:
    """The same-tenant replay (its exact hit tokens added to ``hits``), and whether it was
    sampled (its estimate then to be made). Its table (one entry per distinct (block,
    tenant)) is about as large as the shared one: a pass of its own, after the shared table is
    gone, keeps the peak at one of them. Sampled from the start, at the shared replay's final
    rate, when that one was; else exact, and sampled again from the start past its budget."""
    budget, no_buckets = config.reuse_block_budget, np.zeros(0, np.float64)
    start_rate = min(1.0, shared_rate)
    facts = {**facts, "rate": start_rate}
    about = {**about, "isolated sample rate": sample_rate_text(start_rate)}
    rate = start_rate
    if start_rate >= 1.0:
        exact = passes.carried(
            SAME_TENANT,
            "prefix sharing's same-tenant replay",
            {**facts, "pass": SAME_TENANT},
            about,
            _SameTenantPass,
            lambda _: _SameTenantPass(plan, Replay(1, no_buckets, with_age=False, budget=budget)),
        )
        exact.replay.close()
        if not exact.stopped_at:
            hits.add_same_tenant(exact.total)
            return exact.replay, False
        rate = _sampled_rate(exact.replay, exact.stopped_at, plan.n)
    isolated = passes.carried(
        SAME_TENANT_SAMPLED,
        "prefix sharing's sampled same-tenant replay",
        {**facts, "pass": SAME_TENANT_SAMPLED, "sampled_rate": rate},
        {**about, "isolated sample rate": sample_rate_text(rate)},
        _SampledPass,
        lambda _: _SampledPass(
            plan,
            Replay(1, no_buckets, with_age=False, budget=budget, rate=rate),
            tenant=True,
            hits=None,
        ),
    )
    isolated.replay.close()
    return isolated.replay, True


def _tenant_codes(c: _Arrays) -> npt.NDArray[np.int64]:
    assert c.tenant is not None
    return c.tenant


def _estimate(
    config: PrefixConfig,
    counter: CurveCounter | None,
    hashes: int,
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
            "hashes": hashes,
            "hash_budget": config.curve_hash_budget,
            "sharing_standard_errors": counter.standard_errors,
        }
        log.warning(
            "prefix curve: %d per-window hashes exceed curve_hash_budget %d; the curve's "
            "sharing counts are a sampled estimate (rate %.4g, standard errors %s)",
            hashes,
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
