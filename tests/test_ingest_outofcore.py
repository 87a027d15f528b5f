"""The out-of-core merge of staged reads publishes what the eager merge publishes, byte for byte:
request parts, quarantine, summary and manifest, on the bundled samples and on generated
multi-file traces with quarantined records, repeated ids and arrivals out of order."""

from __future__ import annotations

import hashlib
import io
import json
import random
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from pipeline.hashing import SAMPLE_SALT
from pipeline.ingest import stage
from pipeline.ingest.compute import expand_paths, merge_reads
from pipeline.ingest.outofcore import _as_sliced
from pipeline.ingest.readers import ReadContext
from pipeline.layout import WorkloadLayout
from pipeline.store import STAGED_READS_PREFIX, read_requests

REPO = Path(__file__).resolve().parents[1]


def _inputs(paths: list[Path], salt: bytes = b"s") -> stage.IngestInputs:
    sources = tuple(expand_paths(paths))
    return stage.IngestInputs(
        sources, tuple("auto" for _ in sources), ReadContext(salt=salt), anchor_is_default=True
    )


def _published(layout: WorkloadLayout) -> dict[str, str]:
    files = [*layout.ingest.parts(), layout.ingest.quarantine, layout.ingest.summary]
    files.append(layout.ingest.manifest)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _both(inputs: stage.IngestInputs, root: Path, *, reverse: bool = False) -> None:
    """Eager (the staged reads read back whole and merged, then written; and the command's
    merge of the reads as read) and out of core (the staged reads merged part by part) into
    three folders; all must publish the same bytes."""
    planned, skipped = stage.plan(inputs)
    eager_layout, streamed_layout = WorkloadLayout(root / "eager"), WorkloadLayout(root / "ooc")
    reads = [stage.read_one(inputs, p) for p in planned]
    command_layout = WorkloadLayout(root / "command")
    stage.write(
        merge_reads(
            reads, inputs.context, skipped=skipped, anchor_is_default=inputs.anchor_is_default
        ),
        command_layout,
    )
    eager_staged = [stage.stage_read(read, eager_layout) for read in reads]
    eager = stage.merge(inputs, eager_staged, skipped)
    stage.write(eager, eager_layout)
    staged = [stage.stage_read(stage.read_one(inputs, p), streamed_layout) for p in planned]
    merged = stage.merge_publish(
        inputs, staged[::-1] if reverse else staged, skipped, streamed_layout
    )
    assert merged.summary == eager.summary
    assert_frame_equal(merged.preview, eager.requests.head(stage.PREVIEW_ROWS))
    # The preview holds its own rows, not the first part's buffers to the end of the merge.
    chains = merged.preview["prefix_hashes"]
    assert len(chains.to_arrow().values) == chains.list.len().sum()
    assert_frame_equal(read_requests(streamed_layout).collect(), eager.requests)
    assert_frame_equal(pl.read_parquet(streamed_layout.ingest.quarantine), eager.quarantine)
    assert _published(streamed_layout) == _published(eager_layout)
    assert _published(command_layout) == _published(eager_layout)
    # The staged rows are gone once merged, as when the eager merge's set was published.
    assert not list(streamed_layout.root.glob(f"{STAGED_READS_PREFIX}*/*"))


@pytest.mark.parametrize("rows_per_part", [1_000_000, 997])
def test_bundled_samples_merge_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows_per_part: int
) -> None:
    monkeypatch.setattr(stage, "ROWS_PER_PART", rows_per_part)
    traces = [
        REPO / "traces/mooncake/conversation_trace.jsonl",
        REPO / "traces/azure-code/AzureLLMInferenceTrace_code.csv",
        REPO / "traces/tracelab/round_trace.jsonl",
    ]
    _both(_inputs(traces, SAMPLE_SALT), tmp_path)


def _trace(path: Path, rng: random.Random, ids: list[str], lines: int) -> None:
    """Token-id JSONL: arrivals mostly rising with jumps back, many equal timestamps, ids drawn
    from a shared pool (repeats within and across files) and some unusable lines."""
    ts = rng.randint(0, 50)
    out = []
    for line in range(lines):
        ts += rng.choice([0, 0, 1, 2, 3, -7])
        kind = rng.random() if line else 1.0  # the first line tells the format
        if kind < 0.04:
            out.append("{not json")
        elif kind < 0.07:
            out.append(json.dumps({"ts": ts, "request_id": "bad", "output_tokens": 1}))
        else:
            tokens = [rng.randint(0, 99) for _ in range(rng.randint(1, 40))]
            record = {"ts": max(ts, 0), "request_id": rng.choice(ids), "prompt_token_ids": tokens}
            out.append(json.dumps({**record, "output_tokens": rng.randint(1, 9)}))
    path.write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rows_per_part", [10_000, 37])
def test_generated_multi_file_traces_merge_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, rows_per_part: int
) -> None:
    monkeypatch.setattr(stage, "ROWS_PER_PART", rows_per_part)
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(900)]
    traces = []
    for index in range(4):
        path = tmp_path / "in" / f"day{index}.jsonl"
        path.parent.mkdir(exist_ok=True)
        _trace(path, rng, ids, 250 + 40 * index)
        traces.append(path)
    traces.append(traces[1])  # given twice: read once
    inputs = _inputs(traces)
    _both(inputs, tmp_path / "out", reverse=bool(seed))
    summary = json.loads(WorkloadLayout(tmp_path / "out" / "ooc").ingest.summary.read_text())
    # What the trace is meant to exercise, so the comparison above is not vacuous.
    assert summary["duplicate_request_ids"] > 0 and summary["out_of_order"] > 0
    assert summary["quarantined_by_reason"].keys() > {"duplicate_request_id"}
    assert summary["duplicate_timestamps"] > 0 and summary["skipped_files"]
    if rows_per_part == 37:
        assert len(WorkloadLayout(tmp_path / "out" / "ooc").ingest.parts()) > 10


@pytest.mark.parametrize("rows_per_part", [997])
def test_in_order_files_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows_per_part: int
) -> None:
    """Files already in arrival order end to end (no sort in the eager merge), with equal
    timestamps across files and part boundaries; enough block ids (240k hashes, 1.9 MB) that
    the Parquet writer's page sizes depend on how the parts are laid out in memory."""
    monkeypatch.setattr(stage, "ROWS_PER_PART", rows_per_part)
    traces = []
    for index in range(3):
        path = tmp_path / f"f{index}.jsonl"
        lines = [
            json.dumps(
                {
                    "timestamp": 1000 * (4 * index + i // 1000),
                    "input_length": 512 * 20,
                    "output_length": 7,
                    "hash_ids": [(i + j) % 5000 for j in range(20)],
                }
            )
            for i in range(4000)
        ]
        path.write_text("\n".join(lines) + "\n")
        traces.append(path)
    _both(_inputs(traces), tmp_path / "out")


def test_nothing_ingested_publishes_one_empty_part(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ts": "soon", "prompt_token_ids": [1], "output_tokens": 1}\n')
    _both(_inputs([path]), tmp_path / "out")


def _parquet(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_parquet(buffer, compression="zstd", statistics=True)
    return buffer.getvalue()


def test_a_part_laid_out_as_a_slice_writes_the_whole_tables_bytes() -> None:
    """Pages of a list column follow the length of the values array its rows are a slice of:
    at 300,000 hashes the whole table's slices are cut into several pages where the parts'
    own hashes would make one, and the layout gives back the slices' bytes."""
    rows, chain, part_rows = 4_000, 75, 1_000
    hashes = np.arange(rows * chain, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)

    def table(first: int, height: int) -> pl.DataFrame:
        """Rows ``first`` on, their hashes a values array of their own."""
        offsets = pa.array(np.arange(0, height * chain + 1, chain, dtype=np.int64))
        values = pa.array(hashes[first * chain : (first + height) * chain])
        chains = pl.Series("prefix_hashes", pa.LargeListArray.from_arrays(offsets, values))
        return pl.DataFrame([chains, pl.Series("row", np.arange(first, first + height))])

    whole = table(0, rows)
    for start in range(0, rows, part_rows):
        sliced = whole.slice(start, part_rows)
        own = table(start, part_rows)
        laid_out = own.with_columns(_as_sliced(own["prefix_hashes"], rows * chain))
        assert _parquet(laid_out) == _parquet(sliced)
        assert _parquet(own) != _parquet(sliced)


@pytest.mark.skipif(
    sys.platform != "linux" or Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "2",
    reason="Linux with overcommit: mapped without reserve, untouched zeros are not committed",
)
def test_the_whole_tables_zeros_cost_no_memory() -> None:
    """A part of a workload of 2**37 hashes (1 TiB of values, more than any machine here has
    RAM and swap) is laid out and written: the values past its own are never allocated.
    (A null chain would make the writer build a validity bit for each of them: 16 GiB.)"""
    hashes = pl.Series("prefix_hashes", [[1, 2, 3], [], [4]], dtype=pl.List(pl.UInt64))
    laid_out = _as_sliced(hashes, 2**37)
    written = pl.read_parquet(_parquet(laid_out.to_frame()))
    assert_frame_equal(written, hashes.to_frame())
