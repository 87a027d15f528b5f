"""Benchmark: workload-shape metrics on a generated canonical trace (default 10M requests).

The trace is generated in numpy chunks of 1M rows (never 10M Python objects) and written as
canonical Parquet parts: bursty arrivals over about one day (exponential gaps scaled by a
log-normal burst factor), log-normal prompt/output lengths, 30 % of rows in sessions, ten
tenants, three models, no logged durations (so concurrency uses the latency model).

The measurement runs in a fresh subprocess so its peak RSS (``resource.getrusage``) covers
only the shape computation on a lazy scan of the Parquet files, not the generation.

Run: ``.venv/bin/python -m perf.shape [--requests N] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.schema import conform

CHUNK = 1_000_000
START_US = 1_700_000_000 * 1_000_000


def generate(out_dir: Path, requests: int, seed: int = 7) -> list[Path]:
    """Write ``requests`` canonical rows as ``out_dir/requests/part-*.parquet``."""
    rng = np.random.default_rng(seed)
    parts = out_dir / "requests"
    parts.mkdir(parents=True, exist_ok=True)
    mean_gap_us = 86_400 * 1_000_000 / requests
    clock = START_US
    written = []
    for part, lo in enumerate(range(0, requests, CHUNK)):
        n = min(CHUNK, requests - lo)
        burst = rng.lognormal(0.0, 1.2, n)
        gaps = rng.exponential(mean_gap_us, n) * burst / np.exp(1.2**2 / 2)
        arrival = clock + np.cumsum(gaps).astype(np.int64)
        clock = int(arrival[-1])
        idx = np.arange(lo, lo + n, dtype=np.int64)
        in_session = rng.random(n) < 0.3
        frame = pl.DataFrame(
            {
                "idx": idx,
                "arrival": arrival,
                "prompt_tokens": rng.lognormal(7.0, 1.3, n).astype(np.int64) + 1,
                "output_tokens": rng.lognormal(5.0, 1.0, n).astype(np.int64),
                "session": np.where(in_session, rng.integers(0, requests // 20 + 1, n), -1),
                "tenant": rng.integers(0, 10, n),
                "model": rng.integers(0, 3, n),
            }
        ).select(
            pl.format("r{}", "idx").alias("request_id"),
            pl.col("arrival").cast(pl.Datetime("us", "UTC")),
            pl.when(pl.col("session") >= 0)
            .then(pl.format("s{}", "session"))
            .otherwise(None)
            .alias("session_id"),
            pl.format("tenant-{}", "tenant").alias("tenant"),
            pl.format("model-{}", "model").alias("model"),
            "prompt_tokens",
            "output_tokens",
            pl.lit("bench").alias("source_format"),
            pl.lit("generated").alias("source_file"),
            (pl.col("idx") + 1).alias("source_line"),
        )
        path = parts / f"part-{part:05d}.parquet"
        conform(frame).write_parquet(path, compression="zstd")
        written.append(path)
    return written


def measure(workload: Path) -> dict[str, object]:
    """Time each shape step on a lazy scan; report peak RSS of this process."""
    from pipeline.config import default_config
    from pipeline.layout import WorkloadLayout
    from pipeline.shape.arrivals import arrival_metrics
    from pipeline.shape.compute import compute_shape
    from pipeline.shape.concurrency import peak_concurrency
    from pipeline.shape.lengths import length_metrics
    from pipeline.shape.mix import (
        category_metrics,
        feature_metrics,
        provider_cache_metrics,
        session_metrics,
    )
    from pipeline.shape.stage import write
    from pipeline.store import scan_requests

    cfg = default_config().shape
    lf = scan_requests(workload)
    timings: dict[str, float] = {}
    rss: dict[str, float] = {}

    def step(name: str, fn: object) -> object:
        start = time.perf_counter()
        value = fn()  # type: ignore[operator]
        timings[name] = round(time.perf_counter() - start, 2)
        rss[name] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        return value

    step("arrivals", lambda: arrival_metrics(lf, cfg.min_quanta_per_window))
    step("lengths", lambda: length_metrics(lf))
    conc = step("concurrency", lambda: peak_concurrency(lf, cfg.latency, cfg.plot_points))
    step(
        "mix",
        lambda: (
            session_metrics(lf),
            category_metrics(lf, "tenant"),
            category_metrics(lf, "model"),
            feature_metrics(lf),
            provider_cache_metrics(lf),
        ),
    )
    result = step("full stage (compute)", lambda: compute_shape(lf, cfg))
    with tempfile.TemporaryDirectory() as tmp:
        step("full stage (write)", lambda: write(result, WorkloadLayout(Path(tmp))))  # type: ignore[arg-type]
    shape = result.metrics  # type: ignore[attr-defined]
    return {
        "requests": shape["requests"],
        "peak_concurrency": conc.peak,  # type: ignore[attr-defined]
        "peak_rate_1s": shape["arrivals"]["windows"]["1s"].get("peak_rate_rps"),
        "seconds": timings,
        "peak_rss_mib_after_step": rss,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep the trace here")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        workload = args.keep or Path(tmp)
        if not (workload / "requests").is_dir():
            start = time.perf_counter()
            generate(workload, args.requests)
            print(f"generated {args.requests:,} requests in {time.perf_counter() - start:.1f} s")
        size = sum(p.stat().st_size for p in (workload / "requests").glob("*.parquet"))
        print(f"trace: {size / 2**20:,.0f} MiB of Parquet")
        child = subprocess.run(
            [sys.executable, __file__, "--measure", str(workload)],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
        print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
