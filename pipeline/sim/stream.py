"""A scenario replayed by streaming the request table in arrival order, chunk by chunk.

:func:`simulate_streamed` gives the summary :func:`pipeline.sim.replay.summarise` gives for
:func:`pipeline.sim.replay.simulate` on the whole table, field for field, without holding the
whole table: each chunk (a part of the canonical table, or a slice of one) is flattened on its
own (:func:`pipeline.sim.blocks.sim_input`), its blocks looked up in slot tables kept from
chunk to chunk (:class:`pipeline.sim.slots.BlockSlots`: a block holds a slot, a row of state,
while it is cached on some replica; a block new to the table takes a free one), and replayed
from the state the previous chunk left (:func:`pipeline.sim.kernels.replay_chunk`). The
replays of one block size, isolation, lifetime and replica count share a table (one lookup a
chunk, one slot a block), each with its own state in it. The slots of blocks cached nowhere are
reclaimed when more are needed, so a table follows the blocks its replays cache or pin, plus
one chunk's (:attr:`StreamedRun.peak_state_rows`), however many distinct blocks the quarter
has. What carries over: every replica's block state and free queue, the requests still running
(their chains, replica and finish time: their release is still to come; they keep their place,
the finished ones dropped now and then), the requests in flight per replica, and the routers'
counters (round-robin position, tokens or requests served, the random generator). Per-request
outcomes are summed per replica chunk by chunk.

The affinity routings need each request's session: the logged id, read chunk by chunk, else
inferred chunk by chunk with the inference's state carried from chunk to chunk
(:class:`pipeline.prefix.sessions.SessionStream`, the whole table's sessions while its state
budget holds; past it the least recently active sessions close early, as in the prefix stage).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from numpy.typing import NDArray

from pipeline.arrays import Tokens, narrow
from pipeline.prefix.cache_rules import NAMESPACE_COLUMNS, namespace_codes
from pipeline.prefix.hashmap import dense_ids
from pipeline.prefix.sessions import SessionStream
from pipeline.resume import RequestChunks as RequestChunks
from pipeline.resume import part_chunks as part_chunks
from pipeline.shape.facts import LatencyModel
from pipeline.sim import kernels
from pipeline.sim.blocks import (
    FLATTENED_COLUMNS,
    ContentCoverage,
    SimInputs,
    SimulationInputError,
    sim_input,
)
from pipeline.sim.config import ROUTINGS, Scenario, SimConfig
from pipeline.sim.replay import (
    REPLICA_SUMS,
    RunTotals,
    WorkloadTotals,
    check_scenario,
    summarise_totals,
)
from pipeline.sim.slots import BlockSlots

I64 = NDArray[np.int64]
U64 = NDArray[np.uint64]


def frame_chunks(frame: pl.DataFrame, rows: int) -> RequestChunks:
    """``frame`` (in arrival order) as chunks of ``rows`` requests."""
    if rows < 1:
        raise SimulationInputError(f"chunk rows must be positive, got {rows}")
    return lambda: (frame.slice(lo, rows).lazy() for lo in range(0, frame.height, rows))


@dataclass(frozen=True)
class RequestStream:
    """A request table to stream (:func:`simulate_streamed`): its chunks, the latency model of
    its durations, and the most requests flattened at once (None: a chunk at a time)."""

    chunks: RequestChunks
    latency_model: LatencyModel
    max_rows: int | None = None

    def simulate(
        self,
        scenario: Scenario,
        settings: SimConfig,
        *,
        with_instant: bool = True,
        per_request: bool = False,
    ) -> StreamedRun:
        return simulate_streamed(
            self.chunks,
            scenario,
            settings,
            latency_model=self.latency_model,
            max_rows=self.max_rows,
            with_instant=with_instant,
            per_request=per_request,
        )

    def simulate_many(self, scenarios: list[Scenario], settings: SimConfig) -> list[StreamedRun]:
        return simulate_many(
            self.chunks,
            scenarios,
            settings,
            latency_model=self.latency_model,
            max_rows=self.max_rows,
        )


@dataclass(frozen=True)
class StreamedRun:
    """One scenario's summary document and how much block state the streamed replay held."""

    summary: dict[str, Any]
    chunks: int
    # of the slot tables its replays share with like ones (their lifetime and replica count):
    peak_live_blocks: int  # most blocks cached on some replica when slots were reclaimed
    peak_state_rows: int  # most block rows (slots) held: cached blocks, new ones, spare room
    distinct_blocks: int  # blocks numbered over all chunks (counting a block once a chunk)
    peak_chunk_blocks: int  # most distinct blocks in one chunk
    peak_pinned_total: int  # most blocks pinned on all replicas together at a chunk's end
    peak_running: int  # most requests still running at a chunk's end (carried to the next)
    # each request's prompt and hit tokens (its lifetime's), in arrival order, when asked for
    per_request: PerRequest | None = None


@dataclass(frozen=True)
class PerRequest:
    """Every request's prompt tokens and the prompt tokens it found cached, in arrival order
    (int32 where they fit: :mod:`pipeline.arrays`), with the table's prompt-content coverage
    (what the capacity stage's fleet replay reads)."""

    prompt_tokens: Tokens
    hit_tokens: Tokens
    coverage: ContentCoverage


def simulate_streamed(
    chunks: RequestChunks,
    scenario: Scenario,
    settings: SimConfig,
    *,
    latency_model: LatencyModel,
    max_rows: int | None = None,
    with_instant: bool = True,
    per_request: bool = False,
) -> StreamedRun:
    """Replay ``scenario`` over ``chunks`` (the table in arrival order), each cut into slices
    of at most ``max_rows`` requests; the summary is :func:`pipeline.sim.replay.summarise`'s
    of :func:`pipeline.sim.replay.simulate` on the whole table."""
    return simulate_many(
        chunks,
        [scenario],
        settings,
        latency_model=latency_model,
        max_rows=max_rows,
        with_instant=with_instant,
        per_request=per_request,
    )[0]


def simulate_many(
    chunks: RequestChunks,
    scenarios: list[Scenario],
    settings: SimConfig,
    *,
    latency_model: LatencyModel,
    max_rows: int | None = None,
    with_instant: bool = True,
    per_request: bool = False,
) -> list[StreamedRun]:
    """:func:`simulate_streamed` of every scenario in one pass over the chunks: each chunk is
    read and flattened once for all of them (their block states side by side, each bounded
    by its caches). ``per_request``: each run keeps every request's hit tokens too (8 bytes a
    request and one a scenario)."""
    needs_sessions = any(routes_by_session(s.routing) for s in scenarios)
    streamed = StreamPass(
        scenarios,
        settings,
        TableFacts.of(chunks, needs_sessions),
        latency_model=latency_model,
        max_rows=max_rows,
        with_instant=with_instant,
        per_request=per_request,
    )
    streamed.feed(chunks)
    return streamed.finish()


def routes_by_session(routing: str) -> bool:
    """Whether ``routing`` reads each request's session (the summary counts the inferred
    sessions of an affinity routing, one replica or more)."""
    return routing.endswith("affinity")


@dataclass(frozen=True)
class TableFacts:
    """What a pass reads of the whole table before its first chunk: the one stored block size
    (a chunk without content takes it) and whether any request lacks a logged session an
    affinity routing needs (then every request's session comes from the inference's stream).
    A pass carried to more chunks (:class:`StreamPass`) needs the same facts of the longer
    table."""

    block_size: int | None
    infer_sessions: bool

    @classmethod
    def of(
        cls, chunks: RequestChunks, needs_sessions: bool, parts: Sequence[Path] = ()
    ) -> TableFacts:
        """The facts of the table ``chunks`` read; from the Parquet statistics of its
        ``parts`` (the same table's files) where they settle them, without reading a value (a
        quarter's 192 parts at 100M requests: 0.2 s, against 4.7 s read)."""
        settled = _settled_facts(parts, needs_sessions) if parts else None
        if settled is not None:
            return settled
        return cls(_table_block_size(chunks), needs_sessions and Sessions.missing(chunks))


def _settled_facts(parts: Sequence[Path], needs_sessions: bool) -> TableFacts | None:
    """:class:`TableFacts` from the parts' row-group statistics: every ``block_size`` group one
    value or none, and the ``session_id`` groups' null counts; None when a group has no
    statistics or more than one block size (read then: the error names them all)."""
    sizes: set[int] = set()
    missing = False
    for part in parts:
        meta = pq.ParquetFile(part).metadata
        columns = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if "block_size" in columns:
                stats = group.column(columns["block_size"]).statistics
                if stats is None or not stats.has_null_count:
                    return None
                if stats.null_count < group.num_rows:
                    if not stats.has_min_max or stats.min != stats.max:
                        return None
                    sizes.add(int(stats.min))
            if needs_sessions and group.num_rows:
                if "session_id" not in columns:
                    return None
                stats = group.column(columns["session_id"]).statistics
                if stats is None or not stats.has_null_count:
                    return None
                missing |= stats.null_count > 0
    if len(sizes) > 1:
        return None
    return TableFacts(sizes.pop() if sizes else None, missing)


class StreamPass:
    """:func:`simulate_many`'s pass, fed chunks in arrival order (:meth:`feed`, as often as
    more of the table comes) and summed up at the end (:meth:`finish`). Between feeds it holds
    only what the replays carry from chunk to chunk (bounded by the caches, the module
    docstring), so it can be kept (pickled) at the end of one day and fed the next days later:
    the summaries are those of one pass over all of them (:mod:`pipeline.sim.resume`)."""

    def __init__(
        self,
        scenarios: list[Scenario],
        settings: SimConfig,
        facts: TableFacts,
        *,
        latency_model: LatencyModel,
        max_rows: int | None = None,
        with_instant: bool = True,
        per_request: bool = False,
    ) -> None:
        for scenario in scenarios:
            check_scenario(scenario, settings)
            if scenario.routing not in ROUTINGS:
                raise SimulationInputError(
                    f"unknown routing {scenario.routing!r}; choose from {list(ROUTINGS)}"
                )
        self.facts = facts
        self.latency_model = latency_model
        self.max_rows = max_rows
        self.runs = [_ScenarioStream(s, settings, with_instant, per_request) for s in scenarios]
        self.tables = _SlotTables([replay for run in self.runs for replay in run.replays])
        needs_sessions = any(run.router.needs_sessions for run in self.runs)
        self.sessions = Sessions(facts.infer_sessions) if needs_sessions else None
        self.namespaces = {iso: _Namespaces(iso) for iso in (False, True)}
        self.totals = _Totals()
        self.order = StreamOrder()

    def feed(self, chunks: RequestChunks) -> None:
        """Replay ``chunks``, the next of the table (after every chunk fed before)."""
        runs, totals, tables = self.runs, self.totals, self.tables
        sessions, namespaces = self.sessions, self.namespaces
        threads = ThreadPoolExecutor(1) if (os.cpu_count() or 1) > 1 else None
        try:
            for chunk in flattened_after(
                chunks, self.latency_model, self.max_rows, self.facts.block_size, self.order
            ):
                totals.add(chunk)
                blocks = {
                    key: _ChunkBlocks.of(chunk, *key, namespaces[key[1]])
                    for key in dict.fromkeys(run.blocks_key for run in runs)
                }
                slots = tables.find(blocks)
                home = sessions.hashes(chunk) if sessions is not None else None
                for run in runs:
                    run.feed(chunk, self.order.start, blocks[run.blocks_key], slots, home, threads)
                self.order.start += chunk.n
        finally:
            if threads is not None:
                threads.shutdown()

    @property
    def requests(self) -> int:
        """The requests fed so far."""
        return self.totals.requests

    def finish(self) -> list[StreamedRun]:
        """Every scenario's run over the chunks fed so far."""
        totals = self.totals
        if totals.requests == 0:
            raise SimulationInputError("request table is empty: nothing to replay")
        workload = totals.workload(self.latency_model)
        inferred = self.sessions.inferred if self.sessions is not None else 0
        return [run.finish(workload, inferred, totals.chunks) for run in self.runs]


@dataclass(frozen=True)
class _ChunkBlocks:
    """A chunk's requests at one block size (and isolation), numbered within the chunk."""

    offsets: I64
    ids: Any  # chunk-dense ids of (namespace, block hash)
    n_ids: int
    keys: _Keys  # key of each chunk id
    prompt_blocks: I64
    missing: I64
    hit_limit: I64

    @classmethod
    def of(
        cls, chunk: SimInputs, block_size: int, isolation: bool, namespaces: _Namespaces
    ) -> _ChunkBlocks:
        offsets, hashes = chunk.chains(block_size)
        lengths = np.diff(offsets)
        prompt_blocks, missing, hit_limit = chunk.request_blocks(block_size, lengths)
        per_block_ns = np.repeat(namespaces.codes(chunk), lengths)
        ids, n_ids = _pair_ids(hashes, per_block_ns)
        keys = _Keys.of(ids, n_ids, hashes, per_block_ns)
        return cls(offsets, ids, n_ids, keys, prompt_blocks, missing, hit_limit)


class _ScenarioStream:
    """One scenario's replays (its lifetime's, and the instant one beside durations), router
    and per-replica sums, fed a chunk at a time."""

    def __init__(
        self, scenario: Scenario, settings: SimConfig, with_instant: bool, per_request: bool
    ) -> None:
        self.scenario = scenario
        self.settings = settings
        self.with_instant = with_instant
        replicas = scenario.replicas
        self.capacity = scenario.cache_tokens // scenario.block_size
        self.lifetime = settings.request_lifetime
        self.routing = kernels.FIXED
        if replicas > 1 and scenario.routing == "least-loaded":
            self.routing = kernels.LEAST_LOADED
        elif replicas > 1 and scenario.routing == "cache-aware":
            self.routing = kernels.CACHE_AWARE
        lifetimes = [self.lifetime]
        if self.lifetime == "durations" and with_instant:
            lifetimes.append("instant")
        self.replays = [
            _Replay(replicas, self.capacity, self.routing, life == "instant", scenario, settings)
            for life in lifetimes
        ]
        self.blocks_key = (scenario.block_size, scenario.tenant_isolation)
        self.router = Router(scenario.routing, scenario.replicas, settings)
        self.sums = np.zeros((len(REPLICA_SUMS), replicas), np.int64)
        self.hit_tokens = 0
        self.hit_tokens_instant = 0
        self.distinct = 0
        self.peak_chunk = 0
        # per chunk: its prompt and hit tokens (kept only when per_request is asked for)
        self.kept: list[tuple[Tokens, Tokens]] | None = [] if per_request else None

    def feed(
        self,
        chunk: SimInputs,
        start: int,
        blocks: _ChunkBlocks,
        slots: dict[_TableKey, Any],
        home: U64 | None,
        threads: ThreadPoolExecutor | None,
    ) -> None:
        self.distinct += blocks.n_ids
        self.peak_chunk = max(self.peak_chunk, blocks.n_ids)
        work = _ChunkWork(
            blocks.offsets,
            blocks.prompt_blocks,
            blocks.missing,
            blocks.hit_limit,
            chunk.prompt_tokens,
            chunk.arrival_us,
            chunk.duration_us,
            self.router.assign(start, chunk, home),
        )
        replays = self.replays
        ids = [slots[replay.table_key] for replay in replays]
        if threads is not None and len(replays) > 1:
            other = threads.submit(replays[1].step, work, ids[1])
            hits = replays[0].step(work, ids[0])
            instant_hits = other.result()
        else:
            hits = replays[0].step(work, ids[0])
            instant_hits = replays[1].step(work, ids[1]) if len(replays) > 1 else hits
        replica = replays[0].last_chosen
        content = np.where(chunk.hashes_known, chunk.prompt_tokens, 0)
        self.sums[0] += np.bincount(replica, minlength=self.scenario.replicas)
        for row, values in enumerate((chunk.prompt_tokens, content, chunk.output_tokens, hits), 1):
            np.add.at(self.sums[row], replica, values)
        self.hit_tokens += int(hits.sum())
        self.hit_tokens_instant += int(instant_hits.sum())
        if self.kept is not None:
            # int32 where they fit: at 100M requests the two columns held 1.6 GB as int64
            self.kept.append((narrow(chunk.prompt_tokens), narrow(np.asarray(hits))))

    def finish(self, workload: WorkloadTotals, sessions_inferred: int, chunks: int) -> StreamedRun:
        replicas, replays = self.scenario.replicas, self.replays
        instant_total: int | None = self.hit_tokens_instant
        if self.lifetime == "durations" and not self.with_instant:
            instant_total = None
        replica_sums = pl.DataFrame(
            {
                "replica": np.arange(replicas, dtype=np.int64),
                **{name: self.sums[row] for row, name in enumerate(REPLICA_SUMS)},
            }
        )
        run = RunTotals(
            scenario=self.scenario,
            capacity_blocks=self.capacity,
            replica_sums=replica_sums,
            hit_tokens=self.hit_tokens,
            hit_tokens_instant=instant_total,
            spills=self.router.spills,
            balance_routed=replays[0].balance_routed,
            request_lifetime=self.lifetime,
            replica_slots=self.settings.replica_slots,
            peak_pinned_blocks=replays[0].queue[:, kernels._PEAK].copy(),
            cache_aware=(
                self.settings.cache_aware if self.routing == kernels.CACHE_AWARE else None
            ),
            shed_requests=replays[0].shed,
            request_timeout_s=self.settings.request_timeout_s,
        )
        return StreamedRun(
            summary=summarise_totals(workload, run, lambda: sessions_inferred),
            chunks=chunks,
            peak_live_blocks=max(r.table.peak_live for r in replays),
            peak_state_rows=max(r.peak_rows for r in replays),
            distinct_blocks=self.distinct,
            peak_chunk_blocks=self.peak_chunk,
            peak_pinned_total=max(r.peak_pinned_total for r in replays),
            peak_running=max(r.peak_running for r in replays),
            per_request=None if self.kept is None else self._per_request(workload),
        )

    def _per_request(self, workload: WorkloadTotals) -> PerRequest:
        kept, self.kept = self.kept or [], None
        prompts, hits = [p for p, _ in kept], [h for _, h in kept]
        del kept
        # one column at a time, its chunks let go once joined: a third less held at the join
        return PerRequest(_joined(prompts), _joined(hits), workload.coverage)


def _joined(parts: list[Tokens]) -> Tokens:
    """``parts`` end to end (emptied as they are joined; int64 if any part is: each was
    narrowed as it was kept)."""
    joined = cast(Tokens, np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    parts.clear()
    return joined


# ---------------------------------------------------------------------------------------------
# Chunks
# ---------------------------------------------------------------------------------------------


def _collected(chunk: pl.LazyFrame, columns: Iterable[str]) -> pl.DataFrame:
    present = chunk.collect_schema().names()
    return chunk.select(c for c in columns if c in present).collect()


def _table_block_size(chunks: RequestChunks) -> int | None:
    """The one stored block size of the whole table (None: it has no ``block_size`` at all,
    which :func:`sim_input` then reports), as :func:`sim_input` checks it on a whole table."""
    sizes: set[int] = set()
    for chunk in chunks():
        if "block_size" in chunk.collect_schema().names():
            column = chunk.select(pl.col("block_size").drop_nulls().unique()).collect()
            sizes.update(int(v) for v in column["block_size"])
    if len(sizes) > 1:
        raise SimulationInputError(
            f"block_size must be one value for the whole table, found {sorted(sizes)}"
        )
    return sizes.pop() if sizes else None


@dataclass
class StreamOrder:
    """Where a stream is: the parts read, the requests replayed and the last one's arrival
    (each part must arrive after the parts before it)."""

    parts: int = 0
    start: int = 0
    last_arrival: int | None = None


def flattened_after(
    chunks: RequestChunks,
    latency_model: LatencyModel,
    max_rows: int | None,
    stored: int | None,
    order: StreamOrder,
) -> Iterator[SimInputs]:
    """Each non-empty chunk of ``chunks`` (the next of the table, after those ``order`` has
    seen) flattened (:func:`sim_input`), in slices of ``max_rows``, in arrival order across
    chunks (a chunk whose requests arrive before the previous chunk's last is an error);
    ``order`` carried along. A chunk of requests without content (no block size of its own)
    takes the table's, ``stored`` (:attr:`TableFacts.block_size`)."""
    for chunk in chunks():
        number = order.parts
        order.parts += 1
        frame = _collected(chunk, FLATTENED_COLUMNS)
        if frame.height == 0:
            continue
        if stored is not None:
            frame = frame.with_columns(
                pl.col("block_size").fill_null(stored)
                if "block_size" in frame.columns
                else pl.lit(stored, pl.Int32).alias("block_size")
            )
        if frame["arrival"].null_count() == 0 and not frame["arrival"].is_sorted():
            frame = frame.sort("arrival", maintain_order=True)
        rows = max_rows or frame.height
        for lo in range(0, frame.height, rows):
            part = sim_input(frame.slice(lo, rows), latency_model=latency_model)
            if order.last_arrival is not None and int(part.arrival_us[0]) < order.last_arrival:
                raise SimulationInputError(
                    f"requests chunk {number} arrives before the end of the previous one: the "
                    "canonical table's parts are not in arrival order (ingest the trace again)"
                )
            order.last_arrival = int(part.arrival_us[-1])
            yield part
        del frame


@dataclass
class _Totals:
    """The workload's counts and sums, chunk by chunk (:class:`WorkloadTotals` at the end)."""

    chunks: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    content_requests: int = 0
    content_prompt_tokens: int = 0
    durations_estimated: int = 0

    def add(self, chunk: SimInputs) -> None:
        self.chunks += 1
        self.requests += chunk.n
        self.prompt_tokens += int(chunk.prompt_tokens.sum())
        self.output_tokens += int(chunk.output_tokens.sum())
        self.content_requests += int(chunk.hashes_known.sum())
        self.content_prompt_tokens += int(chunk.prompt_tokens[chunk.hashes_known].sum())
        self.durations_estimated += chunk.durations_estimated

    def workload(self, latency_model: LatencyModel) -> WorkloadTotals:
        total = self.prompt_tokens
        share = self.content_prompt_tokens / total if total else None
        coverage = ContentCoverage(self.content_requests, self.content_prompt_tokens, share)
        return WorkloadTotals(
            self.requests,
            self.prompt_tokens,
            self.output_tokens,
            coverage,
            self.durations_estimated,
            latency_model,
        )


class _Namespaces:
    """Cache namespace codes that agree across chunks: (model, lora_adapter[, tenant]) numbered
    in order of first appearance over the whole table."""

    def __init__(self, tenant_isolation: bool) -> None:
        self.isolation = tenant_isolation
        self.names = [*NAMESPACE_COLUMNS, *(("tenant",) if tenant_isolation else ())]
        self.known: dict[tuple[Any, ...], int] = {}

    def codes(self, chunk: SimInputs) -> I64:
        frame = chunk.tenant_source
        if frame is None:
            raise SimulationInputError("the namespaces of this chunk are not available")
        local = namespace_codes(frame, tenant_isolation=self.isolation)
        keys = frame.select(pl.col(c).cast(pl.String) for c in self.names)
        distinct = keys.unique(maintain_order=True).rows()
        mapping = np.array(
            [self.known.setdefault(row, len(self.known)) for row in distinct], np.int64
        )
        codes: I64 = mapping[local]
        return codes


def _pair_ids(hashes: U64, namespace: U64 | I64) -> tuple[Any, int]:
    """Dense ids of (namespace, hash) per block, in order of first appearance (ids of
    :func:`pipeline.prefix.cache_rules.namespaced_ids`, per block instead of per request)."""
    ids, n_ids = dense_ids(hashes)
    if namespace.size == 0 or int(namespace.max()) == int(namespace.min()):
        return ids, n_ids
    return dense_ids(namespace.astype(np.uint64) * np.uint64(max(n_ids, 1)) + ids.astype(np.uint64))


@dataclass(frozen=True)
class _Keys:
    """The (hash, namespace) key of every dense id."""

    hashes: U64
    namespace: I64

    @classmethod
    def of(cls, ids: Any, n_ids: int, hashes: U64, namespace: I64) -> _Keys:
        by_id = np.zeros(n_ids, np.uint64)
        ns = np.zeros(n_ids, np.int64)
        by_id[ids] = hashes  # every occurrence of an id carries the same key
        ns[ids] = namespace
        return cls(by_id, ns)


@dataclass(frozen=True)
class _ChunkWork:
    """A chunk's requests at the scenario's block size (their blocks' slots: each replay's
    table's)."""

    offsets: I64
    prompt_blocks: I64
    missing: I64
    hit_limit: I64
    prompt_tokens: I64
    arrival: I64
    duration: I64
    chosen: I64  # replica per request (FIXED routing; 0 for the routers)


# ---------------------------------------------------------------------------------------------
# Routing decided before the replay, chunk by chunk
# ---------------------------------------------------------------------------------------------


class Router:
    """The replica of every request for the routings that read no cache state or load
    (:func:`pipeline.sim.replay.assign`), decided a chunk at a time with its counters carried
    (the streamed scenarios and the sampled curves)."""

    def __init__(self, routing: str, replicas: int, settings: SimConfig) -> None:
        self.routing = routing
        self.replicas = replicas
        self.margin = settings.bounded_affinity_margin
        self.rng = np.random.default_rng(settings.random_seed)
        self.served = np.zeros(self.replicas, np.int64)
        self.spills = 0
        self.needs_sessions = routes_by_session(routing)

    def assign(self, start: int, chunk: SimInputs, session: U64 | None) -> I64:
        n, replicas = chunk.n, self.replicas
        if replicas == 1 or self.routing in ("least-loaded", "cache-aware"):
            return np.zeros(n, np.int64)
        if self.routing == "round-robin":
            return np.arange(start, start + n, dtype=np.int64) % replicas
        if self.routing == "random":
            # the generator carries its position: chunk draws continue one draw of them all
            return self.rng.integers(0, replicas, size=n, dtype=np.int64)
        if self.routing == "least-served":
            tokens = chunk.prompt_tokens + chunk.output_tokens
            out: I64 = kernels.least_served_from(tokens, self.served)
            return out
        if session is None:
            raise SimulationInputError(f"routing {self.routing!r} needs the sessions")
        home = (session % np.uint64(replicas)).astype(np.int64)
        if self.routing == "affinity":
            return home
        if self.routing == "bounded-affinity":
            replica, spills = kernels.bounded_affinity_from(home, self.served, start, self.margin)
            self.spills += int(spills)
            return replica  # type: ignore[no-any-return]
        raise SimulationInputError(f"unknown routing {self.routing!r}")


class Sessions:
    """Each request's session hash (:attr:`SimInputs.session_hash`), chunk by chunk: the logged
    id, else (``infer``: some request of the table has none, :meth:`missing`) inferred with the
    state of the chunks before carried over (:class:`pipeline.prefix.sessions.SessionStream`:
    the whole table's sessions, until its state budget closes the least recently active early
    on a table of many millions)."""

    def __init__(self, infer: bool) -> None:
        self.stream = SessionStream() if infer else None
        self.inferred = 0

    @staticmethod
    def missing(chunks: RequestChunks) -> bool:
        """Whether a request of the table has no logged session."""
        return any(
            int(c.select(pl.col("session_id").null_count()).collect().item())
            if "session_id" in c.collect_schema().names()
            else int(c.select(pl.len()).collect().item())
            for c in chunks()
        )

    def hashes(self, chunk: SimInputs) -> U64:
        """The next chunk's sessions (every chunk in arrival order, each once)."""
        if self.stream is None:
            return chunk.session_hash
        hashes, inferred = chunk.sessions_by(self.stream.feed)
        self.inferred += inferred
        return hashes


# ---------------------------------------------------------------------------------------------
# One lifetime's replay, carried from chunk to chunk
# ---------------------------------------------------------------------------------------------


def _room(array: Any, size: int) -> Any:
    """``array``, or a copy half as long again (or ``size``) when it is shorter than ``size``."""
    if array.shape[0] >= size:
        return array
    grown = np.empty((max(size, 3 * array.shape[0] // 2), *array.shape[1:]), array.dtype)
    grown[: array.shape[0]] = array
    return grown


class _Requests:
    """A replay's requests as the chunk kernel reads them (CSR chains of slots and one value a
    request), kept from chunk to chunk: a chunk's requests are appended after the ones carried,
    so a request still running keeps its place and its chain is not copied again each chunk.
    The finished ones are dropped (:meth:`keep`) once they are half as many as the running
    ones: amortised, as at least that many came since the last time."""

    FIELDS = ("prompt_blocks", "missing", "hit_limit", "prompt_tokens", "arrival", "duration")

    def __init__(self) -> None:
        self.n = 0
        self.offsets = np.zeros(1, np.int64)
        self.ids = np.zeros(0, np.int32)
        self.chosen = np.zeros(0, np.int64)
        self.values = {name: np.zeros(0, np.int64) for name in self.FIELDS}

    def append(self, work: _ChunkWork, chunk_ids: Any) -> None:
        first, n = self.n, work.chosen.size
        start = int(self.offsets[first])
        end = start + chunk_ids.size
        self.offsets = _room(self.offsets, first + n + 1)
        self.offsets[first + 1 : first + n + 1] = work.offsets[1:] + start
        self.ids = _room(self.ids, end)
        self.ids[start:end] = chunk_ids
        self.chosen = _room(self.chosen, first + n)
        self.chosen[first : first + n] = work.chosen
        for name in self.FIELDS:
            self.values[name] = _room(self.values[name], first + n)
            self.values[name][first : first + n] = getattr(work, name)
        self.n = first + n

    def view(self, name: str) -> I64:
        out: I64 = self.values[name][: self.n]
        return out

    def keep(self, running: I64, pinned: bool) -> None:
        """Keep only requests ``running`` (ascending), renumbered 0.. in that order: their
        chains (none when nothing is ``pinned``), unknown blocks and replicas; the other
        values are read only on arrival, so they are zeroed."""
        offsets, ids = kernels.gather_chains(
            self.offsets[: self.n + 1], self.ids[: self.offsets[self.n]], running, pinned
        )
        missing = self.values["missing"][running] if pinned else np.zeros(running.size, np.int64)
        chosen = self.chosen[running]
        self.n = running.size
        self.offsets, self.ids, self.chosen = offsets, ids, chosen
        self.values = {name: np.zeros(self.n, np.int64) for name in self.FIELDS}
        self.values["missing"] = missing


@dataclass
class _Replay:
    replicas: int
    capacity: int
    routing: int
    instant: bool
    scenario: Scenario
    settings: SimConfig
    # the slot table (shared with like replays: _SlotTables) and this replay's state in it
    table: BlockSlots = field(init=False)
    member: int = field(init=False)
    buf: Any = None  # replicas × queue size int32
    queue: I64 = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    in_flight: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    # the requests carried and the heap of the running ones (finish time, request)
    requests: _Requests = field(default_factory=_Requests)
    finish: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    finishing: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    n_running: int = 0
    balance_routed: int = 0
    shed: int = 0  # requests request_timeout_s shed (never pinned: not carried)
    last_chosen: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    peak_rows: int = 0
    peak_pinned_total: int = 0
    peak_running: int = 0

    def __post_init__(self) -> None:
        r = self.replicas
        self.buf = np.zeros((r, 64), np.int32)
        self.queue = np.zeros((r, kernels._QUEUE_FIELDS), np.int64)
        self.in_flight = np.zeros(r, np.int64)

    def _queue_room(self, rows: int, per_request: int) -> None:
        """Free queues long enough for their live entries (at most min(capacity, blocks) plus
        one request's entries), four times over so compaction stays rare; grown, never shrunk."""
        need = 4 * (min(self.capacity, rows) + per_request) + 64
        if need >= 2**31 - 1:
            raise SimulationInputError(f"cache queue of {need:,} entries exceeds the 2^31 limit")
        if self.buf.shape[1] < need:
            grown = np.zeros((self.replicas, max(need, 2 * self.buf.shape[1])), np.int32)
            grown[:, : self.buf.shape[1]] = self.buf
            self.buf = grown

    @property
    def table_key(self) -> _TableKey:
        """Replays with the same key hold like blocks (about as many) and share a table."""
        s = self.scenario
        return (s.block_size, s.tenant_isolation, self.instant, self.replicas)

    def step(self, work: _ChunkWork, chunk_ids: Any) -> I64:
        """Replay one chunk (``chunk_ids``: its blocks' slots); returns its requests' hit
        tokens (``last_chosen``: their replicas)."""
        state = self.table.state[self.member]
        requests = self.requests
        first = requests.n
        requests.append(work, chunk_ids)
        n = requests.n
        per_request = int(np.diff(work.offsets).max(initial=0)) + 1
        self._queue_room(self.table.used, per_request)
        self.finish = _room(self.finish, self.n_running + work.chosen.size)
        self.finishing = _room(self.finishing, self.n_running + work.chosen.size)
        knobs = self.settings.cache_aware
        chosen = requests.chosen[:n]
        hits, shed, balance, n_running = kernels.replay_chunk(
            requests.offsets[: n + 1],
            requests.ids[: requests.offsets[n]],
            requests.view("prompt_blocks"),
            requests.view("missing"),
            requests.view("hit_limit"),
            requests.view("prompt_tokens"),
            self.scenario.block_size,
            requests.view("arrival"),
            requests.view("duration"),
            first,
            self.routing,
            self.capacity,
            self.instant,
            self.settings.replica_slots or 0,
            self.settings.timeout_us("instant" if self.instant else "durations"),
            knobs.cache_threshold,
            knobs.balance_abs_threshold,
            knobs.balance_rel_threshold,
            state,
            self.buf,
            self.queue,
            chosen,
            self.finish,
            self.finishing,
            self.n_running,
            self.in_flight,
        )
        self.n_running = n_running = int(n_running)
        self.balance_routed += int(balance)
        self.shed += int(shed[first:].sum())
        self.last_chosen = chosen[first:].copy()
        self.peak_rows = max(self.peak_rows, state.shape[0])
        self.peak_running = max(self.peak_running, n_running)
        if not self.instant:
            pinned = int(self.queue[:, kernels._PINNED].sum())
            self.peak_pinned_total = max(self.peak_pinned_total, pinned)
        if 2 * (n - n_running) > n_running:
            running = np.sort(self.finishing[:n_running])
            self.finishing[:n_running] = np.searchsorted(running, self.finishing[:n_running])
            requests.keep(running, not self.instant)
        out: I64 = hits[first:]
        return out


_TableKey = tuple[int, bool, bool, int]  # block size, isolation, instant, replicas


class _SlotTables:
    """The slot tables of one pass (:class:`BlockSlots`), one for the replays of a
    :attr:`_Replay.table_key`, each with a state of its own in it: a chunk's blocks are looked
    up once a table, not once a replay, and a block cached by several of them holds one slot
    (freed once none caches it)."""

    def __init__(self, replays: list[_Replay]) -> None:
        members: dict[_TableKey, int] = {}
        for replay in replays:
            replay.member = members.get(replay.table_key, 0)
            members[replay.table_key] = replay.member + 1
        self.tables = {key: BlockSlots(key[3], replays=count) for key, count in members.items()}
        for replay in replays:
            replay.table = self.tables[replay.table_key]

    def find(self, blocks: dict[tuple[int, bool], _ChunkBlocks]) -> dict[_TableKey, Any]:
        """Every table's slots of the chunk's blocks, block by block (its ``ids``)."""
        out = {}
        for key, table in self.tables.items():
            chunk = blocks[key[:2]]
            out[key] = table.find(chunk.keys.hashes, chunk.keys.namespace)[chunk.ids]
        return out
