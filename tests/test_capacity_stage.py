"""The capacity stage end to end on the bundled sweep: two workloads of different request mixes
get different, hand-checkable costs from the same benchmark."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from assets.cli import main as enginefit
from pipeline.capacity import stage
from pipeline.capacity.compute import deployment_model_shape
from pipeline.capacity.fit import deployment_of
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import CapacityResult, FleetCache, ServingModel, WorkloadCost
from pipeline.config import load_config
from pipeline.errors import InputFormatError
from pipeline.layout import WorkloadLayout
from pipeline.report.headline import headlines
from pipeline.sim import stage as sim_stage
from pipeline.sim.config import Scenario
from pipeline.sim.replay import simulate
from pipeline.unknown import Unknown
from tests.conftest import (
    REPO,
    _built_once,
    _shared_folder,
    azure_conversation_trace,
    bundled_config,
)

# The bundled SLO's p95 TTFT of 1 s cannot be met by a 1×H100 replica on Mooncake's prompts (its
# p95 prompt is ~40k tokens, ~2 s of prefill alone); a looser limit lets both workloads have a
# capacity, so their costs can be compared.
SLO = {"ttft_p95_ms": 10000, "itl_p99_ms": 60}
# A small simulated grid: the cached share comes from it, the figures need no more.
SIMULATION = {
    "replicas": [1, 2],
    "cache_tokens": [450000],
    "routings": ["round-robin", "cache-aware"],
}


def _configure(tmp_path: Path, name: str, traces: list[dict[str, str]] | None = None) -> Path:
    path = bundled_config(tmp_path, name)
    raw = yaml.safe_load(path.read_text())
    raw["bench"]["slo"] = SLO
    raw["simulation"] = {**raw.get("simulation", {}), **SIMULATION}
    if traces is not None:
        raw["workload"] = {"name": name, "traces": traces}
    path.write_text(yaml.safe_dump(raw))
    return path


def _run_stages(
    config: Path,
    capsys: pytest.CaptureFixture[str] | None,
    commands: tuple[str, ...] = ("ingest", "shape", "simulate", "bench", "capacity"),
) -> CapacityResult:
    for command in commands:
        assert enginefit([command, "--config", str(config)]) == 0, (
            capsys.readouterr().err if capsys else command
        )
    return stage.read_result(load_config(config).layout())


@pytest.fixture(scope="module")
def mooncake_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled Mooncake sample run through every stage once per run (shared by the xdist
    workers): the folder holding its configuration and data. Tests read it or copy it."""

    def run(root: Path) -> Path:
        _run_stages(_configure(root, "mooncake"), None)
        return root

    return _built_once(_shared_folder(tmp_path_factory), "capacity-stage-mooncake", run)


def _mooncake_copy(shared: Path, tmp_path: Path, name: str) -> Path:
    """The shared Mooncake run's data copied to ``tmp_path / name`` with a configuration of its
    own: a test may rerun stages there with other settings."""
    shutil.copytree(shared / "mooncake" / "data", tmp_path / name / "data")
    return _configure(tmp_path, name)


def _cost(result: CapacityResult) -> WorkloadCost:
    (candidate,) = result.candidates
    assert isinstance(candidate.cost, WorkloadCost), candidate
    return candidate.cost


def test_two_workloads_get_different_hand_checkable_costs_from_one_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mooncake_run: Path
) -> None:
    mooncake = stage.read_result(load_config(mooncake_run / "mooncake.yaml").layout())
    trace = azure_conversation_trace(tmp_path / "azure_conv.csv")
    azure = _run_stages(
        _configure(tmp_path, "azure-conv", [{"path": str(trace), "format": "azure"}]), capsys
    )
    long_cost, short_cost = _cost(mooncake), _cost(azure)
    (long_c,), (short_c,) = mooncake.candidates, azure.candidates
    # The same deployment, the same benchmark figure beside each.
    assert long_c.candidate == short_c.candidate
    assert long_c.benchmark_cost_per_1m_output_usd == short_c.benchmark_cost_per_1m_output_usd
    # Longer prompts: fewer requests a second per replica, a higher price per output token.
    assert mooncake.mix.prompt_tokens_mean > 5 * azure.mix.prompt_tokens_mean
    assert isinstance(long_c.workload_capacity_rps, float)
    assert isinstance(short_c.workload_capacity_rps, float)
    assert long_c.workload_capacity_rps < short_c.workload_capacity_rps / 3
    assert long_cost.cost_per_1m_output_usd > short_cost.cost_per_1m_output_usd
    assert long_cost.all_in_cost_per_1m_output_usd > 2 * short_cost.all_in_cost_per_1m_output_usd
    # One figure by hand: replicas = ceil(peak ÷ (capacity × headroom)); monthly = replicas ×
    # GPUs × $/h × 730 (the bundled price: H100 at $3.0/GPU-hour, headroom 0.8).
    for result, cost, capacity in (
        (mooncake, long_cost, long_c.workload_capacity_rps),
        (azure, short_cost, short_c.workload_capacity_rps),
    ):
        replicas = math.ceil(result.mix.peak_rate_rps / (capacity * 0.8))
        assert cost.replicas == max(replicas, 1)
        assert cost.gpu_hour_usd == 3.0
        assert cost.monthly_cost_usd == pytest.approx(cost.replicas * 1 * 3.0 * 730)
        hourly_output = capacity * 3600 * result.mix.output_tokens_mean
        assert cost.all_in_cost_per_1m_output_usd == pytest.approx(3.0 / hourly_output * 1e6)
        # The band's ends through the same formulas: the high end needs the fewer replicas.
        (carried,) = result.candidates
        low, high = carried.workload_capacity_band_rps  # type: ignore[misc]
        fewest = max(math.ceil(result.mix.peak_rate_rps / (high * 0.8)), 1)
        most = max(math.ceil(result.mix.peak_rate_rps / (low * 0.8)), 1)
        assert cost.replicas_band == (fewest, most)
        assert cost.monthly_cost_band_usd == pytest.approx((fewest * 3.0 * 730, most * 3.0 * 730))
        assert cost.all_in_cost_per_1m_output_band_usd == pytest.approx(
            (
                3.0 / (high * 3600 * result.mix.output_tokens_mean) * 1e6,
                3.0 / (low * 3600 * result.mix.output_tokens_mean) * 1e6,
            )
        )
    # What the terminal shows names the transfer.
    assert enginefit(["capacity", "--config", str(tmp_path / "azure-conv.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Measured at 204-token prompts" in out and "req/s per replica" in out
    # Azure traces carry no content: no cached tokens, said so.
    assert azure.mix.cached_prompt_share == 0.0
    assert any("cached tokens taken as 0" in note for note in azure.notes)
    assert isinstance(short_c.fleet_cache, Unknown)
    assert "no prompt content" in short_c.fleet_cache.reason
    # Mooncake: the fleet's own cache, replayed at the fleet's replica count with the replica's
    # KV pool, after the fleet size and the cache settled from the simulated scenarios' share.
    fleet = long_c.fleet_cache
    assert isinstance(fleet, FleetCache), fleet
    assert fleet.kv_tokens == 449_797 and fleet.settled
    assert fleet.replicas == long_cost.replicas
    start = fleet.steps[0]
    assert start.replicas == 0 and 0 < start.cached_share < 1
    assert [s.replicas for s in fleet.steps[1:]] == [s.replicas_needed for s in fleet.steps[:-1]]
    assert fleet.steps[-1].replicas_needed == fleet.replicas
    assert mooncake.mix.cached_prompt_share == 0.0  # each candidate has its own
    # The same replay run by hand through the simulation stage gives the same share.
    cfg = load_config(mooncake_run / "mooncake.yaml")
    inputs = sim_stage.read_inputs(cfg.layout(), cfg.cache_replay().latency)
    scenario = Scenario(512, fleet.replicas, fleet.kv_tokens, fleet.routing)
    hits = simulate(inputs, scenario, cfg.simulation, with_instant=False).hit_tokens
    assert fleet.cached_share == pytest.approx(hits.sum() / inputs.prompt_tokens.sum())
    assert f"on {fleet.replicas} replica(s), {fleet.routing} routing" in fleet.description
    # Mooncake's timestamps sit on a 3 s grid: Gamma arrivals at the CV its counts imply;
    # Azure's resolve gaps: its own arrivals, replayed.
    assert long_c.arrivals is not None and long_c.arrivals.kind == "gamma"
    assert short_c.arrivals is not None and short_c.arrivals.kind == "trace"
    # Its Poisson arrivals replayed in runs: gaps of CV about 1.
    assert short_c.arrivals.cv == pytest.approx(1.0, abs=0.1)
    assert "gap CV" in short_c.arrivals.description
    for candidate in (long_c, short_c):
        assert [v.key for v in candidate.sensitivity] == [
            "poisson",
            "cached_minus",
            "cached_plus",
            "budget_half",
            "budget_double",
        ]
    # The end-of-run summary line.
    config = load_config(tmp_path / "azure-conv.yaml")
    line = dict(headlines(config.layout(), config.filing()))["capacity"]
    assert f"{short_cost.replicas} replica(s) at peak" in line
    assert "per 1M output tokens of this workload" in line


def test_capacity_before_its_inputs_exist_says_which_command_makes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = bundled_config(tmp_path, "fresh")
    assert enginefit(["capacity", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("enginefit capacity: configuration: ")
    assert len(err) == 2 and err[1].startswith("enginefit: error: ")
    assert "run `enginefit bench --config FILE` or materialise `bench_analysis` first" in err[1]
    with pytest.raises(InputFormatError, match="`enginefit capacity --config FILE`"):
        stage.read_result(WorkloadLayout(tmp_path / "nothing"))


def test_an_slo_without_the_simulated_limits_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = bundled_config(tmp_path, "slo")
    raw = yaml.safe_load(config.read_text())
    raw["bench"]["slo"] = {"ttft_p99_ms": 2000}
    config.write_text(yaml.safe_dump(raw))
    # The capacity stage reads the SLO the bench analysis was made with.
    assert enginefit(["bench", "--config", str(config)]) == 0
    assert enginefit(["capacity", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("enginefit: error: bench.slo: the capacity stage simulates")
    assert "ttft_p95_ms and itl_p99_ms" in err


def test_bundled_configuration_sets_the_query_heads() -> None:
    kv = load_config(REPO / "enginefit.yaml").requirements.kv_cache
    assert kv is not None and kv.attention_heads == 32


def test_the_roofline_prior_is_the_teams_model_only_where_the_benchmark_served_it() -> None:
    shape = ModelShape(
        params_billion=8.03, weight_bytes=2, layers=32, kv_heads=8, head_dim=128, kv_bytes=2
    )
    team = ("meta-llama/Llama-3.1-8B-Instruct",)
    # The same model, named with or without its hub organisation: the prior, nothing to say.
    assert deployment_model_shape(shape, "llama-3.1-8b-instruct", team) == (shape, None)
    # Another model: no prior, and the reason names both.
    other, why = deployment_model_shape(shape, "meta-llama/Llama-3.3-70B-Instruct", team)
    assert other is None and why is not None
    assert "benchmarked on meta-llama/Llama-3.3-70B-Instruct, not your model" in why
    # Nothing to compare with: the prior, and the assumption said.
    assumed, note = deployment_model_shape(shape, "m", ())
    assert assumed is shape and note is not None and "requirements.models is not set" in note
    unnamed, note = deployment_model_shape(shape, None, team)
    assert unnamed is shape and note is not None and "does not name its model" in note
    assert deployment_model_shape(None, "m", team) == (None, None)


def test_a_benchmark_of_another_model_is_priced_as_that_model_and_provisional(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mooncake_run: Path
) -> None:
    config = _mooncake_copy(mooncake_run, tmp_path, "other-model")
    ours = stage.read_result(load_config(config).layout())
    (candidate,) = ours.candidates
    assert isinstance(candidate.serving_model, ServingModel)
    assert "roofline" in str(candidate.serving_model.prior)  # the team's model: its prior
    assert candidate.serving_model.model_shape == "requirements.kv_cache"
    raw = yaml.safe_load(config.read_text())
    raw["requirements"]["models"] = ["Qwen/Qwen3-32B"]
    config.write_text(yaml.safe_dump(raw))
    assert enginefit(["capacity", "--config", str(config)]) == 0, capsys.readouterr().err
    theirs = stage.read_result(load_config(config).layout())
    (other,) = theirs.candidates
    assert other.provisional_reason is not None
    assert "benchmarked on meta-llama/Llama-3.1-8B-Instruct, not your model (Qwen/Qwen3-32B)" in (
        other.provisional_reason
    )
    # requirements.kv_cache describes Qwen3-32B, not the benchmark: the benchmarked model's own
    # shape comes from the model table, so its capacity is Llama's, said so.
    assert isinstance(other.serving_model, ServingModel)
    assert other.serving_model.model_shape.startswith("the model table's llama-3.1-8b (https://")
    assert any("not your model" in note for note in theirs.notes)


def test_a_model_nobody_describes_has_no_prior_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mooncake_run: Path
) -> None:
    """A benchmarked model outside the model table, and not the team's (requirements.kv_cache
    describes another): no prior, so an aggregate-only sweep cannot split prefill from decode:
    unknown with both reasons, never 0."""
    results = tmp_path / "results"
    shutil.copytree(REPO / "bench-results" / "vllm-h100-inference-perf", results)
    manifest = results / "enginefit-bench.yaml"
    raw_manifest = yaml.safe_load(manifest.read_text())
    manifest.write_text(yaml.safe_dump({**raw_manifest, "model": "acme/secret-13b"}))
    config = _mooncake_copy(mooncake_run, tmp_path, "unknown-model")
    raw = yaml.safe_load(config.read_text())
    raw["bench"]["results"] = [str(results)]
    raw["requirements"]["models"] = ["Qwen/Qwen3-32B"]
    config.write_text(yaml.safe_dump(raw))
    # The workload's stages are the shared run's; the benchmark and the capacity run again.
    (candidate,) = _run_stages(config, capsys, ("bench", "capacity")).candidates
    model = candidate.serving_model
    assert isinstance(model, Unknown)
    assert "prefill cost cannot be separated from decode" in model.reason
    assert "acme/secret-13b is not in the model table" in model.reason
    assert isinstance(candidate.workload_capacity_rps, Unknown)


def test_two_backends_of_one_engine_are_two_deployments() -> None:
    """TensorRT-LLM's PyTorch and TensorRT backends are different servers: their load points
    are fitted apart, and the deployment says which."""
    base = {"engine": "tensorrt-llm", "engine_version": "1.0", "gpu_type": "H100", "gpu_count": 1}
    points = pl.DataFrame(
        [{**base, "backend": b, "model": "m", "label": None} for b in ("pytorch", "tensorrt")]
    )
    keys = [k for k in stage.DEPLOYMENT_KEYS if k in points.columns]
    groups = points.select(keys).unique().to_dicts()
    assert len(groups) == 2
    described = sorted(deployment_of(g).describe() for g in groups)
    assert described == [
        "tensorrt-llm 1.0 (pytorch backend) / m / 1×H100",
        "tensorrt-llm 1.0 (tensorrt backend) / m / 1×H100",
    ]


def test_a_table_too_large_to_flatten_is_priced_as_the_flattened_one(
    tmp_path: Path, mooncake_run: Path
) -> None:
    """Past ``simulation.curve_exact_max_blocks`` the simulation streams and the fleet's cache
    replays stream the parts too: the capacity stage writes the same files to the byte."""
    config = _mooncake_copy(mooncake_run, tmp_path, "streamed")
    raw = yaml.safe_load(config.read_text())
    raw["simulation"]["curve_exact_max_blocks"] = 0
    config.write_text(yaml.safe_dump(raw))
    flattened: list[object] = []
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(sim_stage, "sim_input", lambda *a, **k: flattened.append(a))
        _run_stages(config, None, ("simulate", "capacity"))
    assert flattened == []
    layout = load_config(config).layout()
    shared = load_config(mooncake_run / "mooncake.yaml").layout()
    written = sorted(p.relative_to(layout.capacity.dir) for p in layout.capacity.dir.rglob("*.*"))
    assert written
    for name in written:
        assert (layout.capacity.dir / name).read_bytes() == (
            shared.capacity.dir / name
        ).read_bytes(), name
