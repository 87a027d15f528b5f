"""The same definitions on a cluster: ENGINEFIT_EXECUTOR names one of Dagster's own executors
(dagster-k8s's k8s_job_executor, dagster-celery's celery_executor), the definitions load with
it through Dagster's own loader, and the documented run config is valid for it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

import assets.definitions as definitions
from assets.executors import CLUSTER_EXECUTORS, EXECUTOR_ENV, cluster_executor
from pipeline.errors import ConfigError
from tests.conftest import REPO

RUN_CONFIGS = {
    "k8s": REPO / "docs" / "cluster" / "k8s-run-config.yaml",
    "celery": REPO / "docs" / "cluster" / "celery-run-config.yaml",
}


def _installed(name: str) -> object:
    module, _ = CLUSTER_EXECUTORS[name]
    return pytest.importorskip(module, reason=f"the cluster extra ({module}) is not installed")


def _is_installed(name: str) -> bool:
    module, _ = CLUSTER_EXECUTORS[name]
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name", sorted(CLUSTER_EXECUTORS))
def test_the_definitions_run_on_the_named_cluster_executor(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every asset and check of the one graph, with the cluster executor on the job; the
    documented run config (docs/cluster/) validates against the job's schema."""
    _installed(name)
    executor = cluster_executor(name)
    assert executor is not None
    defs = definitions.build_definitions(executor)
    dg.Definitions.validate_loadable(defs)
    job = defs.resolve_job_def("full_report")
    assert job.executor_def is executor
    assert job.asset_layer.asset_graph.get_all_asset_keys() == (
        definitions.defs.resolve_job_def("full_report").asset_layer.asset_graph.get_all_asset_keys()
    )
    run_config = yaml.safe_load(RUN_CONFIGS[name].read_text())
    for variable in ("DAGSTER_CELERY_BROKER_URL", "DAGSTER_CELERY_BACKEND_URL"):
        monkeypatch.setenv(variable, "redis://127.0.0.1:6379/0")
    assert dg.validate_run_config(job, run_config)


def test_dagster_loads_the_code_location_with_the_executor_from_the_environment(
    tmp_path: Path,
) -> None:
    """What the cluster's code server does: `dagster definitions validate -m assets.definitions`
    with ENGINEFIT_EXECUTOR set, and the job it loaded uses that executor. One process for every
    installed cluster executor (Dagster's import is most of the cost): the installed `dagster`
    script runs as its own __main__ with the variable set and the definitions not yet imported,
    then the module it loaded is asked."""
    names = [name for name in sorted(CLUSTER_EXECUTORS) if _is_installed(name)]
    if not names:
        pytest.skip("the cluster extra (dagster-k8s, dagster-celery) is not installed")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    env.pop(EXECUTOR_ENV, None)
    (tmp_path / "dagster.yaml").write_text("")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    dagster = Path(sys.executable).with_name("dagster")
    command = (
        "import os, runpy, sys\n"
        f"for name in {names!r}:\n"
        f"    os.environ[{EXECUTOR_ENV!r}] = name\n"
        "    for module in [m for m in sys.modules if m.startswith('assets')]:\n"
        "        del sys.modules[module]\n"
        f"    sys.argv = [{str(dagster)!r}, 'definitions', 'validate', '-m', 'assets.definitions']\n"
        "    try:\n"
        f"        runpy.run_path({str(dagster)!r}, run_name='__main__')\n"
        "    except SystemExit as done:\n"
        "        assert done.code in (0, None), done.code\n"
        "    loaded = sys.modules['assets.definitions']\n"
        "    print(name, loaded.defs.resolve_job_def('full_report').executor_def.name)\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", command],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    said = [line for line in loaded.stdout.splitlines() if line.split(" ")[0] in names]
    expected = []
    for name in names:
        executor = cluster_executor(name)
        assert executor is not None
        expected.append(f"{name} {executor.name}")
    assert said == expected, loaded.stdout


def test_an_unknown_executor_is_one_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"ENGINEFIT_EXECUTOR='slurm': not an executor"):
        cluster_executor("slurm")
    assert cluster_executor(None) is None and cluster_executor("default") is None


def test_enginefit_report_refuses_to_run_a_cluster_executor_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`enginefit report` runs on this machine; with a cluster executor configured it says to
    launch the job on the cluster instead, before any step runs."""
    _installed("k8s")
    monkeypatch.setattr(definitions, "defs", definitions.build_definitions(cluster_executor("k8s")))
    with (
        dg.DagsterInstance.ephemeral() as instance,
        pytest.raises(ConfigError, match="names a cluster executor"),
    ):
        definitions.run_full_graph(tmp_path / "enginefit.yaml", instance)
