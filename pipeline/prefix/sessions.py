"""Conversation (session) ids: the logged ones, else inferred from the prefix-hash chains.

Inference rule
--------------
Requests are taken in arrival order (the row order of the canonical table, which must be
sorted by ``arrival``; ties keep their row order). For a request ``r`` whose ``session_id`` is
not logged and whose ``hashes_known`` is true:

* an earlier request ``p`` is a *candidate parent* when ``p`` has ``k = p.prompt_blocks`` full
  prompt blocks with ``k >= min_blocks`` and ``r``'s prompt chain holds ``p``'s last full
  prompt block hash at the same position (``r.prefix_hashes[k - 1] == p.prefix_hashes[k - 1]``
  and ``k <= r.prompt_blocks``). Because a block hash identifies the whole prefix up to it,
  this means ``r``'s prompt starts with all of ``p``'s full prompt blocks: ``r`` extends ``p``
  (previous prompt + answer + new message, the shape of a multi-turn conversation);
* ``r`` continues the candidate with the **longest** match ``k``; among candidates with the
  same ``k`` (identical prompts, e.g. a retry or a regeneration) the **latest** one;
* with no candidate, ``r`` starts a new conversation.

``min_blocks`` (default 2) keeps a single shared leading block — a common system prompt, or the
Mooncake trace's block id 0 that starts every request — from chaining unrelated requests
together. A request's partial last prompt block (``prompt_tokens % block_size`` tokens) never
takes part: only full blocks are hashed.

``r`` joins its parent's session: the parent's logged id when it has one, else the parent's
inferred id. A new inferred conversation is named ``"inferred-<n>"`` with ``n`` counting new
conversations from 0 in arrival order. Requests with ``hashes_known`` false (count-only traces)
and no logged id are their own singleton conversations. Requests with a logged ``session_id``
keep it (and still serve as candidate parents for later unlogged requests).

``turn`` is the logged turn for requests that keep a logged session id and log a turn;
otherwise it is the 0-based arrival rank of the request within its session. Forks (two
requests continuing the same parent) therefore get consecutive turn numbers, not equal ones.

Cost: one pass in arrival order with an open-addressing hash map (numba, ``pipeline.prefix.hashmap``)
keyed by each request's last full prompt block hash; per request at most
``prompt_blocks - min_blocks + 1`` probes (from the longest possible match down), so the work is
linear in the number of prompt blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.errors import EnginefitError
from pipeline.prefix.hashmap import (
    KEEP_ALL,
    TableParts,
    new_table,
    parts_find,
    parts_grow_if_full,
    parts_rebuilt,
    row_bits,
    table_find,
    table_grow_if_full,
    table_row,
    table_set,
)

DEFAULT_MIN_SESSION_MATCH_BLOCKS = 2

SESSIONS_SCHEMA: pl.Schema = pl.Schema(
    {
        "request_id": pl.String,
        "session_id": pl.String,
        "session_inferred": pl.Boolean,
        "turn": pl.Int32,
    }
)


class SessionInputError(EnginefitError):
    """The request table cannot be used for session inference (e.g. not sorted by arrival)."""


@dataclass(frozen=True)
class FlatLists:
    """A ``List(UInt64)`` column as Arrow-style offsets and values (row ``i`` is
    ``values[offsets[i]:offsets[i + 1]]``)."""

    offsets: npt.NDArray[np.int64]
    values: npt.NDArray[np.uint64]
    # per value: null (read as 0 in ``values``); empty when no value is null, the usual case
    nulls: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))


def flat_lists(series: pl.Series) -> FlatLists:
    """Offsets and values of a list-of-UInt64 column without copying row by row (null lists are
    empty, null values 0 and marked in ``nulls``)."""
    # copies only when needed: a chunk of a streamed column is usually all of these already
    if series.null_count():
        series = series.fill_null(pl.Series([[]], dtype=pl.List(pl.UInt64)).first())
    if series.dtype != pl.List(pl.UInt64):
        series = series.cast(pl.List(pl.UInt64))
    if series.n_chunks() > 1:
        series = series.rechunk()
    arrow = series.to_arrow()
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    offsets = np.asarray(arrow.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values_arr = arrow.values
    # the values of the rows only (a sliced array's buffer may hold more)
    values_arr = values_arr.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    nulls = np.zeros(0, dtype=np.bool_)
    if values_arr.null_count:
        nulls = np.asarray(values_arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
        values_arr = values_arr.fill_null(0)
    values = np.asarray(values_arr.to_numpy(zero_copy_only=False), dtype=np.uint64)
    return FlatLists(offsets=offsets, values=values, nulls=nulls)


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def _parents_chunk(
    table: npt.NDArray[np.uint64],
    used: int,
    shift: int,
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    row0: int,
    prompt_blocks: npt.NDArray[np.int32],
    chain_blocks: npt.NDArray[np.int32],
    searchable: npt.NDArray[np.bool_],
    registrable: npt.NDArray[np.bool_],
    min_blocks: int,
    parent: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.uint64], int]:
    """Parents of the chunk's rows ``row0 + i`` (chain ``values[offsets[i]:offsets[i + 1]]``)
    under the rule in the module docstring, written into ``parent`` (-1 = none). ``table`` maps
    each registered row's last full prompt block hash to the latest such row; per-row arrays
    are indexed by the global row, and ``chain_blocks[r]`` (full prompt blocks the chain holds)
    is written here for every row of the chunk."""
    for i in range(offsets.shape[0] - 1):
        r = row0 + i
        start = offsets[i]
        pb = min(prompt_blocks[r], offsets[i + 1] - start)
        chain_blocks[r] = pb
        if searchable[r]:
            k = pb
            while k >= min_blocks:
                slot = table_find(table, values[start + k - 1], 0, shift)
                if table[2 * slot + 1] != 0:
                    found = table_row(table, slot, shift)
                    # same position: p's last full prompt block is r's block k-1
                    if chain_blocks[found] == k:
                        parent[r] = found
                        break
                k -= 1
        if registrable[r] and pb >= min_blocks:
            # latest wins: ties between equal-length matches go to the latest
            key = values[start + pb - 1]
            slot = table_find(table, key, 0, shift)
            if table_set(table, slot, key, 0, r, shift):
                used += 1
                table = table_grow_if_full(table, used, shift)
    return table, used


class ParentSearch:
    """Session parents found chunk by chunk, the chunks in arrival order (the out-of-core
    path: memory is one table entry per registered request plus a few numbers per request)."""

    def __init__(
        self,
        prompt_blocks: npt.NDArray[np.int32],
        searchable: npt.NDArray[np.bool_],
        registrable: npt.NDArray[np.bool_],
        min_blocks: int,
    ) -> None:
        n = prompt_blocks.shape[0]
        self.shift = row_bits(n)
        self.prompt_blocks = prompt_blocks
        self.searchable = searchable
        self.registrable = registrable
        self.min_blocks = min_blocks
        self.parent = np.full(n, -1, dtype=np.int64)
        self.chain_blocks = np.zeros(n, dtype=np.int32)
        # at most one key per registrable row that reaches min_blocks: no growth
        self.table = new_table(int(np.count_nonzero(registrable & (prompt_blocks >= min_blocks))))
        self.used = 0

    def feed(
        self, row0: int, offsets: npt.NDArray[np.int64], values: npt.NDArray[np.uint64]
    ) -> None:
        self.table, self.used = _parents_chunk(
            self.table,
            self.used,
            self.shift,
            offsets,
            values,
            row0,
            self.prompt_blocks,
            self.chain_blocks,
            self.searchable,
            self.registrable,
            self.min_blocks,
            self.parent,
        )

    def close(self) -> npt.NDArray[np.int64]:
        """The parents (the table is dropped)."""
        self.table = new_table(0)
        return self.parent


def infer_sessions(
    requests: pl.DataFrame, *, min_blocks: int = DEFAULT_MIN_SESSION_MATCH_BLOCKS
) -> pl.DataFrame:
    """Session id, whether it was inferred, and 0-based turn for every request.

    ``requests`` is the canonical table sorted by arrival (it needs ``request_id``,
    ``arrival``, ``session_id``, ``turn``, ``prefix_hashes``, ``prompt_blocks``,
    ``hashes_known``). Returns one row per input row, in input order, with columns
    ``request_id`` (String), ``session_id`` (String), ``session_inferred`` (Boolean) and
    ``turn`` (Int32). The rule is in this module's docstring.
    """
    if requests.height == 0:
        check_min_blocks(min_blocks)
        return pl.DataFrame(schema=SESSIONS_SCHEMA)
    _check_sorted(requests)
    frame, _ = infer_sessions_chunked([requests], SessionStream(min_blocks))
    return frame


def check_min_blocks(min_blocks: int) -> None:
    if min_blocks < 1:
        raise SessionInputError(f"min_session_match_blocks must be >= 1, got {min_blocks}")


def _check_sorted(requests: pl.DataFrame) -> None:
    check_arrivals(requests["arrival"])


def check_arrivals(arrival: pl.Series, after_us: int | None = None) -> None:
    """Raise unless the arrivals are complete and ascending (the canonical row order), and
    none is before ``after_us`` (the previous chunk's last arrival, µs since the epoch)."""
    if arrival.null_count():
        raise SessionInputError(
            "requests: 'arrival' has nulls; the canonical table needs every arrival"
        )
    first = arrival.head(1).dt.epoch("us").to_list() if after_us is not None else []
    if not arrival.is_sorted() or (first and first[0] < after_us):
        raise SessionInputError(
            "requests: not sorted by 'arrival'; session inference needs the canonical arrival order"
        )


# Carried entries (parent-table keys + open sessions) the chunked inference keeps before it
# closes the least recently active sessions early: 12M entries, ~0.55 GB. A generated
# 10M-request trace (Mooncake form) carries 8.8M and stays exact; past the budget the counter
# ``closed_early`` says how many sessions were cut.
DEFAULT_SESSION_STATE_BUDGET = 12_000_000
# Past the budget the state is cut to this share of it, so that it is cut (and the table
# rebuilt) once every several chunks, not at every one.
_CUT_TO = 0.75
# Parts of the carried table (each grows and is rebuilt on its own).
_PARTS = 64
# Bits of a carried parent-table entry's index (the packed table's row field).
_ENTRY_BITS = 40
_LITERAL = r"^inferred-(0|[1-9][0-9]{0,17})$"


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def _stream_chunk(
    owners: Any,
    addresses: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    used: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    prompt_blocks: npt.NDArray[np.int32],
    known: npt.NDArray[np.bool_],
    logged: npt.NDArray[np.bool_],
    logged_sess: npt.NDArray[np.int64],
    arrival_us: npt.NDArray[np.int64],
    min_blocks: int,
    gap_us: int,
    ent_k: npt.NDArray[np.int32],
    ent_sess: npt.NDArray[np.int64],
    ent_us: npt.NDArray[np.int64],
    n_ent: int,
    counter: int,
    sess: npt.NDArray[np.int64],
) -> tuple[int, int]:
    """:func:`_parents_chunk` and the session assignment for one chunk with carried state: the
    table (in parts, ``pipeline.prefix.hashmap.TableParts``) maps a registered request's last
    full prompt block hash to an entry (its full prompt blocks, session code, arrival); a parent
    further back than ``gap_us`` (< 0: no limit) does not count. Session codes: logged handle
    >= 0, or -(1 + m) for conversation m. Returns the entries and conversations so far."""
    for i in range(offsets.shape[0] - 1):
        start = offsets[i]
        pb = min(prompt_blocks[i], offsets[i + 1] - start)
        found = False
        if logged[i]:
            sess[i] = logged_sess[i]
            found = True
        elif known[i]:
            k = pb
            while k >= min_blocks:
                _, table, slot = parts_find(
                    addresses, lengths, values[start + k - 1], 0, _ENTRY_BITS
                )
                if table[2 * slot + 1] != 0:
                    e = table_row(table, slot, _ENTRY_BITS)
                    if ent_k[e] == k and (gap_us < 0 or arrival_us[i] - ent_us[e] <= gap_us):
                        sess[i] = ent_sess[e]
                        found = True
                        break
                k -= 1
        if not found:
            sess[i] = -(1 + counter)
            counter += 1
        if known[i] and pb >= min_blocks:
            key = values[start + pb - 1]
            part, table, slot = parts_find(addresses, lengths, key, 0, _ENTRY_BITS)
            if table[2 * slot + 1] != 0:
                e = table_row(table, slot, _ENTRY_BITS)
            else:
                e = n_ent
                n_ent += 1
                table_set(table, slot, key, 0, e, _ENTRY_BITS)
                used[part] += 1
                parts_grow_if_full(owners, addresses, lengths, used, part, _ENTRY_BITS)
            ent_k[e] = pb
            ent_sess[e] = sess[i]
            ent_us[e] = arrival_us[i]
    return n_ent, counter


@numba.njit(cache=True)  # type: ignore[misc]
def _compacted(
    keep: npt.NDArray[np.bool_],
    ent_k: npt.NDArray[np.int32],
    ent_sess: npt.NDArray[np.int64],
    ent_us: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], int]:
    """Move the kept entries to the front in order (in place); returns each entry's new index
    (-1 = dropped) and how many are kept."""
    new = np.full(keep.shape[0], -1, dtype=np.int64)
    j = 0
    for e in range(keep.shape[0]):
        if keep[e]:
            new[e] = j
            ent_k[j] = ent_k[e]
            ent_sess[j] = ent_sess[e]
            ent_us[j] = ent_us[e]
            j += 1
    return new, j


@dataclass
class SessionTotals:
    """What :class:`SessionStream` found over every chunk: the requests, the requests per
    session (``turns``, one entry a session), and what it carried from chunk to chunk."""

    requests: int
    inferred_requests: int
    turns: pl.Series
    carried_max: int  # most entries (parent keys + open sessions) carried over a chunk boundary
    closed_early: int  # sessions closed by the state budget (0: the result is exact)
    reopened: int  # rows joining a session already closed (a logged ``inferred-<m>`` id)


@dataclass
class SessionStream:
    """Session inference (the rule of this module) over the canonical table in arrival-order
    chunks — parts of the table, or UTC days — with state carried from chunk to chunk.

    What is carried over a boundary is the parent table's entries that a later request can
    still match, and the sessions still open (their name and requests so far). With
    ``gap_s`` set, a request continues an earlier one only within ``gap_s`` seconds of it, so
    an inferred conversation with no request for ``gap_s`` is closed and its entries dropped:
    the state is bounded by what is open at the boundary. Without it (the default, the rule of
    :func:`infer_sessions`), every entry stays. ``budget`` bounds the carried entries in either
    case: past it, the least recently active sessions are closed early (counted in
    ``closed_early``; 0 means the result equals one pass over the whole table). Logged
    sessions stay open until the end or the budget (their id may come back at any time).
    """

    min_blocks: int = DEFAULT_MIN_SESSION_MATCH_BLOCKS
    gap_s: float | None = None
    budget: int = DEFAULT_SESSION_STATE_BUDGET
    # requests that will register (known, at least min_blocks full prompt blocks), when the
    # caller knows: the table and entries are sized once (up to the budget) instead of grown
    expected: int = 0
    _table: TableParts = field(default_factory=lambda: TableParts(_PARTS))
    _ent_k: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    _ent_sess: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    _ent_us: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    _n_ent: int = 0
    _counter: int = 0
    _next_handle: int = 0
    # open sessions: code, requests so far, last arrival (µs)
    _open: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"sess": pl.Int64, "count": pl.Int64, "last_us": pl.Int64}
        )
    )
    # logged ids of open sessions and their codes
    _names: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema={"name": pl.String, "sess": pl.Int64})
    )
    # every logged id by handle (the names of closed sessions too, for :meth:`frame`)
    _all_names: pl.Series = field(default_factory=lambda: pl.Series("name", [], pl.String))
    _closed: list[pl.Series] = field(default_factory=list)
    _requests: int = 0
    _inferred: int = 0
    _last_us: int | None = None
    carried_max: int = 0
    closed_early: int = 0
    reopened: int = 0

    def __post_init__(self) -> None:
        check_min_blocks(self.min_blocks)
        if self.gap_s is not None and not self.gap_s > 0:
            raise SessionInputError(f"session_gap_s must be positive, got {self.gap_s}")
        if self.budget < 1:
            raise SessionInputError(f"session_state_budget must be >= 1, got {self.budget}")
        size = min(self.expected, self.budget)
        if size:
            self._table = TableParts(_PARTS, size)
            self._ent_k = np.zeros(size, np.int32)
            self._ent_sess = np.zeros(size, np.int64)
            self._ent_us = np.zeros(size, np.int64)

    def feed_codes(self, chunk: pl.DataFrame, flat: FlatLists | None = None) -> pl.DataFrame:
        """The next chunk's sessions as codes (``sess``: a logged id's handle >= 0, or -(1 + m)
        for ``inferred-<m>``), ``session_inferred`` and ``turn``, in its order (it reads the
        columns :func:`infer_sessions` reads but ``request_id``; ``flat``: its
        ``prefix_hashes`` already flattened, which are then not read from ``chunk``)."""
        if chunk.height == 0:
            return pl.DataFrame(
                schema={"sess": pl.Int64, "session_inferred": pl.Boolean, "turn": pl.Int32}
            )
        check_arrivals(chunk["arrival"])
        arrival_us = chunk["arrival"].dt.epoch("us").to_numpy()
        if self._last_us is not None and int(arrival_us[0]) < self._last_us:
            raise SessionInputError(
                "requests: a chunk starts before the previous one ends; feed the chunks in "
                "arrival order"
            )
        n = chunk.height
        logged_sess = self._logged_codes(chunk["session_id"])
        logged = chunk["session_id"].is_not_null().to_numpy()
        if flat is None:
            flat = flat_lists(chunk["prefix_hashes"])
        blocks = chunk["prompt_blocks"].fill_null(0).cast(pl.Int32).to_numpy()
        known = chunk["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
        # at most one new entry per request that registers
        need = self._n_ent + int(np.count_nonzero(known & (blocks >= self.min_blocks)))
        if self._ent_k.shape[0] < need:
            size = max(need, self._ent_k.shape[0] * 3 // 2)
            self._ent_k = np.resize(self._ent_k, size)
            self._ent_sess = np.resize(self._ent_sess, size)
            self._ent_us = np.resize(self._ent_us, size)
        sess = np.empty(n, dtype=np.int64)
        counter0 = self._counter
        self._n_ent, self._counter = _stream_chunk(
            self._table.owners,
            self._table.addresses,
            self._table.lengths,
            self._table.used,
            flat.offsets,
            flat.values,
            blocks,
            known,
            logged,
            logged_sess,
            arrival_us,
            self.min_blocks,
            -1 if self.gap_s is None else round(self.gap_s * 1_000_000),
            self._ent_k,
            self._ent_sess,
            self._ent_us,
            self._n_ent,
            self._counter,
            sess,
        )
        del flat
        rows = pl.DataFrame(
            {
                "sess": sess,
                "session_inferred": ~logged,
                "_logged_session": chunk["session_id"],
                "_logged_turn": chunk["turn"],
                "_us": arrival_us,
            }
        ).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("sess").alias("_rank"))
        counts = rows.group_by("sess").agg(
            pl.len().cast(pl.Int64).alias("count"), pl.col("_us").max().alias("last_us")
        )
        merged = self._open.join(counts, on="sess", how="full", coalesce=True)
        # a conversation closed in an earlier chunk met again (only a logged "inferred-<m>")
        self.reopened += merged.filter(
            pl.col("count").is_null() & (pl.col("sess") < 0) & (-pl.col("sess") - 1 < counter0)
        ).height
        rows = rows.join(
            self._open.select("sess", pl.col("count").alias("_before")),
            on="sess",
            how="left",
            maintain_order="left",
        )
        self._open = merged.select(
            "sess",
            (pl.col("count").fill_null(0) + pl.col("count_right").fill_null(0)).alias("count"),
            pl.max_horizontal("last_us", "last_us_right").alias("last_us"),
        )
        codes = rows.select(
            "sess",
            "session_inferred",
            pl.when(pl.col("_logged_session").is_not_null() & pl.col("_logged_turn").is_not_null())
            .then(pl.col("_logged_turn"))
            .otherwise(pl.col("_rank") + pl.col("_before").fill_null(0))
            .cast(pl.Int32)
            .alias("turn"),
        )
        self._requests += n
        self._inferred += int(n - logged.sum())
        self._last_us = int(arrival_us[-1])
        self._prune(self._last_us)
        return codes

    def feed(self, chunk: pl.DataFrame, flat: FlatLists | None = None) -> pl.DataFrame:
        """The sessions (SESSIONS_SCHEMA) of the next chunk's requests, in its order (it needs
        the columns :func:`infer_sessions` reads; ``flat``: its ``prefix_hashes`` already
        flattened, which are then not read from ``chunk``)."""
        return self.frame(chunk["request_id"], self.feed_codes(chunk, flat))

    def frame(self, request_id: pl.Series, codes: pl.DataFrame) -> pl.DataFrame:
        """SESSIONS_SCHEMA rows from :meth:`feed_codes`'s (the names are built only now, so a
        caller may keep the compact codes of every chunk and name them at the end)."""
        names = self._all_names
        named = pl.col("sess").clip(0)
        return pl.DataFrame({"request_id": request_id, **codes.to_dict()}).select(
            "request_id",
            pl.when(pl.col("sess") >= 0)
            .then(pl.lit(names, dtype=pl.String).gather(named) if names.len() else None)
            .otherwise(pl.lit("inferred-") + (-pl.col("sess") - 1).cast(pl.String))
            .alias("session_id"),
            "session_inferred",
            "turn",
        )

    def _logged_codes(self, logged: pl.Series) -> npt.NDArray[np.int64]:
        """Per row: the code of its logged id (new ids get new handles; an id reading
        ``inferred-<m>`` is inferred conversation m's code), -1 where none is logged."""
        ids = pl.DataFrame({"name": logged})
        new = (
            ids.filter(pl.col("name").is_not_null())
            .unique("name", maintain_order=True)
            .join(self._names, on="name", how="anti")
        )
        if new.height:
            literal = new["name"].str.extract(_LITERAL, 1).cast(pl.Int64)
            handles = pl.int_range(self._next_handle, self._next_handle + new.height, eager=True)
            new = new.with_columns(
                pl.when(literal.is_not_null())
                .then(-1 - literal)
                .otherwise(handles)
                .cast(pl.Int64)
                .alias("sess")
            )
            self._next_handle += new.height
            self._names = pl.concat([self._names, new])
            self._all_names = pl.concat([self._all_names, new["name"]])
        return (
            ids.join(self._names, on="name", how="left", maintain_order="left")["sess"]
            .fill_null(-1)
            .to_numpy()
        )

    def _close(self, closing: pl.Expr) -> None:
        """Close the open sessions ``closing`` selects: their turns are final."""
        done = self._open.filter(closing)
        if done.height == 0:
            return
        self._closed.append(done["count"])
        self._open = self._open.filter(~closing)
        self._names = self._names.join(done.select("sess"), on="sess", how="anti")

    def _prune(self, now_us: int) -> None:
        """Drop the entries no later request can match and close the sessions no later request
        can join; then keep the carried state within the budget."""
        keep = np.ones(self._n_ent, dtype=np.bool_)
        if self.gap_s is not None:
            cutoff = now_us - round(self.gap_s * 1_000_000)
            keep &= self._ent_us[: self._n_ent] >= cutoff
            # an inferred conversation grows only through its entries
            self._close((pl.col("sess") < 0) & (pl.col("last_us") < cutoff))
        if int(keep.sum()) + self._open.height > self.budget:
            # the least recently active sessions, oldest first, until the state is cut
            over = int(keep.sum()) + self._open.height - int(self.budget * _CUT_TO)
            order = self._open.sort("last_us", "sess")
            cut = order.head(min(order.height, over))
            self.closed_early += cut.height
            limit = int(cut["last_us"].max())  # type: ignore[arg-type]
            self._close(pl.col("sess").is_in(cut["sess"].implode()))
            keep &= self._ent_us[: self._n_ent] > limit
            keep &= ~np.isin(self._ent_sess[: self._n_ent], cut["sess"].to_numpy())
        if not keep.all():
            new, self._n_ent = _compacted(keep, self._ent_k, self._ent_sess, self._ent_us)
            table = self._table
            parts_rebuilt(
                table.owners,
                table.addresses,
                table.lengths,
                table.used,
                _ENTRY_BITS,
                KEEP_ALL,
                new,
            )
            del new
        self.carried_max = max(self.carried_max, self._n_ent + self._open.height)

    def finish(self) -> SessionTotals:
        """Close every session: the totals over all chunks (the state is released)."""
        self._close(pl.lit(True))
        turns = (
            pl.concat(self._closed).cast(pl.UInt32).rename("turns")
            if self._closed
            else pl.Series("turns", [], dtype=pl.UInt32)
        )
        self._closed = []
        self._table = TableParts(1)
        self._ent_k, self._ent_sess, self._ent_us = (
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )
        self._n_ent = 0
        return SessionTotals(
            requests=self._requests,
            inferred_requests=self._inferred,
            turns=turns,
            carried_max=self.carried_max,
            closed_early=self.closed_early,
            reopened=self.reopened,
        )


def infer_sessions_chunked(
    chunks: Iterable[pl.DataFrame], stream: SessionStream | None = None
) -> tuple[pl.DataFrame, SessionTotals]:
    """:func:`infer_sessions` over arrival-order chunks (e.g. :func:`utc_days`): the sessions
    of every chunk, concatenated, and the totals (``stream`` sets the gap and the budget)."""
    stream = stream or SessionStream()
    frames = [stream.feed(chunk) for chunk in chunks]
    frame = pl.concat(frames) if frames else pl.DataFrame(schema=SESSIONS_SCHEMA)
    return frame, stream.finish()


def utc_days(requests: pl.LazyFrame | pl.DataFrame) -> Iterator[pl.DataFrame]:
    """The canonical table (sorted by arrival) one UTC day at a time, each collected alone."""
    lazy = requests.lazy()
    days = (
        lazy.select(pl.col("arrival").dt.convert_time_zone("UTC").dt.date().unique().sort())
        .collect()
        .to_series()
    )
    for day in days:
        yield lazy.filter(pl.col("arrival").dt.convert_time_zone("UTC").dt.date() == day).collect()
