"""Published report versions and their ledger.

    reports/<workload>/index.json                 the ledger: every published version, in order
    reports/<workload>/<YYYY-Qn>/v<N>/            one version, never overwritten:
        engine-selection.pdf, engine-selection.html, decision.json, manifest.json

A version is built in a hidden staging folder beside it and renamed into place in one step;
only then is its ledger entry appended (the ledger is rewritten atomically). A crash therefore
leaves either nothing or a complete version folder that the ledger does not list yet: the next
run checks such a folder (its manifest's output hashes) and lists it, so the ledger stays valid
and no version number is ever reused. Staging leftovers are removed (enginefit made them).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.errors import InputFormatError
from pipeline.settings import QUARTER
from pipeline.store import sha256_file, write_bytes_atomic, write_json_atomic

VERSION = re.compile(r"^v([1-9]\d*)$")
STAGING_PREFIX = ".staging-"
LEDGER = "index.json"
MANIFEST = "manifest.json"
PDF = "engine-selection.pdf"
HTML = "engine-selection.html"
RECORD = "decision.json"
LEDGER_SCHEMA = 1


def quarter_of(instant: dt.date | dt.datetime | str) -> str:
    """``2025-02-21T00:57:32Z`` → ``2025-Q1``."""
    if isinstance(instant, str):
        instant = dt.datetime.fromisoformat(instant.replace("Z", "+00:00"))
    return f"{instant.year}-Q{(instant.month - 1) // 3 + 1}"


def quarter_key(quarter: str) -> tuple[int, int]:
    match = QUARTER.match(quarter)
    if match is None:
        raise InputFormatError(f"{quarter!r} is not a quarter (YYYY-Qn, e.g. 2026-Q3)")
    return int(match.group(1)), int(match.group(2))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_of(path: Path) -> str | None:
    """A file's sha256, or None when it is missing or unreadable (what an audit reports)."""
    try:
        return sha256_file(path)
    except OSError:
        return None


@dataclass(frozen=True)
class Entry:
    """One ledger line."""

    quarter: str
    version: int
    path: str  # relative to the workload's report folder
    identity: str  # sha256 of what the version was made from (inputs, config, catalog, code)
    manifest_sha256: str
    headline: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ReportTree:
    """The report folder of one workload."""

    root: Path

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER

    def version_dir(self, quarter: str, version: int) -> Path:
        return self.root / quarter / f"v{version}"

    def read_ledger(self) -> list[Entry]:
        if not self.ledger.is_file():
            return []
        try:
            raw = json.loads(self.ledger.read_text(encoding="utf-8"))
            entries = [Entry(**e) for e in raw["versions"]]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise InputFormatError(
                f"{self.ledger}: not an enginefit report ledger ({exc}); it is append-only and "
                "never rewritten by hand: restore it from your backup"
            ) from exc
        return entries

    def write_ledger(self, entries: list[Entry]) -> None:
        write_json_atomic(
            self.ledger,
            {"schema_version": LEDGER_SCHEMA, "versions": [e.as_dict() for e in entries]},
        )

    def latest(self, quarter: str | None = None) -> Entry | None:
        """The newest version (of ``quarter`` when given)."""
        entries = [e for e in self.read_ledger() if quarter is None or e.quarter == quarter]
        return max(entries, key=_order, default=None)

    def compared_with(self, quarter: str) -> Entry | None:
        """What a new version of ``quarter`` compares with: the latest version of that quarter,
        else the latest of the most recent earlier quarter, else (a quarter before every
        published one) the earliest later quarter's latest: never "the first" while any exists."""
        same = self.latest(quarter)
        if same is not None:
            return same
        entries = self.read_ledger()
        earlier = [e for e in entries if quarter_key(e.quarter) < quarter_key(quarter)]
        if earlier:
            return max(earlier, key=_order)
        nearest = min((quarter_key(e.quarter) for e in entries), default=None)
        later = [e for e in entries if quarter_key(e.quarter) == nearest]
        return max(later, key=_order, default=None)

    def reconcile(self) -> list[Entry]:
        """List complete version folders the ledger misses (a crash between the rename and the
        ledger write), remove staging leftovers; returns the entries added."""
        if not self.root.is_dir():
            return []
        entries = self.read_ledger()
        listed = {(e.quarter, e.version) for e in entries}
        added = []
        for quarter_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not QUARTER.match(quarter_dir.name):
                continue
            for child in sorted(quarter_dir.iterdir()):
                if child.name.startswith(STAGING_PREFIX):
                    shutil.rmtree(child, ignore_errors=True)
                    continue
                match = VERSION.match(child.name)
                if match is None or (quarter_dir.name, int(match.group(1))) in listed:
                    continue
                entry = _entry_of(self, child, quarter_dir.name, int(match.group(1)))
                if entry is not None:
                    added.append(entry)
        if added:
            self.write_ledger(sorted([*entries, *added], key=_order))
        return added

    def next_version(self, quarter: str) -> int:
        """The number a new version of ``quarter`` gets: past every listed or existing one."""
        folder = self.root / quarter
        on_disk = [
            int(m.group(1))
            for p in (folder.iterdir() if folder.is_dir() else ())
            if (m := VERSION.match(p.name)) is not None
        ]
        listed = [e.version for e in self.read_ledger() if e.quarter == quarter]
        return max([0, *on_disk, *listed]) + 1

    def publish(
        self,
        quarter: str,
        version: int,
        files: dict[str, bytes],
        manifest: dict[str, Any],
        headline: str,
    ) -> tuple[Entry, Path]:
        """Write version ``version`` of ``quarter`` (files, then the manifest with every
        output's sha256), move it into place, then append it to the ledger. Refused when that
        version exists (another run published it meanwhile): nothing is ever replaced."""
        quarter_key(quarter)
        quarter_dir = self.root / quarter
        quarter_dir.mkdir(parents=True, exist_ok=True)
        staging = quarter_dir / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
        staging.mkdir()
        try:
            for name, data in sorted(files.items()):
                write_bytes_atomic(staging / name, data)
            outputs = {name: sha256_bytes(data) for name, data in sorted(files.items())}
            manifest_bytes = _json_bytes({**manifest, "outputs": outputs})
            write_bytes_atomic(staging / MANIFEST, manifest_bytes)
            target = self.version_dir(quarter, version)
            if target.exists() or version != self.next_version(quarter):
                raise InputFormatError(
                    f"{target}: another enginefit run published this version meanwhile; run "
                    "again (published versions are never replaced)"
                )
            staging.rename(target)  # atomic
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        entry = Entry(
            quarter=quarter,
            version=version,
            path=str(target.relative_to(self.root)),
            identity=str(manifest["identity"]),
            manifest_sha256=sha256_bytes(manifest_bytes),
            headline=headline,
        )
        self.write_ledger(sorted([*self.read_ledger(), entry], key=_order))
        return entry, target


def _order(entry: Entry) -> tuple[int, int, int]:
    return (*quarter_key(entry.quarter), entry.version)


def _json_bytes(payload: Any) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def output_differences(folder: Path, outputs: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """``(name, recorded sha256, sha256 now)`` of each output of a version folder that does not
    match its manifest (now None: missing); empty for a complete, untouched version."""
    now = {name: sha256_of(folder / name) for name in sorted(outputs)}
    return [
        (name, outputs[name], now[name]) for name in sorted(outputs) if now[name] != outputs[name]
    ]


def _entry_of(tree: ReportTree, folder: Path, quarter: str, version: int) -> Entry | None:
    """The ledger entry of a complete version folder (its outputs match its manifest)."""
    manifest_path = folder / MANIFEST
    try:
        data = manifest_path.read_bytes()
        manifest = json.loads(data)
        outputs = manifest["outputs"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    if output_differences(folder, outputs):
        return None
    return Entry(
        quarter=quarter,
        version=version,
        path=str(folder.relative_to(tree.root)),
        identity=str(manifest.get("identity", "")),
        manifest_sha256=sha256_bytes(data),
        headline=str(manifest.get("headline", "")),
    )


def report_tree(config: Config) -> ReportTree:
    """The published versions of the configured workload."""
    return ReportTree(config.paths.report_folder(config.require_workload().name))


def report_quarter(config: Config, last_arrival: str | None) -> str:
    """``report.quarter``, else the quarter of the workload's last arrival."""
    if config.report.quarter is not None:
        return config.report.quarter
    if not last_arrival:
        raise InputFormatError(
            "the workload has no arrivals to date the report: set report.quarter (YYYY-Qn)"
        )
    return quarter_of(last_arrival)
