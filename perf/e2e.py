"""End to end: a generated hash-form trace → ``enginefit report`` → the PDF, as a user runs it.

For each size (default 1M and 10M requests) the one generated workload (``perf/workload.py``,
Mooncake JSONL, 512-token block ids) is written, then ``enginefit report`` runs as a child
process on a configuration that is the bundled ``enginefit.yaml`` with that trace as its
workload (outputs, reports and the Dagster home in a temporary folder), with each executor
asked for (default: in process, ``make report``'s). While it runs, the resident memory of the
command and every process it started (the multiprocess executor's step processes, the PDF
renderer) is sampled every 50 ms from ``/proc`` and summed (proportional set sizes, so a page a
forked process shares with its parent counts once): what the machine holds at that moment. Afterwards each Dagster step's start and end come from the run's event log, so every
stage gets its time (the sum of its steps' wall times; with steps side by side that is more than
the wall time they took) and its peak memory (the highest sample while one of its steps ran).
Generation is not counted.

Run: ``python -m perf.e2e [--requests 1M,10M] [--executors in_process,multiprocess] [--keep
DIR]``. Numbers in the README were
measured on the project machine (2 cores, 24 GiB).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from assets.executors import EXECUTORS
from perf import workload

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 0.05
GIB = 2**30

# A stage is the asset its steps materialise (the checks of all stages are one line).
_STAGE_OF_STEP = (
    ("workload.", "ingest (workload)"),
    ("simulation_scenarios.", "simulation scenarios"),
    ("simulation_curves", "simulation curves"),
    ("simulation_plots", "simulation figures"),
    ("prefix_sharing", "prefix sharing"),
    ("workload_shape", "workload shape"),
    ("concurrency_by_engine", "concurrency by engine"),
    ("bench_", "bench"),
    ("workload_capacity", "capacity"),
    ("engine_decision", "decision"),
    ("revisit_triggers", "revisit triggers"),
    ("engine_selection_report", "report (HTML + PDF)"),
    ("enginefit_inputs", "observing the inputs"),
)
CHECKS = "asset checks"


def stage_of(step_key: str, check_steps: set[str]) -> str:
    if step_key in check_steps:
        return CHECKS
    return next(
        (stage for prefix, stage in _STAGE_OF_STEP if step_key.startswith(prefix)), step_key
    )


def configuration(root: Path, trace: Path) -> Path:
    """The bundled enginefit.yaml with ``trace`` as its workload and outputs under ``root``."""
    raw = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "mooncake"}]
    raw["workload"]["name"] = "generated"
    raw["bench"]["results"] = [str(REPO / p) for p in raw["bench"]["results"]]
    raw["paths"] = {"data_dir": str(root / "data"), "reports_dir": str(root / "reports")}
    path = root / "enginefit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _proc_kib(path: str, field: str) -> int | None:
    """The ``field:`` line's kB figure of a /proc file, None when it cannot be read."""
    try:
        with Path(path).open() as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid``: its resident pages, each shared page divided among
    the processes sharing it (a forked step process shares its parent's until either writes
    them), so the sum over processes is what the machine holds; RSS where it is not known."""
    kib = _proc_kib(f"/proc/{pid}/smaps_rollup", "Pss")
    if kib is None:
        kib = _proc_kib(f"/proc/{pid}/status", "VmRSS")
    return (kib or 0) * 1024


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def tree_memory_bytes(pid: int) -> int:
    """Memory of ``pid`` and all its descendants (the step processes of the multiprocess
    executor, the PDF renderer), summed: what the machine holds at that moment."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += _pss_bytes(current)
        stack.extend(_children(current))
    return total


@contextmanager
def sampled(pid: int) -> Iterator[list[tuple[float, int]]]:
    """(wall time, RSS bytes) of process ``pid`` every SAMPLE_EVERY_S while the body runs."""
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.time(), tree_memory_bytes(pid)))
            done.wait(SAMPLE_EVERY_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def step_windows(home: Path) -> tuple[list[tuple[str, float, float]], set[str]]:
    """(step key, start, end) of every step of the one run in the Dagster home ``home``, and
    the keys of the check steps."""
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs()
        starts: dict[str, float] = {}
        windows = []
        checks = set()
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None or entry.step_key is None:
                continue
            if event.event_type == dg.DagsterEventType.STEP_START:
                starts[entry.step_key] = entry.timestamp
            elif event.event_type == dg.DagsterEventType.STEP_SUCCESS:
                windows.append((entry.step_key, starts[entry.step_key], entry.timestamp))
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                checks.add(entry.step_key)
    return windows, checks


def generate(requests: int, trace: Path) -> None:
    start = time.perf_counter()
    written = workload.write_mooncake(workload.conversations(workload.spec(requests)), trace)
    print(
        f"{requests:,} requests: generated {written.blocks:,} block ids "
        f"({written.bytes / 2**20:,.0f} MiB of JSONL, mean prompt {written.mean_prompt:,.0f} "
        f"tokens) in {time.perf_counter() - start:.1f} s",
        flush=True,
    )


def measure(requests: int, trace: Path, root: Path, executor: str) -> None:
    root.mkdir(parents=True)
    config = configuration(root, trace)
    home = root / "dagster_home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    command = [
        str(Path(sys.executable).parent / "enginefit"),
        *("report", "--config", str(config), "--executor", executor),
    ]
    start = time.perf_counter()
    with (root / "report.log").open("w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
        with sampled(child.pid) as samples:
            code = child.wait()
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"enginefit report failed ({code}): see {root / 'report.log'}")
    tree_peak = max(rss for _, rss in samples)
    pdfs = sorted((root / "reports").rglob("*.pdf"))
    if len(pdfs) != 1:
        raise SystemExit(f"expected one PDF under {root / 'reports'}, found {pdfs}")
    windows, checks = step_windows(home)
    # Kept beside the outputs, for a closer look at where the memory went.
    (root / "rss.tsv").write_text("".join(f"{t:.3f}\t{rss}\n" for t, rss in samples))
    (root / "steps.tsv").write_text("".join(f"{k}\t{b:.3f}\t{e:.3f}\n" for k, b, e in windows))
    seconds: dict[str, float] = defaultdict(float)
    peak: dict[str, int] = defaultdict(int)
    for key, begin, end in windows:
        stage = stage_of(key, checks)
        seconds[stage] += end - begin
        during = [rss for moment, rss in samples if begin <= moment <= end]
        peak[stage] = max(peak[stage], *during, 0)
    print(f"{'stage':<26} {'time s':>8} {'peak memory GiB':>16}")
    for stage in dict.fromkeys(stage_of(key, checks) for key, _, _ in windows):
        memory = f"{peak[stage] / GIB:16.2f}" if peak[stage] else f"{'(under 50 ms)':>16}"
        print(f"{stage:<26} {seconds[stage]:8.1f} {memory}")
    outside = elapsed - sum(seconds.values())
    if outside >= 0:  # with steps side by side their times add up to more than the run's
        print(f"{'start-up, Dagster, PDF out':<26} {outside:8.1f}")
    print(
        f"{requests:,} requests end to end ({executor}): {elapsed:.1f} s "
        f"({elapsed / 60:.1f} min), peak memory {tree_peak / GIB:.2f} GiB (the command and its "
        f"child processes together); "
        f"PDF {pdfs[0].stat().st_size / 1024:,.0f} KiB",
        flush=True,
    )


def _executors(text: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in EXECUTORS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r}: choose from {', '.join(EXECUTORS)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=workload.counts,
        default=[1_000_000, 10_000_000],
        help="sizes, comma-separated (default 1M,10M)",
    )
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temp folder)")
    parser.add_argument(
        "--executors",
        type=_executors,
        default=["in_process"],
        help="executors to run each size with, comma-separated (in_process, multiprocess)",
    )
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="enginefit-e2e-") as scratch:
        base = args.keep or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        for size in args.requests:
            trace = base / f"trace-{size}.jsonl"
            generate(size, trace)
            for executor in args.executors:
                measure(size, trace, base / f"e2e-{size}-{executor}", executor)


if __name__ == "__main__":
    main(sys.argv[1:])
