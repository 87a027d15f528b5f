"""Benchmark: the prefix stage (sessions, sharing curve, reuse replays) on a generated trace.

The trace (default 10M requests, block size 16) is ``perf.workload``'s model at its ``short``
profile, as the canonical table: multi-turn conversations on 16 Zipf-popular shared system
prompts, every turn's prompt the whole history (previous prompt + answer) plus a new user
message, so turn t+1's chain extends turn t's prompt-and-output chain (keys are a 64-bit mix of
(owner, block index)); each conversation belongs to one of 8 tenants; Poisson session starts at
100 requests/s, exponential think times; no session ids logged. It is written as canonical
Parquet parts of 1M rows (generated a part at a time), then ``enginefit prefix PARTS --out DIR``
runs as a child process, as a user runs it: the stage scans the parts and streams the chains
(its out-of-core path, docs/prefix.md). Prints the command's wall time and peak RSS
(``getrusage``), and what it found.

Run: ``.venv/bin/python -m perf.prefix [--requests N] [--block-size B]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl

from perf.ingest import run_enginefit
from perf.workload import canonical_frame, conversations, iter_frames, spec

SEED = 7
TENANTS = 8


def generate(n_requests: int, block_size: int, seed: int = SEED) -> pl.DataFrame:
    """The same table in memory, at once (``perf.sim``'s conversation workload)."""
    drawn = conversations(spec(n_requests, "short", seed=seed, tenants=TENANTS))
    return canonical_frame(drawn, block_size)


def write_parts(folder: Path, n_requests: int, block_size: int, seed: int = SEED) -> int:
    """The canonical table of ``perf.workload``'s short-context conversations (``n_requests``
    requests, 8 tenants, answers in the chain, no session ids) as Parquet parts of 1M rows, in
    arrival order; returns the hashes written."""
    folder.mkdir(parents=True)
    drawn = conversations(spec(n_requests, "short", seed=seed, tenants=TENANTS))
    hashes = 0
    for part, frame in enumerate(iter_frames(drawn, block_size)):
        hashes += int(frame["prefix_hashes"].list.len().sum())
        frame.write_parquet(folder / f"part-{part:05d}.parquet")
    return hashes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="perf-prefix-") as tmp:
        parts, out = Path(tmp) / "requests", Path(tmp) / "out"
        start = time.perf_counter()
        hashes = write_parts(parts, args.requests, args.block_size)
        size = sum(p.stat().st_size for p in parts.iterdir())
        print(
            f"generated {args.requests:,} requests, {hashes:,} hashes of {args.block_size} "
            f"tokens, {size / 2**30:.2f} GiB of Parquet, in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        seconds, peak_mib = run_enginefit(["prefix", str(parts), "--out", str(out)], Path(tmp))
        summary = json.loads((out / "prefix" / "prefix_sharing.json").read_text())
    print(
        f"enginefit prefix (whole command): {seconds:.1f} s, peak RSS {peak_mib / 1024:.2f} GiB; "
        f"curve shape {summary['classification']['shape']!r}, an unbounded cache serves "
        f"{summary['reuse']['hit_share']:.1%} of prompt tokens, "
        f"{summary['sessions']['sessions']:,} sessions inferred",
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
