"""From the canonical request table to the flat arrays the replay kernels read (hash once).

``sim_input(frame)`` sorts requests by arrival and keeps, per request, its chained block hashes
(CSR: ``offsets`` + ``hashes``), prompt blocks, token counts, arrival, duration, cache namespace
(model and LoRA adapter, plus tenant for isolation: ``pipeline.prefix.cache_rules``) and a stable
session hash. ``SimInputs.blocks(block_size, tenant_isolation)`` then derives the view a scenario
needs: the chain strided to a coarser block size, mapped once to dense ids and re-keyed per
namespace, so requests of different models or adapters (or tenants, when isolated) never share a
block. Nothing here depends on a cache capacity or a routing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from pipeline.errors import EnginefitError
from pipeline.prefix.cache_rules import (
    NAMESPACE_COLUMNS,
    hit_limit_blocks,
    namespace_codes,
    namespaced_ids,
)
from pipeline.prefix.hashmap import dense_ids
from pipeline.prefix.sessions import infer_sessions
from pipeline.schema import conform
from pipeline.shape.facts import LatencyModel
from pipeline.sim import kernels

I64 = NDArray[np.int64]
U64 = NDArray[np.uint64]

# The sessions (SESSIONS_SCHEMA) of a table's requests, read from SESSION_COLUMNS and the chains.
InferSessions = Callable[[pl.DataFrame], pl.DataFrame]
_REQUIRED = ("prefix_hashes", "prompt_blocks", "prompt_tokens", "block_size")
# What the session inference (pipeline.prefix.sessions.infer_sessions) reads, kept until it runs
# (the chains not among them: rebuilt then from the flat arrays, not held twice).
SESSION_COLUMNS = (
    "request_id",
    "arrival",
    "session_id",
    "turn",
    "prompt_blocks",
    "hashes_known",
)
# The canonical columns a replay reads: only these are loaded (a 10M-request table's other
# columns, ids of its source lines and such, are gigabytes).
FLATTENED_COLUMNS = tuple(
    dict.fromkeys(
        (
            *_REQUIRED,
            *SESSION_COLUMNS,
            *NAMESPACE_COLUMNS,
            "tenant",
            "output_tokens",
            "e2e_ms",
        )
    )
)

NO_CONTENT = "the trace carries no prompt content, so prefix-cache hits cannot be simulated"
NO_CONTENT_TOKENS = "the requests with prompt content have no prompt tokens"


class SimulationInputError(EnginefitError):
    """The request table cannot be replayed (missing column, inconsistent block counts, ...)."""


@dataclass(frozen=True)
class BlockView:
    """The workload's block chains at one block size (and isolation), as dense ids."""

    block_size: int
    offsets: I64  # n + 1; request r owns ids[offsets[r]:offsets[r+1]] (prompt blocks first)
    ids: I64
    n_ids: int
    prompt_blocks: I64
    missing: I64  # output blocks with unknown tokens: occupy capacity, never match
    hit_limit: (
        I64  # leading prompt blocks that may hit (pipeline.prefix.cache_rules.hit_limit_blocks)
    )

    @cached_property
    def chained(self) -> bool:
        """Every id has one parent and position (kernels.is_chained); checked on first use
        (only the one-pass curve needs it)."""
        return bool(kernels.is_chained(self.offsets, self.ids, max(self.n_ids, 1)))

    @property
    def accesses(self) -> int:
        return int(self.ids.size + self.missing.sum())


@dataclass(frozen=True)
class ContentCoverage:
    """Which requests carry prompt content (block hashes), so their hits can be simulated.

    A request without content (``hashes_known`` false: Azure, BurstGPT) still occupies cache
    capacity, with blocks that never match, but whether it would have hit is unknown. Every
    hit figure is therefore taken over the requests with content: hit ratio = their hit tokens
    / their prompt tokens, ``share`` says how much of the prompt tokens that covers, and with
    no content at all (or no prompt tokens in it) the hit figures are unknown (``reason``).
    """

    requests: int  # requests with prompt content
    prompt_tokens: int  # their prompt tokens
    share: float | None  # their share of all prompt tokens (None: the trace has none)

    @property
    def reason(self) -> str | None:
        """Why the hit figures are unknown, or None when they are known."""
        if self.requests == 0:
            return NO_CONTENT
        return NO_CONTENT_TOKENS if self.prompt_tokens == 0 else None

    @property
    def partial(self) -> bool:
        return self.reason is None and self.share is not None and self.share < 1

    def hit_ratio(self, hit_tokens: int) -> float | None:
        return None if self.reason else hit_tokens / self.prompt_tokens

    def partial_warning(self, total_requests: int) -> str | None:
        """What the hit figures cover when only some requests carry content, else None."""
        if not self.partial:
            return None
        return (
            f"hit figures cover the {self.requests:,} of {total_requests:,} requests that carry "
            f"prompt content ({self.share:.1%} of prompt tokens); the others occupy cache "
            "capacity but whether they would hit is unknown"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "content_requests": self.requests,
            "content_prompt_tokens": self.prompt_tokens,
            "content_share": self.share,
            "hit_unknown_reason": self.reason,
        }


@dataclass
class SimInputs:
    """One workload, hashed once, in arrival order.

    Sessions (``session_hash``, ``sessions_inferred``) are worked out on first use, once: only
    the affinity routings read them, and inferring them (a trace that logs no session id) costs
    more than replaying a scenario. ``session_source`` holds the columns that takes. The
    namespaces with the tenant (``namespace_isolated``) likewise wait for a scenario or curve
    with tenant isolation (``tenant_source``).
    """

    stored_block_size: int
    offsets: I64
    hashes: U64
    hashes_known: NDArray[np.bool_]
    prompt_blocks: I64
    prompt_tokens: I64
    output_tokens: I64  # null counts as 0
    arrival_us: I64
    duration_us: I64
    durations_estimated: int  # requests whose duration came from the latency model
    latency_model: LatencyModel
    namespace: I64  # cache namespace: (model, lora_adapter) code (pipeline.prefix.cache_rules)
    session_source: pl.DataFrame | None = field(default=None, repr=False)  # SESSION_COLUMNS
    tenant_source: pl.DataFrame | None = field(default=None, repr=False)  # namespace + tenant
    _views: dict[tuple[int, bool], BlockView] = field(default_factory=dict, repr=False)
    _session_cache: tuple[U64, int] | None = field(default=None, repr=False)
    _namespace_isolated: I64 | None = field(default=None, repr=False)

    @property
    def namespace_isolated(self) -> I64:
        """Cache namespace with the tenant (``tenant_isolation``): (model, lora_adapter, tenant)."""
        if self._namespace_isolated is None:
            if self.tenant_source is None:
                raise SimulationInputError("the tenants of this input are not available")
            self._namespace_isolated = namespace_codes(self.tenant_source, tenant_isolation=True)
            self.tenant_source = None
        return self._namespace_isolated

    @property
    def session_hash(self) -> U64:
        """Stable hash of each request's session (logged, else inferred, else the request)."""
        return self.sessions_by(infer_sessions)[0]

    @property
    def sessions_inferred(self) -> int:
        """Requests whose session came from ``pipeline.prefix.sessions``."""
        return self.sessions_by(infer_sessions)[1]

    def sessions_by(self, infer: InferSessions) -> tuple[U64, int]:
        """:attr:`session_hash` and :attr:`sessions_inferred`, the requests logging no session
        id given one by ``infer`` (:func:`pipeline.prefix.sessions.infer_sessions` of this
        table alone, or a chunk's sessions carried on from the chunks before it: a
        :meth:`pipeline.prefix.sessions.SessionStream.feed`); worked out once."""
        if self._session_cache is None:
            if self.session_source is None:
                raise SimulationInputError("the sessions of this input are not available")
            chains = pl.Series(
                "prefix_hashes",
                pa.LargeListArray.from_arrays(pa.array(self.offsets), pa.array(self.hashes)),
            )
            session, inferred = _sessions(self.session_source.with_columns(chains), infer)
            self._session_cache = (_stable_string_hash(session), inferred)
            self.session_source = None  # its columns are no longer needed
        return self._session_cache

    @property
    def n(self) -> int:
        return int(self.prompt_tokens.size)

    def coverage(self, requests: NDArray[np.bool_] | None = None) -> ContentCoverage:
        """Prompt content of the requests ``requests`` selects (default: all)."""
        known = self.hashes_known if requests is None else self.hashes_known & requests
        tokens = self.prompt_tokens if requests is None else self.prompt_tokens[requests]
        total = int(tokens.sum())
        covered = int(self.prompt_tokens[known].sum())
        return ContentCoverage(int(known.sum()), covered, covered / total if total else None)

    def blocks(self, block_size: int, tenant_isolation: bool = False) -> BlockView:
        """The chains at ``block_size`` (a multiple of the stored size), cached per variant."""
        key = (block_size, tenant_isolation)
        if key not in self._views:
            self._views[key] = self._derive(block_size, tenant_isolation)
        return self._views[key]

    def stride(self, block_size: int) -> int:
        """Stored blocks per block of ``block_size``, which must be a multiple of the stored
        size."""
        stored = self.stored_block_size
        if block_size <= 0 or block_size % stored:
            raise SimulationInputError(
                f"block size {block_size} is not a positive multiple of the trace's stored block "
                f"size {stored}; coarser blocks are derived by striding the hash chain"
            )
        return block_size // stored

    def chains(self, block_size: int) -> tuple[I64, U64]:
        """CSR offsets and chained hashes of every request at ``block_size`` (a multiple of
        the stored size): the keys of its blocks, before numbering and namespaces."""
        m = self.stride(block_size)
        lens = np.diff(self.offsets)
        hashes = self.hashes
        if m > 1:
            # Block k of size m·B ends where stored block m·k + m - 1 ends; the chained hash
            # there identifies the whole prefix, so it is the coarser block's key.
            pos = np.arange(hashes.size, dtype=np.int64) - np.repeat(self.offsets[:-1], lens)
            hashes = hashes[pos % m == m - 1]
            lens = lens // m
        offsets = np.zeros(lens.size + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        return offsets, hashes

    def request_blocks(self, block_size: int, lengths: I64) -> tuple[I64, I64, I64]:
        """Prompt blocks, unknown output blocks and blocks that may hit of every request at
        ``block_size``, given its chain ``lengths`` (:meth:`chains`)."""
        prompt_blocks = self.prompt_blocks // self.stride(block_size)
        full = (self.prompt_tokens + self.output_tokens) // block_size
        missing = np.maximum(full - lengths, 0)
        hit_limit = np.minimum(hit_limit_blocks(self.prompt_tokens, block_size), prompt_blocks)
        return prompt_blocks, missing, hit_limit

    def _derive(self, block_size: int, tenant_isolation: bool) -> BlockView:
        offsets, hashes = self.chains(block_size)
        ids, n_ids = dense_ids(hashes)
        namespace = self.namespace_isolated if tenant_isolation else self.namespace
        ids, n_ids = namespaced_ids(ids, offsets, namespace, n_ids)
        prompt_blocks, missing, hit_limit = self.request_blocks(block_size, np.diff(offsets))
        return BlockView(block_size, offsets, ids, n_ids, prompt_blocks, missing, hit_limit)


def _stable_string_hash(series: pl.Series) -> U64:
    """FNV-1a 64 (+ SplitMix64) of each UTF-8 string: stable across runs and versions."""
    arr = series.cast(pl.String).fill_null("").to_arrow(compat_level=pl.CompatLevel.oldest())
    arr = arr.cast(pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    hashes: U64 = kernels.fnv1a_strings(np.ascontiguousarray(offsets), data)
    return hashes


def _sessions(frame: pl.DataFrame, infer: InferSessions) -> tuple[pl.Series, int]:
    """Session per request: logged id, else ``pipeline.prefix.sessions.infer_sessions``, else the request."""
    logged = frame["session_id"]
    n_missing = int(logged.null_count())
    if n_missing == 0:
        return logged.cast(pl.String), 0
    inferred_count = 0
    fallback = pl.concat_str(pl.lit("request:"), pl.col("request_id").fill_null(""))
    session = frame.select(pl.col("session_id").fill_null(fallback)).to_series()

    inferred = infer(frame)
    joined = frame.select("request_id", "session_id").join(
        inferred.select("request_id", pl.col("session_id").alias("_inferred")),
        on="request_id",
        how="left",
        maintain_order="left",
    )
    inferred_count = int(
        joined.select((pl.col("session_id").is_null() & pl.col("_inferred").is_not_null()).sum())
        .to_series()
        .item()
    )
    session = joined.select(
        pl.coalesce(
            pl.col("session_id"),
            pl.concat_str(pl.lit("inferred:"), pl.col("_inferred")),
            pl.concat_str(pl.lit("request:"), pl.col("request_id").fill_null("")),
        )
    ).to_series()
    return session, inferred_count


def _flat_chains(frame: pl.DataFrame) -> tuple[I64, U64]:
    """CSR offsets and values of ``prefix_hashes`` (zero-copy from Arrow when possible)."""
    chains = frame["prefix_hashes"]
    if chains.null_count():
        chains = chains.fill_null(pl.Series([[]], dtype=pl.List(pl.UInt64)).first())
    arr = chains.cast(pl.List(pl.UInt64)).rechunk().to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.values.null_count:
        raise SimulationInputError("prefix_hashes: a chain contains a null hash")
    raw_offsets = np.asarray(arr.offsets, dtype=np.int64)
    offsets = raw_offsets - raw_offsets[0]
    values = np.asarray(arr.values, dtype=np.uint64)[raw_offsets[0] : raw_offsets[-1]]
    return offsets, values


def _first_bad(frame: pl.DataFrame, mask: pl.Expr) -> str:
    row = frame.with_row_index("_row").filter(mask).head(1)
    rid = row["request_id"][0] if "request_id" in row.columns else None
    return f"request {rid!r} (row {row['_row'][0]} in arrival order)"


def sim_input(
    requests: pl.DataFrame | pl.LazyFrame,
    *,
    latency_model: LatencyModel,
) -> SimInputs:
    """Flatten a canonical request table (pipeline.schema) for replay, in arrival order."""
    if isinstance(requests, pl.LazyFrame):
        present = requests.collect_schema().names()
        frame = requests.select(c for c in FLATTENED_COLUMNS if c in present).collect()
    else:
        frame = requests
    missing_cols = [c for c in _REQUIRED if c not in frame.columns]
    if missing_cols:
        raise SimulationInputError(f"request table lacks column(s) {missing_cols}")

    frame = conform(frame, FLATTENED_COLUMNS)
    if frame.height == 0:
        raise SimulationInputError("request table is empty: nothing to replay")
    if frame["arrival"].null_count() or not frame["arrival"].is_sorted():
        # stable: ties keep their table order (avoid the copy when already sorted)
        frame = frame.sort("arrival", nulls_last=True, maintain_order=True)
    if frame["prompt_tokens"].null_count():
        raise SimulationInputError(
            f"prompt_tokens is null for {_first_bad(frame, pl.col('prompt_tokens').is_null())}"
        )
    if (frame["prompt_tokens"] < 0).any() or (frame["output_tokens"].fill_null(0) < 0).any():
        bad = (pl.col("prompt_tokens") < 0) | (pl.col("output_tokens") < 0)
        raise SimulationInputError(f"negative token count for {_first_bad(frame, bad)}")
    sizes = frame["block_size"].drop_nulls().unique()
    if sizes.len() != 1:
        raise SimulationInputError(
            f"block_size must be one value for the whole table, found {sorted(sizes.to_list())}"
        )
    stored = int(sizes[0])
    if stored <= 0:
        raise SimulationInputError(f"block_size must be positive, found {stored}")
    known = frame["hashes_known"].fill_null(False)
    if not known.all():
        # Count-only rows share nothing: drop whatever chain they carry.
        frame = frame.with_columns(
            pl.when(known).then(pl.col("prefix_hashes")).otherwise(pl.lit([], pl.List(pl.UInt64))),
            pl.when(known)
            .then(pl.col("prompt_blocks").fill_null(0))
            .otherwise(0)
            .alias("prompt_blocks"),
        )
    else:
        frame = frame.with_columns(pl.col("prompt_blocks").fill_null(0))
    over = pl.col("prompt_blocks") > pl.col("prefix_hashes").list.len()
    if frame.select(over.any()).item():
        raise SimulationInputError(
            f"prompt_blocks exceeds the length of prefix_hashes for {_first_bad(frame, over)}"
        )
    too_many = pl.col("prompt_blocks") * stored > pl.col("prompt_tokens")
    if frame.select(too_many.any()).item():
        raise SimulationInputError(
            f"prompt_blocks × block_size exceeds prompt_tokens for {_first_bad(frame, too_many)}"
        )
    # One contiguous copy of the chains, shared by the flat arrays and the session columns
    # (rechunking inside _flat_chains would leave the table's own chunks alive beside it).
    frame = frame.with_columns(frame["prefix_hashes"].rechunk())
    offsets, hashes = _flat_chains(frame)
    model = latency_model
    estimated = frame["e2e_ms"].null_count()
    duration_ms = frame.select(
        pl.coalesce(pl.col("e2e_ms"), model.duration_ms_expr()).clip(lower_bound=0)
    ).to_series()
    arrival = frame["arrival"]
    if arrival.null_count():
        raise SimulationInputError(
            f"arrival is null for {_first_bad(frame, pl.col('arrival').is_null())}"
        )
    arrival_us = arrival.dt.epoch("us").to_numpy().astype(np.int64)
    duration_us = duration_ms.to_numpy() * 1000.0
    bad_duration = ~np.isfinite(duration_us) | (duration_us > kernels.MAX_DURATION_US)
    if bad_duration.any():
        where = _first_bad(frame, pl.lit(pl.Series(bad_duration)))
        value = duration_ms[int(np.flatnonzero(bad_duration)[0])]
        raise SimulationInputError(
            f"duration of {where} is {value} ms (logged e2e_ms, else the latency model): "
            "not a finite duration below 2^61 µs"
        )
    return SimInputs(
        stored_block_size=stored,
        offsets=offsets,
        hashes=hashes,
        hashes_known=known.to_numpy(),
        prompt_blocks=frame["prompt_blocks"].cast(pl.Int64).to_numpy(),
        prompt_tokens=frame["prompt_tokens"].to_numpy().astype(np.int64),
        output_tokens=frame["output_tokens"].fill_null(0).to_numpy().astype(np.int64),
        arrival_us=arrival_us,
        duration_us=np.rint(duration_us).astype(np.int64),
        durations_estimated=int(estimated),
        latency_model=model,
        namespace=namespace_codes(frame),
        session_source=frame.select(SESSION_COLUMNS),
        tenant_source=frame.select(*NAMESPACE_COLUMNS, "tenant"),
    )
