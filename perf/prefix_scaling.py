"""Benchmark: how the prefix stage's memory grows with the requests, and where it goes.

For each size (default 1M, 3M and 10M requests of ``perf.prefix``'s generated trace, block
size 16) the canonical parts are written once (kept under ``--keep DIR`` to rerun), then
``enginefit prefix PARTS --out DIR`` runs as a child process (wall time, peak RSS). With
``--pieces`` the analysis also runs in this process, and the state each piece holds when the
chains have streamed by is printed: the session stream's carried state and codes, the curve's
per-window hashes, the shared replay's table of distinct blocks and the retention ages, in MiB,
so what grows with the requests and what with the distinct blocks can be read off.

Run: ``python -m perf.prefix_scaling [--requests 1M,3M,10M] [--keep DIR] [--pieces]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl

from perf.ingest import run_enginefit
from perf.prefix import write_parts

MIB = 2**20


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def pieces(parts: Path) -> dict[str, float]:
    """MiB each piece of the analysis holds once the chains have streamed by."""
    from pipeline.prefix import analysis
    from pipeline.prefix.config import PrefixConfig
    from pipeline.settings import default_mapping

    held: dict[str, float] = {}
    original = analysis._FirstPass.feed

    def measured(first: Any, chunks: Any) -> None:
        original(first, chunks)
        stream, sessions, counter = first.stream, first.sessions, first.counter
        held["session carried state"] = (
            stream._table.nbytes()
            + stream._ent_k.nbytes
            + stream._ent_sess.nbytes
            + stream._ent_us.nbytes
            + stream._open.estimated_size()
            + stream._names.estimated_size()
        ) / MIB
        held["session codes so far"] = sum(f.estimated_size() for f in sessions.codes) / MIB
        held["curve per-window hashes (or kept classes)"] = counter.nbytes() / MIB if counter else 0
        held["shared replay table"] = first.shared.table.nbytes() / MIB
        held["retention ages kept"] = first.hits.retention._n * 16 / MIB

    analysis._FirstPass.feed = measured  # type: ignore[method-assign,assignment]
    try:
        config = PrefixConfig.model_validate(default_mapping()["prefix"])
        analysis.analyse(pl.scan_parquet(parts / "*.parquet"), config)
    finally:
        analysis._FirstPass.feed = original  # type: ignore[method-assign,assignment]
    return held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="1M,3M,10M")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--pieces", action="store_true")
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="perf-prefix-scaling-") as tmp:
        root = args.keep or Path(tmp)
        for text in args.requests.split(","):
            n = _size(text)
            parts = root / f"requests-{n}"
            if not parts.exists():
                hashes = write_parts(parts, n, args.block_size)
                print(f"{n:,} requests: {hashes:,} hashes written", flush=True)
            out = root / f"out-{n}"
            seconds, peak = run_enginefit(["prefix", str(parts), "--out", str(out)], root)
            summary = json.loads((out / "prefix" / "prefix_sharing.json").read_text())
            print(
                f"{n:,} requests: enginefit prefix {seconds:.1f} s, peak RSS {peak / 1024:.2f} GiB,"
                f" {summary['sessions']['sessions']:,} sessions",
                flush=True,
            )
            if args.pieces:
                for name, mib in pieces(parts).items():
                    print(f"  {name}: {mib:,.0f} MiB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
