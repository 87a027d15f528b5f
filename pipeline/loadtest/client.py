"""The open-loop client: send each request at its planned time, read its stream, time it.

Sending never waits for answers: one sender coroutine sleeps until each planned offset, builds
nothing on the hot path (the next body is encoded while it waits) and starts the request as its
own task. What a send measures (an :class:`Outcome`): the planned and actual send times, the
time of every content chunk (time to first token, inter-chunk gaps, end-to-end latency), the
server's ``usage`` when it sends one, the finish reason, and how it failed.

Failures never stop a run; each is one ``error_kind``:

``connect_error`` / ``connect_timeout``  no connection;
``client_error``         anything else the HTTP client raised (a bad URL, a refused header…);
``timeout``              no byte for ``read_timeout`` seconds, or the whole request over
                         ``request_timeout``;
``http_<status>``        a non-200 answer (what its body says went wrong, in ``error_detail``:
                         :func:`error_message`, never the request it may echo);
``not_streamed``         a 200 answer that is not an event stream;
``stream_error``         an ``error`` object inside the stream;
``malformed_stream``     a ``data:`` line that is not JSON;
``cut_stream``           the connection ended before ``data: [DONE]``;
``cut_stream_silent``    ``[DONE]`` arrived but no chunk carried a ``finish_reason`` (llama.cpp's
                         server ends an interrupted stream this way, with status 200);
``dropped_cap``          not sent: ``max_in_flight`` requests were in flight (``on_cap: drop``);
``interrupted``          in flight when the run was stopped (Ctrl-C).

With ``on_cap: delay`` a held-back request is sent as soon as a slot frees: it counts as late
(its send time minus its planned time), never silently turning the run into a closed loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

ERROR_DETAIL_CHARS = 200
#: The first send starts this long after the rate's clock starts, so it is not late by setup.
LEAD_S = 0.05


@dataclass
class Outcome:
    """One planned send and what came back (times in seconds from the rate's start)."""

    index: int
    scheduled_s: float
    sent_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    end_s: float | None = None
    http_status: int | None = None
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None
    usage_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    usage_completion_tokens: int | None = None
    error_kind: str | None = None
    error_detail: str | None = None


@dataclass(frozen=True)
class ClientOptions:
    url: str
    api: str  # "completions" | "chat"
    connect_timeout_s: float
    read_timeout_s: float
    request_timeout_s: float
    max_in_flight: int | None
    on_cap: str  # "drop" | "delay"
    headers: dict[str, str] = field(default_factory=dict)


def _detail(text: str) -> str:
    one_line = " ".join(text.split())
    return one_line[:ERROR_DETAIL_CHARS]


def error_message(body: str) -> str:
    """What an error answer says went wrong, without what it echoes of the request.

    Servers often quote the request back (pydantic/FastAPI 422s list each field's ``input``;
    some messages quote the prompt), so only these parts are kept: an OpenAI-style
    ``error.message`` / ``error.type`` / ``error.code``, or each FastAPI ``detail`` item's
    ``loc`` and ``msg``; a body that is not JSON is only measured, never kept.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to be an answer
        return f"a non-JSON body of {len(body)} characters"
    parts: list[str] = []
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        parts += [str(error[k]) for k in ("type", "code", "message") if error.get(k) is not None]
    elif isinstance(error, str):
        parts.append(error)
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if isinstance(detail, list):
        for item in detail:
            if isinstance(item, dict):
                where = ".".join(str(x) for x in item.get("loc", []))
                parts.append(f"{where}: {item.get('msg', '')}".strip(": "))
    elif isinstance(detail, str):
        parts.append(detail)
    if isinstance(payload, dict) and isinstance(payload.get("message"), str):
        parts.append(payload["message"])
    return _detail("; ".join(parts)) if parts else "an error body without a message"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Stream:
    """Parses one response's server-sent events into an :class:`Outcome`."""

    def __init__(self, outcome: Outcome, chat: bool, clock: Callable[[], float], t0: float):
        self.outcome, self.chat, self.clock, self.t0 = outcome, chat, clock, t0
        self.done = False

    def line(self, raw: bytes) -> None:
        line = raw.strip()
        if not line.startswith(b"data:"):
            return  # blank separators, comments (":"), "event:" / "id:" fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except (ValueError, RecursionError):
            # the line may hold generated text: say what is wrong, never what it says
            self._fail("malformed_stream", f"a data: line of {len(payload)} bytes is not JSON")
            return
        if not isinstance(chunk, dict):
            self._fail("malformed_stream", f"a chunk is a {type(chunk).__name__}, not an object")
            return
        if chunk.get("error"):
            self._fail("stream_error", error_message(json.dumps({"error": chunk["error"]})))
            return
        choices = chunk.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            choice = choices[0]
            if self.chat:
                delta = choice.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content")
            else:
                text = choice.get("text")
            if text:
                self.outcome.chunk_times.append(self.clock() - self.t0)
            if choice.get("finish_reason"):
                self.outcome.finish_reason = str(choice["finish_reason"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.outcome.usage_prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):  # vLLM (--enable-prompt-tokens-details), SGLang, OpenAI
                self.outcome.usage_cached_tokens = _int_or_none(details.get("cached_tokens"))
            self.outcome.usage_completion_tokens = _int_or_none(usage.get("completion_tokens"))

    def _fail(self, kind: str, detail: str) -> None:
        if self.outcome.error_kind is None:  # the first problem names the failure
            self.outcome.error_kind, self.outcome.error_detail = kind, detail

    def finish(self) -> None:
        self.outcome.end_s = self.clock() - self.t0
        if self.outcome.error_kind is not None:
            return
        if not self.done:
            self._fail("cut_stream", "the connection ended before data: [DONE]")
        elif self.outcome.finish_reason is None:
            self._fail("cut_stream_silent", "[DONE] without any finish_reason: stream cut short")


async def _send(
    session: aiohttp.ClientSession,
    options: ClientOptions,
    body: bytes,
    outcome: Outcome,
    clock: Callable[[], float],
    t0: float,
) -> None:
    stream = _Stream(outcome, options.api == "chat", clock, t0)
    outcome.sent_s = clock() - t0
    try:
        async with session.post(options.url, data=body, headers=options.headers) as resp:
            outcome.http_status = resp.status
            if resp.status != 200:
                text = (await resp.content.read(4096)).decode("utf-8", "replace")
                outcome.error_kind = f"http_{resp.status}"
                outcome.error_detail = error_message(text)
                outcome.end_s = clock() - t0
                return
            if not resp.content_type.startswith("text/event-stream"):
                outcome.error_kind = "not_streamed"
                outcome.error_detail = f"content type {resp.content_type!r}, not text/event-stream"
                outcome.end_s = clock() - t0
                return
            async for raw in resp.content:
                stream.line(raw)
                if stream.done:
                    break
    except aiohttp.ConnectionTimeoutError as exc:
        stream._fail("connect_timeout", _detail(str(exc) or "connect timeout"))
    except aiohttp.ClientConnectorError as exc:
        stream._fail("connect_error", _detail(str(exc)))
    except TimeoutError:
        stream._fail("timeout", "no data within the read or request timeout")
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        stream._fail("cut_stream", _detail(str(exc) or type(exc).__name__))
    except aiohttp.ClientError as exc:
        stream._fail("client_error", _detail(f"{type(exc).__name__}: {exc}"))
    except asyncio.CancelledError:
        stream._fail("interrupted", "in flight when the run was stopped")
    except Exception as exc:  # noqa: BLE001 - anything else fails this request, never the run
        stream._fail("client_error", _detail(f"{type(exc).__name__}: {exc}"))
    stream.finish()


async def run_schedule(
    offsets_s: list[float],
    body_for: Callable[[int], bytes],
    options: ClientOptions,
    *,
    on_progress: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> list[Outcome]:
    """Send request ``i`` at ``offsets_s[i]`` seconds (open loop) and wait for every answer.

    ``stop`` set (Ctrl-C): sending stops, requests in flight are cancelled and recorded as
    ``interrupted``, and what was measured is returned. ``on_progress`` gets ``"sent"`` and
    ``"done"`` events (for a progress bar).
    """
    loop = asyncio.get_running_loop()
    # Not loop.time: uvloop's is libuv's loop clock, in whole milliseconds and read once per
    # loop iteration, which would quantise gaps of a few ms between tokens by ±1 ms.
    clock = time.perf_counter
    timeout = aiohttp.ClientTimeout(
        total=options.request_timeout_s,
        sock_connect=options.connect_timeout_s,
        sock_read=options.read_timeout_s,
    )
    # One connection per request, as vLLM's benchmarks/backend_request_func.py opens a session
    # per request: servers close kept-alive connections on their own terms (cpp-httplib in
    # llama-server after 5 idle seconds or 100 requests, uvicorn after 5 s), and a send on a
    # pooled connection the server is closing fails ("Can not write request body", "Server
    # disconnected"), an error the load test would count against the server. A request's TTFT
    # includes its connection's setup, as it does in vLLM's benchmark.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    outcomes = [Outcome(index=i, scheduled_s=t + LEAD_S) for i, t in enumerate(offsets_s)]
    tasks: set[asyncio.Task[None]] = set()
    cap = options.max_in_flight
    slots = asyncio.Semaphore(cap) if cap is not None and options.on_cap == "delay" else None
    stop = stop or asyncio.Event()
    stop_wait = asyncio.ensure_future(stop.wait())

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if slots is not None:
            slots.release()
        if on_progress is not None:
            on_progress("done")

    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        t0 = clock()
        body = body_for(0) if outcomes else b""
        for i, outcome in enumerate(outcomes):
            delay = t0 + outcome.scheduled_s - clock()
            if delay > 0:
                await asyncio.wait((stop_wait,), timeout=delay)
            if slots is not None and not stop.is_set():
                acquire = asyncio.ensure_future(slots.acquire())
                await asyncio.wait((acquire, stop_wait), return_when=asyncio.FIRST_COMPLETED)
                if not acquire.done():
                    acquire.cancel()
            if stop.is_set():
                for rest in outcomes[i:]:
                    rest.error_kind, rest.error_detail = "interrupted", "not sent: run stopped"
                break
            if slots is None and cap is not None and len(tasks) >= cap:
                outcome.error_kind = "dropped_cap"
                outcome.error_detail = f"not sent: {cap} requests in flight (max_in_flight)"
                if on_progress is not None:
                    on_progress("done")
            else:
                task = loop.create_task(_send(session, options, body, outcome, clock, t0))
                tasks.add(task)
                task.add_done_callback(finished)
                if on_progress is not None:
                    on_progress("sent")
            if i + 1 < len(outcomes):
                body = body_for(i + 1)  # encoded while waiting for the next send time
        while tasks:
            done_wait = asyncio.ensure_future(asyncio.wait(set(tasks)))
            await asyncio.wait((done_wait, stop_wait), return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                for task in list(tasks):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
                done_wait.cancel()
                break
    stop_wait.cancel()
    return outcomes
