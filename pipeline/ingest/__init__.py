"""Ingestion: trace files in, one canonical request table (plus its quarantine) out.

:mod:`~pipeline.ingest.compute` reads and reconciles, :mod:`~pipeline.ingest.result` holds what
it produces, :mod:`~pipeline.ingest.present` shows it, :mod:`~pipeline.ingest.stage` is the
inputs → run → write contract the asset and the command share.
"""
