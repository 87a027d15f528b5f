"""Pluggable tokenisers: the model's own ``tokenizer.json`` when configured, else an approximation.

The built-in approximation is deterministic and needs no download; every output built on it is
labelled approximate (``tokens_approximate`` in the canonical table). Text goes in, token ids
come out; neither is ever written anywhere.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import ConfigError

# Word pieces of at most 6 word characters (with their leading space), digit runs of at most 3,
# single punctuation marks and whitespace runs: close to BPE counts on English text and code.
_PIECE = re.compile(r" ?[^\W\d_]{1,6}| ?\d{1,3}| ?[^\w\s]|\s+|_")


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def approximate(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...


@lru_cache(maxsize=1 << 16)
def _piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class ApproximateTokenizer:
    """Regex pieces mapped to stable 32-bit ids (CRC-32 of the piece)."""

    name: str = "approximate-regex-v1"
    approximate: bool = True

    def encode(self, text: str) -> list[int]:
        return [_piece_id(piece) for piece in _PIECE.findall(text)]


@dataclass(frozen=True)
class HuggingFaceTokenizer:
    """A local ``tokenizer.json`` through the ``tokenizers`` package (no network access)."""

    path: str
    name: str = ""
    approximate: bool = False
    _impl: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_file(cls, path: str | Path) -> HuggingFaceTokenizer:
        from tokenizers import Tokenizer as HFTokenizer  # import here: heavy, only when configured

        try:
            impl = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise ConfigError(f"{path}: cannot load tokenizer.json: {exc}") from exc
        return cls(path=str(path), name=f"tokenizer.json:{Path(path).name}", _impl=impl)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._impl.encode(text, add_special_tokens=False).ids
        return ids


def make_tokenizer(path: str | None) -> Tokenizer:
    return HuggingFaceTokenizer.from_file(path) if path else ApproximateTokenizer()
