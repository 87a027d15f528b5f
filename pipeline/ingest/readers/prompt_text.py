"""Prompt-text JSON Lines: one request per line with its prompt as plain text.

Shape::

    {"ts": 12.5, "prompt": "...", "output_tokens": 87, "duration_s": 1.9,
     "session_id": "s1", "tenant": "team-a", "model": "m", "output": "..."}

Field choices
-------------
``ts`` (or ``timestamp``)
    Seconds: epoch seconds, or seconds relative to the configured anchor date when below 10^9
    (:func:`~pipeline.ingest.readers.base.seconds_timestamp`; epoch values in ms / µs are quarantined as
    a unit mix-up); an ISO-8601 string is accepted too.
``prompt``
    Required string, tokenised with ``ctx.tokenizer``. ``prompt_tokens`` is the tokenizer's
    count, so it is approximate exactly when the tokenizer is (``tokens_approximate``).
output text (``output``, ``output_text``, ``completion`` or ``response``; first one present)
    When present it is tokenised and its ids are chained *after* the prompt's, so the next
    turn's prompt, which repeats it, hits the blocks this request inserted. The text is
    tokenised separately from the prompt, so only the block straddling the prompt/output
    boundary can differ from a tokenisation of the concatenated string.
``output_tokens``
    Authoritative count when present; otherwise the output text's token count; otherwise null.
``duration_s`` / ``ttft_s``
    End-to-end latency and time to first token in seconds, stored as ``e2e_ms`` / ``ttft_ms``.
session (``session_id``, ``session``, ``conversation_id``, ``conversation``, ``thread_id``),
tenant (``tenant``, ``tenant_id``, ``user``, ``user_id``), ``model``, ``turn``,
request id (``request_id``, ``id``)
    Optional; the first spelling present wins.

Detection: the first object has a string ``prompt`` and a ``ts`` or ``timestamp`` key and no
``messages`` (which is the chat format). The prompt and output text are never written anywhere:
only counts and salted hashes leave this module, and errors name the field and the value's type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pipeline.ingest.readers.base import (
    JsonLinesReader,
    ReadContext,
    RecordError,
    content_blocks,
    number,
    optional_text,
    seconds_timestamp,
    token_count,
)
from pipeline.ingest.readers.source import SourceFile

SESSION_KEYS = ("session_id", "session", "conversation_id", "conversation", "thread_id")
TENANT_KEYS = ("tenant", "tenant_id", "user", "user_id")
REQUEST_ID_KEYS = ("request_id", "id")
OUTPUT_TEXT_KEYS = ("output", "output_text", "completion", "response")
TIMESTAMP_KEYS = ("ts", "timestamp")
INT32_MAX = 2**31 - 1


def first_key(obj: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    """The first of ``keys`` present in ``obj`` with a non-null value."""
    for key in keys:
        if obj.get(key) is not None:
            return key
    return None


def optional_field_text(obj: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    key = first_key(obj, keys)
    return None if key is None else optional_text(obj[key], key)


def optional_turn(value: Any, key: str) -> int | None:
    """A 0-based turn index (fits the canonical Int32 column)."""
    if value is None:
        return None
    turn = token_count(value, key)
    assert turn is not None
    if turn > INT32_MAX:
        raise RecordError(key, "absurd_value", f"value {turn}")
    return turn


def optional_seconds_as_ms(value: Any, key: str) -> float | None:
    """A non-negative duration in seconds, returned in milliseconds."""
    if value is None:
        return None
    seconds = number(value, key)
    if seconds < 0:
        raise RecordError(key, "negative", f"value {seconds}")
    return seconds * 1000.0


def optional_ms(value: Any, key: str) -> float | None:
    if value is None:
        return None
    millis = number(value, key)
    if millis < 0:
        raise RecordError(key, "negative", f"value {millis}")
    return millis


def encode_text(text: Any, key: str, ctx: ReadContext) -> list[int]:
    """Token ids of ``text`` (a string) with the configured tokenizer; content-free errors."""
    if not isinstance(text, str):
        raise RecordError(key, "not_a_string", type(text).__name__)
    try:
        ids = ctx.tokenizer.encode(text)
    except RecursionError:
        raise RecordError(key, "untokenizable", "RecursionError") from None
    except Exception as exc:  # noqa: BLE001 - tokenizer back-ends raise arbitrary types
        raise RecordError(key, "untokenizable", type(exc).__name__) from None
    token_count(len(ids), key)  # absurdly long text is quarantined like an absurd count
    return ids


def line_arrival(obj: Mapping[str, Any], ctx: ReadContext) -> datetime:
    """The record's ``ts`` (or ``timestamp``) in seconds, epoch or relative to the anchor."""
    ts_key = first_key(obj, TIMESTAMP_KEYS)
    if ts_key is None:
        raise RecordError("ts", "missing")
    return seconds_timestamp(obj[ts_key], ts_key, ctx.anchor)


def content_row(
    obj: Mapping[str, Any],
    arrival: datetime,
    prompt_ids: list[int],
    output_ids: list[int] | None,
    output_tokens: int | None,
    ctx: ReadContext,
    *,
    approximate: bool,
) -> dict[str, Any]:
    """A canonical row of a line-per-request content format (prompt text or token ids)."""
    hashes, prompt_blocks = content_blocks(prompt_ids, output_ids, ctx)
    row: dict[str, Any] = {
        "arrival": arrival,
        "session_id": optional_field_text(obj, SESSION_KEYS),
        "turn": optional_turn(obj.get("turn"), "turn"),
        "tenant": optional_field_text(obj, TENANT_KEYS),
        "model": optional_text(obj.get("model"), "model"),
        "prompt_tokens": len(prompt_ids),
        "output_tokens": output_tokens,
        "e2e_ms": optional_seconds_as_ms(obj.get("duration_s"), "duration_s"),
        "ttft_ms": optional_seconds_as_ms(obj.get("ttft_s"), "ttft_s"),
        "prefix_hashes": hashes,
        "prompt_blocks": prompt_blocks,
        "hashes_known": True,
        "tokens_approximate": approximate,
    }
    request_id = optional_field_text(obj, REQUEST_ID_KEYS)
    if request_id is not None:
        row["request_id"] = request_id
    return row


class PromptTextReader(JsonLinesReader):
    name = "prompt-text"
    description = (
        "Prompt-text JSONL (ts s, prompt, output_tokens, duration_s; "
        "optional session/tenant/model/output)"
    )

    @property
    def needs(self) -> str:
        return f"JSONL, a prompt string and {' or '.join(TIMESTAMP_KEYS)}"

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return (
            isinstance(obj.get("prompt"), str)
            and any(key in obj for key in TIMESTAMP_KEYS)
            and "messages" not in obj
        )

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        arrival = line_arrival(obj, ctx)
        if obj.get("prompt") is None:
            raise RecordError("prompt", "missing")
        prompt_ids = encode_text(obj["prompt"], "prompt", ctx)
        output_key = first_key(obj, OUTPUT_TEXT_KEYS)
        output_ids = None if output_key is None else encode_text(obj[output_key], output_key, ctx)
        output_tokens = token_count(obj.get("output_tokens"), "output_tokens", allow_none=True)
        if output_tokens is None and output_ids is not None:
            output_tokens = len(output_ids)
        return content_row(
            obj,
            arrival,
            prompt_ids,
            output_ids,
            output_tokens,
            ctx,
            approximate=ctx.tokenizer.approximate,
        )
