"""End to end: a generated hash-form trace → ``enginefit report`` → the PDF, as a user runs it.

For each size (default 1M and 10M requests) the one generated workload (``perf/workload.py``,
Mooncake JSONL, 512-token block ids, optionally spread over ``--span-days``) is written by a
process of its own, then ``enginefit report`` runs as a child process on a configuration that
is the bundled ``enginefit.yaml`` with that trace as its workload (outputs, reports and the
Dagster home in a temporary folder), with each executor asked for (default: in process,
``make report``'s). While either runs, the command and every process it started (the
multiprocess executor's step processes, the PDF renderer) are sampled every 50 ms from
``/proc``: memory summed as proportional set sizes (a page a forked process shares with its
parent counts once: what the machine holds at that moment), and each process's own CPU ticks.

The guard: when the summed memory passes ``--memory-limit`` (default 14 GiB; other work shares
the machine, and the kernel's out-of-memory killer might pick one of theirs) or the run passes
``--wall-limit`` seconds, the whole process tree is stopped and killed, and the run is reported
as over the limit at the stage whose step was running.

Afterwards each Dagster step's start and end come from the run's event log, so every stage gets
its time (the sum of its steps' wall times; with steps side by side that is more than the wall
time they took), its CPU time (the tree's CPU over its steps' windows) and its peak memory (the
highest sample while one of its steps ran). Per size: generation time and memory, the trace's
disk space, the report's wall and CPU time (the command and all its children), peak memory,
and the disk its outputs take (data dir, reports, Dagster home); printed as tables and written
as JSON (``--json``).

Run: ``python -m perf.e2e [--requests 1M,10M] [--executors auto,in_process,multiprocess]
[--span-days 91] [--memory-limit 14] [--wall-limit S] [--keep DIR] [--traces DIR] [--json
FILE]``; under ``make bench`` (which passes no arguments) the environment variable
``ENGINEFIT_E2E_ARGS`` gives them (``make bench-scale``: 10M, 30M and 100M over a quarter).
Numbers in the README were measured on the project machine (2 cores, 24 GiB).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from assets.executors import EXECUTORS
from perf import workload

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 0.05
GIB = 2**30
ARGS_ENV = "ENGINEFIT_E2E_ARGS"  # the arguments under `make bench` (perf.run passes none)

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


PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """One process at one moment: its id and start time (together they name it even when the
    id is reused), CPU ticks it has used itself (user + system) and its proportional set size."""

    pid: int
    started: int
    cpu_ticks: int
    pss: int


def _proc_kib(path: Path, field: str) -> int | None:
    """The ``field:`` line's kB figure of a /proc file, None when it cannot be read."""
    try:
        with path.open() as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pss_bytes(pid: int, proc: Path = PROC) -> int:
    """Proportional set size of ``pid``: its resident pages, each shared page divided among
    the processes sharing it (a forked step process shares its parent's until either writes
    them), so the sum over processes is what the machine holds; RSS where it is not known."""
    kib = _proc_kib(proc / str(pid) / "smaps_rollup", "Pss")
    if kib is None:
        kib = _proc_kib(proc / str(pid) / "status", "VmRSS")
    return (kib or 0) * 1024


def _stat(pid: int, proc: Path = PROC) -> tuple[int, int] | None:
    """(start time, user + system ticks) of ``pid`` from ``/proc/<pid>/stat``, None when gone.
    The command name may hold spaces and parentheses, so fields are counted after its last ")"."""
    try:
        text = (proc / str(pid) / "stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        # After the name: state is field 3 of stat(5), utime 14, stime 15, starttime 22.
        return int(fields[19]), int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int, proc: Path = PROC) -> list[int]:
    try:
        text = (proc / str(pid) / "task" / str(pid) / "children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def process_tree(pid: int, proc: Path = PROC) -> list[Sample]:
    """``pid`` and all its descendants (the step processes of the multiprocess executor, the
    PDF renderer) as they are now; a process that ended while being read is left out. A child
    whose memory figures (resident and proportional, to the kB) are its parent's is one started
    with ``vfork`` that has not run its program yet: it shares the parent's memory, and /proc
    shows the same pages in both, so its memory is counted 0."""
    found: list[Sample] = []
    stack: list[tuple[int, tuple[int | None, int | None] | None]] = [(pid, None)]
    while stack:
        current, parent_memory = stack.pop()
        stat = _stat(current, proc)
        rollup = proc / str(current) / "smaps_rollup"
        memory = (_proc_kib(rollup, "Rss"), _proc_kib(rollup, "Pss"))
        if stat is not None:
            shared = memory[1] is not None and memory == parent_memory
            pss = 0 if shared else _pss_bytes(current, proc)
            found.append(Sample(current, stat[0], stat[1], pss))
        stack.extend((child, memory) for child in _children(current, proc))
    return found


def tree_memory_bytes(pid: int, proc: Path = PROC) -> int:
    """Memory of ``pid`` and all its descendants, summed: what the machine holds now."""
    return sum(sample.pss for sample in process_tree(pid, proc))


@contextmanager
def sampled(pid: int) -> Iterator[list[tuple[float, int]]]:
    """(wall time, summed memory bytes) of process ``pid``'s tree every SAMPLE_EVERY_S while
    the body runs."""
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


class CpuAccount:
    """CPU time of a process tree from repeated snapshots: per process (id and start time) the
    latest ticks seen, summed. A process's own ticks only (never its children's cumulative
    ones, which would count a reaped child twice); what a process used after its last sample
    (under one sampling interval) is missed, so this is a lower bound."""

    def __init__(self) -> None:
        self._ticks: dict[tuple[int, int], int] = {}

    def add(self, snapshot: list[Sample]) -> None:
        for s in snapshot:
            key = (s.pid, s.started)
            self._ticks[key] = max(self._ticks.get(key, 0), s.cpu_ticks)

    @property
    def processes(self) -> int:
        return len(self._ticks)

    def seconds(self, ticks_per_s: int = CLOCK_TICKS) -> float:
        return sum(self._ticks.values()) / ticks_per_s


@dataclass(frozen=True)
class Limits:
    """When the guard stops a run: summed memory above ``memory_bytes`` (other work shares the
    machine; the kernel's out-of-memory killer might pick one of theirs), the machine's
    available memory under ``min_available_bytes`` (others may hold more than the limit
    leaves), or ``wall_s`` of wall time (None: no limit)."""

    memory_bytes: int
    wall_s: float | None = None
    min_available_bytes: int = 0

    def exceeded(
        self, elapsed_s: float, memory_bytes: int, available_bytes: int | None = None
    ) -> str | None:
        """Why the run must stop now, None when it may go on."""
        if memory_bytes > self.memory_bytes:
            return f"over the memory limit ({self.memory_bytes / GIB:.1f} GiB)"
        if available_bytes is not None and available_bytes < self.min_available_bytes:
            return (
                f"the machine's available memory under {self.min_available_bytes / GIB:.1f} GiB "
                f"(the run held {memory_bytes / GIB:.1f} GiB)"
            )
        if self.wall_s is not None and elapsed_s > self.wall_s:
            return f"over the wall-time limit ({self.wall_s:,.0f} s)"
        return None


def kill_tree(pid: int, proc: Path = PROC) -> None:
    """Stop ``pid`` and every descendant first (so none starts another), then kill them all."""
    seen: set[int] = set()
    for _ in range(3):  # a process forked just before its parent stopped is caught next round
        pids = [s.pid for s in process_tree(pid, proc)]
        if set(pids) <= seen:
            break
        for each in pids:
            with suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)
        seen.update(pids)
    for each in seen:
        with suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


@dataclass
class Watched:
    """A command's run under the guard: its exit code, wall time, CPU time (it and every
    process it started), the memory samples, and why the guard stopped it (None: it was not)."""

    code: int
    wall_s: float
    cpu_s: float
    samples: list[tuple[float, int, float]]  # (time, summed memory bytes, CPU s so far)
    stopped: str | None = None
    stopped_at_s: float | None = None

    @property
    def peak(self) -> int:
        return max((memory for _, memory, _ in self.samples), default=0)


def child_result(
    name: str, command: list[str], log: Path, limits: Limits
) -> tuple[Watched, dict[str, Any]] | None:
    """A benchmark's child ``command`` (its result as JSON on its last line) run under the
    guard from this folder: its run and result, or None when it was stopped or failed (said,
    with the tail of its ``log``)."""
    watched = run_watched(command, log, dict(os.environ), Path.cwd(), limits)
    if watched.stopped or watched.code != 0:
        print(f"{name}: {watched.stopped or f'failed ({watched.code})'}", flush=True)
        print(log.read_text()[-2000:])
        return None
    return watched, json.loads(log.read_text().strip().splitlines()[-1])


def run_watched(
    command: list[str], log: Path, env: dict[str, str], cwd: Path, limits: Limits
) -> Watched:
    """Run ``command`` (output to ``log``), sampling its process tree's memory and CPU every
    SAMPLE_EVERY_S; kill the whole tree when ``limits`` are exceeded. CPU time is the larger of
    the sampled sum and the waited-for children's rusage (the rusage misses descendants that
    were not reaped by their parent, e.g. after a kill; the samples miss each process's last
    interval): both are lower bounds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    samples: list[tuple[float, int, float]] = []
    cpu = CpuAccount()
    stop: list[tuple[str, float]] = []
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                now = time.time()
                snapshot = process_tree(child.pid)
                cpu.add(snapshot)
                memory = sum(s.pss for s in snapshot)
                samples.append((now, memory, cpu.seconds()))
                available = (_proc_kib(PROC / "meminfo", "MemAvailable") or 0) * 1024
                reason = limits.exceeded(now - start, memory, available or None)
                if reason is not None and not stop:
                    stop.append((reason, now - start))
                    kill_tree(child.pid)
                done.wait(SAMPLE_EVERY_S)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            code = child.wait()
        finally:
            done.set()
            thread.join()
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    reason, at = stop[0] if stop else (None, None)
    return Watched(code, wall, max(reaped, cpu.seconds()), samples, reason, at)


def cpu_between(
    samples: list[tuple[float, int, float]], moments: list[float], begin: float, end: float
) -> float:
    """CPU seconds the process tree used from ``begin`` to ``end``: the difference of the
    cumulative figure at the last samples taken by then (``moments``: the samples' times). In
    process that is the step's own; with steps side by side it counts theirs too."""

    def at(moment: float) -> float:
        index = bisect.bisect_right(moments, moment) - 1
        return samples[index][2] if index >= 0 else 0.0

    return max(at(end) - at(begin), 0.0)


def disk_bytes(path: Path) -> int:
    """Disk space the files under ``path`` (or the file) take (allocated blocks; a file with
    several links once)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_blocks * 512
    total, inodes = 0, set()
    for folder, _, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                info = (Path(folder) / name).lstat()
                if info.st_ino not in inodes:
                    inodes.add(info.st_ino)
                    total += info.st_blocks * 512
    return total


def step_windows(home: Path) -> tuple[list[tuple[str, float, float]], set[str], list[str]]:
    """(step key, start, end) of every finished step of the one run in the Dagster home
    ``home``, the keys of the check steps, and the steps started but not finished (those that
    were running when a run was stopped)."""
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs()
        if not runs:
            return [], set(), []
        (run,) = runs
        starts: dict[str, float] = {}
        windows = []
        checks = set()
        ended = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None or entry.step_key is None:
                continue
            if event.event_type == dg.DagsterEventType.STEP_START:
                starts[entry.step_key] = entry.timestamp
            elif event.event_type in ended and entry.step_key in starts:
                windows.append((entry.step_key, starts.pop(entry.step_key), entry.timestamp))
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                checks.add(entry.step_key)
    return windows, checks, list(starts)


def _python_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def generate(requests: int, trace: Path, limits: Limits, span_days: float | None) -> dict[str, Any]:
    """Write the trace in a process of its own, under the same guard as the report."""
    arguments = ["--requests", str(requests), "--form", "hash", "--out", str(trace)]
    if span_days is not None:
        arguments += ["--span-days", str(span_days)]
    log = trace.with_suffix(".log")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    watched = run_watched(_python_command("perf.workload", *arguments), log, env, REPO, limits)
    result: dict[str, Any] = {
        "wall_s": round(watched.wall_s, 1),
        "cpu_s": round(watched.cpu_s, 1),
        "peak_memory_bytes": watched.peak,
        "trace_disk_bytes": disk_bytes(trace),
        "stopped": watched.stopped,
    }
    if watched.stopped:
        print(
            f"{requests:,} requests: generating the trace: {watched.stopped} after {watched.stopped_at_s:.0f} s",
            flush=True,
        )
    elif watched.code != 0:
        raise SystemExit(f"generating the trace failed ({watched.code}): see {log}")
    else:
        print(
            f"{requests:,} requests: generated in {watched.wall_s:.1f} s ({watched.cpu_s:.1f} s "
            f"CPU), peak memory {watched.peak / GIB:.2f} GiB, "
            f"{_size(result['trace_disk_bytes'])} on disk: "
            + " ".join(log.read_text().split("\n")[0].split()[-20:]),
            flush=True,
        )
    return result


def measure(
    requests: int, trace: Path, root: Path, executor: str, limits: Limits
) -> dict[str, Any]:
    root.mkdir(parents=True)
    config = configuration(root, trace)
    home = root / "dagster_home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    command = [
        str(Path(sys.executable).parent / "enginefit"),
        *("report", "--config", str(config), "--executor", executor),
    ]
    watched = run_watched(command, root / "report.log", env, root, limits)
    samples, elapsed = watched.samples, watched.wall_s
    if watched.code != 0 and watched.stopped is None:
        raise SystemExit(f"enginefit report failed ({watched.code}): see {root / 'report.log'}")
    windows, checks, running = (
        step_windows(home)
        if (home / "storage").exists() or watched.stopped is None
        else ([], set(), [])
    )
    # Kept beside the outputs, for a closer look at where the memory went.
    (root / "rss.tsv").write_text(
        "".join(f"{t:.3f}\t{rss}\t{cpu:.2f}\n" for t, rss, cpu in samples)
    )
    (root / "steps.tsv").write_text("".join(f"{k}\t{b:.3f}\t{e:.3f}\n" for k, b, e in windows))
    seconds: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    peak: dict[str, int] = defaultdict(int)
    moments = [moment for moment, _, _ in samples]
    for key, begin, end in windows:
        stage = stage_of(key, checks)
        seconds[stage] += end - begin
        cpu[stage] += cpu_between(samples, moments, begin, end)
        during = [rss for moment, rss, _ in samples if begin <= moment <= end]
        peak[stage] = max(peak[stage], *during, 0)
    stages = list(dict.fromkeys(stage_of(key, checks) for key, _, _ in windows))
    print(f"{'stage':<26} {'time s':>8} {'CPU s':>8} {'peak memory GiB':>16}")
    for stage in stages:
        memory = f"{peak[stage] / GIB:16.2f}" if peak[stage] else f"{'(under 50 ms)':>16}"
        print(f"{stage:<26} {seconds[stage]:8.1f} {cpu[stage]:8.1f} {memory}")
    outside = elapsed - sum(seconds.values())
    if outside >= 0 and watched.stopped is None:  # steps side by side add up to more
        print(f"{'start-up, Dagster, PDF out':<26} {outside:8.1f}")
    disk = {
        "data": disk_bytes(root / "data"),
        "reports": disk_bytes(root / "reports"),
        "dagster_home": disk_bytes(home),
    }
    result: dict[str, Any] = {
        "executor": executor,
        "wall_s": round(elapsed, 1),
        "cpu_s": round(watched.cpu_s, 1),
        "peak_memory_bytes": watched.peak,
        "disk_bytes": disk,
        "stages": [
            {
                "stage": stage,
                "time_s": round(seconds[stage], 1),
                "cpu_s": round(cpu[stage], 1),
                "peak_memory_bytes": peak[stage],
            }
            for stage in stages
        ],
        "stopped": None,
    }
    disk_text = ", ".join(f"{name} {_size(size)}" for name, size in disk.items())
    if watched.stopped is not None:
        at = sorted({stage_of(key, checks) for key in running}) or ["start-up (no step running)"]
        result["stopped"] = {
            "reason": watched.stopped,
            "after_s": round(watched.stopped_at_s or elapsed, 1),
            "stage": ", ".join(at),
            "steps": running,
        }
        print(
            f"{requests:,} requests ({executor}): {watched.stopped} at stage {', '.join(at)} "
            f"after {watched.stopped_at_s:.0f} s; {watched.cpu_s:.0f} s CPU; disk {disk_text}",
            flush=True,
        )
        return result
    pdfs = sorted((root / "reports").rglob("*.pdf"))
    if len(pdfs) != 1:
        raise SystemExit(f"expected one PDF under {root / 'reports'}, found {pdfs}")
    print(
        f"{requests:,} requests end to end ({executor}): {elapsed:.1f} s "
        f"({elapsed / 60:.1f} min), {watched.cpu_s:.1f} s CPU, peak memory "
        f"{watched.peak / GIB:.2f} GiB (the command and its child processes together); "
        f"PDF {pdfs[0].stat().st_size / 1024:,.0f} KiB; disk {disk_text}",
        flush=True,
    )
    return result


def summary(results: list[dict[str, Any]]) -> str:
    """One line per size and executor: generation, the report, CPU, peak memory, disk."""
    head = (
        f"{'requests':>12} {'executor':<12} {'gen s':>7} {'gen GiB':>8} {'trace GiB':>9} "
        f"{'report s':>9} {'CPU s':>8} {'peak GiB':>9} {'outputs GiB':>11}  outcome"
    )
    lines = [head]
    for r in results:
        gen = r["generation"]
        for run in r["runs"] or [None]:
            outputs = sum(run["disk_bytes"].values()) / GIB if run else 0.0
            outcome = "generation " + gen["stopped"] if gen["stopped"] else "ok"
            if run and run["stopped"]:
                stop = run["stopped"]
                outcome = f"{stop['reason']} at stage {stop['stage']} after {stop['after_s']:.0f} s"
            lines.append(
                f"{r['requests']:>12,} {run['executor'] if run else '-':<12} {gen['wall_s']:>7.1f} "
                f"{gen['peak_memory_bytes'] / GIB:>8.2f} {gen['trace_disk_bytes'] / GIB:>9.2f} "
                + (
                    f"{run['wall_s']:>9.1f} {run['cpu_s']:>8.1f} "
                    f"{run['peak_memory_bytes'] / GIB:>9.2f} {outputs:>11.2f}"
                    if run
                    else f"{'':>9} {'':>8} {'':>9} {'':>11}"
                )
                + f"  {outcome}"
            )
    return "\n".join(lines)


# `enginefit report --executor`'s choices: auto (its default) or one of the two.
EXECUTOR_CHOICES = ("auto", *EXECUTORS)


def _executors(text: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in EXECUTOR_CHOICES]
    if unknown:
        choices = ", ".join(EXECUTOR_CHOICES)
        raise argparse.ArgumentTypeError(f"{unknown[0]!r}: choose from {choices}")
    return names


def _gib(text: str) -> int:
    try:
        value = float(text.upper().removesuffix("GIB").removesuffix("G"))
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size: write 12 or 12GiB")
    return round(value * GIB)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=workload.counts,
        default=[1_000_000, 10_000_000],
        help="sizes, comma-separated (default 1M,10M; the scale run: 10M,30M,100M)",
    )
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temp folder)")
    parser.add_argument(
        "--traces",
        type=Path,
        help="keep the generated traces here and reuse one found there as it is (the name says "
        "the size and span; default: written with the outputs)",
    )
    parser.add_argument(
        "--executors",
        type=_executors,
        default=["auto"],
        help="executors to run each size with, comma-separated (auto, the command's default; "
        "in_process; multiprocess)",
    )
    parser.add_argument(
        "--span-days",
        type=float,
        help="spread each trace's sessions over this many days (a quarter: 91; default: the "
        "generator's 100 requests a second)",
    )
    parser.add_argument(
        "--memory-limit",
        type=_gib,
        default=14 * GIB,
        help="kill a run (the trace's generation or the report) whose processes together hold "
        "more than this, in GiB (default 14)",
    )
    parser.add_argument(
        "--min-available",
        type=_gib,
        default=GIB,
        help="kill a run when the machine's available memory falls under this, in GiB (default 1)",
    )
    parser.add_argument(
        "--wall-limit", type=float, help="kill a run after this many seconds (default: none)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(tempfile.gettempdir()) / "enginefit-e2e.json",
        help="write the measurements here (default: %(default)s)",
    )
    args = parser.parse_args(
        argv if argv is not None else shlex.split(os.environ.get(ARGS_ENV, ""))
    )
    limits = Limits(args.memory_limit, args.wall_limit, args.min_available)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="enginefit-e2e-") as scratch:
        base = args.keep or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        if args.traces is not None:
            args.traces.mkdir(parents=True, exist_ok=True)
        for size in args.requests:
            span = f"-{args.span_days:g}d" if args.span_days is not None else ""
            trace = (args.traces or base) / f"trace-{size}{span}.jsonl"
            if args.traces is not None and trace.exists():
                print(f"{size:,} requests: reusing {trace} as it is", flush=True)
                generation = {"reused": str(trace), "trace_disk_bytes": disk_bytes(trace)}
                generation |= {"wall_s": 0.0, "cpu_s": 0.0, "peak_memory_bytes": 0}
                generation["stopped"] = None
            else:
                generation = generate(size, trace, limits, args.span_days)
            runs = []
            if not generation["stopped"]:
                for executor in args.executors:
                    root = base / f"e2e-{size}-{executor}"
                    runs.append(measure(size, trace, root, executor, limits))
            results.append({"requests": size, "generation": generation, "runs": runs})
            report = {
                "machine": {"cpus": os.cpu_count(), "memory_bytes": _memory_total()},
                "load_average": os.getloadavg(),
                "span_days": args.span_days,
                "memory_limit_bytes": limits.memory_bytes,
                "wall_limit_s": limits.wall_s,
                "results": results,
            }
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(summary(results))
    print(f"measurements written to {args.json}", flush=True)


def _size(size: int) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:,.0f} MiB"


def _memory_total() -> int:
    return (_proc_kib(PROC / "meminfo", "MemTotal") or 0) * 1024


if __name__ == "__main__":
    main(sys.argv[1:])
