"""Hostile signing files. The auditor's ``--allowed-signers`` that is missing, a folder or a
device is the flag to fix (exit 2), never a fault of the version; a ``report.signing_key`` or
``report.allowed_signers`` that cannot sign and verify is refused when the configuration loads,
in words that fit (not ssh-keygen's "No principal matched" after the whole run). A version's
signature that is damaged, oversized or of other bytes is said to be so, never blamed on the
allowed signers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.ledger import SIGNATURE
from pipeline.report.signing import NAMESPACE
from tests import test_audit
from tests.conftest import bundled_config
from tests.test_audit import (
    SSH_KEYGEN,
    Published,
    audit_lines,
    forge_consistently,
    needs_ssh_keygen,
    signer_files,
)

published = test_audit.published  # two versions of one workload, published (a fixture)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("missing", "does not exist"),
        ("folder", "is a folder, not a regular file"),
        ("/dev/zero", "is a character device, not a regular file"),
    ],
)
def test_an_unreadable_allowed_signers_flag_is_the_flag_not_the_version(
    published: Published, capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, why: str
) -> None:
    (tmp_path / "folder").mkdir()
    flag = Path(name) if name.startswith("/") else tmp_path / name
    assert enginefit(["audit", str(published.folder(2)), "--allowed-signers", str(flag)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [
        f"enginefit: error: --allowed-signers {flag}: {why}; give your copy of the allowed "
        "signers file (ssh-keygen ALLOWED SIGNERS format)"
    ]


def _signing_config(tmp_path: Path, key: Path, signers: Path) -> Path:
    path = bundled_config(tmp_path, "w")
    raw = yaml.safe_load(path.read_text())
    raw["report"] = {"signing_key": str(key), "allowed_signers": str(signers)}
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(config: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    return str(caught.value)


@needs_ssh_keygen
def test_allowed_signers_that_do_not_list_the_key_fail_when_the_configuration_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = signer_files(tmp_path / "mine")
    other = signer_files(tmp_path / "other", "someone@example.com")
    config = _signing_config(tmp_path, mine.key, other.allowed_signers)
    assert enginefit(["config", "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"enginefit: error: {config}: report.allowed_signers {other.allowed_signers}: does not "
        f"accept the signature of report.signing_key (no principal in {other.allowed_signers} "
        f"made it (it lists no principal with this key for namespace {NAMESPACE})); add the "
        "key's public part to it"
    ]
    # The same files, right way round, load.
    assert load_config(_signing_config(tmp_path, mine.key, mine.allowed_signers)).report


@needs_ssh_keygen
def test_an_allowed_signers_line_ssh_keygen_cannot_read_is_named(tmp_path: Path) -> None:
    mine = signer_files(tmp_path / "mine")
    mine.allowed_signers.write_text("reports@example.com not-a-key\n")
    message = _refused(_signing_config(tmp_path, mine.key, mine.allowed_signers))
    assert message.endswith("made it (line 1: missing key)); add the key's public part to it")


@needs_ssh_keygen
@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("garbage", "not an OpenSSH private key ssh-keygen can load"),
        ("passphrase", "the key is protected by a passphrase; give an unencrypted key"),
    ],
)
def test_a_key_ssh_keygen_cannot_use_says_why_in_words_that_fit(
    tmp_path: Path, kind: str, why: str
) -> None:
    assert SSH_KEYGEN is not None
    mine = signer_files(tmp_path / "mine")
    key = tmp_path / kind
    if kind == "garbage":
        key.write_text("this is not a key\n")
    else:
        subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "secret words", "-f", str(key)], check=True
        )
    config = _signing_config(tmp_path, key, mine.allowed_signers)
    assert _refused(config) == (
        f"{config}: report.signing_key {key}: ssh-keygen could not sign with it ({why}); give "
        "an unencrypted private key readable only by you"
    )


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("signing_key", "is a character device, not a regular file"),
        ("allowed_signers", "is a character device, not a regular file"),
    ],
)
def test_a_device_as_a_signing_file_is_refused_before_ssh_keygen_reads_it(
    tmp_path: Path, setting: str, why: str
) -> None:
    """/dev/zero would keep ssh-keygen reading until its timeout."""
    files = {"signing_key": tmp_path / "key", "allowed_signers": tmp_path / "allowed"}
    for path in files.values():
        path.write_text("x\n")
    files[setting] = Path("/dev/zero")
    config = _signing_config(tmp_path, files["signing_key"], files["allowed_signers"])
    assert _refused(config) == f"{config}: report.{setting} /dev/zero: {why}"


@needs_ssh_keygen
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            lambda good: b"not a signature\n",
            "not an SSH signature ssh-keygen can read: damaged or replaced since it was written",
        ),
        (
            lambda good: good[: len(good) // 2],
            "not an SSH signature ssh-keygen can read: damaged or replaced since it was written",
        ),
        (
            lambda good: good + b"A" * 2_000_000,
            "the signature {sig} is {size:,} bytes, larger than any such file (1,048,576 bytes)",
        ),
    ],
    ids=["garbage", "truncated", "oversized"],
)
def test_a_damaged_signature_is_said_to_be_damaged_not_an_unknown_signer(
    published: Published,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[bytes], bytes],
    why: str,
) -> None:
    """ssh-keygen adds "No principal matched" to any signature it cannot parse, which blamed
    the allowed signers; a signature padded past any real one's size was read for seconds
    (and verified: ssh-keygen ignores what follows its footer)."""
    signer = signer_files(published.base / "keys")
    folder = published.publish(3, sign_with=signer)
    signature = folder / SIGNATURE
    signature.write_bytes(damage(signature.read_bytes()))
    out, _ = audit_lines(
        capsys, str(folder), "--allowed-signers", str(signer.allowed_signers), code=1
    )
    said = why.format(sig=signature, size=signature.stat().st_size)
    assert f"FAILED {signature}: {said}" in out


@needs_ssh_keygen
def test_a_signature_of_other_bytes_says_the_manifest_changed(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    signer = signer_files(published.base / "keys")
    folder = published.publish(3, sign_with=signer)
    assert forge_consistently(published, 3) == folder
    out, _ = audit_lines(
        capsys, str(folder), "--allowed-signers", str(signer.allowed_signers), code=1
    )
    assert (
        f"FAILED {folder / SIGNATURE}: does not verify (the manifest's bytes are not the ones "
        "signed: the manifest changed since, or the signature is another file's)"
    ) in out
