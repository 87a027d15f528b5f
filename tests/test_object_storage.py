"""``paths.data_dir`` and ``paths.reports_dir`` on object storage, against a local S3 server
(moto's, speaking the real S3 protocol over HTTP on a free loopback port): a report made there
equals one made on local disk, its objects are in the bucket, and a published version is never
overwritten."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import secrets
import socket
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import dagster as dg
import moto.server as moto_server
import polars as pl
import pytest
import yaml

from assets.cli import main as enginefit
from assets.days import day_assets, quarter_partitions, shape_day_asset
from assets.prefix import prefix_sharing as prefix_asset
from assets.report import engine_selection_report as report_asset
from assets.resources import EnginefitStore
from assets.shape import workload_shape as shape_asset
from assets.sim import simulation_scenarios as scenarios_asset
from perf.workload import canonical_frame, conversations, spec
from pipeline import results
from pipeline.config import load_config
from pipeline.errors import ConfigError, StageOutputUnreadableError
from pipeline.ingest.days import UnitedDay
from pipeline.layout import WORKLOAD_LOCK, WorkloadLayout
from pipeline.ledger import MANIFEST, RECORD
from pipeline.mirror import pull, pull_reports
from pipeline.prefix.days import analyse_days, forget_passes
from pipeline.remote import Remote, StorageError
from pipeline.report import present
from pipeline.resume import DayPasses
from pipeline.shape import stage as shape_stage
from pipeline.shape.stage import ModelSweeps
from pipeline.sim.resume import DailyStream
from pipeline.sim.stream import RequestStream
from pipeline.store import read_requests
from tests.bundled_report import render_the_html_as_the_pdf
from tests.conftest import (
    DEFAULTS,
    REPO,
    _built_once,
    _shared_folder,
    bundled_config,
    dagster_history,
)
from tests.test_daily_partitions import DAYS, _assert_union_is_whole, _config, _day_file, _sample

BUCKET = "enginefit-test"
WORKLOAD = "mooncake-conversation"  # the bundled configuration's workload name
# The first requests of the bundled trace: every stage runs, in a fraction of the whole's time.
SLICE = 600
# The days the bucket's quarter holds, each ingested by a machine of its own at once: two writers
# racing on one folder prove what three do, and each costs a process loading Dagster.
QUARTER_DAYS = DAYS[:2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _server() -> Iterator[dict[str, str]]:
    """A moto S3 server on a free loopback port, with :data:`BUCKET` made, and the AWS
    variables that point a client at it set for the duration."""
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
    }
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            client(env).create_bucket(Bucket=BUCKET)
            yield env
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with _server() as env:
        yield env


def client(env: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def keys(env: dict[str, str], prefix: str, bucket: str = BUCKET) -> dict[str, str]:
    """Every object under ``prefix``: its key → its ETag."""
    listed = client(env).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def sliced_config(root: Path, name: str, paths: dict[str, str] | None = None) -> Path:
    """The bundled configuration on the first :data:`SLICE` requests of its trace."""
    trace = root / "slice.jsonl"
    if not trace.exists():
        source = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
        with source.open() as handle:
            trace.write_text("".join(next(handle) for _ in range(SLICE)))
    path = bundled_config(root, name)
    raw = yaml.safe_load(path.read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "auto"}]
    if paths is not None:
        raw["paths"] = paths
    path.write_text(yaml.safe_dump(raw))
    return path


def day_files(root: Path) -> Path:
    """The first :data:`SLICE` requests of the bundled trace as :data:`QUARTER_DAYS` (an equal
    share each, moved to its day), one file a day as a quarter is exported."""
    folder = root / "traces"
    folder.mkdir(exist_ok=True)
    sample, share = _sample(SLICE), SLICE // len(QUARTER_DAYS)
    for k in range(len(QUARTER_DAYS)):
        _day_file(folder, k, sample[k * share : (k + 1) * share])
    return folder


def bucket_paths(cache: Path, bucket: str = BUCKET) -> dict[str, str]:
    """``paths`` on ``bucket``, as one machine (its own ``cache``) sees them."""
    return {
        "data_dir": f"s3://{bucket}/team/data",
        "reports_dir": f"s3://{bucket}/team/reports",
        "cache_dir": str(cache),
    }


def daily_config(root: Path, name: str, traces: Path, paths: dict[str, str]) -> Path:
    """The bundled configuration ingesting ``traces``' files day by day, with ``paths``."""
    config = _config(root, name, [str(traces / "mooncake-{day}.jsonl")])
    raw = yaml.safe_load(config.read_text())
    raw["paths"] = paths
    config.write_text(yaml.safe_dump(raw))
    return config


def ingest_day(config: str, day: str) -> None:
    """One day's partition, materialised as a backfill's run of it does (its own process)."""
    workload_day, _ = day_assets(quarter_partitions("2025-Q1"))
    store = EnginefitStore(config_path=config)
    with dg.DagsterInstance.ephemeral() as instance:
        run = dg.materialize(
            [workload_day],
            partition_key=day,
            resources={"store": store},
            instance=instance,
            raise_on_error=False,
        )
    assert run.success, [e.message for e in run.all_events if e.is_failure]


def ingest_days_side_by_side(root: Path, traces: Path) -> None:
    """Each day by a process of its own with a cache of its own (another machine each), all
    writing the same folder in the bucket at once."""
    spawn = multiprocessing.get_context("spawn")
    configs = [
        str(daily_config(root, f"day-{day}", traces, bucket_paths(root / f"cache-{day}")))
        for day in QUARTER_DAYS
    ]
    with ProcessPoolExecutor(len(QUARTER_DAYS), mp_context=spawn) as pool:
        submitted = zip(configs, QUARTER_DAYS, strict=True)
        for done in [pool.submit(ingest_day, c, d) for c, d in submitted]:
            done.result()


@dataclass(frozen=True)
class Runs:
    """The same quarter reported by one machine reading every day's file at once on local disk
    (``local``), and in the bucket (``remote``: its days ingested side by side by a machine
    each, then the report made on another); ``bucket``: every object the server held
    afterwards, as files."""

    local: Path
    remote: Path
    bucket: Path


def _make_both(root: Path) -> Runs:
    traces = day_files(root)
    local = _config(root, "local", [str(traces / f"mooncake-{day}.jsonl") for day in QUARTER_DAYS])
    remote = daily_config(root, "remote", traces, bucket_paths(root / "cache"))
    snapshot = root / "bucket"
    with _server() as env, dagster_history() as home, pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(home))
        # The PDF's stand-in (its HTML): what is compared is where the bytes go, not the PDF,
        # which tests/test_report.py renders for real.
        patch.setattr(present, "render_pdf", render_the_html_as_the_pdf)
        ingest_days_side_by_side(root, traces)
        for config in (local, remote):
            assert enginefit(["report", "--config", str(config)]) == 0
        for key in keys(env, ""):
            target = snapshot / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client(env).get_object(Bucket=BUCKET, Key=key)["Body"].read())
    return Runs(local, remote, snapshot)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Made once per test run (shared by the xdist workers, as ``bundled_graph_run`` is)."""
    return _built_once(_shared_folder(tmp_path_factory), "object-storage", _make_both)


@pytest.fixture
def bucket(empty_bucket: str, s3: dict[str, str], runs: Runs) -> str:
    """A new bucket on this worker's server holding what the run's bucket held (put a few
    objects at a time: the server answers each on a thread of its own)."""
    put = client(s3).put_object

    def upload(path: Path) -> None:
        put(
            Bucket=empty_bucket,
            Key=path.relative_to(runs.bucket).as_posix(),
            Body=path.read_bytes(),
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(upload, sorted(p for p in runs.bucket.rglob("*") if p.is_file())))
    return empty_bucket


@pytest.fixture
def empty_bucket(s3: dict[str, str]) -> str:
    """A new, empty bucket on this worker's server."""
    name = f"enginefit-{secrets.token_hex(4)}"
    client(s3).create_bucket(Bucket=name)
    return name


def _published(config: Path) -> Path:
    filing = load_config(config).filing()
    latest = filing.tree.latest()
    assert latest is not None
    return filing.tree.root / latest.path


# What a manifest records of where it was made (paths, the configuration file, the folders it
# read), which differs between a local run and one on object storage by design.
_WHERE = {"base", "roots", "workload_folder", "configuration_sha256", "identity", "inputs"}
# The ingest set's own files: a union of days names its parts and its notes by day where one
# ingest of every file does not; its table, quarantine and counts are compared instead.
_INGEST_SET = {"ingest_manifest.json", "ingest_summary.json", "requests", "days"}
# This machine's own: the folder's marker and lock, never uploaded.
_MACHINE = {".enginefit-workload", ".enginefit.lock"}


def stage_files(workload: Path) -> dict[str, bytes]:
    """Every file the stages after ingest wrote in ``workload``, by path below it (not the
    passes kept between days: what a union of days keeps, never a result)."""
    return {
        path.relative_to(workload).as_posix(): path.read_bytes()
        for path in sorted(workload.rglob("*"))
        if path.is_file()
        and path.relative_to(workload).parts[0] not in _INGEST_SET | _MACHINE
        and "resume" not in path.relative_to(workload).parts
    }


def _in(bucket: str, config: Path, folder: Path, simulation: dict[str, Any] | None = None) -> Path:
    """``config`` (the one made on object storage) on ``bucket`` with a cache in ``folder``:
    another machine's view of the same folders (``simulation``: keys of that section set)."""
    raw = yaml.safe_load(config.read_text())
    raw["paths"] = bucket_paths(folder / "cache", bucket)
    raw["simulation"] = {**raw.get("simulation", {}), **(simulation or {})}
    path = folder / "elsewhere.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_days_ingested_side_by_side_in_the_bucket_report_as_one_machine_does(runs: Runs) -> None:
    """Every table, figure and summary of every stage, the decision record and what the report
    says it was made from: the same bytes on the machine that made the report from the bucket,
    in the bucket, and on the one machine that read every day's file at once on its disk; the
    request table, quarantine and counts the same too."""
    local, remote = load_config(runs.local).layout(), load_config(runs.remote).layout()
    mine, theirs = stage_files(local.root), stage_files(remote.root)
    assert mine.keys() == theirs.keys() and len(mine) > 50
    assert [name for name in mine if mine[name] != theirs[name]] == []
    uploaded = runs.bucket / "team" / "data" / local.name
    assert [name for name in mine if (uploaded / name).read_bytes() != mine[name]] == []
    _assert_union_is_whole(remote, local)
    assert sorted(json.loads(remote.ingest.manifest.read_text())["days"]) == list(QUARTER_DAYS)

    published = _published(runs.local), _published(runs.remote)
    assert (published[0] / RECORD).read_bytes() == (published[1] / RECORD).read_bytes()
    manifests = [json.loads((folder / MANIFEST).read_text()) for folder in published]
    for manifest in manifests:
        manifest["derived"].pop("ingest_summary.json")  # its notes and warnings name the days
    ours, other = manifests
    assert ours["derived"] == other["derived"] and len(ours["derived"]) > 20
    assert ours["decision_sha256"] == other["decision_sha256"]
    assert ours["outputs"][RECORD] == other["outputs"][RECORD]
    assert other["configuration"]["paths"]["data_dir"] == f"s3://{BUCKET}/team/data"
    read = [
        {k: v for k, v in m["inputs"].items() if not k.startswith("config:")} for m in manifests
    ]
    assert read[0] == read[1]
    for manifest in manifests:
        configuration = manifest["configuration"]
        for key in ("paths", "source"):
            configuration.pop(key)
        for key in ("traces", "daily_quarter"):  # the files at once, or one a day
            configuration["workload"].pop(key)
        for key in (*_WHERE, "outputs"):
            manifest.pop(key)
    assert ours == other


def test_the_outputs_are_objects_in_the_bucket(runs: Runs) -> None:
    """What the server held after the run: each committed set, its marker, the version and
    the ledger; the same bytes as the mirror the run worked on."""
    workload = runs.bucket / "team" / "data" / "mooncake-conversation"
    for name in (
        "ingest_manifest.json",
        "requests/part-00000.parquet",
        "capacity/capacity.json",
        "capacity/.workload_capacity.sha256.json",
        "decision/decision.json",
        "decision/.engine_decision.sha256.json",
        "shape/workload_shape.json",
    ):
        assert (workload / name).read_bytes() == (
            load_config(runs.remote).layout().root / name
        ).read_bytes()
    tree = load_config(runs.remote).filing().tree
    latest = tree.latest()
    assert latest is not None
    reports = runs.bucket / "team" / "reports" / "mooncake-conversation"
    for name in (MANIFEST, RECORD, "engine-selection.pdf", "engine-selection.html"):
        assert (reports / latest.path / name).read_bytes() == (
            tree.root / latest.path / name
        ).read_bytes()
    assert (reports / "index.json").read_bytes() == tree.ledger.read_bytes()


def test_another_machine_reads_the_workload_from_the_bucket(
    runs: Runs, bucket: str, tmp_path: Path
) -> None:
    """A fresh cache (another pod): every committed set comes back from the bucket checked
    against its seal, and the report folder with its ledger."""
    config, original = load_config(_in(bucket, runs.remote, tmp_path)), load_config(runs.remote)
    pull(config.layout(), config.filing().tree)
    assert config.layout().root.is_relative_to(tmp_path / "cache")
    for result in (results.SHAPE, results.CAPACITY, results.DECISION, results.WHATIF):
        assert result.require(config.layout()).read_bytes() == (
            result.require(original.layout()).read_bytes()
        )
    assert (
        read_requests(config.layout()).collect().equals(read_requests(original.layout()).collect())
    )
    assert config.filing().tree.read_ledger() == original.filing().tree.read_ledger()


def test_a_fetched_file_that_differs_from_its_seal_is_refused(
    runs: Runs, bucket: str, s3: dict[str, str], tmp_path: Path
) -> None:
    """A sealed file changed in the bucket (by hand, or a half-finished push from elsewhere)
    is never taken: the pull says which seal's files it could not fetch as sealed."""
    key = "team/data/mooncake-conversation/capacity/capacity.json"
    client(s3).put_object(Bucket=bucket, Key=key, Body=b"{}\n")
    config = load_config(_in(bucket, runs.remote, tmp_path))
    with pytest.raises(StageOutputUnreadableError) as raised:
        pull(config.layout(), config.filing().tree)
    assert str(raised.value).startswith(
        f"s3://{bucket}/team/data/mooncake-conversation/capacity/.workload_capacity.sha256.json: "
        "the files it names do not match it (another machine is writing them, or they were "
        "changed by hand)"
    )
    assert not (config.layout().capacity.dir / ".workload_capacity.sha256.json").exists()


def test_a_published_version_is_never_overwritten(
    runs: Runs, bucket: str, s3: dict[str, str], tmp_path: Path
) -> None:
    """Another machine that has not seen the published version publishes its own under the
    same key: refused at the first object (If-None-Match), the bucket unchanged. Once it has
    pulled, its publication is the next version, beside the first."""
    config = load_config(_in(bucket, runs.remote, tmp_path))
    tree = config.filing().tree
    assert tree.remote is not None
    latest = load_config(runs.remote).filing().tree.latest()
    assert latest is not None
    before = keys(s3, "team/reports/", bucket)
    manifest = {"identity": "0" * 64}
    with pytest.raises(StorageError, match="another enginefit run published this version"):
        tree.publish(latest.quarter, latest.version, {RECORD: b"{}\n"}, manifest, "other")
    assert keys(s3, "team/reports/", bucket) == before
    assert not tree.version_dir(latest.quarter, latest.version).exists()
    assert not Remote(f"s3://{bucket}/team/reports").put_new(
        f"mooncake-conversation/{latest.path}/{MANIFEST}", b"x"
    )
    pull_reports(tree.remote)
    entry, _ = tree.publish(latest.quarter, latest.version + 1, {RECORD: b"{}\n"}, manifest, "o")
    after = keys(s3, "team/reports/", bucket)
    assert {k: v for k, v in after.items() if k in before and not k.endswith("index.json")} == {
        k: v for k, v in before.items() if not k.endswith("index.json")
    }
    assert f"team/reports/mooncake-conversation/{entry.path}/{MANIFEST}" in after
    assert [e.version for e in tree.read_ledger()][-2:] == [latest.version, latest.version + 1]


def test_a_missing_bucket_is_one_line_naming_the_url(
    s3: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sliced_config(
        tmp_path,
        "nobucket",
        {
            "data_dir": "s3://no-such-bucket/data",
            "reports_dir": str(tmp_path / "reports"),
            "cache_dir": str(tmp_path / "cache"),
        },
    )
    assert enginefit(["shape", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("enginefit: error: s3://no-such-bucket/data/mooncake-conversation")
    assert "the bucket no-such-bucket does not exist; create it" in err


def test_an_endpoint_that_does_not_answer_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(
        StorageError,
        match=r"^s3://down-bucket/x: cannot reach the object store at http://127\.0\.0\.1:\d+; start it",
    ):
        Remote("s3://down-bucket/x").list()


def test_no_credentials_is_one_line_saying_which_to_set(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without credentials the client asks the machine's metadata service for a role; where
    there is none, the error says to set credentials, not that the store is down."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageError) as raised:
        Remote(f"s3://{BUCKET}/no-credentials").list()
    assert str(raised.value) == (
        f"s3://{BUCKET}/no-credentials: no credentials for the object store; set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the pod a role)"
    )


@pytest.mark.parametrize(
    ("paths", "said"),
    [
        ({"data_dir": "s3://Bad_Bucket/x"}, "paths.data_dir"),
        ({"storage_options": {"aws_secret_access_key": "x"}}, "never from this file"),
        ({"storage_option": {}}, "storage_option"),
    ],
)
def test_bad_object_storage_settings_are_configuration_errors(
    tmp_path: Path, paths: dict[str, Any], said: str
) -> None:
    config = bundled_config(tmp_path, "bad")
    raw = yaml.safe_load(config.read_text())
    raw["paths"].update(paths)
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=said):
        load_config(config)


# ---------------------------------------------------------------------------------------------
# Each step fetches what it reads.


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every object fetched from the bucket from now on: its key below the workload or report
    folder's parent (``data/...``, ``reports/...``) → its size."""
    seen: dict[str, int] = {}
    real_get, real_download = Remote.get, Remote.download

    def name(remote: Remote, relative: str) -> str:
        return remote.where(relative).split("/team/", 1)[1]

    def get(self: Remote, relative: str) -> bytes | None:
        data = real_get(self, relative)
        if data is not None:
            seen[name(self, relative)] = len(data)
        return data

    def download(self: Remote, relative: str, target: Path) -> None:
        real_download(self, relative, target)
        seen[name(self, relative)] = target.stat().st_size

    monkeypatch.setattr(Remote, "get", get)
    monkeypatch.setattr(Remote, "download", download)
    return seen


def _step_on_a_machine_of_its_own(
    runs: Runs,
    bucket: str,
    folder: Path,
    asset: dg.AssetsDefinition,
    simulation: dict[str, Any] | None = None,
    **run: Any,
) -> dict[str, Any]:
    """``asset`` materialised alone, on a machine that has never seen the workload; returns
    its materialisation's metadata values."""
    folder.mkdir()
    store = EnginefitStore(config_path=str(_in(bucket, runs.remote, folder, simulation)))
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            [asset], resources={"store": store}, instance=instance, raise_on_error=False, **run
        )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    (event,) = result.get_asset_materialization_events()
    metadata = event.step_materialization_data.materialization.metadata
    return {key: value.value for key, value in metadata.items()}


# The report's document as its HTML, as the bucket's runs made it: what is fetched does not
# depend on the PDF's rendering.
@pytest.mark.usefixtures("pdf_as_its_html")
def test_each_step_fetches_what_it_reads_not_the_workload(
    runs: Runs, bucket: str, fetched: dict[str, int], tmp_path: Path
) -> None:
    """On a machine of its own (a pod), a day's step fetches nothing, the union of the days
    fetches the days' sets, the shape step the request table, and the report every stage's
    sealed results, the ingest summary (with the manifest it is checked against) and the
    published versions, never a request part nor a day: each less than the pull of the whole
    workload that every step made before."""
    uploaded = runs.bucket / "team"
    whole = {
        path.relative_to(uploaded).as_posix(): path.stat().st_size
        for path in uploaded.rglob("*")
        if path.is_file() and path.name != WORKLOAD_LOCK  # the writers' leases
    }  # what a pull of everything fetches: every other object is a committed set's

    def step(name: str, asset: dg.AssetsDefinition, **run: Any) -> dict[str, int]:
        fetched.clear()
        _step_on_a_machine_of_its_own(runs, bucket, tmp_path / name, asset, **run)
        return dict(fetched)

    day, union = day_assets(quarter_partitions("2025-Q1"))
    assert step("day", day, partition_key=DAYS[0]) == {}

    days = step("union", union)
    data = f"data/{WORKLOAD}/"
    assert sorted(days) == sorted(k for k in whole if k.startswith(f"{data}days/"))

    shape = step("shape", shape_asset)
    ingest_set = {k for k in whole if k.startswith(data) and "/" not in k[len(data) :]}
    ingest_set |= {k for k in whole if k.startswith(f"{data}requests/")}
    assert set(shape) == ingest_set

    report = step("report", report_asset)
    parts = [k for k in whole if "/requests/" in k or "/days/" in k]
    unread = [
        f"{data}quarantine.parquet",
        *(k for k in whole if "/scenarios/" in k or "/prefix/resume/" in k),
    ]
    assert sorted(report) == sorted(set(whole) - {*parts, *unread})
    assert f"{data}ingest_summary.json" in report and f"{data}ingest_manifest.json" in report
    for fetched_by_step in (days, shape, report):
        assert sum(fetched_by_step.values()) < sum(whole.values())


def test_days_counted_for_the_shape_on_machines_of_their_own_are_read_back(
    runs: Runs,
    bucket: str,
    s3: dict[str, str],
    fetched: dict[str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quarter measured day by day (the exact limit lowered): each day's shape counts, made
    on a machine of its own, fetch the union's manifest and summary and that day's set, not
    the quarter, and are uploaded; the shape on another machine reads them back (it makes only
    the parts that need the quarter's other days) and writes the bytes that a machine making
    every part itself writes."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
    uploaded, data = runs.bucket / "team", f"data/{WORKLOAD}/"
    whole = {
        p.relative_to(uploaded).as_posix()
        for p in uploaded.rglob("*")
        if p.is_file() and p.name != WORKLOAD_LOCK  # the writers' leases
    }
    union = {f"{data}ingest_manifest.json", f"{data}ingest_summary.json"}
    shape_day = shape_day_asset(quarter_partitions("2025-Q1"))
    for day in QUARTER_DAYS:
        fetched.clear()
        made = _step_on_a_machine_of_its_own(
            runs, bucket, tmp_path / f"day-{day}", shape_day, partition_key=day
        )
        assert made["day_parts"].startswith("per-day parts: 1 computed, 0 read back")
        day_set = {k for k in whole if k.startswith(f"{data}days/{day}/")}
        assert set(fetched) == union | day_set and len(day_set) >= 3
    parts = f"team/{data}shape/days/"
    counted = sorted(k[len(parts) :] for k in keys(s3, parts, bucket) if k.endswith("part.json"))
    assert [(k.split("/")[0], k.split("/")[1].split("-")[0]) for k in counted] == [
        (day, "DayCounts") for day in QUARTER_DAYS
    ]

    def shape_files(machine: str) -> dict[str, bytes]:
        folder = tmp_path / machine / "cache" / bucket / "team" / "data" / WORKLOAD / "shape"
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}

    fetched.clear()
    read_back = _step_on_a_machine_of_its_own(runs, bucket, tmp_path / "shape", shape_asset)
    days = len(QUARTER_DAYS)
    assert read_back["day_parts"].startswith(f"per-day parts: {2 * days} computed, {days} read")
    assert {k for k in fetched if k.endswith("/part.json")} == {
        f"{data}shape/days/{k}" for k in counted
    }
    for key in keys(s3, parts, bucket):
        client(s3).delete_object(Bucket=bucket, Key=key)
    made_here = _step_on_a_machine_of_its_own(runs, bucket, tmp_path / "alone", shape_asset)
    assert made_here["day_parts"].startswith(f"per-day parts: {3 * days} computed, 0 read")
    assert shape_files("shape") == shape_files("alone") and len(shape_files("alone")) >= 3


def test_a_day_part_is_uploaded_whole_or_made_again(
    runs: Runs,
    bucket: str,
    s3: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A day's part whose upload failed is not kept here either, so counting the day again
    uploads it; a part the bucket holds without its tables (another machine replacing it) is
    made again, not a failure."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
    day, parts = QUARTER_DAYS[0], f"team/data/{WORKLOAD}/shape/days/{QUARTER_DAYS[0]}/"

    def machine(name: str) -> WorkloadLayout:
        (tmp_path / name).mkdir()
        config = load_config(_in(bucket, runs.remote, tmp_path / name))
        layout = config.layout()
        pull(layout, config.filing().tree, shape_stage.day_reads(layout, day), reports=False)
        return layout

    layout = machine("first")
    real_put = Remote.put

    def refused(self: Remote, relative: str, data: bytes | Path) -> None:
        if relative.endswith("/part.json"):
            raise StorageError(f"{self.where(relative)}: refused")
        real_put(self, relative, data)

    with monkeypatch.context() as failing:
        failing.setattr(Remote, "put", refused)
        with pytest.raises(StorageError, match=r"part\.json: refused"):
            shape_stage.count_day(layout, day)
    assert list(layout.shape_day_parts.rglob("part.json")) == []
    assert not any(k.endswith("part.json") for k in keys(s3, parts, bucket))
    assert shape_stage.count_day(layout, day).startswith("per-day parts: 1 computed, 0 read")
    uploaded = keys(s3, parts, bucket)
    assert sum(k.endswith("/part.json") for k in uploaded) == 1

    assert shape_stage.count_day(machine("second"), day).startswith("per-day parts: 0 computed")
    for key in uploaded:
        if key.endswith(".parquet"):
            client(s3).delete_object(Bucket=bucket, Key=key)
    assert shape_stage.count_day(machine("third"), day).startswith("per-day parts: 1 computed")
    assert keys(s3, parts, bucket).keys() == uploaded.keys()


def test_the_scenarios_pass_kept_by_one_machine_is_resumed_by_another(
    runs: Runs, bucket: str, s3: dict[str, str], fetched: dict[str, int], tmp_path: Path
) -> None:
    """The scenarios streamed over the union of days (the flattening limit lowered) on a
    machine of its own keep their pass in the bucket; another machine reads it back, replays
    no day and writes the same summaries."""
    streamed = {"curve_exact_max_blocks": 1}
    first = _step_on_a_machine_of_its_own(
        runs, bucket, tmp_path / "first", scenarios_asset, streamed
    )
    days = len(QUARTER_DAYS)
    assert first["resumed"].startswith(f"scenario replay: {days} day(s) replayed (no pass kept")
    kept = f"team/data/{WORKLOAD}/simulation/resume/scenarios/"
    assert sorted(k[len(kept) :] for k in keys(s3, kept, bucket)) == ["resume.json", "state.pickle"]

    fetched.clear()
    second = _step_on_a_machine_of_its_own(
        runs, bucket, tmp_path / "second", scenarios_asset, streamed
    )
    assert second["resumed"].startswith(f"scenario replay: 0 day(s) replayed ({days} of {days}")
    assert f"data/{WORKLOAD}/simulation/resume/scenarios/state.pickle" in fetched

    def summaries(machine: str) -> bytes:
        folder = tmp_path / machine / "cache" / bucket / "team" / "data" / WORKLOAD
        return (folder / "simulation" / "scenarios.json").read_bytes()

    assert summaries("first") == summaries("second")
    assert len(json.loads(summaries("first"))) == 8


def test_the_prefix_passes_kept_in_the_bucket_are_resumed_by_another_machine(
    runs: Runs, bucket: str, fetched: dict[str, int], tmp_path: Path
) -> None:
    """The prefix stage of the union on a machine that has never seen the workload reads back
    the passes the bucket's run kept (the state and each part's sessions file fetched), reads
    no day and writes the files that run wrote."""
    got = _step_on_a_machine_of_its_own(runs, bucket, tmp_path / "pod", prefix_asset)
    days = len(QUARTER_DAYS)
    assert got["resumed"].startswith(f"prefix sharing: 0 day(s) replayed ({days} of {days}")
    kept = f"data/{WORKLOAD}/prefix/resume/first/"
    assert f"{kept}state.pickle" in fetched
    assert sum(k.startswith(f"{kept}sessions/") for k in fetched) == days
    mine = tmp_path / "pod" / "cache" / bucket / "team" / "data" / WORKLOAD / "prefix"
    theirs = load_config(runs.remote).layout().prefix
    for name in ("summary", "curve", "sessions"):
        assert (mine / getattr(theirs, name).name).read_bytes() == getattr(
            theirs, name
        ).read_bytes()


def test_the_prefix_passes_leave_nothing_in_the_bucket_they_do_not_name(
    runs: Runs, empty_bucket: str, s3: dict[str, str], tmp_path: Path
) -> None:
    """A day changed: the first pass is made again and the sessions files of the old one are
    removed from the bucket too. A machine that never held the passes, on a workload no
    longer a union of days, removes them from the bucket: every pass's files and the day
    summaries."""
    from tests.test_prefix_days import _days

    trace = canonical_frame(conversations(spec(3_000, "short", seed=7, tenants=3, models=2)), 16)
    days, parts = _days(trace, tmp_path / "parts")

    def layout_on(machine: str) -> WorkloadLayout:
        (tmp_path / machine).mkdir()
        return load_config(_in(empty_bucket, runs.remote, tmp_path / machine)).layout()

    here = layout_on("here")
    analyse_days(DayPasses(days, parts, here.prefix_passes, here.remote), DEFAULTS.prefix)
    kept = f"team/data/{WORKLOAD}/prefix/resume/"
    changed = (days[0], UnitedDay(days[1].day, "re-ingested", days[1].parts), *days[2:])
    again = DayPasses(changed, parts, here.prefix_passes, here.remote)
    analyse_days(again, DEFAULTS.prefix)
    assert "changed" in again.said[0]
    marker = client(s3).get_object(Bucket=empty_bucket, Key=f"{kept}first/resume.json")
    named = json.loads(marker["Body"].read())["files"]
    in_bucket = sorted(
        k[len(f"{kept}first/") :] for k in keys(s3, f"{kept}first/sessions/", empty_bucket)
    )
    assert in_bucket == sorted(named) and len(named) == 5
    assert len(keys(s3, f"{kept}days/", empty_bucket)) == 4

    there = layout_on("there")
    forget_passes(there.prefix_passes, there.remote)
    assert keys(s3, kept, empty_bucket) == {}


def test_kept_passes_no_longer_asked_for_are_removed_from_the_bucket_too(
    runs: Runs, empty_bucket: str, s3: dict[str, str], tmp_path: Path
) -> None:
    """A fleet replay's kept pass that another machine uploaded and this run did not ask for
    is deleted from the bucket (its marker first); a folder not named as a kept pass stays."""
    (tmp_path / "here").mkdir()
    layout = load_config(_in(empty_bucket, runs.remote, tmp_path / "here")).layout()
    prefix = f"team/data/{WORKLOAD}/capacity/resume/"
    ours, other = "b512_r2_c4096_round_robin-alone-per-request", "notes-of-the-team"
    for name in (ours, other):
        for file in ("resume.json", "state.pickle"):
            client(s3).put_object(Bucket=empty_bucket, Key=f"{prefix}{name}/{file}", Body=b"{}")
    stream = RequestStream(lambda: [], DEFAULTS.shape.latency)
    daily = DailyStream((), (), layout.fleet_passes, layout.remote, stream=stream)
    deleted: list[str] = []
    real_delete = Remote.delete

    def delete(self: Remote, relative: str) -> None:
        deleted.append(relative.rsplit("/", 1)[1])
        real_delete(self, relative)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Remote, "delete", delete)
        daily.forget_unused()
    assert daily.forgotten == [ours]
    assert deleted == ["resume.json", "state.pickle"]
    assert sorted(keys(s3, prefix, empty_bucket)) == [
        f"{prefix}{other}/{f}" for f in ("resume.json", "state.pickle")
    ]


def test_the_sweeps_of_a_model_no_longer_fitted_are_removed_from_the_bucket_too(
    runs: Runs, empty_bucket: str, s3: dict[str, str], tmp_path: Path
) -> None:
    """The concurrency sweeps another machine kept for a latency model this run no longer
    fits are deleted from the bucket (each part's marker first); what is not a part stays."""
    (tmp_path / "here").mkdir()
    layout = load_config(_in(empty_bucket, runs.remote, tmp_path / "here")).layout()
    prefix = f"team/data/{WORKLOAD}/bench/days/"
    part = f"{'a' * 16}/2025-02-21/DaySweep-{'0' * 24}"
    for key in (f"{part}/fine.parquet", f"{part}/part.json", f"{'a' * 16}/notes.txt"):
        client(s3).put_object(Bucket=empty_bucket, Key=prefix + key, Body=b"{}")
    deleted: list[str] = []
    real_delete = Remote.delete

    def delete(self: Remote, relative: str) -> None:
        deleted.append(relative.rsplit("/", 1)[1])
        real_delete(self, relative)

    # as after a run over days that fitted no model
    sweeps = ModelSweeps(pl.LazyFrame(), 10, [], layout.concurrency_day_parts, layout.remote)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Remote, "delete", delete)
        said = sweeps.settle()
    assert said is not None and said.startswith("per-day sweeps of 0 latency model(s)")
    assert deleted == ["part.json", "fine.parquet"]
    assert sorted(keys(s3, prefix, empty_bucket)) == [f"{prefix}{'a' * 16}/notes.txt"]
