"""OpenAI-style chat-completion logs (JSON Lines): request ``messages``, response, ``usage``.

Accepted shapes (per line)
--------------------------
- nested: ``{"request": {...body...}, "response": {...body...}, "timestamp": ...}``
  (a ``body`` object inside either side, as in OpenAI batch files, is unwrapped too);
- flat: ``{"messages": [...], "choices": [...], "usage": {...}, "created": ...}``.

Field choices
-------------
arrival
    The log's own ``timestamp`` / ``ts`` (top level, then request) when present — ISO-8601 or
    epoch / relative seconds — else the response's ``created`` (epoch seconds, when the
    provider started the completion). Seconds rules as in
    :func:`~pipeline.ingest.readers.base.seconds_timestamp`.
counts
    ``usage.prompt_tokens``, ``usage.completion_tokens`` and
    ``usage.prompt_tokens_details.cached_tokens`` (Responses-API spellings ``input_tokens``,
    ``output_tokens``, ``input_tokens_details`` too) are authoritative when present. Without
    ``usage`` the counts are those of the rendering below (output: the first choice's message;
    null without a response). ``cached_tokens`` above ``prompt_tokens`` is quarantined.
hashes
    Always from the rendering below with ``ctx.tokenizer`` (``tokens_approximate`` is the
    tokenizer's flag, since the blocks are only as exact as the tokenizer). When the rendering
    has more full prompt blocks than ``usage.prompt_tokens`` fills (an approximate tokenizer
    counting more tokens than the provider did), ``prompt_blocks`` is capped at
    ⌊prompt_tokens / block_size⌋ so that every ingested row replays; the chain keeps its
    blocks (the next turn still hits them) and the ingest summary counts the capped rows
    (``prompt_blocks_capped``).
rendering
    Deterministic and segment-wise: the ``tools`` definitions (canonical JSON) as one leading
    segment, then per message a role header (``<|im_start|>role``, plus ``name``), the body
    and ``<|im_end|>``; the prompt ends with the assistant header. Every piece is tokenised on
    its own and the ids concatenated, so ``render(messages) + reply`` is exactly a prefix of
    ``render(messages + [reply, next user message])`` and block boundaries stay put across
    turns: a conversation's next request hits every full block of the previous prompt and
    reply. Content is a string or a list of parts; ``text`` parts are rendered, any other part
    (image, audio, file) as a placeholder ``<|type|>``. Assistant ``tool_calls`` (and legacy
    ``function_call``) render as ``<|tool_call|>name`` + arguments; tool messages render like
    any other message.
features
    ``structured_output``: ``response_format.type`` is ``json_object`` / ``json_schema`` or a
    vLLM guided-decoding parameter is set. ``tools``: a non-empty ``tools`` or ``functions``
    list. ``lora_adapter``: an explicit ``lora_adapter`` / ``lora`` / ``adapter`` string; model
    names are not guessed at.
ids and grouping
    ``request_id``: the response ``id`` (else a top-level ``request_id`` / ``id``). Session:
    ``session_id`` / ``conversation_id`` / ``thread_id`` (top level, request, or request
    ``metadata``). Tenant: ``tenant`` / ``tenant_id`` / the request's ``user``. Model: the
    response's ``model`` (the model that served it), else the request's.
latency
    Optional ``duration_s`` / ``latency_s`` (→ ``e2e_ms``), ``duration_ms`` / ``latency_ms``,
    ``ttft_s`` / ``ttft_ms`` at the top level.

Only the first choice is used when ``n > 1``. Message texts seen earlier in the same file are
tokenised once (:class:`SegmentCache`): chat logs repeat the conversation in every request.
Message text never leaves this module; errors name the field and a type or count.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from pipeline.ingest.readers.base import (
    PROMPT_BLOCKS_CAPPED,
    JsonLinesReader,
    ReadContext,
    ReadResult,
    RecordError,
    capped_prompt_blocks,
    content_blocks,
    optional_text,
    seconds_timestamp,
    token_count,
)
from pipeline.ingest.readers.prompt_text import (
    encode_text,
    first_key,
    optional_field_text,
    optional_ms,
    optional_seconds_as_ms,
    optional_turn,
)
from pipeline.ingest.readers.source import SourceFile

CHAT_SESSION_KEYS = ("session_id", "conversation_id", "thread_id", "session", "conversation")
CHAT_TENANT_KEYS = ("tenant", "tenant_id", "user", "user_id")
STRUCTURED_TYPES = frozenset({"json_object", "json_schema"})
GUIDED_KEYS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
LORA_KEYS = ("lora_adapter", "lora", "adapter")
END = "<|im_end|>\n"
TOOL_CALL = "<|tool_call|>"


def _unwrap(value: Any) -> Mapping[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    body = value.get("body")
    return body if isinstance(body, Mapping) else value


def split_record(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """The request body and the response body (None when the line has no response)."""
    request = _unwrap(obj.get("request")) or _unwrap(obj) or obj
    response = _unwrap(obj.get("response"))
    if response is None and ("choices" in obj or "usage" in obj):
        response = obj
    return request, response


class SegmentCache:
    """Token ids of recently seen message texts, for the duration of one file's read.

    Chat logs repeat the whole conversation in every request, so without it a conversation of
    n turns is tokenised n times over. Bounded by total characters; least recently used texts
    go first. It lives in memory only and is dropped when the file is read.
    """

    MIN_CHARS = 32  # shorter texts are cheaper to tokenise than to look up

    def __init__(self, max_chars: int = 64 * 2**20) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._ids: OrderedDict[str, list[int]] = OrderedDict()

    def encode(self, text: Any, key: str, ctx: ReadContext) -> list[int]:
        if not isinstance(text, str) or len(text) < self.MIN_CHARS:
            return encode_text(text, key, ctx)
        ids = self._ids.get(text)
        if ids is not None:
            self._ids.move_to_end(text)
            return ids
        ids = encode_text(text, key, ctx)
        self._ids[text] = ids
        self.chars += len(text)
        while self.chars > self.max_chars and self._ids:
            old, _ = self._ids.popitem(last=False)
            self.chars -= len(old)
        return ids


class _Renderer:
    """Tokenises the rendering piece by piece (a cache keeps fixed headers cheap)."""

    def __init__(self, ctx: ReadContext, cache: SegmentCache | None = None) -> None:
        self.ctx = ctx
        self.cache = cache
        self._fixed: dict[str, list[int]] = {}

    def fixed(self, text: str) -> list[int]:
        ids = self._fixed.get(text)
        if ids is None:
            ids = encode_text(text, "messages", self.ctx)
            if len(self._fixed) < 4096:
                self._fixed[text] = ids
        return ids

    def text(self, text: Any, key: str) -> list[int]:
        if self.cache is not None:
            return self.cache.encode(text, key, self.ctx)
        return encode_text(text, key, self.ctx)

    def header(self, message: Mapping[str, Any], key: str) -> list[int]:
        role = message.get("role")
        if not isinstance(role, str):
            raise RecordError(f"{key}.role", "missing" if role is None else "not_a_string")
        name = message.get("name")
        label = role if not isinstance(name, str) else f"{role} name={name}"
        return self.fixed(f"<|im_start|>{label}\n")

    def body(self, message: Mapping[str, Any], key: str) -> list[int]:
        ids: list[int] = []
        content = message.get("content")
        if isinstance(content, str):
            ids += self.text(content, f"{key}.content")
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    ids += self.text(part, f"{key}.content")
                elif not isinstance(part, Mapping):
                    raise RecordError(f"{key}.content", "not_a_content_part", type(part).__name__)
                elif part.get("type") in ("text", "input_text", "output_text"):
                    ids += self.text(part.get("text"), f"{key}.content.text")
                else:
                    kind = part.get("type")
                    ids += self.fixed(f"<|{kind if isinstance(kind, str) else 'part'}|>")
        elif content is not None:
            raise RecordError(f"{key}.content", "not_a_string_or_list", type(content).__name__)
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RecordError(f"{key}.tool_calls", "not_a_list", type(calls).__name__)
        legacy = message.get("function_call")
        for call in [*(calls or []), *([{"function": legacy}] if legacy is not None else [])]:
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping):
                raise RecordError(f"{key}.tool_calls", "not_a_function_call")
            name = function.get("name")
            ids += self.fixed(f"{TOOL_CALL}{name if isinstance(name, str) else ''}\n")
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = canonical_json(arguments, f"{key}.tool_calls.arguments")
            ids += self.text(arguments or "", f"{key}.tool_calls.arguments")
        return ids

    def message(self, message: Any, key: str) -> list[int]:
        if not isinstance(message, Mapping):
            raise RecordError(key, "not_an_object", type(message).__name__)
        return self.header(message, key) + self.body(message, key) + self.fixed(END)


def canonical_json(value: Any, key: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise RecordError(key, "not_serialisable") from None


def render(
    request: Mapping[str, Any],
    reply: Mapping[str, Any] | None,
    ctx: ReadContext,
    cache: SegmentCache | None = None,
) -> tuple[list[int], list[int] | None]:
    """Prompt token ids and (when there is a reply) output token ids of one exchange."""
    messages = request.get("messages")
    if messages is None:
        raise RecordError("messages", "missing")
    if not isinstance(messages, list):
        raise RecordError("messages", "not_a_list", type(messages).__name__)
    renderer = _Renderer(ctx, cache)
    prompt: list[int] = []
    tools = request.get("tools") or request.get("functions")
    if tools:
        prompt += renderer.fixed("<|im_start|>tools\n")
        prompt += renderer.text(canonical_json(tools, "tools"), "tools")
        prompt += renderer.fixed(END)
    for index, message in enumerate(messages):
        prompt += renderer.message(message, f"messages[{index}]")
    prompt += renderer.fixed("<|im_start|>assistant\n")
    if reply is None:
        return prompt, None
    output = renderer.body(reply, "choices[0].message") + renderer.fixed(END)
    return prompt, output


def _first_reply(response: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if response is None:
        return None
    choices = response.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        raise RecordError("choices", "not_a_list", type(choices).__name__)
    if not choices:
        return None
    first = choices[0]
    if not isinstance(first, Mapping):
        raise RecordError("choices[0]", "not_an_object", type(first).__name__)
    message = first.get("message")
    if message is None:
        text = first.get("text")  # completions-style choice
        return {"role": "assistant", "content": text} if isinstance(text, str) else None
    if not isinstance(message, Mapping):
        raise RecordError("choices[0].message", "not_an_object", type(message).__name__)
    return message


def _usage_count(usage: Mapping[str, Any], keys: tuple[str, ...], label: str) -> int | None:
    key = first_key(usage, keys)
    return None if key is None else token_count(usage[key], f"{label}.{key}")


def _cached(usage: Mapping[str, Any]) -> int | None:
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if details is None:
            continue
        if not isinstance(details, Mapping):
            raise RecordError(f"usage.{key}", "not_an_object", type(details).__name__)
        if details.get("cached_tokens") is not None:
            return token_count(details["cached_tokens"], f"usage.{key}.cached_tokens")
    return None


def _structured(request: Mapping[str, Any]) -> bool:
    fmt = request.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in STRUCTURED_TYPES:
        return True
    return any(request.get(key) is not None for key in GUIDED_KEYS)


def _lookup(
    key_sets: tuple[str, ...], *scopes: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any], str] | None:
    for scope in scopes:
        if scope is None:
            continue
        key = first_key(scope, key_sets)
        if key is not None:
            return scope, key
    return None


def _text_from(key_sets: tuple[str, ...], *scopes: Mapping[str, Any] | None) -> str | None:
    found = _lookup(key_sets, *scopes)
    return None if found is None else optional_text(found[0][found[1]], found[1])


class OpenAIChatReader(JsonLinesReader):
    name = "openai-chat"
    description = "OpenAI-style chat logs JSONL (messages, choices, usage, created/timestamp)"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def needs(self) -> str:
        return "JSONL, a messages list at the top level or under request or body"

    def detect_object(self, obj: dict[str, Any]) -> bool:
        request, _ = split_record(obj)
        return isinstance(request.get("messages"), list)

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        self._local.cache = SegmentCache()
        try:
            return super().read(source, ctx)
        finally:
            self._local.cache = None

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        request, response = split_record(obj)
        arrival_at = _lookup(("timestamp", "ts"), obj, request) or _lookup(
            ("created",), response, obj
        )
        if arrival_at is None:
            raise RecordError("timestamp", "missing", "no timestamp, ts or created")
        scope, ts_key = arrival_at
        arrival = seconds_timestamp(scope[ts_key], ts_key, ctx.anchor)

        reply = _first_reply(response)
        prompt_ids, output_ids = render(request, reply, ctx, getattr(self._local, "cache", None))
        hashes, prompt_blocks = content_blocks(prompt_ids, output_ids, ctx)

        usage = response.get("usage") if response is not None else None
        if usage is not None and not isinstance(usage, Mapping):
            raise RecordError("usage", "not_an_object", type(usage).__name__)
        usage = usage or {}
        prompt_tokens = _usage_count(usage, ("prompt_tokens", "input_tokens"), "usage")
        output_tokens = _usage_count(usage, ("completion_tokens", "output_tokens"), "usage")
        cached_tokens = _cached(usage)
        if prompt_tokens is None:
            prompt_tokens = token_count(len(prompt_ids), "messages")
        if output_tokens is None and output_ids is not None:
            output_tokens = len(output_ids)
        assert prompt_tokens is not None
        if cached_tokens is not None and cached_tokens > prompt_tokens:
            raise RecordError(
                "usage.prompt_tokens_details.cached_tokens",
                "exceeds_prompt_tokens",
                f"{cached_tokens} > {prompt_tokens}",
            )

        metadata = request.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else None
        model = _text_from(("model",), response, request)
        row: dict[str, Any] = {
            "arrival": arrival,
            "session_id": _text_from(CHAT_SESSION_KEYS, obj, request, metadata),
            "turn": _turn(obj, request),
            "tenant": _text_from(CHAT_TENANT_KEYS, obj, request, metadata),
            "model": model,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "cached_tokens": cached_tokens,
            "e2e_ms": _latency(obj, ("duration_s", "latency_s"), ("duration_ms", "latency_ms")),
            "ttft_ms": _latency(obj, ("ttft_s",), ("ttft_ms",)),
            "structured_output": _structured(request),
            "tools": bool(request.get("tools") or request.get("functions")),
            "lora_adapter": _text_from(LORA_KEYS, obj, request),
            "prefix_hashes": hashes,
            "prompt_blocks": capped_prompt_blocks(prompt_blocks, prompt_tokens, ctx.block_size),
            "hashes_known": True,
            "tokens_approximate": ctx.tokenizer.approximate,
            PROMPT_BLOCKS_CAPPED: prompt_blocks * ctx.block_size > prompt_tokens,
        }
        request_id = _text_from(("id",), response) or optional_field_text(obj, ("request_id", "id"))
        if request_id is not None:
            row["request_id"] = request_id
        return row


def _turn(obj: Mapping[str, Any], request: Mapping[str, Any]) -> int | None:
    found = _lookup(("turn",), obj, request)
    return None if found is None else optional_turn(found[0]["turn"], "turn")


def _latency(
    obj: Mapping[str, Any], seconds_keys: tuple[str, ...], ms_keys: tuple[str, ...]
) -> float | None:
    key = first_key(obj, seconds_keys)
    if key is not None:
        return optional_seconds_as_ms(obj[key], key)
    key = first_key(obj, ms_keys)
    return None if key is None else optional_ms(obj[key], key)
