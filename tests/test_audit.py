"""`enginefit audit` cannot be fooled, hung or crashed, and hostile JSON is one line everywhere.

The versions here are published through the real ledger (``ReportTree.publish``) with small
stand-in files, so every hostile case is cheap; tests/test_report.py publishes the bundled
workload end to end and tampers with the files its stages read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from assets.cli import main as enginefit_with_dagster
from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ledger import (
    MANIFEST,
    PDF,
    RECORD,
    SIGNATURE,
    ReportTree,
    chain_head,
    sha256_bytes,
)
from pipeline.report import audit as audit_module
from pipeline.report import signing
from pipeline.report import stage as report_stage
from pipeline.report.audit import audit
from pipeline.report.signing import Signer, sign
from pipeline.safe_read import MAX_DEPTH, parse_json
from tests.conftest import REPO, bundled_config
from tests.test_bench_hostile import vllm_point, write_result

NESTED = b"[" * 200_000
BUNDLED_CATALOG = REPO / "pipeline" / "decision" / "engines.yaml"
SSH_KEYGEN = signing.ssh_keygen()
needs_ssh_keygen = pytest.mark.skipif(
    SSH_KEYGEN is None, reason="ssh-keygen (OpenSSH 8.1+) is not installed: signatures untested"
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclasses.dataclass
class Published:
    """A workload's configuration folder, its workload folder, its report tree."""

    base: Path
    workload: Path
    tree: ReportTree

    @property
    def config(self) -> Path:
        return self.base / "enginefit.yaml"

    @property
    def companion(self) -> Path:
        """A file a benchmark reader opened beside a result file."""
        return self.base / "bench" / "config.yaml"

    def folder(self, version: int = 1) -> Path:
        return self.tree.root / "2025-Q1" / f"v{version}"

    def publish(self, version: int, sign_with: Signer | None = None) -> Path:
        manifest = {
            "identity": f"identity-{version}",
            "base": str(self.base),
            "workload_folder": str(self.workload),
            "roots": [str(self.base), str(self.workload)],
            "inputs": {
                "config:enginefit.yaml": sha(self.config),
                "bench:bench/config.yaml": sha(self.companion),
                "bundled:pipeline/decision/engines.yaml": sha(BUNDLED_CATALOG),
            },
            "derived": {"shape/summary.json": sha(self.workload / "shape" / "summary.json")},
            "signature": None
            if sign_with is None
            else {"allowed_signers": str(sign_with.allowed_signers)},
        }
        record = {"as_of": None, "recommendation": {"headline": "vLLM"}}
        files = {PDF: f"%PDF version {version}".encode(), RECORD: json.dumps(record).encode()}
        signer = None if sign_with is None else functools.partial(sign, sign_with)
        _, folder = self.tree.publish("2025-Q1", version, files, manifest, "vLLM", signer)
        return folder


@pytest.fixture
def published(tmp_path: Path) -> Published:
    """Two versions of one workload, published."""
    base = tmp_path / "team"
    (base / "bench").mkdir(parents=True)
    (base / "enginefit.yaml").write_text("workload: {name: w}\n")
    (base / "bench" / "config.yaml").write_text("load: {type: constant}\n")
    workload = tmp_path / "data" / "w"
    (workload / "shape").mkdir(parents=True)
    (workload / "shape" / "summary.json").write_text("{}\n")
    versions = Published(base, workload, ReportTree(tmp_path / "reports" / "w"))
    versions.publish(1)
    versions.publish(2)
    return versions


def audit_lines(
    capsys: pytest.CaptureFixture[str], *argv: str, code: int
) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of ``enginefit audit`` exiting with ``code``."""
    assert enginefit(["audit", *argv]) == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out.splitlines(), captured.err.splitlines()


def rewrite_ledger(tree: ReportTree, change: Any) -> None:
    """Rewrite the ledger consistently (its chain recomputed) with ``change(entry)`` applied:
    what someone editing the ledger with enginefit's own code can do."""
    entries = [change(e) for e in tree.read_ledger()]
    tree.write_ledger([])
    tree.append(entries)


def test_an_untouched_version_passes_and_says_it_is_not_signed(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = audit_lines(capsys, str(published.folder(1)), code=0)
    assert out[1].startswith("ok: every recorded input and output")
    assert "signature: not signed (no report.signing_key when it was published)" in out
    head = chain_head(published.tree.read_ledger())
    assert head is not None and f"ledger chain head: {head}" in out[-1]
    assert audit(published.folder(1), recorded_head=head).ok


def test_the_configuration_edited_after_publication_fails_naming_it(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = sha(published.config)
    published.config.write_text("workload: {name: w}\nbench: {prices: {H100: 3.5}}\n")
    out, _ = audit_lines(capsys, str(published.folder(1)), code=1)
    assert [line for line in out if line.startswith("DIFFERS")] == [
        f"DIFFERS {published.config}: recorded {recorded}, now {sha(published.config)}"
    ]


def test_a_file_a_reader_opened_edited_fails_naming_it(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    published.companion.write_text("load: {type: concurrent}\n")
    out, _ = audit_lines(capsys, str(published.folder(2)), code=1)
    assert any(line.startswith(f"DIFFERS {published.companion}: recorded") for line in out)


def test_the_bundled_catalog_is_checked_against_the_enginefit_that_audits(
    published: Published,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installation = tmp_path / "installation"
    catalog = installation / "pipeline" / "decision" / "engines.yaml"
    catalog.parent.mkdir(parents=True)
    catalog.write_bytes(BUNDLED_CATALOG.read_bytes())
    monkeypatch.setattr(audit_module, "INSTALLATION", installation)
    audit_lines(capsys, str(published.folder(1)), code=0)
    catalog.write_bytes(BUNDLED_CATALOG.read_bytes().replace(b"vllm", b"vllm-forked", 1))
    out, _ = audit_lines(capsys, str(published.folder(1)), code=1)
    assert any(line.startswith(f"DIFFERS {catalog}: recorded") for line in out)


def test_a_missing_ledger_fails_the_audit(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forger's case: ledger deleted, PDF changed, manifest updated to the new hash."""
    folder = published.folder(1)
    (folder / PDF).write_bytes(b"%PDF forged")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["outputs"][PDF] = sha(folder / PDF)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    published.tree.ledger.unlink()
    out, _ = audit_lines(capsys, str(folder), code=1)
    assert f"FAILED {published.tree.ledger}: missing: no ledger lists this version" in out[1]
    assert not any(line.startswith("ok") for line in out)


def test_an_edited_ledger_entry_breaks_the_chain_naming_it(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = json.loads(published.tree.ledger.read_text())
    raw["versions"][0]["headline"] = "SGLang"
    published.tree.ledger.write_text(json.dumps(raw))
    out, _ = audit_lines(capsys, str(published.folder(2)), code=1)
    assert (
        f"FAILED {published.tree.ledger}: the chain breaks at versions[1] (2025-Q1/v2): it or "
        "versions[0] (2025-Q1/v1) was edited, or an entry between them removed"
    ) in out


def test_a_manifest_the_ledger_does_not_vouch_for_is_never_followed(
    published: Published, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``../../../../dev/zero``, a FIFO and /etc/shadow listed by a tampered manifest: the
    audit stops at the ledger, reading none of them."""
    hashed: list[Path] = []
    real_sha256_of = audit_module.sha256_of
    monkeypatch.setattr(
        audit_module, "sha256_of", lambda path: hashed.append(path) or real_sha256_of(path)
    )
    fifo = published.base / "pipe"
    os.mkfifo(fifo)
    folder = published.folder(1)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["inputs"] |= {
        "trace:../../../../dev/zero": "0" * 64,
        "trace:pipe": "0" * 64,
        "config:/etc/shadow": "0" * 64,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with hang_guard():
        out, _ = audit_lines(capsys, str(folder), code=1)
    assert out[1].startswith(f"DIFFERS {folder / MANIFEST}: recorded")
    assert len([line for line in out if line.startswith(("DIFFERS", "FAILED"))]) == 1
    assert hashed == []  # not even the outputs: nothing the manifest lists was opened
    # Even with the ledger rewritten to vouch for it: refused, never hashed, never blocked on.
    digest = sha(folder / MANIFEST)
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, manifest_sha256=digest) if e.version == 1 else e,
    )
    with hang_guard():
        out, _ = audit_lines(capsys, str(folder), code=1)
    assert f"FAILED {published.base / '../../../../dev/zero'}: refused: outside the places" in (
        "\n".join(out)
    )
    assert "FAILED /etc/shadow: refused: outside the places the version recorded" in "\n".join(out)
    assert f"DIFFERS {fifo}: recorded {'0' * 64}, missing or unreadable" in out
    assert fifo in hashed  # opened without blocking, refused as not a regular file
    assert not [p for p in hashed if p.name in ("zero", "shadow")]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "headline",
            "SGLang",
            "versions[1].headline: 'SGLang' is not the headline its manifest records ('vLLM')",
        ),
        (
            "identity",
            "identity-1",
            "versions[1].identity: 'identity-1' is not the identity its manifest records "
            "('identity-2')",
        ),
        (
            "published_at",
            "2999-01-01T00:00:00+00:00",
            "versions[1].published_at: 2999-01-01T00:00:00+00:00 is in the future",
        ),
        (
            "published_at",
            "2001-01-01T00:00:00+00:00",
            "versions[1].published_at: 2001-01-01T00:00:00+00:00 is before versions[0]'s ",
        ),
    ],
)
def test_an_edited_field_of_the_last_ledger_entry_fails_naming_it(
    published: Published,
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: str,
    message: str,
) -> None:
    """The last entry reworded with its chain recomputed (no later entry to break): the audit
    checks the entry's words against the manifest and decision record it vouches for."""
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, **{field: value}) if e.version == 2 else e,
    )
    out, _ = audit_lines(capsys, str(published.folder(2)), code=1)
    assert any(line.startswith(f"FAILED {published.tree.ledger}: {message}") for line in out), out
    assert not any(line.startswith("ok") for line in out)


def test_a_headline_the_decision_record_does_not_carry_fails(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    """Manifest and ledger reworded together (the record beside them still says vLLM): the
    decision record names the mismatch."""
    folder = published.folder(2)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["headline"] = "SGLang"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    digest = sha(folder / MANIFEST)
    rewrite_ledger(
        published.tree,
        lambda e: (
            dataclasses.replace(e, headline="SGLang", manifest_sha256=digest)
            if e.version == 2
            else e
        ),
    )
    out, _ = audit_lines(capsys, str(folder), code=1)
    assert (
        f"FAILED {published.tree.ledger}: versions[1].headline: 'SGLang' is not the headline of "
        "the decision record it points to ('vLLM')"
    ) in out


@contextlib.contextmanager
def hang_guard(seconds: int = 300) -> Iterator[None]:
    """Fail instead of hanging the suite if the body blocks: a bound minutes away from a call
    that returns at once, so no result depends on the machine's speed."""

    def ring(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def forge_consistently(published: Published, version: int = 2) -> Path:
    """PDF, manifest and ledger of ``version`` rewritten together, the chain recomputed: what
    only a signature or a chain head kept elsewhere can catch."""
    folder = published.folder(version)
    (folder / PDF).write_bytes(b"%PDF forged")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["outputs"][PDF] = sha(folder / PDF)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    digest = sha(folder / MANIFEST)
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, manifest_sha256=digest) if e.version == version else e,
    )
    return folder


def test_a_consistent_rewrite_is_caught_by_a_chain_head_kept_elsewhere(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a signature, nothing inside the report folder can tell a consistent rewrite
    from the original (the documented limit); the chain head recorded at publication can."""
    recorded = chain_head(published.tree.read_ledger())
    assert recorded is not None
    folder = forge_consistently(published)
    audit_lines(capsys, str(folder), code=0)
    out, _ = audit_lines(capsys, str(folder), "--chain-head", recorded, code=1)
    assert (
        f"FAILED {published.tree.ledger}: its chain no longer contains the recorded head "
        f"{recorded}: the ledger was rewritten since that head was recorded"
    ) in out
    # A head recorded before a later version was appended is still in the chain.
    first = chain_head(published.tree.read_ledger()[:1])
    assert first is not None and audit(published.folder(1), recorded_head=first).ok


# ------------------------------------------------------------------------------ signatures


def signer_files(folder: Path, principal: str = "reports@example.com") -> Signer:
    """A fresh ed25519 key and an allowed signers file listing it for enginefit reports."""
    assert SSH_KEYGEN is not None
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / "id_ed25519"
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", str(key)],
        check=True,
    )
    public = key.with_suffix(".pub").read_text().split()
    allowed = folder / "allowed_signers"
    allowed.write_text(f'{principal} namespaces="{signing.NAMESPACE}" {public[0]} {public[1]}\n')
    return Signer(key, allowed)


@needs_ssh_keygen
def test_a_signed_version_is_verified_and_a_consistent_rewrite_is_caught(
    published: Published, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    signer = signer_files(published.base / "keys")
    folder = published.publish(3, sign_with=signer)
    assert (folder / SIGNATURE).is_file()
    out, _ = audit_lines(capsys, str(folder), code=0)
    assert (
        f"signature: verified: signed by reports@example.com (the version's own allowed "
        f"signers {signer.allowed_signers})"
    ) in out
    mine = signer_files(tmp_path / "auditor", "auditor@example.com")
    out, _ = audit_lines(
        capsys, str(folder), "--allowed-signers", str(mine.allowed_signers), code=1
    )
    assert any(line.startswith(f"FAILED {folder / SIGNATURE}: no principal in") for line in out)
    # PDF, manifest and ledger rewritten together: the signature no longer matches.
    assert forge_consistently(published, 3) == folder
    out, _ = audit_lines(
        capsys, str(folder), "--allowed-signers", str(signer.allowed_signers), code=1
    )
    assert any(line.startswith(f"FAILED {folder / SIGNATURE}: does not verify") for line in out)
    # The signature removed: the manifest says the version was signed.
    (folder / SIGNATURE).unlink()
    out, _ = audit_lines(capsys, str(folder), code=1)
    assert f"FAILED {folder / SIGNATURE}: missing or not a regular file; signature unchecked" in (
        out
    )


@needs_ssh_keygen
def test_a_key_the_allowed_signers_do_not_list_fails_the_publication(
    published: Published, tmp_path: Path
) -> None:
    signer = signer_files(tmp_path / "a")
    other = signer_files(tmp_path / "b", "someone@example.com")
    with pytest.raises(ConfigError, match=r"report.allowed_signers .* does not accept"):
        published.publish(3, sign_with=Signer(signer.key, other.allowed_signers))
    assert not published.folder(3).exists()
    assert [e.version for e in published.tree.read_ledger()] == [1, 2]


def test_signing_without_ssh_keygen_or_allowed_signers_is_a_config_error(
    published: Published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(signing, "ssh_keygen", lambda: None)
    with pytest.raises(ConfigError, match=r"ssh-keygen .* is not installed"):
        published.publish(3, sign_with=Signer(tmp_path / "key", tmp_path / "allowed"))
    config = bundled_config(tmp_path, "w")
    config.write_text(config.read_text() + "report: {signing_key: key}\n")
    with pytest.raises(ConfigError, match="signing_key is set without allowed_signers"):
        load_config(config)


# --------------------------------------------------------------------- hostile JSON, ledgers


def test_random_bytes_or_deep_nesting_in_a_vouched_manifest_is_one_line(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = published.folder(1)
    for content in (random.Random(7).randbytes(4096), NESTED):
        (folder / MANIFEST).write_bytes(content)
        out, _ = audit_lines(capsys, str(folder), code=1)  # the ledger does not vouch for it
        assert out[1].startswith(f"DIFFERS {folder / MANIFEST}: recorded")
        vouched = sha256_bytes(content)
        rewrite_ledger(
            published.tree,
            lambda e, digest=vouched: (
                dataclasses.replace(e, manifest_sha256=digest) if e.version == 1 else e
            ),
        )
        _, err = audit_lines(capsys, str(folder), code=2)
        assert len(err) == 1 and err[0].startswith(f"enginefit: error: {folder / MANIFEST}: ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw | {"versions": "v1"}, "versions: expected a list of entries, got str"),
        (
            lambda raw: raw | {"versions": [raw["versions"][0] | {"version": "one"}]},
            "versions[0].version: expected a whole number >= 1, got 'one'",
        ),
        (lambda raw: raw | {"versions": [[]] * 2}, "versions[0]: expected an object, got list"),
    ],
)
def test_a_malformed_ledger_is_one_line_naming_the_field(
    published: Published, capsys: pytest.CaptureFixture[str], change: Any, message: str
) -> None:
    ledger = published.tree.ledger
    ledger.write_text(json.dumps(change(json.loads(ledger.read_text()))))
    _, err = audit_lines(capsys, str(published.folder(1)), code=2)
    assert err == [
        f"enginefit: error: {ledger}: {message}; the ledger is append-only and never edited by "
        "hand: restore it from your backup"
    ]
    # What `report` reads first: the same error, not a TypeError.
    with pytest.raises(InputFormatError, match=f"{ledger}: "):
        published.tree.latest("2025-Q1")


def test_garbage_in_the_latest_manifest_names_it(published: Published) -> None:
    """`report` reads the latest version's manifest to reproduce what it compared with: only
    the one the ledger recorded, parsed by the safe reader."""
    latest = published.folder(2) / MANIFEST
    latest.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(InputFormatError, match=f"^{latest}: not the manifest the ledger recorded"):
        report_stage._compared_with(published.tree, "2025-Q1", "identity-2")
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, manifest_sha256=sha(latest)) if e.version == 2 else e,
    )
    with pytest.raises(InputFormatError, match=f"^{latest}: not UTF-8 text"):
        report_stage._compared_with(published.tree, "2025-Q1", "identity-2")
    latest.write_text("[1]")
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, manifest_sha256=sha(latest)) if e.version == 2 else e,
    )
    with pytest.raises(InputFormatError, match=f"^{latest}: not an enginefit report manifest"):
        report_stage._compared_with(published.tree, "2025-Q1", "identity-2")


def test_the_shared_reader_refuses_depth_and_non_finite_numbers_naming_the_key() -> None:
    with pytest.raises(InputFormatError, match=f"^x.json: nested more than {MAX_DEPTH} levels"):
        parse_json(NESTED, "x.json")
    with pytest.raises(InputFormatError, match=f"nested more than {MAX_DEPTH} levels"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x.json")
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x.json") is not None
    # A benchmark tool's file keeps its bare Infinity (SGLang's request_rate); depth still counts.
    assert parse_json('{"request_rate": Infinity}', "r.json", strict=False) == {
        "request_rate": math.inf
    }
    with pytest.raises(InputFormatError, match=f"nested more than {MAX_DEPTH} levels"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "r.json", strict=False)
    for text, key, shown in (
        ('{"triggers": [{"threshold": NaN}]}', "triggers[0].threshold", "NaN"),
        ('{"a": {"b": -Infinity}}', "a.b", "-Infinity"),
        ('{"cost": 1e999}', "cost", "Infinity"),
    ):
        with pytest.raises(InputFormatError) as caught:
            parse_json(text, "record.json")
        assert str(caught.value).startswith(f"record.json: {key}: {shown} is not a finite number")


def record_of(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "decision.json"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (NESTED, "nested more than"),
        (b'{"previous": {"triggers": [{"threshold": NaN}]}}', "previous.triggers[0].threshold:"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text"),
    ],
)
def test_a_hostile_previous_record_is_one_line_in_explain_and_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    record = record_of(tmp_path, content)
    assert enginefit(["explain", str(record)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [err[0]] and err[0].startswith(f"enginefit: error: {record}: ")
    assert message in err[0]
    config = bundled_config(tmp_path, "w")
    argv = ["decide", "--config", str(config), "--previous", str(record)]
    assert enginefit_with_dagster(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"enginefit: error: {record}: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_a_deeply_nested_bench_result_or_facts_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tmp_path / "result.json"
    for nested in (NESTED, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)):
        result.write_bytes(nested)
        assert enginefit(["bench", str(result)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[-1].startswith(f"enginefit: error: {result}: nested more than"), err
    facts = tmp_path / "facts.json"
    facts.write_bytes(NESTED)
    vllm = write_result(tmp_path / "vllm", vllm_point())
    assert enginefit(["bench", str(vllm), "--workload-facts", str(facts)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"enginefit: error: {facts}: nested more than"), err


def test_a_ledger_from_before_the_chain_says_what_to_do(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = published.tree.ledger
    raw = json.loads(ledger.read_text())
    for entry in raw["versions"]:
        del entry["published_at"], entry["previous_sha256"]
    ledger.write_text(json.dumps(raw | {"schema_version": 1}))
    _, err = audit_lines(capsys, str(published.folder(1)), code=2)
    assert err == [
        f"enginefit: error: {ledger}: written by an older enginefit, without the hash chain "
        "that lets an audit trust it; move the folder aside (its versions stay readable) and "
        "the next report starts a chained ledger"
    ]
