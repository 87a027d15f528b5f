"""SLO parsing, per-point status and the capacity search (hand-built frames + the H100 sweep)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bench.checks import no_silent_pass
from pipeline.bench.compute import analyse_bench
from pipeline.bench.config import LatencyLimit, SloSpec, SloSpecError, parse_slo_spec
from pipeline.bench.schema import conform_load_points
from pipeline.bench.slo import evaluate_slo, required_requests, slo_capacity
from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from tests.bench_points import kept_up_run
from tests.conftest import DEFAULTS, REPO, bench_settings

# The Apache-2.0 sweep is committed (tests/data/bench/NOTICE), so these tests always run.
H100 = (
    Path(__file__).resolve().parent
    / "data"
    / "bench"
    / "inference-perf"
    / "kubecon-na-2025-vllm-h100"
)


def point(load: float, ttft: float | None, itl: float | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "point_id": f"p{load:g}",
        "engine": "vllm",
        "gpu_type": "H100",
        "gpu_count": 1,
        "load_mode": "open",
        "offered_rate_rps": float(load),
        "ttft_p95_ms": ttft,
        "itl_p99_ms": itl,
        "completed": 100,
        "failed": 0,
        "output_tokens_per_s": 100.0 * load,
        "total_tokens_per_s": 300.0 * load,
        "output_tokens_mean": 100.0,
        "input_tokens_mean": 200.0,
    }
    if load > 0:
        row.update(kept_up_run(load))
    row.update(extra)
    return row


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return conform_load_points(pl.DataFrame(rows, infer_schema_length=None))


def statuses(rows: list[dict[str, Any]], slo: SloSpec | None = None) -> list[str]:
    evaluated = evaluate_slo(frame(rows), bench_settings(slo=slo or DEFAULTS.bench.slo))
    return evaluated.get_column("slo_status").to_list()


# ------------------------------------------------------------------ parsing


def test_parse_default_spec() -> None:
    slo = parse_slo_spec("ttft_p95_ms=1000,itl_p99_ms=60", DEFAULTS.bench.slo)
    assert slo.limits == (LatencyLimit("ttft", "p95", 1000.0), LatencyLimit("itl", "p99", 60.0))
    assert slo.itl_definition == "per-gap"
    assert slo.columns() == ["ttft_p95_ms", "itl_p99_ms"]
    assert slo.max_error_rate == 0.01


def test_parse_per_request_itl_reads_tpot_and_options() -> None:
    slo = parse_slo_spec(
        " itl_p99_ms = 60 , e2e_p99_ms=5000, itl_definition=per-request, max_error_rate=none ",
        DEFAULTS.bench.slo,
    )
    assert slo.columns() == ["tpot_p99_ms", "e2e_p99_ms"]
    assert slo.max_error_rate is None
    assert "ITL (per-request)" in slo.describe()


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "empty SLO"),
        ("ttft_p95_ms", "not KEY=VALUE"),
        ("ttft_p95_ms=", "not KEY=VALUE"),
        ("ttft_p95_ms=fast", "must be a number"),
        ("ttft_p95_ms=-5", "≥ 0"),
        ("ttft_p95_ms=inf", "finite"),
        ("ttft_p97_ms=1000", "unknown key 'ttft_p97_ms'"),
        ("latency=3", "unknown key 'latency'"),
        ("ttft_p95_ms=1,ttft_p95_ms=2", "given twice"),
        ("ttft_p95_ms=1,,itl_p99_ms=2", "item 2 is empty"),
        ("itl_definition=per-gap", "no latency limit"),
        ("ttft_p95_ms=1000,itl_definition=mean", "itl_definition"),
        ("ttft_p95_ms=1000,max_error_rate=5", "fraction in [0, 1]"),
    ],
)
def test_malformed_specs_give_clear_errors(spec: str, needle: str) -> None:
    with pytest.raises(SloSpecError) as info:
        parse_slo_spec(spec, DEFAULTS.bench.slo)
    assert needle in str(info.value)
    assert str(info.value).startswith("--slo")


def test_slo_error_is_a_config_error() -> None:
    assert issubclass(SloSpecError, ConfigError)


def bench_section(raw: dict[str, Any], tmp_path: Path | None = None) -> Any:
    """The ``bench`` section of a configuration file holding ``raw``."""
    if tmp_path is None:
        return config_from_mapping({"bench": raw}).bench
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"workload": {"name": "w", "traces": ["t"], "hash_salt": "s"}}))
    return config_from_mapping(
        {"workload": {"name": "w", "traces": ["t"], "hash_salt": "s"}, "bench": raw}, source=path
    ).bench


def test_bench_settings_validates_keys(tmp_path: Path) -> None:
    settings_ = bench_section(
        {
            "results": ["bench/"],
            "slo": {"ttft_p95_ms": 800, "itl_p99_ms": None, "e2e_p99_ms": 9000},
            "interpolate": True,
            "prices": {"gpu_hour_usd": {"H100": 3.0, "default": 2.0}},
            "as_of": "2026-11-29",
            "max_age_days": 90,
        },
        tmp_path,
    )
    assert settings_.results == (tmp_path / "bench",)
    assert [lim.key for lim in settings_.slo.limits] == ["ttft_p95_ms", "e2e_p99_ms"]
    assert settings_.prices.gpu_hour_usd == {"H100": 3.0}
    assert settings_.prices.default == 2.0
    assert settings_.as_of is not None and settings_.as_of.isoformat() == "2026-11-29"
    assert settings_.max_age_days == 90
    # An SLO naming a limit replaces the default limits but keeps the default options.
    assert settings_.slo.itl_definition == DEFAULTS.bench.slo.itl_definition


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"slos": {}}, "unknown key bench.slos (did you mean slo?)"),
        ({"slo": {"ttft_p95": 1}}, "bench.slo: unknown key 'ttft_p95'"),
        ({"interpolate": "yes"}, "bench.interpolate: Input should be a valid boolean"),
        (
            {"max_age_days": 0},
            "bench.max_age_days: Input should be greater than or equal to 1 (got 0)",
        ),
        ({"as_of": "29/11/2026"}, "bench.as_of: '29/11/2026' is not an ISO date"),
        ({"prices": {"gpu_hour_usd": {"H100": -1}}}, "bench.prices.gpu_hour_usd.H100"),
        ({"prices": {"usd": 1}}, "bench.prices"),
        ({"results": "x"}, "bench.results: Input should be a valid tuple"),
        ({"manifest": 3}, "bench.manifest: expected a path string"),
        ({"overload": {"tolerance": 1.5}}, "bench.overload.tolerance: Input should be less than 1"),
        ({"overload": {"tolerance": "low"}}, "bench.overload.tolerance: Input should be a valid"),
        ({"overload": {"min_window_latencies": 0}}, "bench.overload.min_window_latencies"),
        ({"overload": {"window": 3}}, "unknown key bench.overload.window"),
        ({"overload": 0.15}, "bench.overload: Input should be a valid dictionary"),
        ({"min_tail_requests": -1}, "bench.min_tail_requests: Input should be greater than"),
        ({"min_tail_requests": 1.5}, "bench.min_tail_requests: Input should be a valid integer"),
    ],
)
def test_bench_settings_errors_name_the_key(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        bench_section(raw)
    assert needle in str(info.value)


# ------------------------------------------------------------------ per-point status


def test_pass_fail_unknown_and_never_silent_pass() -> None:
    rows = [
        point(1, 100.0, 20.0),  # pass
        point(2, 1000.0, 60.0),  # exactly at the limits: pass (<=)
        point(3, 1000.1, 20.0),  # ttft breaks
        point(4, None, 20.0),  # p95 TTFT missing -> unknown, not pass
        point(5, None, 80.0),  # missing TTFT but ITL breaks -> fail
        point(6, 100.0, 20.0, failed=None),  # failure count unknown -> unknown
        point(7, 100.0, 20.0, **{**kept_up_run(7, 200), "completed": 196, "failed": 4}),  # 2%
        point(8, 100.0, 20.0, achieved_rate_rps=6.0),  # 75% of offered -> unknown
        point(9, 100.0, 20.0, achieved_rate_rps=8.5),  # 94% of offered -> pass
    ]
    assert statuses(rows) == [
        "pass",
        "pass",
        "fail",
        "unknown",
        "fail",
        "unknown",
        "fail",
        "unknown",
        "pass",
    ]
    evaluated = evaluate_slo(frame(rows), DEFAULTS.bench)
    reasons = evaluated.get_column("slo_reason").to_list()
    assert reasons[2] == "p95 TTFT 1000.1 ms > 1000 ms"
    assert reasons[3] == "p95 TTFT missing (limit ≤ 1000 ms)"
    assert "p99 ITL (per-gap) 80.0 ms > 60 ms" in reasons[4]
    assert reasons[5] == "failure count not recorded"
    assert reasons[6] == "error rate 2.0% > 1%"
    assert "achieved send rate 6.0 req/s < 90% of offered 8.0 req/s" in reasons[7]
    assert no_silent_pass(evaluated, DEFAULTS.bench) == []


def test_per_request_itl_uses_tpot_not_gap_itl() -> None:
    slo = parse_slo_spec("itl_p99_ms=60,itl_definition=per-request", DEFAULTS.bench.slo)
    rows = [point(1, 10.0, 10.0, tpot_p99_ms=None), point(2, 10.0, 500.0, tpot_p99_ms=30.0)]
    assert statuses(rows, slo) == ["unknown", "pass"]


def test_nan_percentile_counts_as_missing() -> None:
    assert statuses([point(1, math.nan, 10.0)]) == ["unknown"]


def test_silent_pass_check_catches_a_forged_pass() -> None:
    evaluated = evaluate_slo(frame([point(1, None, 10.0)]), DEFAULTS.bench)
    forged = evaluated.with_columns(slo_status=pl.lit("pass"))
    assert no_silent_pass(forged, DEFAULTS.bench) == [
        "1 of 1 passing points have a missing or broken limit, too few requests for a "
        "percentile, an open-loop server not shown to keep up, or an impossible value"
    ]


# ------------------------------------------------------------------ capacity search


def capacity(rows: list[dict[str, Any]], **kw: Any) -> pl.DataFrame:
    slo = DEFAULTS.bench.slo
    return slo_capacity(evaluate_slo(frame(rows), bench_settings(slo=slo)), slo, **kw)


def only(cap: pl.DataFrame, sweep: str = "open") -> dict[str, Any]:
    rows = cap.filter(pl.col("sweep") == sweep).to_dicts()
    assert len(rows) == 1
    return rows[0]


def test_monotone_sweep_bracketed() -> None:
    rows = [point(1, 100, 20), point(2, 200, 30), point(4, 900, 50), point(8, 1500, 70)]
    row = only(capacity(rows))
    assert row["capacity_status"] == "bracketed"
    assert row["capacity_load"] == 4.0
    assert row["first_fail_load"] == 8.0
    assert row["capacity_rps"] == 4.0
    assert row["output_throughput_tps"] == 400.0
    assert row["total_throughput_tps"] == 1200.0
    assert row["capacity_point_id"] == "p4"
    assert row["pattern"] == "1:P 2:P 4:P 8:F"
    assert row["non_monotone"] is False
    assert row["interpolated"] is False


def test_non_monotone_reported_and_not_used() -> None:
    rows = [point(1, 100, 20), point(2, 200, 30), point(3, 1200, 30), point(4, 300, 30)]
    rows.append(point(5, 2000, 90))
    row = only(capacity(rows))
    assert row["capacity_load"] == 2.0  # not 4, which passes above the failure at 3
    assert row["non_monotone"] is True
    assert row["passes_above_fail"] == "4"
    assert "non-monotone: passes at 4 above the first failure at 3" in row["note"]


def test_all_pass_is_a_lower_bound() -> None:
    row = only(capacity([point(1, 100, 20), point(2, 200, 30)]))
    assert row["capacity_status"] == "not_bracketed"
    assert row["capacity_load"] == 2.0
    assert "at least 2" in row["note"]


def test_first_point_fails() -> None:
    row = only(capacity([point(1, 2000, 20), point(2, 3000, 30)]))
    assert row["capacity_status"] == "below_range"
    assert row["capacity_load"] is None
    assert row["capacity_rps"] is None


def test_all_unknown() -> None:
    row = only(capacity([point(1, None, 20), point(2, None, 30)]))
    assert row["capacity_status"] == "unknown"
    assert row["capacity_load"] is None


def test_unknown_between_pass_and_fail_is_reported() -> None:
    rows = [point(1, 100, 20), point(2, None, 20), point(3, 100, 20, failed=None)]
    rows.append(point(4, 2000, 20))
    row = only(capacity(rows))
    assert row["capacity_load"] == 1.0
    assert row["unknown_above_capacity"] == "2, 3"
    assert "may be higher" in row["note"]


def test_closed_loop_reported_apart() -> None:
    rows = [point(1, 100, 20), point(2, 2000, 20)]
    for users, ttft, rps in [(1, 50.0, 0.9), (8, 400.0, 6.5), (32, 1800.0, 9.0)]:
        rows.append(
            point(
                0,
                ttft,
                20.0,
                point_id=f"c{users}",
                load_mode="closed",
                offered_rate_rps=None,
                concurrency=users,
                request_throughput_rps=rps,
            )
        )
    rows.append(
        point(0, 10.0, 10.0, point_id="burst", load_mode="offline", offered_rate_rps=math.inf)
    )
    cap = capacity(rows)
    assert cap.get_column("sweep").to_list() == ["closed", "open", "other"]
    closed = only(cap, "closed")
    assert closed["capacity_load"] == 8.0  # concurrency
    assert closed["capacity_rps"] == 6.5  # achieved completions at that concurrency
    assert "closed loop" in closed["note"]
    assert only(cap, "open")["capacity_rps"] == 1.0
    assert only(cap, "other")["capacity_status"] == "not_searched"


def test_candidates_are_searched_separately() -> None:
    rows = [point(1, 100, 20), point(2, 2000, 20)]
    rows += [
        point(1, 100, 20, engine="sglang", point_id="s1"),
        point(2, 100, 20, engine="sglang", point_id="s2"),
    ]
    cap = capacity(rows)
    assert cap.select("engine", "capacity_load").rows() == [("sglang", 2.0), ("vllm", 1.0)]


def test_interpolation_only_when_asked_and_marked() -> None:
    rows = [point(2, 200, 30), point(4, 900, 50), point(8, 1500, 70)]
    plain = only(capacity(rows))
    assert plain["capacity_rps"] == 4.0
    assert plain["interpolated"] is False
    row = only(capacity(rows, interpolate=True))
    # TTFT crosses 1000 at 4 + (1000-900)/(1500-900) * 4 = 4.667; ITL would cross at 6.
    assert row["interpolated"] is True
    assert row["capacity_load"] == 4.0  # the measured figure is kept
    assert row["capacity_rps"] == pytest.approx(4 + 4 / 6)
    assert row["output_throughput_tps"] == pytest.approx(400 + 400 / 6)
    assert "INTERPOLATED" in row["note"]


def test_interpolation_not_applied_without_bracket() -> None:
    row = only(capacity([point(1, 100, 20), point(2, 200, 20)], interpolate=True))
    assert row["interpolated"] is False
    assert row["capacity_rps"] == 2.0


def reference_capacity(seq: list[tuple[float, str]]) -> tuple[float | None, bool]:
    """Straightforward loop: walk up the loads; stop at the first failure."""
    best: float | None = None
    failed_at: float | None = None
    for load, status in sorted(seq):
        if status == "fail" and failed_at is None:
            failed_at = load
        elif status == "pass" and failed_at is None:
            best = load
    non_monotone = failed_at is not None and any(
        s == "pass" and load > failed_at for load, s in seq
    )
    return best, non_monotone


# Each example is a batch of sweeps, one deployment (GPU type) each, analysed in one call:
# 15 examples check 60-180 sweeps, each on its own, at a tenth of one call per sweep.
@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["pass", "fail", "unknown"]), min_size=1, max_size=9),
        min_size=4,
        max_size=12,
    )
)
def test_capacity_matches_reference(patterns: list[list[str]]) -> None:
    values = {"pass": (100.0, 20.0), "fail": (5000.0, 20.0), "unknown": (None, 20.0)}
    rows = [
        point(i + 1, *values[s], gpu_type=f"H100-{k}")
        for k, pattern in enumerate(patterns)
        for i, s in enumerate(pattern)
    ]
    found = capacity(rows).filter(pl.col("sweep") == "open")
    for k, pattern in enumerate(patterns):
        (row,) = found.filter(pl.col("gpu_type") == f"H100-{k}").to_dicts()
        expected, non_monotone = reference_capacity([(i + 1.0, s) for i, s in enumerate(pattern)])
        assert row["capacity_load"] == expected, pattern
        assert row["non_monotone"] is non_monotone, pattern


# ------------------------------------------------------------------ the real H100 sweep


def h100_points() -> pl.DataFrame:
    if not H100.is_dir():
        pytest.skip("shared bench samples not available")
    from pipeline.bench.readers import read_bench_files

    manifest = {"engine": "vllm", "engine_version": "0.11.0", "gpu_type": "H100", "gpu_count": 1}
    files = sorted(H100.glob("stage_*_lifecycle_metrics.json"))
    return read_bench_files(files, manifest=manifest).load_points


def stage(n: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((H100 / f"stage_{n}_lifecycle_metrics.json").read_text())
    return data


@pytest.mark.shared
def test_h100_sweep_capacity() -> None:
    points = h100_points()
    slo = DEFAULTS.bench.slo
    evaluated = evaluate_slo(points, bench_settings(slo=slo)).sort("load")
    # Stage 0 has 60 requests: too few for a p99 (needs ⌈1 ÷ 0.01⌉ = 100); stages 1-3 pass.
    assert evaluated.get_column("slo_status").to_list() == ["unknown"] + ["pass"] * 3 + ["fail"] * 3
    assert evaluated.item(0, "slo_reason") == (
        "only 60 completed requests; p99 ITL (per-gap) needs ≥ 100 (measured 7.4 ms, limit ≤ 60 ms)"
    )
    assert evaluated.get_column("keep_up_status").to_list() == ["kept_up"] * 7
    assert set(evaluated.get_column("keep_up_method").to_list()) == {"drain_corrected"}
    row = only(slo_capacity(evaluated, slo))
    s3 = stage(3)
    assert row["capacity_status"] == "bracketed"
    assert row["capacity_load"] == pytest.approx(s3["load_summary"]["requested_rate"])  # 92.19
    # min(offered 92.19, achieved send rate 92.224): capacity is never above what was sent
    assert row["capacity_rps"] == 92.19
    assert row["first_fail_load"] == pytest.approx(stage(4)["load_summary"]["requested_rate"])
    # Sustained output rate: achieved send rate × mean output tokens per completed request
    # = 92.22409851829183 × 62.3254384378955 = 5747.907 tok/s; the whole-run figure 5693.884
    # (5531 requests ÷ 60.54 s including the drain) is 0.94 % lower.
    assert s3["load_summary"]["achieved_rate"] == 92.22409851829183
    assert s3["successes"]["output_len"]["mean"] == 62.3254384378955
    assert row["sustained_rate_rps"] == 92.22409851829183
    assert row["output_throughput_tps"] == pytest.approx(5747.907374692207)
    assert row["whole_run_output_tps"] == pytest.approx(5693.884076290361)
    assert row["output_rate_basis"] == "sustained: send rate × mean output tokens"
    assert row["n_loads"] == 7
    assert row["repeats"] == 1 and row["output_rate_spread"] is None
    assert row["non_monotone"] is False


@pytest.mark.shared
def test_h100_keep_up_shares_by_hand() -> None:
    """Completion rate with the drain left in ÷ send rate, from each stage file's own numbers:
    at least 95 % of what was sent on every stage, so the aggregates alone say kept up."""
    evaluated = evaluate_slo(h100_points(), DEFAULTS.bench).sort("record_index")
    for n, share in enumerate(evaluated.get_column("keep_up_share").to_list()):
        s = stage(n)
        # inference-perf's throughput divides by the stage's first send to last completion
        expected = (
            s["successes"]["throughput"]["requests_per_sec"] / s["load_summary"]["achieved_rate"]
        )
        assert share == pytest.approx(expected), n
        assert 0.95 <= share < 1.0  # e.g. stage 3: 91.36 ÷ 92.22 req/s


@pytest.mark.shared
def test_h100_sweep_interpolated_near_saturation() -> None:
    slo = DEFAULTS.bench.slo
    row = only(
        slo_capacity(evaluate_slo(h100_points(), bench_settings(slo=slo)), slo, interpolate=True)
    )
    s3, s4 = stage(3), stage(4)
    t3 = s3["successes"]["latency"]["time_to_first_token"]["p95"] * 1000
    t4 = s4["successes"]["latency"]["time_to_first_token"]["p95"] * 1000
    r3, r4 = s3["load_summary"]["requested_rate"], s4["load_summary"]["requested_rate"]
    expected = r3 + (1000 - t3) / (t4 - t3) * (r4 - r3)
    assert row["interpolated"] is True
    assert row["capacity_rps"] == pytest.approx(expected)
    assert 100 < row["capacity_rps"] < 102  # SOURCE.md: saturates at ~101 req/s


@pytest.mark.shared
def test_h100_tighter_slo_moves_capacity_down() -> None:
    slo = parse_slo_spec("ttft_p95_ms=50,itl_p99_ms=60", DEFAULTS.bench.slo)
    row = only(slo_capacity(evaluate_slo(h100_points(), bench_settings(slo=slo)), slo))
    assert row["capacity_load"] == pytest.approx(61.79)  # p95 TTFT 48.7 ms; 80.2 ms at 92.19


# ------------------------------------------------------------------ enough requests per percentile


def test_required_requests_table() -> None:
    # ⌈k ÷ (1 − q)⌉: k = 1 -> p50 2, p90 10, p95 20, p99 100; a mean needs one request.
    assert [required_requests(s, 1) for s in ("p50", "p90", "p95", "p99", "mean")] == [
        2,
        10,
        20,
        100,
        1,
    ]
    assert [required_requests(s, 3) for s in ("p50", "p95", "p99")] == [6, 60, 300]
    assert [required_requests(s, 0) for s in ("p99", "mean")] == [0, 0]  # 0 disables


def test_too_few_requests_make_a_percentile_unknown() -> None:
    rows = [
        point(1, 100.0, 20.0, **kept_up_run(1, 20)),  # p99 ITL from 20 requests is their max
        point(2, 100.0, 90.0, **kept_up_run(2, 20)),  # a broken p99 from 20 cannot fail either
        point(
            3, 100.0, 20.0, **kept_up_run(3, 2, latency_s=0.1)
        ),  # 2 requests: neither p95 nor p99
        point(4, 100.0, 20.0, **kept_up_run(4, 100)),  # exactly enough
        point(5, 5000.0, 20.0, **kept_up_run(5, 20)),  # p95 TTFT from 20 is judged: fails
    ]
    evaluated = evaluate_slo(frame(rows), DEFAULTS.bench)
    assert evaluated.get_column("slo_status").to_list() == [
        "unknown",
        "unknown",
        "unknown",
        "pass",
        "fail",
    ]
    reasons = evaluated.get_column("slo_reason").to_list()
    too_few = "only 20 completed requests; p99 ITL (per-gap) needs ≥ 100"
    assert reasons[0] == f"{too_few} (measured 20.0 ms, limit ≤ 60 ms)"
    assert reasons[1] == f"{too_few} (measured 90.0 ms, limit ≤ 60 ms)"  # shown, not judged
    assert reasons[2] == (
        "only 2 completed requests; p95 TTFT needs ≥ 20 (measured 100.0 ms, limit ≤ 1000 ms); "
        "only 2 completed requests; p99 ITL (per-gap) needs ≥ 100 (measured 20.0 ms, limit ≤ 60 ms)"
    )
    assert reasons[4].startswith("p95 TTFT 5000.0 ms > 1000 ms")
    assert no_silent_pass(evaluated, DEFAULTS.bench) == []
    # k = 0 switches the rule off: the 20-request points are judged on their values.
    relaxed = evaluate_slo(frame(rows), bench_settings(slo=DEFAULTS.bench.slo, min_tail_requests=0))
    assert relaxed.get_column("slo_status").to_list()[:3] == ["pass", "fail", "pass"]
    # A silent pass with too few requests is caught by the asset check.
    forged = evaluated.with_columns(slo_status=pl.lit("pass"))
    assert no_silent_pass(forged.slice(0, 1), DEFAULTS.bench) != []


def test_two_request_guidellm_points_cannot_support_a_p95() -> None:
    """The guidellm v0.8 fixture (mock server, two requests at each of 2 and 4 req/s)."""
    from pipeline.bench.readers import read_bench_files

    path = REPO / "tests" / "data" / "bench" / "guidellm"
    result = read_bench_files(
        [path / "llmd-fixture_mockserver_guidellm0.8dev_schema2.json"],
        manifest={"engine": "mock", "gpu_type": "none", "gpu_count": 1},
    )
    evaluated = evaluate_slo(result.load_points, DEFAULTS.bench)
    assert evaluated.get_column("completed").to_list() == [2, 2]
    assert evaluated.get_column("slo_status").to_list() == ["unknown", "unknown"]
    reason = evaluated.item(0, "slo_reason")
    assert "only 2 completed requests; p95 TTFT needs ≥ 20" in reason
    # its duration is guidellm's measurement window, which leaves out the drain: not judged
    assert evaluated.item(0, "keep_up_status") == "unknown"
    assert "measure_window span" in evaluated.item(0, "keep_up_reason")


def test_min_tail_requests_reaches_the_analysis() -> None:
    rows = [point(1, 100.0, 20.0), point(2, 100.0, 20.0)]  # 100 requests each
    strict = analyse_bench(frame(rows), bench_settings(min_tail_requests=2))
    reasons = strict.evaluated.get_column("slo_reason").to_list()
    assert (
        reasons
        == [
            "only 100 completed requests; p99 ITL (per-gap) needs ≥ 200 "
            "(measured 20.0 ms, limit ≤ 60 ms)"
        ]
        * 2
    )
    assert analyse_bench(frame(rows), DEFAULTS.bench).capacity.item(0, "capacity_rps") == 2.0


# ------------------------------------------------------------------ sustained rates at capacity


def test_capacity_and_token_rate_come_from_what_was_sent() -> None:
    rows = [
        # offered 4, sent 3.8 (within the 90 % send-rate check): capacity 3.8, not 4
        point(4, 100.0, 20.0, achieved_rate_rps=3.8, output_tokens_per_s=300.0),
        point(8, 2000.0, 20.0),
    ]
    row = only(capacity(rows))
    assert row["capacity_load"] == 4.0
    assert row["capacity_rps"] == 3.8  # min(offered 4, sent 3.8)
    assert row["sustained_rate_rps"] == 3.8
    assert row["output_throughput_tps"] == pytest.approx(3.8 * 100.0)  # × mean output tokens
    assert row["total_throughput_tps"] == pytest.approx(3.8 * (200.0 + 100.0))
    assert row["whole_run_output_tps"] == 300.0  # the tool's figure, kept beside
    # a client that sent faster than offered does not raise the capacity above the offered load
    fast = only(capacity([point(4, 100.0, 20.0, achieved_rate_rps=4.2), point(8, 2000.0, 20.0)]))
    assert (fast["capacity_rps"], fast["output_throughput_tps"]) == (4.0, pytest.approx(420.0))


def test_whole_run_rate_only_without_a_mean_output_length() -> None:
    rows = [point(2, 100.0, 20.0, output_tokens_mean=None), point(4, 2000.0, 20.0)]
    row = only(capacity(rows))
    assert row["output_throughput_tps"] == 200.0  # the tool's whole-run output_tokens_per_s
    assert row["output_rate_basis"] == "whole-run: mean output tokens unknown"
    # the mean is derived from the totals when the reader left it empty: 1000 / 100 = 10
    derived = [point(2, 100.0, 20.0, output_tokens_mean=None, total_output_tokens=1000)]
    derived.append(point(4, 2000.0, 20.0))
    assert only(capacity(derived))["output_throughput_tps"] == pytest.approx(2 * 10.0)


def test_no_interpolation_toward_an_overloaded_failure() -> None:
    # The failure at 8 req/s is overloaded: even with its longest latency (1 s) taken off as
    # drain, 100 ÷ (40 − 1) ÷ 8 = 32 % of sends.
    rows = [point(4, 900.0, 20.0), point(8, 1500.0, 20.0, duration_s=40.0, e2e_max_ms=1000.0)]
    row = only(capacity(rows, interpolate=True))
    assert row["interpolated"] is False
    assert row["capacity_rps"] == 4.0
    assert (
        "not interpolated: the first failure at 8 did not keep up (keep-up overloaded)"
        in (row["note"])
    )
