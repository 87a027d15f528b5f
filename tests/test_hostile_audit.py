"""Hostile ``enginefit audit --chain-head`` values: empty, malformed, a digit short, or a whole
page long is a mistyped flag (one line naming it, exit 2, the value echoed at most 80
characters), never the "ledger was rewritten" tamper alarm; the right head in upper case is
the right head. A manifest that names the file system's root among its places is refused
before anything there is read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from pipeline.cli import main as enginefit
from pipeline.commands.report import chain_head_flag
from pipeline.ledger import MANIFEST
from tests import test_audit
from tests.test_audit import Published, rewrite_ledger

published = test_audit.published  # two versions of one workload, published (a fixture)

HEAD = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("", "'' (0 characters)"),
        ("not-a-head", "'not-a-head' (10 characters)"),
        (HEAD[:63], f"'{HEAD[:63]}' (63 characters)"),
        ("a" * 100_000, "'" + "a" * 80 + "…' (100,000 characters)"),
    ],
)
def test_a_malformed_chain_head_is_the_flag_not_a_tamper_alarm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, shown: str
) -> None:
    assert enginefit(["audit", str(tmp_path / "v1"), "--chain-head", value]) == 2
    err = capsys.readouterr()
    assert "rewritten" not in err.out + err.err
    assert err.err.strip().splitlines() == [
        "enginefit: error: --chain-head: expected the 64 hex digits an audit prints as the "
        f"chain head, got {shown}"
    ]


def test_the_right_head_in_upper_case_is_the_right_head() -> None:
    assert chain_head_flag(HEAD.upper()) == HEAD
    assert chain_head_flag(f"  {HEAD}\n") == HEAD
    assert chain_head_flag(None) is None


def test_a_vouched_manifest_naming_the_file_systems_root_reads_nothing_there(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest rewritten with its ledger (the documented limit without a signature) that
    names ``/`` as a root and /etc/shadow as an input: refused, its hash never printed."""
    folder = published.folder(2)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.update(base="/", roots=["/", "/etc"], inputs={"config:etc/shadow": "0" * 64})
    (folder / MANIFEST).write_text(json.dumps(manifest))
    digest = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    rewrite_ledger(
        published.tree,
        lambda e: dataclasses.replace(e, manifest_sha256=digest) if e.version == 2 else e,
    )
    assert enginefit(["audit", str(folder)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith(("FAILED", "DIFFERS"))] == [
        f"FAILED {folder / MANIFEST}: roots: / is not a place a version records (the file "
        "system's root or a system folder); nothing under it is read",
        f"FAILED {folder / MANIFEST}: roots: /etc is not a place a version records (the file "
        "system's root or a system folder); nothing under it is read",
        "FAILED /etc/shadow: refused: outside the places the version recorded (); the manifest "
        "lists a file no stage read",
    ]


@pytest.mark.parametrize("published_at", ["yesterday", "2026-11-29T10:00:00", ""])
def test_a_ledger_entry_published_at_no_time_is_named(
    published: Published, capsys: pytest.CaptureFixture[str], published_at: str
) -> None:
    rewrite_ledger(published.tree, lambda e: dataclasses.replace(e, published_at=published_at))
    assert enginefit(["audit", str(published.folder(2))]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"enginefit: error: {published.tree.ledger}: versions[0].published_at: "
        f"{published_at!r} is not a time with its UTC offset (ISO 8601, e.g. "
        "2026-11-29T10:00:00+00:00, as enginefit writes it); the ledger is append-only and "
        "never edited by hand: restore it from your backup"
    ]
