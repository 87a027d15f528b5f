"""The engine catalog is data validated on load, and the engines named anywhere must be in it;
the KV-cache sizing formula reproduces the H100 figures of docs/decision-rules.md#kv-cache-sizing."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import yaml

from pipeline.config import config_from_mapping
from pipeline.decision.catalog import FEATURES, HardwareTarget, _bundled_text, load_catalog
from pipeline.decision.config import KvCacheSizing
from pipeline.errors import ConfigError
from tests.decision_fixtures import decide_on, steady_traffic, sweep

ENGINES = {"vllm", "sglang", "tensorrt-llm", "llama.cpp", "ollama", "tgi"}
LAYERS = {
    "dynamo",
    "llm-d",
    "vllm-production-stack",
    "sglang-model-gateway",
    "kserve",
    "ray-serve",
    "bentoml",
}


def test_the_bundled_catalog_holds_every_engine_and_layer_with_sources() -> None:
    catalog = load_catalog()
    assert set(catalog.engines) == ENGINES and set(catalog.layers) == LAYERS
    for engine in catalog.engines.values():
        assert set(engine.features) == set(FEATURES)
        assert set(engine.hardware) <= set(get_args(HardwareTarget))
        assert engine.sources() <= set(catalog.sources)
    assert catalog.engines["tgi"].status.state == "maintenance"
    assert catalog.engines["tgi"].status.since.isoformat() == "2025-12-11"  # type: ignore[union-attr]
    assert set(catalog.engines["tensorrt-llm"].hardware) == {"nvidia"}
    # Published SGLang-vs-vLLM margins, kept as secondary figures.
    margins = {f.condition: f.margin for f in catalog.engines["sglang"].secondary_figures}
    assert margins["shared-prefix"] == 0.29 and margins["no-sharing"] == 0.0


@pytest.mark.parametrize(
    ("alias", "key"),
    [
        ("vLLM", "vllm"),
        ("TensorRT_LLM", "tensorrt-llm"),
        ("trtllm", "tensorrt-llm"),
        ("text-generation-inference", "tgi"),
        ("llama-server", "llama.cpp"),
    ],
)
def test_engines_are_found_by_any_alias(alias: str, key: str) -> None:
    assert load_catalog().engine_key(alias) == key


def _broken(tmp_path: Path, edit: str, replacement: str) -> Path:
    text = _bundled_text()
    assert edit in text
    path = tmp_path / "catalog.yaml"
    path.write_text(text.replace(edit, replacement, 1))
    return path


@pytest.mark.parametrize(
    ("edit", "replacement", "message"),
    [
        (
            '    design_bet: "The memory manager',
            '    design_bat: "The memory manager',
            "unknown key engines.vllm.design_bat (did you mean design_bet?)",
        ),
        (
            "    licence: Apache-2.0\n    as_of: 2026-11-30\n\n  sglang:",
            "    as_of: 2026-11-30\n\n  sglang:",
            "engines.vllm.licence is required",
        ),
        (
            "as_of: 2026-11-30\n\nsources:",
            "as_of: 2026-13-45\n\nsources:",
            "as_of: '2026-13-45' is not an ISO date",
        ),
        (
            "engines: [sglang, tensorrt-llm, vllm]",
            "engines: [sglang, lmdeploy]",
            "layers.dynamo names engines the catalog lacks: ['lmdeploy']",
        ),
        (
            "hardware_sources: [T]",
            "hardware_sources: [T, NOPE]",
            "engines.tensorrt-llm cites undefined sources ['NOPE']",
        ),
        (
            "      nvidia: full\n      amd: full\n      intel-gpu: full\n      cpu: full\n      tpu",
            "      nvidia: full\n      amd: maybe\n      intel-gpu: full\n      cpu: full\n      tpu",
            "engines.vllm.hardware.amd",
        ),
    ],
)
def test_a_bad_catalog_is_one_error_naming_the_file_and_key(
    tmp_path: Path, edit: str, replacement: str, message: str
) -> None:
    path = _broken(tmp_path, edit, replacement)
    with pytest.raises(ConfigError) as caught:
        load_catalog(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_an_unknown_engine_in_the_configuration_names_the_key(tmp_path: Path) -> None:
    raw = {
        "workload": {"name": "w", "traces": ["t.jsonl"], "hash_salt": "s"},
        "requirements": {"current_engine": "lmdeploy"},
    }
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=tmp_path / "enginefit.yaml")
    assert str(caught.value).startswith(
        f"{tmp_path / 'enginefit.yaml'}: requirements.current_engine: unknown engine 'lmdeploy'; "
        "the engine catalog knows llama.cpp, ollama, sglang, tensorrt-llm, tgi, vllm"
    )


def test_an_unknown_engine_in_a_benchmark_names_its_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        decide_on(tmp_path, steady_traffic(), [sweep("lmdeploy", 5)], {})
    manifest = tmp_path / "bench-results" / "0-lmdeploy" / "enginefit-bench.yaml"
    assert str(caught.value).startswith(f"{manifest}: engine: unknown engine 'lmdeploy'; ")


def test_a_team_catalog_can_add_an_engine(tmp_path: Path) -> None:
    raw = yaml.safe_load(_bundled_text())
    raw["engines"]["lmdeploy"] = {
        **raw["engines"]["vllm"],
        "name": "LMDeploy",
        "aliases": ["lmdeploy"],
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw))
    record = decide_on(
        tmp_path, steady_traffic(), [sweep("lmdeploy", 5)], {}, decision={"catalog": str(path)}
    )
    assert record.recommendation.engine == "lmdeploy"
    assert record.catalog["source"] == str(path)


@pytest.mark.parametrize(
    ("gpus", "params", "layers", "tokens"),
    [
        (1, 8.03, 32, 450_000),  # Llama-3.1-8B, TP1: ≈450k
        (4, 70.6, 80, 470_000),  # Llama-3.1-70B, TP4: "≈470k"
        (8, 70.6, 80, 1_370_000),  # TP8: "≈1.37M"
    ],
)
def test_kv_cache_sizing_reproduces_engine_facts(
    gpus: int, params: float, layers: int, tokens: int
) -> None:
    sizing = KvCacheSizing(
        gpu_memory_gib=79.2,
        gpus_per_replica=gpus,
        memory_utilization=0.92,
        overhead_gib=3.0 if gpus == 1 else 4.0,
        model_params_billion=params,
        weight_bytes=2.0,
        layers=layers,
        kv_heads=8,
        head_dim=128,
        kv_bytes=2.0,
    )
    assert sizing.tokens_per_replica() == pytest.approx(tokens, rel=0.01)


def test_kv_cache_sizing_refuses_a_model_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="leave no memory for the KV cache"):
        KvCacheSizing(
            gpu_memory_gib=24.0,
            gpus_per_replica=1,
            memory_utilization=0.9,
            overhead_gib=2.0,
            model_params_billion=70.6,
            weight_bytes=2.0,
            layers=80,
            kv_heads=8,
            head_dim=128,
            kv_bytes=2.0,
        )
