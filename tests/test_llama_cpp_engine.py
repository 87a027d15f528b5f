"""Smoke test of the real CI engine: llama-cpp-python's OpenAI-compatible server on a tiny GGUF.

Skipped when the optional engine is not installed (llama-cpp-python[server], and gguf to write
the model); see tests/llama_cpp_server.py for how the server behaves on the wire.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from pipeline.cli import main
from pipeline.loadtest.client import ClientOptions, run_schedule
from pipeline.loadtest.stage import _new_loop
from tests.llama_cpp_server import LlamaServer, llama_cpp_available, run_llama_cpp_server
from tests.workloads import growing_conversations

# `make test` installs the engine extra and sets ENGINEFIT_REQUIRE_ENGINE=1: there a missing
# engine is a broken install and fails; elsewhere (a bare `pytest`) the module is skipped.
_MISSING = (
    None
    if llama_cpp_available() and importlib.util.find_spec("gguf") is not None
    else "llama-cpp-python[server] and gguf are not installed (pip install -e '.[engine]')"
)
if _MISSING and os.environ.get("ENGINEFIT_REQUIRE_ENGINE") == "1":
    raise RuntimeError(f"ENGINEFIT_REQUIRE_ENGINE=1 but {_MISSING}")
if _MISSING:
    pytest.skip(_MISSING, allow_module_level=True)

# Imported only now: it needs gguf, checked above.
from tests.tiny_gguf import write_tiny_llama_gguf  # noqa: E402

N_TOKENS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    # One server for the module: start-up is ~0.5 s, each request a few ms on the tiny model.
    model = write_tiny_llama_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with run_llama_cpp_server(model) as running:
        yield running


def _stream(server: LlamaServer, path: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of one streamed request, in order."""
    payloads: list[str] = []
    with (
        httpx.Client(timeout=30.0) as client,
        client.stream("POST", f"{server.url}/{path}", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                payloads.append(line.removeprefix("data: "))
    return payloads


def test_server_reports_the_model(server: LlamaServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    assert server.url.endswith("/v1")
    assert server.model == "tiny"


def test_completion_streams_exactly_the_requested_tokens(server: LlamaServer) -> None:
    body = {
        "model": server.model,
        "prompt": "The server was used to test the model",
        "max_tokens": N_TOKENS,
        # min_tokens masks EOS until then, so the reply length is exact whatever the weights.
        "min_tokens": N_TOKENS,
        "stream": True,
    }
    payloads = _stream(server, "completions", body)

    assert payloads[-1] == "[DONE]"
    choices = [json.loads(p)["choices"][0] for p in payloads[:-1]]
    content = [c for c in choices if c["finish_reason"] is None]
    # One chunk per token: the tiny model never samples byte tokens, which would hold text back.
    assert len(content) == N_TOKENS
    assert all(c["text"] for c in content)
    # A complete stream closes with an empty chunk that carries the finish reason.
    assert choices[-1] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}


def test_chat_stream_has_role_content_and_finish_chunks(server: LlamaServer) -> None:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me about the test"}],
        "max_tokens": N_TOKENS,
        "min_tokens": N_TOKENS,
        "stream": True,
    }
    payloads = _stream(server, "chat/completions", body)

    assert payloads[-1] == "[DONE]"
    choices = [json.loads(p)["choices"][0] for p in payloads[:-1]]
    assert choices[0]["delta"] == {"role": "assistant"}
    assert [bool(c["delta"].get("content")) for c in choices[1:-1]] == [True] * N_TOKENS
    assert choices[-1]["delta"] == {}
    assert choices[-1]["finish_reason"] == "length"


def test_replay_at_two_rates_feeds_a_capacity_table(
    server: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = tmp_path / "conversations.parquet", tmp_path / "run"
    growing_conversations(400, 20, extra_tokens=5, output_tokens=N_TOKENS).write_parquet(trace)
    argv = [
        "loadtest", str(trace), "--endpoint", server.url, "--model", server.model,
        # A few dozen requests a rate: the properties below hold request by request, and the
        # bench stage reads a point of any size (its verdict may be "unknown").
        "--rates", "10,20", "--duration", "2s", "--warmup", "0.5s",
        "--engine", "llama.cpp", "--gpu-type", "cpu", "--gpu-count", "1", "--price", "0.1",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # llama.cpp sends no usage in a stream: counted by chunks, and said so
    assert "carried no usage" in printed
    requests = pl.read_parquet(out / "loadtest-requests.parquet")
    done = requests.filter(pl.col("ok"))
    assert done.height >= 0.95 * requests.height
    assert set(done.get_column("output_tokens_source")) == {"chunks"}
    # it honours min_tokens: every answer is as long as the trace asked
    assert (done.get_column("output_tokens") == done.get_column("max_tokens")).all()
    assert main(["bench", str(out), "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    points = analysis["points"]
    assert sorted(p["offered_rate_rps"] for p in points) == [10.0, 20.0]
    assert all(p["point_id"].startswith("vllm_bench_serve:") for p in points)
    assert {p["slo_status"] for p in points} <= {"pass", "fail", "unknown"}
    assert len(analysis["capacity"]) == 1  # one candidate: llama.cpp on cpu
    assert analysis["capacity"][0]["candidate"].startswith("llama.cpp /")


def test_an_interrupted_stream_is_reported_as_cut(tmp_path: Path) -> None:
    # With interrupt_requests on (the package default), a second request silently ends the
    # stream in flight: status 200, [DONE], but no finish_reason.
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    with run_llama_cpp_server(model, interrupt_requests=True) as running:
        # The first stream is long enough to still run when the second arrives; the second,
        # served in full afterwards, is short (its length is not what is tested).
        bodies = [
            json.dumps(
                {"model": running.model, "prompt": "the test", "max_tokens": tokens,
                 "min_tokens": tokens, "stream": True}
            ).encode()
            for tokens in (2000, N_TOKENS)
        ]  # fmt: skip
        options = ClientOptions(
            f"{running.url}/completions", "completions", 10, 30, 120, None, "drop",
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            outcomes = runner.run(run_schedule([0.0, 0.3], bodies.__getitem__, options))
    first = outcomes[0]
    assert first.error_kind in {"cut_stream_silent", "cut_stream"}
    assert 0 < len(first.chunk_times) < 2000
    assert outcomes[1].error_kind is None and len(outcomes[1].chunk_times) == N_TOKENS
