"""TraceLab ``round_trace.jsonl`` (UW SyFI Lab): one coding-agent LLM invocation ("round") a line.

Mapping
-------
``session_id``, ``model``
    As logged (pseudonymised in the public release).
``round_index`` → ``turn``
    0-based order within the session.
``input_tokens_total`` → ``prompt_tokens``; ``output_tokens`` → ``output_tokens``
    Provider-reported counts (exact for the provider's tokenizer: ``tokens_approximate`` False).
    Codex's ``output_tokens`` already include its ``reasoning_output_tokens``.
``prefix_tokens`` → ``cached_tokens``
    The provider's cache-read tokens. Above ``input_tokens_total`` it is quarantined
    (``exceeds_prompt_tokens``).
tenant
    ``user`` when present (the unsanitised rows), else ``project`` (Claude rows of the public
    release), else null.
arrival
    The round's request is sent once its input is complete, so arrival is the **latest input
    event** (``user_message`` / ``tool_result``) of ``timing_events``; a round whose events have
    no input event falls back to its earliest event. (TraceLab's own "round start" is the
    earliest event; the two differ only when a round waits for several tool results.)
``ttft_ms`` / ``e2e_ms``
    From arrival to the first output event (``reasoning``, ``text``, ``tool_call``) and to the
    last event of the round (``usage_report`` when logged, else the last output event). Event
    timestamps are client-side log times, so both are approximate; null when the round has no
    output event after arrival.
``tools``
    True: every TraceLab round is a coding-agent call that offers the agent's tools (the
    ``tools`` list records the calls actually made). ``structured_output`` is unknown (null).
``request_id``
    ``trace_key`` (unique across sessions), else ``round_id``.

The trace has no content, so ``prefix_hashes`` is empty and ``hashes_known`` False; prefix
reuse is known only through the provider's ``cached_tokens``. Detection: the first object has
``provider``, ``round_index`` and ``input_tokens_total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pipeline.ingest.readers.base import (
    JsonLinesReader,
    ReadContext,
    RecordError,
    iso_timestamp,
    optional_text,
    require,
    token_count,
)
from pipeline.ingest.readers.prompt_text import optional_field_text, optional_turn
from pipeline.ingest.readers.source import SourceFile

_KEYS = {"provider", "round_index", "input_tokens_total"}
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
OUTPUT_EVENTS = frozenset({"reasoning", "text", "tool_call"})


def _events(value: Any) -> list[tuple[str, datetime]]:
    if not isinstance(value, list) or not value:
        raise RecordError("timing_events", "missing" if not value else "not_a_list")
    events: list[tuple[str, datetime]] = []
    for index, event in enumerate(value):
        key = f"timing_events[{index}]"
        if not isinstance(event, Mapping):
            raise RecordError(key, "not_an_object", type(event).__name__)
        kind = event.get("event_type")
        if not isinstance(kind, str):
            raise RecordError(f"{key}.event_type", "missing" if kind is None else "not_a_string")
        events.append((kind, iso_timestamp(require(event, "timestamp"), f"{key}.timestamp")))
    return events


def round_timing(events: list[tuple[str, datetime]]) -> tuple[datetime, float | None, float | None]:
    """Arrival, ttft_ms and e2e_ms of one round from its (event type, time) list."""
    inputs = [t for kind, t in events if kind in INPUT_EVENTS]
    arrival = max(inputs) if inputs else min(t for _, t in events)
    outputs = [t for kind, t in events if kind in OUTPUT_EVENTS and t >= arrival]
    reports = [t for kind, t in events if kind == "usage_report" and t >= arrival]
    if not outputs:
        return arrival, None, None
    end = max(reports) if reports else max(outputs)
    ttft = (min(outputs) - arrival).total_seconds() * 1000.0
    e2e = (end - arrival).total_seconds() * 1000.0
    return arrival, ttft, e2e


class TraceLabReader(JsonLinesReader):
    name = "tracelab"
    description = (
        "TraceLab round_trace.jsonl (provider, session_id, round_index, "
        "token counts, timing_events)"
    )

    @property
    def needs(self) -> str:
        return f"JSONL, keys {', '.join(sorted(_KEYS))}"

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return obj.keys() >= _KEYS

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        prompt = token_count(require(obj, "input_tokens_total"), "input_tokens_total")
        cached = token_count(obj.get("prefix_tokens"), "prefix_tokens", allow_none=True)
        output = token_count(obj.get("output_tokens"), "output_tokens", allow_none=True)
        assert prompt is not None
        if cached is not None and cached > prompt:
            raise RecordError("prefix_tokens", "exceeds_prompt_tokens", f"{cached} > {prompt}")
        arrival, ttft_ms, e2e_ms = round_timing(_events(obj.get("timing_events")))
        row: dict[str, Any] = {
            "arrival": arrival,
            "session_id": optional_text(require(obj, "session_id"), "session_id"),
            "turn": optional_turn(obj.get("round_index"), "round_index"),
            "tenant": optional_field_text(obj, ("user", "project")),
            "model": optional_text(obj.get("model"), "model"),
            "prompt_tokens": prompt,
            "output_tokens": output,
            "cached_tokens": cached,
            "e2e_ms": e2e_ms,
            "ttft_ms": ttft_ms,
            "tools": True,
            "prefix_hashes": [],
            "prompt_blocks": 0,
            "hashes_known": False,
            "tokens_approximate": False,
        }
        request_id = optional_field_text(obj, ("trace_key", "round_id"))
        if request_id is not None:
            row["request_id"] = request_id
        return row
