"""Shared test helpers: where the real public data lives, and a tiny workload configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when ../shared is absent (a fresh clone)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"{path} not available (../shared is only present in the development workspace)"
        )
    return path


def write_config(tmp_path: Path, traces: list[str], **workload: object) -> Path:
    """A minimal enginefit.yaml in ``tmp_path`` naming ``traces``; data goes under tmp_path."""
    lines = ["workload:", "  name: t", "  traces:"]
    lines += [f"    - path: {t}" for t in traces]
    settings = {"block_size": 16, "hash_salt": "test-salt", **workload}
    lines += [f"  {key}: {value}" for key, value in settings.items()]
    lines += [
        "paths:",
        f"  data_dir: {tmp_path / 'data'}",
        f"  reports_dir: {tmp_path / 'reports'}",
    ]
    path = tmp_path / "enginefit.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def shared_if_present(*parts: str) -> list[Path]:
    """``[path]`` when the ../shared file exists, else ``[]`` (for parametrize lists)."""
    path = SHARED.joinpath(*parts)
    return [path] if path.exists() else []
