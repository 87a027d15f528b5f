"""``enginefit audit PATH``: re-hash everything a published version recorded and say exactly
what differs.

Checked: the version's own files (PDF, HTML, decision record, against the manifest's
``outputs``), the manifest against the ledger's hash of it, and every input it was made from
(trace files, benchmark result files and manifests, a team catalog). The upstream stage outputs
under ``data/`` are listed as ``derived``: a later run of the workload replaces them, so a
difference there is reported but does not fail the audit (re-run with the recorded inputs to
reproduce them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputFormatError
from pipeline.report.versions import (
    LEDGER,
    MANIFEST,
    output_differences,
    sha256_bytes,
    sha256_of,
)


@dataclass(frozen=True)
class Difference:
    path: str
    expected_sha256: str | None
    actual_sha256: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AuditResult:
    manifest: Path
    checked: int = 0
    differences: list[Difference] = field(default_factory=list)
    derived_changed: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "manifest": str(self.manifest),
            "checked": self.checked,
            "differences": [d.as_dict() for d in self.differences],
            "derived_changed": [d.as_dict() for d in self.derived_changed],
        }


def _manifest_path(path: Path) -> Path:
    candidate = path / MANIFEST if path.is_dir() else path
    if not candidate.is_file():
        raise InputFormatError(
            f"{path}: not a published report version (no {MANIFEST}); give a version folder "
            "reports/<workload>/<quarter>/v<N>/ or its manifest.json"
        )
    return candidate


def _input_path(key: str, base: Path) -> Path:
    """``trace:traces/x.jsonl`` → the file, relative to the configuration's folder."""
    _, _, name = key.partition(":")
    path = Path(name)
    return path if path.is_absolute() else base / path


def audit(path: Path) -> AuditResult:
    manifest_path = _manifest_path(path)
    folder = manifest_path.parent
    raw = manifest_path.read_bytes()
    try:
        manifest = json.loads(raw)
        outputs: dict[str, str] = manifest["outputs"]
        inputs: dict[str, str] = manifest["inputs"]
        derived: dict[str, str] = manifest.get("derived", {})
        base = Path(manifest["base"])
        workload_folder = Path(manifest["workload_folder"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputFormatError(
            f"{manifest_path}: not an enginefit report manifest ({exc})"
        ) from exc
    result = AuditResult(manifest_path)

    def check(label: str, file: Path, expected: str | None, into: list[Difference]) -> None:
        result.checked += 1
        actual = sha256_of(file)
        if actual != expected:
            into.append(Difference(label, expected, actual))

    result.checked += len(outputs)
    result.differences += [
        Difference(str(folder / name), expected, actual)
        for name, expected, actual in output_differences(folder, outputs)
    ]
    for key, digest in sorted(inputs.items()):
        file = _input_path(key, base)
        check(str(file), file, digest, result.differences)
    ledger = _ledger_entry(folder)
    if ledger is not None:
        result.checked += 1
        if ledger != sha256_bytes(raw):
            result.differences.append(Difference(str(manifest_path), ledger, sha256_bytes(raw)))
    for name, digest in sorted(derived.items()):
        check(str(workload_folder / name), workload_folder / name, digest, result.derived_changed)
    return result


def _ledger_entry(folder: Path) -> str | None:
    """The ledger's hash of this version's manifest (None when no ledger lists it)."""
    for parent in folder.parents:
        ledger = parent / LEDGER
        if ledger.is_file():
            try:
                entries = json.loads(ledger.read_text(encoding="utf-8"))["versions"]
            except (json.JSONDecodeError, KeyError, TypeError):
                return None
            relative = str(folder.relative_to(parent))
            return next((e["manifest_sha256"] for e in entries if e["path"] == relative), None)
    return None


def audit_text(result: AuditResult) -> str:
    lines = [f"audit of {result.manifest.parent}: {result.checked} files checked"]
    if result.ok:
        lines.append("ok: every recorded input and output has the hash it was published with")
    for d in result.differences:
        state = "missing" if d.actual_sha256 is None else f"now {d.actual_sha256}"
        lines.append(f"DIFFERS {d.path}: recorded {d.expected_sha256}, {state}")
    for d in result.derived_changed:
        state = "missing" if d.actual_sha256 is None else "replaced by a later run"
        lines.append(f"note: derived {d.path} {state} (does not fail the audit)")
    return "\n".join(lines)
