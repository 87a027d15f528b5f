"""Ingest throughput: a generated 1M-request token-count CSV, token-id hashing (``hashlib`` per
block and the reader's compiled kernel), block-id hashing, the token-id JSONL reader,
and ``enginefit ingest`` end to end on a 1M-request Azure CSV, a 1M-request Mooncake JSONL and
a 100k-request token-id JSONL (short profile).

Every trace is ``perf.workload``'s conversation model (the CSV and the JSONL hold the same
requests, as Azure's and Mooncake's formats carry them); token hashing alone runs on random ids.

Run with ``make bench`` (all benchmarks) or ``python -m perf.run ingest``; ``python -m
perf.ingest --cli-only [--requests N] [--token-id-requests N] [--formats csv,jsonl,token-ids]``
runs only the end-to-end commands. Prints wall time and
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
from pipeline.hashing import chain_hash_tokens
from pipeline.ingest.blockhash import chain_hash_id_runs, chain_hash_token_runs
from pipeline.ingest.compute import ingest_paths

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


def bench_token_run_hashing(request_tokens: int = 1_024) -> dict[str, float]:
    """The same 16M random token ids as :func:`bench_token_hashing`, as requests of
    ``request_tokens`` (a prompt run and an output run each) chain-hashed by the compiled kernel
    the token-id reader uses, 15,625 requests in one call (a 16 MiB block of token-id lines
    holds about 2,500 such requests: the call size changes little)."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 150_000, 16_000_000).astype(np.uint32)
    starts = np.arange(0, tokens.size, request_tokens, dtype=np.int64)
    prompt = request_tokens * 9 // 10
    runs = np.stack(
        [
            starts,
            np.full_like(starts, prompt),
            starts + prompt,
            np.full_like(starts, request_tokens - prompt),
        ],
        axis=1,
    )
    chain_hash_token_runs(tokens[:request_tokens], runs[:1], 16, b"bench")  # compiled
    timings = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        hashes = chain_hash_token_runs(tokens, runs, 16, b"bench")
        timings.append(time.perf_counter() - start)
    elapsed = min(timings)
    assert hashes.size == runs.shape[0] * (request_tokens // 16)
    return {"compiled_hash_seconds": elapsed, "tokens_hashed_compiled_per_s": tokens.size / elapsed}


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


def run_enginefit(args: list[str], cwd: Path) -> tuple[float, float]:
    """``enginefit ARGS`` in a child process: wall seconds and peak RSS (MiB).

    The child runs this checkout's code (``PYTHONPATH``), in ``cwd`` (a folder without a
    project configuration), with a fixed salt.
    """
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "ENGINEFIT_HASH_SALT": "bench"}
    command = [sys.executable, "-m", "assets.cli", *args]
    child = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *command],
        cwd=cwd,
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


def run_command(trace: Path, out: Path) -> tuple[float, float]:
    """``enginefit ingest TRACE --out OUT``, as :func:`run_enginefit` runs it."""
    return run_enginefit(["ingest", str(trace), "--out", str(out)], out.parent)


TOKEN_ID_ROWS = 100_000
FORMATS = ("csv", "jsonl", "token-ids")


def bench_cli_ingest(
    tmp: Path,
    rows: int = ROWS,
    repeats: int = REPEATS,
    *,
    token_id_rows: int = TOKEN_ID_ROWS,
    formats: tuple[str, ...] = FORMATS,
) -> dict[str, float]:
    """The formats as whole ``enginefit ingest`` commands, alternating: the best time of
    ``repeats`` runs each, and the largest peak RSS. The token-id JSONL is ``token_id_rows``
    short-profile requests with session ids (its own size: the token-id form is about 40 times
    the bytes of the hash form per request)."""
    traces: dict[str, Path] = {}
    results: dict[str, float] = {"cli_rows": rows}
    if "csv" in formats:
        traces["csv"] = tmp / "azure_cli.csv"
        generate_azure_csv(traces["csv"], rows)
    if "jsonl" in formats:
        traces["jsonl"] = tmp / "mooncake_cli.jsonl"
        results["cli_jsonl_hash_ids"] = generate_mooncake_jsonl(traces["jsonl"], rows)
        results["cli_jsonl_mib"] = traces["jsonl"].stat().st_size / 2**20
    counts = {"csv": rows, "jsonl": rows}
    if "token-ids" in formats:
        traces["token-ids"] = tmp / "token_ids_cli.jsonl"
        drawn = conversations(spec(token_id_rows, "short", seed=2))
        written = write_token_ids(drawn, traces["token-ids"], sessions=True)
        counts["token-ids"] = token_id_rows
        results["cli_token_ids_rows"] = token_id_rows
        results["cli_token_ids_tokens"] = written.tokens
        results["cli_token_ids_mib"] = traces["token-ids"].stat().st_size / 2**20
    seconds: dict[str, list[float]] = {name: [] for name in traces}
    peak: dict[str, list[float]] = {name: [] for name in traces}
    for _ in range(repeats):
        for name, trace in traces.items():
            elapsed, rss = run_command(trace, tmp / f"out-{name}")
            print(
                f"  enginefit ingest {name}: {elapsed:.2f} s, peak RSS {rss:,.0f} MiB", flush=True
            )
            seconds[name].append(elapsed)
            peak[name].append(rss)
    # The fastest run (other load only adds time) and the largest peak (memory is not noise).
    for name in traces:
        key = name.replace("-", "_")
        best = min(seconds[name])
        results[f"cli_{key}_seconds"] = best
        results[f"cli_{key}_requests_per_s"] = counts[name] / best
        results[f"cli_{key}_peak_rss_mib"] = max(peak[name])
    if "token-ids" in traces:
        results["cli_token_ids_tokens_per_s"] = (
            results["cli_token_ids_tokens"] / results["cli_token_ids_seconds"]
        )
    if {"csv", "jsonl"} <= traces.keys():
        results["cli_jsonl_over_csv"] = results["cli_jsonl_seconds"] / results["cli_csv_seconds"]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="perf.ingest", description=__doc__)
    parser.add_argument("--cli-only", action="store_true", help="only the end-to-end commands")
    parser.add_argument("--requests", type=int, default=ROWS, help="requests per generated trace")
    parser.add_argument(
        "--token-id-requests",
        type=int,
        default=TOKEN_ID_ROWS,
        help="requests in the generated token-id JSONL",
    )
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="end-to-end commands to run, comma-separated (csv, jsonl, token-ids)",
    )
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        results: dict[str, float] = {}
        if not args.cli_only:
            results |= bench_csv_ingest(tmp)
            results |= bench_token_hashing()
            results |= bench_token_run_hashing()
            results |= bench_block_id_hashing()
            results |= bench_token_id_reader(tmp)
        formats = tuple(name.strip() for name in args.formats.split(",") if name.strip())
        if unknown := set(formats) - set(FORMATS):
            parser.error(f"unknown formats: {', '.join(sorted(unknown))}")
        results |= bench_cli_ingest(
            tmp,
            args.requests,
            args.repeats,
            token_id_rows=args.token_id_requests,
            formats=formats,
        )
    for key, value in results.items():
        print(f"{key:>28}: {value:,.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
