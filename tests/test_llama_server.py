"""llama.cpp's C++ llama-server, the real batching engine `make validate` measures: what the
validation relies on, checked on the tiny model.

Skipped when the server is not built on this machine (`make engine`) or gguf is missing;
`make test` sets ENGINEFIT_REQUIRE_ENGINE=1, and then a missing engine is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
import yaml

from perf.validate import Mix, bench_settings, judge, poisson_arrivals, record_engine_args
from pipeline.cli import main
from pipeline.loadtest.plan import WORDS
from tests.llama_cpp_server import (
    LlamaServer,
    LlamaServerFlags,
    llama_server_binary,
    run_llama_server,
)

_MISSING = (
    None
    if llama_server_binary() is not None and importlib.util.find_spec("gguf") is not None
    else "llama-server is not built here or gguf is not installed (make engine)"
)
if _MISSING and os.environ.get("ENGINEFIT_REQUIRE_ENGINE") == "1":
    raise RuntimeError(f"ENGINEFIT_REQUIRE_ENGINE=1 but {_MISSING}")
if _MISSING:
    pytest.skip(_MISSING, allow_module_level=True)

from tests.tiny_gguf import write_tiny_llama_gguf  # noqa: E402 (needs gguf, checked above)

FLAGS = LlamaServerFlags(slots=2, ctx_size=2 * 2048, batch_size=128, ubatch_size=128, threads=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    folder = tmp_path_factory.mktemp("llama-server")
    model = write_tiny_llama_gguf(folder / "tiny-words.gguf", words=WORDS)
    with run_llama_server(model, FLAGS, log_path=folder / "server.log") as running:
        yield running


def _complete(server: LlamaServer, prompt: str, tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": server.model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
    with httpx.Client(timeout=60.0) as client:
        response = client.post(f"{server.url}/completions", json={**body, **extra})
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_server_reports_its_model_and_flags(server: LlamaServer) -> None:
    assert server.model == "tiny-words"
    assert server.command[0] == "llama-server"
    assert server.engine_args["max_num_seqs"] == 2
    assert server.engine_args["max_num_batched_tokens"] == 128


def test_every_load_test_word_is_one_token(server: LlamaServer) -> None:
    words = list(WORDS)
    reply = _complete(server, " ".join(words), 1)
    # BOS + one token a word: a planned prompt of N words is N + 1 tokens to the server
    assert reply["usage"]["prompt_tokens"] == len(words) + 1


def test_ignore_eos_gives_exactly_the_tokens_asked(tmp_path: Path) -> None:
    # A model that ends most answers at once: ignore_eos still runs to max_tokens.
    model = write_tiny_llama_gguf(tmp_path / "eager-eos.gguf", eos_bias=3.0, words=WORDS)
    with run_llama_server(model, FLAGS) as eager:
        lengths = {_complete(eager, "the test", 40)["usage"]["completion_tokens"] for _ in range(4)}
    assert lengths == {40}


def test_a_repeated_prefix_is_served_from_the_slot(server: LlamaServer) -> None:
    prefix = " ".join(WORDS[:300])
    _complete(server, prefix + " model test", 2)
    again = _complete(server, prefix + " water time", 2)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 300 <= cached <= 302  # BOS and the 300 shared words, not the new ending
    assert again["timings"]["cache_n"] == cached


def test_two_slots_decode_at_the_same_time(server: LlamaServer) -> None:
    # Continuous batching: a short request sent while a long one streams is answered before
    # the long one ends; with one slot it would wait for the long one's 1,900 tokens. Decided
    # by which ends first, not by a clock, so a busy machine slows both alike.
    streaming, long_ended, let_go = threading.Event(), threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def stream_long() -> None:
        try:
            read_long()
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, in the test's thread
            failed.append(exc)

    def read_long() -> None:
        body = {
            "model": server.model,
            "prompt": "request long " + " ".join(WORDS[:50]),
            "max_tokens": 1900,
            "ignore_eos": True,
            "stream": True,
        }
        with (
            httpx.Client(timeout=300.0) as client,
            client.stream("POST", f"{server.url}/completions", json=body) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    streaming.set()
                if let_go.is_set():
                    return  # the connection closed: the server stops it
        long_ended.set()

    long = threading.Thread(target=stream_long)
    long.start()
    try:
        assert streaming.wait(120), "the long request never streamed a token"
        short = _complete(server, "request short " + " ".join(WORDS[50:60]), 8)
        answered_first = not long_ended.is_set()
    finally:
        let_go.set()
        long.join(300)
    assert not failed, f"the long request failed: {failed[0]!r}"
    assert short["usage"]["completion_tokens"] == 8
    assert answered_first, "the short request waited for the long one: one slot at a time"


def test_a_load_test_of_it_reads_back_with_its_engine_args(
    server: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "short.parquet"
    Mix("short", prompt=(20, 40), output=(8, 12)).trace(0, poisson_arrivals(300, 0)).write_parquet(
        trace
    )
    folder = tmp_path / "run"
    argv = [
        "loadtest", str(trace), "--endpoint", server.url, "--model", server.model,
        # about 48 measured requests, the same as 8 req/s for 6 s, in half the time
        "--rates", "16", "--duration", "3s", "--warmup", "0.5s", "--arrivals", "poisson",
        "--length-control", "ignore_eos", "--engine", "llama.cpp", "--gpu-type", "cpu",
        "--gpu-count", "1", "--price", "0.05", "--out", str(folder),
    ]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    record_engine_args(folder, server)
    requests = pl.read_parquet(folder / "loadtest-requests.parquet").filter(pl.col("ok"))
    # llama-server sends usage: tokens are its count, not chunks
    assert set(requests.get_column("output_tokens_source")) == {"usage"}
    assert (requests.get_column("output_tokens") == requests.get_column("max_tokens")).all()
    (probe,) = judge([folder], bench_settings())
    assert probe.rate_rps == pytest.approx(16.0, rel=0.3)
    assert probe.completed >= 30
    assert probe.status in {"pass", "fail", "unknown"}
    manifest = yaml.safe_load((folder / "enginefit-bench.yaml").read_text(encoding="utf-8"))
    assert manifest["engine_args"] == FLAGS.engine_args()
