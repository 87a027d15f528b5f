"""Benchmark: the scenarios' streamed pass (or the sampled curves' gathering) over a quarter of
days, kept and resumed when a day is appended (:mod:`pipeline.sim.resume`), against replaying
every day again.

A ``perf.workload`` trace (short profile, block size 16, answers in the chain, sessions
logged) spread over ``--days`` + 1 days is written as canonical Parquet parts, each within
one day (a day's requests split where the generator's chunks end). Each measurement runs the
default grid (8 scenarios, one pass, slices of ``pipeline.sim.stage.STREAM_ROWS``) in a child
process of its own under ``perf.e2e``'s guard (summed PSS every 50 ms):

* ``cold``: the first ``--days`` days, no pass kept (it is kept at the end);
* ``append``: the day after them appended, the kept pass resumed;
* ``whole``: every day replayed from the start (no pass kept).

With ``--pass curves`` each mode reads the days for the default configuration's capacity
curves instead, sampled (SHARDS) at the rate the stage derives for the whole table
(:func:`pipeline.sim.curve_stream.sample_rate`), or ``--budget`` blocks' worth. With ``--pass
prefix`` each mode runs the prefix stage's analysis of the days (:mod:`pipeline.prefix.days`:
its day summaries and passes kept), and ``append`` and ``whole`` are compared by the summary's
JSON and the bytes of the sessions file as the stage writes it.

Printed per mode: peak memory, wall and CPU seconds, the size of the kept pass, and whether
``append`` and ``whole`` wrote the same summaries (curves). Run:
``.venv/bin/python -m perf.sim_resume [--requests 10M] [--days 91] [--keep DIR]
[--modes cold,append,whole] [--pass scenarios|curves|prefix] [--budget BLOCKS]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.e2e import GIB, Limits, child_result
from perf.workload import DAY_S, conversations, iter_frames, spec

MODES = ("cold", "append", "whole")
PREFIX = "prefix"


def generate(folder: Path, requests: int, days: int) -> None:
    """``requests`` over ``days`` days as parts in arrival order, each of one day, and
    ``days.json`` listing each part's day."""
    import polars as pl

    drawn = conversations(spec(requests, "short", seed=7, rate_rps=requests / (days * DAY_S)))
    parts = folder / "requests"
    parts.mkdir(parents=True, exist_ok=True)
    day_of_part: list[str] = []
    for frame in iter_frames(drawn, 16, sessions=True):
        dated = frame.with_columns(pl.col("arrival").dt.date().alias("_day"))
        for (day,), rows in dated.group_by("_day", maintain_order=True):
            rows.drop("_day").write_parquet(parts / f"part-{len(day_of_part):05d}.parquet")
            day_of_part.append(str(day))
    (folder / "days.json").write_text(json.dumps(day_of_part))


def child(mode: str, folder: Path, days: int, which: str, budget: int | None) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from pipeline.config import default_config
    from pipeline.ingest.days import UnitedDay
    from pipeline.resume import STATE, DayPasses
    from pipeline.sim.compute import curve_combinations, curve_points
    from pipeline.sim.curve_stream import sample_rate, stored_blocks
    from pipeline.sim.resume import CURVES, SCENARIOS, DailyStream
    from pipeline.sim.stage import STREAM_ROWS
    from pipeline.sim.stream import RequestStream, part_chunks

    config = default_config()
    settings = config.simulation
    if budget is not None:
        settings = settings.replace(curve_exact_max_blocks=budget)
    latency = settings.latency(config.shape.latency)
    day_of_part = json.loads((folder / "days.json").read_text())
    order = list(dict.fromkeys(day_of_part))
    used = order[:days] if mode == "cold" else order[: days + 1]
    united = tuple(UnitedDay(d, f"generated-{d}", day_of_part.count(d)) for d in used)
    files = sorted((folder / "requests").glob("part-*.parquet"))[: sum(d.parts for d in united)]
    kept = folder / ("resume-whole" if mode == "whole" else "resume")
    if mode == "whole":
        shutil.rmtree(kept, ignore_errors=True)
    t0 = time.perf_counter()
    if which == PREFIX:
        return _prefix(mode, DayPasses(united, tuple(files), kept), folder, t0)
    rows = None if which == CURVES else STREAM_ROWS
    daily = DailyStream(
        united, tuple(files), kept, stream=RequestStream(part_chunks(files), latency, rows)
    )
    if which == CURVES:
        rate = sample_rate(settings, stored_blocks(files))
        curves = daily.gathered_curves(settings, curve_combinations(settings), rate)
        return {
            "mode": mode,
            "seconds": round(time.perf_counter() - t0, 2),
            "said": daily.said[-1],
            "kept_mib": round((kept / CURVES / STATE).stat().st_size / 2**20, 1),
            "requests": sum(pq.ParquetFile(f).metadata.num_rows for f in files),
            "rate": rate,
            "summaries": [
                curve_points(curves),
                [(c.block_size, c.replicas, c.routing, c.hit_ratio_error) for c in curves],
            ],
        }
    runs = daily.simulate_many(settings.scenarios(), settings)
    return {
        "mode": mode,
        "seconds": round(time.perf_counter() - t0, 2),
        "said": daily.said[-1],
        "kept_mib": round((kept / SCENARIOS / STATE).stat().st_size / 2**20, 1),
        "requests": runs[0].summary["requests"],
        "summaries": {run.summary["scenario"]: run.summary for run in runs},
    }


def _prefix(mode: str, daily: Any, folder: Path, t0: float) -> dict[str, Any]:
    """The prefix analysis of ``daily``'s days, as :func:`child` reports it."""
    import hashlib

    from pipeline.config import default_config
    from pipeline.prefix.days import analyse_days
    from pipeline.store import copy_parquet_atomic, write_parquet_atomic

    sessions = folder / f"sessions-{mode}.parquet"
    result = analyse_days(daily, default_config().prefix)
    seconds = time.perf_counter() - t0
    if result.sessions_files:
        copy_parquet_atomic(result.sessions_files, sessions)
    else:
        write_parquet_atomic(result.sessions.collect(), sessions)
    kept = sum(f.stat().st_size for f in daily.folder.rglob("*") if f.is_file())
    return {
        "mode": mode,
        "seconds": round(seconds, 2),
        "said": "\n  ".join(daily.said),
        "kept_mib": round(kept / 2**20, 1),
        "requests": result.summary.requests,
        "summaries": [
            json.dumps(result.to_json(), sort_keys=True),
            hashlib.sha256(sessions.read_bytes()).hexdigest(),
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=91, help="days before the appended one")
    parser.add_argument("--memory-limit", type=float, default=8.0, help="GiB (the guard)")
    parser.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) DIR")
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    parser.add_argument(
        "--pass", dest="which", choices=("scenarios", "curves", PREFIX), default="scenarios"
    )
    parser.add_argument("--budget", type=int, default=None, help="curve_exact_max_blocks")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.days, args.which, args.budget)))
        return
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:  # before any trace is generated
        parser.error(f"--modes: {', '.join(unknown)} not one of {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="sim_resume_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "days.json").is_file():
            t = time.perf_counter()
            generate(folder, args.requests, args.days + 1)
            print(f"generated {args.requests:,} requests ({time.perf_counter() - t:.1f} s)")
        shutil.rmtree(folder / "resume", ignore_errors=True)
        limits = Limits(int(args.memory_limit * GIB))
        results = {}
        for mode in modes:
            command = [sys.executable, "-m", "perf.sim_resume", "--child", mode]
            command += ["--folder", str(folder), "--days", str(args.days), "--pass", args.which]
            command += [] if args.budget is None else ["--budget", str(args.budget)]
            ran = child_result(mode, command, Path(tmp) / f"{mode}.log", limits)
            if ran is None:
                continue
            watched, r = ran
            results[mode] = r
            print(
                f"{mode}: {r['requests']:,} requests, peak memory (PSS) "
                f"{watched.peak / 2**20:,.0f} MiB, wall {watched.wall_s:.1f} s, CPU "
                f"{watched.cpu_s:.1f} s (the pass {r['seconds']} s), kept {r['kept_mib']} MiB\n"
                f"  {r['said']}" + (f" (sample rate {r['rate']})" if "rate" in r else ""),
                flush=True,
            )
        if "append" in results and "whole" in results:
            same = results["append"]["summaries"] == results["whole"]["summaries"]
            print(f"append and whole wrote the same {args.which}: {same}")


if __name__ == "__main__":
    main()
