"""Small canonical workloads built in code, with properties chosen so tests can state the
expected figures by hand (no hand-written stage outputs: tests run the real stages on these)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from pipeline.schema import conform

BLOCK = 16
PEAK_MINUTE = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)  # minute-aligned: one 60 s count window


def peaky_sharing_trace(peak: int = 9_000, tail: int = 600) -> pl.DataFrame:
    """``peak`` requests evenly inside one clock minute, then ``tail`` more one per second.

    * 60 s peak rate = ``peak`` / 60 req/s; mean rate = (peak + tail) / span.
    * prompts: 800 tokens, except every 50th request (2 %) with 6,400 → p50 800, p99 6,400.
    * outputs: 60 tokens.
    * prefix: 4 of 5 requests start with the same 4 blocks (64 tokens), the rest of every
      chain is unique → shared-prefix ratio 80 % at W = 64 (and at 16, 32).
    """
    n = peak + tail
    arrivals = [PEAK_MINUTE + timedelta(microseconds=i * 60_000_000 // peak) for i in range(peak)]
    arrivals += [PEAK_MINUTE + timedelta(seconds=60 + i) for i in range(tail)]
    prompts = [6_400 if i % 50 == 0 else 800 for i in range(n)]
    chains = []
    for i, prompt in enumerate(prompts):
        blocks = prompt // BLOCK
        own = [1_000_000 + i * 1_000 + k for k in range(blocks)]
        chains.append([1, 2, 3, 4, *own[4:]] if i % 5 else own)
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": arrivals,
                "prompt_tokens": prompts,
                "output_tokens": [60] * n,
                "block_size": [BLOCK] * n,
                "prefix_hashes": chains,
                "prompt_blocks": [p // BLOCK for p in prompts],
                "hashes_known": [True] * n,
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


def growing_conversations(
    requests: int, conversations: int, *, extra_tokens: int, output_tokens: int
) -> pl.DataFrame:
    """``requests`` one second apart; request i is turn i // c of conversation s = i mod c,
    whose chain grows one 16-token block per turn ([s·100 + 1 … s·100 + turn + 1]), with
    ``extra_tokens`` past the last full block."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    n, c = requests, conversations
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": [t0 + timedelta(seconds=i) for i in range(n)],
                "session_id": [f"s{i % c}" for i in range(n)],
                "prompt_tokens": [BLOCK * (i // c + 1) + extra_tokens for i in range(n)],
                "output_tokens": [output_tokens] * n,
                "block_size": [BLOCK] * n,
                "prefix_hashes": [
                    [(i % c) * 100 + k + 1 for k in range(i // c + 1)] for i in range(n)
                ],
                "prompt_blocks": [i // c + 1 for i in range(n)],
                "hashes_known": [True] * n,
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )
