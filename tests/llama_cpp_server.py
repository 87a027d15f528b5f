"""Real OpenAI-compatible engines for tests on a tiny GGUF: llama-cpp-python's Python server
(:func:`run_llama_cpp_server`, one request at a time) and llama.cpp's C++ ``llama-server``
(:func:`run_llama_server`, continuous batching over ``-np`` slots; the binary built once per
machine by ``perf/llama_server.py``).

llama-server on the wire (llama.cpp as vendored by llama-cpp-python 0.3.36): requests are
scheduled into slots; each server step decodes one token for every generating slot and fills
the rest of the batch (``-b`` tokens) with prompt tokens of the slots still prefilling, a long
prompt split over steps. ``ignore_eos`` is honoured, ``stream_options.include_usage`` gives a
last chunk with ``usage`` (``prompt_tokens_details.cached_tokens``: the slot's KV reused from
its previous prompt) and ``timings`` (the server's own prompt and decode times).

The Python server, as measured:

What the server does on the wire, checked by real requests (llama-cpp-python 0.3.36, its server
extra, the tiny model of tests/tiny_gguf.py, httpx, this 2-core machine):

Stream format (stream=true). Both endpoints answer 200 with ``text/event-stream; charset=utf-8``
at once, then events ``data: <json>`` each followed by a blank line (LF only), then
``data: [DONE]``. One chunk per token here; with a real model a character split over several
byte tokens is held back and sent as one chunk.
- /v1/completions: content chunks ``{"choices": [{"text": " shoul", "index": 0,
  "logprobs": null, "finish_reason": null}], ...}``; the last chunk is
  ``{"text": "", ..., "finish_reason": "length"}`` ("stop" on EOS); then ``data: [DONE]``.
- /v1/chat/completions: a first chunk ``"delta": {"role": "assistant"}`` with no content, then
  ``"delta": {"content": " who"}`` per token, then ``"delta": {}, "finish_reason": "length"``,
  then ``data: [DONE]``. No template in the GGUF, so the server falls back to "llama-2".
- ``stream_options: {"include_usage": true}`` is accepted and ignored: no usage chunk ever
  comes in a stream (non-streamed replies do carry ``usage``). Token counts in a stream are
  counted from the chunks, or asked of POST /extras/tokenize {"input": text} (not under /v1).
- Streams longer than 15 s carry sse-starlette comment lines ``: ping - <UTC time>``.

Request fields.
- ``max_tokens`` is honoured exactly (1, 7, 50, 300 → that many content chunks, finish
  "length"). Default when absent: 16 for completions, up to n_ctx for chat.
- ``min_tokens`` is honoured on both endpoints: it masks EOS until then. On a model that stops
  after ~5 tokens, max_tokens=min_tokens=32 gave 32 chunks in 16 of 16 replies.
- ``ignore_eos`` (like any unknown field) is accepted with 200 and ignored: the same model
  still stopped early (0–17 tokens, finish "stop") in 15 of 16 replies.
- ``prompt`` as token ids ([1, 300, 400] or [[...]]) is refused: HTTP 500 carrying a
  pydantic "Input should be a valid string" message. A list of one string works; a list of
  two strings gives a bare 500.

Concurrency. One request runs at a time (one model, one lock). With interrupt_requests off a
second request gets 200 and headers at once but its first token only after the first request
ends (a 3,000-token stream sent at 0.02 s ended at 6.2 s; the 5-token request sent at 0.3 s
got its first token at 6.2 s). So time to first token is measured to the first content chunk,
never to the headers. GET /v1/models takes the same lock: it waits for a running stream.

Cut streams (interrupt_requests on, the package's default). Any request arriving during a
stream, GET /v1/models included, ends that stream: status stays 200, the content chunks stop
(~510 of 3,000 tokens came in 0.3 s), NO chunk with a finish_reason comes, ``data: [DONE]``
still comes, then the server drops the connection without the closing HTTP chunk (httpx:
RemoteProtocolError "incomplete chunked read"). So a client detects a cut stream by the missing
finish_reason, never by a missing [DONE], and counts a transport error after [DONE] as a cut.
The newcomer's stream is normal.

Timings (tiny model, 2 cores). Server start to a 200 from /v1/models: 0.45–0.6 s; stop
(SIGTERM): ~0.2 s. 1,000 prompt tokens + 32 output tokens: first token in ~40–47 ms, done in
~55–63 ms streamed, ~30 ms non-streamed. A prompt sharing its prefix with the previous one
reuses its KV cache (first token in ~4 ms), so timed prompts must differ from their start.
Decoding runs at ~2,000 tokens/s early in a context, ~500/s averaged over 3,000 tokens.

The server log (stderr) holds no prompt text: model loading, uvicorn access lines, timings.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from perf.llama_server import cached_binary

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LlamaServer:
    """A running server: ``url`` ends in /v1; ``model`` is the id GET /v1/models reports."""

    url: str
    model: str
    pid: int
    command: tuple[str, ...] = ()
    engine_args: dict[str, int | bool] = field(default_factory=dict)


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python and its ``server`` extra are installed (tests skip otherwise)."""
    try:
        # app pulls in fastapi, sse-starlette, starlette-context and pydantic-settings: the
        # server extra. OSError: the package is there but its libllama.so does not load.
        import llama_cpp.server.app  # noqa: F401
        import uvicorn  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def _free_port() -> int:
    # The OS picks a free port; another process could take it before the server binds, which
    # start-up then reports as an early exit with "address already in use" in the tail.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_env() -> dict[str, str]:
    """The environment without variables the server would read as settings.

    Its settings are pydantic-settings classes, so any variable named like a field (MODEL,
    N_CTX, PORT, HOST, API_KEY, ...; case-insensitive) fills a setting not given on the command
    line, and __main__ reads HOST and PORT even over the flags. A CI machine's PORT must not move
    the server.
    """
    from llama_cpp.server.settings import Settings

    fields = {name.lower() for name in Settings.model_fields} | {"config_file"}
    return {k: v for k, v in os.environ.items() if k.lower() not in fields}


def _tail(log: IO[bytes], limit: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode("utf-8", "replace")[-limit:]


@contextlib.contextmanager
def run_llama_cpp_server(
    model_path: Path, *, n_ctx: int = 4096, interrupt_requests: bool = False
) -> Iterator[LlamaServer]:
    """Run ``python -m llama_cpp.server`` on 127.0.0.1 for the ``with`` block, then stop it.

    ``interrupt_requests`` is off by default: with it on (the package's default) a stream is cut
    short whenever another request arrives, which is not what a load test should measure.
    """
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--model_alias",
        model_path.stem,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "true" if interrupt_requests else "false",
        # A fixed seed: the same sequence of requests gets the same replies, run after run (a
        # request's own "seed" field pins that one reply).
        "--seed",
        "0",
    ]
    base = f"http://127.0.0.1:{port}"
    # An anonymous temporary file, gone when closed: the server's log is kept only to explain a
    # failed start, and a file (unlike a pipe) never fills up and blocks the server.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env()
        )
        try:
            model = _wait_until_up(proc, base, log)
            yield LlamaServer(url=f"{base}/v1", model=model, pid=proc.pid)
        finally:
            # uvicorn waits for open streams on SIGTERM; a test that left one open is cut.
            _stop(proc)


def _wait_until_up(
    proc: subprocess.Popen[bytes], base: str, log: IO[bytes], name: str = "llama_cpp.server"
) -> str:
    """Poll GET /v1/models until it answers; return the model id it reports (llama-server
    answers 503 while it loads the model)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with code {proc.returncode} before answering; "
                    f"its output ends with:\n{_tail(log)}"
                )
            try:
                response = client.get(f"{base}/v1/models")
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            if response.status_code == 200:
                return str(response.json()["data"][0]["id"])
            time.sleep(0.1)
    raise RuntimeError(
        f"{name} did not answer GET {base}/v1/models within {START_TIMEOUT_S:.0f} s; "
        f"its output ends with:\n{_tail(log)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------- llama.cpp's llama-server


@dataclass(frozen=True)
class LlamaServerFlags:
    """The scheduling flags a llama-server runs with (each one recorded with the run)."""

    slots: int = 2  # -np: requests served at once
    ctx_size: int = 8192  # -c: KV tokens, split evenly over the slots (--no-kv-unified)
    batch_size: int = 512  # -b: tokens one step processes (decodes first, then prompt tokens)
    ubatch_size: int = 512  # -ub: tokens one compute pass takes (a step is ⌈b / ub⌉ passes)
    threads: int = 1  # -t and -tb: compute threads, pinned so a busy machine's noise is less

    def argv(self) -> list[str]:
        return [
            "-np", str(self.slots), "-c", str(self.ctx_size), "--no-kv-unified",
            "-b", str(self.batch_size), "-ub", str(self.ubatch_size),
            "-t", str(self.threads), "-tb", str(self.threads),
        ]  # fmt: skip

    def engine_args(self) -> dict[str, int | bool]:
        """The flags under the sidecar manifest's ``engine_args`` names (vLLM's): a slot is a
        running request, the batch is the per-step token budget, a prompt longer than what is
        left of it is split over steps, the KV pool is the context."""
        return {
            "max_num_seqs": self.slots,
            "max_num_batched_tokens": self.batch_size,
            "enable_chunked_prefill": True,
            "kv_cache_tokens": self.ctx_size,
            "max_model_len": self.ctx_size // self.slots,
        }


def llama_server_binary() -> Path | None:
    """The llama-server built for this machine (``make engine``), or None."""
    return cached_binary()


def _llama_server_env() -> dict[str, str]:
    """The environment without LLAMA_* variables: llama-server reads LLAMA_ARG_<FLAG> as
    flags not given on the command line, so a CI machine's settings must not reach it."""
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("LLAMA_")}


@contextlib.contextmanager
def run_llama_server(
    model_path: Path,
    flags: LlamaServerFlags = LlamaServerFlags(),
    *,
    binary: Path | None = None,
    log_path: Path | None = None,
) -> Iterator[LlamaServer]:
    """Run llama.cpp's ``llama-server`` on 127.0.0.1 for the ``with`` block, then stop it.

    The model is served as ``model_path.stem``; ``log_path`` keeps the server's log (else an
    anonymous file, read only to explain a failed start)."""
    found = binary or llama_server_binary()
    if found is None:
        raise RuntimeError("llama-server is not built on this machine: run `make engine`")
    port = _free_port()
    cmd = [
        str(found), "-m", str(model_path), "--alias", model_path.stem,
        "--host", "127.0.0.1", "--port", str(port), *flags.argv(),
        "--no-webui", "--metrics", "--seed", "0",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w+b") if log_path is not None else tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_llama_server_env(),
        )
        try:
            model = _wait_until_up(proc, base, log, "llama-server")
            yield LlamaServer(
                url=f"{base}/v1",
                model=model,
                pid=proc.pid,
                command=(found.name, *cmd[1:]),
                engine_args=flags.engine_args(),
            )
        finally:
            _stop(proc)
