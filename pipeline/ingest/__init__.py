"""Ingestion: trace files in, one canonical request table (plus its quarantine) out.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``); its settings are the
``workload`` section (:class:`pipeline.ingest.config.IngestConfig`, reached as
``config.workload``: the workload's name also names every stage's folder). Beside the shape:
``readers/`` (one reader per trace format), ``blockhash`` and ``tokenize`` (the prompt's block
hashes), ``days`` (one UTC day at a time, for daily partitions).
"""
