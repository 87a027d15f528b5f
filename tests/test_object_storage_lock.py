"""Two machines writing the same folder in the bucket (a day's set, or the workload's union of
the days) take turns: each holds a lease on it (an object written only by conditional puts),
the second waits for the first, one held past the wait is a one-line error naming its holder,
and a writer that lost its lease commits nothing. Against moto's S3 server, as
tests/test_object_storage.py; each "machine" is a cache folder of its own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline import remote as remote_module
from pipeline.config import Config, load_config
from pipeline.ingest import days, stage
from pipeline.layout import WORKLOAD_LOCK, WorkloadLayout
from pipeline.mirror import pull_workload
from pipeline.remote import Remote, StorageError
from pipeline.store import read_requests
from tests.test_daily_partitions import (
    DAYS,
    _assert_union_is_whole,
    _config,
    _prompt_days,
    _run_day,
    _whole,
)
from tests.test_object_storage import BUCKET, _server, bucket_paths, client, keys

WORKLOAD = "mooncake-conversation"  # the bundled configuration's workload name
PREFIX = f"team/data/{WORKLOAD}/"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with _server() as env:
        yield env


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    return _prompt_days(tmp_path / "prompts")


def machine(root: Path, name: str, traces: Path) -> Config:
    """The daily configuration on the bucket as machine ``name`` (a cache of its own) sees it."""
    config = _config(root, name, [str(traces / "prompts-{day}.jsonl")], fmt="prompt-text")
    raw = yaml.safe_load(config.read_text())
    raw["paths"] = bucket_paths(root / name / "cache")
    config.write_text(yaml.safe_dump(raw))
    return load_config(config)


def _clear(s3: dict[str, str]) -> None:
    for key in keys(s3, "team/"):
        client(s3).delete_object(Bucket=BUCKET, Key=key)


@pytest.fixture
def journal(s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every upload and deletion in the bucket from now on: (writer thread, operation, key),
    each upload made slow enough that two writers at once would interleave theirs."""
    _clear(s3)
    seen: list[tuple[str, str, str]] = []

    def watched(name: str) -> Callable[..., Any]:
        real = getattr(Remote, name)

        def operation(self: Remote, relative: str, *args: Any) -> Any:
            seen.append((threading.current_thread().name, name, self.where(relative)))
            if name == "put":
                time.sleep(0.05)
            return real(self, relative, *args)

        return operation

    for name in ("put", "delete"):
        monkeypatch.setattr(Remote, name, watched(name))
    return seen


def side_by_side(**writers: Callable[[], object]) -> dict[str, Exception | None]:
    """Each writer in a thread of its name, all started at once; what each raised."""
    raised: dict[str, Exception | None] = {}

    def run(name: str, write: Callable[[], object]) -> None:
        try:
            write()
            raised[name] = None
        except Exception as exc:  # noqa: BLE001 - each writer's outcome is asserted
            raised[name] = exc

    threads = [threading.Thread(target=run, args=item, name=item[0]) for item in writers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return raised


def _one_after_the_other(journal: list[tuple[str, str, str]], folder: str) -> list[str]:
    """The writers of the set in ``folder`` (its own files, below it but not in a folder of a
    set of its own), in the order they wrote; each appears once if they took turns."""
    inside = [
        writer
        for writer, _, url in journal
        if url.startswith(folder) and not url[len(folder) :].startswith("days/")
    ]
    return [w for i, w in enumerate(inside) if i == 0 or inside[i - 1] != w]


def _committed(traces: Path, root: Path) -> WorkloadLayout:
    """The workload as a machine that has never seen it pulls it from the bucket."""
    fresh = machine(root, "fresh", traces).layout()
    assert fresh.remote is not None
    pull_workload(fresh.remote)
    return fresh


def test_two_machines_uniting_the_days_take_turns(
    s3: dict[str, str], journal: list[tuple[str, str, str]], traces: Path, tmp_path: Path
) -> None:
    """Machine a unites the first two days while machine b unites all three, at once: one
    waits for the other's lease, so their uploads never interleave, and the bucket holds one
    whole union (the one written last), equal to one ingest of its days' files."""
    ingester = machine(tmp_path, "days", traces)
    for day in DAYS:
        days.write_day(_run_day(ingester, day), ingester.layout(), day)
    a, b = machine(tmp_path, "a", traces), machine(tmp_path, "b", traces)
    for config in (a, b):
        assert config.layout().remote is not None
        pull_workload(config.layout().remote)  # type: ignore[arg-type]
    journal.clear()
    raised = side_by_side(
        a=lambda: days.write_union(a.layout(), DAYS[:2]),
        b=lambda: days.write_union(b.layout(), DAYS),
    )
    assert raised == {"a": None, "b": None}
    folder = f"s3://{BUCKET}/{PREFIX}"
    turns = _one_after_the_other(journal, folder)
    assert sorted(turns) == ["a", "b"]
    union = _committed(traces, tmp_path)
    last = {"a": DAYS[:2], "b": DAYS}[turns[-1]]
    assert sorted(json.loads(union.ingest.manifest.read_text())["days"]) == list(last)
    if last != DAYS:  # one ingest of the files of the days it unites
        (traces / f"prompts-{DAYS[2]}.jsonl").unlink()
    _assert_union_is_whole(union, _whole(traces, tmp_path, "prompts-{day}.jsonl", "prompt-text"))
    lease = json.loads(
        client(s3).get_object(Bucket=BUCKET, Key=PREFIX + WORKLOAD_LOCK)["Body"].read()
    )
    assert lease["ends"] == 0.0  # given back


def test_two_machines_writing_one_day_take_turns(
    s3: dict[str, str], journal: list[tuple[str, str, str]], traces: Path, tmp_path: Path
) -> None:
    """The same day ingested by two machines at once (a retry beside a run still going, from
    a file that changed in between): their uploads never interleave, and the day's set in the
    bucket is whole, the one written last."""
    a, b = machine(tmp_path, "a", traces), machine(tmp_path, "b", traces)
    first = _run_day(a, DAYS[0])
    path = traces / f"prompts-{DAYS[0]}.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:25]))
    second = _run_day(b, DAYS[0])
    raised = side_by_side(
        a=lambda: days.write_day(first, a.layout(), DAYS[0]),
        b=lambda: days.write_day(second, b.layout(), DAYS[0]),
    )
    assert raised == {"a": None, "b": None}
    folder = f"s3://{BUCKET}/{PREFIX}days/{DAYS[0]}/"
    turns = _one_after_the_other(journal, folder)
    assert sorted(turns) == ["a", "b"]
    day = _committed(traces, tmp_path).day(DAYS[0])
    expected = {"a": first, "b": second}[turns[-1]]
    assert read_requests(day).collect().equals(expected.requests)
    assert stage.read_summary(day).ingested == expected.summary.ingested


def _lease_of_another_machine(s3: dict[str, str], key: str, ends: float) -> None:
    body = {"holder": "elsewhere pid 7 (0000)", "since": "2025-02-21T05:00:00+00:00", "ends": ends}
    client(s3).put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())


def test_a_lease_held_past_the_wait_is_one_line_naming_its_holder(
    s3: dict[str, str],
    journal: list[tuple[str, str, str]],
    traces: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another machine holds the day's folder and keeps holding it: this writer waits, then
    says who holds it since when, and writes nothing there. A lease whose term ended (its
    machine stopped) is taken over at once."""
    monkeypatch.setattr(remote_module, "LEASE_WAIT_S", 1.0)
    config = machine(tmp_path, "a", traces)
    result = _run_day(config, DAYS[0])
    key = f"{PREFIX}days/{DAYS[0]}/{WORKLOAD_LOCK}"
    _lease_of_another_machine(s3, key, time.time() + 3600)
    started = time.monotonic()
    with pytest.raises(StorageError) as raised:
        days.write_day(result, config.layout(), DAYS[0])
    # waited its whole patience (the message below says which: 1 s), however busy the machine
    assert time.monotonic() - started >= 1.0
    assert str(raised.value) == (
        f"s3://{BUCKET}/{key}: another machine (elsewhere pid 7 (0000)) has been writing this "
        "folder since 2025-02-21T05:00:00+00:00 and still was after 1 s; run again once it has "
        "finished (a machine that stopped gives the folder up 60 s after its last renewal)"
    )
    assert not [url for _, _, url in journal if f"days/{DAYS[0]}/" in url]

    _lease_of_another_machine(s3, key, time.time() - 1)
    days.write_day(result, config.layout(), DAYS[0])
    assert f"{PREFIX}days/{DAYS[0]}/ingest_manifest.json" in keys(s3, PREFIX)


def test_a_writer_that_lost_its_lease_commits_nothing(
    s3: dict[str, str],
    journal: list[tuple[str, str, str]],
    traces: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer cut off long enough for another machine to take its lease over finds out
    before it commits: its set's manifest is never written, and the error says so."""
    config = machine(tmp_path, "a", traces)
    result = _run_day(config, DAYS[0])
    key = f"{PREFIX}days/{DAYS[0]}/{WORKLOAD_LOCK}"
    real = Remote.put

    def taken_meanwhile(self: Remote, relative: str, data: Any) -> None:
        if relative.endswith(".parquet"):  # the set half uploaded: another machine takes over
            _lease_of_another_machine(s3, key, time.time() + 3600)
        real(self, relative, data)

    monkeypatch.setattr(Remote, "put", taken_meanwhile)
    with pytest.raises(StorageError) as raised:
        days.write_day(result, config.layout(), DAYS[0])
    assert str(raised.value) == (
        f"s3://{BUCKET}/{key}: this machine's hold on the folder lapsed and another machine "
        "(elsewhere pid 7 (0000)) took it; what this run was writing there was not committed: "
        "run again"
    )
    assert f"{PREFIX}days/{DAYS[0]}/ingest_manifest.json" not in keys(s3, PREFIX)


def test_a_held_lease_is_renewed_until_given_back(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held past several of its terms, a lease stays its holder's (renewed meanwhile), so
    another machine's wait runs out; given back, the other takes it at once."""
    monkeypatch.setattr(remote_module, "LEASE_TTL_S", 0.3)
    folder = Remote(f"s3://{BUCKET}/team/renewed")
    mine, theirs = remote_module.Lease(folder, "lease"), remote_module.Lease(folder, "lease")
    mine.acquire()
    try:
        with pytest.raises(StorageError, match=r"another machine .* still was after 1 s"):
            theirs.acquire(wait=1.0)
        mine.confirm()
    finally:
        mine.release()
    # no patience at all: taken at the first look, or the one-line error
    theirs.acquire(wait=0.0)
    theirs.release()
