"""Token-id JSON Lines: the exact, tokenizer-free input.

Shape (issue 2, format f)::

    {"ts": 3.25, "session_id": "s1", "prompt_token_ids": [1, 2, ...],
     "output_token_ids": [7, 8, ...]}        # or "output_tokens": 42 (a count)

Field choices
-------------
``ts`` (or ``timestamp``)
    Seconds, epoch or relative to the anchor date
    (:func:`~pipeline.readers.base.seconds_timestamp`: ms / µs epoch values are quarantined as
    a unit mix-up).
``prompt_token_ids``
    Required list of integer ids in ``[0, 2**32)``; ``prompt_tokens`` is its length.
``output_token_ids``
    When present, chained after the prompt ids (the next turn, which repeats them, hits) and
    its length is ``output_tokens``. A separate ``output_tokens`` count is then cross-checked:
    a disagreement is quarantined (``length_mismatch``), since this format claims exactness.
``output_tokens``
    The output count when no ids are given; null when neither is.
optional
    ``session_id`` / ``session`` / ``conversation_id``, ``turn``, ``tenant`` / ``user``,
    ``model``, ``request_id`` / ``id``, ``duration_s`` / ``ttft_s`` (→ ``e2e_ms`` / ``ttft_ms``).

Counts are exact (``tokens_approximate`` is False). Detection: the first object has
``prompt_token_ids``. Token ids are never written anywhere, only their salted chain hashes.
"""

from __future__ import annotations

from typing import Any

from pipeline.readers.base import (
    JsonLinesReader,
    ReadContext,
    RecordError,
    require,
    token_count,
    token_ids,
)
from pipeline.readers.prompt_text import content_row, line_arrival
from pipeline.readers.source import SourceFile


class TokenIdsReader(JsonLinesReader):
    name = "token-ids"
    description = (
        "Token-id JSONL (ts s, session_id, prompt_token_ids, output_token_ids or output_tokens)"
    )

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return "prompt_token_ids" in obj

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        arrival = line_arrival(obj, ctx)
        prompt_ids = token_ids(require(obj, "prompt_token_ids"), "prompt_token_ids")
        output_ids = None
        if obj.get("output_token_ids") is not None:
            output_ids = token_ids(obj["output_token_ids"], "output_token_ids")
        output_tokens = token_count(obj.get("output_tokens"), "output_tokens", allow_none=True)
        if output_ids is not None:
            if output_tokens is not None and output_tokens != len(output_ids):
                raise RecordError(
                    "output_tokens",
                    "length_mismatch",
                    f"{output_tokens} != {len(output_ids)} output_token_ids",
                )
            output_tokens = len(output_ids)
        return content_row(
            obj, arrival, prompt_ids, output_ids, output_tokens, ctx, approximate=False
        )
