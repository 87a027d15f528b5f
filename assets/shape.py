"""Dagster layer of the workload-shape stage: one asset and its checks (logic in pipeline.shape)."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from assets.resources import EnginefitStore
from pipeline.shape.config import parse_shape_config
from pipeline.shape.outputs import SHAPE_JSON, write_shape_outputs
from pipeline.shape.report import (
    check_estimates_labelled,
    check_unsupported_have_reasons,
    summary_tables,
)
from pipeline.store import scan_requests

STAGE = "shape"


@dg.asset(
    key="workload_shape",
    deps=["workload"],
    group_name="shape",
    description="Arrival pattern, token lengths, concurrency, traffic mix and axis findings.",
)
def workload_shape(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    config = store.config()
    cfg = parse_shape_config(config.section("shape"), str(config.source or "<config>"))
    out = write_shape_outputs(scan_requests(store.workload_dir()), cfg, store.stage_dir(STAGE))
    shape = out.result.to_json()
    tables = summary_tables(shape)
    conc = shape["concurrency"]
    metadata: dict[str, Any] = {
        "requests": dg.MetadataValue.int(int(shape["requests"])),
        "peak_concurrency": dg.MetadataValue.int(int(conc["peak"])),
        "peak_concurrency_estimated": dg.MetadataValue.bool(bool(conc["estimated"])),
        "concurrency_label": dg.MetadataValue.text(str(conc["label"])),
        "timestamps_quantised": dg.MetadataValue.bool(
            bool(shape["arrivals"]["quantisation"]["quantised"])
        ),
        **{f"{name}_table": dg.MetadataValue.md(md) for name, md in tables.items()},
        **{name: dg.MetadataValue.path(str(path)) for name, path in sorted(out.paths.items())},
    }
    return dg.MaterializeResult(metadata=metadata)


def _load_shape(store: EnginefitStore) -> dict[str, Any]:
    path = store.stage_dir(STAGE) / SHAPE_JSON
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


@dg.asset_check(asset=workload_shape, description="Estimated concurrency carries its model.")
def estimated_concurrency_labelled(store: EnginefitStore) -> dg.AssetCheckResult:
    ok, message = check_estimates_labelled(_load_shape(store))
    return dg.AssetCheckResult(passed=ok, description=message)


@dg.asset_check(
    asset=workload_shape, description="Statistics the timestamps cannot support say why."
)
def unsupported_statistics_explained(store: EnginefitStore) -> dg.AssetCheckResult:
    ok, message = check_unsupported_have_reasons(_load_shape(store))
    return dg.AssetCheckResult(passed=ok, description=message)


ASSETS = [workload_shape]
CHECKS = [estimated_concurrency_labelled, unsupported_statistics_explained]
