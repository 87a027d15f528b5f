"""Detached signatures of a version's manifest with OpenSSH's ``ssh-keygen -Y sign`` and
``-Y verify`` (OpenSSH 8.1 and later; the key never leaves the machine that signs).

With ``report.signing_key`` and ``report.allowed_signers`` set, each version's
``manifest.json`` is signed when it is published (``manifest.json.sig`` beside it) and checked
against the allowed signers at once, so a key the allowed signers do not list fails the
publication, not a later audit. ``enginefit audit`` verifies the signature against the allowed
signers file the auditor gives (``--allowed-signers``), else the one the version names. The
manifest holds the hash of every output and input, so the signature covers the whole version:
rewriting the PDF, the manifest and the ledger together is caught without the signing key.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.safe_read import regular_file_problem

NAMESPACE = "enginefit-report"
_TIMEOUT_S = 60
# An OpenSSH private key or an allowed signers file is a few kilobytes; a far larger file is
# neither (and a device such as /dev/zero would keep ssh-keygen reading until its timeout).
LARGEST_KEY_FILE = 1024 * 1024
# ssh-keygen's own words for a problem with a line of an allowed signers file ("FILE:3: ...").
_LINE_PROBLEM = re.compile(r"^(?P<file>.+):(?P<line>\d+): (?P<why>.+)$")


def ssh_keygen() -> str | None:
    """The ``ssh-keygen`` on the PATH (None when OpenSSH is not installed)."""
    return shutil.which("ssh-keygen")


@dataclass(frozen=True)
class Signer:
    """The configured signing key and the allowed signers file that must accept it."""

    key: Path
    allowed_signers: Path


@dataclass(frozen=True)
class _Ran:
    code: int
    output: str
    said: tuple[str, ...]  # its messages, in order

    @property
    def reason(self) -> str:
        """Why it failed, in words that fit what enginefit asked of it."""
        for line in self.said:
            # Before "No principal matched", which ssh-keygen adds when it read no signature.
            if line.startswith("Couldn't parse signature"):
                return (
                    "not an SSH signature ssh-keygen can read: damaged or replaced since it was "
                    "written"
                )
            if line.startswith("Signature verification failed") or line.startswith(
                "Could not verify signature"
            ):
                return (
                    "the manifest's bytes are not the ones signed: the manifest changed since, "
                    "or the signature is another file's"
                )
            if "incorrect passphrase" in line or "passphrase" in line.lower():
                return "the key is protected by a passphrase; give an unencrypted key"
            if line.startswith("Couldn't load public key") or line.startswith("Load key"):
                return "not an OpenSSH private key ssh-keygen can load"
            bad_line = _LINE_PROBLEM.match(line)
            if bad_line:
                return f"line {bad_line['line']}: {bad_line['why']}"
        if any(line.startswith("No principal matched") for line in self.said):
            return f"it lists no principal with this key for namespace {NAMESPACE}"
        return self.said[-1] if self.said else f"ssh-keygen exit code {self.code}"


def _run(program: str, args: list[str], stdin: bytes | None = None) -> _Ran:
    try:
        done = subprocess.run(
            [program, *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
            # No terminal: a passphrase prompt fails at once instead of waiting for a person.
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return _Ran(1, "", (f"ssh-keygen did not finish within {_TIMEOUT_S} s",))
    except OSError as exc:
        return _Ran(1, "", (f"ssh-keygen could not run ({exc.strerror or exc})",))
    output = done.stdout.decode("utf-8", "replace")
    said = (done.stderr.decode("utf-8", "replace") + output).strip().splitlines()
    return _Ran(done.returncode, output, tuple(said))


def check_signer(signer: Signer) -> None:
    """Refuse, before any stage runs, a signing setup that would fail the publication: the key
    and the allowed signers must be small regular files, and a probe signed with the key must
    be accepted by the allowed signers (a :class:`ConfigError` naming the setting)."""
    for setting, path in (
        ("report.signing_key", signer.key),
        ("report.allowed_signers", signer.allowed_signers),
    ):
        problem = regular_file_problem(path, largest=LARGEST_KEY_FILE)
        if problem is not None:
            raise ConfigError(f"{setting} {path}: {problem}")
    stamps = tuple(_stamp(path) for path in (signer.key, signer.allowed_signers))
    _probe(signer, stamps)


def _stamp(path: Path) -> tuple[int, int, int]:
    status = path.stat()
    return status.st_ino, status.st_size, status.st_mtime_ns


@functools.cache
def _probe(signer: Signer, stamps: tuple[tuple[int, int, int], ...]) -> None:
    """Sign a probe with the key and check it (once per state of the two files: ``stamps``)."""
    with tempfile.TemporaryDirectory(prefix="enginefit-signing-") as folder:
        probe = Path(folder) / "probe.json"
        probe.write_bytes(b"{}\n")
        sign(signer, probe)


def sign(signer: Signer, manifest: Path) -> None:
    """Write ``<manifest>.sig`` and check it against the allowed signers; a problem is a
    :class:`ConfigError` naming the setting to fix."""
    program = ssh_keygen()
    if program is None:
        raise ConfigError(
            "report.signing_key is set but ssh-keygen (OpenSSH 8.1 or later) is not installed: "
            "install OpenSSH, or remove report.signing_key to publish unsigned versions"
        )
    ran = _run(program, ["-Y", "sign", "-f", str(signer.key), "-n", NAMESPACE, str(manifest)])
    if ran.code != 0:
        raise ConfigError(
            f"report.signing_key {signer.key}: ssh-keygen could not sign with it ({ran.reason}); "
            "give an unencrypted private key readable only by you"
        )
    _, problem = verify(
        manifest, manifest.with_name(manifest.name + ".sig"), signer.allowed_signers
    )
    if problem is not None:
        raise ConfigError(
            f"report.allowed_signers {signer.allowed_signers}: does not accept the signature "
            f"of report.signing_key ({problem}); add the key's public part to it"
        )


def verify(manifest: Path, signature: Path, allowed_signers: Path) -> tuple[str, str | None]:
    """(the principal that signed, None) when ``signature`` is a valid signature of
    ``manifest``'s bytes by a principal ``allowed_signers`` lists for :data:`NAMESPACE`, else
    ("", what is wrong)."""
    program = ssh_keygen()
    if program is None:
        return "", "ssh-keygen (OpenSSH 8.1 or later) is not installed to check it"
    # A signature or an allowed signers file is a few kilobytes: a larger one, or one that is
    # not a regular file, is refused before ssh-keygen reads it (for seconds, or until its
    # timeout).
    for what, path in (("the signature", signature), ("the allowed signers", allowed_signers)):
        problem = regular_file_problem(path, largest=LARGEST_KEY_FILE)
        if problem is not None:
            return "", f"{what} {path} {problem}"
    found = _run(
        program, ["-Y", "find-principals", "-s", str(signature), "-f", str(allowed_signers)]
    )
    principals = found.output.split()
    if any(line.startswith("Couldn't parse signature") for line in found.said):
        return "", found.reason
    if found.code != 0 or not principals:
        return "", f"no principal in {allowed_signers} made it ({found.reason})"
    checks = ["-f", str(allowed_signers), "-I", principals[0], "-n", NAMESPACE]
    ran = _run(
        program, ["-Y", "verify", *checks, "-s", str(signature)], stdin=manifest.read_bytes()
    )
    return (principals[0], None) if ran.code == 0 else ("", f"does not verify ({ran.reason})")
