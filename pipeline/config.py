"""The whole ``enginefit.yaml``, parsed once into typed sections reached as ``config.<stage>``.

Loading merges the user's file over ``pipeline/defaults.yaml`` (the one place every default is
written and documented), then validates every section strictly (:mod:`pipeline.settings`): an
unknown section or key anywhere, a wrong type, or an out-of-range value is a
:class:`~pipeline.errors.ConfigError` naming the file and the dotted key. Paths in the file are
relative to the file's folder. Without a file (ad-hoc commands) the defaults apply and there is
no workload.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, ValidationInfo

from pipeline.bench.config import BenchSettings
from pipeline.bench.slo import is_limit_key
from pipeline.errors import ConfigError
from pipeline.hashing import salt_fingerprint
from pipeline.layout import WorkloadLayout
from pipeline.prefix.config import PrefixConfig
from pipeline.settings import (
    BlockSize,
    ConfigInstant,
    ConfigPath,
    Fraction,
    Section,
)
from pipeline.settings import validation_message as _message
from pipeline.shape.config import ShapeConfig
from pipeline.sim.config import SimulationConfig

SALT_ENV_VAR = "ENGINEFIT_HASH_SALT"
WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _known_format(value: Any) -> Any:
    from pipeline.readers import FORMAT_NAMES  # readers import this module's neighbours

    if isinstance(value, str) and value not in ("auto", *FORMAT_NAMES):
        raise ValueError(f"unknown format {value!r}; choose auto or one of {FORMAT_NAMES}")
    return value


class TraceSource(Section):
    """One trace file (or glob): ``path`` resolved, ``label`` as written (recorded as lineage)."""

    path: str
    format: Annotated[str, BeforeValidator(_known_format)]
    label: str

    @property
    def display(self) -> str:
        return self.label or self.path


def _trace_entries(value: Any, info: ValidationInfo) -> Any:
    """``[path, {path, format}, …]`` → trace entries with the path resolved against the file."""
    if not isinstance(value, list):
        return value
    base = (info.context or {}).get("base")
    entries = []
    for item in value:
        entry = {"path": item} if isinstance(item, str) else item
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            written = Path(entry["path"])
            resolved = written if written.is_absolute() or base is None else Path(base) / written
            entry = {"format": "auto", **entry, "path": str(resolved), "label": str(written)}
        entries.append(entry)
    return tuple(entries)


def _slug(value: Any) -> Any:
    if isinstance(value, str) and not WORKLOAD_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a workload name: use letters, digits, '.', '_' and '-' "
            "(it names the output folder, so no '/' or '..')"
        )
    return value


class WorkloadSettings(Section):
    name: Annotated[str, BeforeValidator(_slug)]
    traces: Annotated[tuple[TraceSource, ...], BeforeValidator(_trace_entries), Field(min_length=1)]
    block_size: BlockSize
    hash_salt: Annotated[str, Field(min_length=1)]
    anchor: ConfigInstant
    tokenizer: ConfigPath | None
    quarantine_warn_share: Fraction

    @property
    def salt_bytes(self) -> bytes:
        return self.hash_salt.encode()

    @property
    def salt_fingerprint(self) -> str:
        """A short, non-reversible tag of the salt, safe to print in reports and manifests."""
        return salt_fingerprint(self.salt_bytes)


class ReadSettings(Section):
    """How trace files are read: the workload's settings, or the defaults when there is none."""

    block_size: BlockSize
    anchor: ConfigInstant
    tokenizer: ConfigPath | None


class PathsSettings(Section):
    data_dir: ConfigPath
    reports_dir: ConfigPath


class _File(BaseModel):
    """What a configuration file may contain: these sections and nothing else."""

    model_config = {"extra": "forbid", "frozen": True, "arbitrary_types_allowed": True}

    workload: WorkloadSettings | None = None
    paths: PathsSettings
    shape: ShapeConfig
    prefix: PrefixConfig
    bench: BenchSettings
    simulation: SimulationConfig


@dataclass(frozen=True)
class Config:
    """Every section, validated. ``workload`` is None when no configuration file was given."""

    workload: WorkloadSettings | None
    paths: PathsSettings
    shape: ShapeConfig
    prefix: PrefixConfig
    simulation: SimulationConfig
    bench: BenchSettings
    read: ReadSettings
    source: Path | None = None

    @property
    def where(self) -> str:
        return str(self.source) if self.source else "<defaults>"

    def require_workload(self) -> WorkloadSettings:
        if self.workload is None:
            raise ConfigError(
                "no workload configured: pass --config FILE with a workload section "
                "(or run the command in a folder holding enginefit.yaml)"
            )
        return self.workload

    def layout(self) -> WorkloadLayout:
        """Where this workload's outputs live: ``<paths.data_dir>/<workload.name>/``."""
        return WorkloadLayout(self.paths.data_dir / self.require_workload().name)

    def as_dict(self) -> dict[str, Any]:
        """Every setting as plain data (the salt only as its fingerprint: it is a secret)."""
        workload = None
        if self.workload is not None:
            workload = self.workload.model_dump(mode="json", exclude={"hash_salt"})
            workload["hash_salt_fingerprint"] = self.workload.salt_fingerprint
        return {
            "source": str(self.source) if self.source else None,
            "workload": workload,
            "paths": self.paths.model_dump(mode="json"),
            "shape": self.shape.model_dump(mode="json"),
            "prefix": self.prefix.model_dump(mode="json"),
            "simulation": _plain(self.simulation),
            "bench": self.bench.as_dict(),
        }

    def describe(self) -> str:
        """The line every command prints first: which configuration and workload it used."""
        if self.source is None:
            return "configuration: built-in defaults (no enginefit.yaml; pass --config FILE)"
        name = self.workload.name if self.workload else "none"
        return f"configuration: {self.source} (workload {name})"


def _plain(section: Any) -> Any:
    """A settings object as JSON-ready data."""
    if isinstance(section, BaseModel):
        return section.model_dump(mode="json")
    return json.loads(json.dumps(dataclasses.asdict(section), default=str))


@cache
def _defaults_text() -> str:
    return resources.files("pipeline").joinpath("defaults.yaml").read_text(encoding="utf-8")


def default_mapping() -> dict[str, Any]:
    """``pipeline/defaults.yaml`` as a fresh mapping."""
    raw = yaml.safe_load(_defaults_text())
    assert isinstance(raw, dict)  # a packaging bug, never user input
    return raw


def _merge(
    base: dict[str, Any], override: dict[str, Any], path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``override`` over ``base``: mappings merge key by key, anything else replaces.

    One exception: an SLO that names any latency limit replaces the default limits (its options
    still default), so ``slo: {ttft_p99_ms: 500}`` is that limit alone, not added to the default.
    """
    out = copy.deepcopy(base)
    if path == ("bench", "slo") and any(is_limit_key(str(k)) for k in override):
        out = {k: v for k, v in out.items() if not is_limit_key(str(k))}
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, (*path, str(key)))
        else:
            out[key] = value
    return out


def config_from_mapping(raw: dict[str, Any], *, source: Path | None = None) -> Config:
    """Validate a configuration mapping (the parsed YAML) merged over the defaults."""
    where = str(source) if source else "<config>"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: top level must be a mapping of sections")
    for name, section in raw.items():
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"{where}: section '{name}' must be a mapping")
    user = {k: v for k, v in raw.items() if v is not None}
    if source is not None and "workload" not in user:
        raise ConfigError(f"{where}: missing 'workload' section (name, traces, hash_salt)")
    if "workload" in user and os.environ.get(SALT_ENV_VAR):
        user["workload"] = {**user["workload"], "hash_salt": os.environ[SALT_ENV_VAR]}
    defaults = default_mapping()
    workload = _merge(defaults.pop("workload"), user.get("workload") or {})
    merged = _merge(defaults, user)
    if "workload" in user:
        merged["workload"] = workload
    base = source.parent if source else Path.cwd()
    try:
        parsed = _File.model_validate(merged, context={"base": base})
        read = ReadSettings.model_validate(
            {key: workload.get(key) for key in ReadSettings.model_fields}, context={"base": base}
        )
    except ValidationError as exc:
        raise ConfigError(_message(exc, _File, where)) from exc
    except ConfigError as exc:  # raised by a section's own parser (the SLO, prices)
        raise ConfigError(f"{where}: {exc}") from exc
    return Config(
        workload=parsed.workload,
        paths=parsed.paths,
        shape=parsed.shape,
        prefix=parsed.prefix,
        simulation=parsed.simulation,
        bench=parsed.bench,
        read=read,
        source=source,
    )


def default_config() -> Config:
    """The built-in defaults, with no workload (what an ad-hoc command runs with)."""
    return config_from_mapping({})


def load_config(path: str | Path) -> Config:
    source = Path(path).resolve()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{source}: configuration file not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{source}: is a folder, not a configuration file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    return config_from_mapping(raw, source=source)
