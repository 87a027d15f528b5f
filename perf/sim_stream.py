"""Scenario replay: the whole table flattened at once against the streamed replay, chunk by chunk.

Run: ``.venv/bin/python -m perf.sim_stream [--requests N] [--parts P] [--sessions]``.

A ``perf.workload`` trace (short profile, block size 16, answers in the chain; ``--sessions``
logs the conversation as session id, else affinity infers the sessions over the whole table)
is written as ``P`` canonical Parquet parts in arrival order, as ingest leaves a multi-day
table. Each mode then runs every scenario of the default grid (``simulation`` defaults:
durations lifetime with the instant figures beside; ``--lifetime instant`` for the instant
lifetime alone) in a child process of its own:

* ``flat``: today's one-pass path, ``sim_input`` of the whole table then ``simulate`` +
  ``summarise`` per scenario (the table flattened once, shared by the scenarios);
* ``stream``: ``pipeline.sim.stream`` over the parts, a part at a time (``--max-rows`` cuts
  parts into slices), one pass per scenario (as the Dagster steps run them);
* ``stream-all``: one pass over the parts for every scenario (``enginefit simulate``).

Printed per mode: seconds (flatten and each scenario), peak RSS of the child (ru_maxrss), and
whether every summary equals the other mode's, field for field.

Measured 2026-12-02 on the project machine, 2 cores / 24 GiB, under a load average of 23-26
(other jobs: wall times are 3-5x a quiet machine's; compare the modes, not the seconds), default
grid (8 scenarios: block 16, 1 and 4 replicas, 1M and 4M cache tokens, round-robin, affinity,
cache-aware), parts of 100k requests. Every run: summaries identical across modes.

| trace | lifetime | flat (today) | stream-all |
|---|---|---|---|
| 300k, sessions logged | instant | 595 MiB, 68 s | 912 MiB, 129 s |
| 1M, sessions logged | instant | 1,415 MiB, 53 s (load had dropped) | 1,165 MiB, 256 s |
| 300k, no session ids | instant | 616 MiB, 79 s | 944 MiB, 136 s |
| 1M, no session ids | instant | 1,415 MiB, 259 s | 1,336 MiB, 421 s |
| 1M, sessions logged | durations (+ instant) | 1,533 MiB, 255 s | 4,969 MiB, 1,538 s |

Instant lifetime: the streamed block state is the caches' (peak live blocks = replicas ×
capacity, the same at 300k and 1M; peak rows = that plus one part's new blocks), so the stream
grows by one part's flattening and its fixed 8-scenario state, while the flat path grows with the
table (+820 MiB from 300k to 1M, against +253 MiB streamed); without session ids the affinity scenarios infer sessions over
the whole table first, which grows with it. Durations: this generated trace sends 100 requests a
second to one replica of 64 slots, more than it serves, so requests in flight (and the blocks
they pin) grow with the trace: 10.6M live blocks at 1M requests on one replica, 4.6M on four.
Pinned blocks are carried (and renumbered each part) per scenario and lifetime, side by side
for the 8 scenarios, which costs more than the one flattened table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.e2e import GIB, Limits, run_watched
from perf.workload import conversations, iter_frames, spec


def generate(requests: int, parts: int, folder: Path, sessions: bool) -> list[Path]:
    c = conversations(spec(requests, "short"))
    files = []
    rows = -(-requests // parts)
    for i, frame in enumerate(iter_frames(c, 16, sessions=sessions, chunk=rows)):
        path = folder / f"part-{i:05d}.parquet"
        frame.write_parquet(path)
        files.append(path)
    return files


def child(mode: str, folder: Path, max_rows: int | None, lifetime: str | None) -> dict[str, Any]:
    from pipeline.config import default_config
    from pipeline.sim.blocks import sim_input
    from pipeline.sim.replay import simulate, summarise
    from pipeline.sim.stream import RequestStream
    from pipeline.store import scan_requests

    config = default_config()
    settings = config.simulation
    if lifetime is not None:
        settings = settings.replace(request_lifetime=lifetime)
    latency = settings.latency(config.shape.latency)
    files = sorted(folder.glob("part-*.parquet"))
    out: dict[str, Any] = {"mode": mode, "seconds": {}, "summaries": {}}
    t0 = time.perf_counter()
    if mode == "flat":
        inp = sim_input(scan_requests(folder), latency_model=latency)
        out["seconds"]["flatten"] = time.perf_counter() - t0
    else:
        stream = RequestStream(lambda: (scan_requests(f) for f in files), latency, max_rows)
    if mode == "stream-all":
        runs = stream.simulate_many(settings.scenarios(), settings)
        out["summaries"] = {run.summary["scenario"]: run.summary for run in runs}
        out["peak_live_blocks"] = {r.summary["scenario"]: r.peak_live_blocks for r in runs}
        out["peak_state_rows"] = {r.summary["scenario"]: r.peak_state_rows for r in runs}
    for scenario in settings.scenarios() if mode != "stream-all" else []:
        t = time.perf_counter()
        if mode == "flat":
            summary = summarise(inp, simulate(inp, scenario, settings))
        else:
            run = stream.simulate(scenario, settings)
            summary = run.summary
            out.setdefault("peak_live_blocks", {})[scenario.key] = run.peak_live_blocks
            out.setdefault("peak_state_rows", {})[scenario.key] = run.peak_state_rows
        out["seconds"][scenario.key] = round(time.perf_counter() - t, 2)
        out["summaries"][scenario.key] = summary
    out["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--sessions", action="store_true")
    parser.add_argument("--modes", default="flat,stream,stream-all")
    parser.add_argument("--lifetime", choices=("durations", "instant"), default=None)
    parser.add_argument("--memory-limit", type=float, default=5.0, help="GiB (the guard)")
    parser.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) DIR")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.max_rows, args.lifetime)))
        return
    with tempfile.TemporaryDirectory(prefix="sim_stream_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if not list(folder.glob("part-*.parquet")):
            t = time.perf_counter()
            files = generate(args.requests, args.parts, folder, args.sessions)
            print(
                f"generated {args.requests:,} requests in {len(files)} parts "
                f"({time.perf_counter() - t:.1f} s)",
                flush=True,
            )
        limits = Limits(int(args.memory_limit * GIB))
        results = {}
        for mode in args.modes.split(","):
            command = [sys.executable, "-m", "perf.sim_stream", "--child", mode]
            command += ["--folder", str(folder)]
            if args.max_rows:
                command += ["--max-rows", str(args.max_rows)]
            if args.lifetime:
                command += ["--lifetime", args.lifetime]
            log = Path(tmp) / f"{mode}.log"
            watched = run_watched(command, log, dict(os.environ), Path.cwd(), limits)
            if watched.stopped or watched.code != 0:
                print(f"{mode}: {watched.stopped or f'failed ({watched.code})'}", flush=True)
                print(log.read_text()[-2000:])
                continue
            results[mode] = r = json.loads(log.read_text().strip().splitlines()[-1])
            print(
                f"{mode}: peak memory (PSS) {watched.peak / 2**20:,.0f} MiB, wall "
                f"{watched.wall_s:.1f} s, CPU {watched.cpu_s:.1f} s, seconds {r['seconds']}",
                flush=True,
            )
            if "peak_live_blocks" in r:
                print(f"  peak live blocks {r['peak_live_blocks']}")
                print(f"  peak state rows {r['peak_state_rows']}")
        texts = {json.dumps(r["summaries"], sort_keys=True) for r in results.values()}
        print(f"summaries identical across modes: {len(texts) == 1}")


if __name__ == "__main__":
    main()
