"""Mooncake FAST'25 JSONL: ``timestamp`` (ms since trace start), lengths, 512-token ``hash_ids``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pipeline.hashing import chain_hash_block_ids
from pipeline.readers.base import (
    JsonLinesReader,
    ReadContext,
    RecordError,
    check_arrival,
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
        millis = number(require(obj, "timestamp"), "timestamp")
        if millis < 0:
            raise RecordError("timestamp", "negative", f"value {millis}")
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
        # Only full blocks are cacheable: a partial last block's id never yields a hit.
        full = prompt // MOONCAKE_BLOCK_TOKENS
        return {
            "arrival": check_arrival(ctx.anchor + timedelta(milliseconds=millis), "timestamp"),
            "prompt_tokens": prompt,
            "output_tokens": output,
            "block_size": MOONCAKE_BLOCK_TOKENS,
            "prefix_hashes": chain_hash_block_ids(ids[:full], ctx.salt).tolist(),
            "prompt_blocks": full,
            "hashes_known": True,
            "tokens_approximate": False,
        }
