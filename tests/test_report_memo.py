"""Page 1, the decision memo: what is asked (switch, stay or start), what each option costs a
month with why it is or is not the choice, how sure, what would change it, the next steps —
each checked against the decision record it is built from."""

from __future__ import annotations

from pathlib import Path

from pipeline.present.text import money, usd
from pipeline.report.sections.memo import MEMO_TRIGGERS, decision_memo, trigger_priority
from tests.decision_fixtures import candidate, decide_on, steady_traffic, sweep

NVIDIA_DATACENTER = {"deployment": "datacenter", "hardware": ["nvidia"]}


def test_a_switch_from_tgi_is_asked_with_its_costs_and_migration(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "current_engine": "tgi", "engineer_week_usd": 6_000},
    )
    memo = decision_memo(record, None)
    assert memo.ask == (
        f"Approve vLLM as the inference engine for {record.workload}. This is a switch from "
        "Hugging Face TGI, which serves it today."
    )
    vllm = candidate(record, "vllm")
    first = memo.options[0]
    assert first.engine == "vLLM" and first.why.startswith("Chosen")
    # The fleet plus model changes where that total is known, else the fleet alone.
    monthly = (
        vllm.monthly_total_usd if vllm.monthly_total_usd is not None else vllm.monthly_cost_usd
    )
    assert first.monthly == money(monthly) != "unknown"
    assert first.per_1m == usd(vllm.cost_per_1m_output_usd)
    # Every option not ruled out has a reason in words; TGI is ruled out, with its reason.
    assert all(o.why for o in memo.options)
    assert {o.engine for o in memo.options}.isdisjoint({"Hugging Face TGI"})
    tgi = next(o for o in memo.ruled_out if o.engine == "Hugging Face TGI")
    assert tgi.why.startswith("ruled out: ")
    assert any(
        step.startswith(f"Plan the migration to vLLM: {money(vllm.switch_cost_usd)} one-off")
        for step in memo.next_steps
    )
    # The few things that would change it: the highest-priority triggers, as sentences.
    shown = sorted(record.triggers, key=trigger_priority)[:MEMO_TRIGGERS]
    assert len(memo.changes) == len(shown) <= MEMO_TRIGGERS
    assert all(c[:1].isupper() and c.endswith(".") for c in memo.changes)
    assert memo.confidence.split(":")[0].lower() == record.recommendation.confidence


def test_keeping_the_engine_that_runs_today_plans_no_migration(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "current_engine": "vllm", "engineer_week_usd": 6_000},
    )
    memo = decision_memo(record, None)
    assert memo.ask.endswith("This keeps vLLM, which serves the workload today.")
    assert not any(step.startswith("Plan the migration") for step in memo.next_steps)


def test_a_new_deployment_says_so_and_asks_for_a_replay_of_this_traffic(tmp_path: Path) -> None:
    record = decide_on(tmp_path, steady_traffic(), [sweep("vllm", 5)], NVIDIA_DATACENTER)
    memo = decision_memo(record, "llm-d")
    assert "No engine serves this workload today: this is a new deployment." in memo.ask
    assert ", with prefix-aware routing through llm-d." in memo.ask
    assert memo.next_steps[0].startswith("Replay this traffic against vLLM")
    assert "Deploy llm-d in front of the replicas (prefix-aware routing)." in memo.next_steps
    assert memo.next_steps[-1].startswith("Next quarter, run `enginefit report`")
