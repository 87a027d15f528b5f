"""Which assets Dagster holds stale or missing, and the outside inputs' data versions recorded
for it: the one place enginefit uses Dagster's private API.

Dagster's stale-status resolver (what the UI's "Materialize stale and missing" uses) is not
public API, nor are the tags an observation carries its data version in. Every private name used
is imported here and listed in :data:`PRIVATE_NAMES` with the parameters enginefit passes it;
``tests/test_staleness.py`` checks each against the installed Dagster, and resolves a small
graph's statuses through :func:`stale_or_missing` and :func:`record_data_versions`, so an
upgrade that moves or changes one fails there, naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import dagster as dg

try:
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.definitions.data_version import (
        DATA_VERSION_IS_USER_PROVIDED_TAG,
        DATA_VERSION_TAG,
        CachingStaleStatusResolver,
        StaleStatus,
    )
    from dagster._core.definitions.temporal_context import TemporalContext
    from dagster._time import get_current_datetime
except ImportError as exc:  # an upgrade moved one: say which, not only that the import failed
    raise ImportError(
        f"Dagster {dg.__version__}: {exc}; assets/staleness.py uses this private name "
        "(tests/test_staleness.py lists them)"
    ) from exc

#: (module, name, the parameters or fields enginefit passes it by name or in order).
PRIVATE_NAMES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "dagster._core.asset_graph_view.asset_graph_view",
        "AssetGraphView",
        ("temporal_context", "instance", "asset_graph"),
    ),
    (
        "dagster._core.definitions.data_version",
        "CachingStaleStatusResolver",
        ("instance", "asset_graph", "loading_context"),
    ),
    ("dagster._core.definitions.data_version", "StaleStatus", ()),
    ("dagster._core.definitions.data_version", "DATA_VERSION_TAG", ()),
    ("dagster._core.definitions.data_version", "DATA_VERSION_IS_USER_PROVIDED_TAG", ()),
    (
        "dagster._core.definitions.temporal_context",
        "TemporalContext",
        ("effective_dt", "last_event_id"),
    ),
    ("dagster._time", "get_current_datetime", ()),
)


def stale_or_missing(
    instance: dg.DagsterInstance, definitions: dg.Definitions, keys: Iterable[dg.AssetKey]
) -> set[dg.AssetKey]:
    """Those of ``keys`` that Dagster holds stale (an input they read was observed with a new
    data version, or an asset they read was materialised since) or missing (never
    materialised), now."""
    graph = definitions.resolve_asset_graph()
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    resolver = CachingStaleStatusResolver(instance, graph, view)
    outdated = (StaleStatus.STALE, StaleStatus.MISSING)
    return {key for key in keys if resolver.get_status(key) in outdated}


def record_data_versions(instance: dg.DagsterInstance, versions: Mapping[str, str]) -> list[str]:
    """Record each observable source asset's data version in ``versions`` (by asset key) that
    differs from the latest Dagster holds, as the observation a run of its observe function
    records, outside any run; returns the keys recorded. A version Dagster already holds is not
    recorded again: staleness compares versions, so it would change nothing."""
    recorded = []
    for key, version in versions.items():
        latest = instance.fetch_observations(dg.AssetKey(key), limit=1).records
        observation = latest[0].asset_observation if latest else None
        if observation is not None and observation.data_version == version:
            continue
        instance.report_runless_asset_event(
            dg.AssetObservation(
                asset_key=key,
                tags={DATA_VERSION_TAG: version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
            )
        )
        recorded.append(key)
    return recorded
