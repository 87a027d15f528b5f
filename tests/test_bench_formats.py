"""Benchmark formats by registration: a tool is one reader module declaring its ``FORMAT``, its
sample under tests/data/bench/<tool> and its section in docs/bench.md#result-formats-read.
Dispatch, detection, skip notes, the unrecognised-format message and the docs' detection table
all come from the registrations, so a made-up format registered here is detected and read with
no edit anywhere else."""

from __future__ import annotations

import importlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.bench import readers
from pipeline.bench.detect import BenchFormatError, Document
from pipeline.bench.readers import FORMATS, read_bench_files
from pipeline.bench.readers._common import BenchFormat, Companion, RawPoint

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bench"
DOCS = ROOT / "docs" / "bench.md"
MANIFEST = {"engine": "vllm", "gpu_type": "H100", "gpu_count": 1}
TABLE_START = "<!-- from the readers' FORMAT declarations (tests/test_bench_formats.py) -->"
TABLE_END = "<!-- end of the FORMAT declarations -->"


def _tiny_detect(path: Path, record: Any) -> str | None:
    if isinstance(record, dict) and "tinybench_version" in record:
        return "tinybench"
    if isinstance(record, dict) and "tinybench_requests" in record:
        return "tinybench_requests"
    return None


def _tiny_read(doc: Document) -> list[RawPoint]:
    obj = doc.records[0]
    values = {"load_mode": "open", "offered_rate_rps": obj["rate"], "completed": obj["ok"]}
    values["failed"] = obj["failed"]
    return [RawPoint(record_index=0, values=values, native={"ttft_p99_ms": obj["p99_ttft"]})]


TINY = BenchFormat(
    tool="tinybench",
    title="tinybench",
    files="tiny.json",
    needs="a `tinybench_version` key",
    detect=_tiny_detect,
    read=_tiny_read,
    companions=(
        Companion("tinybench_requests", "a `tinybench_requests` key", "tinybench requests file"),
    ),
    side_files=("*.tinylog.json",),
)


def test_a_made_up_format_registered_once_is_detected_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FORMATS, TINY.tool, TINY)
    result_file = tmp_path / "tiny.json"
    tiny = {"tinybench_version": 1, "rate": 2.5, "ok": 99, "failed": 1, "p99_ttft": 80.0}
    result_file.write_text(json.dumps(tiny))
    requests = tmp_path / "tiny_requests.json"
    requests.write_text(json.dumps({"tinybench_requests": []}))
    log = tmp_path / "run.tinylog.json"
    log.write_text("not even JSON")
    result = read_bench_files([tmp_path], manifest=MANIFEST)
    row = result.load_points.row(0, named=True)
    assert result.load_points.height == 1
    assert (row["tool"], row["point_id"]) == ("tinybench", f"tinybench:{result_file}#0")
    assert (row["offered_rate_rps"], row["completed"], row["failed"]) == (2.5, 99, 1)
    assert (row["error_rate"], row["ttft_p99_ms"], row["ttft_source"]) == (0.01, 80.0, "native")
    assert (row["tpot_source"], row["tpot_definition"]) == ("missing", None)
    assert f"{log}: skipped (tool side file, not a result)" in result.notes
    assert f"{requests}: tinybench requests file" in result.notes

    stranger = tmp_path / "other" / "x.json"
    stranger.parent.mkdir()
    stranger.write_text(json.dumps({"latency": 1}))
    with pytest.raises(BenchFormatError) as caught:
        read_bench_files([stranger], manifest=MANIFEST)
    assert "; tinybench tiny.json (a tinybench_version key)" in str(caught.value)


def test_every_reader_module_is_registered() -> None:
    modules = [p.stem for p in Path(readers.__file__).parent.glob("*.py") if p.stem[0] != "_"]
    declared = [importlib.import_module(f"pipeline.bench.readers.{m}").FORMAT for m in modules]
    assert sorted(f.tool for f in declared) == list(FORMATS)
    assert len(FORMATS) == 7


@pytest.mark.parametrize("tool", list(FORMATS))
def test_every_format_has_a_sample_read_as_its_own(tool: str) -> None:
    sample = DATA / tool.replace("_", "-")
    points = read_bench_files([sample], manifest=MANIFEST).load_points
    assert points.height > 0
    assert set(points.get_column("tool")) == {tool}


def test_the_samples_written_for_this_project(tmp_path: Path) -> None:
    """The three samples no licence let us copy, read back as written (docs/bench.md units)."""
    vllm = read_bench_files([DATA / "vllm-bench-serve"], manifest=MANIFEST).load_points
    assert vllm.get_column("offered_rate_rps").to_list() == [2.0, 8.0]
    second = vllm.row(1, named=True)
    assert (second["load_mode"], second["arrival_process"], second["completed"]) == (
        "open",
        "poisson",
        800,
    )
    assert (second["ttft_p50_ms"], second["ttft_p99_ms"], second["itl_p99_ms"]) == (
        60.3,
        190.4,
        41.0,
    )
    genai = read_bench_files([DATA / "genai-perf"], manifest=MANIFEST).load_points.row(
        0, named=True
    )
    assert (genai["load_mode"], genai["concurrency"], genai["completed"]) == ("closed", 6, 235)
    assert math.isclose(genai["duration_s"], 235 / 3.91)  # count ÷ request throughput
    assert (genai["tpot_p99_ms"], genai["e2e_p95_ms"]) == (14.1, 1760.3)
    aiperf = read_bench_files([DATA / "aiperf"], manifest=MANIFEST).load_points.row(0, named=True)
    assert (aiperf["load_mode"], aiperf["arrival_process"], aiperf["offered_rate_rps"]) == (
        "open",
        "poisson",
        4.0,
    )
    assert (aiperf["completed"], aiperf["failed"], aiperf["duration_s"]) == (238, 2, 61.4)
    assert math.isclose(aiperf["error_rate"], 2 / 240)
    assert (aiperf["itl_p99_ms"], aiperf["tpot_p99_ms"]) == (27.4, 14.6)  # per gap, per request


def docs_sections() -> list[str]:
    text = DOCS.read_text(encoding="utf-8")
    part = text.split("\n## Result formats read\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^### (.+)$", part, re.M)


def test_every_format_has_a_docs_section() -> None:
    sections = docs_sections()
    assert [f.title for f in FORMATS.values() if f.title not in sections] == []


def detection_table() -> str:
    """docs/bench.md's detection table, as the registrations say it."""

    def anchor(title: str) -> str:
        return re.sub(r"[^\w-]", "", title.lower().replace(" ", "-"))

    lines = [TABLE_START, "", "| format | kind | a record is this kind when |", "|---|---|---|"]
    for f in FORMATS.values():
        over = "".join(f"; it takes precedence over `{tool}`" for tool in f.refines)
        lines.append(f"| [{f.title}](#{anchor(f.title)}) | `{f.tool}` | {f.needs}{over} |")
        lines += [f"| | `{c.kind}` | {c.rule} |" for c in f.companions]
    sides = "; ".join(
        f"{', '.join(f'`{p}`' for p in f.side_files)} ({f.title})"
        for f in FORMATS.values()
        if f.side_files
    )
    lines += ["", f"Side files, skipped with a note when a folder is expanded: {sides}.", ""]
    return "\n".join([*lines, TABLE_END])


def test_the_docs_detection_table_is_the_registrations() -> None:
    text = DOCS.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    assert text[start:end] == detection_table(), "paste this:\n" + detection_table()
