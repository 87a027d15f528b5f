"""Which of Dagster's executors runs the steps: configuration, never code.

On one machine the job keeps Dagster's default executor (``multi_or_in_process_executor``):
``enginefit report`` picks multiprocess or in-process in the run config
(:func:`executor_config`), multiprocess forking each step from a fork server
(:func:`stop_fork_server` after each run). On a cluster the environment variable
``ENGINEFIT_EXECUTOR`` of the code location (the Helm chart's user deployment, see
docs/cluster/) names one of Dagster's own cluster executors, and the same definitions run
each step elsewhere:

- ``k8s``: dagster-k8s's ``k8s_job_executor``, one Kubernetes Job per step;
- ``celery``: dagster-celery's ``celery_executor``, steps queued to Celery workers.

Their settings (namespace, image, volumes, broker) are the run config's ``execution`` section
(docs/cluster/*.yaml), and the packages are the ``cluster`` extra.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, Literal

import dagster as dg

from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.ingest.compute import expand_paths as trace_files
from pipeline.ingest.days import ingested_days
from pipeline.sim.curve_stream import stored_blocks

EXECUTOR_ENV = "ENGINEFIT_EXECUTOR"
# name → (module, executor); both come from the `cluster` extra.
CLUSTER_EXECUTORS = {
    "k8s": ("dagster_k8s", "k8s_job_executor"),
    "celery": ("dagster_celery", "celery_executor"),
}


def cluster_executor(name: str | None) -> dg.ExecutorDefinition | None:
    """The executor ``name`` (``ENGINEFIT_EXECUTOR``) stands for; None (unset, empty or
    ``default``) keeps Dagster's default."""
    if not name or name == "default":
        return None
    if name not in CLUSTER_EXECUTORS:
        choices = ", ".join(["default", *CLUSTER_EXECUTORS])
        raise ConfigError(f"{EXECUTOR_ENV}={name!r}: not an executor enginefit knows ({choices})")
    module_name, attribute = CLUSTER_EXECUTORS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{EXECUTOR_ENV}={name}: {module_name.replace('_', '-')} is not installed "
            "(pip install -e '.[cluster]')"
        ) from exc
    executor: dg.ExecutorDefinition = getattr(module, attribute)
    return executor


def configured_executor() -> dg.ExecutorDefinition | None:
    return cluster_executor(os.environ.get(EXECUTOR_ENV))


Executor = Literal["multiprocess", "in_process"]
EXECUTORS: tuple[Executor, ...] = ("multiprocess", "in_process")
#: How many times ``simulation.curve_exact_max_blocks`` stored blocks a table holds before
#: ``--executor auto`` runs its steps in processes of their own. Measured on 2 cores, 24 GiB
#: (README, "A quarter at 10M, 30M and 100M requests"): in one process 30M generated requests
#: (256M blocks, 2.6 times the default limit) peaked at 4.5 GiB and ran fastest, while 100M
#: (855M, 8.6 times) went past 12 GiB where multiprocess peaked at 8.8 GiB.
MULTIPROCESS_PAST_LIMIT = 4
#: Bytes of trace a stored block takes in the densest trace at hand, Mooncake's conversation
#: trace (traces/mooncake/: 3,029,533 bytes for 276,491 blocks; the generated 100M quarter
#: takes 18). Before the first ingest a trace is taken to hold its bytes over this many blocks;
#: once its table is ingested, the table decides.
TRACE_BYTES_PER_BLOCK = 11


@dataclass(frozen=True)
class ExecutorChoice:
    """The executor ``enginefit report --executor auto`` runs, and why, in a phrase."""

    executor: Executor
    reason: str


def auto_executor(config: Config) -> ExecutorChoice:
    """``multiprocess`` past :data:`MULTIPROCESS_PAST_LIMIT` times
    ``simulation.curve_exact_max_blocks`` stored blocks, else ``in_process`` (the faster on a
    few cores, and below the limit the one that flattens the table once for every stage).
    Past the limit no stage shares a flattened table, so a step in a process of its own loses
    little, gives its memory back when it ends, and runs beside another. The size is the
    ingested table's (a daily workload's: its days'), else the trace files' bytes over
    :data:`TRACE_BYTES_PER_BLOCK`."""
    limit = config.simulation.curve_exact_max_blocks
    parts = _ingested_parts(config)
    if parts:
        blocks = stored_blocks(parts)
        seen = f"the ingested table holds {blocks:,} stored blocks"
    elif config.require_workload().daily_quarter is not None:
        return ExecutorChoice("in_process", "no day of the workload is ingested yet")
    else:
        files = [
            Path(source.path)
            for trace in config.require_workload().traces
            for source in trace_files([trace.path])
        ]
        unreadable = next((path for path in files if not path.is_file()), None)
        if unreadable is not None:
            return ExecutorChoice(
                "in_process", f"{unreadable} is not a file to size the run by (ingest says why)"
            )
        size = sum(path.stat().st_size for path in files)
        blocks = size // TRACE_BYTES_PER_BLOCK
        shown = f"{size / 2**30:,.2f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"
        seen = f"the trace files ({shown}) may hold {blocks:,} stored blocks"
    bound = MULTIPROCESS_PAST_LIMIT * limit
    if blocks > bound:
        return ExecutorChoice(
            "multiprocess",
            f"{seen}, more than {MULTIPROCESS_PAST_LIMIT} × simulation.curve_exact_max_blocks "
            f"({bound:,}): each step in a process of its own",
        )
    return ExecutorChoice(
        "in_process",
        f"{seen}, at most {MULTIPROCESS_PAST_LIMIT} × simulation.curve_exact_max_blocks "
        f"({bound:,})",
    )


def _ingested_parts(config: Config) -> list[Path]:
    """The request parts of the workload's table as ingested (of each ingested day, for a
    workload ingested by day); none before the first ingest."""
    layout = config.layout()
    if config.require_workload().daily_quarter is not None:
        return [p for day in ingested_days(layout) for p in layout.day(day).ingest.parts()]
    return layout.ingest.parts() if layout.ingest.manifest.is_file() else []


# The fork server imports these once; each step's process is forked from it (assets/worker.py).
WORKER_PRELOAD = ["assets.worker"]


def executor_config(executor: Executor, max_concurrent: int | None = None) -> dict[str, Any]:
    """Run config for the job's executor (Dagster's default ``multi_or_in_process_executor``):
    ``multiprocess`` forks each step from a server that has imported the definitions (so a step
    starts in about 0.2 s, not 3 s) and runs up to ``max_concurrent`` at once (default: one per
    CPU); ``in_process`` runs every step in this process, one at a time."""
    if executor == "in_process":
        return {"in_process": {}}
    start = {"forkserver": {"preload_modules": WORKER_PRELOAD}}
    config: dict[str, Any] = {"start_method": start}
    if max_concurrent is not None:
        config["max_concurrent"] = max_concurrent
    return {"multiprocess": config}


#: CPython's private call that stops a process's fork server (its own tests use it);
#: tests/test_staleness.py checks the running Python still has it.
FORK_SERVER_STOP = "multiprocessing.forkserver._forkserver._stop"


def stop_fork_server() -> None:
    """Python keeps one fork server per process, with the environment and working folder it
    started with, for as long as the process lives. Stopped after each run, the next run in
    the same process (tests, perf/graph.py) forks its steps from a server that sees the then
    environment (e.g. the DAGSTER_PG_* its instance reads), and the preloaded modules' memory
    goes back meanwhile. A Python without the call keeps its server (the next run sees the
    environment it started with)."""
    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()
