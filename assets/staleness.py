"""Which assets Dagster holds stale or missing: the one place enginefit uses Dagster's private API.

Dagster's stale-status resolver (what the UI's "Materialize stale and missing" uses) is not
public API. Every private name used is imported here and listed in :data:`PRIVATE_NAMES` with
the parameters enginefit passes it; ``tests/test_staleness.py`` checks each against the
installed Dagster, and resolves a small graph's statuses through :func:`stale_or_missing`, so
an upgrade that moves or changes one fails there, naming it.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

try:
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
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
