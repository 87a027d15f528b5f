"""The whole asset graph (``enginefit report``) under Dagster's multiprocess executor against
in-process, on the bundled sample and on a larger generated workload.

Run: ``.venv/bin/python -m perf.graph [--copies N] [--files F] [--repeats R] [--no-sample]``.
The generated workload is the bundled Mooncake conversation trace laid end to end ``N`` times
(copy k an hour later, its block ids shifted past every earlier copy's, so each copy is new
traffic with the same sharing), written as ``F`` trace files. Each run starts from an empty data
folder and a Dagster home of its own (a persistent SQLite instance for both executors); the
outputs of the two executors must be byte-identical before any time is printed. Wall time
depends on what else the machine runs; CPU time (this process and every step's) hardly does, and
shows what the executor itself costs. Numbers in the README were measured on the project machine
(2 cores, 24 GiB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import yaml

from assets.cli import DEFAULT_DAGSTER_YAML
from assets.definitions import run_full_graph
from assets.executors import EXECUTORS, Executor

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
HOUR_MS = 3_600_000


def generate(folder: Path, copies: int, files: int) -> int:
    """``copies`` back-to-back copies of the bundled trace in ``files`` Mooncake JSONL files."""
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    shift = 1 + max(max(r["hash_ids"], default=0) for r in records)
    span = HOUR_MS * (1 + max(r["timestamp"] for r in records) // HOUR_MS)
    folder.mkdir(parents=True)
    per_file = -(-copies // files)
    written = 0
    for f in range(files):
        with (folder / f"part-{f:03d}.jsonl").open("w") as handle:
            for k in range(f * per_file, min(copies, (f + 1) * per_file)):
                for r in records:
                    moved = {
                        **r,
                        "timestamp": r["timestamp"] + k * span,
                        "hash_ids": [h + k * shift for h in r["hash_ids"]],
                    }
                    handle.write(json.dumps(moved) + "\n")
                    written += 1
    return written


def configuration(root: Path, traces: Path | None) -> Path:
    """The bundled enginefit.yaml with absolute inputs and outputs under ``root``."""
    raw = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    raw["workload"]["traces"] = (
        [{"path": str(traces), "format": "mooncake"}]
        if traces is not None
        else [{**t, "path": str(REPO / t["path"])} for t in raw["workload"]["traces"]]
    )
    raw["bench"]["results"] = [str(REPO / p) for p in raw["bench"]["results"]]
    raw["bench"]["as_of"] = "2026-11-29"
    raw["paths"] = {"data_dir": str(root / "data"), "reports_dir": str(root / "reports")}
    path = root / "enginefit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _cpu_seconds() -> float:
    """CPU time of this process and of every process it has waited for (the step processes,
    through the fork server that run_full_graph stops and waits for after each run)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_run(
    root: Path, traces: Path | None, executor: Executor
) -> tuple[float, float, dict[str, str]]:
    root.mkdir(parents=True)
    config = configuration(root, traces)
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DEFAULT_DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    start, cpu = time.perf_counter(), _cpu_seconds()
    with dg.DagsterInstance.get() as instance:
        run = run_full_graph(config, instance, executor=executor)
    elapsed, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    if not run.success:
        raise SystemExit(f"{executor} run failed: {run.failures}")
    return elapsed, cpu, digests(root / "data")


def compare(name: str, key: str, traces: Path | None, tmp: Path, repeats: int) -> None:
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}
    outputs: dict[str, dict[str, str]] = {}
    for attempt in range(repeats):
        for executor in EXECUTORS:
            seconds, used, files = timed_run(tmp / f"{key}-{executor}-{attempt}", traces, executor)
            best[executor] = min(best.get(executor, float("inf")), seconds)
            cpu[executor] = min(cpu.get(executor, float("inf")), used)
            outputs[executor] = files
            print(f"  {name}: {executor:<12} {seconds:6.1f} s wall, {used:6.1f} s CPU", flush=True)
    if outputs["multiprocess"] != outputs["in_process"]:
        raise SystemExit(f"{name}: the executors wrote different outputs")
    speedup = best["in_process"] / best["multiprocess"]
    print(
        f"{name}: best of {repeats}: in_process {best['in_process']:.1f} s "
        f"({cpu['in_process']:.1f} s CPU), multiprocess {best['multiprocess']:.1f} s "
        f"({cpu['multiprocess']:.1f} s CPU) on {os.cpu_count()} CPUs: {speedup:.2f}x; "
        "outputs identical",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=24, help="copies of the sample (24: a day)")
    parser.add_argument("--files", type=int, default=4, help="trace files to spread them over")
    parser.add_argument("--repeats", type=int, default=1, help="runs per executor (best kept)")
    parser.add_argument("--no-sample", action="store_true", help="only the generated workload")
    args = parser.parse_args(argv if argv is not None else [])
    home = os.environ.get("DAGSTER_HOME")
    try:
        with tempfile.TemporaryDirectory(prefix="enginefit-perf-graph-") as tmp_name:
            tmp = Path(tmp_name)
            if not args.no_sample:
                compare("bundled sample (12,031 requests)", "sample", None, tmp, args.repeats)
            if args.copies:
                start = time.perf_counter()
                n = generate(tmp / "traces", args.copies, args.files)
                print(
                    f"generated: {n:,} requests in {args.files} files "
                    f"({time.perf_counter() - start:.1f} s)",
                    flush=True,
                )
                compare(
                    f"generated ({n:,} requests)", "generated", tmp / "traces", tmp, args.repeats
                )
    finally:
        if home is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = home


if __name__ == "__main__":
    main(sys.argv[1:])
