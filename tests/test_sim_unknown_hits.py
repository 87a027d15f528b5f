"""A trace without prompt content (Azure, BurstGPT) cannot show prefix-cache hits: the hit
figures are unknown (null, with the reason), never 0, in the commands' text and JSON, the
stage's Parquet and JSON outputs, the figures and the curve-vs-replay check. With only some
requests carrying content, the hit figures cover those requests and say how much they cover."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.etree import ElementTree

import dagster as dg
import polars as pl
import pytest

from assets.resources import EnginefitStore
from assets.sim import ASSETS, CHECKS
from pipeline.cli import main
from pipeline.schema import conform
from pipeline.sim.blocks import NO_CONTENT, sim_input
from pipeline.sim.checks import curve_matches_replay
from pipeline.sim.config import Scenario
from pipeline.sim.curve import capacity_curve
from pipeline.sim.present import hit_ratio_vs_capacity_svg, imbalance_vs_hit_ratio_svg
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import ScenarioSummary, curves_frame, scenario_frame
from tests.conftest import DEFAULTS, REPO, write_config, write_requests

SVG = "{http://www.w3.org/2000/svg}"

AZURE = REPO / "traces" / "azure-code" / "AzureLLMInferenceTrace_code.csv"
AZURE_ROWS = 300


@pytest.fixture
def azure(tmp_path: Path) -> Path:
    """The first rows of the bundled Azure code trace (CC BY 4.0): token counts only."""
    lines = AZURE.read_text().splitlines()[: AZURE_ROWS + 1]
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _azure_prompt_tokens(path: Path) -> int:
    return int(pl.read_csv(path)["ContextTokens"].sum())


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_simulate_on_azure_reports_unknown_hits_not_zero(
    azure: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", str(azure), "--block-size", "16", "--cache-tokens", "100000"]
    out = _json([*argv, "--replicas", "2", "--routing", "cache-aware"], capsys)
    for key in (
        "hit_tokens",
        "hit_ratio",
        "prefill_tokens",
        "hit_tokens_instant",
        "hit_ratio_instant",
        "prefill_imbalance",
    ):
        assert out[key] is None, key
    assert out["hit_unknown_reason"] == NO_CONTENT
    assert (out["content_requests"], out["content_prompt_tokens"]) == (0, 0)
    assert out["content_share"] == 0.0
    # what does not depend on content is still reported
    assert out["requests"] == AZURE_ROWS
    assert out["prompt_tokens"] == _azure_prompt_tokens(azure)
    per_replica = out["per_replica"]
    assert isinstance(per_replica, list) and len(per_replica) == 2
    assert sum(r["requests"] for r in per_replica) == AZURE_ROWS
    assert all(r["hit_ratio"] is None and r["hit_tokens"] is None for r in per_replica)
    assert isinstance(out["token_imbalance"], float) and out["token_imbalance"] >= 1.0

    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"hit ratio unknown: {NO_CONTENT}" in text
    assert "replica 0: 300 requests" in text and "hit ratio unknown" in text
    assert not re.search(r"\d\.\d\d%", text)  # no hit percentage anywhere


def test_curve_on_azure_reports_unknown_hits_not_zero(
    azure: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _json(["curve", str(azure), "--block-size", "16"], capsys)
    assert out["max_hit_ratio"] is None and out["max_hit_tokens"] is None
    assert out["saturation_cache_tokens"] is None
    assert out["points"] == []
    assert out["hit_unknown_reason"] == NO_CONTENT
    assert main(["curve", str(azure), "--block-size", "16"]) == 0
    assert capsys.readouterr().out == (
        f"{AZURE_ROWS} requests, 1 replica(s), single, block size 16: hit ratio unknown: "
        f"{NO_CONTENT}\n"
    )


# --- some requests with content --------------------------------------------------------------


def _mixed_frame() -> pl.DataFrame:
    """Three conversations of four turns with content (turn t: chain of t + 1 blocks, 16(t + 1)
    + 1 prompt tokens), interleaved with four count-only requests of 100 prompt tokens."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(12):
        s, t = i % 3, i // 3
        rows.append(
            {
                "request_id": f"c{i}",
                "session_id": f"s{s}",
                "prompt_tokens": 16 * (t + 1) + 1,
                "prefix_hashes": [s * 100 + k + 1 for k in range(t + 1)],
                "prompt_blocks": t + 1,
                "hashes_known": True,
            }
        )
    for j in range(4):
        rows.insert(
            3 * j + 1,
            {
                "request_id": f"n{j}",
                "session_id": None,
                "prompt_tokens": 100,
                "prefix_hashes": [],
                "prompt_blocks": 0,
                "hashes_known": False,
            },
        )
    frame = pl.DataFrame(rows, schema_overrides={"prefix_hashes": pl.List(pl.UInt64)})
    return conform(
        frame.with_columns(
            pl.Series("arrival", [t0 + timedelta(seconds=k) for k in range(len(rows))]),
            pl.lit(4).alias("output_tokens"),
            pl.lit(16).alias("block_size"),
        )
    )


# Turn t hits the t blocks its previous turn cached: 16·t tokens, three conversations.
MIXED_HITS = 3 * sum(16 * t for t in range(4))  # 288
MIXED_CONTENT_TOKENS = 3 * sum(16 * (t + 1) + 1 for t in range(4))  # 492
MIXED_PROMPT_TOKENS = MIXED_CONTENT_TOKENS + 4 * 100  # 892


def test_partial_content_hits_cover_the_requests_with_content() -> None:
    inp = sim_input(_mixed_frame(), latency_model=DEFAULTS.shape.latency)
    settings = DEFAULTS.simulation.replace(request_lifetime="instant")
    out = summarise(inp, simulate(inp, Scenario(16, 1, 10**6, "round-robin"), settings))
    assert out["hit_tokens"] == MIXED_HITS
    assert out["hit_ratio"] == pytest.approx(288 / 492)
    assert out["prefill_tokens"] == MIXED_CONTENT_TOKENS - MIXED_HITS
    assert out["prompt_tokens"] == MIXED_PROMPT_TOKENS
    assert out["content_requests"] == 12
    assert out["content_share"] == pytest.approx(492 / 892)
    assert out["hit_unknown_reason"] is None
    assert out["warnings"] == [
        "hit figures cover the 12 of 16 requests that carry prompt content (55.2% of prompt "
        "tokens); the others occupy cache capacity but whether they would hit is unknown"
    ]
    curve = capacity_curve(inp, settings, block_size=16, replicas=1, routing="round-robin")
    as_dict = curve.as_dict()
    assert as_dict["max_hit_tokens"] == MIXED_HITS
    assert as_dict["max_hit_ratio"] == pytest.approx(288 / 492)
    assert as_dict["content_share"] == pytest.approx(492 / 892)
    assert curve.frame()["hit_ratio"].max() == pytest.approx(288 / 492)
    # in a 2-block cache the count-only requests' 6 anonymous blocks each take capacity too:
    # hits fall, and the one-pass curve still equals the replay there
    small = summarise(inp, simulate(inp, Scenario(16, 1, 32, "round-robin"), settings))
    assert small["hit_tokens"] < MIXED_HITS
    assert small["hit_tokens"] == curve.hit_tokens_at(32)


def test_partial_content_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_requests(_mixed_frame(), tmp_path / "wl")
    argv = ["simulate", str(tmp_path / "wl"), "--block-size", "16", "--cache-tokens", "100000"]
    assert main([*argv, "--request-lifetime", "instant"]) == 0
    text = capsys.readouterr().out
    assert "hit 288 (58.54% of the 492 prompt tokens with content)" in text
    assert "warning: hit figures cover the 12 of 16 requests" in text
    assert main(["curve", str(tmp_path / "wl"), "--block-size", "16"]) == 0
    text = capsys.readouterr().out
    assert "max hit ratio 58.54% from" in text
    assert "warning: hit figures cover the 12 of 16 requests" in text


# --- the check and the figures ---------------------------------------------------------------


def _unknown_outputs() -> tuple[pl.DataFrame, pl.DataFrame]:
    frame = _mixed_frame().with_columns(
        pl.lit(False).alias("hashes_known"),
        pl.lit([], pl.List(pl.UInt64)).alias("prefix_hashes"),
        pl.lit(0).alias("prompt_blocks"),
    )
    inp = sim_input(frame, latency_model=DEFAULTS.shape.latency)
    settings = DEFAULTS.simulation
    summaries = [
        ScenarioSummary.from_json(
            summarise(inp, simulate(inp, Scenario(16, r, 64, "round-robin"), settings))
        )
        for r in (1, 2)
    ]
    curves = [
        capacity_curve(inp, settings, block_size=16, replicas=r, routing="round-robin")
        for r in (1, 2)
    ]
    return curves_frame(curves), scenario_frame(summaries)


def test_the_check_treats_unknown_as_unknown() -> None:
    curves, scenarios = _unknown_outputs()
    # one row per curve, at capacity 0, with null hits and the reason
    assert curves.height == 2
    assert curves["capacity_blocks"].to_list() == [0, 0]
    assert curves["hit_tokens"].null_count() == 2 and curves["hit_ratio"].null_count() == 2
    assert curves["hit_unknown_reason"].to_list() == [NO_CONTENT, NO_CONTENT]
    assert scenarios["hit_ratio"].null_count() == scenarios.height == 2
    assert scenarios["hit_ratio"].dtype == pl.Float64
    # both unknown: they agree
    assert curve_matches_replay(curves, scenarios) == []
    # a known curve against an unknown replay (or the reverse) is a disagreement
    known_curve = curves.with_columns(pl.lit(16, pl.Int64).alias("hit_tokens"))
    problems = curve_matches_replay(known_curve, scenarios)
    assert problems == [
        "b16_r1_c64_round_robin: replay unknown hit tokens, curve 16 at 4 blocks",
        "b16_r2_c64_round_robin: replay unknown hit tokens, curve 16 at 4 blocks",
    ]
    known_replay = scenarios.with_columns(pl.lit(0, pl.Int64).alias("hit_tokens_instant"))
    assert curve_matches_replay(curves, known_replay) == [
        "b16_r1_c64_round_robin: replay 0 hit tokens, curve unknown at 4 blocks",
        "b16_r2_c64_round_robin: replay 0 hit tokens, curve unknown at 4 blocks",
    ]
    # below a known curve's first step the curve has 0 hits (unchanged)
    stepped = pl.DataFrame(
        {
            "block_size": [16],
            "replicas": [1],
            "routing": ["single"],
            "capacity_blocks": [10],
            "hit_tokens": [48],
        }
    )
    assert curve_matches_replay(stepped, known_replay.filter(pl.col("replicas") == 1)) == []


def _svg_text(svg: bytes) -> str:
    """The text of an SVG, its lines joined by single spaces."""
    lines = ("".join(e.itertext()) for e in ElementTree.fromstring(svg).iter(f"{SVG}text"))
    return " ".join(" ".join(line.split()) for line in lines)


def test_the_figures_say_unknown_instead_of_drawing_zero() -> None:
    curves, scenarios = _unknown_outputs()
    for svg in (
        hit_ratio_vs_capacity_svg(curves, scenarios),
        imbalance_vs_hit_ratio_svg(scenarios),
    ):
        assert f"hit ratio unknown: {NO_CONTENT}" in _svg_text(svg)
        # nothing drawn, so no legend (a curve or a scenario marker would bring one)
        assert b'id="legend_1"' not in svg


# --- the configured stage end to end on Azure -----------------------------------------------


def test_configured_stage_on_azure_end_to_end(
    azure: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, [str(azure)])
    with config.open("a") as f:
        f.write(
            "simulation:\n"
            "  replicas: [1, 2]\n"
            "  cache_tokens: [1000, 100000]\n"
            "  routings: [round-robin, cache-aware]\n"
        )
    assert main(["ingest", "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--config", str(config), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / "data" / "t" / "simulation"

    scenarios = pl.read_parquet(out / "scenarios.parquet")
    # R=1: one routing × 2 capacities; R=2: 2 routings × 2 capacities
    assert scenarios.height == 6
    for column in ("hit_tokens", "hit_ratio", "prefill_tokens", "hit_ratio_instant"):
        assert scenarios[column].null_count() == 6, column
    assert set(scenarios["hit_unknown_reason"]) == {NO_CONTENT}
    assert scenarios["requests"].to_list() == [AZURE_ROWS] * 6
    replicas = pl.read_parquet(out / "replicas.parquet")
    assert replicas["hit_ratio"].dtype == pl.Float64 and replicas["hit_ratio"].null_count() == 10
    summary = json.loads((out / "scenarios.json").read_text())
    assert all(s["hit_ratio"] is None and s["hit_unknown_reason"] == NO_CONTENT for s in summary)
    assert sorted(printed["scenarios"], key=lambda s: s["scenario"]) == summary

    curves = pl.read_parquet(out / "curves.parquet")
    # one single-replica curve and one per cache-independent routing at R=2
    assert curves.select("replicas", "routing").rows() == [(1, "single"), (2, "round-robin")]
    assert curves["hit_ratio"].null_count() == 2
    curve_points = json.loads((out / "curves.json").read_text())
    assert [c["max_hit_ratio"] for c in curve_points] == [None, None]
    assert all(c["points"] == [] and c["hit_unknown_reason"] == NO_CONTENT for c in curve_points)
    assert f"hit ratio unknown: {NO_CONTENT}" in _svg_text(
        (out / "hit_ratio_vs_capacity.svg").read_bytes()
    )
    commanded = {p.name: p.read_bytes() for p in out.glob("*.*")}

    # the assets write the same files, and their check passes (unknown agrees with unknown)
    result = dg.materialize(
        [*ASSETS, *CHECKS], resources={"store": EnginefitStore(config_path=str(config))}
    )
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert [c.passed for c in checks] == [True]
    assert {p.name: p.read_bytes() for p in out.glob("*.*")} == commanded
