"""The load test's plan: arrivals, prompts that keep the trace's prefix structure, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError, InputFormatError
from pipeline.loadtest.compute import endpoint_url, public_url
from pipeline.loadtest.plan import (
    WORDS,
    namespace,
    plan_offsets,
    plan_rate,
    prompt_text,
    prompt_words,
    trace_sample,
)
from pipeline.schema import conform
from tests.workloads import growing_conversations


def test_trace_arrivals_keep_the_pattern_at_the_target_rate() -> None:
    # gaps 1, 2, 3 s (0.5 req/s) at 2 req/s: each gap × 0.25, then one mean gap (0.5 s) and
    # the pattern again: 0, .25, .75, 1.5 | 2.0, 2.25, 2.75, 3.5 | 4.0
    arrivals = np.array([0.0, 1.0, 3.0, 6.0])
    offsets = plan_offsets(
        "trace", rate_rps=2.0, horizon_s=4.01, burstiness=1.0, seed=0, arrival_s=arrivals
    )
    np.testing.assert_allclose(offsets, [0, 0.25, 0.75, 1.5, 2.0, 2.25, 2.75, 3.5, 4.0])


def test_trace_arrivals_need_two_distinct_times() -> None:
    with pytest.raises(InputFormatError, match="--arrivals poisson"):
        plan_offsets("trace", rate_rps=1, horizon_s=10, burstiness=1, seed=0, arrival_s=np.zeros(5))


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("gamma", 3.0), ("gamma", 0.5)])
def test_synthetic_arrivals_have_the_rate_and_variability(kind: str, cv: float) -> None:
    offsets = plan_offsets(kind, rate_rps=200.0, horizon_s=200.0, burstiness=cv, seed=7)
    gaps = np.diff(offsets)
    assert offsets.size == pytest.approx(40_000, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    again = plan_offsets(kind, rate_rps=200.0, horizon_s=200.0, burstiness=cv, seed=7)
    np.testing.assert_array_equal(offsets, again)  # the seed fixes the schedule
    assert offsets.max() < 200.0


def test_shared_blocks_share_text_and_nothing_else_does() -> None:
    ns = namespace(0, 4.0)
    a = prompt_words(np.array([11, 12, 13], np.uint64), 56, 16, ns, send_key=0)
    b = prompt_words(np.array([11, 12, 99], np.uint64), 56, 16, ns, send_key=1)
    assert a.size == b.size == 56
    assert (a[:32] == b[:32]).all()  # two shared blocks: the same 32 words
    assert (a[32:48] != b[32:48]).any()  # the third block differs
    assert (a[48:] != b[48:]).any()  # the 8-word tails belong to each send alone
    other_rate = prompt_words(np.array([11, 12, 13], np.uint64), 56, 16, namespace(0, 8.0), 0)
    assert (other_rate[:16] != a[:16]).any()  # another rate meets a cold cache
    text = prompt_text(a)
    assert len(text.split(" ")) == 56 and set(text.split()) <= set(WORDS)


def test_a_count_only_trace_shares_nothing() -> None:
    ns = namespace(0, 1.0)
    a = prompt_words(np.zeros(0, np.uint64), 40, 16, ns, send_key=0)
    b = prompt_words(np.zeros(0, np.uint64), 40, 16, ns, send_key=1)
    assert a.size == 40 and (a != b).any()


def test_trace_sample_reads_the_replayed_columns() -> None:
    frame = growing_conversations(6, 2, extra_tokens=3, output_tokens=5)
    trace = trace_sample(frame.lazy())
    assert trace.requests == 6 and trace.block_size == 16 and trace.hashes_known
    assert trace.prompt_tokens.tolist() == [19, 19, 35, 35, 51, 51]
    assert trace.block_hashes(4).tolist() == [1, 2, 3]  # conversation 0, turn 2
    assert trace.mean_rate_rps == pytest.approx(1.0)
    plan = plan_rate(
        trace, kind="trace", rate_rps=4.0, duration_s=2.0, warmup_s=0.5, burstiness=1, seed=0
    )
    np.testing.assert_allclose(plan.offsets_s, np.arange(10) * 0.25)
    assert plan.warmup_count == 2 and plan.trace_rows.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]


def test_trace_without_output_lengths_is_refused() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    frame = conform(
        pl.DataFrame(
            {
                "request_id": ["a", "b"],
                "arrival": [t0, t0 + timedelta(seconds=1)],
                "prompt_tokens": [10, 20],
                "block_size": [16, 16],
            }
        )
    )
    with pytest.raises(InputFormatError, match="no output lengths"):
        trace_sample(frame.lazy())


@pytest.mark.parametrize(
    ("endpoint", "api", "url"),
    [
        ("http://h:8000", "completions", "http://h:8000/v1/completions"),
        ("http://h:8000/v1/", "chat", "http://h:8000/v1/chat/completions"),
        ("https://h/v1/chat/completions", "chat", "https://h/v1/chat/completions"),
    ],
)
def test_endpoint_forms(endpoint: str, api: str, url: str) -> None:
    assert endpoint_url(endpoint, api) == url


@pytest.mark.parametrize(
    ("endpoint", "api"),
    [("localhost:8000", "completions"), ("http://h/v1/chat/completions", "completions")],
)
def test_bad_endpoints_name_the_flag(endpoint: str, api: str) -> None:
    with pytest.raises(ConfigError, match="--endpoint"):
        endpoint_url(endpoint, api)


def test_public_url_drops_credentials() -> None:
    assert public_url("http://user:secret@h:8000/v1?key=x") == "http://h:8000/v1"


def test_loadtest_section_is_strict() -> None:
    config = config_from_mapping({"loadtest": {"rates": "1,2.5", "duration": "2m"}})
    assert config.loadtest.rates == (1.0, 2.5) and config.loadtest.duration == 120.0
    with pytest.raises(ConfigError, match=r"unknown key loadtest\.rate"):
        config_from_mapping({"loadtest": {"rate": [1]}})
    with pytest.raises(ConfigError, match=r"loadtest\.rates: .*> 0"):
        config_from_mapping({"loadtest": {"rates": [0, 1]}})
    with pytest.raises(ConfigError, match=r"loadtest\.duration: .*120s"):
        config_from_mapping({"loadtest": {"duration": "two minutes"}})
    with pytest.raises(ConfigError, match=r"loadtest\.length_control"):
        config_from_mapping({"loadtest": {"length_control": ["ignore_eos", "stop"]}})


def test_the_plan_says_when_several_models_become_one(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.config import default_config
    from pipeline.loadtest.compute import plan_rates
    from pipeline.loadtest.present import plan_lines

    frame = growing_conversations(6, 2, extra_tokens=1, output_tokens=3).with_columns(
        model=pl.Series(["m1", "m2"] * 3), lora_adapter=pl.Series([None, None, "sql"] * 2)
    )
    trace = trace_sample(frame.lazy())
    assert trace.served_as == ("m1", "m1+sql", "m2", "m2+sql")
    settings = default_config().loadtest.replace(rates=[1.0], duration=5.0)
    text = "\n".join(plan_lines(trace, plan_rates(trace, settings), settings))
    assert "served as 4 models/adapters (m1, m1+sql, m2, m2+sql)" in text


def test_a_rates_schedule_does_not_depend_on_the_other_rates() -> None:
    from pipeline.config import default_config
    from pipeline.loadtest.compute import plan_rates
    from pipeline.loadtest.stage import read_inputs

    frame = growing_conversations(400, 7, extra_tokens=1, output_tokens=3)
    # irregular gaps, so a different window would scale differently
    frame = frame.with_columns(
        arrival=pl.col("arrival") + pl.duration(milliseconds=(pl.int_range(400) ** 2) % 977)
    )
    alone = default_config().loadtest.replace(rates=[2.0], duration=10.0, warmup=2.0)
    with_fast = alone.replace(rates=[2.0, 50.0])
    a = plan_rates(read_inputs(frame.lazy(), alone, label="t", name=None).trace, alone)[0]
    b = plan_rates(read_inputs(frame.lazy(), with_fast, label="t", name=None).trace, with_fast)[0]
    np.testing.assert_array_equal(a.offsets_s, b.offsets_s)
    assert a.offsets_s.size == pytest.approx(24, abs=2)  # 2 req/s over 12 s


def test_bucketed_timestamps_are_warned_about() -> None:
    from pipeline.config import default_config
    from pipeline.loadtest.compute import plan_rates
    from pipeline.loadtest.present import plan_lines, plan_problems

    frame = growing_conversations(60, 3, extra_tokens=1, output_tokens=3).with_columns(
        arrival=pl.col("arrival").dt.truncate("10s")  # 6 buckets of 10 requests
    )
    trace = trace_sample(frame.lazy())
    settings = default_config().loadtest.replace(rates=[1.0], duration=50.0, warmup=0.0)
    plans = plan_rates(trace, settings)
    assert plans[0].trace_instants == 5  # 50 sends replay rows 0-49: five buckets
    text = "\n".join(plan_lines(trace, plans, settings))
    assert "only 5 distinct instant(s)" in text and "--arrivals poisson" in text
    short = settings.replace(duration=1.0, warmup=60.0)
    assert "nothing would be measured" in plan_problems(plan_rates(trace, short))[0]
