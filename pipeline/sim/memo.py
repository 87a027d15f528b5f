"""The one large stage input a process keeps between the steps that share it.

A Dagster run whose steps share a process (``enginefit report``'s in-process executor) runs the
simulation's scenario steps one after another on the same flattened workload: keeping it saves
flattening and numbering its blocks once per step. Only one input is kept, of any stage, so a
process never holds two workloads' arrays; a stage that loads a large input of its own calls
:func:`release` first, so what the previous stage kept is not held beside it (at 10M requests
each is gigabytes).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_KEPT: dict[Hashable, Any] = {}


def reuse(key: Hashable, build: Callable[[], T]) -> T:
    """The value kept under ``key``, else ``build()``'s, kept in place of whatever was."""
    if key in _KEPT:
        kept: T = _KEPT[key]
        return kept
    _KEPT.clear()  # before building: the old input's memory is free for the new one
    value = _KEPT[key] = build()
    return value


def release() -> None:
    """Let go of the kept input."""
    _KEPT.clear()
