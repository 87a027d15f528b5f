"""A small OpenAI-compatible streaming server for load-test tests and benchmarks.

Run it as a script (``python perf/stub_openai_server.py --port 0 [options]``: it prints one line
``listening on http://HOST:PORT`` once bound and serves until SIGTERM/SIGINT), or from Python with
``run_stub_server(**options)``, which starts it as a subprocess (so it gets its own core while the
client under test drives it) and yields a ``StubServer``.

The toy model:

* tokens are whitespace words: a prompt string's tokens are ``prompt.split()``, a list of ints is
  its own tokens, a chat request's tokens are the words of all message contents in order; every
  generated token is the text ``" tok"``;
* it emits ``max_tokens`` tokens (default 16), or stops early ("stop") after ``--natural-length``
  tokens unless the request sends ``ignore_eos: true`` or ``min_tokens`` (EOS is then masked until
  ``min_tokens`` have been emitted, as vLLM does);
* TTFT = ``--ttft-ms`` + ``--prefill-ms-per-token`` × uncached prompt tokens, then one token every
  ``--itl-ms``;
* an unbounded prefix cache of full ``--block-size`` blocks with chained hashes, looked up in
  arrival order; like vLLM, the last prompt token is never served from cache;
* faults are chosen by the request's 1-based arrival index (``--error-every K`` hits requests K,
  2K, …), so tests are deterministic. When several match, the first of error, hang, cut,
  silent-cut, malformed wins:

  - error: ``--error-status`` (503) with an OpenAI-style JSON error body; no cache lookup;
  - hang: nothing at all (not even headers) for ``--hang-s`` (3600 s), then the connection closes;
  - cut: half the tokens (n // 2), then the connection closes mid chunked body (no finish_reason,
    no [DONE]);
  - silent_cut: half the tokens, then ``data: [DONE]`` with no finish_reason and no usage chunk
    (llama.cpp when interrupted);
  - malformed: one extra non-JSON ``data:`` line after the first half of the tokens; the stream
    is otherwise complete;

* ``--usage requested`` (default) streams the usage chunk when the request asks for it with
  ``stream_options.include_usage``; ``never`` never streams it (llama.cpp), ``always`` always does.
  Non-streamed answers always carry usage.

``GET /stats`` returns one record per generation request (arrival order) plus totals. Times are
the server's ``time.monotonic()``, one system-wide clock on Linux: ``arrival_s`` when the request
reached its handler, ``first_token_due_s`` when its delays put the first token, ``write_s`` just
before each streamed body write (the tokens of a write can reach the client no earlier), so tests compare a client's timings with the server's own instead of
bounding wall-clock time. ``outcome`` is ok, bad_request, error, hang, cut, silent_cut, malformed,
client_closed or running. ``POST /reset``
clears the records, the arrival counter and the prefix cache. ``POST /configure`` with a JSON
object of options (``run_stub_server``'s names) serves with those from then on, the others at
their defaults, and resets: tests that each want other options share one process
(``StubServer.configure``), its start-up being most of what such a test costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

SCRIPT = Path(__file__).resolve()
LISTENING = "listening on "
FAULTS = ("error", "hang", "cut", "silent_cut", "malformed")  # precedence when several match
USAGE_MODES = ("requested", "never", "always")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"
# Not JSON: a truncated object, as a buggy proxy or a torn write would leave it.
MALFORMED = b'data: {"choices":[{"index":0,"text":" tok"\n\n'


def build_parser() -> argparse.ArgumentParser:
    """The server's options; ``run_stub_server`` accepts the same names with underscores."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], exit_on_error=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port")
    p.add_argument("--model", default="stub-model", help="listed by /v1/models")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0, help="per uncached token")
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--natural-length", type=int, default=None, help="default: never stops")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--error-every", type=int, default=0, help="0 = never")
    p.add_argument("--error-status", type=int, default=503)
    p.add_argument("--cut-every", type=int, default=0)
    p.add_argument("--silent-cut-every", type=int, default=0)
    p.add_argument("--malformed-every", type=int, default=0)
    p.add_argument("--hang-every", type=int, default=0)
    p.add_argument("--hang-s", type=float, default=3600.0, help="how long a hung request waits")
    p.add_argument("--usage", choices=USAGE_MODES, default="requested")
    return p


def check_options(ns: argparse.Namespace) -> None:
    """Reject values the server cannot honour (raises ValueError)."""
    if ns.block_size < 1:
        raise ValueError("block_size must be >= 1")
    if ns.natural_length is not None and ns.natural_length < 0:
        raise ValueError("natural_length must be >= 0")
    for name in ("ttft_ms", "prefill_ms_per_token", "itl_ms", "hang_s"):
        if getattr(ns, name) < 0:
            raise ValueError(f"{name} must be >= 0")
    for fault in FAULTS:
        if getattr(ns, f"{fault}_every") < 0:
            raise ValueError(f"{fault}_every must be >= 0")
    if not 400 <= ns.error_status <= 599:
        raise ValueError("error_status must be an HTTP error status (400-599)")


# --------------------------------------------------------------------------------------------
# Server side (runs in the subprocess)
# --------------------------------------------------------------------------------------------


class BadRequestError(Exception):
    """The request body is not one this server (or OpenAI) would accept: answered with 400."""


@dataclass(slots=True)
class Parsed:
    tokens: Sequence[object]
    max_tokens: int
    min_tokens: int | None
    ignore_eos: bool
    include_usage: bool
    stream: bool
    model_json: str


@dataclass(slots=True)
class Record:
    """One generation request, mutated as it progresses; serialised only by /stats."""

    index: int
    api: str
    arrival_s: float
    prompt_tokens: int = 0
    hit_tokens: int = 0
    max_tokens: int = 0
    min_tokens: int | None = None
    ignore_eos: bool = False
    include_usage: bool = False
    stream: bool = False
    emitted_tokens: int = 0
    outcome: str = "running"
    first_token_due_s: float | None = None
    write_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


class PrefixCache:
    """Unbounded set of chained block hashes (vLLM automatic prefix caching, never evicting)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: set[int] = set()

    def lookup_insert(self, tokens: Sequence[object]) -> int:
        """Cached tokens for this prompt, then insert all its full blocks."""
        b = self.block_size
        p = len(tokens)
        max_hit = max(0, (p - 1) // b)  # the last prompt token is always recomputed
        h = 0
        hits = 0
        counting = True
        for i in range(p // b):
            # Python's tuple hash is deterministic within the process, which is all we need.
            h = hash((h, tuple(tokens[i * b : (i + 1) * b])))
            if counting:
                if i < max_hit and h in self.blocks:
                    hits += 1
                else:
                    counting = False
            self.blocks.add(h)
        return hits * b


def _bool_field(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequestError(f"{key} must be a boolean")
    return value


def _int_field(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise BadRequestError(f"{key} must be an integer >= {minimum}")
    return value


def parse_body(api: str, raw: bytes, default_model_json: str) -> Parsed:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError("request body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    tokens: Sequence[object]
    if api == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            tokens = prompt.split()
        elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
            tokens = prompt
        else:
            raise BadRequestError("prompt must be a string or a list of token ids")
        max_tokens = _int_field(body, "max_tokens", 1)
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages must be a non-empty list")
        words: list[str] = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else 0
            if isinstance(content, str):
                words.extend(content.split())
            elif isinstance(content, list):  # content parts: only their text counts
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        words.extend(part["text"].split())
            elif content is not None:  # None: assistant tool-call turns
                raise BadRequestError("each message must be an object with string content")
        tokens = words
        max_tokens = _int_field(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", 1)
    options = body.get("stream_options")
    model = body.get("model")
    return Parsed(
        tokens=tokens,
        max_tokens=16 if max_tokens is None else max_tokens,
        min_tokens=_int_field(body, "min_tokens", 0),
        ignore_eos=_bool_field(body, "ignore_eos"),
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        stream=_bool_field(body, "stream"),
        model_json=json.dumps(model) if isinstance(model, str) else default_model_json,
    )


@dataclass(slots=True)
class Chunks:
    """Every SSE line one request can send, encoded once (the token chunk is reused n times)."""

    first: bytes  # chat: role chunk + first token; completions: the token chunk
    token: bytes
    finish: bytes
    usage: bytes | None


COMPACT = (",", ":")


def _choices(api: str, kind: str) -> str:
    """The ``choices`` JSON of one chunk kind: role, token, or a finish reason."""
    finish = kind if kind in ("stop", "length") else None
    if api == "chat":
        delta = {"role": "assistant", "content": ""} if kind == "role" else {}
        if kind == "token":
            delta = {"content": " tok"}
        choice: dict[str, object] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": " tok" if kind == "token" else ""}
    choice |= {"logprobs": None, "finish_reason": finish}
    return json.dumps([choice], separators=COMPACT)


# Dumped once at import: a request only glues its own id/model header onto these.
CHOICES = {
    api: {kind: _choices(api, kind) for kind in ("role", "token", "stop", "length")}
    for api in ("completions", "chat")
}


def build_chunks(
    api: str, rid: str, model_json: str, finish_reason: str, usage: dict[str, object] | None
) -> Chunks:
    obj = "chat.completion.chunk" if api == "chat" else "text_completion"
    created = int(time.time())
    head = (
        f'data: {{"id":"{rid}","object":"{obj}","created":{created},"model":{model_json},"choices":'
    )
    # OpenAI puts "usage": null on every other chunk when the usage chunk will follow.
    tail = ',"usage":null}\n\n' if usage is not None else "}\n\n"
    choices = CHOICES[api]
    token = head + choices["token"] + tail
    finish = head + choices[finish_reason] + tail
    first = head + choices["role"] + tail + token if api == "chat" else token
    usage_line = None
    if usage is not None:
        usage_line = (
            head + '[],"usage":' + json.dumps(usage, separators=COMPACT) + "}\n\n"
        ).encode()
    return Chunks(first.encode(), token.encode(), finish.encode(), usage_line)


def error_response(status: int, message: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


async def sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def close_abruptly(request: web.Request) -> None:
    # close() flushes what was already written, then drops the connection: the chunked body never
    # gets its terminating chunk, so clients see an incomplete message.
    transport = request.transport
    if transport is not None:
        transport.close()


@dataclass
class ServerState:
    opts: argparse.Namespace
    cache: PrefixCache = field(init=False)
    records: list[Record] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        self.cache = PrefixCache(self.opts.block_size)
        self.default_model_json = json.dumps(self.opts.model)
        self.every = [(name, getattr(self.opts, f"{name}_every")) for name in FAULTS]
        self.every = [(name, k) for name, k in self.every if k > 0]
        self.ttft_s = self.opts.ttft_ms / 1000
        self.prefill_s = self.opts.prefill_ms_per_token / 1000
        self.itl_s = self.opts.itl_ms / 1000

    def reset(self) -> None:
        self.cache = PrefixCache(self.opts.block_size)
        self.records = []
        self.count = 0

    def fault(self, index: int) -> str | None:
        for name, k in self.every:
            if index % k == 0:
                return name
        return None

    def planned_tokens(self, req: Parsed) -> int:
        natural: int | None = self.opts.natural_length
        if req.ignore_eos or natural is None:
            return req.max_tokens
        return min(req.max_tokens, max(natural, req.min_tokens or 0))

    def stats(self) -> dict[str, object]:
        return {
            "requests": [r.as_dict() for r in self.records],
            "totals": {
                "requests": len(self.records),
                "prompt_tokens": sum(r.prompt_tokens for r in self.records),
                "hit_tokens": sum(r.hit_tokens for r in self.records),
            },
            "config": {k: v for k, v in vars(self.opts).items() if k not in ("host", "port")},
        }

    async def generate(self, request: web.Request, api: str) -> web.StreamResponse:
        arrival = time.monotonic()
        raw = await request.read()
        # Index, fault choice and cache lookup run without awaiting in between: arrival order.
        self.count += 1
        rec = Record(index=self.count, api=api, arrival_s=arrival)
        self.records.append(rec)
        try:
            req = parse_body(api, raw, self.default_model_json)
        except BadRequestError as exc:
            rec.outcome = "bad_request"
            return error_response(400, str(exc))
        rec.prompt_tokens = len(req.tokens)
        rec.max_tokens = req.max_tokens
        rec.min_tokens = req.min_tokens
        rec.ignore_eos = req.ignore_eos
        rec.include_usage = req.include_usage
        rec.stream = req.stream
        fault = self.fault(rec.index)
        if fault == "error":  # rejected before any work: no cache lookup
            rec.outcome = "error"
            return error_response(self.opts.error_status, "injected error (stub server)")
        rec.hit_tokens = self.cache.lookup_insert(req.tokens)

        n = self.planned_tokens(req)
        finish_reason = "length" if n >= req.max_tokens else "stop"
        first_at = arrival + self.ttft_s + self.prefill_s * (rec.prompt_tokens - rec.hit_tokens)
        rec.first_token_due_s = first_at
        mode = self.opts.usage
        send_usage = mode == "always" or (mode == "requested" and req.include_usage)
        prompt_n = rec.prompt_tokens

        if fault == "hang":
            rec.outcome = "hang"
            await asyncio.sleep(self.opts.hang_s)
            close_abruptly(request)
            return web.Response()
        sent = n // 2 if fault in ("cut", "silent_cut") else n
        usage = None
        if send_usage and fault != "silent_cut":
            usage = {
                "prompt_tokens": prompt_n,
                "completion_tokens": sent,
                "total_tokens": prompt_n + sent,
                "prompt_tokens_details": {"cached_tokens": rec.hit_tokens},
            }
        rid = ("chatcmpl-" if api == "chat" else "cmpl-") + str(rec.index)
        if not req.stream:
            return await self.respond_whole(
                request, rec, req, fault, sent, first_at, rid, finish_reason
            )

        chunks = build_chunks(api, rid, req.model_json, finish_reason, usage)
        pieces = [chunks.first] + [chunks.token] * (sent - 1) if sent else []
        if fault == "malformed" and pieces:
            pieces[max(1, sent // 2) - 1] += MALFORMED
        if fault == "cut":
            end = b""
        elif fault == "silent_cut":
            end = DONE  # llama.cpp when interrupted: [DONE] without finish_reason or usage
        else:
            end = chunks.finish + (chunks.usage or b"") + DONE
        if pieces:
            pieces[-1] += end
        elif end:
            pieces = [end]

        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)  # headers stay buffered until the first write
        try:
            if self.itl_s == 0:
                # No pacing: one write per request is what keeps 500+ req/s on one core.
                await sleep_until(first_at)
                if pieces:
                    rec.write_s.append(time.monotonic())
                    await resp.write(b"".join(pieces))
                rec.emitted_tokens = sent
            else:
                for k, piece in enumerate(pieces):
                    await sleep_until(first_at + k * self.itl_s)
                    rec.write_s.append(time.monotonic())
                    await resp.write(piece)
                    rec.emitted_tokens = min(k + 1, sent)
        except ConnectionError:
            # Returning (not raising) keeps aiohttp from logging a traceback per lost client.
            rec.outcome = "client_closed"
            return resp
        except asyncio.CancelledError:  # handler cancellation: the client went away mid-sleep
            rec.outcome = "client_closed"
            raise
        if fault == "cut":
            await sleep_until(first_at)  # also when no token was sent
            close_abruptly(request)
            rec.outcome = "cut"
            return resp
        rec.outcome = fault or "ok"
        await resp.write_eof()
        return resp

    async def respond_whole(
        self,
        request: web.Request,
        rec: Record,
        req: Parsed,
        fault: str | None,
        sent: int,
        first_at: float,
        rid: str,
        finish_reason: str,
    ) -> web.Response:
        try:
            await sleep_until(first_at + max(0, sent - 1) * self.itl_s)
        except asyncio.CancelledError:
            rec.outcome = "client_closed"
            raise
        rec.emitted_tokens = sent
        rec.outcome = fault or "ok"
        if fault == "cut":
            close_abruptly(request)
            return web.Response()
        if fault == "malformed":
            return web.Response(body=MALFORMED[6:], content_type="application/json")
        text = " tok" * sent
        chat = rec.api == "chat"
        choice: dict[str, object] = {"index": 0, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["finish_reason"] = None if fault == "silent_cut" else finish_reason
        body: dict[str, object] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": json.loads(req.model_json),
            "choices": [choice],
        }
        if fault != "silent_cut":  # --usage is about the streamed usage chunk only
            body["usage"] = {
                "prompt_tokens": rec.prompt_tokens,
                "completion_tokens": sent,
                "total_tokens": rec.prompt_tokens + sent,
                "prompt_tokens_details": {"cached_tokens": rec.hit_tokens},
            }
        return web.json_response(body)


def make_app(opts: argparse.Namespace) -> web.Application:
    # The state requests are served from, replaced whole by POST /configure: a request already
    # running finishes on the state it started with, outside the new records.
    current = [ServerState(opts)]

    async def completions(request: web.Request) -> web.StreamResponse:
        return await current[0].generate(request, "completions")

    async def chat(request: web.Request) -> web.StreamResponse:
        return await current[0].generate(request, "chat")

    async def models(_: web.Request) -> web.Response:
        model_id = current[0].opts.model
        model = {"id": model_id, "object": "model", "created": 0, "owned_by": "enginefit-stub"}
        return web.json_response({"object": "list", "data": [model]})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(current[0].stats())

    async def reset(_: web.Request) -> web.Response:
        current[0].reset()
        return web.json_response({"ok": True})

    async def configure(request: web.Request) -> web.Response:
        try:
            options = json.loads(await request.read())
            if not isinstance(options, dict):
                raise TypeError("expected a JSON object of options")
            _, effective = options_to_argv(options)
        except (ValueError, TypeError) as exc:
            return error_response(400, str(exc))
        effective.update(host=opts.host, port=opts.port)  # where it listens stays
        current[0] = ServerState(argparse.Namespace(**effective))
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=256 * 1024**2)  # long token-id prompts
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    app.router.add_post("/configure", configure)
    return app


async def serve(opts: argparse.Namespace) -> None:
    # No access log (a log line per request costs more than serving it); cancel handlers whose
    # client went away, so hung and abandoned streams do not pile up.
    runner = web.AppRunner(
        make_app(opts), access_log=None, handler_cancellation=True, shutdown_timeout=0.25
    )
    await runner.setup()
    site = web.TCPSite(runner, opts.host, opts.port, backlog=4096, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Announced only now: whoever reads the line may stop the server at once, cleanly.
    sys.stdout.write(f"{LISTENING}http://{opts.host}:{port}\n")
    sys.stdout.flush()
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        opts = parser.parse_args(argv)
        check_options(opts)
    except (argparse.ArgumentError, ValueError) as exc:
        parser.error(str(exc))
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(opts))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(opts))
    return 0


# --------------------------------------------------------------------------------------------
# Client side (the test or benchmark process)
# --------------------------------------------------------------------------------------------


@dataclass
class StubServer:
    """A running stub server subprocess. ``url`` is the OpenAI base URL (ends in /v1)."""

    url: str
    base_url: str
    port: int
    options: dict[str, object]
    process: subprocess.Popen[bytes]

    def _call(self, method: str, path: str, body: bytes = b"") -> Any:
        req = urllib.request.Request(
            self.base_url + path, method=method, data=body if method == "POST" else None
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict[str, Any]:
        """Per-request records (arrival order) and totals; see ``Record`` for the fields."""
        result: dict[str, Any] = self._call("GET", "/stats")
        return result

    def reset(self) -> None:
        """Forget records, restart arrival indices at 1 and empty the prefix cache."""
        self._call("POST", "/reset")

    def configure(self, **options: object) -> StubServer:
        """Serve with these options from now on (the others at their defaults, as
        ``run_stub_server(**options)`` would start it), reset as by :meth:`reset`: one process
        for tests that each want other options. Returns the server itself."""
        _, effective = options_to_argv(options)  # a bad option raises here, as at start-up
        self._call("POST", "/configure", json.dumps(options).encode())
        self.options = effective
        return self


def options_to_argv(options: dict[str, object]) -> tuple[list[str], dict[str, object]]:
    """CLI arguments for these keyword options, and the full effective option set."""
    parser = build_parser()
    defaults = vars(parser.parse_args([]))
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"unknown stub server option(s): {', '.join(unknown)}")
    argv: list[str] = []
    for key, value in options.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        raise ValueError(str(exc)) from exc
    check_options(ns)
    return argv, vars(ns)


@contextlib.contextmanager
def run_stub_server(startup_timeout: float = 15.0, **options: object) -> Iterator[StubServer]:
    """Start the server as a subprocess with these options, yield it, terminate it on exit."""
    argv, effective = options_to_argv(options)
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *argv], stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            line = _read_first_line(proc, startup_timeout)
            if not line.startswith(LISTENING):
                stderr.seek(0)
                detail = stderr.read().decode(errors="replace")
                raise RuntimeError(f"stub server did not start: {line!r}\n{detail}")
            base = line[len(LISTENING) :].strip()
            port = int(base.rsplit(":", 1)[1])
            yield StubServer(f"{base}/v1", base, port, effective, proc)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _read_first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The subprocess's first stdout line, or '' if it exits or times out first."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # EOF: the process died
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace") if b"\n" in data else ""


if __name__ == "__main__":
    sys.exit(main())
