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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ValidationError,
    ValidationInfo,
)

from pipeline.bench.config import BenchConfig, is_limit_key, slo_from_mapping
from pipeline.capacity.config import CapacityConfig, ReplayBasis
from pipeline.decision.catalog import Catalog, load_catalog
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.errors import ConfigError, os_reason
from pipeline.ingest.config import SALT_ENV_VAR, IngestConfig, ReadConfig
from pipeline.layout import WorkloadLayout, child_folder
from pipeline.ledger import Filing, ReportTree
from pipeline.loadtest.config import LoadtestConfig
from pipeline.prefix.config import PrefixConfig
from pipeline.remote import STORAGE_OPTIONS, Mirror, check_url, is_url, mirror_of, options_of
from pipeline.report.config import Provenance, ReportConfig
from pipeline.report.signing import Signer, check_signer
from pipeline.settings import (
    SECTIONS,
    ConfigPath,
    Section,
    _resolve_path,
    default_mapping,
    load_yaml,
)
from pipeline.settings import validation_message as _message
from pipeline.shape.config import ShapeConfig
from pipeline.sim.config import SimConfig
from pipeline.whatif.config import NEW_DEPLOYMENT, WhatifConfig


def _folder_or_new(value: Any) -> Any:
    """Outputs go under these folders: an existing file there is refused before anything runs."""
    if isinstance(value, Path) and value.exists() and not value.is_dir():
        raise ValueError(f"{value} is a file, not a folder")
    return value


def _location(value: Any, info: ValidationInfo) -> Any:
    """An ``s3://bucket/prefix`` URL as written (normalised), else a path as every path is."""
    if is_url(value):
        return check_url(value)
    return _resolve_path(value, info)


def _storage_options(value: Any) -> Any:
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in STORAGE_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)}: one of {', '.join(sorted(STORAGE_OPTIONS))} "
                "(credentials come from the AWS environment variables or the machine's role, "
                "never from this file)"
            )
    return value


#: A folder on this machine, or on object storage (``s3://bucket/prefix``, :mod:`pipeline.mirror`).
Location = Annotated[Path | str, BeforeValidator(_location), AfterValidator(_folder_or_new)]


class PathsConfig(Section):
    data_dir: Location
    reports_dir: Location
    cache_dir: ConfigPath | None
    storage_options: Annotated[dict[str, str | bool], AfterValidator(_storage_options)]

    def _mirror(self, location: Path | str) -> Mirror | None:
        if isinstance(location, Path):
            return None
        cache = self.cache_dir or Path.home() / ".cache" / "enginefit" / "objects"
        return mirror_of(location, cache, options_of(self.storage_options))

    @property
    def data_mirror(self) -> Mirror | None:
        """The mirror of ``data_dir`` when it is on object storage."""
        return self._mirror(self.data_dir)

    @property
    def reports_mirror(self) -> Mirror | None:
        return self._mirror(self.reports_dir)

    @property
    def data_folder(self) -> Path:
        """Where this machine reads and writes workloads: ``data_dir``, or its mirror."""
        mirror = self.data_mirror
        return mirror.local if mirror else Path(self.data_dir)

    def report_folder(self, name: str) -> Path:
        """``<reports_dir>/<name>`` for a safe one-folder ``name`` (never outside reports_dir)."""
        mirror = self.reports_mirror
        root = mirror.local if mirror else Path(self.reports_dir)
        return child_folder(root, name, "report name")


class _File(BaseModel):
    """What a configuration file may contain: these sections and nothing else."""

    model_config = {"extra": "forbid", "frozen": True, "arbitrary_types_allowed": True}

    workload: IngestConfig | None = None
    paths: PathsConfig
    shape: ShapeConfig
    prefix: PrefixConfig
    bench: BenchConfig
    simulation: SimConfig
    capacity: CapacityConfig
    requirements: Requirements
    decision: DecisionConfig
    report: ReportConfig
    loadtest: LoadtestConfig
    whatif: WhatifConfig


# The sections after the workload, in the order the configuration is printed.
_PRINTED = SECTIONS[1:]


@dataclass(frozen=True)
class Config:
    """Every section, validated. ``workload`` is None when no configuration file was given."""

    workload: IngestConfig | None
    paths: PathsConfig
    shape: ShapeConfig
    prefix: PrefixConfig
    simulation: SimConfig
    bench: BenchConfig
    capacity: CapacityConfig
    requirements: Requirements
    decision: DecisionConfig
    report: ReportConfig
    loadtest: LoadtestConfig
    whatif: WhatifConfig
    read: ReadConfig
    source: Path | None = None

    def catalog(self) -> Catalog:
        """The engine catalog ``decision.catalog`` names (else the bundled one)."""
        return load_catalog(self.decision.catalog)

    def cache_replay(self) -> ReplayBasis:
        """How the capacity search replays the fleet's cache: the simulation section, with
        the shape section's latency model where the simulation names none."""
        return ReplayBasis(self.simulation, self.shape.latency)

    @property
    def where(self) -> str:
        return str(self.source) if self.source else "<defaults>"

    @property
    def base(self) -> Path:
        """The folder the file's relative paths start from (the current one without a file)."""
        return self.source.parent if self.source else Path.cwd()

    def require_workload(self) -> IngestConfig:
        if self.workload is None:
            raise ConfigError(
                "no workload configured: pass --config FILE with a workload section "
                "(or run the command in a folder holding enginefit.yaml)"
            )
        return self.workload

    def layout(self) -> WorkloadLayout:
        """Where this workload's outputs live: ``<paths.data_dir>/<workload.name>/``."""
        name = self.require_workload().name
        folder = child_folder(self.paths.data_folder, name, "workload.name")
        mirror = self.paths.data_mirror
        return WorkloadLayout(folder, mirror.child(name) if mirror else None)

    def filing(self) -> Filing:
        """Where this workload's report versions are published (``<paths.reports_dir>/<workload
        .name>/``) and the quarter a new one files under (``report.quarter``)."""
        name = self.require_workload().name
        folder = self.paths.report_folder(name)
        mirror = self.paths.reports_mirror
        return Filing(
            ReportTree(folder, mirror.child(name) if mirror else None), self.report.quarter
        )

    def as_dict(self) -> dict[str, Any]:
        """Every setting as plain data, the one serialisation of the configuration (printed by
        `enginefit config`, recorded in the report manifest); the salt only as its fingerprint:
        it is a secret."""
        workload = None
        if self.workload is not None:
            workload = self.workload.model_dump(mode="json", exclude={"hash_salt"})
            workload["hash_salt_fingerprint"] = self.workload.salt_fingerprint
        sections = {name: getattr(self, name).model_dump(mode="json") for name in _PRINTED}
        return {
            "source": str(self.source) if self.source else None,
            "workload": workload,
            **sections,
        }

    def provenance(self) -> Provenance:
        """What a report version records of this configuration (:meth:`as_dict` among it)."""
        workload = self.require_workload()
        return Provenance(
            source=self.source,
            configuration=self.as_dict(),
            traces=tuple(trace.path for trace in workload.traces),
            tokenizer=workload.tokenizer,
            bench_results=self.bench.results,
            bench_manifest=self.bench.manifest,
            catalog=self.decision.catalog,
        )

    def describe(self) -> str:
        """The line every command prints first: which configuration and workload it used."""
        if self.source is None:
            return "configuration: built-in defaults (no enginefit.yaml; pass --config FILE)"
        name = self.workload.name if self.workload else "none"
        return f"configuration: {self.source} (workload {name})"


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
        # An unknown key is said as one by the validation below, whatever its value.
        if name in _File.model_fields and section is not None and not isinstance(section, dict):
            raise ConfigError(f"{where}: section '{name}' must be a mapping")
    user = {k: v for k, v in raw.items() if v is not None}
    if source is not None and "workload" not in user:
        raise ConfigError(f"{where}: missing 'workload' section (name, traces)")
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
        read = ReadConfig.model_validate(
            {key: workload.get(key) for key in ReadConfig.model_fields}, context={"base": base}
        )
    except ValidationError as exc:
        raise ConfigError(_message(exc, _File, where)) from exc
    except ConfigError as exc:  # raised by a section's own parser (the SLO, prices)
        raise ConfigError(f"{where}: {exc}") from exc
    config = Config(
        workload=parsed.workload,
        paths=parsed.paths,
        shape=parsed.shape,
        prefix=parsed.prefix,
        simulation=parsed.simulation,
        bench=parsed.bench,
        capacity=parsed.capacity,
        requirements=parsed.requirements,
        decision=parsed.decision,
        report=parsed.report,
        loadtest=parsed.loadtest,
        whatif=parsed.whatif,
        read=read,
        source=source,
    )
    _check_engine_names(config, where)
    _check_scenario_slos(config, where)
    _check_signing(config.report, where)
    return config


def _check_signing(report: ReportConfig, where: str) -> None:
    """A signing key the allowed signers do not accept fails now, not after the whole run."""
    if report.signing_key is None or report.allowed_signers is None:
        return
    try:
        check_signer(Signer(report.signing_key, report.allowed_signers))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _check_scenario_slos(config: Config, where: str) -> None:
    """Each what-if scenario's SLO, merged over the configured one, is a valid SLO."""
    for name, changes in config.whatif.scenarios.items():
        if changes.slo is not None:
            slo_from_mapping(
                changes.slo, where=f"{where}: whatif.scenarios.{name}.slo", base=config.bench.slo
            )


def _check_engine_names(config: Config, where: str) -> None:
    """Engines the requirements name must be in the catalog (loaded only when one is named)."""
    named = [("requirements.current_engine", config.requirements.current_engine)]
    named += [
        (f"requirements.migration_engineer_weeks.{name}", name)
        for name in config.requirements.migration_engineer_weeks
    ]
    named += [
        (f"whatif.scenarios.{scenario}.current_engine", changes.current_engine)
        for scenario, changes in config.whatif.scenarios.items()
        if changes.current_engine != NEW_DEPLOYMENT
    ]
    named = [(key, name) for key, name in named if name is not None]
    if not named and config.decision.catalog is None:
        return
    catalog = config.catalog()
    for key, name in named:
        assert name is not None
        catalog.require_engine(name, f"{where}: {key}")


def default_config() -> Config:
    """The built-in defaults, with no workload (what an ad-hoc command runs with)."""
    return config_from_mapping({})


def load_config(path: str | Path) -> Config:
    try:
        source = Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop raises RuntimeError on 3.11
        why = os_reason(exc) if isinstance(exc, OSError) else "a symbolic link loop"
        raise ConfigError(f"{path}: cannot resolve the path ({why})") from exc
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
    raw = load_yaml(text, str(source)) or {}
    return config_from_mapping(raw, source=source)
