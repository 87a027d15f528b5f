"""What a load test sends, and when: pure functions from the workload's canonical table.

**Arrivals.** ``trace``: the inter-arrival gaps of the trace's first ⌈rate × horizon⌉ + 1
requests, in trace order, scaled so their mean rate is the target rate (the burst pattern is
kept, its tempo changed; one rate's schedule does not depend on the other rates); when the run is
longer than the scaled trace, the pattern repeats after one mean gap. ``poisson``: exponential
gaps; ``gamma``: gamma gaps whose coefficient of variation is ``burstiness`` (1 = Poisson).
Send offsets never depend on the server: the client sends at these times (open loop).

**Requests.** Send ``i`` of a rate replays trace request ``i mod N`` (trace order): its prompt
length, its output length (``max_tokens``), and its prefix structure.

**Prompts.** Only hashes and counts exist, never the original text. A prompt is a sequence of
words from :data:`WORDS` (common English words, each one token in the usual BPE and
SentencePiece vocabularies, so words ≈ tokens): each of the request's hashed prompt blocks
becomes ``block_size`` words drawn from the block's hash, so two requests that share a chain of
block hashes share exactly that text; the rest of the prompt (the partial last block, or the
whole prompt of a trace without content) is words drawn from the send itself, shared with
nobody. Every rate draws its words in its own namespace, so one rate never warms the server's
cache for the next (each rate starts as cold as the trace did). What a replay cannot reproduce:
reuse of *generated* blocks (a conversation's next prompt holds the previous answer, which the
server generated as text of its own), and separate caches per model or adapter (every request
goes to one ``--model``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.errors import InputFormatError

# Common English words, each a single token (with its leading space) in GPT-2/LLaMA/Mistral/Qwen
# style vocabularies; about 500 of them give ~9 bits per word, so two different blocks collide
# with probability about 2^-(9·block_size).
WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        """
        the of and to in is was for that on as with by he at from his it an were are which be this
        had not or have one but all she they there been has when who their more would her will no
        if out so up said what its about into than them can only other new some could time these
        two may then do first any my now such like our over man me even most made after also did
        many before must through back years where much your way well down should because each just
        those people how too little state good very make world still own see men work long get
        here between both life being under never day same another know while last might us great
        old year off come since against go came right used take three place around however home
        small found thought went say part once general high upon school every does got united left
        number course war until always away something fact though water less public put think
        almost hand enough far took head yet government system better set told nothing night end
        why called didn find look asked later point knew city next program business give group
        toward young days let room president side social given present several order national
        possible rather second face per among form important often things looked early white john
        case become large big need four within felt along children saw best church ever least
        power development light thing seemed family interest want members mind country area others
        done turned although open god service certain kind problem began different door thus help
        sense means whole matter perhaps itself york times law human line above name example
        action company hands local show five history whether gave either act today feet across
        taken past quite anything seen having death week experience body word half really field am
        car words already themselves information tell together college shall money period held
        keep sure free seems real behind cannot miss political air question making office brought
        whose special heard major problems ago became federal moment study available known result
        street economic boy position reason change south board individual job areas society west
        close turn love community true court force full seem policy wife future age voice center
        woman control common necessary following front sometimes six girl clear further land run
        students provide military similar training growth private level either type black include
        ground data road value art peace table music low record river paper plan town plant red
        heart story cost field class stand blue stage natural list food summer green model sound
        simple cold early test rate market short fire trade lost hope north chance strong science
        bank size cut deal page energy plain king step bed glass rest nature text wall bit film
        hour note heat radio shot design sea pass hold fine tree lay map star product leader wind
        dark ship pay past sent note fall sun gas
        """.split()  # noqa: SIM905 (one word list reads better as text)
    )
)
WORD_COUNT = len(WORDS)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TAIL_TAG = np.uint64(0xD1B54A32D192ED03)  # keeps a send's own words apart from block words


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (uint64 arithmetic wraps, as intended)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def namespace(seed: int, rate_rps: float) -> int:
    """The word namespace of one rate of one run: fixed by the seed and the rate alone, so the
    same rate gets the same prompts whatever the order of the rates."""
    key = np.array([seed & 0xFFFFFFFFFFFFFFFF, round(rate_rps * 1e6)], dtype=np.uint64)
    return int(_mix(_mix(key[:1]) ^ key[1:])[0])


def _words(keys: np.ndarray, count: int) -> np.ndarray:
    """``count`` word indices per key (a row each), drawn from the key alone."""
    steps = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN
    return (_mix(keys[:, None] + steps[None, :]) % np.uint64(WORD_COUNT)).astype(np.int64)


def prompt_words(
    block_hashes: np.ndarray, prompt_tokens: int, block_size: int, ns: int, send_key: int
) -> np.ndarray:
    """Word indices of one prompt of ``prompt_tokens`` words.

    ``block_hashes``: the request's prompt block hashes (uint64, chained). Full blocks take
    their words from their hash; a listed partial last block (block-id traces list one) takes
    the first words of its hash's block; the rest comes from ``send_key``, unique to the send.
    """
    ns_key = np.uint64(ns)
    hashed = min(len(block_hashes), math.ceil(prompt_tokens / block_size))
    parts: list[np.ndarray] = []
    if hashed:
        keys = block_hashes[:hashed].astype(np.uint64) ^ ns_key
        parts.append(_words(keys, block_size).ravel()[:prompt_tokens])
    tail = prompt_tokens - (parts[0].size if parts else 0)
    if tail > 0:
        key = np.array([send_key], dtype=np.uint64) ^ ns_key ^ _TAIL_TAG
        parts.append(_words(_mix(key), tail).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def prompt_text(words: np.ndarray) -> str:
    """The words joined by single spaces (each word then carries its leading space in BPE)."""
    return " ".join([WORDS[i] for i in words.tolist()])


# ------------------------------------------------------------------------------ the trace


@dataclass(frozen=True)
class TraceSample:
    """The columns of the canonical table a load test replays, in arrival order."""

    arrival_s: np.ndarray  # float64, seconds since the first arrival
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64 (nulls filled, see :func:`trace_sample`)
    hash_offsets: np.ndarray  # int64, len N + 1: request i's prompt blocks are
    hash_values: np.ndarray  # uint64 hash_values[hash_offsets[i]:hash_offsets[i + 1]]
    block_size: int
    hashes_known: bool  # any request carries block identities
    output_filled: int  # requests whose output length was not logged (given the median)
    served_as: tuple[str, ...] = ()  # the distinct model / LoRA adapter names logged

    @property
    def requests(self) -> int:
        return int(self.prompt_tokens.size)

    def block_hashes(self, row: int) -> np.ndarray:
        return self.hash_values[self.hash_offsets[row] : self.hash_offsets[row + 1]]

    @property
    def mean_rate_rps(self) -> float | None:
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if self.requests > 1 else 0.0
        return (self.requests - 1) / span if span > 0 else None


def trace_sample(requests: pl.LazyFrame, *, limit: int | None = None) -> TraceSample:
    """The first ``limit`` requests by arrival (all when None) as arrays.

    Raises :class:`InputFormatError` for an empty workload, one with mixed block sizes, or one
    that logs no output lengths at all (a load test needs ``max_tokens`` for every request).
    """
    ordered = requests.with_row_index("_order").sort("arrival", "_order")
    if limit is not None:
        ordered = ordered.head(limit)
    frame = ordered.select(
        (pl.col("arrival") - pl.col("arrival").first()).dt.total_microseconds().alias("us"),
        "prompt_tokens",
        "output_tokens",
        "block_size",
        pl.when(pl.col("hashes_known"))
        .then(pl.col("prefix_hashes").list.head(pl.col("prompt_blocks")))
        .otherwise(pl.lit([], dtype=pl.List(pl.UInt64)))
        .alias("hashes"),
        "hashes_known",
        pl.when(pl.col("lora_adapter").is_null())
        .then(pl.col("model").fill_null(""))
        .otherwise(pl.concat_str(pl.col("model").fill_null("?"), pl.lit("+"), "lora_adapter"))
        .alias("served_as"),
    ).collect()
    if frame.height == 0:
        raise InputFormatError("the workload has no requests to replay")
    sizes = frame.get_column("block_size").unique().drop_nulls()
    if sizes.len() > 1:
        raise InputFormatError(
            f"the workload mixes block sizes {sorted(sizes.to_list())}; ingest it with one "
            "block size to replay its prefix structure"
        )
    outputs = frame.get_column("output_tokens")
    known = outputs.drop_nulls()
    if known.len() == 0:
        raise InputFormatError(
            "the workload logs no output lengths (output_tokens is empty in every request), so "
            "a load test cannot ask for the right number of tokens; replay a trace that logs them"
        )
    median = max(1, round(float(known.median())))  # type: ignore[arg-type]
    hashes = frame.get_column("hashes")
    offsets = np.zeros(frame.height + 1, dtype=np.int64)
    np.cumsum(hashes.list.len().to_numpy(), out=offsets[1:])
    return TraceSample(
        arrival_s=frame.get_column("us").to_numpy().astype(np.float64) / 1e6,
        prompt_tokens=frame.get_column("prompt_tokens").to_numpy().astype(np.int64),
        output_tokens=outputs.fill_null(median).clip(lower_bound=1).to_numpy().astype(np.int64),
        hash_offsets=offsets,
        hash_values=hashes.explode().drop_nulls().to_numpy().astype(np.uint64),
        block_size=int(sizes[0]) if sizes.len() else 16,
        hashes_known=bool(frame.get_column("hashes_known").any()),
        output_filled=outputs.null_count(),
        served_as=tuple(sorted(n for n in frame.get_column("served_as").unique().to_list() if n)),
    )


# ----------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class RatePlan:
    """One rate's sends: offsets from the rate's start, and the trace row each replays."""

    rate_rps: float
    offsets_s: np.ndarray  # float64, non-decreasing
    trace_rows: np.ndarray  # int64
    warmup_count: int  # the first sends, discarded from the results
    namespace: int
    arrival_cv: float  # coefficient of variation of the planned gaps (1 = Poisson)
    #: trace arrivals: how many distinct timestamps the replayed requests have (a bucketed
    #: trace replays its buckets as bursts); None for synthetic arrivals
    trace_instants: int | None = None

    @property
    def sends(self) -> int:
        return int(self.offsets_s.size)


def trace_gaps(arrival_s: np.ndarray) -> np.ndarray:
    """The trace's inter-arrival gaps (seconds), in trace order."""
    return np.diff(arrival_s)


def trace_window(arrival_s: np.ndarray | None, rate_rps: float, horizon_s: float) -> np.ndarray:
    """The trace arrivals one rate replays: its first ⌈rate × horizon⌉ + 1 requests (all when
    the trace is shorter), whose gaps are then scaled to average exactly the rate, so a rate's
    schedule depends on nothing but the rate, the horizon and the trace."""
    if arrival_s is None or arrival_s.size < 2:
        raise InputFormatError(
            "the trace's arrivals cannot be scaled to a rate: it has fewer than two requests; "
            "use --arrivals poisson or gamma"
        )
    window = arrival_s[: math.ceil(rate_rps * horizon_s) + 1]
    if window[-1] <= window[0]:
        raise InputFormatError(
            f"the trace's first {window.size} requests all arrive at one instant, so their gaps "
            "cannot be scaled to a rate; use --arrivals poisson or gamma"
        )
    return window


def plan_offsets(
    kind: str,
    *,
    rate_rps: float,
    horizon_s: float,
    burstiness: float,
    seed: int,
    arrival_s: np.ndarray | None = None,
) -> np.ndarray:
    """Send offsets in [0, horizon) at a mean of ``rate_rps`` (see the module docstring)."""
    expected = max(1, math.ceil(rate_rps * horizon_s))
    if kind == "trace":
        window = trace_window(arrival_s, rate_rps, horizon_s)
        gaps = trace_gaps(window)
        scaled = gaps * (gaps.size / float(gaps.sum())) / rate_rps  # mean gap = 1 / rate
        cycle = np.concatenate([scaled, [1.0 / rate_rps]])  # the pattern repeats after one gap
        repeats = math.ceil(expected / cycle.size) + 1
        gap_stream = np.tile(cycle, repeats)
        offsets = np.concatenate([[0.0], np.cumsum(gap_stream[:-1])])
    else:
        rng = np.random.default_rng([seed, round(rate_rps * 1e6)])
        count = expected + 10 * math.ceil(math.sqrt(expected)) + 10
        if kind == "poisson":
            gaps = rng.exponential(1.0 / rate_rps, count)
        else:  # gamma with coefficient of variation `burstiness`: shape k = 1 / CV²
            shape = 1.0 / burstiness**2
            gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), count)
        offsets = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        while offsets[-1] < horizon_s:  # a slow draw: extend rather than stop short
            more = rng.exponential(1.0 / rate_rps, count)
            offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(more)])
    return offsets[offsets < horizon_s]


def coefficient_of_variation(offsets_s: np.ndarray) -> float:
    gaps = np.diff(offsets_s)
    if gaps.size < 2 or gaps.mean() <= 0:
        return math.nan
    return float(gaps.std() / gaps.mean())


def plan_rate(
    trace: TraceSample,
    *,
    kind: str,
    rate_rps: float,
    duration_s: float,
    warmup_s: float,
    burstiness: float,
    seed: int,
) -> RatePlan:
    offsets = plan_offsets(
        kind,
        rate_rps=rate_rps,
        horizon_s=warmup_s + duration_s,
        burstiness=burstiness,
        seed=seed,
        arrival_s=trace.arrival_s,
    )
    rows = np.arange(offsets.size, dtype=np.int64) % trace.requests
    return RatePlan(
        rate_rps=rate_rps,
        offsets_s=offsets,
        trace_rows=rows,
        warmup_count=int(np.count_nonzero(offsets < warmup_s)),
        namespace=namespace(seed, rate_rps),
        arrival_cv=coefficient_of_variation(offsets),
        trace_instants=(
            int(np.unique(trace.arrival_s[np.unique(rows)]).size) if kind == "trace" else None
        ),
    )


def rows_needed(max_rate_rps: float, horizon_s: float) -> int:
    """An upper bound on the trace rows a plan replays before wrapping (a few σ of Poisson
    noise above the mean count), so a large trace is never loaded whole."""
    mean = max_rate_rps * horizon_s
    return math.ceil(mean + 10 * math.sqrt(mean) + 10)
