"""The engine catalog is data validated on load (every fact with its own evidence date), parsed
once, and the engines named anywhere must be in it; the KV-cache sizing formula reproduces the
H100 figures of docs/decision-rules.md#kv-cache-sizing."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import get_args

import pytest
import yaml

from pipeline.config import config_from_mapping
from pipeline.decision import catalog as catalog_module
from pipeline.decision.catalog import (
    FEATURES,
    Fact,
    HardwareTarget,
    _bundled_text,
    load_catalog,
    oldest_fact,
)
from pipeline.decision.config import KvCacheSizing
from pipeline.errors import ConfigError
from pipeline.settings import load_yaml
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
    # The team's SGLang-vs-vLLM margins: kept, but marked estimates (no primary source).
    figures = {f.condition: f for f in catalog.engines["sglang"].secondary_figures}
    assert figures["shared-prefix"].margin == 0.29 and figures["no-sharing"].margin == 0.0
    assert all(figures[c].estimate for c in ("shared-prefix", "very-large-models", "no-sharing"))
    assert figures["shared-prefix"].shown() == (
        "about 29% ahead of vLLM on shared-prefix workloads (estimate: no primary source)"
    )
    assert figures["vendor-benchmark-2024"].shown() == figures["vendor-benchmark-2024"].claim


def test_every_fact_carries_its_own_evidence_date() -> None:
    """Facts are dated by their own sources (TGI's snapshot of 2026-01-08, vLLM's wheel of
    2026-11-01), undated ones say so, and the catalog's as_of is no fact's date."""
    catalog = load_catalog()
    tgi, vllm = catalog.engines["tgi"], catalog.engines["vllm"]
    assert tgi.status.evidence_date == date(2026, 1, 8)
    assert vllm.support("lora").evidence_date == date(2026, 11, 1)
    assert vllm.migration_engineer_weeks.evidence_date is None  # a team estimate: undated
    trt = catalog.engines["tensorrt-llm"].change_by_backend
    assert trt is not None and trt["pytorch"].evidence_date == date(2025, 6, 18)
    dates = {d for key in catalog.engines for _, d in catalog.engines[key].dated_facts(key)}
    assert len(dates - {None}) > 3 and None in dates
    assert catalog.as_of == date(2026, 11, 30)
    facts = catalog.facts_used(["tgi", "vllm"], ("lora",), {})
    oldest = oldest_fact(facts)
    assert oldest is not None and (oldest.key, oldest.evidence_date) == (
        "engines.tgi.change",  # TGI's facts share one date: the first key breaks the tie
        date(2026, 1, 8),
    )
    assert Fact("engines.vllm.features.lora", date(2026, 11, 1)) in facts
    assert "engines.vllm.features.tool_calls" not in {f.key for f in facts}  # not required


def test_tensorrt_llm_change_cost_follows_its_backend() -> None:
    """PyTorch (trtllm-serve's default since 1.0): a restart, no build; TensorRT: a build per
    change; no backend named: unknown, never assumed."""
    trt = load_catalog().engines["tensorrt-llm"]
    pytorch, tensorrt = trt.change_cost("pytorch"), trt.change_cost("tensorrt")
    assert pytorch is not None and (pytorch.kind, pytorch.build_minutes) == ("restart", 0)
    assert {s.what for s in pytorch.optional_steps} == {
        "quantisation step",
        "new-architecture support lag",
    }
    assert tensorrt is not None and (tensorrt.kind, tensorrt.build_minutes) == ("rebuild", 30)
    assert trt.change_cost(None) is None and trt.default_backend == "pytorch"
    assert (trt.migration_weeks("pytorch"), trt.migration_weeks(None)) == (3, 6)


def test_corrected_catalog_facts() -> None:
    catalog = load_catalog()
    llama = catalog.engines["llama.cpp"].support("long_context")
    assert llama.support == "full" and "one request can use the whole context" in llama.note
    trt = catalog.engines["tensorrt-llm"]
    assert trt.support("lora").support == "limited" and "CUDA graphs" in trt.support("lora").note
    assert "off by default" in trt.support("long_context").note
    assert "prototype" in trt.support("tool_calls").note
    assert catalog.engines["sglang"].hardware["tpu"] == "plugin"
    assert "tpu" not in catalog.engines["tgi"].hardware
    kserve = catalog.layers["kserve"]
    assert "prefix_aware_routing" in kserve.adds and kserve.prefix_routing != "none"
    assert catalog.engines["ollama"].support("speculative_decoding").support == "limited"
    assert "speculative_decoding" in FEATURES


def test_a_catalog_is_parsed_once_and_names_resolve_without_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 10,000-engine catalog was once parsed twice and every name lookup normalised
    every alias. Parses and normalisations are counted, not timed."""
    raw = yaml.safe_load(_bundled_text())
    for i in range(2_000):
        raw["engines"][f"e{i}"] = {**raw["engines"]["vllm"], "name": f"E{i}", "aliases": [f"x{i}"]}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw))
    parses = []
    monkeypatch.setattr(
        catalog_module, "load_yaml", lambda t, w, **k: parses.append(w) or load_yaml(t, w, **k)
    )
    first = load_catalog(path)
    assert load_catalog(path) is first and len(parses) == 1
    normalised = []
    real = catalog_module._normalised
    monkeypatch.setattr(catalog_module, "_normalised", lambda n: normalised.append(n) or real(n))
    assert [first.engine_key(f"X{i}") for i in (0, 1_999)] == ["e0", "e1999"]
    assert len(normalised) == 2  # the name asked for, not the catalog's aliases
    path.write_text(yaml.safe_dump(raw) + "\n")  # changed bytes: parsed again
    assert load_catalog(path) is not first and len(parses) == 2


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
            "schema_version: 2\n",
            "schema_version: 1\n",
            "schema_version: a schema 1 catalog has no evidence dates: give every fact an "
            "evidence_date",
        ),
        (
            "    name: vLLM\n",
            "    name: vLLM\n    name: vLLM 2\n",
            "column 5: duplicate key 'name'",  # its line and column, from libyaml's parser
        ),
        (
            "    licence: Apache-2.0\n\n  sglang:",
            "\n  sglang:",
            "engines.vllm.licence is required",
        ),
        (
            'lora: {support: full, note: "multi-LoRA; runtime load/unload", evidence_date: 2026-11-01}',
            'lora: {support: full, note: "multi-LoRA; runtime load/unload", evidence_date: 2026-11-31}',
            "engines.vllm.features.lora.evidence_date: '2026-11-31' is neither an ISO date "
            "(YYYY-MM-DD) nor 'undated'",
        ),
        (
            'lora: {support: full, note: "multi-LoRA; runtime load/unload", evidence_date: 2026-11-01}',
            'lora: {support: full, note: "multi-LoRA; runtime load/unload"}',
            "engines.vllm.features.lora.evidence_date is required",
        ),
        (
            "    hardware_evidence_date: 2026-01-08\n",
            "    hardware_evidence_date: 2027-01-08\n",
            "engines.tgi.hardware_evidence_date 2027-01-08 is after the catalog's as_of "
            "2026-11-30: evidence cannot postdate the catalog",
        ),
        (
            "migration_engineer_weeks: {value: 6, estimate: true, evidence_date: undated, "
            "by_backend: {pytorch: 3, tensorrt: 6}}",
            "migration_engineer_weeks: {value: 6, estimate: true, evidence_date: undated, "
            "by_backend: {pytorch: 3}}",
            "migration_engineer_weeks.by_backend must name change_by_backend's backends "
            "['pytorch', 'tensorrt']; got ['pytorch']",
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
