"""Benchmark: the shape stage of a quarter from per-day parts (:mod:`pipeline.shape.daily`)
against the same quarter read in chunks, and what a day ingested again costs.

The trace is ``perf.shape``'s model (conversations with sessions, ten tenants, three models, a
daily cycle) at the rate that spreads ``--requests`` over ``--days`` days, as canonical Parquet
parts. Each measurement runs in a fresh subprocess (its peak RSS is its own):

* ``chunked``: the table above the exact limit, no days: ``pipeline.shape.chunked``;
* ``days, cold``: every day's parts computed and kept;
* ``days, warm``: every part read back;
* ``one day again``: the middle day under a new digest (as after ingesting it again).

With ``--models N`` the same four measure the ``concurrency_by_engine`` step instead: the
concurrency under N latency models (TPOT 5, 10, … ms), swept in chunks, or merged from the
days' sweeps (:class:`pipeline.shape.stage.ModelSweeps`: kept per model).

The exact limit is forced to 0 so every size takes the large-table paths. Run:
``.venv/bin/python -m perf.shape_daily [--requests 10M] [--days 91] [--keep DIR]
[--models N]``.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.peak import peak_rss_bytes
from perf.workload import DAY_S, conversations, count, iter_frames, spec


def generate(out_dir: Path, requests: int, days: int) -> None:
    drawn = conversations(
        spec(
            requests,
            "long",
            seed=7,
            tenants=10,
            models=3,
            diurnal=0.5,
            rate_rps=requests / (days * DAY_S),
        )
    )
    parts = out_dir / "requests"
    parts.mkdir(parents=True, exist_ok=True)
    for part, frame in enumerate(iter_frames(drawn, None, sessions=True)):
        frame.write_parquet(parts / f"part-{part:05d}.parquet", compression="zstd")


def measure(workload: Path, mode: str, parts: Path, models: int) -> dict[str, Any]:
    import dataclasses

    import polars as pl

    from pipeline.config import default_config
    from pipeline.shape.compute import compute_shape
    from pipeline.shape.concurrency import peak_concurrency
    from pipeline.shape.daily import DailyParts, DaySource, PartStore
    from pipeline.shape.stage import ModelSweeps, day_of
    from pipeline.store import scan_requests

    cfg = default_config().shape
    lf = scan_requests(workload / "requests")
    start = time.perf_counter()
    store = PartStore(parts)
    sources = []
    if mode != "chunked":
        days = lf.select(pl.col("arrival").dt.date().unique().sort()).collect().to_series()
        names = [d.isoformat() for d in days]
        middle = names[len(names) // 2]
        digest = {d: ("v2" if mode == "one day again" and d == middle else "v1") for d in names}
        sources = [DaySource(d, day_of(lf, d), digest[d]) for d in names]
    if models:
        latencies = [dataclasses.replace(cfg.latency, tpot_ms=5.0 * (k + 1)) for k in range(models)]
        if mode == "chunked":
            peaks = [peak_concurrency(lf, m, 10, exact_max_requests=0).peak for m in latencies]
        else:
            sweeps = ModelSweeps(lf, 10, sources, parts / "engines")
            peaks = [sweeps(m).peak for m in latencies]
            store.computed, store.read = _summed(sweeps.stores.values())
        return {
            "mode": f"{models} models, {mode}",
            "seconds": round(time.perf_counter() - start, 2),
            "cpu_s": round(resource.getrusage(resource.RUSAGE_SELF).ru_utime, 1),
            "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1),
            "computed": store.computed,
            "read": store.read,
            "peaks": peaks,
        }
    if mode == "chunked":
        result = compute_shape(lf, cfg, exact_max_requests=0)
    else:
        result = compute_shape(lf, cfg, exact_max_requests=0, days=DailyParts(sources, store))
    seconds = time.perf_counter() - start
    shape = result.to_json()
    return {
        "mode": mode,
        "seconds": round(seconds, 2),
        "cpu_s": round(resource.getrusage(resource.RUSAGE_SELF).ru_utime, 1),
        "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1),
        "computed": store.computed,
        "read": store.read,
        "requests": shape["requests"],
        "peak_concurrency": shape["concurrency"]["peak"],
        "prompt_p99": shape["lengths"]["prompt_tokens"]["p99"],
    }


def _summed(stores: Any) -> tuple[dict[str, int], dict[str, int]]:
    """The parts computed and read back over ``stores``, by kind."""
    computed: dict[str, int] = {}
    read: dict[str, int] = {}
    for store in stores:
        for total, counts in ((computed, store.computed), (read, store.read)):
            for kind, n in counts.items():
                total[kind] = total.get(kind, 0) + n
    return computed, read


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=count, default=10_000_000)
    parser.add_argument("--days", type=int, default=91)
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep the trace here")
    parser.add_argument("--models", type=int, default=0, help="concurrency_by_engine's step")
    parser.add_argument("--measure", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    if args.models < 0:  # before any trace is generated
        parser.error(f"--models: a count of latency models, 0 or more (got {args.models})")
    if args.measure is not None:
        workload, mode, parts = args.measure
        print(json.dumps(measure(Path(workload), mode, Path(parts), args.models)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        workload = args.keep or Path(tmp) / "trace"
        if not (workload / "requests").is_dir():
            start = time.perf_counter()
            generate(workload, args.requests, args.days)
            print(f"generated {args.requests:,} requests in {time.perf_counter() - start:.0f} s")
        parts = Path(tmp) / "parts"
        for mode in ("chunked", "days, cold", "days, warm", "one day again"):
            command = [sys.executable, __file__, "--measure", str(workload), mode, str(parts)]
            out = subprocess.run(
                [*command, "--models", str(args.models)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            print(json.dumps(json.loads(out.splitlines()[-1]), sort_keys=True))


if __name__ == "__main__":
    main()
