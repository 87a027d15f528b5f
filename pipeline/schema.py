"""The canonical request table: one row per request, whatever the source format.

Every reader in :mod:`pipeline.ingest.readers` produces exactly these columns, in this order, with
these dtypes. Units are fixed here once so no metric ever has to guess them.

Columns
-------
request_id
    Stable id: the source's own id when it has one, else ``"<file name>:<line>"``.
arrival
    Arrival time, UTC, microsecond precision. Relative source timestamps are added to the
    configured anchor date; naive wall-clock timestamps are taken as UTC.
session_id
    Conversation / session id when the source logs one (null otherwise; sessions can be
    inferred later from the prefix chains).
turn
    0-based turn (round) index within the session, when logged.
tenant
    Tenant / user / client id, when logged (used for isolation and the side-channel finding).
model
    Model name the request was served by, when logged.
prompt_tokens
    Prompt (input / context) tokens.
output_tokens
    Generated tokens; null when the source does not log them.
cached_tokens
    Prompt tokens the *provider* reported as served from its cache (OpenAI
    ``usage.prompt_tokens_details.cached_tokens``, TraceLab ``prefix_tokens``); null when not logged.
    This is what the provider saw, not what our simulation computes.
e2e_ms, ttft_ms
    End-to-end latency and time to first token in milliseconds, when logged (null otherwise).
structured_output, tools
    Whether the request asked for structured output (``response_format`` / JSON schema) or
    offered tools / function calls. Null when the source cannot tell.
lora_adapter
    LoRA adapter name, when logged.
block_size
    Tokens per block that ``prefix_hashes`` was cut with.
prefix_hashes
    Chained, salted 64-bit hashes of the request's *full* blocks: block ``k``'s hash is
    ``H(salt, hash of block k-1, tokens of block k)``, so one hash identifies the whole prefix
    up to and including block ``k`` (the vLLM automatic-prefix-caching key). The chain runs over
    the prompt followed by the output when the output tokens are known; the first
    ``prompt_blocks`` entries are pure prompt blocks. Empty when the source has no content
    (token-count-only traces).
prompt_blocks
    How many leading ``prefix_hashes`` are prompt blocks (``prompt_tokens // block_size`` when
    the content is known; for block-id traces, the full prompt blocks the source identifies).
hashes_known
    True when the source carried prompt content or block identities, so ``prefix_hashes`` is
    meaningful; False for count-only traces (whose requests then share nothing).
tokens_approximate
    True when the token counts and blocks came from the built-in approximate tokenizer rather
    than the model's own ``tokenizer.json`` or the source's counts.
source_format, source_file, source_line
    Lineage: which reader, which file (as given), which 1-based line or record number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

CANONICAL_SCHEMA: pl.Schema = pl.Schema(
    {  # type: ignore[arg-type]
        "request_id": pl.String,
        "arrival": pl.Datetime("us", "UTC"),
        "session_id": pl.String,
        "turn": pl.Int32,
        "tenant": pl.String,
        "model": pl.String,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "cached_tokens": pl.Int64,
        "e2e_ms": pl.Float64,
        "ttft_ms": pl.Float64,
        "structured_output": pl.Boolean,
        "tools": pl.Boolean,
        "lora_adapter": pl.String,
        "block_size": pl.Int32,
        "prefix_hashes": pl.List(pl.UInt64),
        "prompt_blocks": pl.Int32,
        "hashes_known": pl.Boolean,
        "tokens_approximate": pl.Boolean,
        "source_format": pl.String,
        "source_file": pl.String,
        "source_line": pl.Int64,
    }
)

# One quarantined record: where it was, which field was wrong, and why. The raw text is not
# kept (it may hold prompt text); only a short, non-content description of the problem.
QUARANTINE_SCHEMA: pl.Schema = pl.Schema(
    {
        "source_file": pl.String,
        "source_line": pl.Int64,
        "field": pl.String,
        "reason": pl.String,
        "detail": pl.String,
    }
)

# Sanity bounds: a prompt or output above this many tokens is not a real request but a unit or
# parsing error (the largest context windows in late 2026 are around ten million tokens).
MAX_PLAUSIBLE_TOKENS = 10_000_000


def conform_to(frame: pl.DataFrame, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Add any missing column of ``schema`` as nulls, cast to it and put it in its order."""
    missing = [
        pl.lit(None, dtype=dtype).alias(name)
        for name, dtype in schema.items()
        if name not in frame.columns
    ]
    return frame.with_columns(missing).select(
        pl.col(name).cast(dtype) for name, dtype in schema.items()
    )


def conform(frame: pl.DataFrame, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """:func:`conform_to` the canonical schema (``columns``: only those canonical columns, in
    canonical order)."""
    wanted = {n: t for n, t in CANONICAL_SCHEMA.items() if columns is None or n in columns}
    return conform_to(frame, wanted)


def empty_canonical() -> pl.DataFrame:
    return pl.DataFrame(schema=CANONICAL_SCHEMA)


def empty_quarantine() -> pl.DataFrame:
    return pl.DataFrame(schema=QUARANTINE_SCHEMA)
