"""What an input cannot support: a typed ``Unknown`` carrying its reason, never a 0 or a bare
null. Every stage result uses it for a figure it could not compute; ``pipeline.present``
renders it, the same way everywhere."""

from __future__ import annotations

from typing import TypeGuard, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class Unknown(BaseModel):
    """A figure the input cannot support, and why (one sentence a reader understands)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str


def is_known(value: T | Unknown) -> TypeGuard[T]:
    return not isinstance(value, Unknown)
