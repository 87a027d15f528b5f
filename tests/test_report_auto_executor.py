"""`enginefit report --executor auto`: multiprocess past four times the flattening limit,
sized by the ingested table (its stored blocks, as the simulation counts them) or, before the
first ingest, by the trace files' bytes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml

from assets.executors import MULTIPROCESS_PAST_LIMIT, TRACE_BYTES_PER_BLOCK, auto_executor
from pipeline.commands.ingest import configured_inputs
from pipeline.config import Config, load_config
from pipeline.ingest import days
from pipeline.ingest import stage as ingest_stage
from pipeline.store import read_requests
from tests.conftest import REPO, bundled_config
from tests.test_daily_partitions import DAYS, _config, _daily_union, three_days  # noqa: F401

TRACE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"


def _with_limit(path: Path, limit: int) -> Config:
    raw = yaml.safe_load(path.read_text())
    raw.setdefault("simulation", {})["curve_exact_max_blocks"] = limit
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _chains(table: pl.LazyFrame) -> int:
    """Stored blocks counted from the data: a chain's entries, an empty or null chain one slot
    (as Parquet's metadata counts them)."""
    lengths = table.select(pl.col("prefix_hashes").list.len().fill_null(0).clip(1, None))
    return int(lengths.sum().collect().item())


def _limits(blocks: int) -> tuple[int, int]:
    """The largest limit at which ``blocks`` run in processes of their own, and the smallest at
    which they run in one."""
    return (blocks - 1) // MULTIPROCESS_PAST_LIMIT, -(-blocks // MULTIPROCESS_PAST_LIMIT)


def test_before_the_first_ingest_the_trace_bytes_decide(tmp_path: Path) -> None:
    blocks = TRACE.stat().st_size // TRACE_BYTES_PER_BLOCK
    path = bundled_config(tmp_path, "auto")
    small = auto_executor(load_config(path))
    assert small.executor == "in_process" and f"may hold {blocks:,} stored blocks" in small.reason
    below, at = _limits(blocks)
    large = auto_executor(_with_limit(path, below))
    assert large.executor == "multiprocess"
    assert large.reason.endswith(
        f"more than 4 × simulation.curve_exact_max_blocks ({4 * below:,}): "
        "each step in a process of its own"
    )
    assert auto_executor(_with_limit(path, at)).executor == "in_process"


def test_the_ingested_table_decides_once_there(tmp_path: Path) -> None:
    path = bundled_config(tmp_path, "auto")
    config = load_config(path)
    ingest_stage.write(ingest_stage.run(configured_inputs(config)), config.layout())
    stored = _chains(read_requests(config.layout()))
    # The bytes' estimate is this trace's own density: within 1 % of its table.
    assert abs(TRACE.stat().st_size // TRACE_BYTES_PER_BLOCK - stored) < stored / 100
    below, at = _limits(stored)
    kept = auto_executor(_with_limit(path, at))
    assert kept.executor == "in_process"
    assert kept.reason.startswith(f"the ingested table holds {stored:,} stored blocks, at most")
    assert auto_executor(_with_limit(path, below)).executor == "multiprocess"


def test_a_daily_workload_is_sized_by_its_days(three_days: Path, tmp_path: Path) -> None:  # noqa: F811
    config = load_config(_config(tmp_path, "none", [str(three_days / "mooncake-{day}.jsonl")]))
    assert auto_executor(config).reason == "no day of the workload is ingested yet"
    layout = _daily_union(three_days, tmp_path)
    stored = sum(_chains(read_requests(layout.day(day))) for day in DAYS)
    assert stored == _chains(read_requests(layout))
    path = tmp_path / "daily.yaml"
    below, at = _limits(stored)
    assert auto_executor(_with_limit(path, at)).reason.startswith(
        f"the ingested table holds {stored:,} stored blocks"
    )
    assert auto_executor(_with_limit(path, below)).executor == "multiprocess"
    assert days.ingested_days(layout) == list(DAYS)


def test_a_trace_that_is_not_there_sizes_nothing(tmp_path: Path) -> None:
    path = bundled_config(tmp_path, "auto")
    raw = yaml.safe_load(path.read_text())
    missing = tmp_path / "missing.jsonl"
    raw["workload"]["traces"] = [{"path": str(missing), "format": "auto"}]
    path.write_text(yaml.safe_dump(raw))
    choice = auto_executor(load_config(path))
    assert (choice.executor, choice.reason) == (
        "in_process",
        f"{missing} is not a file to size the run by (ingest says why)",
    )
