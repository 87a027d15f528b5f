"""``enginefit loadtest`` as a person runs it: on the real Mooncake trace against the stub
server, read back by ``enginefit bench``; Ctrl-C; wrong input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import polars as pl
import pytest
import yaml

from assets.bench import ASSETS as BENCH_ASSETS
from assets.bench import CHECKS as BENCH_CHECKS
from assets.resources import EnginefitStore
from perf.stub_openai_server import StubServer, run_stub_server
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.sim.blocks import sim_input
from pipeline.sim.curve import capacity_curve
from pipeline.store import read_requests
from tests.conftest import DEFAULTS, REPO, bundled_config
from tests.workloads import growing_conversations

if TYPE_CHECKING:
    from assets.definitions import GraphRun

# The workload folder's stages after prefix: the load test and the bench assets write or read
# none of them.
LATER_STAGES = ["simulation", "bench", "capacity", "decision", "whatif"]
DEPLOYMENT = ["--engine", "vllm", "--gpu-type", "H100", "--gpu-count", "1", "--price", "2.5"]


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    """One stub server process for the module, configured by each test."""
    with run_stub_server() as server:
        yield server


def test_mooncake_replay_feeds_the_bench_stage(
    bundled_graph_run: tuple[GraphRun, Path],
    stub: StubServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = bundled_config(tmp_path, "lt")
    # the results folder the bench assets read, where loadtest.out_dir (default bench-results,
    # beside the configuration) puts each run
    raw = yaml.safe_load(config.read_text())
    raw["bench"]["results"] = [str(tmp_path / "bench-results")]
    # The load test runs today: the decision is dated today too (a report cannot predate the
    # benchmark it reads).
    raw["bench"]["as_of"] = None
    config.write_text(yaml.safe_dump(raw))
    (tmp_path / "bench-results").mkdir()
    # What `enginefit ingest`, `shape` and `prefix` write on this configuration is what the
    # graph wrote on the bundled one (tests/test_stage_identity.py): its first stages' outputs,
    # copied, instead of running them again. Their seals and recorded inputs must still match.
    _, graph_data = bundled_graph_run
    workload = "mooncake-conversation"
    shutil.copytree(
        graph_data / workload,
        tmp_path / "lt" / "data" / workload,
        ignore=lambda folder, _: LATER_STAGES if Path(folder).name == workload else (),
    )
    server = stub.configure(block_size=512, model="tiny")
    code = main(
        [
            "loadtest", "--config", str(config), "--endpoint", server.url, "--model", "tiny",
            "--rates", "8", "--duration", "1.5s", "--warmup", "0.25s",
            # the sample's timestamps are bucketed to ~3 s: its own gaps are no schedule
            "--arrivals", "poisson",
            "--max-in-flight", "1", "--on-cap", "delay", *DEPLOYMENT,
        ]
    )  # fmt: skip
    totals = server.stats()["totals"]
    assert code == 0
    printed = capsys.readouterr()
    assert "enginefit loadtest: configuration:" in printed.err  # says what it used
    (out,) = (tmp_path / "bench-results").glob("loadtest-vllm-*")
    assert f"wrote {out}" in printed.out and "enginefit bench" in printed.out
    requests = pl.read_parquet(out / "loadtest-requests.parquet")
    sent = requests.height
    assert requests.get_column("ok").all() and sent == totals["requests"]
    # the stub's cache (exact vLLM rule, unbounded) hit what the replay predicts for these rows
    layout = load_config(config).layout()
    replayed = read_requests(layout).sort("arrival", maintain_order=True).head(sent).collect()
    assert sorted(requests.get_column("trace_row")) == list(range(sent))
    curve = capacity_curve(
        sim_input(replayed, latency_model=DEFAULTS.shape.latency),
        DEFAULTS.simulation,
        block_size=512,
        replicas=1,
        routing="round-robin",
    )
    assert totals["prompt_tokens"] == int(replayed.get_column("prompt_tokens").sum())
    assert totals["hit_tokens"] == curve.max_hit_tokens > 0
    # the rate file carries only measured sends; the manifest names the workload
    result = json.loads((out / "vllm-8qps.json").read_text())
    warm = int(requests.get_column("warmup").sum())
    assert result["num_prompts"] == sent - warm and result["completed"] == sent - warm
    assert result["model_id"] == "tiny" and len(result["ttfts"]) == sent - warm
    record = json.loads((out / "loadtest-run.json").read_text())
    assert record["rates"][0]["warmup"] == warm and not record["interrupted"]
    points = pl.read_parquet(out / "loadtest-points.parquet")
    assert points.height == 1 and points.item(0, "dataset") == "enginefit-trace"
    assert points.item(0, "workload") == "mooncake-conversation"
    # the bench assets read the configured results folder with no extra step, and the
    # validity checks know it is the team's own traffic
    assert dg.materialize(
        [*BENCH_ASSETS, *BENCH_CHECKS],
        resources={"store": EnginefitStore(config_path=str(config))},
        raise_on_error=True,
    ).success
    loaded = pl.read_parquet(layout.bench.load_points)
    assert loaded.get_column("dataset").to_list() == ["enginefit-trace"]
    findings = pl.read_parquet(layout.bench.findings).filter(pl.col("check") == "prefix_structure")
    assert findings.item(0, "status") == "ok"
    assert "enginefit loadtest" in findings.item(0, "message")


def _canonical(tmp_path: Path) -> Path:
    path = tmp_path / "conversations.parquet"
    growing_conversations(40, 4, extra_tokens=3, output_tokens=8).write_parquet(path)
    return path


def _wait_for_arrivals(server: StubServer, proc: subprocess.Popen[bytes], count: int) -> None:
    """Until the server has received ``count`` requests; the deadline only catches a hang."""
    deadline = time.monotonic() + 120
    while len(server.stats()["requests"]) < count:
        assert proc.poll() is None, "the load test ended before sending"
        assert time.monotonic() < deadline, f"fewer than {count} requests in 120 s"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_keeps_what_was_measured(stub: StubServer, tmp_path: Path, signum: int) -> None:
    trace, out = _canonical(tmp_path), tmp_path / "run"
    server = stub.configure(ttft_ms=300)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "pipeline.cli", "loadtest", str(trace),
            "--endpoint", server.url, "--model", "stub-model", "--rates", "5,10",
            "--duration", "60s", "--warmup", "0", *DEPLOYMENT, "--out", str(out),
            # one request at a time: the second reaching the server means the first was
            # answered and measured
            "--max-in-flight", "1", "--on-cap", "delay",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # The signal handlers are in place before the first request is sent, so once requests
    # arrive the signal is the run's to handle, however slowly the process started.
    _wait_for_arrivals(server, proc, 2)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr and b"stopping, writing what was measured" in stderr
    record = json.loads((out / "loadtest-run.json").read_text())
    assert record["interrupted"] and record["rate_files"] == []  # a cut rate is no load point
    requests = pl.read_parquet(out / "loadtest-requests.parquet")
    kinds = requests.get_column("error_kind")
    assert (kinds == "interrupted").sum() > 0 and requests.get_column("ok").sum() > 0
    assert requests.height == record["rates"][0]["planned"]  # every planned send accounted for


WRONG_INPUT = [
    (["--rates", "0,1"], "--rates: "),
    (["--rates", "0.3333333,0.33333334"], "listed twice"),
    (["--duration", "soon"], "--duration: "),
    (["--api", "grpc"], "--api"),
    (["--engine", "vllm"], "--gpu-type, --gpu-count required"),
    (["--engine", ""], "--engine must not be empty"),
    (["--gpu-count", "0"], "--gpu-count must be a whole number from 1"),
    (["--price", "-3"], "--price must be a price of 0 to 1000 $/GPU-hour"),
    (["--endpoint", "localhost:8000"], "--endpoint: expected an http(s) URL"),
    (["--endpoint", "http://127.0.0.1:99999/v1"], "a port is 1 to 65535"),
    (["--endpoint", "http://alice:pw@127.0.0.1:9/v1"], "credentials in the URL"),
    (["--api-key-env", "ENGINEFIT_TEST_UNSET_VAR"], "that environment variable is not set"),
    (["--rates", "0.01", "--duration", "1s", "--warmup", "60s"], "nothing would be measured"),
]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize(("flags", "message"), WRONG_INPUT)
def test_wrong_input_is_one_line_before_anything_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
    dry_run: bool,
) -> None:
    given = dict(zip(DEPLOYMENT[::2], DEPLOYMENT[1::2], strict=True))
    if flags[0] == "--engine" and len(flags) == 2 and flags[1] == "vllm":
        given = {}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        given[flag] = value
    argv = ["--endpoint", "http://127.0.0.1:9", "--model", "m"]
    argv += [x for item in given.items() for x in item if item[0] not in flags[::2]]
    argv += flags + (["--dry-run"] if dry_run else [])
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["loadtest", str(_canonical(tmp_path)), *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)
    assert "replaying" not in "\n".join(err)  # refused before anything was sent


def test_a_server_that_is_down_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["loadtest", str(_canonical(tmp_path)), "--endpoint", "http://127.0.0.1:9/v1"]
    assert main([*argv, "--model", "m", *DEPLOYMENT]) == 2
    assert "cannot reach the server" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_server_that_accepts_and_never_answers_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It is listening: "cannot reach the server … is it running?" was wrong. The kernel
    completes the handshake for a listening socket's backlog, and nothing ever answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        argv = ["loadtest", str(_canonical(tmp_path)), "--endpoint", endpoint, "--model", "m"]
        assert main([*argv, "--read-timeout", "1s", *DEPLOYMENT]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"enginefit: error: --endpoint {endpoint}/completions: the server accepted the "
        f"connection but did not answer GET {endpoint}/models within 1 s (--read-timeout, "
        "loadtest.read_timeout); is it stuck, or still loading the model? Raise --read-timeout "
        "to wait longer"
    )
    assert "Traceback" not in err


def test_a_run_where_nothing_completes_says_why_and_fails(
    stub: StubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    server = stub.configure(error_every=1, error_status=422)
    code = main(
        [
            "loadtest", str(_canonical(tmp_path)), "--endpoint", server.url,
            "--model", "stub-model", "--rates", "10", "--duration", "1s", "--warmup", "0",
            *DEPLOYMENT, "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "requests failed as http_422" in err and "--length-control ''" in err
    record = json.loads((out / "loadtest-run.json").read_text())
    assert record["rates"][0]["completed"] == 0 and record["rates"][0]["errors"]["http_422"] > 0
    assert "NaN" not in (out / "vllm-10qps.json").read_text()  # strict JSON, even with no answer


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    import datetime as dt

    from pipeline.loadtest.result import Deployment
    from pipeline.loadtest.stage import claim_folder, run_folder

    started = dt.datetime(2026, 11, 30, 8, 0, 0, tzinfo=dt.UTC)
    first = run_folder(tmp_path, Deployment("vllm", "H100", 1), started)
    claim_folder(first)
    second = run_folder(tmp_path, Deployment("vllm", "H100", 1), started)
    assert first.root.name == "loadtest-vllm-20261130-080000"
    assert second.root.name == "loadtest-vllm-20261130-080000-2"


def test_an_existing_folder_is_never_written_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["loadtest", str(_canonical(tmp_path)), "--endpoint", "http://127.0.0.1:9"]
    code = main([*argv, "--model", "m", *DEPLOYMENT, "--out", str(out)])
    assert code == 2 and "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_dry_run_prints_the_plan_and_sends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _canonical(tmp_path)
    argv = ["loadtest", str(trace), "--rates", "2,4", "--duration", "5s", "--dry-run"]
    argv += ["--endpoint", "http://127.0.0.1:9/v1", "--model", "m", *DEPLOYMENT]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "40 requests loaded" in err and "hashed prompt blocks of 16 tokens" in err
    assert list(tmp_path.glob("bench-results*")) == []
