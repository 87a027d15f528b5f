"""BurstGPT CSV: ``Timestamp`` (seconds from trace start), model, token counts, log type.

Later releases add ``Session ID`` and ``Elapsed time`` (seconds); both are optional here.
``Log Type`` ("Conversation log" / "API log") says which Azure OpenAI surface served the
request; it is kept as the tenant, the only client grouping the trace has.
"""

from __future__ import annotations

from pipeline.ingest.readers.csvtable import Column, CsvReader


class BurstGPTReader(CsvReader):
    name = "burstgpt"
    description = "BurstGPT CSV (Timestamp s, Model, Request tokens, Response tokens, Log Type)"
    columns = (
        Column("Timestamp", "epoch_or_relative", "arrival"),
        Column("Model", "text", "model"),
        Column("Request tokens", "tokens", "prompt_tokens"),
        Column("Response tokens", "tokens", "output_tokens"),
        Column("Total tokens", "tokens", "_total_tokens", required=False),
        Column("Log Type", "text", "tenant"),
    )
    # The BurstGPT README spells the later column "SessionID"; the CSV header has "Session ID".
    header_aliases = {"SessionID": "Session ID", "Elapsed Time": "Elapsed time"}  # noqa: RUF012
    optional_columns = (
        Column("Session ID", "text", "session_id", required=False),
        Column("Elapsed time", "duration", "e2e_ms", required=False),
    )
