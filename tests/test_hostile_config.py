"""Hostile numbers in ``enginefit.yaml``: every number the configuration holds has a sane range,
checked when the configuration loads, so no extreme value (``1e308``, ``1e-300``, a million map
points) reaches the arithmetic of capacity, the decision or the what-if map."""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from pipeline.cli import main as enginefit
from pipeline.config import _File, config_from_mapping
from pipeline.errors import ConfigError
from pipeline.settings import REMOVED_KEYS
from tests.conftest import REPO

# A path step that is a key of a mapping field (a scenario's name, a GPU type) or an item of a
# list field.
KEY = "{}"
ITEM = "[]"


def _numbers(annotation: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], type]]:
    """Every int or float leaf the configuration model holds, as its path and type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            yield from _numbers(field.annotation, (*path, name))
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _numbers(arg, path)
    elif origin is typing.Annotated:
        yield from _numbers(args[0], path)
    elif origin is tuple:
        yield from _numbers(args[0], (*path, ITEM))
    elif origin is dict:
        yield from _numbers(args[1], (*path, KEY))
    elif annotation in (int, float):
        yield path, annotation


NUMBERS = sorted(set(_numbers(_File, ())), key=lambda leaf: leaf[0])
# A value each mapping's key takes (a name the catalog knows where it must).
KEYS = {"scenarios": "s", "migration_engineer_weeks": "vllm", "gpu_hour_usd": "H100"}


def bundled() -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    raw["workload"]["traces"] = [{"path": str(REPO / "traces"), "format": "auto"}]
    raw["bench"]["results"] = []
    return dict(raw)


def with_value(path: tuple[str, ...], value: object) -> tuple[dict[str, Any], str]:
    """The bundled configuration with the number at ``path`` set to ``value``, and the dotted
    key an error must name."""
    raw = bundled()
    node: Any = raw
    dotted = ""
    steps = list(path)
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        nxt = steps[i + 1] if not last else None
        if step == ITEM:
            node.clear()
            node.append(value)
            dotted += "[0]"
            break
        if step == KEY:
            name = KEYS[steps[i - 1]]
            node.clear()
            if last:
                node[name] = value
            else:
                node[name] = {}
                node = node[name]
            dotted += f".{name}"
            continue
        dotted += f".{step}" if dotted else step
        if path[:2] == ("whatif", "map") and step == "axes":
            axis = copy.deepcopy(node["axes"]["gpu_price"])
            axis[steps[i + 2]] = value
            node["axes"] = {"gpu_price": axis}
            dotted += f".gpu_price.{steps[i + 2]}"
            break
        if last:
            node[step] = value
        elif nxt == ITEM:
            node[step] = []
            node = node[step]
        elif nxt == KEY:
            node[step] = {}
            node = node[step]
        else:
            default = _defaults_at(path[: i + 1])
            if node.get(step) is None:
                node[step] = default
            node = node[step]
    return raw, dotted


def _defaults_at(path: tuple[str, ...]) -> Any:
    """The defaults' mapping at ``path`` (an optional section the bundled file leaves null
    takes the shape section's latency model)."""
    from pipeline.settings import default_mapping

    node: Any = default_mapping()
    for step in path:
        node = node.get(step) if isinstance(node, dict) else None
    if node is None and path[-1] == "latency_model":
        return dict(default_mapping()["shape"]["latency_model"])
    return copy.deepcopy(node) if node is not None else {}


def test_the_walk_reaches_the_numbers_the_findings_name() -> None:
    paths = {path for path, _ in NUMBERS}
    for path in [
        ("capacity", "headroom"),
        ("requirements", "kv_cache", "gpu_memory_gib"),
        ("whatif", "scenarios", KEY, "traffic_scale"),
        ("whatif", "scenarios", KEY, "gpu_price_factor"),
        ("whatif", "scenarios", KEY, "gpu_hour_usd", KEY),
        ("whatif", "map", "x", "start"),
        ("whatif", "map", "x", "points"),
        ("whatif", "map", "axes", KEY, "stop"),
        ("simulation", "replicas", ITEM),
    ]:
        assert path in paths
    assert len(NUMBERS) > 60


@pytest.mark.parametrize(
    ("path", "kind"), NUMBERS, ids=lambda p: ".".join(p) if isinstance(p, tuple) else ""
)
def test_every_configuration_number_is_bounded_above_where_it_loads(
    path: tuple[str, ...], kind: type
) -> None:
    huge = 10**30 if kind is int else 1.0e308
    raw, dotted = with_value(path, huge)
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    message = str(caught.value)
    assert message.startswith("/cfg/enginefit.yaml: "), message
    # A list's own parser (rates, block sizes) names the list.
    assert dotted.removesuffix("[0]") in message, message
    assert "\n" not in message, message


def test_every_configuration_number_walked_takes_the_bundled_value_back() -> None:
    """The harness itself: the bundled file with the walk's edits at a sane value loads (so
    the refusals above are the bound's, not a broken mapping's)."""
    sane: dict[type, tuple[object, ...]] = {int: (2, 5, 500), float: (0.3, 2.0, 100.0)}
    for path, kind in NUMBERS:
        if path[:2] == ("whatif", "map") and path[-1] in ("start", "stop"):
            continue  # start and stop are only sane together
        loaded = []
        for value in sane[kind]:
            raw, _ = with_value(path, value)
            try:
                config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
            except ConfigError:
                continue
            loaded.append(value)
        assert loaded, path


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        # An overflow of polars' integer replica count once divided by.
        (
            {"capacity": {"headroom": 1.0e-300}},
            "capacity.headroom",
            "Input should be greater than or equal to 0.05",
        ),
        (
            {"requirements": {"kv_cache": {"gpu_memory_gib": 1.0e308}}},
            "requirements.kv_cache.gpu_memory_gib",
            "Input should be less than or equal to 4096",
        ),
        (
            {"requirements": {"kv_cache": {"kv_bytes": 1.0e-300}}},
            "requirements.kv_cache.kv_bytes",
            "Input should be greater than or equal to 0.125",
        ),
        (
            {"whatif": {"scenarios": {"s": {"traffic_scale": 1.0e300}}}},
            "whatif.scenarios.s.traffic_scale",
            "Input should be less than or equal to 1000",
        ),
        (
            {"whatif": {"scenarios": {"s": {"gpu_price_factor": 1.0e308}}}},
            "whatif.scenarios.s.gpu_price_factor",
            "Input should be less than or equal to 1000",
        ),
        (
            {"whatif": {"scenarios": {"s": {"gpu_hour_usd": {"H100": 1.0e308}}}}},
            "whatif.scenarios.s.gpu_hour_usd.H100",
            "Input should be less than or equal to 1000",
        ),
        (
            {"whatif": {"map": {"x": {"start": 1.0e-300, "stop": 1.0e300}}}},
            "whatif.map.x.start",
            "the traffic axis runs from 0.001 to 1000",
        ),
        (
            {"whatif": {"map": {"x": {"points": 1_000_000}}}},
            "whatif.map.x.points",
            "Input should be less than or equal to 100",
        ),
    ],
)
def test_the_findings_extreme_numbers_are_refused_when_the_configuration_loads(
    section: dict[str, Any], value: str, message: str
) -> None:
    raw = bundled()
    for name, part in section.items():
        raw[name] = _deep_merge(raw.get(name) or {}, part)
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    text = str(caught.value)
    assert text.startswith("/cfg/enginefit.yaml: "), text
    assert f"{value}: {message}" in text, text


def _deep_merge(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, item in part.items():
        if isinstance(item, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], item)
        else:
            out[key] = item
    return out


def test_more_scenarios_than_the_memo_holds_are_refused() -> None:
    raw = bundled()
    raw["whatif"] = {"scenarios": {f"s{i}": {"traffic_scale": 2} for i in range(101)}}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value).startswith(
        "/cfg/enginefit.yaml: whatif.scenarios: Dictionary should have at most 100 items"
    ), caught.value


@pytest.mark.parametrize("name", ["", "  ", "a\nb"])
def test_a_scenario_without_a_printable_name_is_refused(name: str) -> None:
    raw = bundled()
    raw["whatif"] = {"scenarios": {name: {"traffic_scale": 2}}}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value) == (
        f"/cfg/enginefit.yaml: whatif.scenarios: the key {name!r}: a scenario's name is one "
        f"printable line of 1 to 80 characters (got {name!r})"
    )


def test_a_scenario_price_for_a_nameless_gpu_is_refused() -> None:
    raw = bundled()
    raw["whatif"] = {"scenarios": {"s": {"gpu_hour_usd": {"": 2}}}}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value).startswith(
        "/cfg/enginefit.yaml: whatif.scenarios.s.gpu_hour_usd: the key '': String should have "
        "at least 1 character (got '')"
    ), caught.value


@pytest.mark.parametrize(
    ("prices", "key"),
    [
        ({"H100": 1.0e308}, "bench.prices.gpu_hour_usd.H100"),
        ({"default": 1001}, "bench.prices.gpu_hour_usd.default"),
        (5000, "bench.prices.gpu_hour_usd"),
    ],
)
def test_a_price_wider_than_any_gpu_is_refused(prices: object, key: str) -> None:
    raw = bundled()
    raw["bench"]["prices"] = {"gpu_hour_usd": prices}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value).startswith(
        f"/cfg/enginefit.yaml: {key}: a price is 0 to 1000 $ per GPU-hour"
    ), caught.value


def test_a_latency_limit_past_an_hour_is_refused() -> None:
    raw = bundled()
    raw["bench"]["slo"] = {"ttft_p95_ms": 1.0e308}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value) == (
        "/cfg/enginefit.yaml: bench.slo.ttft_p95_ms: a latency limit is at most 3,600,000 ms "
        "(an hour), got 1e+308"
    )


def test_the_command_says_the_key_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = bundled()
    raw["capacity"] = {"headroom": 1.0e-300}
    path = tmp_path / "enginefit.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert enginefit(["config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        f"enginefit: error: {path}: capacity.headroom: Input should be greater than or equal "
        "to 0.05 (got 1e-300)"
    ]


def test_the_documented_rules_name_the_largest_map_and_the_widest_price() -> None:
    text = (REPO / "pipeline" / "defaults.yaml").read_text()
    assert "100 x 100 = 10,000 cells" in text
    assert "0 to 1000 $ per GPU-hour" in text
    assert "at most 100 scenarios" in text


def test_a_removed_key_says_what_replaced_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = bundled()
    raw["capacity"] = {"far_ratio": 4.0}
    path = tmp_path / "enginefit.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert enginefit(["config", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"enginefit: error: {path}: unknown key capacity.far_ratio: removed; the capacity "
        "stage's transfer of a benchmark to the workload's mix is provisional past the one "
        "transfer distance the bench stage's length check also uses, 2x either way "
        "(docs/decision-rules.md#transferability), not a setting of its own; delete it"
    ]


@pytest.mark.parametrize("dotted", sorted(REMOVED_KEYS))
def test_every_removed_key_is_gone_and_said_so(dotted: str) -> None:
    """Each key of the table is one the configuration no longer has (the table never hides a
    live key), and setting it is refused with the note, never a "did you mean"."""
    section, key = dotted.split(".")
    annotation = _File.model_fields[section].annotation
    (model,) = (
        arg
        for arg in (annotation, *typing.get_args(annotation))
        if isinstance(arg, type) and issubclass(arg, BaseModel)
    )
    assert key not in model.model_fields
    raw = bundled()
    raw[section] = {**(raw.get(section) or {}), key: 1}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value) == (
        f"/cfg/enginefit.yaml: unknown key {dotted}: removed; {REMOVED_KEYS[dotted]}; delete it"
    )


@pytest.mark.parametrize("value", [1, [1], "x"])
def test_an_unknown_top_level_key_is_said_to_be_unknown_whatever_its_value(value: object) -> None:
    """Not "section 'a' must be a mapping": that is said of a section only."""
    raw = bundled()
    raw["a"] = value
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value) == (
        "/cfg/enginefit.yaml: unknown key a; known keys here: bench, capacity, decision, "
        "loadtest, paths, prefix, report, requirements, shape, simulation, whatif, workload"
    )
    raw = bundled()
    raw["shape"] = value
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source=Path("/cfg/enginefit.yaml"))
    assert str(caught.value) == "/cfg/enginefit.yaml: section 'shape' must be a mapping"
