"""The real-engine validation's own logic (perf/validate.py), on hand-made probes: the rate
bisection, the capacity it reports, the verdict, the mixes and the engine_args record. The
measurement itself is `make validate`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from perf.validate import (
    MIXES,
    Bisection,
    Mix,
    Outcome,
    ProbeResult,
    Timing,
    engine_limits,
    main,
    poisson_arrivals,
    probe_outcome,
    record_engine_args,
    signed_error,
    sweep_order,
    verdict,
)
from tests.llama_cpp_server import LlamaServer, LlamaServerFlags


def _probe(rate: float, passed: bool | None, margin: float = math.nan) -> ProbeResult:
    outcome: Outcome = "inconclusive" if passed is None else "pass" if passed else "fail"
    return ProbeResult(
        rate_rps=rate,
        outcome=outcome,
        margin=margin,
        status="unknown" if passed is None else outcome,
        reason="",
        ttft_p95_ms=None,
        itl_p99_ms=None,
        kept_up="kept_up",
        completed=200,
        folder="",
    )


def test_bisection_expands_then_halves_the_bracket_in_log_space() -> None:
    b = Bisection(ratio=1.1)
    b.add(_probe(4.0, True))
    assert b.next_rate() == pytest.approx(5.4)  # no failure yet: 1.35× the highest pass
    b.add(_probe(5.4, True))
    b.add(_probe(7.29, False))
    assert b.next_rate() == pytest.approx(math.sqrt(5.4 * 7.29))  # 6.27
    b.add(_probe(6.27, True))
    b.add(_probe(7.0, False))
    # 7.0 / 6.27 = 1.116 > 1.1: one more
    assert b.next_rate() == pytest.approx(math.sqrt(6.27 * 7.0))
    b.add(_probe(6.6, True))
    assert b.next_rate() is None  # 7.0 / 6.6 = 1.06 ≤ 1.1


def test_bisection_without_a_pass_steps_down() -> None:
    b = Bisection(ratio=1.1)
    b.add(_probe(8.1, False))
    assert b.next_rate() == pytest.approx(6.0)  # 8.1 / 1.35
    assert b.capacity() == "no probed rate passed the SLO"


def test_capacity_interpolates_the_margin_to_one() -> None:
    b = Bisection(ratio=1.1)
    b.add(_probe(4.0, True, margin=0.5))
    b.add(_probe(8.0, False, margin=2.0))
    # log margin −ln2 at ln4, +ln2 at ln8: it crosses 0 half way, at √32
    capacity = b.capacity()
    assert isinstance(capacity, tuple)
    assert capacity[1:] == (4.0, 8.0)
    assert capacity[0] == pytest.approx(math.sqrt(32.0))


def test_capacity_takes_the_bracket_middle_when_the_failure_is_not_latency() -> None:
    b = Bisection(ratio=1.1)
    b.add(_probe(4.0, True, margin=0.5))
    b.add(_probe(9.0, False, margin=0.8))  # failed for the queue, not the limits
    capacity = b.capacity()
    assert isinstance(capacity, tuple)
    assert capacity[0] == pytest.approx(6.0)  # √(4 × 9)
    assert capacity[1:] == (4.0, 9.0)


def test_a_pass_above_a_failure_is_an_inversion_and_not_the_bracket() -> None:
    b = Bisection(ratio=1.1)
    for rate, passed in ((4.0, True), (6.0, False), (7.0, True), (5.0, True)):
        b.add(_probe(rate, passed))
    low, high = b.highest_pass(), b.lowest_fail()
    assert low is not None and high is not None
    assert (low.rate_rps, high.rate_rps) == (5.0, 6.0)
    assert b.inversions() == 1


def test_an_inconclusive_probe_moves_nothing() -> None:
    b = Bisection(ratio=1.1)
    b.add(_probe(4.0, True))
    b.add(_probe(8.0, False))
    b.add(_probe(math.sqrt(32.0), None))  # too few requests to judge
    low, high = b.highest_pass(), b.lowest_fail()
    assert low is not None and high is not None
    assert (low.rate_rps, high.rate_rps) == (4.0, 8.0)
    assert b.next_rate() == pytest.approx(math.sqrt(32.0))  # tried again


def test_an_unknown_bench_status_fails_only_when_a_limit_or_the_queue_says_so() -> None:
    assert probe_outcome("pass", 0.5, "kept_up") == "pass"
    assert probe_outcome("fail", 0.5, "overloaded") == "fail"
    assert probe_outcome("unknown", 4.0, "unknown") == "fail"  # p95 TTFT 4× the limit
    assert probe_outcome("unknown", 0.5, "overloaded") == "fail"
    assert probe_outcome("unknown", 0.5, "kept_up") == "inconclusive"  # too few requests
    assert probe_outcome("unknown", math.nan, "unknown") == "inconclusive"


def test_signed_error_is_predicted_over_measured() -> None:
    assert signed_error(11.5, 10.0) == pytest.approx(0.15)
    assert signed_error(8.0, 10.0) == pytest.approx(-0.2)


def test_verdict_passes_only_when_every_direction_is_within_the_bound() -> None:
    ok = verdict({"a → b": 0.1, "b → a": -0.22}, 0.35, 0.05, 0.15, aim=0.15)
    assert ok.code == 0
    assert ok.text.startswith("PASS: every signed error within ±35% (worst 22.0%)")
    assert ok.text.endswith("1 of 2 within the ±15% aim")


def test_verdict_fails_an_outlier_on_a_quiet_machine() -> None:
    bad = verdict({"a → b": 0.1, "b → a": -0.3}, 0.15, 0.05, 0.15)
    assert bad.code == 1
    assert bad.text.startswith("FAIL: b → a -30.0%")


def test_verdict_does_not_judge_an_outlier_on_a_noisy_machine() -> None:
    noisy = verdict({"a → b": 0.1, "b → a": -0.3}, 0.15, 0.4, 0.15)
    assert noisy.code == 3
    assert noisy.text.startswith("NOT JUDGED: b → a -30.0%")
    assert "moved 40%" in noisy.text


def test_verdict_never_passes_what_was_not_measured() -> None:
    missing = verdict(
        {"a → b": 0.0, "b → a": "not measured (no probed rate passed)"}, 0.15, 0.5, 0.15
    )
    assert missing.code == 1
    assert "not measured" in missing.text
    assert verdict({}, 0.15, 0.0, 0.15).code == 1


def test_verdict_says_but_does_not_judge_what_enginefit_withholds() -> None:
    """A direction the stage carries nothing to (one mix cannot price its context) is said
    with the model's error, neither judged against the bound nor enough to pass alone."""
    withheld = {"a → c": "model +66.4%"}
    ok = verdict({"a+b → c": 0.21}, 0.4, 0.05, 0.15, withheld=withheld)
    assert ok.code == 0
    assert ok.text.endswith(
        "0 of 1 within the ±15% aim; withheld by enginefit (one mix cannot price their "
        "context): a → c (model +66.4%)"
    )
    assert verdict({"a+b → c": 0.5}, 0.4, 0.05, 0.15, withheld=withheld).code == 1
    assert verdict({}, 0.4, 0.05, 0.15, withheld=withheld).code == 1


def test_mix_trace_has_its_lengths_and_shared_prefixes() -> None:
    mix = Mix("p", prompt=(100, 120), output=(5, 7), prefix_groups=2, prefix_tokens=64)
    trace = mix.trace(1, poisson_arrivals(500, seed=0))
    prompts = trace.get_column("prompt_tokens").to_numpy()
    assert prompts.min() >= 100 and prompts.max() <= 120
    assert set(trace.get_column("output_tokens").to_list()) == {5, 6, 7}
    chains = {tuple(h) for h in trace.get_column("prefix_hashes").to_list()}
    assert chains == {(1, 2, 3, 4), (1001, 1002, 1003, 1004)}  # 64 tokens = 4 blocks per group
    # every prompt's first 64 tokens are cached except the first of each group
    expected = (64 * 500 - 2 * 64) / prompts.sum()
    assert mix.cached_share(trace) == pytest.approx(expected)
    assert Mix("u", prompt=(10, 20), output=(1, 2)).cached_share(trace) == 0.0


def test_mix_without_prefixes_has_no_block_hashes() -> None:
    trace = Mix("u", prompt=(10, 20), output=(1, 2)).trace(0, poisson_arrivals(50, seed=0))
    assert not trace.get_column("hashes_known").any()
    assert trace.get_column("prefix_hashes").list.len().sum() == 0


def test_the_sweeps_take_one_rate_of_each_mix_in_turn() -> None:
    timing = Timing(sweep=(0.5, 1.0), measured_sweep=(1.0,))
    order = sweep_order({"short": 40.0, "long": 20.0, "prefix": 30.0}, timing)
    guess = 0.45  # GUESS_SHARE × the back-to-back rate
    assert [name for name, _ in order] == ["short", "long", "prefix", "short", "long"]
    expected = [
        40.0 * guess * 0.5,
        20.0 * guess * 0.5,
        30.0 * guess,  # only measured: its own, shorter sweep
        40.0 * guess,
        20.0 * guess,
    ]
    assert [rate for _, rate in order] == pytest.approx(expected)


def test_timing_runs_long_enough_for_the_requests() -> None:
    timing = Timing(duration_s=15.0, min_requests=150, max_duration_s=40.0)
    assert timing.seconds(20.0) == 15.0
    assert timing.seconds(5.0) == 30.0
    assert timing.seconds(1.0) == 40.0


def test_engine_args_go_into_the_manifest_and_come_back_as_limits(tmp_path: Path) -> None:
    flags = LlamaServerFlags(slots=3, ctx_size=3000, batch_size=128, ubatch_size=64, threads=1)
    assert flags.argv()[:4] == ["-np", "3", "-c", "3000"]
    server = LlamaServer(
        url="http://127.0.0.1:1/v1",
        model="m",
        pid=1,
        command=("llama-server", *flags.argv()),
        engine_args=flags.engine_args(),
    )
    folders = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "enginefit-bench.yaml").write_text(
            "engine: llama.cpp\ngpu_type: cpu\ngpu_count: 1\n", encoding="utf-8"
        )
        record_engine_args(folder, server)
        folders.append(folder)
    written = yaml.safe_load((tmp_path / "a" / "enginefit-bench.yaml").read_text())
    assert written["engine"] == "llama.cpp"
    assert written["engine_args"] == {
        "max_num_seqs": 3,
        "max_num_batched_tokens": 128,
        "enable_chunked_prefill": True,
        "kv_cache_tokens": 3000,
        "max_model_len": 1000,
    }
    assert engine_limits(folders) == written["engine_args"]
    (tmp_path / "b" / "enginefit-bench.yaml").write_text("engine: x\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="no engine_args"):
        engine_limits(folders)


def test_mix_draws_are_reproducible() -> None:
    mix = Mix("u", prompt=(10, 20), output=(1, 2))
    arrivals = poisson_arrivals(100, seed=0)
    a = mix.trace(3, arrivals).get_column("prompt_tokens").to_numpy()
    b = mix.trace(3, arrivals).get_column("prompt_tokens").to_numpy()
    assert np.array_equal(a, b)


def test_every_mix_replays_one_poisson_arrival_pattern() -> None:
    arrivals = poisson_arrivals(4000, seed=0)
    assert np.array_equal(arrivals, poisson_arrivals(4000, seed=0))
    gaps = np.diff(arrivals)
    assert (gaps > 0).all()
    # unit rate, exponential gaps: mean 1 and coefficient of variation 1, within 3σ of 4,000
    assert abs(gaps.mean() - 1.0) < 3 / math.sqrt(4000)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1
    traces = [m.trace(i, arrivals) for i, m in enumerate(MIXES)]
    first = traces[0].get_column("arrival")
    offsets = (first - first[0]).dt.total_microseconds().to_numpy() / 1e6
    assert offsets == pytest.approx(arrivals - arrivals[0], abs=1e-6)
    assert all(t.get_column("arrival").equals(first) for t in traces[1:])


def test_refit_of_a_folder_without_a_kept_run_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--refit", str(tmp_path)]) == 2
    missing = capsys.readouterr().err
    assert (
        missing
        == f"--refit {tmp_path}: no validate.json there; give the folder a run kept with --out DIR\n"
    )
    (tmp_path / "validate.json").write_text("{not json", encoding="utf-8")
    assert main(["--refit", str(tmp_path)]) == 2
    broken = capsys.readouterr().err
    assert broken.startswith(
        f"--refit {tmp_path}: the kept run cannot be fitted again (JSONDecodeError"
    )
    assert broken.count("\n") == 1
