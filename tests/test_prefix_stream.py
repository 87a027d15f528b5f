"""The out-of-core prefix analysis: chunk boundaries change nothing, a scanned table gives what
the same table in memory gives, and the one-pass replay keeps tenants and (model, adapter)
namespaces apart like replaying each alone (brute force on random traces with nulls, unknown
hashes, logged sessions, tenants and namespaces)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.prefix import analysis
from pipeline.prefix.stage import inputs_from, run
from pipeline.schema import conform
from tests.conftest import DEFAULTS
from tests.prefix_oracles import reuse_per_request

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
B = 4


def _trace(seed: int, n: int) -> pl.DataFrame:
    rng = random.Random(seed)
    convs: list[list[int]] = []
    rows = []
    t = 0.0
    for i in range(n):
        t += rng.choice([0, 0.5, 3, 30, 200])
        u = rng.random()
        if convs and u < 0.5:
            conv = rng.choice(convs)
            conv.extend(rng.randrange(1, 6) for _ in range(rng.randrange(0, 4)))
            tokens = list(conv)
        elif convs and u < 0.6:
            tokens = list(rng.choice(convs))  # a retry
        else:
            tokens = [rng.randrange(3)] + [rng.randrange(50) for _ in range(rng.randrange(0, 6))]
            convs.append(tokens)
        chain: list[int | None] = []
        acc = 0
        for x in tokens:
            acc = (acc * 1_000_003 + x + 1) % 2**63
            chain.append(acc)
        pb = max(0, len(chain) - rng.randrange(0, 2))
        if rng.random() < 0.05:
            pb = len(chain) + 2  # more prompt blocks than the chain holds
        if chain and rng.random() < 0.02:
            chain[rng.randrange(len(chain))] = None
        rows.append(
            {
                "request_id": f"q{i}",
                "arrival": T0 + dt.timedelta(seconds=t),
                "session_id": rng.choice([None] * 8 + ["s1", "s2", "inferred-1", "inferred-0"]),
                "turn": rng.choice([None, None, 3]),
                "tenant": rng.choice([None, "", "a", "b"]) if seed % 2 else None,
                "model": rng.choice([None, "m1"]) if seed % 3 == 0 else None,
                "lora_adapter": rng.choice([None, "l"]) if seed % 3 == 0 else None,
                "prompt_tokens": None if rng.random() < 0.02 else B * pb + rng.randrange(B),
                "prefix_hashes": None if rng.random() < 0.02 else chain,
                "prompt_blocks": None if rng.random() < 0.02 else pb,
                "hashes_known": rng.random() > 0.05 if seed % 4 else True,
                "block_size": B,
            }
        )
    strings = dict.fromkeys(["session_id", "tenant", "model", "lora_adapter"], pl.String)
    return conform(
        pl.DataFrame(
            rows,
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64), "turn": pl.Int32, **strings},
        )
    )


def _analysed(requests: pl.DataFrame | pl.LazyFrame, block_size: int | None) -> Any:
    settings = DEFAULTS.prefix.replace(block_size=block_size)
    return run(inputs_from(requests), settings)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_size", [None, 2 * B])
def test_chunks_and_scans_change_nothing(
    seed: int, block_size: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = _trace(seed, 300)
    whole = _analysed(frame, block_size)
    path = tmp_path / "requests.parquet"
    frame.write_parquet(path, row_group_size=50)
    monkeypatch.setattr(analysis, "CHUNK_HASHES", 37)
    monkeypatch.setattr(analysis, "MIN_CHUNK_ROWS", 1)
    for chunked in (_analysed(frame, block_size), _analysed(pl.scan_parquet(path), block_size)):
        assert chunked.summary == whole.summary
        assert_frame_equal(chunked.curve, whole.curve)
        assert_frame_equal(chunked.sessions.collect(), whole.sessions.collect())


def _reference_hits(frame: pl.DataFrame) -> tuple[list[int], list[int]]:
    """Leading prompt blocks an earlier request held: any tenant, and the same tenant (a null
    tenant is the tenant ""), within the request's (model, adapter)."""
    seen: set[tuple[Any, ...]] = set()
    seen_by_tenant: set[tuple[Any, ...]] = set()
    hits, same = [], []
    for row in frame.iter_rows(named=True):
        chain = [h or 0 for h in row["prefix_hashes"] or []]
        if not row["hashes_known"]:
            hits.append(0)
            same.append(0)
            continue
        space = (row["model"], row["lora_adapter"])
        tenant = row["tenant"] or ""
        pb = min(row["prompt_blocks"] or 0, len(chain))
        k = 0
        while k < pb and (space, chain[k]) in seen:
            k += 1
        j = 0
        while j < pb and (space, tenant, chain[j]) in seen_by_tenant:
            j += 1
        hits.append(k)
        same.append(j)
        seen.update((space, h) for h in chain)
        seen_by_tenant.update((space, tenant, h) for h in chain)
    return hits, same


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_one_replay_keeps_tenants_and_namespaces_apart(seed: int) -> None:
    frame = _trace(seed, 400)
    per = reuse_per_request(frame, B)
    hits, same = _reference_hits(frame)
    assert per["hit_blocks"].to_list() == hits
    limit = [max(0, (p or 0) - 1) // B for p in frame["prompt_tokens"].to_list()]
    assert per["hit_tokens_same_tenant"].to_list() == [
        min(s, lim) * B for s, lim in zip(same, limit, strict=True)
    ]
