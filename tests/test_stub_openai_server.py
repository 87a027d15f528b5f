"""The stub OpenAI-compatible server the load-test harness is tested against: wire format, timing,
toy prefix cache, natural stops and every injected fault, seen from an HTTP client (httpx)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from perf.stub_openai_server import (
    SCRIPT,
    StubServer,
    _read_first_line,
    options_to_argv,
    run_stub_server,
)

Event = dict[str, Any]


def sse_payloads(body: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking every event is one ``data:`` line."""
    assert body.endswith("\n\n") or not body
    payloads = []
    for event in body.split("\n\n")[:-1]:
        assert event.startswith("data: ") and "\n" not in event, event
        payloads.append(event[len("data: ") :])
    return payloads


def events(body: str) -> list[Event]:
    """Parsed JSON chunks, after checking the stream ends with exactly one [DONE]."""
    payloads = sse_payloads(body)
    assert payloads[-1] == "[DONE]"
    assert payloads.count("[DONE]") == 1
    return [json.loads(p) for p in payloads[:-1]]


def completion(prompt: str | list[int], **extra: object) -> dict[str, object]:
    return {"model": "m", "prompt": prompt, **extra}


def chat(*contents: str, **extra: object) -> dict[str, object]:
    roles = ["system"] + ["user"] * (len(contents) - 1)
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return {"model": "m", "messages": messages, **extra}


def stream(client: httpx.Client, path: str, body: dict[str, object]) -> httpx.Response:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response


def text_of(chunks: list[Event]) -> str:
    """Concatenated generated text of completion or chat chunks."""
    out = ""
    for chunk in chunks:
        for choice in chunk["choices"]:
            out += choice.get("text") or choice.get("delta", {}).get("content") or ""
    return out


def finish_reasons(chunks: list[Event]) -> list[str]:
    return [c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    """One server process for the module: each test configures the options it wants (a start
    is most of what a test here costs); those about the process itself start their own."""
    with run_stub_server() as server:
        yield server


@pytest.fixture
def plain(stub: StubServer) -> StubServer:
    return stub.configure(block_size=4)


@pytest.fixture
def client(plain: StubServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=plain.url, timeout=10) as c:
        yield c


# --------------------------------------------------------------------------- wire format


def test_streamed_completion_wire_format(client: httpx.Client) -> None:
    chunks = events(stream(client, "/completions", completion("a b c", max_tokens=3)).text)
    assert [c["choices"][0]["text"] for c in chunks] == [" tok", " tok", " tok", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all(c["object"] == "text_completion" and c["model"] == "m" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)  # not asked for


def test_streamed_completion_usage_chunk_when_asked(client: httpx.Client) -> None:
    body = completion("a b c", max_tokens=2, stream_options={"include_usage": True})
    chunks = events(stream(client, "/completions", body).text)
    *content, last = chunks
    assert finish_reasons(content) == ["length"] and content[-1]["choices"][0]["finish_reason"]
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert all(c["usage"] is None for c in content)  # OpenAI: null on the other chunks


def test_streamed_chat_wire_format(client: httpx.Client) -> None:
    body = chat("be brief", "hello there", max_tokens=3, stream_options={"include_usage": True})
    chunks = events(stream(client, "/chat/completions", body).text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in chunks[1:4]] == [{"content": " tok"}] * 3
    assert chunks[4]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["prompt_tokens"] == 4
    assert chunks[5]["usage"]["completion_tokens"] == 3
    assert len(chunks) == 6
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_chat_max_completion_tokens_and_content_parts(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "one two"}]}],
        "max_completion_tokens": 2,
    }
    chunks = events(stream(client, "/chat/completions", body).text)
    assert text_of(chunks) == " tok tok"
    assert client.post("/chat/completions", json=body).json()["usage"]["prompt_tokens"] == 2


def test_non_streaming_answers_one_json_object(client: httpx.Client) -> None:
    answer = client.post("/completions", json=completion([5, 6, 7], max_tokens=2)).json()
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["text"] == " tok tok"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["prompt_tokens"] == 3 and answer["usage"]["total_tokens"] == 5
    answer = client.post("/chat/completions", json=chat("hi", "you")).json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": " tok" * 16}
    assert answer["usage"]["completion_tokens"] == 16  # max_tokens defaults to 16


def test_models_endpoint(client: httpx.Client) -> None:
    models = client.get("/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "stub-model"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", b"{not json"),
        ("/completions", json.dumps({"prompt": ["a", "b"]}).encode()),
        ("/completions", json.dumps({"prompt": "a", "max_tokens": 0}).encode()),
        ("/completions", json.dumps({"prompt": "a", "ignore_eos": "yes"}).encode()),
        ("/completions", json.dumps({"prompt": "a", "min_tokens": -1}).encode()),
        ("/chat/completions", json.dumps({"prompt": "a"}).encode()),
        ("/chat/completions", json.dumps({"messages": [{"content": 3}]}).encode()),
    ],
)
def test_bad_requests_get_openai_style_400(client: httpx.Client, path: str, body: bytes) -> None:
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------------------- toy prefix cache


def hits(client: httpx.Client, server: StubServer, *bodies: dict[str, object]) -> list[int]:
    server.reset()
    for body in bodies:
        path = "/chat/completions" if "messages" in body else "/completions"
        client.post(path, json={**body, "max_tokens": 1}).raise_for_status()
    return [r["hit_tokens"] for r in server.stats()["requests"]]


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def test_prefix_cache_hand_computed(client: httpx.Client, plain: StubServer) -> None:
    # B = 4. 10 words → 2 full blocks cached; +3 words → 3 full blocks, the first 2 hit.
    assert hits(client, plain, completion(words(10)), completion(words(13))) == [0, 8]
    # 9 words: 2 full blocks, both servable (⌊8/4⌋ = 2).
    assert hits(client, plain, completion(words(9)), completion(words(9))) == [0, 8]
    # 8 words: 2 full blocks but the last prompt token is never served from cache (⌊7/4⌋ = 1).
    assert hits(client, plain, completion(words(8)), completion(words(8))) == [0, 4]
    # Chained: an equal second block behind a different first block does not hit.
    other = "x " + words(8, start=1)
    assert hits(client, plain, completion(words(9)), completion(other)) == [0, 0]
    # Short prompts have no full block.
    assert hits(client, plain, completion(words(3)), completion(words(3))) == [0, 0]


def test_prefix_cache_token_ids_and_chat(client: httpx.Client, plain: StubServer) -> None:
    ids = list(range(100, 109))
    assert hits(client, plain, completion(ids), completion([*ids, 1, 2])) == [0, 8]
    # Chat tokens are the words of all contents in order, so they share blocks with the prompt.
    assert hits(client, plain, chat(words(4), words(5, 4)), completion(words(12))) == [0, 8]
    stats = plain.stats()
    assert [r["prompt_tokens"] for r in stats["requests"]] == [9, 12]
    assert stats["totals"] == {"requests": 2, "prompt_tokens": 21, "hit_tokens": 8}


def test_configure_sets_every_option_and_resets(stub: StubServer) -> None:
    with httpx.Client(base_url=stub.configure(natural_length=3, model="m2").url) as c:
        assert text_of(events(stream(c, "/completions", completion("x")).text)) == " tok" * 3
        assert c.get("/models").json()["data"][0]["id"] == "m2"
        # the options not named go back to their defaults, the records are forgotten
        default = stub.configure()
        assert text_of(events(stream(c, "/completions", completion("x")).text)) == " tok" * 16
        (only,) = default.stats()["requests"]
        assert only["index"] == 1
    _, started_with = options_to_argv({})
    assert default.stats()["config"] == {
        k: v for k, v in started_with.items() if k not in ("host", "port")
    }
    assert default.options == started_with
    with pytest.raises(ValueError, match="block_size"):
        stub.configure(block_size=0)
    # the server checks what it is sent as the command line would (400, options unchanged)
    refused = httpx.post(stub.base_url + "/configure", json={"itl_ms": -1})
    assert refused.status_code == 400 and "itl_ms" in refused.json()["error"]["message"]
    assert httpx.post(stub.base_url + "/configure", json=["ttft_ms"]).status_code == 400
    assert default.stats()["config"]["itl_ms"] == 0.0


def test_reset_forgets_cache_records_and_indices(client: httpx.Client, plain: StubServer) -> None:
    client.post("/completions", json=completion(words(9), max_tokens=1)).raise_for_status()
    plain.reset()
    client.post("/completions", json=completion(words(9), max_tokens=1)).raise_for_status()
    (only,) = plain.stats()["requests"]
    assert only["index"] == 1 and only["hit_tokens"] == 0


def test_stats_record_what_the_client_asked(client: httpx.Client, plain: StubServer) -> None:
    before = time.monotonic()
    stream(
        client,
        "/completions",
        completion("a b", max_tokens=5, min_tokens=5, ignore_eos=True, stream_options={}),
    )
    client.post("/chat/completions", json=chat("a", stream_options={"include_usage": True}))
    after = time.monotonic()
    first, second = plain.stats()["requests"]
    assert first == {
        "index": 1,
        "api": "completions",
        "arrival_s": first["arrival_s"],
        "prompt_tokens": 2,
        "hit_tokens": 0,
        "max_tokens": 5,
        "min_tokens": 5,
        "ignore_eos": True,
        "include_usage": False,
        "stream": True,
        "emitted_tokens": 5,
        "outcome": "ok",
        "first_token_due_s": first["arrival_s"],
        "write_s": first["write_s"],
    }
    assert second["api"] == "chat" and second["include_usage"] and not second["stream"]
    assert second["min_tokens"] is None and second["ignore_eos"] is False
    # time.monotonic() is one system-wide clock on Linux: comparable across processes.
    assert before <= first["arrival_s"] <= second["arrival_s"] <= after
    assert len(first["write_s"]) == 1  # unpaced: the whole answer in one write
    assert first["arrival_s"] <= first["write_s"][0] <= second["arrival_s"]
    assert second["write_s"] == []  # not streamed


# --------------------------------------------------------------------------- natural stop


@pytest.fixture
def stops_after_3(stub: StubServer) -> StubServer:
    return stub.configure(natural_length=3)


@pytest.mark.parametrize(
    ("extra", "tokens", "reason"),
    [
        ({"max_tokens": 10}, 3, "stop"),
        ({"max_tokens": 2}, 2, "length"),
        ({"max_tokens": 3}, 3, "length"),
        ({"max_tokens": 10, "ignore_eos": True}, 10, "length"),
        ({"max_tokens": 10, "min_tokens": 6}, 6, "stop"),
        ({"max_tokens": 10, "min_tokens": 10}, 10, "length"),
        ({"max_tokens": 10, "min_tokens": 2}, 3, "stop"),
    ],
)
def test_natural_stop_unless_asked_not_to(
    stops_after_3: StubServer, extra: dict[str, object], tokens: int, reason: str
) -> None:
    with httpx.Client(base_url=stops_after_3.url, timeout=10) as c:
        chunks = events(stream(c, "/completions", completion("x", **extra)).text)
        assert text_of(chunks) == " tok" * tokens
        assert finish_reasons(chunks) == [reason]
        answer = c.post("/chat/completions", json=chat("x", **extra)).json()
        assert answer["choices"][0]["finish_reason"] == reason
        assert answer["usage"]["completion_tokens"] == tokens


# --------------------------------------------------------------------------- timing


# The server's event loop times its sleeps in whole milliseconds: it may wake that much early.
TIMER_SLACK_S = 0.005


def test_ttft_itl_and_prefill_follow_the_configured_delays(stub: StubServer) -> None:
    opts = {"ttft_ms": 100, "itl_ms": 30, "prefill_ms_per_token": 20, "block_size": 4}
    received: list[list[float]] = []
    sent: list[float] = []
    server = stub.configure(**opts)
    with httpx.Client(base_url=server.url) as c:
        for _ in ("cold", "warm"):
            sent.append(time.monotonic())
            stamps = []
            body = completion(words(10), max_tokens=5, stream=True)
            with c.stream("POST", "/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {") and '"text":" tok"' in line:
                        stamps.append(time.monotonic())
            received.append(stamps)
        cold, warm = server.stats()["requests"]
    assert (cold["hit_tokens"], warm["hit_tokens"]) == (0, 8)
    # Timings on the server's own clock, so load on the machine cannot fail them: the first
    # token is due 100 ms + 20 ms per uncached token after arrival, each token is a write of its
    # own 30 ms after the last is due, and no write is early (later is the machine's load).
    for record, uncached in ((cold, 10), (warm, 2)):
        due = record["first_token_due_s"]
        assert due - record["arrival_s"] == pytest.approx(0.1 + 0.02 * uncached)
        writes = record["write_s"]
        assert len(writes) == 5
        assert all(at >= due + 0.03 * k - TIMER_SLACK_S for k, at in enumerate(writes))
    # One clock for both processes: each token reached the client after the server wrote it.
    for stamps, record, start in zip(received, (cold, warm), sent, strict=True):
        assert start <= record["arrival_s"]
        assert len(stamps) == 5
        assert all(got >= wrote for got, wrote in zip(stamps, record["write_s"], strict=True))


# --------------------------------------------------------------------------- faults


def test_error_every_answers_json_error_without_touching_the_cache(stub: StubServer) -> None:
    server = stub.configure(error_every=2, block_size=4)
    with httpx.Client(base_url=server.url) as c:
        statuses = []
        for _ in range(4):
            response = c.post("/completions", json=completion(words(9), stream=True))
            statuses.append(response.status_code)
            if response.status_code != 200:
                assert response.headers["content-type"].startswith("application/json")
                assert response.json()["error"]["code"] == 503
        records = server.stats()["requests"]
    assert statuses == [200, 503, 200, 503]
    assert [r["outcome"] for r in records] == ["ok", "error", "ok", "error"]
    assert [r["hit_tokens"] for r in records] == [0, 0, 8, 0]


def test_error_status_option_and_cli_flags(stub: StubServer) -> None:
    argv, effective = options_to_argv({"error_every": 1, "error_status": 429, "ttft_ms": 5})
    assert argv == ["--error-every", "1", "--error-status", "429", "--ttft-ms", "5"]
    assert effective["ttft_ms"] == 5.0 and effective["itl_ms"] == 0.0
    with pytest.raises(TypeError, match="ttft"):
        options_to_argv({"ttft": 5})
    with pytest.raises(ValueError, match="block_size"):
        options_to_argv({"block_size": 0})
    with pytest.raises(ValueError, match="usage"):
        options_to_argv({"usage": "sometimes"})
    response = httpx.post(
        stub.configure(error_every=1, error_status=429).url + "/completions",
        json=completion("a"),
    )
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_cut_every_closes_mid_stream(stub: StubServer) -> None:
    server = stub.configure(cut_every=2)
    with httpx.Client(base_url=server.url) as c:
        received = b""
        outcomes = []
        for _ in range(3):
            received = b""
            body = completion(
                "a", max_tokens=6, stream=True, stream_options={"include_usage": True}
            )
            try:
                with c.stream("POST", "/completions", json=body) as response:
                    for piece in response.iter_raw():
                        received += piece
                outcomes.append("complete")
            except httpx.RemoteProtocolError:
                outcomes.append("cut")
                payloads = sse_payloads(received.decode())
                assert "[DONE]" not in payloads
                chunks = [json.loads(p) for p in payloads]
                assert text_of(chunks) == " tok" * 3  # half of 6
                assert finish_reasons(chunks) == []
        records = server.stats()["requests"]
    assert outcomes == ["complete", "cut", "complete"]
    assert [r["outcome"] for r in records] == ["ok", "cut", "ok"]
    assert [r["emitted_tokens"] for r in records] == [6, 3, 6]


def test_silent_cut_ends_with_done_but_no_finish_reason_or_usage(stub: StubServer) -> None:
    server = stub.configure(silent_cut_every=2)
    with httpx.Client(base_url=server.url) as c:
        extra: dict[str, object] = {"max_tokens": 6, "stream_options": {"include_usage": True}}
        normal = events(stream(c, "/completions", completion("a", **extra)).text)
        silent = events(stream(c, "/chat/completions", chat("a", **extra)).text)
        records = server.stats()["requests"]
    assert finish_reasons(normal) == ["length"] and normal[-1]["usage"]["completion_tokens"] == 6
    assert text_of(silent) == " tok" * 3
    assert finish_reasons(silent) == []
    assert all(c["choices"] for c in silent)  # no usage chunk
    assert [r["outcome"] for r in records] == ["ok", "silent_cut"]


def test_malformed_every_sends_one_line_that_is_not_json(stub: StubServer) -> None:
    server = stub.configure(malformed_every=1)
    with httpx.Client(base_url=server.url) as c:
        body = completion("a", max_tokens=6, stream_options={"include_usage": True})
        payloads = sse_payloads(stream(c, "/completions", body).text)
        assert server.stats()["requests"][0]["outcome"] == "malformed"
    parsed: list[Event] = []
    bad = []
    for position, payload in enumerate(payloads[:-1]):
        try:
            parsed.append(json.loads(payload))
        except ValueError:
            bad.append(position)
    assert bad == [3]  # in the middle, after 3 of the 6 tokens
    assert payloads[-1] == "[DONE]"
    assert text_of(parsed) == " tok" * 6 and finish_reasons(parsed) == ["length"]


def test_hang_every_trips_the_client_read_timeout() -> None:
    read_timeout_s = 0.5
    timed_out = []
    started = []
    with run_stub_server(hang_every=2) as server:
        with httpx.Client(
            base_url=server.url, timeout=httpx.Timeout(5.0, read=read_timeout_s)
        ) as c:
            for _ in range(3):  # one after another: the second to arrive hangs
                started.append(time.monotonic())
                try:
                    stream(c, "/completions", completion("a", max_tokens=2))
                    timed_out.append(False)
                except httpx.ReadTimeout:
                    timed_out.append(True)
        records = server.stats()["requests"]
    assert [r["outcome"] for r in records] == ["ok", "hang", "ok"]
    # The hung request times out; an answered one if the server, by its own clock, took the
    # whole read timeout to answer, and never if it answered within the read timeout of the
    # request's start (the client's read starts no sooner). Between the two (a busy machine
    # delaying the request itself), either verdict is right.
    for r, start, out in zip(records, started, timed_out, strict=True):
        if r["outcome"] == "hang" or r["write_s"][0] - r["arrival_s"] >= read_timeout_s:
            assert out
        elif r["write_s"][0] < start + read_timeout_s:
            assert not out
    # A hung request does not hold up shutdown: the server left on SIGTERM, within the grace
    # run_stub_server gives before it kills (a kill would leave -9).
    assert server.process.returncode == 0


def test_client_going_away_is_recorded_quietly(stub: StubServer) -> None:
    server = stub.configure(itl_ms=20)
    with httpx.Client(base_url=server.url) as c:
        body = completion("a", max_tokens=50, stream=True)
        with c.stream("POST", "/completions", json=body) as response:
            next(response.iter_raw())  # first token, then hang up
        c.post("/completions", json=completion("a", max_tokens=1, stream=True))
    deadline = time.monotonic() + 60  # only a server that never notices fails this
    while (first := server.stats()["requests"][0])["outcome"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert first["outcome"] == "client_closed"
    assert 1 <= first["emitted_tokens"] < 50


@pytest.mark.parametrize(("mode", "usage_chunk"), [("never", False), ("always", True)])
def test_usage_mode(stub: StubServer, mode: str, usage_chunk: bool) -> None:
    with httpx.Client(base_url=stub.configure(usage=mode).url) as c:
        for asked in (True, False):
            body = completion("a", max_tokens=2, stream_options={"include_usage": asked})
            chunks = events(stream(c, "/completions", body).text)
            assert (chunks[-1]["choices"] == []) is usage_chunk
            assert ("usage" in chunks[0]) is usage_chunk
            assert finish_reasons(chunks) == ["length"]
        # The non-streamed answer carries usage either way.
        assert "usage" in c.post("/completions", json=completion("a")).json()


# --------------------------------------------------------------------------- as a script


def test_script_prints_one_line_and_stops_on_sigint() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--port", "0", "--itl-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = _read_first_line(proc, 15)
        match = re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        models = httpx.get(f"http://127.0.0.1:{match[1]}/v1/models").json()
        assert models["data"][0]["id"] == "stub-model"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # only a server that ignores SIGINT fails
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == b""  # nothing after the one line


def test_script_rejects_bad_options() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--block-size", "0"], capture_output=True, timeout=15
    )
    assert result.returncode == 2 and b"block_size" in result.stderr
