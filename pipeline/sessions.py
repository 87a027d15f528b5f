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

Cost: one pass in arrival order with an open-addressing hash map (numba, ``pipeline.hashmap``)
keyed by each request's last full prompt block hash; per request at most
``prompt_blocks - min_blocks + 1`` probes (from the longest possible match down), so the work is
linear in the number of prompt blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.errors import EnginefitError
from pipeline.hashmap import EMPTY, get, new_map, put

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


def flat_lists(series: pl.Series) -> FlatLists:
    """Offsets and values of a list-of-UInt64 column without copying row by row (nulls are empty)."""
    filled = series.fill_null(pl.Series([[]], dtype=pl.List(pl.UInt64)).first())
    arrow = filled.cast(pl.List(pl.UInt64)).rechunk().to_arrow()
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    offsets = np.asarray(arrow.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values_arr = arrow.values
    if values_arr.null_count:
        values_arr = values_arr.fill_null(0)
    values = np.asarray(values_arr.to_numpy(zero_copy_only=False), dtype=np.uint64)
    return FlatLists(offsets=offsets, values=values)


@numba.njit(cache=True)  # type: ignore[misc]
def _infer_parents(
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    prompt_blocks: npt.NDArray[np.int64],
    searchable: npt.NDArray[np.bool_],
    registrable: npt.NDArray[np.bool_],
    min_blocks: int,
) -> npt.NDArray[np.int64]:
    """Parent row of each row (-1 = none) under the rule in the module docstring."""
    n = offsets.shape[0] - 1
    # latest row ending at each last-full-prompt-block hash
    keys, rows = new_map(n)
    used = 0
    parent = np.full(n, -1, dtype=np.int64)
    for r in range(n):
        start = offsets[r]
        avail = offsets[r + 1] - start
        pb = prompt_blocks[r]
        if pb > avail:
            pb = avail
        if searchable[r]:
            k = pb
            while k >= min_blocks:
                found = get(keys, rows, values[start + k - 1])
                if found != EMPTY:
                    p_pb = prompt_blocks[found]
                    p_avail = offsets[found + 1] - offsets[found]
                    if p_pb > p_avail:
                        p_pb = p_avail
                    if p_pb == k:  # same position: p's last full prompt block is r's block k-1
                        parent[r] = found
                        break
                k -= 1
        if registrable[r] and pb >= min_blocks:
            # latest wins: ties between equal-length matches go to the latest
            keys, rows, used = put(keys, rows, used, values[start + pb - 1], r)
    return parent


@numba.njit(cache=True)  # type: ignore[misc]
def _assign_sessions(
    parent: npt.NDArray[np.int64], logged_code: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per row: session code (logged code >= 0, or -(1 + n) for inferred conversation n) and
    whether the row's session is inferred (1) or logged (0)."""
    n = parent.shape[0]
    code = np.empty(n, dtype=np.int64)
    inferred = np.zeros(n, dtype=np.int64)
    counter = 0
    for r in range(n):
        if logged_code[r] >= 0:
            code[r] = logged_code[r]
        elif parent[r] >= 0:
            code[r] = code[parent[r]]
            inferred[r] = 1
        else:
            code[r] = -(1 + counter)
            counter += 1
            inferred[r] = 1
    return code, inferred


def infer_parents(
    requests: pl.DataFrame, *, min_blocks: int = DEFAULT_MIN_SESSION_MATCH_BLOCKS
) -> pl.Series:
    """Row index of the request each request continues (null when it starts a conversation).

    Every request with known hashes is searched (logged session ids are ignored here); see
    :func:`infer_sessions` for how logged ids take precedence.
    """
    _check_sorted(requests)
    flat = flat_lists(requests["prefix_hashes"])
    known = requests["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    pb = requests["prompt_blocks"].fill_null(0).cast(pl.Int64).to_numpy()
    parent = _infer_parents(flat.offsets, flat.values, pb, known, known, max(1, min_blocks))
    return pl.Series("parent", parent, dtype=pl.Int64).replace(-1, None)


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
    if min_blocks < 1:
        raise SessionInputError(f"min_session_match_blocks must be >= 1, got {min_blocks}")
    if requests.height == 0:
        return pl.DataFrame(schema=SESSIONS_SCHEMA)
    _check_sorted(requests)
    logged = requests["session_id"]
    logged_codes = (
        logged.cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1).to_numpy()
        if logged.null_count() < requests.height
        else np.full(requests.height, -1, dtype=np.int64)
    )
    flat = flat_lists(requests["prefix_hashes"])
    known = requests["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    pb = requests["prompt_blocks"].fill_null(0).cast(pl.Int64).to_numpy()
    searchable = known & (logged_codes < 0)
    parent = _infer_parents(flat.offsets, flat.values, pb, searchable, known, min_blocks)
    code, inferred = _assign_sessions(parent, logged_codes)
    frame = pl.DataFrame(
        {
            "request_id": requests["request_id"],
            "_code": code,
            "session_inferred": inferred.astype(np.bool_),
            "_logged_session": logged,
            "_logged_turn": requests["turn"],
        }
    )
    # A session's id: the logged id when its code is a logged one, else "inferred-<n>". An
    # inferred request that continues a logged request carries that request's logged id.
    logged_by_code = (
        frame.filter(pl.col("_code") >= 0)
        .group_by("_code")
        .agg(pl.col("_logged_session").drop_nulls().first().alias("_logged_id"))
    )
    return (
        frame.join(logged_by_code, on="_code", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("_code") >= 0)
            .then(pl.col("_logged_id"))
            .otherwise(pl.lit("inferred-") + (-pl.col("_code") - 1).cast(pl.String))
            .alias("session_id")
        )
        .with_columns(
            pl.when(pl.col("_logged_session").is_not_null() & pl.col("_logged_turn").is_not_null())
            .then(pl.col("_logged_turn"))
            .otherwise(pl.int_range(pl.len()).over("session_id"))
            .cast(pl.Int32)
            .alias("turn")
        )
        .select(SESSIONS_SCHEMA.names())
    )


def _check_sorted(requests: pl.DataFrame) -> None:
    arrival = requests["arrival"]
    if arrival.null_count():
        raise SessionInputError(
            "requests: 'arrival' has nulls; the canonical table needs every arrival"
        )
    if not arrival.is_sorted():
        raise SessionInputError(
            "requests: not sorted by 'arrival'; session inference needs the canonical arrival order"
        )
