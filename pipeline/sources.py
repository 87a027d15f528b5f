"""Citations: what the decision record and the selection document cite, and how to find them.

A cite is a document of this repository with an optional section anchor
(``docs/decision-rules.md#hardware``: the rules, their thresholds and their primary sources) or
an upstream URL. Rules cite their section as their whole ``source``; a revisit trigger's reason
starts with its section (``docs/decision-rules.md#concurrency: peak concurrency ≤ 2 …``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# A repository document (optionally at a heading anchor), or an http(s) URL up to whitespace.
CITE = re.compile(r"\bdocs/[\w.-]+\.md(?:#[\w-]+)?|https?://[^\s<>\"')]+")
# Punctuation that ends a sentence after a URL rather than belonging to it.
_TRAILING = ".,;:"


def cites_in(text: str) -> list[str]:
    """The cites in ``text``, in order of appearance (a sentence's full stop is not part of a
    URL)."""
    return [match.group().rstrip(_TRAILING) for match in CITE.finditer(text)]


def split_cite(text: str) -> tuple[str | None, str]:
    """A trigger reason's leading cite and its words (``None`` and the text when it has none)."""
    cite, sep, words = text.partition(": ")
    if sep and CITE.fullmatch(cite):
        return cite, words
    return None, text


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if not value.startswith("data:"):  # an embedded figure, not text
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def cited_sources(content: Any) -> list[str]:
    """Every distinct cite in any text of ``content`` (nested dicts and lists of strings),
    sorted: the document's sources list, built from what its text actually cites."""
    return sorted({cite for text in _strings(content) for cite in cites_in(text)})
