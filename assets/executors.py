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
from multiprocessing import forkserver
from typing import Any, Literal

import dagster as dg

from pipeline.errors import ConfigError

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
