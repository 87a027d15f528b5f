"""Ingest throughput: a generated 1M-request token-count CSV, and token-id hashing.

Run with ``make bench`` (all benchmarks) or ``python -m perf.run ingest``. Prints wall
time and rates; numbers in the README were measured on the project machine (2 cores, 24 GiB).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.hashing import chain_hash_tokens
from pipeline.ingest import ingest_paths

ROWS = 1_000_000


def generate_azure_csv(path: Path, rows: int, seed: int = 0) -> None:
    """An Azure-format CSV (TIMESTAMP, ContextTokens, GeneratedTokens) with rows requests."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:00:00", "us")
    gaps = rng.exponential(1000.0, rows).astype("int64")  # ~1000 req/s
    stamps = (start + np.cumsum(gaps).astype("timedelta64[us]")).astype(str)
    context = rng.integers(1, 8000, rows)
    generated = rng.integers(1, 500, rows)
    with path.open("w") as handle:
        handle.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        stamps_fmt = np.char.replace(stamps, "T", " ")
        lines = [f"{t},{c},{g}\n" for t, c, g in zip(stamps_fmt, context, generated, strict=True)]
        handle.writelines(lines)


REPEATS = 3  # best of three: the machine's other load only ever adds time


def bench_csv_ingest(tmp: Path) -> dict[str, float]:
    path = tmp / "azure_1m.csv"
    generate_azure_csv(path, ROWS)
    timings = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = ingest_paths([path], salt=b"bench")
        timings.append(time.perf_counter() - start)
        assert result.summary.ingested == ROWS
    elapsed = min(timings)
    return {"csv_rows": ROWS, "csv_seconds": elapsed, "csv_requests_per_s": ROWS / elapsed}


def bench_token_hashing() -> dict[str, float]:
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 150_000, 16_000_000)
    timings = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        hashes = chain_hash_tokens(tokens, 16, b"bench")
        timings.append(time.perf_counter() - start)
    elapsed = min(timings)
    assert hashes.size == 1_000_000
    return {
        "hashed_tokens": tokens.size,
        "hash_seconds": elapsed,
        "tokens_hashed_per_s": tokens.size / elapsed,
    }


def bench_token_id_reader(tmp: Path, requests: int = 20_000) -> dict[str, float]:
    """End to end through the token-id JSONL reader (parse + validate + hash)."""
    rng = np.random.default_rng(2)
    path = tmp / "token_ids.jsonl"
    total = 0
    with path.open("w") as handle:
        for i in range(requests):
            prompt = rng.integers(0, 150_000, int(rng.integers(64, 2048))).tolist()
            total += len(prompt)
            handle.write(
                json.dumps(
                    {
                        "ts": i * 0.01,
                        "session_id": f"s{i % 500}",
                        "prompt_token_ids": prompt,
                        "output_tokens": 10,
                    }
                )
                + "\n"
            )
    start = time.perf_counter()
    result = ingest_paths([path], salt=b"bench")
    elapsed = time.perf_counter() - start
    assert result.summary.ingested == requests
    return {
        "token_id_requests": requests,
        "token_id_seconds": elapsed,
        "token_id_tokens_per_s": total / elapsed,
        "token_id_requests_per_s": requests / elapsed,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        results = {**bench_csv_ingest(tmp), **bench_token_hashing(), **bench_token_id_reader(tmp)}
    for key, value in results.items():
        print(f"{key:>28}: {value:,.2f}")


if __name__ == "__main__":
    main()
