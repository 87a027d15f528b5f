"""The load-test stage: read the workload → plan each rate → run it against the endpoint →
write the results where ``enginefit bench`` reads them.

A run writes one new folder (never an existing one; :class:`pipeline.layout.LoadtestRunPaths`)
holding:

``vllm-<rate>qps.json``      per completed rate, a ``vllm bench serve``-compatible result with
                             per-request arrays (warm-up excluded), so any tool reads it;
``enginefit-bench.yaml``     the sidecar manifest from the flags (engine, GPUs, price, date,
                             model, ``workload`` and ``dataset: enginefit-trace``, which the
                             validity checks recognise as the team's own traffic);
``loadtest-requests.parquet`` every planned send, warm-up, dropped and interrupted ones
                             included (:data:`pipeline.loadtest.compute.REQUEST_SCHEMA`);
``loadtest-points.parquet``  the rate files read back through the bench readers: the
                             project's normalised load points;
``loadtest-run.json``        settings, deployment, workload and each rate's summary.

This module is the shell: :func:`run` holds the network I/O and the signal handling, :func:`write`
the files; what they call is pure (:mod:`pipeline.loadtest.compute`: URLs, plans, request
bodies, outcome tables; :mod:`pipeline.loadtest.result`: the result and its records).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import polars as pl
import yaml

from pipeline.bench.readers import read_bench_files
from pipeline.errors import ConfigError, InputFormatError
from pipeline.layout import LoadtestRunPaths
from pipeline.loadtest.client import ClientOptions, Outcome, run_schedule
from pipeline.loadtest.compute import (
    REQUEST_SCHEMA,
    LoadtestInputs,
    bodies_for,
    endpoint_url,
    plan_rates,
    public_url,
    rate_summary,
    request_frame,
    vllm_burstiness,
    vllm_result,
)
from pipeline.loadtest.config import LoadtestConfig
from pipeline.loadtest.plan import (
    RatePlan,
    rows_needed,
    trace_sample,
)
from pipeline.loadtest.result import Deployment, LoadtestResult, RateRun, manifest, run_record
from pipeline.store import json_bytes, write_bytes_atomic, write_parquet_atomic

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# ------------------------------------------------------------------------------- inputs


def read_inputs(
    requests: pl.LazyFrame, settings: LoadtestConfig, *, label: str, name: str | None
) -> LoadtestInputs:
    """The first trace requests a run can replay (never the whole of a large trace)."""
    limit = rows_needed(max(settings.rates), settings.warmup + settings.duration)
    return LoadtestInputs(trace_sample(requests, limit=limit), label, name)


# ---------------------------------------------------------------------------------- run


ProgressFactory = Callable[[RatePlan], Callable[[str], None]]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # import here: optional, a faster event loop where installed

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


async def _check_endpoint(url: str, model: str, options: ClientOptions) -> str | None:
    """A warning when the server answers ``/models`` without the model; raises ConfigError when
    the server cannot be reached at all, or accepts the connection and does not answer."""

    base = url.rsplit("/chat/completions", 1)[0].rsplit("/completions", 1)[0]
    where = f"--endpoint {public_url(url)}"
    timeout = aiohttp.ClientTimeout(
        total=options.request_timeout_s,
        sock_connect=options.connect_timeout_s,
        sock_read=options.read_timeout_s,
    )
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(base + "/models", headers=options.headers) as resp,
        ):
            if resp.status in (401, 403):
                raise ConfigError(
                    f"{where}: the server refused the token (HTTP "
                    f"{resp.status}); set $OPENAI_API_KEY or name the variable with --api-key-env"
                )
            if resp.status != 200:
                return None  # some servers have no /models; the run itself will tell
            payload = await resp.json(content_type=None)
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConfigError(
            f"{where}: no connection within {options.connect_timeout_s:g} s (--connect-timeout, "
            "loadtest.connect_timeout); is the server running and reachable there?"
        ) from exc
    except TimeoutError as exc:  # connected: the answer is what did not come
        seconds, flag, key = (
            (options.read_timeout_s, "--read-timeout", "read_timeout")
            if isinstance(exc, aiohttp.SocketTimeoutError)
            else (options.request_timeout_s, "--request-timeout", "request_timeout")
        )
        raise ConfigError(
            f"{where}: the server accepted the connection but did not answer GET "
            f"{public_url(base)}/models within {seconds:g} s ({flag}, loadtest.{key}); is it "
            f"stuck, or still loading the model? Raise {flag} to wait longer"
        ) from exc
    except aiohttp.ClientConnectorError as exc:
        raise ConfigError(
            f"{where}: cannot reach the server ({exc.__class__.__name__}: "
            f"{exc}); is it running and listening there?"
        ) from exc
    except (aiohttp.ClientError, ValueError):
        return None
    models = (
        [m.get("id") for m in payload.get("data", []) if isinstance(m, dict)]
        if isinstance(payload, dict)
        else []
    )
    if models and model not in models:
        return f"the server lists models {models}, not {model!r}: requests may fail"
    return None


def run(
    workload: LoadtestInputs,
    settings: LoadtestConfig,
    deployment: Deployment,
    *,
    headers: dict[str, str] | None = None,
    progress: ProgressFactory | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> LoadtestResult:
    """Every rate in turn against ``settings.endpoint`` (Ctrl-C: stop, keep what was measured)."""
    if settings.endpoint is None:
        raise ConfigError("no endpoint: pass --endpoint URL (or set loadtest.endpoint)")
    if settings.model is None:
        raise ConfigError("no model: pass --model NAME (the name the server serves it under)")
    url = endpoint_url(settings.endpoint, settings.api)
    model = settings.model
    options = ClientOptions(
        url=url,
        api=settings.api,
        connect_timeout_s=settings.connect_timeout,
        read_timeout_s=settings.read_timeout,
        request_timeout_s=settings.request_timeout,
        max_in_flight=settings.max_in_flight,
        on_cap=settings.on_cap,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    plans = plan_rates(workload.trace, settings)
    started = dt.datetime.now(dt.UTC)
    runs: list[RateRun] = []

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def interrupt(name: str) -> None:
            if stop.is_set():
                raise KeyboardInterrupt  # a second signal: give up at once
            stop.set()
            print(
                f"\n{name}: stopping, writing what was measured (Ctrl-C again to abort)",
                file=sys.stderr,
            )

        # Ctrl-C, and the SIGTERM of `timeout`, a CI runner or a pod's shutdown, alike.
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, interrupt, signal.Signals(signum).name)
        try:
            problem = await _check_endpoint(url, model, options)
            if problem:
                warn(problem)
            for plan in plans:
                rate_started = dt.datetime.now(dt.UTC)
                outcomes: list[Outcome] = await run_schedule(
                    plan.offsets_s.tolist(),
                    bodies_for(workload.trace, plan, settings, model),
                    options,
                    on_progress=progress(plan) if progress else None,
                    stop=stop,
                )
                frame = request_frame(plan, workload.trace, outcomes)
                runs.append(RateRun(plan, frame, rate_started, stop.is_set()))
                if stop.is_set():
                    return True
            return False
        finally:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        interrupted = runner.run(main())
    return LoadtestResult(
        settings, deployment, workload, runs, started, dt.datetime.now(dt.UTC), interrupted
    )


# -------------------------------------------------------------------------------- write


def run_folder(out_dir: Path, deployment: Deployment, started: dt.datetime) -> LoadtestRunPaths:
    """``<out_dir>/loadtest-<engine>-<UTC start>``: one new folder per run."""
    safe = "".join(c if c.isalnum() or c in "-._" else "-" for c in deployment.engine)
    base = out_dir / f"loadtest-{safe}-{started.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = base, 1
    while candidate.exists():  # two runs in one second: never the same folder
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return LoadtestRunPaths(candidate)


def check_new_folder(folder: Path) -> None:
    """A run writes only into a new or empty folder, never over anything."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InputFormatError(
            f"{folder}: already exists and is not empty; a load test writes only into a new "
            "folder (choose another --out DIR)"
        )


def claim_folder(paths: LoadtestRunPaths) -> None:
    """Create a run's folder (new or empty) and mark it as the load test's."""
    folder = paths.root
    check_new_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths.marker.write_text("written by enginefit loadtest\n", encoding="utf-8")


def write(run: LoadtestResult, paths: LoadtestRunPaths) -> dict[str, Any]:
    """Write a run into its new folder; returns the run record (also written)."""
    claim_folder(paths)
    header = "# Written by enginefit loadtest from its flags.\n"
    write_bytes_atomic(
        paths.manifest, (header + yaml.safe_dump(manifest(run), sort_keys=True)).encode()
    )
    summaries: list[dict[str, Any]] = []
    written: list[Path] = []
    for rate in run.rates:
        summaries.append(rate_summary(rate.requests, rate.plan, interrupted=rate.interrupted))
        if rate.interrupted or rate.requests.filter(~pl.col("warmup")).height == 0:
            continue  # a cut-short rate is not a load point; its sends stay in the table
        result = vllm_result(
            rate.requests,
            model=run.settings.model or "",
            api=run.settings.api,
            rate_rps=rate.plan.rate_rps,
            burstiness=vllm_burstiness(
                run.settings.arrivals, run.settings.burstiness, rate.plan.arrival_cv
            ),
            max_in_flight=run.settings.max_in_flight,
            started=rate.started,
        )
        target = paths.rate_result(rate.plan.rate_rps)
        write_bytes_atomic(target, json_bytes(result))
        written.append(target)
    frames = [rate.requests for rate in run.rates]
    write_parquet_atomic(pl.concat(frames) if frames else REQUEST_SCHEMA.to_frame(), paths.requests)
    if written:
        write_parquet_atomic(read_bench_files(written).load_points, paths.points)
    record = run_record(run, summaries, [p.name for p in written])
    write_bytes_atomic(paths.record, json_bytes(record))
    return record
