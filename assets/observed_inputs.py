"""The outside inputs (:mod:`assets.inputs`) as one observable source asset: each observation's
data version hashes what it watches, so Dagster knows which stage is stale."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import dagster as dg

from assets import inputs
from assets.resources import EnginefitStore


def observe_inputs(store: EnginefitStore) -> Iterator[dg.ObserveResult]:
    """Each outside input's data version: its files' stat, or its settings, hashed."""
    for key, version in inputs.input_versions(store.config()).items():
        yield dg.ObserveResult(asset_key=key, data_version=dg.DataVersion(version))


with warnings.catch_warnings():
    # Dagster calls the decorator beta; the data versions it records are the stable part.
    warnings.simplefilter("ignore", dg.BetaWarning)
    enginefit_inputs = dg.multi_observable_source_asset(
        name="enginefit_inputs",
        specs=[
            dg.AssetSpec(key, group_name="inputs", description=inputs.DESCRIPTIONS[key])
            for key in inputs.INPUT_KEYS
        ],
    )(observe_inputs)

ASSETS = [enginefit_inputs]
CHECKS: list[dg.AssetChecksDefinition] = []
