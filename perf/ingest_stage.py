"""The ``workload`` asset's ingest steps at scale, eager merge against out-of-core merge.

The steps run in one child process as the in-process executor runs them: the trace files
planned, each read and staged in chunks of records (:func:`pipeline.ingest.stage.read_stage`;
on a ``--code`` checkout from before it, read whole then staged), then merged and published, either as before (every
staged read back whole, :func:`~pipeline.ingest.stage.merge` then
:func:`~pipeline.ingest.stage.write`) or out of core
(:func:`~pipeline.ingest.stage.merge_publish`). While it runs, the memory of the child is
sampled every 50 ms from ``/proc`` (proportional set sizes, summed over the child and anything
it starts: :func:`perf.e2e.tree_memory_bytes`). Printed: wall and CPU seconds of the read steps
and of the merge, the peak memory during each, and the machine's load average (other work on
the machine adds time, not memory).

``--merge command`` runs ``enginefit ingest TRACE... --out DIR`` instead, the whole command in
its child process (start, imports, read, merge, publish, print), sampled the same way; printed:
its wall and CPU seconds, the peak of the samples and the child's own peak RSS (``VmHWM``).
``--code DIR`` runs the child on another checkout of the project (e.g. ``git archive`` of an
earlier commit), to measure before and after a change on the same traces.

Run: ``python -m perf.ingest_stage --merge eager|ooc|command [--code DIR] [--out DIR] TRACE...``
(traces, globs or folders, e.g. ``perf/workload.py``'s Mooncake JSONL split into daily files).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perf.e2e import GIB, sampled

REPO = Path(__file__).resolve().parents[1]

# The child: the asset's steps in process, phase boundaries (wall clock, CPU) as JSON on stdout.
_CHILD = """
import json, resource, sys, time
from pathlib import Path
from pipeline.ingest import stage
from pipeline.ingest.compute import expand_paths
from pipeline.ingest.readers import ReadContext
from pipeline.layout import WorkloadLayout

def mark(name):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps([name, time.time(), usage.ru_utime + usage.ru_stime]), flush=True)

how, out, *traces = sys.argv[1:]
layout = WorkloadLayout(Path(out))
mark("start")
sources = tuple(expand_paths(traces))
inputs = stage.IngestInputs(sources, tuple("auto" for _ in sources), ReadContext(salt=b"bench"))
planned, skipped = stage.plan(inputs)
if hasattr(stage, "read_stage"):  # each file read and staged in chunks of records
    staged = [stage.read_stage(inputs, p, layout) for p in planned]
else:  # a checkout from before: each file read whole, then staged
    staged = [stage.stage_read(stage.read_one(inputs, p), layout) for p in planned]
mark("read")
if how == "eager":
    result = stage.merge(inputs, staged, skipped)
    stage.write(result, layout)
    ingested = result.summary.ingested
    del result
else:
    ingested = stage.merge_publish(inputs, staged, skipped, layout).summary.ingested
mark("merge")
print(json.dumps(["ingested", ingested]), flush=True)
"""


def measure_command(traces: list[str], out: Path, code: Path) -> dict[str, float]:
    """``enginefit ingest TRACE... --out OUT`` as a whole command, run from ``code``."""
    peak_to = out.parent / f".{out.name}.peak"
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "ENGINEFIT_HASH_SALT": "bench",
        "ENGINEFIT_PEAK_TO": str(peak_to),
    }
    command = [sys.executable, "-c", _COMMAND, "ingest", *traces, "--out", str(out)]
    start = time.time()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env, cwd=out.parent)
    with sampled(child.pid) as samples:
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.time() - start
    if status != 0:
        raise SystemExit(f"enginefit ingest failed ({status})")
    summary = json.loads((out / "ingest_summary.json").read_text())
    peak_kib = int(peak_to.read_text())
    peak_to.unlink()
    return {
        "requests": summary["ingested"],
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_gib": max((m for _, m in samples), default=0) / GIB,
        "max_rss_gib": peak_kib * 1024 / GIB,
        "load_average_1m": os.getloadavg()[0],
    }


# The command's child: ``enginefit`` with the arguments given (its exit status is the child's),
# writing its own peak resident memory (``VmHWM``, :mod:`perf.peak`; inline, as an older
# ``--code`` checkout has no perf.peak) to the file ``ENGINEFIT_PEAK_TO`` names as it exits:
# the waited-for ``ru_maxrss`` would carry this benchmark's own peak across the exec.
_COMMAND = """
import atexit, os, sys
def _peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(os.environ["ENGINEFIT_PEAK_TO"], "w").write(line.split()[1])
atexit.register(_peak)
from assets.cli import main
sys.exit(main(sys.argv[1:]))
"""


def measure(how: str, traces: list[str], out: Path, code: Path = REPO) -> dict[str, float]:
    if how == "command":
        return measure_command(traces, out, code)
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [sys.executable, "-c", _CHILD, how, str(out), *traces]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    with sampled(child.pid) as samples:
        output, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the ingest steps failed ({child.returncode})")
    marks = {name: (at, cpu) for name, at, cpu in map(json.loads, output.splitlines()[:-1])}
    ingested = json.loads(output.splitlines()[-1])[1]
    results: dict[str, float] = {"requests": ingested}
    for phase, begin in (("read", "start"), ("merge", "read")):
        (t0, c0), (t1, c1) = marks[begin], marks[phase]
        results[f"{phase}_wall_s"] = t1 - t0
        results[f"{phase}_cpu_s"] = c1 - c0
        during = [memory for moment, memory in samples if t0 <= moment <= t1]
        results[f"{phase}_peak_gib"] = max(during, default=0) / GIB
    results["peak_gib"] = max((m for _, m in samples), default=0) / GIB
    results["load_average_1m"] = os.getloadavg()[0]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="perf.ingest_stage", description=__doc__)
    parser.add_argument("--merge", choices=("eager", "ooc", "command"), required=True)
    parser.add_argument("--out", type=Path, default=None, help="workload folder (default: temp)")
    parser.add_argument(
        "--code", type=Path, default=REPO, help="the project checkout the child runs"
    )
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "workload"
        results = measure(
            args.merge, [str(Path(t).absolute()) for t in args.traces], out, args.code
        )
    print(f"{'load_average_1m_before':>24}: {load_before:,.2f}")
    for key, value in results.items():
        print(f"{key:>24}: {value:,.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
