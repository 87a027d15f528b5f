"""``enginefit audit PATH``: re-hash everything a published version recorded and say exactly
what differs.

In this order, and nothing the manifest lists is followed before the first two hold:

1. the ledger (``reports/<workload>/index.json``): it must exist, its hash chain must hold,
   and (with ``--chain-head``) contain the head recorded elsewhere; it must list this version;
2. the manifest's sha256 against the ledger's entry for it, then every human-readable field of
   that entry against the manifest and the decision record it points to (quarter, version and
   path, identity, headline, each engine's capacity prediction error; the publication time
   against the version's report date, the entries around it and the clock), each mismatch
   naming the field;
3. the signature of the manifest (``manifest.json.sig``), when the version was signed or
   ``--allowed-signers`` is given; else the audit says the version is not signed;
4. the version's own files (PDF, HTML, decision record) against the manifest's ``outputs``;
5. every input it was made from (configuration, traces, benchmark result files and the files
   their readers opened, manifests, tokenizer, catalog, previous record), each only if it is a
   regular file inside the places the version recorded (``roots``; never the file system's
   root or a system folder): a FIFO or device is never read, a path that leaves them is
   refused, never hashed. The bundled catalog is checked
   against the enginefit that audits (audit with the version's recorded commit to check it).

What each guarantee catches: the hashes catch any edit of one file; the chain catches an
edited or removed ledger entry that a later entry follows; a signature catches the PDF, the
manifest and the ledger rewritten together (it needs the private key). Without a signature,
such a consistent rewrite is caught only by comparing the chain head (printed by every audit
and publication) with a copy kept elsewhere: ``--chain-head``.

The upstream stage outputs under ``data/`` are listed as ``derived``: a later run of the
workload replaces them, so a difference there is reported but does not fail the audit.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputFormatError
from pipeline.ledger import (
    BUNDLED_INPUT,
    INSTALLATION,
    MANIFEST,
    PREDICTION_ERROR,
    RECORD,
    SIGNATURE,
    Entry,
    ReportTree,
    chain_breaks,
    chain_head,
    entry_sha256,
    prediction_errors,
    sha256_bytes,
    sha256_of,
)
from pipeline.report.config import JsonDocument
from pipeline.report.signing import verify
from pipeline.safe_read import parse_json, read_regular


@dataclass(frozen=True)
class Difference:
    path: str
    expected_sha256: str | None
    actual_sha256: str | None


@dataclass
class AuditResult:
    manifest: Path
    checked: int = 0
    differences: list[Difference] = field(default_factory=list)
    derived_changed: list[Difference] = field(default_factory=list)
    #: what fails the audit besides a differing hash, each naming its file
    problems: list[str] = field(default_factory=list)
    chain_head: str | None = None
    signature: str = "not checked"

    @property
    def ok(self) -> bool:
        return not self.differences and not self.problems

    def as_dict(self) -> JsonDocument:
        return {"ok": self.ok, **asdict(self), "manifest": str(self.manifest)}


@dataclass(frozen=True)
class Manifest:
    """The parts of a manifest the audit follows, each checked for its type."""

    outputs: dict[str, str]
    inputs: dict[str, str]
    derived: dict[str, str]
    base: Path
    workload_folder: Path
    roots: list[Path]
    signature: dict[str, str] | None


def _manifest_path(path: Path) -> Path:
    candidate = (path / MANIFEST if path.is_dir() else path).absolute()
    if candidate.name != MANIFEST or not candidate.is_file():
        raise InputFormatError(
            f"{path}: not a published report version (no {MANIFEST}); give a version folder "
            "reports/<workload>/<quarter>/v<N>/ or its manifest.json"
        )
    return candidate


def _texts(raw: Any, key: str, where: Path) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise InputFormatError(f"{where}: {key}: expected an object of file names to sha256s")
    return raw


def parse_manifest(data: bytes, where: Path) -> Manifest:
    """A manifest's bytes, parsed and checked; anything else is one error naming the file."""
    raw = parse_json(data, where)
    if not isinstance(raw, dict):
        raise InputFormatError(f"{where}: not an enginefit report manifest (not an object)")
    for key in ("outputs", "inputs", "base", "workload_folder", "roots"):
        if key not in raw:
            raise InputFormatError(f"{where}: not an enginefit report manifest (no {key!r})")
    for key in ("base", "workload_folder"):
        if not isinstance(raw[key], str) or not Path(raw[key]).is_absolute():
            raise InputFormatError(f"{where}: {key}: expected an absolute folder")
    roots = raw["roots"]
    if not isinstance(roots, list) or not all(
        isinstance(r, str) and Path(r).is_absolute() for r in roots
    ):
        raise InputFormatError(f"{where}: roots: expected a list of absolute paths")
    signature = raw.get("signature")
    if signature is not None:
        signature = _texts(signature, "signature", where)
        if "allowed_signers" not in signature:
            raise InputFormatError(f"{where}: signature: no allowed_signers")
    return Manifest(
        outputs=_texts(raw["outputs"], "outputs", where),
        inputs=_texts(raw["inputs"], "inputs", where),
        derived=_texts(raw.get("derived", {}), "derived", where),
        base=Path(raw["base"]),
        workload_folder=Path(raw["workload_folder"]),
        roots=[Path(r) for r in roots],
        signature=signature,
    )


def audit(
    path: Path, *, allowed_signers: Path | None = None, recorded_head: str | None = None
) -> AuditResult:
    """Audit the version at ``path`` (its folder or manifest). ``allowed_signers``: the
    auditor's own allowed signers file (the signature is then required); ``recorded_head``: a
    chain head kept elsewhere, which the ledger must still contain."""
    manifest_path = _manifest_path(path)
    folder = manifest_path.parent
    result = AuditResult(manifest_path)
    raw = read_regular(manifest_path)
    if not _ledger_vouches(folder, raw, result, recorded_head):
        return result  # nothing a manifest the ledger does not vouch for lists is followed
    manifest = parse_manifest(raw, manifest_path)
    _check_signature(manifest_path, manifest, allowed_signers, result)

    def check(label: Path, digest: str, into: list[Difference], inside: list[Path]) -> None:
        result.checked += 1
        resolved = label.resolve()
        if not any(resolved.is_relative_to(root) for root in inside):
            result.problems.append(
                f"{label}: refused: outside the places the version recorded "
                f"({', '.join(map(str, inside))}); the manifest lists a file no stage read"
            )
            return
        actual = sha256_of(resolved)
        if actual != digest:
            into.append(Difference(str(label), digest, actual))

    for name, digest in sorted(manifest.outputs.items()):
        if name != Path(name).name or name in ("", ".", ".."):
            result.problems.append(f"{manifest_path}: outputs: {name!r} is not a file name")
            continue
        check(folder / name, digest, result.differences, [folder.resolve()])
    roots = [r.resolve() for r in manifest.roots]
    for root in [r for r in roots if _too_broad(r)]:
        result.problems.append(
            f"{manifest_path}: roots: {root} is not a place a version records (the file "
            "system's root or a system folder); nothing under it is read"
        )
    roots = [r for r in roots if not _too_broad(r)]
    shipped = [INSTALLATION / "pipeline"]
    for key, digest in sorted(manifest.inputs.items()):
        kind, _, name = key.partition(":")
        if kind == BUNDLED_INPUT:  # checked against the enginefit that audits
            check(INSTALLATION / name, digest, result.differences, shipped)
        else:
            check(manifest.base / name, digest, result.differences, roots)
    workload = [manifest.workload_folder.resolve()]
    for name, digest in sorted(manifest.derived.items()):
        check(manifest.workload_folder / name, digest, result.derived_changed, workload)
    return result


# Folders no configuration, trace or benchmark lives in: a manifest naming one (or "/") as a
# root would have the audit read, and print the hash of, any file there (/etc/shadow).
_SYSTEM_FOLDERS = tuple(
    Path(p) for p in ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/usr", "/bin", "/sbin")
)


def _too_broad(root: Path) -> bool:
    """The file system's root, or a system folder or anything inside one."""
    return root == Path(root.anchor) or any(root.is_relative_to(f) for f in _SYSTEM_FOLDERS)


def _ledger_vouches(
    folder: Path, manifest: bytes, result: AuditResult, recorded_head: str | None
) -> bool:
    """Check the ledger of ``reports/<workload>/<quarter>/v<N>/`` and its entry for this
    manifest; False (with the problem in ``result``) when it does not vouch for it."""
    tree = ReportTree(folder.parent.parent)
    result.checked += 1
    if not tree.ledger.exists():
        result.problems.append(
            f"{tree.ledger}: missing: no ledger lists this version, so nothing it records can "
            "be trusted; restore the ledger from your backup"
        )
        return False
    entries = tree.read_ledger()
    result.chain_head = chain_head(entries)
    result.problems += [f"{tree.ledger}: {problem}" for problem in chain_breaks(entries)]
    if recorded_head is not None and recorded_head not in {entry_sha256(e) for e in entries}:
        result.problems.append(
            f"{tree.ledger}: its chain no longer contains the recorded head {recorded_head}: "
            "the ledger was rewritten since that head was recorded"
        )
    relative = f"{folder.parent.name}/{folder.name}"
    index = next((i for i, e in enumerate(entries) if e.path == relative), None)
    if index is None:
        result.problems.append(f"{tree.ledger}: lists no version {relative}")
    elif entries[index].manifest_sha256 != sha256_bytes(manifest):
        entry = entries[index]
        result.differences.append(
            Difference(str(folder / MANIFEST), entry.manifest_sha256, sha256_bytes(manifest))
        )
    else:
        where = f"{tree.ledger}: versions[{index}]"
        record = _record_fields(folder / RECORD)
        parsed = parse_json(manifest, folder / MANIFEST)
        result.checked += 1
        result.problems += entry_problems(
            where, entries, index, parsed if isinstance(parsed, dict) else {}, record
        )
    return result.ok


def _record_fields(path: Path) -> JsonDocument | str:
    """The decision record's headline, date and capacity prediction errors, or why they cannot
    be read (a problem the entry check reports)."""
    try:
        raw = parse_json(read_regular(path), path)
    except (OSError, InputFormatError) as exc:
        return f"{path}: cannot be read to check the ledger's headline ({exc})"
    recommendation = raw.get("recommendation") if isinstance(raw, dict) else None
    headline = recommendation.get("headline") if isinstance(recommendation, dict) else None
    if not isinstance(headline, str):
        return f"{path}: records no recommendation.headline to check the ledger's against"
    return {
        "headline": headline,
        "as_of": raw.get("as_of"),
        "prediction_errors": prediction_errors(raw),
    }


def entry_problems(
    where: str,
    entries: list[Entry],
    index: int,
    manifest: JsonDocument,
    record: JsonDocument | str,
) -> list[str]:
    """Every human-readable field of ledger entry ``index`` against the manifest it vouches
    for and the decision record beside it, each mismatch naming the field (``where``: the
    ledger and the entry). The publication time is not in the manifest (the manifest is
    written before the entry), so it is checked against what bounds it: not before the
    version's report date, not before the entry above it nor after the one below, not after
    the clock."""
    entry = entries[index]
    problems = []
    for field_name in ("quarter", "version", "identity", "headline"):
        ours, theirs = getattr(entry, field_name), manifest.get(field_name)
        if theirs is None:
            problems.append(f"{where}.{field_name}: its manifest records none to check it against")
        elif ours != theirs:
            problems.append(
                f"{where}.{field_name}: {ours!r} is not the {field_name} its manifest records "
                f"({theirs!r})"
            )
    if entry.path != f"{manifest.get('quarter')}/v{manifest.get('version')}":
        problems.append(
            f"{where}.path: {entry.path!r} is not the folder of the quarter and version its "
            f"manifest records ({manifest.get('quarter')}/v{manifest.get('version')})"
        )
    if isinstance(record, str):
        problems.append(record)
    elif record["headline"] != entry.headline:
        problems.append(
            f"{where}.headline: {entry.headline!r} is not the headline of the decision record "
            f"it points to ({record['headline']!r})"
        )
    elif record.get("as_of") and manifest.get("report_date") not in (None, record["as_of"]):
        problems.append(
            f"{where}: its manifest's report_date {manifest.get('report_date')} is not the "
            f"decision record's as_of {record['as_of']}"
        )
    if not isinstance(record, str) and record.get("prediction_errors") != entry.prediction_errors:
        problems.append(
            f"{where}.prediction_errors: {entry.prediction_errors!r} is not the capacity "
            "prediction errors of the decision record it points to "
            f"({record.get('prediction_errors')!r}, its measurements {PREDICTION_ERROR}[…])"
        )
    problems += _published_at_problems(where, entries, index, manifest.get("report_date"))
    return problems


def _published_at_problems(
    where: str, entries: list[Entry], index: int, report_date: Any
) -> list[str]:
    moment = _instant(entries[index].published_at)
    field_name = f"{where}.published_at"
    if moment is None:
        return [f"{field_name}: {entries[index].published_at!r} is not a UTC time (ISO 8601)"]
    problems = []
    if isinstance(report_date, str) and moment.date().isoformat() < report_date:
        problems.append(
            f"{field_name}: {entries[index].published_at} is before the version's report date "
            f"{report_date} (its manifest's report_date): a version is published on or after "
            "the day it is dated"
        )
    for other in (index - 1, index + 1):
        if 0 <= other < len(entries):
            neighbour = _instant(entries[other].published_at)
            if neighbour is not None and (
                neighbour > moment if other < index else neighbour < moment
            ):
                problems.append(
                    f"{field_name}: {entries[index].published_at} is "
                    f"{'before' if other < index else 'after'} versions[{other}]'s "
                    f"{entries[other].published_at}: the ledger lists versions in publication order"
                )
    if moment > dt.datetime.now(dt.UTC):
        problems.append(f"{field_name}: {entries[index].published_at} is in the future")
    return problems


def _instant(text: str) -> dt.datetime | None:
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _check_signature(
    manifest_path: Path, manifest: Manifest, trusted: Path | None, result: AuditResult
) -> None:
    signature = manifest_path.with_name(SIGNATURE)
    if manifest.signature is None and trusted is None and not signature.exists():
        result.signature = "not signed (no report.signing_key when it was published)"
        return
    result.checked += 1
    if manifest.signature is None and trusted is None:
        result.problems.append(
            f"{signature}: a signature the manifest does not mention; pass --allowed-signers "
            "FILE to check it"
        )
        return
    signers = trusted
    if signers is None:
        assert manifest.signature is not None  # neither None: returned above
        signers = Path(manifest.signature["allowed_signers"])
        if not any(signers.resolve().is_relative_to(r.resolve()) for r in manifest.roots):
            result.problems.append(
                f"{signers}: refused: the allowed signers file the manifest names is outside "
                "the places the version recorded; pass your own with --allowed-signers FILE"
            )
            return
    for needed in (signature, signers):
        if sha256_of(needed) is None:
            result.problems.append(f"{needed}: missing or not a regular file; signature unchecked")
            return
    principal, problem = verify(manifest_path, signature, signers)
    if problem is not None:
        result.problems.append(f"{signature}: {problem}")
        return
    whose = "your" if trusted is not None else "the version's own"
    result.signature = f"verified: signed by {principal} ({whose} allowed signers {signers})"


def audit_text(result: AuditResult) -> str:
    lines = [f"audit of {result.manifest.parent}: {result.checked} files checked"]
    if result.ok:
        lines.append("ok: every recorded input and output has the hash it was published with")
    lines += [f"FAILED {problem}" for problem in result.problems]
    for d in result.differences:
        state = "missing or unreadable" if d.actual_sha256 is None else f"now {d.actual_sha256}"
        lines.append(f"DIFFERS {d.path}: recorded {d.expected_sha256}, {state}")
    for d in result.derived_changed:
        state = "missing" if d.actual_sha256 is None else "replaced by a later run"
        lines.append(f"note: derived {d.path} {state} (does not fail the audit)")
    lines.append(f"signature: {result.signature}")
    if result.chain_head is not None:
        lines.append(
            f"ledger chain head: {result.chain_head} (keep a copy elsewhere; `enginefit audit "
            "--chain-head` then also catches a consistent rewrite of the ledger)"
        )
    return "\n".join(lines)
