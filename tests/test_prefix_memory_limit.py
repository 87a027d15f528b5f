"""The prefix stage is out of core: under a data-size limit that the eager path (collect the whole
canonical table, then analyse it) exceeds, ``enginefit prefix`` still runs and writes the same
files as an unconstrained run.

The workload: 1M requests in multi-turn conversations over 16 shared system prompts, 32-token
blocks, 37M chain hashes (300 MB of hashes, two canonical parts). What the eager path holds
beyond the stage grows with the table (about 300 MiB a million requests here): a million leaves
the budget 140 MiB on either side at half the cost of two million. Each child process first loads
the modules and compiles (or loads) the kernels on a tiny table, then limits its data segment
(``RLIMIT_DATA``: heap and private writable mappings, which is where numpy, numba and polars'
allocator put their memory on Linux ≥ 4.7) to what it already uses plus ``BUDGET_MIB``.
Measured on the development machine: the stage needs 700-725 MiB above that baseline, the eager
path 1000-1040 MiB (its table alone holds every hash); the budget sits between them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pytest

from pipeline.cli import main
from pipeline.ingest import stage as ingest_stage
from pipeline.layout import WorkloadLayout
from pipeline.schema import conform
from tests.conftest import REPO, write_requests

resource = pytest.importorskip("resource")

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(),
    reason="RLIMIT_DATA bounds mmap'd memory (and /proc reports it) on Linux only",
)

REQUESTS = 1_000_000
BLOCK = 32
BUDGET_MIB = 860

# Run in a child: load and warm up, limit the data segment to what is in use plus the budget,
# then run the stage command ("stage") or the eager path ("eager").
HARNESS = r"""
import datetime as dt, resource, sys
from pathlib import Path
import polars as pl
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.layout import WorkloadLayout
from pipeline.prefix import stage
from pipeline.schema import conform
from pipeline.store import scan_requests

mode, workload, out, config, budget_mib = sys.argv[1:6]
settings = load_config(config).prefix
t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
tiny = pl.DataFrame(
    {"request_id": ["a", "b"], "arrival": [t0, t0], "prompt_tokens": [70, 90],
     "prefix_hashes": [[1, 2], [1, 2, 3]], "prompt_blocks": [2, 2],
     "hashes_known": [True, True], "block_size": [32, 32]},
    schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
)
stage.run(stage.inputs_from(conform(tiny)), settings)  # the kernels, loaded before the limit
with open("/proc/self/status") as status:
    in_use = next(int(l.split()[1]) for l in status if l.startswith("VmData:")) * 1024
limit = in_use + int(budget_mib) * 2**20
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
if mode == "stage":
    sys.exit(main(["prefix", workload, "--out", out, "--config", config]))
frame = scan_requests(Path(workload)).collect()  # the whole table, every column
stage.write(stage.run(stage.inputs_from(frame), settings), WorkloadLayout(Path(out)))
"""

# How an allocation failure shows: Python's MemoryError (numpy, numba), the Rust allocator's
# abort (polars), or a thread whose stack (a private mapping the limit counts) cannot be mapped.
OUT_OF_MEMORY = re.compile(
    r"MemoryError|memory allocation of \d+ bytes failed|Cannot allocate memory|out of memory"
    r"|can't start new thread",
    re.IGNORECASE,
)


def _mix(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 of (a, b): distinct pairs give distinct-looking 64-bit hashes."""
    with np.errstate(over="ignore"):
        z = a * np.uint64(0x9E3779B97F4A7C15) + b + np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def conversations(n: int, seed: int = 3) -> pl.DataFrame:
    """A canonical table of ``n`` requests sorted by arrival: conversations of geometric length
    (mean ≈ 6.7 turns) whose every turn resends the whole history (system prompt, then the
    earlier turns) plus a new message, so most hashes repeat earlier ones."""
    rng = np.random.default_rng(seed)
    turns = np.minimum(rng.geometric(0.15, size=n), 40)
    n_conv = int(np.searchsorted(np.cumsum(turns), n)) + 1
    turns = turns[:n_conv]
    turns[-1] -= int(turns.sum()) - n
    conv = np.repeat(np.arange(n_conv), turns)
    first = np.cumsum(turns) - turns
    turn = np.arange(n) - np.repeat(first, turns)
    sys_tokens = rng.integers(100, 800, 16)
    system = rng.integers(0, 16, n_conv)[conv]
    message = rng.integers(20, 200, n)
    history = np.cumsum(message) - message
    prompt = sys_tokens[system] + history - np.repeat(history[first], turns) + message
    think = rng.exponential(20e6, n).astype(np.int64)
    think[turn == 0] = 0
    waited = np.cumsum(think)
    start = rng.integers(0, 6 * 3600 * 10**6, n_conv)[conv]
    arrival = start + waited - np.repeat(waited[first], turns)
    order = np.argsort(arrival, kind="stable")
    conv, system, prompt, arrival = conv[order], system[order], prompt[order], arrival[order]
    blocks = prompt // BLOCK
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(blocks, out=offsets[1:])
    values = np.empty(int(offsets[-1]), np.uint64)
    for lo in range(0, n, 200_000):
        hi = min(n, lo + 200_000)
        lens = blocks[lo:hi]
        j = np.arange(int(offsets[hi] - offsets[lo])) - np.repeat(
            offsets[lo:hi] - offsets[lo], lens
        )
        in_system = j < np.repeat(sys_tokens[system[lo:hi]] // BLOCK, lens)
        owner = np.where(
            in_system,
            np.repeat(system[lo:hi], lens).astype(np.uint64),
            np.repeat(conv[lo:hi], lens).astype(np.uint64) + np.uint64(1 << 40),
        )
        values[offsets[lo] : offsets[hi]] = _mix(owner, j.astype(np.uint64))
    return conform(
        pl.DataFrame(
            {
                "request_id": pl.int_range(n, eager=True).cast(pl.String),
                "arrival": pl.Series(arrival, dtype=pl.Int64).cast(pl.Datetime("us", "UTC"))
                + dt.timedelta(days=20454),
                "prompt_tokens": prompt,
                "output_tokens": np.zeros(n, np.int64),
                "block_size": np.full(n, BLOCK, np.int32),
                "prefix_hashes": pl.Series(
                    pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
                ),
                "prompt_blocks": blocks.astype(np.int32),
                "hashes_known": np.ones(n, np.bool_),
            }
        )
    )


def _limited(
    mode: str, workload: Path, out: Path, config: Path
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "POLARS_MAX_THREADS": "2",  # the same thread pools (and their buffers) on any machine
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            HARNESS,
            mode,
            str(workload),
            str(out),
            str(config),
            str(BUDGET_MIB),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_stage_runs_under_a_limit_the_eager_path_exceeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = tmp_path / "workload"
    # Two parts, so the stage streams across a part's end as it does on a large ingest.
    monkeypatch.setattr(ingest_stage, "ROWS_PER_PART", REQUESTS // 2)
    write_requests(conversations(REQUESTS), workload)
    assert len(list((workload / "requests").iterdir())) == 2
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        f"workload:\n  name: w\n  traces: [unused.jsonl]\n  block_size: {BLOCK}\n"
        "  hash_salt: test-salt\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n"
    )
    free = WorkloadLayout(tmp_path / "free")
    assert main(["prefix", str(workload), "--out", str(free.root), "--config", str(config)]) == 0

    eager = _limited("eager", workload, tmp_path / "eager", config)
    assert eager.returncode != 0, "the eager path fits the limit: the test proves nothing"
    assert OUT_OF_MEMORY.search(eager.stderr), eager.stderr[-3000:]

    limited = WorkloadLayout(tmp_path / "limited")
    run = _limited("stage", workload, limited.root, config)
    assert run.returncode == 0, run.stderr[-3000:]
    files = free.prefix.files()
    assert files
    for name, path in files.items():
        assert limited.prefix.files()[name].read_bytes() == path.read_bytes(), name
