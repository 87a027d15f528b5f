"""The open-loop client against the local stub server: timing, the open-loop property,
failures counted, caps counted, the prefix structure the server's cache meets."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pytest

from perf.stub_openai_server import StubServer, run_stub_server
from pipeline.loadtest.client import ClientOptions, Outcome, run_schedule
from pipeline.loadtest.compute import LoadtestInputs, bodies_for, rate_summary, request_frame
from pipeline.loadtest.config import LoadtestConfig
from pipeline.loadtest.plan import plan_rate, trace_sample
from pipeline.loadtest.present import rate_notes
from pipeline.loadtest.result import Deployment
from pipeline.loadtest.stage import _new_loop, run
from pipeline.sim.blocks import sim_input
from pipeline.sim.curve import capacity_curve
from tests.conftest import DEFAULTS
from tests.workloads import growing_conversations


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    """One stub server process for the module: each test configures the options it wants (a
    start is much of what a test here costs)."""
    with run_stub_server() as server:
        yield server


BODY = b'{"model":"stub-model","prompt":"a b c d","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}'


def options(server: StubServer, **changes: Any) -> ClientOptions:
    values: dict[str, Any] = {
        "url": server.url + "/completions",
        "api": "completions",
        "connect_timeout_s": 5.0,
        "read_timeout_s": 10.0,
        "request_timeout_s": 30.0,
        "max_in_flight": None,
        "on_cap": "drop",
        "headers": {"Content-Type": "application/json"},
    }
    values.update(changes)
    return ClientOptions(**values)


def send(
    offsets: Iterable[float], opts: ClientOptions, body_for: Callable[[int], bytes] = lambda _: BODY
) -> list[Outcome]:
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(run_schedule(list(offsets), body_for, opts))


def send_until(
    offsets: Iterable[float], opts: ClientOptions, reached: Callable[[], bool]
) -> list[Outcome]:
    """``send``, stopped (as Ctrl-C stops a run) once ``reached()`` is true: for a server that
    does not answer. Polling gives up after five minutes, only so a client that never sends
    fails instead of hanging the suite."""

    async def run_until() -> list[Outcome]:
        stop = asyncio.Event()

        async def watch() -> None:
            for _ in range(3000):
                if await asyncio.to_thread(reached):
                    break
                await asyncio.sleep(0.1)
            stop.set()

        watcher = asyncio.ensure_future(watch())
        outcomes = await run_schedule(list(offsets), lambda _: BODY, opts, stop=stop)
        await watcher
        return outcomes

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(run_until())


def settings(**changes: Any) -> LoadtestConfig:
    return DEFAULTS.loadtest.replace(**changes)


def prompt_of(words: int) -> bytes:
    """BODY with a prompt of this many tokens: the server's record of it is found by its length."""
    return BODY.replace(b'"a b c d"', json.dumps(" ".join("w" * words)).encode())


# Both event loops (uvloop) keep time in whole milliseconds.
CLOCK_SLACK_S = 0.002


def test_ttft_and_inter_token_gaps_match_the_server_delays(stub: StubServer) -> None:
    # Every timing is compared with the server's record of the same request (offsets from the
    # send against offsets from the arrival), never with a wall-clock bound: a busy machine makes
    # tokens late, never early.
    server = stub.configure(ttft_ms=80, itl_ms=50)
    outcomes = send([0.0, 0.1, 0.2, 0.3], options(server), lambda i: prompt_of(i + 1))
    records = {r["prompt_tokens"]: r for r in server.stats()["requests"]}
    for i, o in enumerate(outcomes):
        assert o.error_kind is None and o.sent_s is not None and len(o.chunk_times) == 6
        assert o.usage_completion_tokens == 6 and o.usage_prompt_tokens == i + 1
        record = records[i + 1]
        assert record["first_token_due_s"] - record["arrival_s"] == pytest.approx(0.08)
        # Each chunk, timed from the send, came no sooner than the server wrote it, timed from
        # its arrival: a client stamping too early, or on another clock, fails here.
        served = np.array(record["write_s"]) - record["arrival_s"]
        measured = np.array(o.chunk_times) - o.sent_s
        assert (measured >= served - CLOCK_SLACK_S).all()
        assert served[0] >= 0.08 - CLOCK_SLACK_S and (np.diff(served) > 0).all()
        assert (np.diff(measured) >= 0).all()


def test_each_chunk_is_timed_as_it_arrives_not_when_the_stream_ends(stub: StubServer) -> None:
    """The server writes the first token and then nothing for ten minutes: the stream never
    ends, the read timeout does. The chunk that came was timed when it came, no sooner than the
    server wrote it; a client timing chunks at the stream's end (or reading the whole body
    first) has no time for it, or the time it gave up. How late the machine lets the client
    read it changes neither."""
    server = stub.configure(itl_ms=600_000)
    (outcome,) = send([0.0], options(server, read_timeout_s=1.0))
    (record,) = server.stats()["requests"]
    assert outcome.error_kind == "timeout" and outcome.sent_s is not None
    assert outcome.end_s is not None and len(outcome.chunk_times) == 1
    assert len(record["write_s"]) == 1  # one token written, the next ten minutes away
    served = record["write_s"][0] - record["arrival_s"]
    assert outcome.chunk_times[0] - outcome.sent_s >= served - CLOCK_SLACK_S
    assert outcome.chunk_times[0] < outcome.end_s


def test_sending_never_waits_for_a_slow_server(stub: StubServer) -> None:
    """The server answers nothing for ten minutes; the run is stopped once all 20 requests
    reached it. Each was sent with no answer to wait for, so the client is open-loop however
    late a busy machine makes its sends (a closed loop would still be waiting on the first)."""
    offsets = [i * 0.02 for i in range(20)]  # 50 req/s for 0.4 s
    server = stub.configure(ttft_ms=600_000)
    silent = options(server, read_timeout_s=600.0, request_timeout_s=600.0)
    outcomes = send_until(offsets, silent, lambda: len(server.stats()["requests"]) == 20)
    records = server.stats()["requests"]
    assert len(records) == 20 and all(r["write_s"] == [] for r in records)
    assert all(o.sent_s is not None and o.error_kind == "interrupted" for o in outcomes)
    late = np.array([(o.sent_s or 0) - o.scheduled_s for o in outcomes])
    assert late.min() >= -CLOCK_SLACK_S  # never sent early


def test_failures_are_counted_by_kind_and_never_stop_the_run(stub: StubServer) -> None:
    n = 30
    expected: Counter[str] = Counter()
    for i in range(1, n + 1):  # the stub's precedence: error, cut, silent cut, malformed
        if i % 5 == 0:
            expected["http_503"] += 1
        elif i % 7 == 0:
            expected["cut_stream"] += 1
        elif i % 11 == 0:
            expected["cut_stream_silent"] += 1
        elif i % 13 == 0:
            expected["malformed_stream"] += 1
    server = stub.configure(
        error_every=5, cut_every=7, silent_cut_every=11, malformed_every=13, itl_ms=1
    )
    # one at a time, so the server's arrival order is the send order
    outcomes = send(np.arange(n) * 0.01, options(server, max_in_flight=1, on_cap="delay"))
    got = Counter(o.error_kind for o in outcomes if o.error_kind)
    assert got == expected
    assert sum(1 for o in outcomes if o.error_kind is None) == n - sum(expected.values())


def test_a_hung_request_times_out(stub: StubServer) -> None:
    read_timeout_s = 0.5
    server = stub.configure(hang_every=2)
    # No send is earlier than this (the client's clock is time.monotonic's, as the server's).
    before = time.monotonic()
    outcomes = send(
        [0.0, 0.05, 0.1],
        options(server, read_timeout_s=read_timeout_s),
        lambda i: prompt_of(i + 1),
    )
    records = {r["prompt_tokens"]: r for r in server.stats()["requests"]}
    # The server's record says which request it left hanging (the second to arrive) and when it
    # answered the others, on its own clock: the client's verdict on each follows from that, so
    # a busy machine can change which request hangs but never make a verdict wrong.
    assert sorted(r["outcome"] for r in records.values()) == ["hang", "ok", "ok"]
    for i, outcome in enumerate(outcomes):
        record = records[i + 1]
        assert outcome.sent_s is not None
        if record["outcome"] == "hang":
            assert outcome.error_kind == "timeout" and outcome.chunk_times == []
            assert outcome.end_s is not None
            assert outcome.end_s - outcome.sent_s >= read_timeout_s - CLOCK_SLACK_S  # not early
        # Answered within the read timeout of the send (the client's read starts no sooner,
        # so the answer came in time, however late the server met the request).
        elif record["write_s"][0] < before + outcome.sent_s + read_timeout_s - CLOCK_SLACK_S:
            assert outcome.error_kind is None and len(outcome.chunk_times) == 6


def test_an_unreachable_server_is_a_connect_error() -> None:
    opts = ClientOptions("http://127.0.0.1:9/v1/completions", "completions", 2, 2, 5, None, "drop")
    outcomes = send([0.0], opts)
    assert outcomes[0].error_kind == "connect_error"


def test_cap_drop_counts_what_it_held_back(stub: StubServer) -> None:
    # Every request holds its slot 200 ms or more by the server's clock (a busy machine only
    # holds it longer): the 10 sends within 225 ms find both slots taken, bar a few.
    offsets = np.arange(10) * 0.025
    server = stub.configure(ttft_ms=200)
    dropped = send(offsets, options(server, max_in_flight=2, on_cap="drop"))
    delayed = send(offsets, options(server, max_in_flight=2, on_cap="delay"))
    kinds = Counter(o.error_kind for o in dropped)
    assert kinds["dropped_cap"] >= 5 and kinds[None] == 10 - kinds["dropped_cap"]
    assert all(o.sent_s is None for o in dropped if o.error_kind == "dropped_cap")
    assert all(o.error_kind is None for o in delayed)
    assert max((o.sent_s or 0) - o.scheduled_s for o in delayed) > 0.3  # late, and said so


def _replay(server: StubServer, frame: Any, **changes: Any) -> Any:
    trace = trace_sample(frame.lazy())
    workload = LoadtestInputs(trace, "growing conversations", "t")
    values: dict[str, Any] = {
        "endpoint": server.url,
        "model": "stub-model",
        "rates": [30.0],
        "duration": 0.99,
        "warmup": 0.0,
        "max_in_flight": 1,  # one at a time: the server meets them in trace order
        "on_cap": "delay",
    }
    config = settings(**{**values, **changes})
    return run(workload, config, Deployment("vllm", "H100", 1))


def test_the_server_cache_meets_the_replays_prefix_structure(stub: StubServer) -> None:
    frame = growing_conversations(30, 4, extra_tokens=5, output_tokens=4)
    server = stub.configure(block_size=16)
    result = _replay(server, frame)
    totals = server.stats()["totals"]
    sent = result.rates[0].requests
    rows = sorted(sent.get_column("trace_row").to_list())
    assert rows == list(range(30))  # 30 req/s × 0.99 s: each trace request once
    predicted = capacity_curve(
        sim_input(frame, latency_model=DEFAULTS.shape.latency),
        DEFAULTS.simulation,
        block_size=16,
        replicas=1,
        routing="round-robin",
    )
    assert totals["prompt_tokens"] == int(frame.get_column("prompt_tokens").sum())
    assert totals["hit_tokens"] == predicted.max_hit_tokens > 0
    # and the run reports the server's own figure (usage.prompt_tokens_details.cached_tokens)
    summary = rate_summary(sent, result.rates[0].plan, interrupted=False)
    assert summary["cache_reported"] == 30
    assert summary["cache_hit_share"] == pytest.approx(
        predicted.max_hit_tokens / totals["prompt_tokens"]
    )
    assert "served from its prefix cache" in " ".join(rate_notes(summary))


def test_missing_usage_and_short_answers_are_reported(stub: StubServer) -> None:
    frame = growing_conversations(10, 2, extra_tokens=1, output_tokens=6)
    server = stub.configure(usage="never", natural_length=3)
    # 30 req/s × 0.32 s: the 10 trace requests once
    plain = _replay(server, frame, length_control=[], duration=0.32)
    asked = _replay(server, frame, length_control=["min_tokens"], duration=0.32)
    for result, short in ((plain, 10), (asked, 0)):
        rate = result.rates[0]
        summary = rate_summary(rate.requests, rate.plan, interrupted=False)
        assert summary["completed"] == 10 and summary["usage_reported"] == 0
        assert summary["output_short"] == short
        assert set(rate.requests.get_column("output_tokens_source")) == {"chunks"}
        notes = " ".join(rate_notes(summary))
        assert "carried no usage" in notes
        assert ("shorter than the trace asked" in notes) == bool(short)


def test_bodies_ask_for_the_trace_lengths() -> None:
    frame = growing_conversations(4, 2, extra_tokens=5, output_tokens=7)
    trace = trace_sample(frame.lazy())
    plan = plan_rate(
        trace, kind="poisson", rate_rps=2, duration_s=2, warmup_s=0, burstiness=1, seed=3
    )
    chat = settings(api="chat", length_control=["ignore_eos"], include_usage=False)
    body = json.loads(bodies_for(trace, plan, chat, "m")(0))
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["model"] == "m"
    assert "min_tokens" not in body and "stream_options" not in body
    assert len(body["messages"][0]["content"].split()) == int(
        trace.prompt_tokens[plan.trace_rows[0]]
    )


def test_request_frame_definitions() -> None:
    trace = trace_sample(growing_conversations(2, 1, extra_tokens=0, output_tokens=3).lazy())
    plan = plan_rate(
        trace, kind="poisson", rate_rps=1, duration_s=2, warmup_s=0, burstiness=1, seed=0
    )
    outcome = Outcome(index=0, scheduled_s=1.0, sent_s=1.002, chunk_times=[1.1, 1.13, 1.17])
    outcome.end_s, outcome.finish_reason = 1.2, "length"
    row = request_frame(plan, trace, [outcome]).row(0, named=True)
    assert row["late_ms"] == pytest.approx(2.0)
    assert row["ttft_ms"] == pytest.approx(98.0)
    assert row["e2e_ms"] == pytest.approx(198.0)
    assert row["itl_ms"] == pytest.approx([30.0, 40.0])
    assert row["output_tokens"] == 3 and row["output_tokens_source"] == "chunks"
    assert row["tpot_ms"] == pytest.approx((198.0 - 98.0) / 2)


def test_the_result_file_offers_the_rate_of_its_measured_window(tmp_path: Any) -> None:
    import datetime as dt

    from pipeline.bench.readers import read_bench_files
    from pipeline.loadtest.compute import vllm_result

    trace = trace_sample(growing_conversations(8, 2, extra_tokens=0, output_tokens=3).lazy())
    plan = plan_rate(
        trace, kind="poisson", rate_rps=2, duration_s=3, warmup_s=0, burstiness=1, seed=0
    )
    schedule = [0.0, 0.1, 0.2, 2.0]  # a burst: 3 gaps over 2 s offer 1.5 req/s, whatever "2"
    outcomes = []
    for i, t in enumerate(schedule):
        o = Outcome(index=i, scheduled_s=t, sent_s=t, chunk_times=[t + 0.1, t + 0.2, t + 0.3])
        o.end_s, o.finish_reason, o.usage_completion_tokens = t + 0.3, "length", 3
        outcomes.append(o)
    frame = request_frame(plan, trace, outcomes)
    started = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    result = vllm_result(
        frame, model="m", api="completions", rate_rps=2.0, burstiness=1.0, max_in_flight=None,
        started=started,
    )  # fmt: skip
    assert result["request_rate"] == 1.5 and result["num_prompts"] == 4
    assert result["duration"] == pytest.approx(2.3) and result["total_output_tokens"] == 12
    assert result["mean_ttft_ms"] == pytest.approx(100.0)
    assert result["p99_itl_ms"] == pytest.approx(100.0)
    path = tmp_path / "vllm-2qps.json"
    path.write_text(json.dumps(result))
    point = read_bench_files(
        [path], manifest={"engine": "vllm", "gpu_type": "H100", "gpu_count": 1}
    ).load_points.row(0, named=True)
    assert point["offered_rate_rps"] == 1.5
    assert point["achieved_rate_rps"] == pytest.approx(1.5)  # on schedule: the two agree
    assert point["load_mode"] == "open" and point["completed"] == 4


def test_error_bodies_keep_what_went_wrong_not_what_they_echo() -> None:
    from pipeline.loadtest.client import error_message

    fastapi_422 = (
        '{"detail": [{"type": "extra_forbidden", "loc": ["body", "ignore_eos"], '
        '"msg": "Extra inputs are not permitted", "input": "secret prompt words"}]}'
    )
    assert error_message(fastapi_422) == "body.ignore_eos: Extra inputs are not permitted"
    openai = '{"error": {"message": "model not found", "type": "NotFoundError", "code": 404}}'
    assert error_message(openai) == "NotFoundError; 404; model not found"
    assert error_message("<html>secret prompt words</html>") == "a non-JSON body of 32 characters"


def test_anything_the_client_raises_fails_that_request_only(stub: StubServer) -> None:
    server = stub.configure()
    # aiohttp refuses an Authorization header beside credentials in the URL (ValueError)
    url = server.url.replace("http://", "http://u:p@") + "/completions"
    opts = options(server, url=url, headers={"Authorization": "Bearer x"})
    outcomes = send([0.0, 0.05], opts)
    assert [o.error_kind for o in outcomes] == ["client_error", "client_error"]
    assert all("ValueError" in (o.error_detail or "") for o in outcomes)


def test_a_malformed_line_is_measured_never_kept(stub: StubServer) -> None:
    server = stub.configure(malformed_every=1)
    (outcome,) = send([0.0], options(server))
    assert outcome.error_kind == "malformed_stream"
    assert "tok" not in (outcome.error_detail or "") and "bytes is not JSON" in (
        outcome.error_detail or ""
    )
