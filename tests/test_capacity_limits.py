"""A deployment's scheduling limits and the model's physical bounds: where each limit comes from
(configuration, manifest, result file, catalog, fitted), the engine catalog's defaults by GPU,
the model table and its shapes, and the physical floors, each checked against hand-computed
figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.bench.manifest import BenchManifestError
from pipeline.bench.readers import read_bench_files
from pipeline.capacity.limits import kv_bytes, resolve_limits, weight_bytes
from pipeline.capacity.models import deployment_shape, model_table
from pipeline.capacity.prior import ModelShape, physical_floors, roofline_prior
from pipeline.capacity.stage import deployment_limits
from pipeline.config import default_config
from pipeline.decision.catalog import load_catalog
from pipeline.unknown import Unknown
from tests import batching_server_sim as sim

CONFIG = default_config().capacity
CATALOG = load_catalog()


def _sweep(folder: Path, **manifest: object) -> Path:
    """One small simulated vLLM sweep whose manifest is ``manifest`` over the defaults."""
    prompt, output = sim.mix(60, (100, 300), (20, 40), seed=3)
    sim.write_sweep(sim.GpuServer(), folder, [4.0], prompt, output)
    path = folder / "enginefit-bench.yaml"
    path.write_text(json.dumps({**json.loads(path.read_text()), **manifest}))
    return folder


def test_manifest_engine_args_are_the_deployments_limits(tmp_path: Path) -> None:
    folder = _sweep(
        tmp_path,
        engine_args={
            "max_num_batched_tokens": 320,
            "max_num_seqs": 64,
            "enable_chunked_prefill": False,
            "kv_cache_dtype": "FP8",
        },
    )
    points = read_bench_files(folder).load_points
    assert json.loads(points["engine_args"][0]) == {
        "enable_chunked_prefill": False,
        "kv_cache_dtype": "fp8",
        "max_num_batched_tokens": 320,
        "max_num_seqs": 64,
    }
    limits = deployment_limits(points, CATALOG, CONFIG)
    assert (limits.budget, limits.batch, limits.chunked) == (320, 64, False)
    assert limits.token_budget.source == "manifest"
    assert limits.token_budget.detail == f"engine_args in {folder / 'enginefit-bench.yaml'}"
    assert kv_bytes(limits) == 1.0
    # The team's configuration overrides every deployment's.
    team = deployment_limits(points, CATALOG, CONFIG.replace(token_budget=1024))
    assert team.budget == 1024 and team.token_budget.source == "configuration"
    assert team.batch == 64


@pytest.mark.parametrize(
    ("engine_args", "message"),
    [
        (
            {"max_num_batch_tokens": 8},
            r"'engine_args' has unknown key\(s\) \['max_num_batch_tokens'\]",
        ),
        ({"max_num_seqs": 0}, r"'engine_args.max_num_seqs' must be a whole number ≥ 1 \(got 0\)"),
        ({"enable_chunked_prefill": "yes"}, r"'engine_args.enable_chunked_prefill' must be true"),
        ({"gpu_memory_utilization": 1.5}, r"'engine_args.gpu_memory_utilization' must be a share"),
        ([1, 2], r"'engine_args' must be a mapping"),
    ],
)
def test_a_bad_engine_arg_is_one_line_naming_the_manifest_and_key(
    tmp_path: Path, engine_args: object, message: str
) -> None:
    folder = _sweep(tmp_path, engine_args=engine_args)
    with pytest.raises(BenchManifestError, match=message) as err:
        read_bench_files(folder)
    assert str(folder / "enginefit-bench.yaml") in str(err.value)
    assert "\n" not in str(err.value)


def test_what_a_result_file_records_comes_before_the_catalog(tmp_path: Path) -> None:
    folder = _sweep(tmp_path)
    result = next(folder.glob("vllm-*.json"))
    doc = json.loads(result.read_text())
    doc["max_num_batched_tokens"] = "512"  # vllm bench serve --metadata k=v: text
    doc["max_num_seqs"] = "lots"
    result.write_text(json.dumps(doc))
    read = read_bench_files(folder)
    points = read.load_points
    assert json.loads(points["recorded_engine_args"][0]) == {"max_num_batched_tokens": 512}
    assert (
        "engine argument max_num_seqs='lots' in the file is not a whole number ≥ 1: left out"
        in points["row_notes"][0].to_list()
    )
    limits = deployment_limits(points, CATALOG, CONFIG)
    assert limits.budget == 512 and limits.token_budget.source == "result file"
    assert limits.batch == 1024 and limits.max_batch.source == "catalog"


def test_sglang_server_info_gives_its_scheduling_limits(tmp_path: Path) -> None:
    from pipeline.bench.readers._common import RawPoint
    from pipeline.bench.readers.sglang import _record_server_args

    point = RawPoint(record_index=0)
    _record_server_args(
        point,
        {
            "chunked_prefill_size": -1,
            "max_prefill_tokens": 16384,
            "max_running_requests": 48,
            "max_total_num_tokens": 812_345,
            "tp_size": 2,
            "kv_cache_dtype": "auto",
        },
    )
    assert point.engine_args == {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 16384,
        "max_num_seqs": 48,
        "kv_cache_tokens": 812_345,
        "tensor_parallel_size": 2,
        "kv_cache_dtype": "auto",
    }


@pytest.mark.parametrize(
    ("engine", "gpu", "expected"),
    [
        ("vllm", "H100-80GB", (8192, 1024, True)),
        ("vllm", "NVIDIA H200", (8192, 1024, True)),
        ("vllm", "A100-80GB", (2048, 256, True)),  # vLLM leaves the A100 out on purpose
        ("vllm", "L40S", (2048, 256, True)),
        ("sglang", "H100", (8192, 2048, True)),
        ("sglang", "A100-40GB", (4096, 2048, True)),
        ("sglang", "L4", (2048, 2048, True)),
        ("sglang", "MI300X", (16384, 2048, True)),
        ("trtllm", "H100", (8192, 2048, False)),  # chunked prefill off by default
        ("llama.cpp", "L4", (2048, 4, True)),
    ],
)
def test_the_catalog_defaults_follow_the_engine_and_gpu(
    engine: str, gpu: str, expected: tuple[int, int, bool]
) -> None:
    found = CATALOG.scheduling_defaults(engine, gpu)
    assert found is not None
    assert (
        found.max_num_batched_tokens,
        found.max_num_seqs,
        found.enable_chunked_prefill,
    ) == expected
    assert "https://github.com/" in found.detail
    assert CATALOG.scheduling_defaults("tgi", "H100") is None  # no defaults: assumed, said so
    unstated = resolve_limits(
        manifest_args={},
        recorded_args={},
        defaults=None,
        config=CONFIG,
        manifest_file=None,
        gpu_count=2,
    )
    assert unstated.token_budget.source == "assumed" and unstated.budget == 8192
    assert unstated.tensor_parallel_size.value == 2


def test_quantisation_words_give_bytes_per_parameter() -> None:
    assert weight_bytes("bf16") == 2.0
    assert weight_bytes("FP8-dynamic") == 1.0
    assert weight_bytes("awq-int4") == 0.5
    assert weight_bytes("mxfp4") == 0.5
    assert weight_bytes(None) is None and weight_bytes("nf-something") is None


def test_the_model_table_knows_common_models_with_sources() -> None:
    table = model_table()
    for name in (
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen3-30B-A3B",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "deepseek-ai/DeepSeek-R1",
        "openai/gpt-oss-120b",
        "RedHatAI/Llama-3.1-8B-Instruct-FP8",
    ):
        found = table.find(name)
        assert found is not None, name
        assert (
            found[1].source.startswith("https://huggingface.co/") and found[1].attention_heads > 0
        )
    assert table.find("acme/secret-13b") is None
    assert table.find(None) is None


def test_shapes_by_hand() -> None:
    table = model_table()
    llama = table.find("llama-3.1-8b")[1].shape()  # type: ignore[index]
    # 2 (K, V) × 32 layers × 8 KV heads × 128 × 2 bytes = 131,072 bytes a token.
    assert llama.kv_bytes_per_token() == 131_072
    assert llama.attention_flops_per_pair() == 2 * 32 * 32 * (128 + 128)
    deepseek = table.find("deepseek-v3")[1].shape()  # type: ignore[index]
    # Latent attention: 61 layers × (512 + 64) × 2 bytes, no K/V pair (70,272 in BF16).
    assert deepseek.kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    assert deepseek.attention_flops_per_pair() == 2 * 61 * 128 * (192 + 128)
    assert deepseek.active_params == 37e9
    gpt_oss = table.find("gpt-oss-20b")[1].shape()  # type: ignore[index]
    # Only the 12 full-attention layers hold a long context's KV.
    assert gpt_oss.kv_bytes_per_token() == 2 * 12 * 8 * 64 * 2


def test_physical_floors_by_hand() -> None:
    llama = model_table().find("llama-3.1-8b")[1].shape()  # type: ignore[index]
    floors = physical_floors("H100-80GB", 1, llama)
    assert not isinstance(floors, Unknown)
    # Reading 8.03 B BF16 weights at 3.35 TB/s; one context token's KV likewise.
    assert floors.overhead_s == pytest.approx(8.03e9 * 2 / 3.35e12)
    assert floors.context_s_per_token == pytest.approx(131_072 / 3.35e12)
    # 2 FLOPs a parameter at 989 TFLOPS dense BF16; FP8 weights run at twice the peak.
    assert floors.prefill_s_per_token == pytest.approx(2 * 8.03e9 / 989e12)
    fp8 = physical_floors("H100-80GB", 1, llama.with_quantisation(1.0, None))
    assert not isinstance(fp8, Unknown)
    assert fp8.prefill_s_per_token == pytest.approx(floors.prefill_s_per_token / 2)
    assert fp8.overhead_s == pytest.approx(floors.overhead_s / 2)
    # Tensor parallelism over 4 GPUs divides every floor by 4.
    tp4 = physical_floors("H100-80GB", 4, llama)
    assert not isinstance(tp4, Unknown)
    assert tp4.overhead_s == pytest.approx(floors.overhead_s / 4)
    # A mixture of experts reads at least its active parameters a step.
    mixtral = model_table().find("mixtral-8x7b")[1].shape()  # type: ignore[index]
    moe = physical_floors("H100", 1, mixtral)
    assert not isinstance(moe, Unknown)
    assert moe.overhead_s == pytest.approx(12.9e9 * 2 / 3.35e12)
    prior = roofline_prior("H100", 1, mixtral)
    assert not isinstance(prior, Unknown)
    assert prior.overhead_s == pytest.approx(46.7e9 * 2 / (3.35e12 * 0.8))  # all of them
    assert isinstance(physical_floors("H100", 1, None), Unknown)


def test_a_deployments_shape_comes_from_the_team_or_the_table_and_says_which() -> None:
    team = ModelShape(
        params_billion=8.03, weight_bytes=2, layers=32, kv_heads=8, head_dim=128, kv_bytes=2
    )
    shape, source = deployment_shape(
        team, "meta-llama/Llama-3.1-8B-Instruct", weight_bytes=None, kv_bytes=1.0
    )
    assert shape is not None and shape.attention_heads == 32  # the table fills the head count
    assert shape.kv_bytes == 1.0  # the deployment's FP8 KV
    assert source.startswith("requirements.kv_cache, query heads from the model table")
    other, source = deployment_shape(None, "Qwen/Qwen3-32B", weight_bytes=1.0, kv_bytes=None)
    assert other is not None and other.layers == 64 and other.weight_bytes == 1.0
    assert "the model table's qwen3-32b" in source
    none, source = deployment_shape(None, "acme/secret-13b", weight_bytes=None, kv_bytes=None)
    assert none is None
    assert source == (
        "none: acme/secret-13b is not in the model table (pipeline/capacity/models.yaml) and "
        "requirements.kv_cache does not describe it"
    )


def test_a_bad_scheduling_default_in_the_catalog_is_one_line_naming_the_key(
    tmp_path: Path,
) -> None:
    from pipeline.decision.catalog import _bundled_text
    from pipeline.errors import ConfigError

    path = tmp_path / "engines.yaml"
    path.write_text(
        _bundled_text().replace(
            "max_num_seqs: 1024, enable_chunked_prefill",
            "max_seqs: 1024, enable_chunked_prefill",
            1,
        )
    )
    with pytest.raises(ConfigError) as err:
        load_catalog(path)
    assert str(path) in str(err.value)
    assert "engines.vllm.scheduling.defaults" in str(err.value) and "max_seqs" in str(err.value)
