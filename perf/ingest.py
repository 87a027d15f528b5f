"""Ingest throughput: a generated 1M-request token-count CSV, token-id and block-id hashing,
and ``enginefit ingest`` end to end on a 1M-request Azure CSV and a 1M-request Mooncake JSONL.

Every trace is ``perf.workload``'s conversation model (the CSV and the JSONL hold the same
requests, as Azure's and Mooncake's formats carry them); token hashing alone runs on random ids.

Run with ``make bench`` (all benchmarks) or ``python -m perf.run ingest``; ``python -m
perf.ingest --cli-only [--requests N]`` runs only the end-to-end commands. Prints wall time and
rates; numbers in the README were measured on the project machine (2 cores, 24 GiB).

The end-to-end runs are whole commands in a child process (interpreter start, imports, read,
write), each timed on its own, with the command's peak RSS as
``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in a small launcher that runs only that command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perf.workload import (
    MooncakeIds,
    conversations,
    spec,
    write_azure_csv,
    write_mooncake,
    write_token_ids,
)
from pipeline.blockhash import chain_hash_id_runs
from pipeline.hashing import chain_hash_tokens
from pipeline.ingest import ingest_paths

ROWS = 1_000_000


SEED = 0


def generate_azure_csv(path: Path, rows: int, seed: int = SEED) -> None:
    """``perf.workload``'s conversations (long profile) as an Azure-format CSV (TIMESTAMP,
    ContextTokens, GeneratedTokens) of ``rows`` requests."""
    write_azure_csv(conversations(spec(rows, seed=seed)), path)


def generate_mooncake_jsonl(path: Path, rows: int, seed: int = SEED) -> int:
    """The same requests in ``perf.workload``'s hash form, Mooncake JSONL (returns the hash ids
    written): multi-turn conversations on 16 Zipf-popular system prompts, each turn repeating
    the history, mean prompt about 4,100 tokens (at most 32k), lines in arrival order as
    ``json.dumps`` writes them."""
    return write_mooncake(conversations(spec(rows, seed=seed)), path).blocks


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


def bench_block_id_hashing(batch: int = 65_536) -> dict[str, float]:
    """Mooncake-style block ids: the hash ids of ``perf.workload``'s 1M-request hash form
    (about 8.5 a request), chain-hashed ``batch`` requests a call, as the reader does per block
    of lines (16 MiB hold about 70k requests)."""
    drawn = conversations(spec(ROWS, seed=3))
    offsets, ids = MooncakeIds.of(drawn).ids(drawn, drawn.order)
    counts = np.diff(offsets)
    starts = offsets[:-1]
    timings = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        hashed = sum(
            chain_hash_id_runs(ids, starts[lo : lo + batch], counts[lo : lo + batch], b"bench").size
            for lo in range(0, counts.size, batch)
        )
        timings.append(time.perf_counter() - start)
    elapsed = min(timings)
    assert hashed == ids.size
    return {
        "hashed_block_ids": ids.size,
        "block_id_hash_seconds": elapsed,
        "block_ids_hashed_per_s": ids.size / elapsed,
    }


def bench_token_id_reader(tmp: Path, requests: int = 20_000) -> dict[str, float]:
    """End to end through the token-id JSONL reader (parse + validate + hash) on
    ``perf.workload``'s token-id form: short-profile conversations (prompt + answer about 930
    tokens a request), session ids logged."""
    path = tmp / "token_ids.jsonl"
    drawn = conversations(spec(requests, "short", seed=2))
    tokens = write_token_ids(drawn, path, sessions=True).tokens
    start = time.perf_counter()
    result = ingest_paths([path], salt=b"bench")
    elapsed = time.perf_counter() - start
    assert result.summary.ingested == requests
    return {
        "token_id_requests": requests,
        "token_id_seconds": elapsed,
        "token_id_tokens_per_s": tokens / elapsed,
        "token_id_requests_per_s": requests / elapsed,
    }


# Starts the command and reports its wall time and getrusage(RUSAGE_CHILDREN).ru_maxrss (KiB).
# A child's peak RSS counts the memory of whatever spawned it (Linux keeps the spawner's high-water
# mark across exec), so the command is started from this small interpreter, not from the
# benchmark process, whose own peak would otherwise be reported.
_LAUNCHER = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def run_command(trace: Path, out: Path) -> tuple[float, float]:
    """``enginefit ingest TRACE --out OUT`` in a child process: wall seconds and peak RSS (MiB).

    The child runs this checkout's code (``PYTHONPATH``), in ``out``'s folder so no project
    configuration is picked up, with a fixed salt.
    """
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "ENGINEFIT_HASH_SALT": "bench"}
    command = [sys.executable, "-m", "assets.cli", "ingest", str(trace), "--out", str(out)]
    child = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *command],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({child.returncode}): {child.stderr[-2000:]}"
        )
    elapsed, max_rss_kib = child.stdout.split()
    return float(elapsed), int(max_rss_kib) / 1024


def bench_cli_ingest(tmp: Path, rows: int = ROWS, repeats: int = REPEATS) -> dict[str, float]:
    """Both formats as whole ``enginefit ingest`` commands, alternating: the best time of
    ``repeats`` runs each, and the largest peak RSS."""
    csv_path, jsonl_path = tmp / "azure_cli.csv", tmp / "mooncake_cli.jsonl"
    generate_azure_csv(csv_path, rows)
    ids = generate_mooncake_jsonl(jsonl_path, rows)
    seconds: dict[str, list[float]] = {"csv": [], "jsonl": []}
    peak: dict[str, list[float]] = {"csv": [], "jsonl": []}
    for _ in range(repeats):
        for name, trace in (("csv", csv_path), ("jsonl", jsonl_path)):
            elapsed, rss = run_command(trace, tmp / f"out-{name}")
            print(
                f"  enginefit ingest {name}: {elapsed:.2f} s, peak RSS {rss:,.0f} MiB", flush=True
            )
            seconds[name].append(elapsed)
            peak[name].append(rss)
    # The fastest run (other load only adds time) and the largest peak (memory is not noise).
    csv_s, jsonl_s = min(seconds["csv"]), min(seconds["jsonl"])
    csv_rss, jsonl_rss = max(peak["csv"]), max(peak["jsonl"])
    return {
        "cli_rows": rows,
        "cli_jsonl_hash_ids": ids,
        "cli_jsonl_mib": jsonl_path.stat().st_size / 2**20,
        "cli_csv_seconds": csv_s,
        "cli_csv_requests_per_s": rows / csv_s,
        "cli_csv_peak_rss_mib": csv_rss,
        "cli_jsonl_seconds": jsonl_s,
        "cli_jsonl_requests_per_s": rows / jsonl_s,
        "cli_jsonl_peak_rss_mib": jsonl_rss,
        "cli_jsonl_over_csv": jsonl_s / csv_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="perf.ingest", description=__doc__)
    parser.add_argument("--cli-only", action="store_true", help="only the end-to-end commands")
    parser.add_argument("--requests", type=int, default=ROWS, help="requests per generated trace")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        results: dict[str, float] = {}
        if not args.cli_only:
            results |= bench_csv_ingest(tmp)
            results |= bench_token_hashing()
            results |= bench_block_id_hashing()
            results |= bench_token_id_reader(tmp)
        results |= bench_cli_ingest(tmp, args.requests, args.repeats)
    for key, value in results.items():
        print(f"{key:>28}: {value:,.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
