"""The benchmarks' one generated workload: seeded multi-turn conversations, written in any form.

The model (:class:`Spec`, :func:`conversations`)
------------------------------------------------
* Conversations start as a Poisson process, optionally modulated by a daily cycle (rate
  ∝ 1 − a·cos(2π t / day): trough at the start, peak twelve hours in), over ``requests /
  rate_rps`` seconds (so about ``rate_rps`` requests a second; the last conversations' later
  turns run on past that, at a falling rate).
* Each conversation opens with one of ``system_prompts`` shared system prompts, chosen with
  Zipf popularity (weight ∝ 1/rank^``zipf``), whose lengths are log-normal.
* Turn k's prompt is the whole history (the previous turn's prompt and answer) plus a new user
  message, so turn k+1's tokens (and block chain) extend turn k's prompt-and-answer. User
  messages and answers are log-normal; turns per conversation geometric; a conversation ends
  before a turn whose prompt + answer would pass ``max_context`` tokens.
* The next turn arrives after the answer has streamed (``stream_s_per_token`` a token) and an
  exponential think time.
* Optionally each conversation belongs to one of ``tenants`` tenants and ``models`` models
  (uniform), fixed for the whole conversation.

All of it is drawn with numpy in chunks of conversations from one seed: no Python object per
request or per block, and the same seed and settings give the same arrays and byte-identical
files. Two profiles (:data:`PROFILES`): ``long`` (the default: a Mooncake-like chat service,
mean prompt about 4–5k tokens, 32k-token context) and ``short`` (about 800-token contexts,
what the block-size-16 benchmarks use so that 10M requests fit in memory).

The forms (each from the same :class:`Conversations`)
-----------------------------------------------------
* :func:`write_mooncake` — hash form: Mooncake JSONL (ms timestamps from 0, 512-token
  ``hash_ids``, the last possibly partial block with an id of its own), lines as ``json.dumps``
  writes them, in arrival order, streamed in chunks. Mooncake's format has no session, tenant or
  model field (the project's reader reads the four fields only), so this form carries none.
* :func:`write_token_ids` — token-id JSONL (``ts`` s, ``prompt_token_ids``,
  ``output_token_ids``, optional ``session_id``/``turn``/``tenant``/``model``), read by
  ``pipeline.ingest.readers.token_ids``: token ids are a function of (owner, position), so every turn
  repeats its conversation's earlier tokens exactly and a system prompt's tokens are the same in
  every conversation that opens with it. Large: about 6 bytes a token.
* :func:`iter_frames` / :func:`canonical_frame` — the canonical table
  (:func:`pipeline.schema.conform`) at a block size, prefix hashes included (the answer's blocks
  in the chain or not) or left out, for benchmarks that skip ingestion.
* :func:`write_azure_csv` — the Azure LLM inference CSV form (times and lengths only).
* :func:`write_csv` — a plain CSV (arrival µs, session, tenant, model, lengths) for quick
  scripts such as ``perf/shape_baseline.py``.

Command: ``python -m perf.workload --requests 1M --form hash|token-ids --out PATH
[--seed S] [--profile long|short] [--tenants N] [--models N] [--sessions] [--diurnal A]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from perf.peak import peak_rss_bytes
from pipeline.schema import conform

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

MOONCAKE_BLOCK_TOKENS = 512
TOKEN_ID_FORM_MAX_REQUESTS = 1_000_000
VOCABULARY = 151_000  # token ids are drawn below this (a Qwen-sized vocabulary)
START = datetime(2026, 1, 1, tzinfo=UTC)  # arrival 0 of the canonical frame and the CSV
DAY_S = 86_400.0
_CONVERSATION_CHUNK = 100_000  # conversations drawn per round
_WRITE_CHUNK = 200_000  # requests formatted and written per round


@dataclass(frozen=True)
class Spec:
    """Everything the generated trace depends on (with the seed, all of it)."""

    requests: int
    seed: int = 0
    tenants: int = 0  # 0: no tenant logged
    models: int = 0  # 0: no model logged
    rate_rps: float = 100.0  # mean requests per second over the trace
    diurnal: float = 0.0  # amplitude a of the daily cycle, 0 <= a < 1
    system_prompts: int = 16
    zipf: float = 1.2
    system_tokens: tuple[float, float] = (1200.0, 0.7)  # log-normal median, sigma
    message_tokens: tuple[float, float] = (150.0, 1.4)
    answer_tokens: tuple[float, float] = (350.0, 0.6)
    mean_turns: float = 4.0  # geometric
    max_context: int = 32_768
    think_s: float = 30.0  # mean think time between an answer and the next message
    stream_s_per_token: float = 0.02  # the answer streams before the user reads and replies
    conversation_chunk: int = _CONVERSATION_CHUNK  # conversations drawn per round

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError("requests must be >= 1")
        if not 0.0 <= self.diurnal < 1.0:
            raise ValueError("diurnal amplitude must be in [0, 1)")
        if self.mean_turns < 1.0 or self.rate_rps <= 0 or self.max_context < 64:
            raise ValueError("mean_turns >= 1, rate_rps > 0 and max_context >= 64 required")
        if self.conversation_chunk < 1:
            raise ValueError("conversation_chunk must be >= 1")


PROFILES: dict[str, dict[str, Any]] = {
    "long": {},
    "short": {
        "system_tokens": (250.0, 0.6),
        "message_tokens": (40.0, 1.0),
        "answer_tokens": (110.0, 0.6),
        "mean_turns": 3.5,
        "max_context": 4096,
    },
}


def spec(requests: int, profile: str = "long", **settings: Any) -> Spec:
    """A :class:`Spec` of ``profile``'s lengths with ``settings`` on top."""
    return Spec(requests=requests, **{**PROFILES[profile], **settings})


@dataclass(frozen=True)
class Conversations:
    """The drawn trace. Per conversation: its system prompt, tenant, model, first request
    (generation order) and turns. Per request, in generation order (conversation by
    conversation): conversation, turn, prompt and output tokens, arrival µs from 0. ``order``
    lists the requests by arrival (stable)."""

    spec: Spec
    system_tokens: I64  # per system prompt
    system: I64
    tenant: I64 | None
    model: I64 | None
    first: I64
    turns: I64
    conv: I64
    turn: I64
    prompt: I64
    output: I64
    arrival_us: I64
    order: I64

    @property
    def n(self) -> int:
        return int(self.prompt.size)

    @property
    def n_conversations(self) -> int:
        return int(self.system.size)


def _lognormal(
    rng: np.random.Generator, median_sigma: tuple[float, float], size: int, top: int
) -> I64:
    median, sigma = median_sigma
    values = np.rint(rng.lognormal(math.log(median), sigma, size)).astype(np.int64)
    return np.clip(values, 1, top)


@dataclass(frozen=True)
class _Drawn:
    """One round of :func:`_draw`: per conversation its system prompt, tenant, model and kept
    turns; per kept turn (conversation by conversation) message, answer and think time µs."""

    system: I64
    tenant: I64
    model: I64
    turns: I64
    message: I64
    answer: I64
    think: I64


def _system_prompts(rng: np.random.Generator, s: Spec) -> tuple[I64, npt.NDArray[np.float64]]:
    """The shared system prompts' lengths and Zipf popularity (the first draw of ``rng``)."""
    system_tokens = _lognormal(rng, s.system_tokens, s.system_prompts, s.max_context // 4)
    weight = 1.0 / np.arange(1, s.system_prompts + 1) ** s.zipf
    return system_tokens, weight / weight.sum()


def _draw(
    rng: np.random.Generator,
    labels: np.random.Generator,
    s: Spec,
    system_tokens: I64,
    popularity: npt.NDArray[np.float64],
) -> _Drawn:
    """The next ``s.conversation_chunk`` conversations, in the order every writer draws them."""
    quarter = s.max_context // 4  # system, one message, one answer: each at most a quarter
    c = s.conversation_chunk
    system = rng.choice(s.system_prompts, size=c, p=popularity).astype(np.int64)
    tenant = labels.integers(0, max(s.tenants, 1), c)
    model = labels.integers(0, max(s.models, 1), c)
    planned = rng.geometric(1.0 / s.mean_turns, c).astype(np.int64)
    m = int(planned.sum())
    message = _lognormal(rng, s.message_tokens, m, quarter)
    answer = _lognormal(rng, s.answer_tokens, m, quarter)
    think_us = rng.exponential(s.think_s * 1e6, m)
    # Turns past the context limit are dropped: prompt + answer grows with every turn, so
    # the turns kept are a prefix of each conversation's.
    conv = np.repeat(np.arange(c), planned)
    prompt, _ = _prompts(system_tokens[system], conv, planned, message, answer)
    keep = prompt + answer <= s.max_context
    turns = np.bincount(conv[keep], minlength=c).astype(np.int64)
    return _Drawn(
        system,
        tenant,
        model,
        turns,
        message[keep],
        answer[keep],
        think_us[keep].astype(np.int64),
    )


def conversations(s: Spec) -> Conversations:
    """Draw ``s.requests`` requests of whole conversations (the last one cut at the count)."""
    rng = np.random.default_rng(s.seed)
    # Tenants and models from a stream of their own: asking for them changes nothing else.
    labels = np.random.default_rng([s.seed, 1])
    system_tokens, popularity = _system_prompts(rng, s)
    parts: dict[str, list[I64]] = {k: [] for k in ("system", "tenant", "model", "turns")}
    turn_parts: dict[str, list[I64]] = {k: [] for k in ("message", "answer", "think")}
    have = 0
    while have < s.requests:
        drawn = _draw(rng, labels, s, system_tokens, popularity)
        for k, values in parts.items():
            values.append(getattr(drawn, k))
        for k, values in turn_parts.items():
            values.append(getattr(drawn, k))
        have += int(drawn.turns.sum())
    system, tenant, model, turns = (np.concatenate(parts[k]) for k in parts)
    message, answer, think = (np.concatenate(turn_parts[k])[: s.requests] for k in turn_parts)
    # Cut at the request count: the conversations after it go, the last one may lose turns.
    ends = np.cumsum(turns)
    n_conv = int(np.searchsorted(ends, s.requests)) + 1
    system, tenant, model, turns = system[:n_conv], tenant[:n_conv], model[:n_conv], turns[:n_conv]
    turns[-1] -= int(ends[n_conv - 1]) - s.requests
    conv = np.repeat(np.arange(n_conv), turns)
    prompt, first = _prompts(system_tokens[system], conv, turns, message, answer)
    turn = np.arange(s.requests, dtype=np.int64) - first[conv]
    start = _session_starts(rng, n_conv, s)
    arrival = _arrivals(s, start, conv, first, answer, think)
    return Conversations(
        spec=s,
        system_tokens=system_tokens,
        system=system,
        tenant=tenant if s.tenants else None,
        model=model if s.models else None,
        first=first,
        turns=turns,
        conv=conv,
        turn=turn,
        prompt=prompt,
        output=answer,
        arrival_us=arrival,
        order=np.argsort(arrival, kind="stable"),
    )


def _prompts(
    system_tokens: I64, conv: I64, turns: I64, message: I64, answer: I64
) -> tuple[I64, I64]:
    """Each turn's prompt (system + earlier messages and answers + this message) and each
    conversation's first request index."""
    first = np.cumsum(turns) - turns
    step = message + answer
    before = np.cumsum(step) - step
    return system_tokens[conv] + before - before[first][conv] + message, first


def _arrivals(s: Spec, start: I64, conv: I64, first: I64, answer: I64, think: I64) -> I64:
    """Arrival µs of each turn: turn k+1 arrives after turn k's answer streamed and the user
    thought about it (``conv`` indexes ``start``; ``first`` are the conversations' first turns
    in these arrays)."""
    gap = np.rint(answer * (s.stream_s_per_token * 1e6)).astype(np.int64) + think
    gap = np.roll(gap, 1)
    gap[first] = 0
    elapsed = np.cumsum(gap)
    arrival: I64 = start[conv] + elapsed - elapsed[first][conv]
    return arrival


def _session_starts(rng: np.random.Generator, n_conv: int, s: Spec) -> I64:
    """Poisson session starts (µs from 0, the first at 0) for ``s.requests / s.rate_rps``
    seconds on average, through the daily cycle's time change when ``s.diurnal`` > 0."""
    mean_gap_s = s.requests / s.rate_rps / n_conv
    gaps = rng.exponential(mean_gap_s, n_conv)
    gaps[0] = 0.0
    operational = np.cumsum(gaps)  # a homogeneous process in Λ(t) = t − a·D/2π·sin(2πt/D)
    if s.diurnal > 0:
        horizon = operational[-1] / (1.0 - s.diurnal) + DAY_S
        t = np.linspace(0.0, horizon, int(horizon / 10.0) + 2)
        cumulative = t - s.diurnal * DAY_S / (2 * math.pi) * np.sin(2 * math.pi * t / DAY_S)
        operational = np.interp(operational, cumulative, t)
    return np.rint(operational * 1e6).astype(np.int64)


# -- block and token identities -------------------------------------------------------------


def _mix(a: U64, b: U64) -> U64:
    """splitmix64 of (a, b): distinct pairs give distinct-looking 64-bit values."""
    with np.errstate(over="ignore"):
        z = a * np.uint64(0x9E3779B97F4A7C15) + b + np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _runs(lengths: I64) -> tuple[I64, I64]:
    """Offsets (n + 1) of consecutive runs of ``lengths``, and each element's index in its run."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    position = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    return offsets, position


@dataclass(frozen=True)
class MooncakeIds:
    """Block-id ranges of the hash form: the system prompts' full blocks first, then one range
    per conversation (its own full blocks, then one id per turn for that turn's partial last
    block). Ids are dense, never repeated within a request."""

    system_full: I64  # per system prompt
    system_base: I64
    conv_full: I64  # per conversation: full prompt blocks of its last (longest) turn
    conv_base: I64

    @classmethod
    def of(cls, c: Conversations) -> MooncakeIds:
        last = c.first + c.turns - 1
        return cls.layout(c.system_tokens, c.system, c.turns, c.prompt[last])

    @classmethod
    def layout(cls, system_tokens: I64, system: I64, turns: I64, last_prompt: I64) -> MooncakeIds:
        """The ranges from the system prompts' lengths and, per conversation, its system
        prompt, turns and last (longest) prompt."""
        b = MOONCAKE_BLOCK_TOKENS
        system_full = system_tokens // b
        system_base = np.cumsum(system_full) - system_full
        conv_full = last_prompt // b
        own = conv_full - system_full[system] + turns
        conv_base = int(system_full.sum()) + np.cumsum(own) - own
        return cls(system_full, system_base, conv_full, conv_base)

    def ids(self, c: Conversations, rows: I64) -> tuple[I64, I64]:
        """Offsets and flat ids of ``rows``' ``hash_ids`` (⌈prompt / 512⌉ each)."""
        return self.ids_of(c.system, c.conv[rows], c.turn[rows], c.prompt[rows])

    def ids_of(self, system_of: I64, conv: I64, turn: I64, prompt: I64) -> tuple[I64, I64]:
        """Offsets and flat ids of requests given by conversation, turn and prompt tokens
        (``system_of``: each conversation's system prompt)."""
        offsets, j = _runs(-(-prompt // MOONCAKE_BLOCK_TOKENS))
        counts = np.diff(offsets)
        conv = np.repeat(conv, counts)
        system = system_of[conv]
        system_full = self.system_full[system]
        own = self.conv_base[conv] - system_full
        partial = self.conv_base[conv] + self.conv_full[conv] - system_full
        ids = np.where(
            j < system_full,
            self.system_base[system] + j,
            np.where(
                j < np.repeat(prompt // MOONCAKE_BLOCK_TOKENS, counts),
                own + j,
                partial + np.repeat(turn, counts),
            ),
        )
        return offsets, ids

    def distinct(self, c: Conversations) -> tuple[int, int]:
        """Distinct full-block ids (those the reader keeps) and partial-block ids in the file."""
        used = np.unique(c.system)
        full = int(self.system_full[used].sum())
        full += int((self.conv_full - self.system_full[c.system]).sum())
        partial = int(np.count_nonzero(c.prompt % MOONCAKE_BLOCK_TOKENS))
        return full, partial


def _owners(c: Conversations, rows: I64, position: I64, counts: I64, unit: int) -> U64:
    """Who a token (``unit`` 1) or block (``unit`` = block size) at ``position`` belongs to: its
    system prompt when it lies wholly inside it, else its conversation."""
    conv = np.repeat(c.conv[rows], counts)
    system = c.system[conv]
    inside = (position + 1) * unit <= c.system_tokens[system]
    return np.where(inside, system, c.spec.system_prompts + conv).astype(np.uint64)


def token_ids(c: Conversations, rows: I64) -> tuple[I64, npt.NDArray[np.uint32]]:
    """Offsets and flat token ids of ``rows``' prompt followed by output."""
    offsets, position = _runs(c.prompt[rows] + c.output[rows])
    owner = _owners(c, rows, position, np.diff(offsets), 1)
    ids = _mix(owner, position.astype(np.uint64)) % np.uint64(VOCABULARY)
    return offsets, ids.astype(np.uint32)


def chain_keys(
    c: Conversations, rows: I64, block_size: int, answers: bool = True
) -> tuple[I64, U64]:
    """Offsets and flat 64-bit keys of ``rows``' full blocks (prompt, then answer when
    ``answers``): one key per (owner, block index), so equal keys mean equal prefixes, as
    chained hashes of the token form would."""
    tokens = c.prompt[rows] + (c.output[rows] if answers else 0)
    offsets, j = _runs(tokens // block_size)
    owner = _owners(c, rows, j, np.diff(offsets), block_size)
    return offsets, _mix(owner, j.astype(np.uint64))


def _chunks(
    c: Conversations, size: int = _WRITE_CHUNK, tokens: int | None = None
) -> Iterator[tuple[int, I64]]:
    """(arrival rank of the first, request rows in generation order) a chunk at a time: at most
    ``size`` requests, and with ``tokens`` at most that many prompt + output tokens (at least
    one request)."""
    if tokens is None:
        bounds = [*range(0, c.n, size), c.n]
    else:
        load = np.cumsum(c.prompt[c.order] + c.output[c.order])
        bounds, lo = [], 0
        while lo < c.n:
            bounds.append(lo)
            room = int(np.searchsorted(load, (load[lo - 1] if lo else 0) + tokens, "right"))
            lo = min(max(room, lo + 1), lo + size)
        bounds.append(c.n)
    for lo, hi in itertools.pairwise(bounds):
        yield lo, c.order[lo:hi]


def _list_text(offsets: I64, values: npt.NDArray[Any]) -> pl.Expr:
    """``a, b, c`` per request of a flat array cut at ``offsets`` (json.dumps's spacing)."""
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pl.lit(pl.Series(lists)).cast(pl.List(pl.String)).list.join(", ")


def _write_lines(handle: Any, lines: pl.Series) -> None:
    handle.write((lines.str.join("\n").item() + "\n").encode())


# -- the forms --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """What a writer wrote, for the command's summary line."""

    path: Path
    requests: int
    blocks: int
    block_size: int
    distinct_blocks: int
    mean_prompt: float
    mean_output: float
    bytes: int
    note: str = ""
    tokens: int = 0  # token ids written (token-id form)


def write_mooncake(c: Conversations, path: Path) -> Written:
    """The hash form: Mooncake JSONL in arrival order (``timestamp`` ms from 0)."""
    if c.tenant is not None or c.model is not None:
        raise ValueError(
            "Mooncake JSONL has no tenant or model field (the reader reads timestamp, lengths "
            "and hash_ids only): use the token-ids form or the canonical frame for them"
        )
    layout = MooncakeIds.of(c)
    blocks = 0
    with path.open("wb") as handle:
        for _, rows in _chunks(c):
            blocks += _write_mooncake_lines(
                handle,
                layout,
                c.system,
                c.conv[rows],
                c.turn[rows],
                c.prompt[rows],
                c.output[rows],
                c.arrival_us[rows],
            )
    full, partial = layout.distinct(c)
    return Written(
        path,
        c.n,
        blocks,
        MOONCAKE_BLOCK_TOKENS,
        full,
        float(c.prompt.mean()),
        float(c.output.mean()),
        path.stat().st_size,
        f"{partial:,} more ids name partial last blocks (the reader drops them)",
    )


def _write_mooncake_lines(
    handle: Any,
    layout: MooncakeIds,
    system_of: I64,
    conv: I64,
    turn: I64,
    prompt: I64,
    output: I64,
    arrival_us: I64,
) -> int:
    """Write these requests' Mooncake lines, in the order given; the number of ids written."""
    offsets, ids = layout.ids_of(system_of, conv, turn, prompt)
    line = pl.concat_str(
        pl.lit('{"timestamp": '),
        pl.lit(pl.Series(arrival_us // 1000)).cast(pl.String),
        pl.lit(', "input_length": '),
        pl.lit(pl.Series(prompt)).cast(pl.String),
        pl.lit(', "output_length": '),
        pl.lit(pl.Series(output)).cast(pl.String),
        pl.lit(', "hash_ids": ['),
        _list_text(offsets, ids),
        pl.lit("]}"),
    )
    _write_lines(handle, pl.select(line).to_series())
    return int(ids.size)


@dataclass(frozen=True)
class Streamed:
    """What :func:`write_mooncake_streamed` wrote, with the conversations and the span."""

    written: Written
    conversations: int
    span_us: int


def write_mooncake_streamed(s: Spec, path: Path) -> Streamed:
    """The hash form of ``conversations(s)``, byte for byte what :func:`write_mooncake` writes,
    without holding a per-request array of the whole trace: 100M requests in a few GiB.

    Pass 1 draws every round as :func:`conversations` does and keeps per conversation only its
    system prompt, turns and last prompt (the block-id layout), then the session starts (the
    generator's next draws). Pass 2 draws the rounds again from the seed and builds one round's
    requests at a time; a conversation's turns arrive at or after its start, and starts never
    decrease, so every request before the next round's first start can be written, in the
    stable arrival order of the whole trace, and the rest wait for the next round."""
    if s.tenants or s.models:
        raise ValueError(
            "Mooncake JSONL has no tenant or model field (the reader reads timestamp, lengths "
            "and hash_ids only): use the token-ids form or the canonical frame for them"
        )
    rng = np.random.default_rng(s.seed)
    labels = np.random.default_rng([s.seed, 1])
    system_tokens, popularity = _system_prompts(rng, s)
    systems, turn_counts, last_prompts = [], [], []
    have = 0
    while have < s.requests:
        drawn = _draw(rng, labels, s, system_tokens, popularity)
        turns = drawn.turns
        total = int(turns.sum())
        if have + total >= s.requests:  # the last round: cut at the request count
            ends = np.cumsum(turns)
            keep = int(np.searchsorted(ends, s.requests - have)) + 1
            turns = turns[:keep].copy()
            turns[-1] -= int(ends[keep - 1]) - (s.requests - have)
        conv = np.repeat(np.arange(turns.size), turns)
        kept = int(turns.sum())
        prompt, first = _prompts(
            system_tokens[drawn.system[: turns.size]],
            conv,
            turns,
            drawn.message[:kept],
            drawn.answer[:kept],
        )
        systems.append(drawn.system[: turns.size])
        turn_counts.append(turns)
        last_prompts.append(prompt[first + turns - 1])
        have += total
    system = np.concatenate(systems)
    all_turns = np.concatenate(turn_counts)
    layout = MooncakeIds.layout(system_tokens, system, all_turns, np.concatenate(last_prompts))
    del systems, turn_counts, last_prompts
    n_conv = int(system.size)
    start = _session_starts(rng, n_conv, s)

    rng = np.random.default_rng(s.seed)
    labels = np.random.default_rng([s.seed, 1])
    _system_prompts(rng, s)
    names = ("conv", "turn", "prompt", "output", "arrival")
    waiting: dict[str, I64] = {name: np.zeros(0, dtype=np.int64) for name in names}
    blocks = partial = prompt_sum = output_sum = last_arrival = 0
    lo = 0
    with path.open("wb") as handle:
        while lo < n_conv:
            drawn = _draw(rng, labels, s, system_tokens, popularity)
            hi = min(lo + s.conversation_chunk, n_conv)
            turns = all_turns[lo:hi]
            kept = int(turns.sum())
            conv = np.repeat(np.arange(hi - lo), turns)
            answer, think = drawn.answer[:kept], drawn.think[:kept]
            prompt, first = _prompts(
                system_tokens[system[lo:hi]], conv, turns, drawn.message[:kept], answer
            )
            new = {
                "conv": conv + lo,
                "turn": np.arange(kept, dtype=np.int64) - first[conv],
                "prompt": prompt,
                "output": answer,
                "arrival": _arrivals(s, start[lo:hi], conv, first, answer, think),
            }
            # Waiting requests came from earlier rounds, so joined before the new ones the
            # rows stay in generation order and a stable sort keeps the whole trace's ties.
            rows = {name: np.concatenate((waiting[name], new[name])) for name in names}
            order = np.argsort(rows["arrival"], kind="stable")
            boundary = int(start[hi]) if hi < n_conv else None
            ready = (
                order.size
                if boundary is None
                else int(np.searchsorted(rows["arrival"][order], boundary, "left"))
            )
            later = rows["arrival"] >= boundary if boundary is not None else None
            for piece in range(0, ready, _WRITE_CHUNK):
                out = order[piece : min(piece + _WRITE_CHUNK, ready)]
                prompt_out = rows["prompt"][out]
                blocks += _write_mooncake_lines(
                    handle,
                    layout,
                    system,
                    rows["conv"][out],
                    rows["turn"][out],
                    prompt_out,
                    rows["output"][out],
                    rows["arrival"][out],
                )
                partial += int(np.count_nonzero(prompt_out % MOONCAKE_BLOCK_TOKENS))
                prompt_sum += int(prompt_out.sum())
                output_sum += int(rows["output"][out].sum())
            if ready:
                last_arrival = max(last_arrival, int(rows["arrival"][order[ready - 1]]))
            waiting = (
                {name: rows[name][later] for name in names}
                if later is not None
                else {name: rows[name][:0] for name in names}
            )
            lo = hi
    used = np.unique(system)
    full = int(layout.system_full[used].sum())
    full += int((layout.conv_full - layout.system_full[system]).sum())
    written = Written(
        path,
        s.requests,
        blocks,
        MOONCAKE_BLOCK_TOKENS,
        full,
        prompt_sum / s.requests,
        output_sum / s.requests,
        path.stat().st_size,
        f"{partial:,} more ids name partial last blocks (the reader drops them)",
    )
    return Streamed(written, n_conv, last_arrival - int(start[0]))


def write_token_ids(c: Conversations, path: Path, *, sessions: bool = False) -> Written:
    """The token-id form: one JSON object per request in arrival order (``ts`` seconds from 0
    with µs, prompt and output token ids; ``session_id``/``turn`` with ``sessions``,
    ``tenant``/``model`` when the spec has them)."""
    if c.n > TOKEN_ID_FORM_MAX_REQUESTS:
        raise ValueError(f"the token-id form is for up to {TOKEN_ID_FORM_MAX_REQUESTS:,} requests")
    tokens = 0
    with path.open("wb") as handle:
        for _, rows in _chunks(c, _WRITE_CHUNK, tokens=4_000_000):
            offsets, ids = token_ids(c, rows)
            tokens += int(ids.size)
            prompt = c.prompt[rows]
            cut = offsets[:-1] + prompt
            # Prompt ids are [offsets[i], cut[i]), output ids [cut[i], offsets[i + 1]): two
            # list columns over the same flat array.
            prompt_ids = _sublists(offsets[:-1], cut, ids)
            output_ids = _sublists(cut, offsets[1:], ids)
            pieces: list[pl.Expr] = [
                pl.lit('{"ts": '),
                pl.lit(pl.Series(c.arrival_us[rows] / 1e6)).cast(pl.String),
            ]
            if sessions:
                pieces += [
                    pl.lit(', "session_id": "c'),
                    pl.lit(pl.Series(c.conv[rows])).cast(pl.String),
                    pl.lit('", "turn": '),
                    pl.lit(pl.Series(c.turn[rows])).cast(pl.String),
                ]
            for name, values in (("tenant", c.tenant), ("model", c.model)):
                if values is not None:
                    pieces += [
                        pl.lit(f', "{name}": "{name}-'),
                        pl.lit(pl.Series(values[c.conv[rows]])).cast(pl.String),
                        pl.lit('"'),
                    ]
            pieces += [
                pl.lit(', "prompt_token_ids": ['),
                prompt_ids,
                pl.lit('], "output_token_ids": ['),
                output_ids,
                pl.lit("]}"),
            ]
            _write_lines(handle, pl.select(pl.concat_str(pieces)).to_series())
    distinct = _distinct_chain_blocks(c, 16, answers=True)
    return Written(
        path,
        c.n,
        int(((c.prompt + c.output) // 16).sum()),  # the reader's chains at its block size
        16,
        distinct,
        float(c.prompt.mean()),
        float(c.output.mean()),
        path.stat().st_size,
        f"{tokens:,} token ids",
        tokens,
    )


def _sublists(starts: I64, stops: I64, values: npt.NDArray[Any]) -> pl.Expr:
    lengths = stops - starts
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
    return _list_text(offsets, values[index])


def _distinct_chain_blocks(c: Conversations, block_size: int, *, answers: bool) -> int:
    """Distinct full blocks of the chains at ``block_size``: the used system prompts' whole
    blocks plus, per conversation, the blocks of its longest chain past its system prompt's."""
    last = c.first + c.turns - 1
    longest = (c.prompt[last] + (c.output[last] if answers else 0)) // block_size
    system_full = c.system_tokens // block_size
    used = np.unique(c.system)
    return int(system_full[used].sum() + (longest - system_full[c.system]).sum())


def iter_frames(
    c: Conversations,
    block_size: int | None = 16,
    *,
    answers_in_chain: bool = True,
    sessions: bool = False,
    chunk: int = 1_000_000,
) -> Iterator[pl.DataFrame]:
    """The canonical table in arrival order, ``chunk`` rows at a time. ``block_size`` None
    leaves the chains out (``hashes_known`` false); ``sessions`` logs conversation and turn."""
    for lo, rows in _chunks(c, chunk):
        n = rows.size
        columns: dict[str, Any] = {
            "request_id": pl.int_range(lo, lo + n, eager=True).cast(pl.String),
            "arrival": pl.Series(c.arrival_us[rows] + _START_US).cast(pl.Datetime("us", "UTC")),
            "prompt_tokens": c.prompt[rows],
            "output_tokens": c.output[rows],
            "tokens_approximate": np.zeros(n, dtype=np.bool_),
            "source_format": pl.repeat("generated", n, eager=True),
            "source_line": np.arange(lo + 1, lo + n + 1, dtype=np.int64),
        }
        if sessions:
            columns["session_id"] = pl.Series(c.conv[rows]).cast(pl.String)
            columns["turn"] = c.turn[rows].astype(np.int32)
        for name, values in (("tenant", c.tenant), ("model", c.model)):
            if values is not None:
                columns[name] = pl.Series(values[c.conv[rows]]).cast(pl.String)
        if block_size is not None:
            offsets, keys = chain_keys(c, rows, block_size, answers_in_chain)
            chains = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(keys))
            columns |= {
                "block_size": np.full(n, block_size, dtype=np.int32),
                "prefix_hashes": pl.Series(chains),
                "prompt_blocks": (c.prompt[rows] // block_size).astype(np.int32),
                "hashes_known": np.ones(n, dtype=np.bool_),
            }
        else:
            columns["hashes_known"] = np.zeros(n, dtype=np.bool_)
        yield conform(pl.DataFrame(columns))


_START_US = int(START.timestamp()) * 1_000_000


def canonical_frame(
    c: Conversations,
    block_size: int | None = 16,
    *,
    answers_in_chain: bool = True,
    sessions: bool = False,
) -> pl.DataFrame:
    """The whole canonical table in memory (see :func:`iter_frames`)."""
    return pl.concat(
        iter_frames(c, block_size, answers_in_chain=answers_in_chain, sessions=sessions),
        rechunk=True,
    )


CSV_HEADER = ("arrival_us", "session_id", "tenant", "model", "prompt_tokens", "output_tokens")


def write_csv(c: Conversations, path: Path) -> None:
    """A plain CSV of the requests in arrival order: ``arrival_us`` (µs since the Unix epoch,
    the canonical frame's instant), ``session_id`` (the conversation), ``tenant`` and ``model``
    (empty when the spec has none), prompt and output tokens."""
    with path.open("wb") as handle:
        for index, frame in enumerate(iter_frames(c, None, sessions=True)):
            frame.select(
                pl.col("arrival").dt.epoch("us").alias("arrival_us"),
                *CSV_HEADER[1:],
            ).write_csv(handle, include_header=index == 0)


def write_azure_csv(c: Conversations, path: Path) -> None:
    """The requests as an Azure LLM inference CSV (``TIMESTAMP`` naive wall clock with µs,
    ``ContextTokens``, ``GeneratedTokens``), in arrival order from :data:`START`: the form
    carries lengths and times only."""
    with path.open("wb") as handle:
        for index, frame in enumerate(iter_frames(c, None)):
            frame.select(
                pl.col("arrival")
                .dt.replace_time_zone(None)
                .dt.to_string("%Y-%m-%d %H:%M:%S%.6f")
                .alias("TIMESTAMP"),
                pl.col("prompt_tokens").alias("ContextTokens"),
                pl.col("output_tokens").alias("GeneratedTokens"),
            ).write_csv(handle, include_header=index == 0)


# -- the command ------------------------------------------------------------------------------


def count(text: str) -> int:
    """``100K``, ``1M``, ``10M``, ``2.5M`` or a plain integer (at least 1); an argparse type."""
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:].upper())
    try:
        value = round(float(text[:-1]) * scale) if scale else int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a request count: write 100K, 1M or 10M")
    return value


def counts(text: str) -> list[int]:
    """Comma-separated :func:`count` values (``1M,10M``); an argparse type."""
    return [count(part) for part in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="perf.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=count, required=True, help="e.g. 100K, 1M, 10M")
    parser.add_argument("--form", choices=("hash", "token-ids", "azure", "csv"), default="hash")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="long")
    parser.add_argument("--tenants", type=int, default=0, help="not in the hash form")
    parser.add_argument("--models", type=int, default=0, help="not in the hash form")
    parser.add_argument("--sessions", action="store_true", help="token-ids: log session/turn")
    parser.add_argument("--rate", type=float, default=Spec.rate_rps, help="mean requests/s")
    parser.add_argument(
        "--span-days",
        type=float,
        help="sessions start over this many days (a quarter: 91): the rate is requests / span; "
        "instead of --rate",
    )
    parser.add_argument("--diurnal", type=float, default=0.0, help="daily cycle amplitude")
    args = parser.parse_args(argv)
    if args.form in ("hash", "azure") and (args.tenants or args.models or args.sessions):
        parser.error(f"the {args.form} form cannot carry tenants, models or sessions")
    if args.span_days is not None:
        if args.span_days <= 0:
            parser.error(f"--span-days {args.span_days}: a span is more than 0 days")
        args.rate = args.requests / (args.span_days * DAY_S)
    start = time.perf_counter()
    chosen = spec(
        args.requests,
        args.profile,
        seed=args.seed,
        tenants=args.tenants,
        models=args.models,
        rate_rps=args.rate,
        diurnal=args.diurnal,
    )
    # Written beside its name and renamed when whole: a generation stopped half way leaves no
    # trace that perf.e2e --traces would take for a finished one.
    target = args.out
    args.out = target.with_name(f".{target.name}.partial")
    try:
        written, n_conversations, span_s, drawing = _write(args, chosen, start)
        args.out.replace(target)
    finally:
        args.out.unlink(missing_ok=True)
    elapsed = time.perf_counter() - start
    peak = peak_rss_bytes() / 2**20
    print(
        f"wrote {target} ({args.form}, seed {args.seed}, {args.profile} profile): "
        f"{written.requests:,} requests in {n_conversations:,} conversations over "
        f"{span_s / 3600:.1f} h; mean prompt {written.mean_prompt:,.0f} tokens, mean output "
        f"{written.mean_output:,.0f} tokens"
    )
    if written.block_size:
        print(
            f"  {written.blocks:,} blocks of {written.block_size} tokens, "
            f"{written.distinct_blocks:,} distinct full blocks; {written.note}"
        )
    print(
        f"  {written.bytes / 2**20:,.0f} MiB in {elapsed:.1f} s{drawing}; peak RSS {peak:,.0f} MiB"
    )


def _write(args: argparse.Namespace, chosen: Any, start: float) -> tuple[Written, int, float, str]:
    """The trace ``args`` asks for written to ``args.out``: what was written, its conversations,
    its span in seconds, and the drawing time as said."""
    drawing = ""
    if args.form == "hash":  # drawn a round at a time: bounded memory at any size
        streamed = write_mooncake_streamed(chosen, args.out)
        written, n_conversations, span_s = (
            streamed.written,
            streamed.conversations,
            streamed.span_us / 1e6,
        )
    else:
        drawn = conversations(chosen)
        drawing = f" (drawing {time.perf_counter() - start:.1f} s)"
        if args.form in ("csv", "azure"):
            (write_csv if args.form == "csv" else write_azure_csv)(drawn, args.out)
            written = Written(
                args.out,
                drawn.n,
                0,
                0,
                0,
                float(drawn.prompt.mean()),
                float(drawn.output.mean()),
                args.out.stat().st_size,
            )
        else:
            written = write_token_ids(drawn, args.out, sessions=args.sessions)
        n_conversations = drawn.n_conversations
        span_s = (int(drawn.arrival_us.max()) - int(drawn.arrival_us.min())) / 1e6
    return written, n_conversations, span_s, drawing


if __name__ == "__main__":
    main(sys.argv[1:])
