"""Trace readers, chosen by content (never by file extension).

``READERS`` is tried in order; the first whose ``detect`` accepts the decompressed head of the
file (:meth:`SourceFile.head`: at least its first whole record) reads it. More specific formats
come before more general ones.
"""

from __future__ import annotations

from pipeline.errors import InputFormatError
from pipeline.ingest.readers.azure import AzureReader
from pipeline.ingest.readers.base import ReadContext, Reader, ReadResult
from pipeline.ingest.readers.burstgpt import BurstGPTReader
from pipeline.ingest.readers.canonical import CanonicalParquetReader
from pipeline.ingest.readers.mooncake import MooncakeReader
from pipeline.ingest.readers.openai_chat import OpenAIChatReader
from pipeline.ingest.readers.prompt_text import PromptTextReader
from pipeline.ingest.readers.source import SourceFile
from pipeline.ingest.readers.token_ids import TokenIdsReader
from pipeline.ingest.readers.tracelab import TraceLabReader

READERS: list[Reader] = [
    CanonicalParquetReader(),
    MooncakeReader(),
    TraceLabReader(),
    TokenIdsReader(),
    OpenAIChatReader(),
    PromptTextReader(),
    AzureReader(),
    BurstGPTReader(),
]

FORMAT_NAMES = [r.name for r in READERS]
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def reader_named(name: str) -> Reader:
    for reader in READERS:
        if reader.name == name:
            return reader
    raise InputFormatError(f"unknown format {name!r}; known formats: {', '.join(FORMAT_NAMES)}")


def detect_reader(source: SourceFile) -> Reader:
    head = source.head()
    if not head.strip():
        raise InputFormatError(f"{source.label}: file is empty")
    if head.startswith(UTF16_BOMS):
        raise InputFormatError(
            f"{source.label}: file is UTF-16 text; traces are read as UTF-8: convert it first "
            "(e.g. `iconv -f UTF-16 -t UTF-8`)"
        )
    for reader in READERS:
        if reader.detect(head):
            return reader
    raise InputFormatError(unrecognised_message(source.label))


def unrecognised_message(label: str) -> str:
    """What a file no reader detects gets told: each format and what it needs, then how to
    read any other CSV or JSON Lines layout (:mod:`pipeline.ingest.readers.columns`)."""
    needs = "; ".join(f"{reader.name} ({reader.needs})" for reader in READERS)
    return (
        f"{label}: unrecognised trace format; the formats and what each needs: {needs}. "
        "Any other CSV (with a header row) or JSON Lines: name its columns in the "
        f"configuration, workload.traces: [{{path: {label}, format: columns, columns: "
        "{arrival: COLUMN, prompt_tokens: COLUMN, output_tokens: COLUMN}}] "
        "(README, 'Trace formats')"
    )


__all__ = [
    "FORMAT_NAMES",
    "READERS",
    "ReadContext",
    "ReadResult",
    "Reader",
    "SourceFile",
    "detect_reader",
    "reader_named",
    "unrecognised_message",
]
