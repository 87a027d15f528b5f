"""``paths.data_dir`` and ``paths.reports_dir`` on object storage, against a local S3 server
(moto's, speaking the real S3 protocol over HTTP on a free loopback port): a report made there
equals one made on local disk, its objects are in the bucket, and a published version is never
overwritten."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assets.cli import main as enginefit
from pipeline import results
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.ledger import MANIFEST, RECORD, ReportTree
from pipeline.mirror import pull
from pipeline.remote import Remote, StorageError, mirror_of
from pipeline.store import read_requests
from tests.conftest import REPO, bundled_config

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "enginefit-test"
# The first requests of the bundled trace: every stage runs, in a fraction of the whole's time.
SLICE = 600


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A moto S3 server on a free loopback port, with the bucket made, and the AWS variables
    that point a client at it."""
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
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        client(env).create_bucket(Bucket=BUCKET)
        yield env
    server.stop()


def client(env: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def keys(env: dict[str, str], prefix: str) -> dict[str, str]:
    """Every object under ``prefix``: its key → its ETag."""
    listed = client(env).list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
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


@pytest.fixture(scope="module")
def runs(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same report made twice: on local disk, and with both folders in the bucket (with a
    local cache of its own). Returns the two configurations."""
    root = tmp_path_factory.mktemp("objstore")
    local = sliced_config(root, "local")
    remote = sliced_config(
        root,
        "remote",
        {
            "data_dir": f"s3://{BUCKET}/team/data",
            "reports_dir": f"s3://{BUCKET}/team/reports",
            "cache_dir": str(root / "cache"),
        },
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(root / "dagster"))
        for config in (local, remote):
            assert enginefit(["report", "--config", str(config)]) == 0
    return local, remote


def _published(config: Path) -> Path:
    filing = load_config(config).filing()
    latest = filing.tree.latest()
    assert latest is not None
    return filing.tree.root / latest.path


# What a manifest records of where it was made (paths, the configuration file, the folders it
# read), which differs between a local run and one on object storage by design.
_WHERE = {"base", "roots", "workload_folder", "configuration_sha256", "identity", "inputs"}


def test_a_report_on_object_storage_equals_the_one_made_on_local_disk(
    runs: tuple[Path, Path],
) -> None:
    local, remote = (_published(config) for config in runs)
    assert (local / RECORD).read_bytes() == (remote / RECORD).read_bytes()
    mine, theirs = (json.loads((folder / MANIFEST).read_text()) for folder in (local, remote))
    # Every derived table, figure and summary the report was made from: the same bytes.
    assert mine["derived"] == theirs["derived"] and len(mine["derived"]) > 20
    assert mine["decision_sha256"] == theirs["decision_sha256"]
    assert mine["outputs"][RECORD] == theirs["outputs"][RECORD]
    configuration = theirs["configuration"]
    assert configuration["paths"]["data_dir"] == f"s3://{BUCKET}/team/data"
    for manifest in (mine, theirs):
        manifest["configuration"].pop("paths")
        manifest["configuration"].pop("source")
        for key in (*_WHERE, "outputs"):
            manifest.pop(key)
    assert mine == theirs
    inputs = [json.loads((folder / MANIFEST).read_text())["inputs"] for folder in (local, remote)]
    assert {k: v for k, v in inputs[0].items() if not k.startswith("config:")} == {
        k: v for k, v in inputs[1].items() if not k.startswith("config:")
    }
    local_capacity = load_config(runs[0]).layout().capacity.result.read_bytes()
    assert load_config(runs[1]).layout().capacity.result.read_bytes() == local_capacity


def test_the_outputs_are_objects_in_the_bucket(runs: tuple[Path, Path], s3: dict[str, str]) -> None:
    data = keys(s3, "team/data/mooncake-conversation/")
    workload = "team/data/mooncake-conversation/"
    for name in (
        "ingest_manifest.json",
        "requests/part-00000.parquet",
        "capacity/capacity.json",
        "capacity/.workload_capacity.sha256.json",
        "decision/decision.json",
        "shape/workload_shape.json",
    ):
        assert workload + name in data
    latest = load_config(runs[1]).filing().tree.latest()
    assert latest is not None
    folder = f"team/reports/mooncake-conversation/{latest.path}"
    reports = keys(s3, "team/reports/")
    for name in (MANIFEST, RECORD, "engine-selection.pdf", "engine-selection.html"):
        assert f"{folder}/{name}" in reports
    assert "team/reports/mooncake-conversation/index.json" in reports
    # What the bucket holds is what the local mirror holds, byte for byte.
    body = client(s3).get_object(Bucket=BUCKET, Key=workload + "capacity/capacity.json")
    assert body["Body"].read() == load_config(runs[1]).layout().capacity.result.read_bytes()


def test_another_machine_reads_the_workload_from_the_bucket(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A fresh cache (another pod): every committed set comes back from the bucket checked
    against its seal, and the report folder with its ledger."""
    raw = yaml.safe_load(runs[1].read_text())
    raw["paths"]["cache_dir"] = str(tmp_path / "elsewhere")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    config, original = load_config(other), load_config(runs[1])
    pull(config.layout(), config.filing().tree)
    assert config.layout().root.is_relative_to(tmp_path / "elsewhere")
    for result in (results.SHAPE, results.CAPACITY, results.DECISION, results.WHATIF):
        assert result.require(config.layout()).read_bytes() == (
            result.require(original.layout()).read_bytes()
        )
    assert (
        read_requests(config.layout()).collect().equals(read_requests(original.layout()).collect())
    )
    assert config.filing().tree.read_ledger() == original.filing().tree.read_ledger()


def test_a_published_version_is_never_overwritten(
    runs: tuple[Path, Path], s3: dict[str, str], tmp_path: Path
) -> None:
    """Another machine that has not seen version 1 publishes its own: refused at the first key
    (If-None-Match), the bucket's version 1 unchanged; after a pull it publishes version 2."""
    config = load_config(runs[1])
    tree = config.filing().tree
    latest = tree.latest()
    assert latest is not None
    mirror = mirror_of(f"s3://{BUCKET}/team/reports", tmp_path / "cold").child(tree.root.name)
    cold = ReportTree(mirror.local, mirror)
    before = keys(s3, "team/reports/")
    manifest = {"identity": "0" * 64}
    with pytest.raises(StorageError, match="another enginefit run published this version"):
        cold.publish(latest.quarter, latest.version, {RECORD: b"{}\n"}, manifest, "other")
    assert keys(s3, "team/reports/") == before
    assert not cold.version_dir(latest.quarter, latest.version).exists()
    reports = Remote(f"s3://{BUCKET}/team/reports")
    assert not reports.put_new(f"mooncake-conversation/{latest.path}/{MANIFEST}", b"x")
    assert keys(s3, "team/reports/") == before


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
