"""Which of Dagster's executors runs the steps: configuration, never code.

On one machine the job keeps Dagster's default executor (``multi_or_in_process_executor``):
``enginefit report`` picks multiprocess or in-process in the run config
(:func:`assets.definitions.executor_config`). On a cluster the environment variable
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
