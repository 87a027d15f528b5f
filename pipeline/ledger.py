"""Published report versions and their ledger: what the report stage publishes, and the decision
reads back (the previous version's record, whose triggers each run checks).

    reports/<workload>/index.json                 the ledger: every published version, in order
    reports/<workload>/<YYYY-Qn>/v<N>/            one version, never overwritten:
        engine-selection.pdf, engine-selection.html, decision.json, manifest.json

The ledger is a hash chain in publication order: each entry records when it was appended
(``published_at``, UTC) and the sha256 of the entry before it (``previous_sha256``), so an
entry edited after a later one was appended breaks the chain at the next entry, and the hash
of the last entry (the chain head, :func:`chain_head`) stands for the whole ledger: recorded
elsewhere, it exposes even a consistent rewrite of the ledger (``enginefit audit
--chain-head``).

A version is built in a hidden staging folder beside it (its manifest signed there when
``report.signing_key`` is set, :mod:`pipeline.report.signing`) and renamed into place in one
step; only then is its ledger entry appended (the ledger is rewritten atomically). A crash
therefore leaves either nothing or a complete version folder that the ledger does not list
yet: the next run checks such a folder (its manifest's output hashes) and lists it, so the
ledger stays valid and no version number is ever reused. Staging leftovers are removed (enginefit made them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputFormatError
from pipeline.mirror import forget_version, publish_version, push_ledger
from pipeline.remote import Mirror
from pipeline.safe_read import open_regular, parse_json, read_json, read_regular
from pipeline.settings import QUARTER
from pipeline.store import write_bytes_atomic, write_json_atomic

VERSION = re.compile(r"^v([1-9]\d*)$")
STAGING_PREFIX = ".staging-"
LEDGER = "index.json"
# The temporary file an atomic write of the ledger renames into place (pipeline.store).
_LEDGER_LEFTOVER = re.compile(r"^\.index\.json\.[0-9a-f]{12}$")
MANIFEST = "manifest.json"
PDF = "engine-selection.pdf"
HTML = "engine-selection.html"
RECORD = "decision.json"
SIGNATURE = "manifest.json.sig"
# The kind of an input shipped with enginefit (the bundled catalog): its path is relative to
# the installation, the folder holding the ``pipeline`` package.
BUNDLED_INPUT = "bundled"
INSTALLATION = Path(__file__).resolve().parents[1]
LEDGER_SCHEMA = 2
SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: The decision record's measurement the ledger keeps for each engine, quarter over quarter:
#: the capacity the serving model predicted for the workload without its own traffic, against
#: the capacity measured on that traffic (predicted ÷ measured − 1; null: unknown), under
#: ``capacity.prediction_error[<engine>]``.
PREDICTION_ERROR = "capacity.prediction_error"
_PREDICTION_KEY = re.compile(rf"^{re.escape(PREDICTION_ERROR)}\[(.+)\]$")


def prediction_errors(record: Any) -> dict[str, float | None] | None:
    """Each engine's prediction error in a decision record (its parsed JSON), by engine; None
    when the record has none (no deployment was benchmarked on the workload's own traffic)."""
    measured = record.get("measurements") if isinstance(record, dict) else None
    if not isinstance(measured, dict):
        return None
    found = {
        match.group(1): value
        for key, value in measured.items()
        if (match := _PREDICTION_KEY.match(key)) is not None and _is_error(value)
    }
    return dict(sorted(found.items())) or None


def _is_error(value: Any) -> bool:
    """A signed error as JSON holds it: a number, or null where it is unknown."""
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


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
    """A regular file's sha256, or None when it is missing, unreadable or not a regular file
    (what an audit reports; a FIFO or a device is never read)."""
    digest = hashlib.sha256()
    try:
        with open_regular(path) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except (OSError, InputFormatError):
        return None
    return digest.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One ledger line."""

    quarter: str
    version: int
    path: str  # relative to the workload's report folder
    identity: str  # sha256 of what the version was made from (inputs, config, catalog, code)
    manifest_sha256: str
    headline: str
    published_at: str  # when the entry was appended (UTC, ISO 8601)
    previous_sha256: str | None  # entry_sha256 of the entry before it (None: the first)
    #: Each engine's capacity prediction error in the version's decision record
    #: (:func:`prediction_errors`); None: it has none, and the entry has no such key.
    prediction_errors: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.prediction_errors is None:
            # An entry without the check keeps the form (and hash) entries always had.
            del out["prediction_errors"]
        return out


def entry_sha256(entry: Entry) -> str:
    """The hash the next entry chains to: of the entry's fields, canonically serialised."""
    return sha256_bytes(json.dumps(entry.as_dict(), sort_keys=True, separators=(",", ":")).encode())


def chain_head(entries: list[Entry]) -> str | None:
    """The hash of the last entry, which the whole chain hangs from (None: empty ledger)."""
    return entry_sha256(entries[-1]) if entries else None


def chain_breaks(entries: list[Entry]) -> list[str]:
    """Where the chain does not hold, one sentence each naming the entry at fault (empty: the
    chain is intact)."""
    problems = []
    previous: str | None = None
    for index, entry in enumerate(entries):
        if entry.previous_sha256 != previous:
            problems.append(
                f"the chain breaks at versions[{index}] ({entry.path}): it or "
                f"versions[{index - 1}] ({entries[index - 1].path}) was edited, or an entry "
                "between them removed"
                if index
                else f"versions[0] ({entry.path}) does not start the chain: it was edited, or "
                "the entries before it removed"
            )
        previous = entry_sha256(entry)
    return problems


_ENTRY_TEXT = ("quarter", "path", "identity", "manifest_sha256", "headline", "published_at")


def _entry(raw: Any, where: str) -> Entry:
    """One ledger entry, every field checked (a problem names the field)."""
    if not isinstance(raw, dict):
        raise InputFormatError(f"{where}: expected an object, got {type(raw).__name__}")
    expected = {*_ENTRY_TEXT, "version", "previous_sha256"}
    if set(raw) - {"prediction_errors"} != expected:
        missing = sorted(expected - set(raw))
        unknown = sorted(set(raw) - expected - {"prediction_errors"})
        raise InputFormatError(f"{where}: missing keys {missing}, unknown keys {unknown}")
    errors = raw.get("prediction_errors")
    if "prediction_errors" in raw and (
        not isinstance(errors, dict) or not errors or not all(map(_is_error, errors.values()))
    ):
        raise InputFormatError(
            f"{where}.prediction_errors: expected an object of engines to signed errors "
            "(numbers, or null where unknown)"
        )
    for key in _ENTRY_TEXT:
        if not isinstance(raw[key], str):
            raise InputFormatError(f"{where}.{key}: expected text, got {raw[key]!r}")
    version = raw["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InputFormatError(f"{where}.version: expected a whole number >= 1, got {version!r}")
    if QUARTER.match(raw["quarter"]) is None:
        raise InputFormatError(f"{where}.quarter: {raw['quarter']!r} is not a quarter (YYYY-Qn)")
    if raw["path"] != f"{raw['quarter']}/v{version}":
        raise InputFormatError(
            f"{where}.path: {raw['path']!r} is not {raw['quarter']}/v{version}, the folder of "
            "the quarter and version the entry names"
        )
    try:
        published = dt.datetime.fromisoformat(raw["published_at"])
    except ValueError:
        published = None
    if published is None or published.tzinfo is None:
        raise InputFormatError(
            f"{where}.published_at: {raw['published_at'][:80]!r} is not a time with its UTC "
            "offset (ISO 8601, e.g. 2026-11-29T10:00:00+00:00, as enginefit writes it)"
        )
    for key in ("manifest_sha256", "previous_sha256"):
        value = raw[key]
        if not (value is None and key == "previous_sha256") and not (
            isinstance(value, str) and SHA256.match(value)
        ):
            raise InputFormatError(f"{where}.{key}: expected a sha256 (64 hex digits)")
    return Entry(**raw)


@dataclass(frozen=True)
class ReportTree:
    """The report folder of one workload; ``remote``: the folder on object storage it mirrors
    (``paths.reports_dir`` an ``s3://`` URL), where each version and the ledger are uploaded."""

    root: Path
    remote: Mirror | None = field(default=None, compare=False)

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER

    def version_dir(self, quarter: str, version: int) -> Path:
        return self.root / quarter / f"v{version}"

    def read_ledger(self) -> list[Entry]:
        """The ledger's entries in publication order ([] before the first version); one error
        naming the ledger (and the entry and field) for anything else than a ledger."""
        if not self.ledger.exists():
            return []
        raw = read_json(self.ledger)
        if isinstance(raw, dict) and raw.get("schema_version") == 1:
            raise InputFormatError(
                f"{self.ledger}: written by an older enginefit, without the hash chain that "
                "lets an audit trust it; move the folder aside (its versions stay readable) "
                "and the next report starts a chained ledger"
            )
        try:
            if not isinstance(raw, dict) or raw.get("schema_version") != LEDGER_SCHEMA:
                raise InputFormatError(
                    f"{self.ledger}: not a version {LEDGER_SCHEMA} enginefit report ledger "
                    "(an object with schema_version and versions)"
                )
            versions = raw.get("versions")
            if not isinstance(versions, list):
                raise InputFormatError(
                    f"{self.ledger}: versions: expected a list of entries, got "
                    f"{type(versions).__name__}"
                )
            return [_entry(e, f"{self.ledger}: versions[{i}]") for i, e in enumerate(versions)]
        except InputFormatError as exc:
            raise InputFormatError(
                f"{exc}; the ledger is append-only and never edited by hand: restore it from "
                "your backup"
            ) from exc

    def write_ledger(self, entries: list[Entry]) -> None:
        write_json_atomic(
            self.ledger,
            {"schema_version": LEDGER_SCHEMA, "versions": [e.as_dict() for e in entries]},
        )
        if self.remote is not None:
            push_ledger(self.remote, self.ledger)

    def append(self, entries: list[Entry]) -> None:
        """Append ``entries`` (made by :func:`new_entry`) to the ledger, each chained to the
        one before it."""
        chained = self.read_ledger()
        for entry in entries:
            chained.append(dataclasses.replace(entry, previous_sha256=chain_head(chained)))
        self.write_ledger(chained)

    def read_manifest(self, entry: Entry) -> dict[str, Any]:
        """The manifest of a listed version, refused unless it is the one the ledger recorded
        (what a new version compares with must be what was published)."""
        path = self.root / entry.path / MANIFEST
        data = read_regular(path)
        if sha256_bytes(data) != entry.manifest_sha256:
            raise InputFormatError(
                f"{path}: not the manifest the ledger recorded for {entry.path}: it was changed "
                f"after publication (`enginefit audit {path.parent}` lists what differs)"
            )
        manifest = parse_json(data, path)
        if not isinstance(manifest, dict):
            raise InputFormatError(f"{path}: not an enginefit report manifest (not an object)")
        return manifest

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
        ledger write), remove staging leftovers and a ledger write a crash left half done (its
        temporary ``.index.json.<hex>``); returns the entries added."""
        if not self.root.is_dir():
            return []
        for leftover in self.root.iterdir():
            if _LEDGER_LEFTOVER.match(leftover.name) and leftover.is_file():
                leftover.unlink(missing_ok=True)
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
            self.append(added)
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
        sign: Callable[[Path], None] | None = None,
    ) -> tuple[Entry, Path]:
        """Write version ``version`` of ``quarter`` (files, then the manifest with every
        output's sha256, signed by ``sign`` when given), move it into place, then append it to
        the ledger. Refused when that version exists (another run published it meanwhile):
        nothing is ever replaced."""
        quarter_key(quarter)
        quarter_dir = self.root / quarter
        quarter_dir.mkdir(parents=True, exist_ok=True)
        staging = quarter_dir / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
        staging.mkdir()
        try:
            for name, data in sorted(files.items()):
                write_bytes_atomic(staging / name, data)
            outputs = {name: sha256_bytes(data) for name, data in sorted(files.items())}
            # The ledger entry's readable fields, recorded where the audit checks them.
            readable = {"quarter": quarter, "version": version, "headline": headline}
            manifest_bytes = _json_bytes({**manifest, **readable, "outputs": outputs})
            write_bytes_atomic(staging / MANIFEST, manifest_bytes)
            if sign is not None:
                sign(staging / MANIFEST)
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
        if self.remote is not None:
            try:
                publish_version(self.remote, target)
            except BaseException:
                forget_version(target)  # the mirror holds only what the remote does
                raise
        entry = new_entry(
            self,
            target,
            quarter,
            version,
            str(manifest["identity"]),
            manifest_bytes,
            headline,
            _record_errors(files.get(RECORD), target / RECORD),
        )
        self.append([entry])
        return entry, target


def _order(entry: Entry) -> tuple[int, int, int]:
    return (*quarter_key(entry.quarter), entry.version)


def new_entry(
    tree: ReportTree,
    folder: Path,
    quarter: str,
    version: int,
    identity: str,
    manifest_bytes: bytes,
    headline: str,
    errors: dict[str, float | None] | None = None,
) -> Entry:
    """The ledger entry of a version folder, dated now, with its decision record's prediction
    errors (``errors``); chained when appended."""
    return Entry(
        quarter=quarter,
        version=version,
        path=str(folder.relative_to(tree.root)),
        identity=identity,
        manifest_sha256=sha256_bytes(manifest_bytes),
        headline=headline,
        published_at=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        previous_sha256=None,
        prediction_errors=errors,
    )


def _record_errors(data: bytes | None, where: Path) -> dict[str, float | None] | None:
    """The prediction errors of a version's decision record (its bytes; None: none)."""
    return None if data is None else prediction_errors(parse_json(data, where))


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
        data = read_regular(manifest_path)
        manifest = parse_json(data, manifest_path)
        outputs = manifest["outputs"]
        if not isinstance(outputs, dict) or output_differences(folder, outputs):
            return None
        record = folder / RECORD
        errors = _record_errors(read_regular(record), record) if RECORD in outputs else None
    except (OSError, InputFormatError, KeyError, TypeError):
        return None
    return new_entry(
        tree,
        folder,
        quarter,
        version,
        str(manifest.get("identity", "")),
        data,
        str(manifest.get("headline", "")),
        errors,
    )


@dataclass(frozen=True)
class Filing:
    """Where a workload's report versions are published (``tree``), and the quarter a new
    version files under (``quarter``: ``report.quarter``; None: the quarter of the traffic's
    last arrival)."""

    tree: ReportTree
    quarter: str | None = None

    def quarter_for(self, last_arrival: str | None) -> str:
        """The configured quarter, else the quarter of the workload's last arrival."""
        if self.quarter is not None:
            return self.quarter
        if not last_arrival:
            raise InputFormatError(
                "the workload has no arrivals to date the report: set report.quarter (YYYY-Qn)"
            )
        return quarter_of(last_arrival)
