"""Benchmark: workload-shape metrics on a generated canonical trace (default 1M and 10M requests),
beside a plain-Python script computing the same figures.

The trace is ``perf.workload``'s model (long profile, seed 7) written as canonical Parquet
parts of 1M rows: multi-turn conversations (session ids and turns logged) at 100 requests/s on
a daily cycle (amplitude 0.5; 10M requests span about 28 hours), ten tenants, three models, no
logged durations (so concurrency uses the latency model), no prefix chains.

The measurement runs in a fresh subprocess so its peak RSS (``resource.getrusage``) covers
only the shape computation on a lazy scan of the Parquet files, not the generation. Up to
``--baseline-max`` requests (default 1M) the same requests are also exported as CSV and
``perf/shape_baseline.py`` (``csv``, loops, dicts, ``statistics``) reads it and computes its
figures in another subprocess; every figure must agree with the stage's (relative 1e-9) before
the two times are printed side by side.

Traces above the stage's exact limit (``pipeline.shape.config.EXACT_MAX_REQUESTS``, or
``--exact-max N`` to force it lower) take the chunked, sketched path: only the whole stage is
timed there, and the baseline is skipped (sketched percentiles are not the baseline's).

Run: ``.venv/bin/python -m perf.shape [--requests 1M,10M] [--keep DIR] [--baseline-max N]
[--exact-max N]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.peak import peak_rss_bytes
from perf.shape_baseline import disagreements, stage_figures
from perf.workload import conversations, count, counts, iter_frames, spec, write_csv

BASELINE_MAX = 1_000_000  # the plain-Python baseline holds every row as a dict


def generate(out_dir: Path, requests: int, seed: int = 7, *, csv: bool = False) -> list[Path]:
    """Write ``requests`` canonical rows as ``out_dir/requests/part-*.parquet`` (and with
    ``csv`` the same requests as ``out_dir/requests.csv`` for the baseline)."""
    drawn = conversations(spec(requests, "long", seed=seed, tenants=10, models=3, diurnal=0.5))
    parts = out_dir / "requests"
    parts.mkdir(parents=True, exist_ok=True)
    written = []
    for part, frame in enumerate(iter_frames(drawn, None, sessions=True)):
        path = parts / f"part-{part:05d}.parquet"
        frame.write_parquet(path, compression="zstd")
        written.append(path)
    if csv:
        write_csv(drawn, out_dir / "requests.csv")
    return written


def measure(workload: Path, exact_max: int | None = None) -> dict[str, object]:
    """Time each shape step on a lazy scan; report peak RSS of this process. With
    ``exact_max`` (the stage's ``exact_max_requests``) below the trace's size only the whole
    stage is measured, on its chunked path (the single steps would read whole columns)."""
    import polars as pl

    from pipeline.config import default_config
    from pipeline.layout import WorkloadLayout
    from pipeline.shape.arrivals import arrival_metrics
    from pipeline.shape.compute import compute_shape
    from pipeline.shape.concurrency import peak_concurrency
    from pipeline.shape.config import EXACT_MAX_REQUESTS, MIN_QUANTA_PER_WINDOW, PLOT_POINTS
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
        rss[name] = round(peak_rss_bytes() / 2**20, 1)
        return value

    limit = EXACT_MAX_REQUESTS if exact_max is None else exact_max
    rows = lf.select(pl.len()).collect().item()
    if rows <= limit:
        step("arrivals", lambda: arrival_metrics(lf, MIN_QUANTA_PER_WINDOW))
        step("lengths", lambda: length_metrics(lf))
        step("concurrency", lambda: peak_concurrency(lf, cfg.latency, PLOT_POINTS))
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
    result = step("full stage (compute)", lambda: compute_shape(lf, cfg, exact_max_requests=limit))
    with tempfile.TemporaryDirectory() as tmp:
        step("full stage (write)", lambda: write(result, WorkloadLayout(Path(tmp))))  # type: ignore[arg-type]
    shape = result.to_json()  # type: ignore[attr-defined]
    return {
        "figures": stage_figures(shape),
        "latency": [
            cfg.latency.ttft_base_ms,
            cfg.latency.ttft_per_prompt_token_ms,
            cfg.latency.tpot_ms,
        ],
        "requests": shape["requests"],
        "sketched": rows > limit,
        "peak_concurrency": shape["concurrency"]["peak"],
        "peak_rate_1s": shape["arrivals"]["windows"]["1s"].get("peak_rate_rps"),
        "seconds": timings,
        "peak_rss_mib_after_step": rss,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=counts,
        default=[1_000_000, 10_000_000],
        help="trace sizes, comma-separated (default 1M,10M)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep the traces here")
    parser.add_argument(
        "--baseline-max",
        type=int,
        default=BASELINE_MAX,
        help="largest trace the plain-Python baseline also runs on",
    )
    parser.add_argument(
        "--exact-max",
        type=count,
        default=None,
        help="the stage's exact_max_requests (default its own); below a trace's size the "
        "chunked, sketched path is measured and the baseline skipped",
    )
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.exact_max)))
        return
    for requests in args.requests:
        with tempfile.TemporaryDirectory() as tmp:
            workload = (args.keep / f"shape-{requests}") if args.keep else Path(tmp)
            sketched = args.exact_max is not None and requests > args.exact_max
            compare(
                requests, workload, requests <= args.baseline_max and not sketched, args.exact_max
            )


def compare(requests: int, workload: Path, baseline: bool, exact_max: int | None = None) -> None:
    """The stage on a generated trace of ``requests``; with ``baseline``, the plain-Python
    script beside it on the same requests (its figures must equal the stage's)."""
    if not (workload / "requests").is_dir() or (
        baseline and not (workload / "requests.csv").is_file()
    ):
        start = time.perf_counter()
        generate(workload, requests, csv=baseline)
        print(f"generated {requests:,} requests in {time.perf_counter() - start:.1f} s")
    size = sum(p.stat().st_size for p in (workload / "requests").glob("*.parquet"))
    print(f"trace: {requests:,} requests, {size / 2**20:,.0f} MiB of Parquet")
    limit = [] if exact_max is None else ["--exact-max", str(exact_max)]
    result = _child([sys.executable, __file__, "--measure", str(workload), *limit])
    figures = result.pop("figures")
    latency = result.pop("latency")
    print(json.dumps(result, indent=2, sort_keys=True))
    if not baseline:
        print("plain-Python baseline skipped (trace above --baseline-max, or sketched)")
        return
    script = Path(__file__).with_name("shape_baseline.py")
    latency_arg = ",".join(repr(v) for v in latency)
    plain = _child(
        [sys.executable, str(script), str(workload / "requests.csv"), "--latency", latency_arg]
    )
    bad = disagreements(plain["figures"], figures)
    assert not bad, "baseline and stage disagree:\n" + "\n".join(bad)
    stage_s = result["seconds"]["full stage (compute)"]
    plain_s = plain["read_s"] + plain["compute_s"]
    print(
        f"plain-Python baseline ({len(figures)} figures, all equal to the stage's): read CSV "
        f"{plain['read_s']:.2f} s + compute {plain['compute_s']:.2f} s = {plain_s:.2f} s; "
        f"the stage {stage_s:.2f} s (every metric, a lazy scan of the Parquet parts): "
        f"baseline / stage {plain_s / stage_s:.1f}x (compute alone "
        f"{plain['compute_s'] / stage_s:.1f}x)"
    )


def _child(command: list[str]) -> dict[str, Any]:
    """Run a measuring child process and return the JSON of its last line."""
    child = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
