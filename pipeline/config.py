"""The one configuration file (``enginefit.yaml``): loading, defaults and validation.

Each section belongs to one part of the pipeline. This module parses the sections every part
needs (``workload``, ``paths``); later parts parse their own section from :attr:`Config.raw`
with :meth:`Config.section`, so adding a part never changes this file's schema for the others.
The bundled ``enginefit.yaml`` documents every option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError
from pipeline.hashing import salt_fingerprint

SALT_ENV_VAR = "ENGINEFIT_HASH_SALT"
DEFAULT_ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class TraceSource:
    """One trace file (or glob) and the format to read it with (``auto`` detects by content)."""

    path: str
    format: str = "auto"
    label: str = ""  # the path as written in the configuration: recorded as lineage

    @property
    def display(self) -> str:
        return self.label or self.path


@dataclass(frozen=True)
class WorkloadConfig:
    name: str
    traces: tuple[TraceSource, ...]
    block_size: int = 16
    hash_salt: str = ""
    anchor: datetime = DEFAULT_ANCHOR
    tokenizer: str | None = None
    quarantine_warn_share: float = 0.01

    @property
    def salt_bytes(self) -> bytes:
        return self.hash_salt.encode()

    @property
    def salt_fingerprint(self) -> str:
        """A short, non-reversible tag of the salt, safe to print in reports and manifests."""
        return salt_fingerprint(self.salt_bytes)


@dataclass(frozen=True)
class PathsConfig:
    data_dir: Path = Path("data")
    reports_dir: Path = Path("reports")


@dataclass(frozen=True)
class Config:
    workload: WorkloadConfig
    paths: PathsConfig
    source: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        """A later part's own section (empty when absent), for it to validate itself."""
        value = self.raw.get(name) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{self._where()}: section '{name}' must be a mapping")
        return value

    def _where(self) -> str:
        return str(self.source) if self.source else "<config>"


def parse_anchor(value: Any, where: str) -> datetime:
    """An anchor date for relative timestamps: ISO-8601 date or datetime; naive means UTC."""
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(
                f"{where}: workload.anchor {value!r} is not an ISO-8601 date"
            ) from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def config_from_mapping(raw: dict[str, Any], *, source: Path | None = None) -> Config:
    where = str(source) if source else "<config>"
    base = source.parent if source else Path.cwd()
    workload = raw.get("workload")
    if not isinstance(workload, dict):
        raise ConfigError(f"{where}: missing 'workload' section")
    traces_raw = workload.get("traces")
    if not isinstance(traces_raw, list) or not traces_raw:
        raise ConfigError(f"{where}: workload.traces must list at least one trace file")
    traces = []
    for i, item in enumerate(traces_raw):
        entry = {"path": item} if isinstance(item, str) else item
        if not isinstance(entry, dict) or "path" not in entry:
            raise ConfigError(f"{where}: workload.traces[{i}] needs a 'path'")
        path = Path(str(entry["path"]))
        resolved = path if path.is_absolute() else base / path
        traces.append(
            TraceSource(
                path=str(resolved), format=str(entry.get("format", "auto")), label=str(path)
            )
        )
    salt = os.environ.get(SALT_ENV_VAR) or str(workload.get("hash_salt", ""))
    if not salt:
        raise ConfigError(
            f"{where}: workload.hash_salt is empty; set it (or {SALT_ENV_VAR}) to a secret so "
            "block hashes cannot be matched against known prompts"
        )
    share = float(workload.get("quarantine_warn_share", 0.01))
    if not 0 <= share <= 1:
        raise ConfigError(f"{where}: workload.quarantine_warn_share must be in [0, 1]")
    tokenizer = workload.get("tokenizer")
    if tokenizer is not None:
        tok_path = Path(str(tokenizer))
        tokenizer = str(tok_path if tok_path.is_absolute() else base / tok_path)
    paths_raw = raw.get("paths") or {}
    data_dir = Path(str(paths_raw.get("data_dir", "data")))
    reports_dir = Path(str(paths_raw.get("reports_dir", "reports")))
    return Config(
        workload=WorkloadConfig(
            name=str(workload.get("name", "workload")),
            traces=tuple(traces),
            block_size=_positive_int(workload.get("block_size", 16), "workload.block_size", where),
            hash_salt=salt,
            anchor=parse_anchor(workload.get("anchor", DEFAULT_ANCHOR.isoformat()), where),
            tokenizer=tokenizer,
            quarantine_warn_share=share,
        ),
        paths=PathsConfig(
            data_dir=data_dir if data_dir.is_absolute() else base / data_dir,
            reports_dir=reports_dir if reports_dir.is_absolute() else base / reports_dir,
        ),
        source=source,
        raw=raw,
    )


def load_config(path: str | Path) -> Config:
    source = Path(path).resolve()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{source}: configuration file not found") from exc
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections")
    return config_from_mapping(raw, source=source)
