"""The engine catalog is data validated on load (every fact with its own evidence date), parsed
once, and the engines named anywhere must be in it; the KV-cache sizing formula reproduces the
H100 figures of docs/decision-rules.md#kv-cache-sizing."""

from __future__ import annotations

from datetime import date
from functools import partial
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
    version_key,
)
from pipeline.decision.config import KvCacheSizing
from pipeline.errors import ConfigError
from pipeline.settings import load_yaml
from tests.decision_fixtures import decide_on as decide_drawing_figures
from tests.decision_fixtures import steady_traffic, sweep

# What these tests read is the decision, not the stages' figures, which took most of each
# scenario's time to draw.
decide_on = partial(decide_drawing_figures, figures=False)

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
    # No SGLang-vs-vLLM margin without a publication: only the dated vendor posts remain,
    # presented as they were published.
    figures = catalog.engines["sglang"].secondary_figures
    assert [f.condition for f in figures] == ["vendor-benchmark-2024-01", "vendor-benchmark-2024"]
    assert all(not f.estimate and f.shown() == f.claim for f in figures)


def test_every_fact_has_a_date_and_a_source() -> None:
    """Each fact of the bundled catalog rests on named sources and carries an evidence date,
    and every source it names says where it is and when it is from (or when it was read): an
    undated fact would count as the oldest evidence there is in every decision."""
    catalog = load_catalog()
    records = catalog.fact_records()
    assert len(records) > 100  # engines x features, hardware notes, CUDA, layers...
    undated = [r.key for r in records if r.evidence_date is None]
    unsourced = [r.key for r in records if not r.sources]
    assert undated == [] and unsourced == []
    for name in {s for r in records for s in r.sources}:
        source = catalog.sources[name]
        assert source.url and (source.date is not None or source.read is not None), name
        assert (source.date or source.read) <= catalog.as_of  # type: ignore[operator]
    assert catalog.as_of == date(2026, 12, 1)


def test_an_undated_fact_counts_as_the_oldest() -> None:
    facts = [
        Fact("engines.a.hardware", date(2024, 1, 1)),
        Fact("engines.b.status", None),
        Fact("engines.a.status", None),
    ]
    assert oldest_fact(facts) == Fact("engines.a.status", None)
    assert oldest_fact(facts[:1]) == facts[0] and oldest_fact([]) is None


def test_every_fact_carries_its_own_evidence_date() -> None:
    """Facts are dated by their own sources (TGI's snapshot of 2026-01-08, vLLM's wheel of
    2026-11-01, the AWS page on vLLM Neuron of 2026-09-01), and the catalog's as_of is no
    fact's date."""
    catalog = load_catalog()
    tgi, vllm = catalog.engines["tgi"], catalog.engines["vllm"]
    assert tgi.status.evidence_date == date(2026, 1, 8)
    assert vllm.support("lora").evidence_date == date(2026, 11, 1)
    assert vllm.hardware_notes["neuron"].evidence_date == date(2026, 9, 1)
    facts = catalog.facts_used(["tgi", "vllm"], ("lora",), ("neuron",))
    oldest = oldest_fact(facts)
    assert oldest is not None and (oldest.key, oldest.evidence_date) == (
        "engines.tgi.change",  # TGI's facts share one date: the first key breaks the tie
        date(2026, 1, 8),
    )
    keys = {f.key for f in facts}
    assert Fact("engines.vllm.features.lora", date(2026, 11, 1)) in facts
    assert "engines.vllm.features.tool_calls" not in keys  # not required
    # The notes on the team's hardware are used; the others are not.
    assert "engines.vllm.hardware_notes.neuron" in keys
    assert "engines.vllm.hardware_notes.intel-gpu" not in keys
    assert "engines.vllm.cuda[0]" in keys  # the CUDA release its latest version needs


def test_tensorrt_llm_has_one_backend_and_a_change_is_a_restart() -> None:
    """The TensorRT engine backend was removed (July 2026): PyTorch is the only one, a model
    change restarts the server, no build; the wait for a new architecture is said, not
    charged."""
    trt = load_catalog().engines["tensorrt-llm"]
    change = trt.change_cost()
    assert (change.kind, change.build_minutes) == ("restart", 0)
    assert {s.what for s in change.optional_steps} == {
        "quantisation step",
        "new-architecture support lag",
    }
    assert trt.backends == ("pytorch", "_autodeploy")
    removed = trt.removed_backends["tensorrt"]
    assert (removed.since, removed.replaced_by) == (date(2026, 7, 2), "pytorch")
    assert trt.migration_weeks() == 3
    assert "compiled" not in trt.design_bet.replace("compiled TensorRT engine path was removed", "")


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


def test_the_facts_of_december_2026() -> None:
    """vLLM on AWS Neuron (the vllm-neuron plugin, beta); vLLM's Intel GPU support is basic
    serving; SGLang after v0.5.19 needs CUDA 13; TGI on AMD is MI210/MI250 only; Ray Serve's
    SGLang support is in early development; Dynamo at 1.6.2 / 1.7.0; the serving features."""
    catalog = load_catalog()
    vllm, sglang, tgi = (catalog.engines[e] for e in ("vllm", "sglang", "tgi"))
    assert vllm.hardware["neuron"] == "plugin" and "beta" in vllm.hardware_notes["neuron"].note
    assert vllm.hardware_words("neuron").startswith("neuron (plugin; the vllm-project/vllm-neuron")
    assert vllm.hardware["intel-gpu"] == "partial"
    assert "basic model inference and serving" in vllm.hardware_notes["intel-gpu"].note
    need = sglang.cuda_for("0.5.20")
    assert need is not None and (need.min_cuda, need.min_driver) == ("13", "580")
    assert sglang.cuda_for("0.5.19") is None and sglang.current_cuda() == need
    assert vllm.current_cuda() is not None and vllm.current_cuda().min_cuda == "12"  # type: ignore[union-attr]
    assert tgi.hardware["amd"] == "partial" and tgi.hardware_notes["amd"].note == (
        "AMD Instinct MI210 and MI250 only"
    )
    assert catalog.layers["ray-serve"].engine_notes["sglang"].endswith("early development")
    assert "1.6.2" in catalog.layers["dynamo"].status.note
    assert "1.7.0" in catalog.layers["dynamo"].status.note
    serving = ("multi_node", "pd_disaggregation", "expert_parallelism", "kv_offload")
    assert set(serving) <= set(FEATURES)
    levels = {e: [catalog.engines[e].support(f).support for f in serving] for e in ENGINES}
    assert levels["vllm"] == levels["sglang"] == levels["tensorrt-llm"] == ["full"] * 4
    assert levels["ollama"] == levels["tgi"] == ["unsupported"] * 4
    assert levels["llama.cpp"] == ["limited", "unsupported", "unsupported", "limited"]


@pytest.mark.parametrize(
    ("version", "order"),
    [("0.5.19", -1), ("0.5.20", 0), ("0.5.23", 1), ("1.4.0rc1", 1), ("0.5.20rc2", -1)],
)
def test_versions_compare_as_releases(version: str, order: int) -> None:
    key, base = version_key(version), version_key("0.5.20")
    assert (key > base) - (key < base) == order
    assert version_key("1.4.0rc1") < version_key("1.4.0") < version_key("1.4.0.post1")
    assert version_key("b10488") > version_key("b9452")


def test_a_catalog_is_parsed_once_and_names_resolve_without_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 10,000-engine catalog was once parsed twice and every name lookup normalised
    every alias. Parses and normalisations are counted, not timed, so a few hundred engines
    show either (a lookup that scanned would normalise hundreds of aliases)."""
    raw = yaml.safe_load(_bundled_text())
    for i in range(200):
        raw["engines"][f"e{i}"] = {**raw["engines"]["vllm"], "name": f"E{i}", "aliases": [f"x{i}"]}
    path = tmp_path / "big.yaml"
    text = yaml.safe_dump(raw)
    path.write_text(text)
    parses = []
    monkeypatch.setattr(
        catalog_module, "load_yaml", lambda t, w, **k: parses.append(w) or load_yaml(t, w, **k)
    )
    first = load_catalog(path)
    assert load_catalog(path) is first and len(parses) == 1
    normalised = []
    real = catalog_module._normalised
    monkeypatch.setattr(catalog_module, "_normalised", lambda n: normalised.append(n) or real(n))
    assert [first.engine_key(f"X{i}") for i in (0, 199)] == ["e0", "e199"]
    assert len(normalised) == 2  # the name asked for, not the catalog's aliases
    path.write_text(text + "\n")  # changed bytes: parsed again
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
            "schema_version: 3\n",
            "schema_version: 1\n",
            "schema_version: a schema 1 catalog has no evidence dates: give every fact an "
            "evidence_date",
        ),
        (
            "schema_version: 3\n",
            "schema_version: 2\n",
            "schema_version: a schema 2 catalog predates per-fact sources, CUDA requirements",
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
            "engines.tgi.hardware.evidence_date 2027-01-08 is after the catalog's as_of "
            "2026-12-01: evidence cannot postdate the catalog",
        ),
        (
            "as_of: 2026-12-01\n\nsources:",
            "as_of: 2026-13-45\n\nsources:",
            "as_of: '2026-13-45' is not an ISO date",
        ),
        (
            'url: "https://docs.vllm.ai/en/latest/design/prefix_caching/", date: undated, '
            "read: 2026-11-30}",
            'url: "https://docs.vllm.ai/en/latest/design/prefix_caching/", date: undated}',
            "sources.Vd: a source without a date of its own needs the day it was read "
            "(read: YYYY-MM-DD)",
        ),
        (
            '        min_cuda: "13"\n        min_driver: "580"\n        note: "the CUDA 12',
            '        min_cuda: "thirteen"\n        min_driver: "580"\n        note: "the CUDA 12',
            "'thirteen' is not a CUDA version",
        ),
        (
            '      sglang: "community SGLang support is in early development"',
            '      tgi: "community SGLang support is in early development"',
            "engine_notes name engines the layer does not serve: ['tgi']",
        ),
        (
            "engines: [sglang, tensorrt-llm, vllm]",
            "engines: [sglang, lmdeploy]",
            "layers.dynamo names engines the catalog lacks: ['lmdeploy']",
        ),
        (
            "hardware_sources: [T]\n",
            "hardware_sources: [T, NOPE]\n",
            "engines.tensorrt-llm cites undefined sources ['NOPE']",
        ),
        (
            "      nvidia: full\n      amd: full\n      intel-gpu: partial\n      cpu: full\n      tpu",
            "      nvidia: full\n      amd: maybe\n      intel-gpu: partial\n      cpu: full\n      tpu",
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


_FIRST_FIGURE = (
    "        condition: vendor-benchmark-2024-01\n        margin: null\n        estimate: false\n"
)


def test_a_team_estimate_is_shown_as_one_with_what_would_confirm_it(tmp_path: Path) -> None:
    """A team catalog may keep a margin that is its own reading rather than a publication, but
    every output then says it is an estimate and what would confirm it; without that, the
    catalog is refused naming the figure."""
    estimate = _FIRST_FIGURE.replace("margin: null", "margin: 0.29").replace(
        "estimate: false", "estimate: true"
    )
    unconfirmed = _broken(tmp_path, _FIRST_FIGURE, estimate)
    with pytest.raises(ConfigError) as caught:
        load_catalog(unconfirmed)
    assert str(caught.value).startswith(f"{unconfirmed}: engines.sglang.secondary_figures[0]: ")
    assert "an estimated margin needs confirm_with: what would confirm it" in str(caught.value)
    confirm = "benchmark SGLang and vLLM on your own traffic"
    confirmed = _broken(tmp_path, _FIRST_FIGURE, estimate + f'        confirm_with: "{confirm}"\n')
    figure = load_catalog(confirmed).engines["sglang"].secondary_figures[0]
    assert figure.estimate and figure.shown() == (
        f"{figure.claim} (an estimate, not a published figure; {confirm})"
    )


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
