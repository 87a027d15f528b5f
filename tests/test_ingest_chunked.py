"""A trace file read in chunks of records (:func:`pipeline.ingest.stage.read_stage`) publishes
what the whole-file read publishes, byte for byte, JSON Lines and CSV alike: bad lines in several
chunks keep their real line numbers, a repeated id in a later chunk loses to the first, arrivals
out of order across a chunk boundary are counted; and each chunk's rows are staged as a file of
their own."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.hashing import SAMPLE_SALT
from pipeline.ingest import stage
from pipeline.ingest.config import TraceColumns
from pipeline.ingest.readers import ReadContext, SourceFile, detect_reader
from pipeline.ingest.readers import source as source_module
from pipeline.ingest.readers.base import drain
from pipeline.ingest.readers.columns import ColumnsReader
from pipeline.layout import WorkloadLayout
from pipeline.store import STAGED_READS_PREFIX
from tests.test_ingest_outofcore import _inputs, _published

REPO = Path(__file__).resolve().parents[1]


def _token_ids(ts: int, request_id: str) -> str:
    return json.dumps(
        {"ts": ts, "request_id": request_id, "prompt_token_ids": [1, 2, 3], "output_tokens": 2}
    )


# Records (non-blank lines) 1-3 | 4-6 | 7-8 at three records a chunk: the bad lines (2, 8) in the
# first and last chunk, `a` (line 1) repeated in the second (line 5), `b` (line 3) in the third
# (line 9), and line 4 arriving before line 3 across the first boundary.
HAND_MADE = [
    _token_ids(10, "a"),
    "{not json",
    _token_ids(12, "b"),
    _token_ids(11, "c"),
    _token_ids(13, "a"),
    "",
    _token_ids(14, "d"),
    "{not json",
    _token_ids(9, "b"),
]


# The same trace as a CSV whose columns the trace entry names: the header is line 1, so each
# record sits a line further down; its bad lines are a count that is no integer (line 3) and a
# line a field short (line 9). A quoted field, a CR before a newline and an unterminated last
# line on the way.
HAND_MADE_CSV = [
    "ts,id,prompt,output",
    "10,a,3,2",
    "11,x,oops,2",
    "12,b,3,2",
    '11,"c",3,2',
    "13,a,3,2",
    "",
    "14,d,3,2\r",
    "15,e,3",
    "9,b,3,2",
]
CSV_COLUMNS = TraceColumns.model_validate(
    {"arrival": "ts", "request_id": "id", "prompt_tokens": "prompt", "output_tokens": "output"}
)


def _hand_made(tmp_path: Path, form: str) -> tuple[stage.IngestInputs, int, list[str]]:
    """The hand-made trace as JSON Lines or as CSV: its inputs, how many lines further down
    than in the JSON Lines its records sit, and why its two bad lines are quarantined."""
    if form == "jsonl":
        path = tmp_path / "trace.jsonl"
        path.write_text("\n".join(HAND_MADE) + "\n")
        return _inputs([path]), 0, ["invalid_json", "invalid_json"]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(HAND_MADE_CSV))
    inputs = stage.IngestInputs(
        (SourceFile.of(path),),
        (ColumnsReader(CSV_COLUMNS),),
        ReadContext(salt=b"s"),
        anchor_is_default=True,
    )
    return inputs, 1, ["not_an_integer", "wrong_field_count"]


def _publish_chunked(inputs: stage.IngestInputs, layout: WorkloadLayout, records: int) -> None:
    planned, skipped = stage.plan(inputs)
    staged = [stage.read_stage(inputs, p, layout, records=records) for p in planned]
    stage.merge_publish(inputs, staged, skipped, layout)


@pytest.mark.parametrize("form", ["jsonl", "csv"])
@pytest.mark.parametrize("records", [1, 2, 3, 1000])
def test_hand_made_trace_in_chunks_publishes_the_same_bytes(
    tmp_path: Path, records: int, form: str
) -> None:
    inputs, below, bad = _hand_made(tmp_path, form)
    whole, chunked = WorkloadLayout(tmp_path / "whole"), WorkloadLayout(tmp_path / "chunked")
    stage.write(stage.run(inputs), whole)
    _publish_chunked(inputs, chunked, records)
    assert _published(chunked) == _published(whole)
    quarantine = pl.read_parquet(chunked.ingest.quarantine)
    assert quarantine.select("source_line", "reason").rows() == [
        (2 + below, bad[0]),
        (5 + below, "duplicate_request_id"),
        (8 + below, bad[1]),
        (9 + below, "duplicate_request_id"),
    ]
    summary = json.loads(chunked.ingest.summary.read_text())
    assert (summary["records_read"], summary["ingested"], summary["out_of_order"]) == (8, 4, 1)
    kept = pl.read_parquet(chunked.ingest.part(0))
    assert kept.select("request_id", "source_line").rows() == [
        ("a", 1 + below),
        ("c", 4 + below),
        ("b", 3 + below),
        ("d", 7 + below),
    ]
    assert not list(chunked.root.glob(f"{STAGED_READS_PREFIX}*/*"))  # cleared once published


@pytest.mark.parametrize("form", ["jsonl", "csv"])
@pytest.mark.parametrize(("records", "files"), [(1, 6), (3, 3), (1000, 1)])
def test_each_chunk_is_staged_as_its_own_file(
    tmp_path: Path, records: int, files: int, form: str
) -> None:
    """Rows per chunk at three records a chunk: records 1, 3 | 4, 5, 7 | 9 of the JSON Lines
    (a line further down in the CSV); at one a chunk the chunks of a bad line hold no rows and
    stage no file."""
    inputs, _, _ = _hand_made(tmp_path, form)
    (planned,), _ = stage.plan(inputs)
    staged = stage.read_stage(inputs, planned, WorkloadLayout(tmp_path / "w"), records=records)
    assert len(staged.files) == files
    heights = [pl.read_parquet(p).height for p in staged.files]
    assert sum(heights) == 6 and staged.read.result.quarantine.height == 2
    if records == 3:
        assert heights == [2, 3, 1]
    assert_frame_equal(
        pl.concat([pl.read_parquet(p) for p in staged.files]),
        stage.read_one(inputs, planned).result.requests,
    )


@pytest.mark.parametrize("block_bytes", [source_module.CHUNK_BYTES, 700])
@pytest.mark.parametrize("records", [1, 7, 11])
def test_reader_chunks_make_the_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, records: int
) -> None:
    """Mooncake (scanned block by block) and tracelab (line by line): the chunks, each at most
    ``records`` records, concatenate to the rows the whole read returns, with its quarantine
    and counts; chunk and block boundaries fall anywhere relative to each other."""
    monkeypatch.setattr(source_module, "CHUNK_BYTES", block_bytes)
    mooncake = tmp_path / "mooncake.jsonl"
    lines = (REPO / "traces/mooncake/conversation_trace.jsonl").read_text().splitlines()[:300]
    lines[40] = "{broken"
    lines[41] = ""
    lines[200] = json.dumps({"timestamp": -5, "input_length": 1, "output_length": 1})
    mooncake.write_text("\n".join(lines) + "\n")
    ctx = ReadContext(salt=b"s")
    for source in (
        SourceFile.of(mooncake),
        SourceFile.of(REPO / "traces/tracelab/round_trace.jsonl"),
    ):
        reader = detect_reader(source)
        whole = reader.read(source, ctx)
        chunks: list[pl.DataFrame] = []
        rest = drain(reader.read_chunks(source, ctx, records), chunks.append)
        assert len(chunks) > 1
        assert all(chunk.height <= records for chunk in chunks)
        assert_frame_equal(pl.concat(chunks), whole.requests)
        assert_frame_equal(rest.quarantine, whole.quarantine)
        assert rest.records_read == whole.quarantine.height
        assert sum(c.height for c in chunks) + rest.records_read == whole.records_read
        assert (rest.prompt_blocks_capped, rest.notes) == (
            whole.prompt_blocks_capped,
            whole.notes,
        )
    assert whole.records_read > 0


@pytest.mark.parametrize("block_bytes", [source_module.CHUNK_BYTES, 700])
@pytest.mark.parametrize("records", [1, 7, 11])
def test_csv_chunks_make_the_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, records: int
) -> None:
    """An Azure CSV read a block of lines at a time: the chunks, each at most ``records``
    records, concatenate to the rows the read of the file as one block returns, with its
    quarantine (lines numbered as in the file) and counts; a block with a byte Polars would
    misread splits its lines in Python, the others in Polars."""
    lines = (REPO / "traces/azure-code/AzureLLMInferenceTrace_code.csv").read_bytes()
    rows = lines.split(b"\n")[:120]
    rows[10] = b""  # blank: not a record
    rows[20] += b",1"  # a field too many
    rows[30] = b"\xff" + rows[30]  # not UTF-8
    rows[40] = rows[40].replace(b",", b",\x1f", 1)  # a unit separator: Python splits the lines
    path = tmp_path / "azure.csv"
    path.write_bytes(b"\n \n" + b"\n".join(rows))  # header on line 3; the last line unterminated
    source, ctx = SourceFile.of(path), ReadContext()
    reader = detect_reader(source)
    whole = reader.read(source, ctx)
    assert whole.quarantine.select("source_line", "reason").rows() == [
        (23, "wrong_field_count"),
        (33, "invalid_utf8"),
        (43, "not_an_integer"),
    ]
    monkeypatch.setattr(source_module, "CHUNK_BYTES", block_bytes)
    chunks: list[pl.DataFrame] = []
    rest = drain(reader.read_chunks(source, ctx, records), chunks.append)
    assert len(chunks) > 1
    assert all(chunk.height <= records for chunk in chunks)
    assert_frame_equal(pl.concat(chunks), whole.requests)
    assert_frame_equal(rest.quarantine, whole.quarantine)
    assert sum(c.height for c in chunks) + rest.records_read == whole.records_read == 118
    assert (rest.prompt_blocks_capped, rest.notes) == (0, ())


def test_bundled_samples_in_small_chunks_publish_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_publish`` (``enginefit ingest``) at 97 records a chunk, the Azure CSV as the JSON
    Lines files."""
    monkeypatch.setattr(stage, "CHUNK_RECORDS", 97)
    traces = [
        REPO / "traces/mooncake/conversation_trace.jsonl",
        REPO / "traces/azure-code/AzureLLMInferenceTrace_code.csv",
        REPO / "traces/tracelab/round_trace.jsonl",
    ]
    inputs = _inputs(traces, SAMPLE_SALT)
    whole, chunked = WorkloadLayout(tmp_path / "whole"), WorkloadLayout(tmp_path / "chunked")
    stage.write(stage.run(inputs), whole)
    stage.run_publish(inputs, chunked)
    assert _published(chunked) == _published(whole)


def test_chunks_of_decoded_and_of_scanned_rows_merge_alike(tmp_path: Path) -> None:
    """Mooncake lines the scanner leaves to ``json`` (an escaped key) fill the first chunk, clean
    ones the second: the staged files of both kinds are one table to the merge."""
    clean = {"timestamp": 5, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]}
    escaped = json.dumps(clean).replace('"timestamp"', '"time\\u0073tamp"')
    lines = [escaped] * 3 + [json.dumps({**clean, "timestamp": 6 + i}) for i in range(3)]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("\n".join(lines) + "\n")
    inputs = _inputs([path])
    whole, chunked = WorkloadLayout(tmp_path / "whole"), WorkloadLayout(tmp_path / "chunked")
    stage.write(stage.run(inputs), whole)
    _publish_chunked(inputs, chunked, 3)
    assert _published(chunked) == _published(whole)
    assert json.loads(chunked.ingest.summary.read_text())["ingested"] == 6
