"""Hostile benchmark results: a point whose latency no run can produce (a p95 TTFT of ``inf``)
is unknown, and every sentence about the sweep agrees with the capacity table. Extreme but
finite numbers (a load of 1e308 req/s, a send rate of 1e-300) print no numpy warning: a person's
stderr holds the command's own lines only. Bench outputs computed from other inputs than the
configuration names now are never reused silently."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from perf.capacity import LLAMA_8B
from pipeline import results
from pipeline.bench import stage as bench_stage
from pipeline.bench.readers import read_bench_files
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.cli import main as enginefit
from pipeline.config import default_config, load_config
from pipeline.layout import WorkloadLayout
from pipeline.unknown import Unknown
from tests.test_bench_cli import run_json as bench_json
from tests.test_bench_hostile import vllm_point, with_bench_section, write_result


def test_an_infinite_ttft_above_the_last_pass_never_raises_the_lower_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "r"
    for i, (rate, ttft) in enumerate([(1.0, 80.0), (8.0, math.inf)]):
        point = vllm_point(
            request_rate=rate,
            duration=200 / rate,
            request_throughput=rate * 0.995,
            output_throughput=rate * 99.5,
            total_token_throughput=rate * 199,
            p95_ttft_ms=ttft,
        )
        write_result(folder, point, name=f"run{i}.json")
    payload = bench_json(capsys, str(folder), "--gpu-hour-usd", "2")
    (cap,) = payload["capacity"]
    assert cap["capacity_status"] == "not_bracketed"
    assert cap["capacity_load"] == 1.0
    assert cap["note"].split("; ") == [
        "no failure seen: capacity is at least 1",
        "unknown points at 8 above the capacity: the true capacity may be higher",
    ]


def _warnings_while(run: Callable[[], object]) -> list[str]:
    """What ``run`` warned, each as its category and text (pytest would otherwise keep them
    from the stderr a person sees)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def test_a_load_of_1e308_draws_its_figures_without_a_numpy_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Matplotlib's log scale and tick steps overflow on such a point; numpy said so on stderr."""
    folder = tmp_path / "r"
    write_result(folder, vllm_point(request_rate=1.0e308, request_throughput=1.0e308), "a.json")
    write_result(folder, vllm_point(p95_ttft_ms=1.0e308, p99_itl_ms=1.0e308), "b.json")
    argv = ["bench", str(folder), "--gpu-hour-usd", "2", "--out", str(tmp_path / "out")]
    assert _warnings_while(lambda: enginefit(argv)) == []
    assert "Warning" not in capsys.readouterr().err
    figure = tmp_path / "out" / "bench" / "latency_vs_load.svg"
    assert figure.read_bytes().startswith(b"<?xml")


def test_a_send_rate_of_1e_300_is_not_fitted_and_warns_nothing(tmp_path: Path) -> None:
    """Its replay's arrivals (a mean gap of 1e300 s) overflowed, and numpy said so on stderr."""
    for i, rate in enumerate([1.0e-300, 2.0e-300]):
        point = vllm_point(request_rate=rate, request_throughput=rate)
        write_result(tmp_path / "r", point, name=f"run{i}.json")
    points = read_bench_files(tmp_path / "r").load_points
    models: list[object] = []

    def fit() -> None:
        models.append(
            fit_serving_model(
                points,
                None,
                deployment_of(points.row(0, named=True)),
                config=default_config().capacity,
                model_shape=LLAMA_8B,
            )
        )

    assert _warnings_while(fit) == []
    (model,) = models
    assert isinstance(model, Unknown)
    first = str(points.get_column("point_id")[0])
    assert (
        f"{first}: no finite send rate of at least 1e-06 req/s (closed-loop or burst points "
        "are not fitted)"
    ) in model.reason


def _stale_line(capsys: pytest.CaptureFixture[str], config: Path) -> str:
    """The one error line of ``enginefit capacity`` refusing stale bench outputs (exit 2)."""
    assert enginefit(["capacity", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def _benched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: str = ""
) -> tuple[Path, Path, WorkloadLayout]:
    """A result folder, a configuration naming it (with ``settings`` in its bench section) and
    its workload folder, after `enginefit bench`."""
    folder = tmp_path / "results"
    write_result(folder, vllm_point(), "a.json")
    config = with_bench_section(tmp_path, f"{{results: [{folder}], {settings}}}")
    assert enginefit(["bench", "--config", str(config)]) == 0
    capsys.readouterr()
    return folder, config, load_config(config).layout()


def test_bench_outputs_computed_from_other_inputs_are_never_reused_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bench outputs record what they were computed from (the bench section and every
    result file, by digest): a result file changed, added or removed, or a setting changed,
    since `enginefit bench` ran is one line naming the stale output and what rewrites it."""
    folder, config, layout = _benched(tmp_path, capsys, "prices: {gpu_hour_usd: 2}")
    bench_stage.require_current(layout, load_config(config).bench)  # fits: no error
    analysis = layout.bench.analysis
    rerun = "re-run `enginefit bench --config FILE` (or materialise `bench_analysis`)"

    def said(change: str) -> str:
        return (
            f"enginefit: error: {analysis}: computed from other inputs than bench.results and "
            f"the bench section name now ({change}); {rerun}"
        )

    write_result(folder, vllm_point(p95_ttft_ms=90.0), "a.json")
    assert _stale_line(capsys, config) == said("bench.results[0]/a.json changed")
    write_result(folder, vllm_point(), "a.json")  # as it was: fits again
    write_result(folder, vllm_point(request_rate=4.0), "b.json")
    assert _stale_line(capsys, config) == said("bench.results[0]/b.json is new")
    (folder / "b.json").unlink()
    config.write_text(config.read_text().replace("gpu_hour_usd: 2", "gpu_hour_usd: 3"))
    assert _stale_line(capsys, config) == said("the bench section changed")
    assert enginefit(["bench", "--config", str(config)]) == 0
    bench_stage.require_current(layout, load_config(config).bench)


def test_bench_outputs_that_record_no_inputs_are_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written by an enginefit that did not record its bench inputs: they cannot be matched
    to the configuration, so they are not reused either."""
    _, config, layout = _benched(tmp_path, capsys)
    for result in (results.LOAD_POINTS, results.BENCH):
        written = json.loads(result.seal_path(layout).read_text())["sha256"]
        result.seal(layout, [layout.bench.dir / name for name in written])
    assert _stale_line(capsys, config) == (
        f"enginefit: error: {layout.bench.analysis}: computed from other inputs than "
        "bench.results and the bench section name now (it records no inputs: an earlier "
        "enginefit wrote it); re-run `enginefit bench --config FILE` (or materialise "
        "`bench_analysis`)"
    )
