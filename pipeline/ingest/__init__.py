"""Ingestion: trace files in, one canonical request table (plus its quarantine) out.

The stage shape (compute, result, present, checks, stage, cli) with one file less: no
``config.py``, because ingest's settings are the ``workload`` and ``read`` sections of
:mod:`pipeline.config`, which every stage shares (the workload names every stage's folder).
Beside the shape: ``readers/`` (one reader per trace format), ``blockhash`` and ``tokenize``
(the prompt's block hashes), ``days`` (one UTC day at a time, for daily partitions).
"""
