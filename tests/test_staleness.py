"""The private Dagster and CPython names enginefit uses (``assets/staleness.py``,
``assets/executors.py``) are still there, take what enginefit passes them, and still tell a
stale asset from a fresh one: an upgrade that changes one fails here, naming it."""

from __future__ import annotations

import importlib
import inspect
from multiprocessing import forkserver

import dagster as dg
import pytest

from assets import staleness
from assets.executors import FORK_SERVER_STOP


def _parameters(found: object) -> list[str]:
    """What a private name takes by name: a record's fields, else its signature's."""
    fields = getattr(found, "_fields", None)
    if fields is not None:
        return list(fields)
    return list(inspect.signature(found).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "name", "parameters"),
    staleness.PRIVATE_NAMES,
    ids=[f"{module}.{name}" for module, name, _ in staleness.PRIVATE_NAMES],
)
def test_dagster_still_has_each_private_name(
    module: str, name: str, parameters: tuple[str, ...]
) -> None:
    found = getattr(importlib.import_module(module), name, None)
    assert found is not None, f"Dagster {dg.__version__} has no {module}.{name}"
    if not parameters:
        return  # a constant, or a type enginefit passes nothing
    taken = _parameters(found)
    missing = [p for p in parameters if p not in taken]
    assert not missing, (
        f"Dagster {dg.__version__}: {module}.{name} takes {taken}, no longer {missing}"
    )


def test_the_stale_statuses_enginefit_asks_for_exist() -> None:
    names = {status.name for status in staleness.StaleStatus}
    assert {"STALE", "MISSING"} <= names, f"Dagster {dg.__version__}: StaleStatus is {names}"


def test_python_still_has_the_fork_server_stop() -> None:
    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    assert callable(stop), f"this Python has no {FORK_SERVER_STOP}"


def test_missing_then_fresh_then_stale_after_its_upstream_ran_again() -> None:
    """Two assets, ``downstream`` reading ``upstream``: both missing before a run, neither after
    one, and ``downstream`` alone stale once ``upstream`` has been materialised again."""

    @dg.asset
    def upstream() -> int:
        return 1

    @dg.asset
    def downstream(upstream: int) -> int:
        return upstream + 1

    definitions = dg.Definitions(assets=[upstream, downstream])
    keys = [dg.AssetKey("upstream"), dg.AssetKey("downstream")]
    with dg.DagsterInstance.ephemeral() as instance:
        assert staleness.stale_or_missing(instance, definitions, keys) == set(keys)
        assert dg.materialize([upstream, downstream], instance=instance).success
        assert staleness.stale_or_missing(instance, definitions, keys) == set()
        assert dg.materialize([upstream], instance=instance).success
        assert staleness.stale_or_missing(instance, definitions, keys) == {keys[1]}


@pytest.mark.filterwarnings("ignore::dagster.BetaWarning")
def test_a_recorded_data_version_makes_what_reads_it_stale_only_when_it_changed() -> None:
    """An observable input's data version recorded outside a run, as ``enginefit decide`` does:
    the asset reading it is fresh after a run, stays fresh when the same version is met again
    (and nothing new is recorded), and is stale once a new version is recorded."""

    @dg.observable_source_asset
    def source() -> dg.DataVersion:
        return dg.DataVersion("never observed in a run")

    @dg.asset(deps=[source])
    def reader() -> int:
        return 1

    definitions = dg.Definitions(assets=[source, reader])
    keys = [dg.AssetKey("reader")]
    with dg.DagsterInstance.ephemeral() as instance:
        assert staleness.record_data_versions(instance, {"source": "v1"}) == ["source"]
        assert dg.materialize([reader], instance=instance).success
        assert staleness.stale_or_missing(instance, definitions, keys) == set()
        assert staleness.record_data_versions(instance, {"source": "v1"}) == []
        assert staleness.stale_or_missing(instance, definitions, keys) == set()
        assert staleness.record_data_versions(instance, {"source": "v2"}) == ["source"]
        assert staleness.stale_or_missing(instance, definitions, keys) == set(keys)
