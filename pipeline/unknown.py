"""What an input cannot support: a typed ``Unknown`` carrying its reason, never a 0 or a bare
null. Every stage result uses it for a figure it could not compute; ``pipeline.present``
renders it, the same way everywhere."""

from __future__ import annotations

from typing import TypeGuard, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer

T = TypeVar("T")


class Unknown(BaseModel):
    """A figure the input cannot support, and why (one sentence a reader understands)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str


def is_known(value: T | Unknown) -> TypeGuard[T]:
    return not isinstance(value, Unknown)


class ResultModel(BaseModel):
    """Base of every typed stage result: immutable, and a key the model does not name is an
    error (a file written by another version fails on reading, not later in a consumer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _null_if_unknown(value: object) -> object:
    return None if isinstance(value, Unknown) else value


# On disk an unknown figure stays ``null`` (its reason is written once beside it, in the key
# each file has always used); in memory it is the ``Unknown`` carrying that reason.
NullIfUnknown = PlainSerializer(_null_if_unknown)
