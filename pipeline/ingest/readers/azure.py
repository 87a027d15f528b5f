"""Azure LLM inference trace CSV (Splitwise): ``TIMESTAMP`` (naive wall clock), token counts."""

from __future__ import annotations

from pipeline.ingest.readers.csvtable import Column, CsvReader


class AzureReader(CsvReader):
    name = "azure"
    description = "Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens)"
    # TIMESTAMP has no zone; the dataset is Azure's and is taken as UTC (documented in README).
    columns = (
        Column("TIMESTAMP", "datetime", "arrival"),
        Column("ContextTokens", "tokens", "prompt_tokens"),
        Column("GeneratedTokens", "tokens", "output_tokens"),
    )
