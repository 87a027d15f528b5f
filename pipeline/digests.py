"""SHA-256 digests of files, read a block at a time (never held whole)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

_BLOCK = 1 << 20


def sha256_of(handle: BinaryIO) -> str:
    """The SHA-256 of what ``handle`` holds from where it stands to its end."""
    digest = hashlib.sha256()
    while chunk := handle.read(_BLOCK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return sha256_of(handle)
