"""A folder on object storage (``s3://bucket/prefix``) and the few operations enginefit needs on
it: read, write, write-once, list, delete. :mod:`pipeline.mirror` keeps a local folder in step
with one; nothing else talks to the object store.

The client is obstore (object_store, Rust): credentials, region and endpoint come from the
standard AWS environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP`` ...) or the
pod's role, and ``paths.storage_options`` may add the non-secret ones (a credential is never
written in a file that a report records). Every failure is one :class:`StorageError` line
naming the URL and what to do.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from pipeline.errors import EnginefitError

SCHEME = "s3://"
# S3's bucket naming rules (3-63 lower-case letters, digits, '.', '-'), then an optional prefix.
_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s]*)?$")
#: The ``paths.storage_options`` a configuration may set: where and how to reach the store,
#: never a credential (those come from the environment or the machine's role).
STORAGE_OPTIONS = frozenset(
    {"endpoint", "region", "allow_http", "virtual_hosted_style_request", "skip_signature"}
)
# A store that does not answer is said within seconds, not after the client's 3-minute default.
_RETRY = {"max_retries": 2, "retry_timeout": dt.timedelta(seconds=15)}


class StorageError(EnginefitError):
    """The object store refused or could not be reached: one line naming the URL."""


def is_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def check_url(value: str) -> str:
    """``value`` as a normalised ``s3://bucket/prefix`` (no trailing '/'), else ValueError."""
    match = _URL.match(value.strip())
    if match is None:
        raise ValueError(
            f"{value!r} is not an S3 URL: s3://BUCKET/PREFIX (bucket: 3-63 lower-case letters, "
            "digits, '.' and '-')"
        )
    prefix = "/".join(part for part in (match.group(2) or "").split("/") if part)
    if any(part in (".", "..") for part in prefix.split("/")):
        raise ValueError(f"{value!r}: '.' and '..' are not folders on object storage")
    return f"{SCHEME}{match.group(1)}" + (f"/{prefix}" if prefix else "")


@dataclass(frozen=True)
class Remote:
    """A folder on object storage: ``url`` (``s3://bucket/prefix``), and the client options."""

    url: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def bucket(self) -> str:
        return self.url[len(SCHEME) :].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The key prefix of the folder ('' for the bucket's root)."""
        parts = self.url[len(SCHEME) :].split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    def child(self, name: str) -> Remote:
        return Remote(f"{self.url}/{name}", self.options)

    def where(self, relative: str = "") -> str:
        """The URL of ``relative`` (a '/'-separated path below the folder)."""
        return f"{self.url}/{relative}" if relative else self.url

    def _client(self) -> Any:
        # The client reads the AWS_* variables when it is built: one per set of them.
        aws = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
        return _store(self.bucket, self.options, aws)

    def _key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    # -- operations (each error one StorageError line) ----------------------------------------

    def get(self, relative: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""

        with self._errors(relative):
            try:
                return bytes(obstore.get(self._client(), self._key(relative)).bytes())
            except FileNotFoundError:
                if not self._bucket_exists():
                    raise
                return None

    def download(self, relative: str, target: Path) -> None:
        """The object into ``target`` (written beside it, renamed into place), streamed."""

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.download-{os.getpid()}")
        with self._errors(relative):
            try:
                result = obstore.get(self._client(), self._key(relative))
                with tmp.open("wb") as handle:
                    for chunk in result:
                        handle.write(chunk)
                tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)

    def put(self, relative: str, data: bytes | Path) -> None:
        """Write (or replace) the object; a file is streamed (multipart when large)."""

        with self._errors(relative):
            obstore.put(self._client(), self._key(relative), data)

    def put_new(self, relative: str, data: bytes) -> bool:
        """Write the object only if none exists (``If-None-Match: *``): False when one does."""
        return self.swap(relative, data, None) is not None

    def get_version(self, relative: str) -> tuple[bytes, str] | None:
        """The object's bytes and its version (ETag); None when there is no such object."""
        with self._errors(relative):
            try:
                result = obstore.get(self._client(), self._key(relative))
                return bytes(result.bytes()), str(result.meta["e_tag"])
            except FileNotFoundError:
                if not self._bucket_exists():
                    raise
                return None

    def swap(self, relative: str, data: bytes, version: str | None) -> str | None:
        """Write the object only if it is still at ``version`` (``If-Match``), or, ``version``
        None, only if there is none (``If-None-Match: *``): the new version, else None (another
        writer changed it first)."""
        mode: Any = {"e_tag": version} if version is not None else "create"
        with self._errors(relative):
            try:
                put = obstore.put(
                    self._client(), self._key(relative), data, mode=mode, use_multipart=False
                )
            except (AlreadyExistsError, PreconditionError):
                return None
        return str(put["e_tag"])

    def delete(self, relative: str) -> None:

        with self._errors(relative):
            obstore.delete(self._client(), self._key(relative))

    def list(self, relative: str = "") -> dict[str, int]:
        """Every object below ``relative`` (a folder; '' the whole folder), as its path below
        this folder → its size."""

        below = self._key(relative).rstrip("/")
        start = len(self.prefix) + 1 if self.prefix else 0
        found: dict[str, int] = {}
        with self._errors(relative):
            stream = obstore.list(self._client(), below + "/" if below else None)
            for batch in stream:
                for meta in batch:
                    found[str(meta["path"])[start:]] = int(meta["size"])
        if not found and not self._bucket_exists():
            raise self._error(relative, _NO_BUCKET)
        return found

    def _bucket_exists(self) -> bool:

        with self._errors(""):
            try:
                obstore.list(self._client(), chunk_size=1).collect()
            except FileNotFoundError:
                return False
        return True

    def _error(self, relative: str, problem: str) -> StorageError:
        return StorageError(f"{self.where(relative)}: {problem.format(bucket=self.bucket)}")

    @contextmanager
    def _errors(self, relative: str) -> Iterator[None]:
        try:
            yield
        except (AlreadyExistsError, PreconditionError, StorageError):
            raise
        except (PermissionDeniedError, UnauthenticatedError, PermissionError) as exc:
            raise self._error(relative, _problem(exc, _DENIED)) from exc
        except FileNotFoundError as exc:
            said = str(exc)
            if "NoSuchBucket" in said or "bucket does not exist" in said:
                raise self._error(relative, _NO_BUCKET) from exc
            raise
        except (BaseError, OSError, ValueError) as exc:
            if "NoSuchBucket" in str(exc):
                raise self._error(relative, _NO_BUCKET) from exc
            raise self._error(relative, _problem(exc, _UNREACHABLE)) from exc


# A lease on a folder (:class:`Lease`): how long a hold lasts unless renewed (its holder renews
# it every third of that), and how long a writer waits for another machine's to end.
LEASE_TTL_S = 60.0
LEASE_WAIT_S = 600.0
_LEASE_POLL_S = 0.5


class Lease:
    """One machine's hold on a folder of the object store that several machines write: the
    object ``relative`` names its holder and when the hold ends. It is taken, renewed and
    given back only by conditional writes (``If-None-Match: *`` where there is none,
    ``If-Match`` the version read where it ended), so two machines never both hold it; a
    machine that stops renewing (killed, cut off) loses it :data:`LEASE_TTL_S` seconds after
    its last renewal. Machines' clocks are taken to agree within seconds (NTP)."""

    def __init__(self, remote: Remote, relative: str) -> None:
        self.remote, self.relative = remote, relative
        self.holder = f"{socket.gethostname()} pid {os.getpid()} ({secrets.token_hex(4)})"
        self.since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self._version: str | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self, ends: float) -> bytes:
        fields = {"holder": self.holder, "since": self.since, "ends": ends}
        return (json.dumps(fields, sort_keys=True) + "\n").encode()

    def _held(self, data: bytes) -> tuple[str, str, float]:
        """Who holds the lease ``data`` records, since when, and until when (epoch seconds)."""
        try:
            fields = json.loads(data)
            return str(fields["holder"]), str(fields["since"]), float(fields["ends"])
        except (ValueError, TypeError, KeyError) as exc:
            raise StorageError(
                f"{self.remote.where(self.relative)}: not a lease enginefit wrote; remove it "
                "if no enginefit run is writing this folder"
            ) from exc

    def acquire(self, wait: float | None = None) -> None:
        """Take the lease, waiting up to ``wait`` seconds (:data:`LEASE_WAIT_S`) while another
        machine holds it; then a :class:`StorageError` naming the holder."""
        patience = LEASE_WAIT_S if wait is None else wait
        deadline = time.monotonic() + patience
        holder, since = "unknown", "a moment ago"
        while True:
            current = self.remote.get_version(self.relative)
            if current is None:
                self._version = self.remote.swap(self.relative, self._body(self._ends()), None)
            else:
                holder, since, ends = self._held(current[0])
                if ends <= time.time():  # given back, or its holder stopped renewing it
                    body = self._body(self._ends())
                    self._version = self.remote.swap(self.relative, body, current[1])
            if self._version is not None:
                break
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"{self.remote.where(self.relative)}: another machine ({holder}) has been "
                    f"writing this folder since {since} and still was after {patience:.0f} s; "
                    "run again once it has finished (a machine that stopped gives the folder "
                    f"up {LEASE_TTL_S:.0f} s after its last renewal)"
                )
            time.sleep(_LEASE_POLL_S)
        self._renewer = threading.Thread(target=self._keep, name="enginefit-lease", daemon=True)
        self._renewer.start()

    @staticmethod
    def _ends() -> float:
        return time.time() + LEASE_TTL_S

    def _keep(self) -> None:
        while not self._stop.wait(LEASE_TTL_S / 3):
            try:
                self.renew()
            except StorageError:
                return  # lost (said by confirm), or the store is unreachable: retried by confirm

    def renew(self) -> None:
        """Extend the hold; a :class:`StorageError` when another machine has taken it."""
        with self._lock:
            if self._lost is None and self._version is not None:
                version = self.remote.swap(self.relative, self._body(self._ends()), self._version)
                if version is None:
                    current = self.remote.get_version(self.relative)
                    self._lost = self._held(current[0])[0] if current else "nobody"
                self._version = version
            if self._lost is not None:
                raise StorageError(
                    f"{self.remote.where(self.relative)}: this machine's hold on the folder "
                    f"lapsed and another machine ({self._lost}) took it; what this run was "
                    "writing there was not committed: run again"
                )

    def confirm(self) -> None:
        """Before a commit (a marker written): still held, for another full term."""
        self.renew()

    def release(self) -> None:
        """Give the lease back (its hold ends now), if still held."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with self._lock:
            if self._lost is None and self._version is not None:
                with suppress(StorageError):  # unreachable: the hold ends with its term anyway
                    self.remote.swap(self.relative, self._body(0.0), self._version)
            self._version = None


@contextmanager
def leased(remote: Remote, relative: str) -> Iterator[Lease]:
    """Hold the lease ``relative`` of ``remote`` for the body (:class:`Lease`)."""
    lease = Lease(remote, relative)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()


_NO_BUCKET = (
    "the bucket {bucket} does not exist; create it, or set paths.data_dir / paths.reports_dir "
    "to a bucket that does"
)
_DENIED = (
    "the object store refused the credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE, or the pod's role) to ones allowed to read and write this bucket"
)
_NO_CREDENTIALS = (
    "no credentials for the object store; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE, or give the pod a role)"
)
_UNREACHABLE = (
    "cannot reach the object store{endpoint}; start it, or fix AWS_ENDPOINT_URL (or "
    "paths.storage_options.endpoint)"
)


# Without credentials in the environment the client asks the machine's metadata service (EC2's
# instance metadata, ECS's task credentials) for a role: failing there means no credentials.
_METADATA_SERVICES = ("169.254.169.254", "169.254.170.2", "fd00:ec2::254")


def _problem(exc: BaseException, default: str) -> str:
    said = str(exc)
    if any(address in said for address in _METADATA_SERVICES):
        return _NO_CREDENTIALS
    if any(
        words in said
        for words in ("credential", "Credential", "InvalidAccessKeyId", "SignatureDoesNotMatch")
    ):
        return _DENIED if "InvalidAccessKeyId" in said or "Signature" in said else _NO_CREDENTIALS
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    return default.replace("{endpoint}", f" at {endpoint}" if endpoint else "")


@cache
def _store(
    bucket: str, options: tuple[tuple[str, str], ...], environment: tuple[tuple[str, str], ...]
) -> Any:
    """One client per bucket and options, built from the environment (obstore reads the AWS_*
    variables itself) with the configured options over it; ``environment``, those variables,
    only keys the cache."""
    config: dict[str, Any] = dict(options)
    return S3Store(bucket, config=config, retry_config=_RETRY)  # type: ignore[arg-type]


def options_of(mapping: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    # The client reads booleans as the words true and false.
    return tuple(
        sorted(
            (str(k), str(v).lower() if isinstance(v, bool) else str(v)) for k, v in mapping.items()
        )
    )


@dataclass(frozen=True)
class Mirror:
    """A folder on object storage (``remote``) worked on through a folder on this machine
    (``local``), with what was last seen of each commit marker there kept under ``state``
    (outside ``local``, so the mirrored folder holds only what the remote one does)."""

    remote: Remote
    local: Path
    state: Path

    def child(self, name: str) -> Mirror:
        return Mirror(self.remote.child(name), self.local / name, self.state / name)


def mirror_of(url: str, cache_dir: Path, options: tuple[tuple[str, str], ...] = ()) -> Mirror:
    """The mirror of ``url`` under ``cache_dir``: ``<cache_dir>/<bucket>/<prefix>``."""
    remote = Remote(url, options)
    below = Path(remote.bucket, *[p for p in remote.prefix.split("/") if p])
    return Mirror(remote, cache_dir / below, cache_dir / ".synced" / below)
