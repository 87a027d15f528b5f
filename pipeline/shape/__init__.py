"""Workload shape: arrivals, lengths, concurrency, traffic mix, and where that puts the workload.

Pure functions over the canonical request table (:mod:`pipeline.schema`); no Dagster here.
The JSON keys are documented in ``docs/shape.md``. ``stage`` holds the contract the asset and
the command share.
"""
