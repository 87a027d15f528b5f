"""Mooncake FAST'25 JSONL: ``timestamp`` (ms since trace start), lengths, 512-token ``hash_ids``.

``timestamp``
    Milliseconds since the trace started, placed after the configured anchor date, as the
    published traces write it. A value of at least 10^12 ms cannot be an offset (it would be
    31 years into the trace) but is an epoch time in ms, as traces converted from a service's
    own logs write it: it is taken as that absolute time (1767225600000 is
    2026-01-01T00:00:00Z), not as the anchor plus 56 years. Values 10^3 times larger still (µs
    or ns epochs) are quarantined as ``timestamp_unit_mismatch``
    (:func:`~pipeline.readers.base.epoch_or_relative`).
``input_length`` / ``output_length``
    Prompt and output tokens (exact).
``hash_ids``
    One id per 512-token prompt block, the last one possibly partial (so exactly
    ⌈input_length / 512⌉ ids, else ``length_mismatch``). Only full blocks are cacheable: the
    partial last block's id is dropped, and ``prompt_blocks`` is ⌊input_length / 512⌋.
"""

from __future__ import annotations

from typing import Any

from pipeline.hashing import chain_hash_block_ids
from pipeline.readers.base import (
    JsonLinesReader,
    ReadContext,
    RecordError,
    epoch_or_relative,
    number,
    require,
    token_count,
)
from pipeline.readers.source import SourceFile

MOONCAKE_BLOCK_TOKENS = 512
_KEYS = {"timestamp", "input_length", "output_length", "hash_ids"}


class MooncakeReader(JsonLinesReader):
    name = "mooncake"
    description = (
        "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids of 512-token blocks)"
    )

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return obj.keys() >= _KEYS

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        arrival = epoch_or_relative(
            number(require(obj, "timestamp"), "timestamp"), "timestamp", ctx.anchor, "ms"
        )
        prompt = token_count(require(obj, "input_length"), "input_length")
        output = token_count(require(obj, "output_length"), "output_length")
        ids = require(obj, "hash_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise RecordError("hash_ids", "not_a_list_of_integers")
        assert prompt is not None
        expected = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != expected:
            raise RecordError(
                "hash_ids",
                "length_mismatch",
                f"{len(ids)} ids for {prompt} tokens, expected {expected}",
            )
        full = prompt // MOONCAKE_BLOCK_TOKENS
        return {
            "arrival": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "block_size": MOONCAKE_BLOCK_TOKENS,
            "prefix_hashes": chain_hash_block_ids(ids[:full], ctx.salt).tolist(),
            "prompt_blocks": full,
            "hashes_known": True,
            "tokens_approximate": False,
        }
