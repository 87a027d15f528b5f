"""Scenario replay: the whole table flattened at once against the streamed replay, chunk by chunk.

Run: ``.venv/bin/python -m perf.sim_stream [--requests N] [--parts P] [--sessions] [--rate R]
[--max-rows N] [--lifetime L] [--keep DIR] [--memory-limit GiB]``.

A ``perf.workload`` trace (short profile, block size 16, answers in the chain, ``--rate``
requests a second, default 100; ``--sessions`` logs the conversation as session id, else
affinity infers the sessions over the whole table) is written as ``P`` canonical Parquet parts
in arrival order (into ``--keep DIR`` to be reused). Each mode then runs every scenario of the
default grid (``simulation`` defaults: durations lifetime with the instant figures beside;
``--lifetime instant`` for the instant lifetime alone) in a child process of its own, under
``perf.e2e``'s guard (summed PSS sampled every 50 ms, the child killed past
``--memory-limit``):

* ``flat``: today's one-pass path, ``sim_input`` of the whole table then ``simulate`` +
  ``summarise`` per scenario (the table flattened once, shared by the scenarios);
* ``stream``: ``pipeline.sim.stream`` over the parts, a part at a time (``--max-rows`` cuts
  parts into slices), one pass per scenario (as the Dagster steps would run them);
* ``stream-all``: one pass over the parts for every scenario (as ``enginefit simulate`` would).

Printed per mode: peak memory (summed PSS), wall and CPU seconds, seconds per scenario, and
whether every summary equals the other modes', field for field.

Measured 2026-12-02 on the project machine (2 cores / 24 GiB, load average 1-4 from other
jobs), default grid (8 scenarios: block 16, 1 and 4 replicas, 1M and 4M cache tokens,
round-robin, affinity, cache-aware), 1M requests, sessions logged, 10 parts of 100k, streamed
in slices of 25k (``pipeline.sim.stage.STREAM_ROWS``). Every run: summaries identical.

| trace | lifetime | flat | stream-all | stream (a pass a scenario) |
|---|---|---|---|---|
| 100 req/s | durations | 1,772 MiB, 29 s CPU | 4,313 MiB, 45 s | 1,698 MiB, 84 s (parts) |
| 100 req/s | instant | 1,428 MiB, 16 s | 1,148 MiB, 20 s | 1,273 MiB, 54 s (parts) |
| 10 req/s | durations | 1,992 MiB, 22 s | 1,406 MiB, 29 s | 912 MiB, 57 s |
| 10 req/s | instant | 1,424 MiB, 12 s | 1,004 MiB, 16 s | 679 MiB, 41 s |

Whole 100k parts instead of slices: stream-all 4,820 MiB, 37 s (durations) and 1,526 MiB,
20 s (instant) at 100 req/s. The replay streamed before the slot tables (every cached block
renumbered each chunk), 300k requests at 100 req/s, durations: 2,171 MiB, 26.5 s CPU in
slices of 25k against 1,904 MiB, 13.8 s now (flat: 817 MiB, 8.5 s).

At 10 requests a second the streamed block state is the caches' (peak live blocks = replicas ×
capacity; peak rows = that plus one slice's blocks, half as much again to spare) and a pass over
every scenario costs 1.3-1.4 times the CPU of the flattened table for 30% less memory. At 100
requests a second one replica of 64 slots is sent more than it serves: the requests in flight
and the blocks they pin grow with the trace (10.6M pinned blocks at 1M requests on one replica,
4.6M on four, 780k and 260k requests running), and every scenario's pinned blocks and running
chains are held side by side. A pass a scenario holds one scenario's, but reads and flattens
the table again each time, where the flat path flattens it once for all.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.e2e import GIB, Limits, child_result
from perf.peak import peak_rss_bytes
from perf.workload import conversations, iter_frames, spec


def generate(
    requests: int, parts: int, folder: Path, sessions: bool, rate: float | None = None
) -> list[Path]:
    c = conversations(spec(requests, "short", **({"rate_rps": rate} if rate else {})))
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
    out["peak_rss_mib"] = round(peak_rss_bytes() / 2**20)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--sessions", action="store_true")
    parser.add_argument("--rate", type=float, default=None, help="requests a second")
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
            files = generate(args.requests, args.parts, folder, args.sessions, args.rate)
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
            ran = child_result(mode, command, Path(tmp) / f"{mode}.log", limits)
            if ran is None:
                continue
            watched, r = ran
            results[mode] = r
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
