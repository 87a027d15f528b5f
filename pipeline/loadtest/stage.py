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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import polars as pl
import yaml

from pipeline.bench.manifest import BenchManifest
from pipeline.bench.readers import read_bench_files
from pipeline.errors import ConfigError, InputFormatError
from pipeline.layout import LoadtestRunPaths
from pipeline.loadtest.client import ClientOptions, Outcome, run_schedule
from pipeline.loadtest.compute import (
    REQUEST_SCHEMA,
    rate_summary,
    request_frame,
    vllm_burstiness,
    vllm_result,
)
from pipeline.loadtest.config import LoadtestSettings
from pipeline.loadtest.plan import (
    RatePlan,
    TraceSample,
    plan_rate,
    prompt_text,
    prompt_words,
    rows_needed,
    trace_sample,
)
from pipeline.store import json_bytes, write_bytes_atomic, write_parquet_atomic

DATASET = "enginefit-trace"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


#: What served the requests: exactly what a sidecar manifest says (engine, GPUs, price…),
#: validated by its rules (BENCH_FORMATS §1.5).
Deployment = BenchManifest

#: The manifest keys a run's flags set (the rest come from the run itself).
DEPLOYMENT_KEYS = (
    "engine",
    "engine_version",
    "gpu_type",
    "gpu_count",
    "quantization",
    "price_per_gpu_hour_usd",
)


@dataclass(frozen=True)
class Workload:
    trace: TraceSample
    label: str  # the configured workload's name, or the traces named ad hoc
    name: str | None  # the configured workload's name (the manifest's ``workload``)


@dataclass
class RateRun:
    plan: RatePlan
    requests: pl.DataFrame
    started: dt.datetime
    interrupted: bool


@dataclass
class LoadtestRun:
    settings: LoadtestSettings
    deployment: Deployment
    workload: Workload
    rates: list[RateRun]
    started: dt.datetime
    finished: dt.datetime
    interrupted: bool


# ------------------------------------------------------------------------------- inputs


def read_workload(
    requests: pl.LazyFrame, settings: LoadtestSettings, *, label: str, name: str | None
) -> Workload:
    """The first trace requests a run can replay (never the whole of a large trace)."""
    limit = rows_needed(max(settings.rates), settings.warmup + settings.duration)
    return Workload(trace_sample(requests, limit=limit), label, name)


def endpoint_url(endpoint: str, api: str) -> str:
    """The request URL for ``endpoint`` (a server root, its ``/v1``, or the full path)."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--endpoint {endpoint!r}: expected an http(s) URL such as http://127.0.0.1:8000/v1"
        )
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ConfigError(f"--endpoint {endpoint!r}: {exc} (a port is 1 to 65535)") from exc
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "--endpoint: credentials in the URL would show in process lists and logs; put the "
            "token in $OPENAI_API_KEY (or name another variable with --api-key-env)"
        )
    path = parts.path.rstrip("/")
    suffix = "/chat/completions" if api == "chat" else "/completions"
    if path.endswith(("/chat/completions", "/completions")):
        if not path.endswith(suffix) or (
            api == "completions" and path.endswith("/chat/completions")
        ):
            raise ConfigError(f"--endpoint {endpoint!r} is not the {api} API; pass the server root")
    elif path.endswith("/v1"):
        path += suffix
    else:
        path += "/v1" + suffix
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def public_url(url: str) -> str:
    """The URL without credentials or query (what the written files may name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def plan_rates(trace: TraceSample, settings: LoadtestSettings) -> list[RatePlan]:
    return [
        plan_rate(
            trace,
            kind=settings.arrivals,
            rate_rps=rate,
            duration_s=settings.duration,
            warmup_s=settings.warmup,
            burstiness=settings.burstiness,
            seed=settings.seed,
        )
        for rate in settings.rates
    ]


def request_body(
    trace: TraceSample, plan: RatePlan, index: int, settings: LoadtestSettings, model: str
) -> bytes:
    """The JSON body of send ``index`` of ``plan``: the trace request's prompt, synthesised,
    and its output length, asked for as exactly as the server allows."""
    row = int(plan.trace_rows[index])
    words = prompt_words(
        trace.block_hashes(row),
        int(trace.prompt_tokens[row]),
        trace.block_size,
        plan.namespace,
        send_key=index,
    )
    text = prompt_text(words)
    output = int(trace.output_tokens[row])
    body: dict[str, Any] = {"model": model, "max_tokens": output, "stream": True}
    if settings.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if settings.include_usage:
        body["stream_options"] = {"include_usage": True}
    if "ignore_eos" in settings.length_control:
        body["ignore_eos"] = True
    if "min_tokens" in settings.length_control:
        body["min_tokens"] = output
    return json.dumps(body, separators=(",", ":")).encode()


#: Bodies of one rate are encoded before it starts when they fit in this many bytes (about 8
#: bytes a prompt word), so no send waits for its own encoding; past it they are encoded one
#: send ahead, while the sender waits for the next send time.
PREBUILD_BYTES = 512 * 1024 * 1024


def bodies_for(
    trace: TraceSample, plan: RatePlan, settings: LoadtestSettings, model: str
) -> Callable[[int], bytes]:
    """Send ``i``'s body, encoded ahead of the run when the rate's bodies fit in memory."""
    words = int(trace.prompt_tokens[plan.trace_rows].sum())
    if words * 8 <= PREBUILD_BYTES:
        bodies = [request_body(trace, plan, i, settings, model) for i in range(plan.sends)]
        return bodies.__getitem__
    return lambda i: request_body(trace, plan, i, settings, model)


# ---------------------------------------------------------------------------------- run


ProgressFactory = Callable[[RatePlan], Callable[[str], None]]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # a faster event loop where installed (Linux, macOS)

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


async def _check_endpoint(
    url: str, model: str, timeout_s: float, headers: dict[str, str]
) -> str | None:
    """A warning when the server answers ``/models`` without the model; raises ConfigError when
    the server cannot be reached at all."""
    import aiohttp

    base = url.rsplit("/chat/completions", 1)[0].rsplit("/completions", 1)[0]
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(base + "/models", headers=headers) as resp,
        ):
            if resp.status in (401, 403):
                raise ConfigError(
                    f"--endpoint {public_url(url)}: the server refused the token (HTTP "
                    f"{resp.status}); set $OPENAI_API_KEY or name the variable with --api-key-env"
                )
            if resp.status != 200:
                return None  # some servers have no /models; the run itself will tell
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientConnectorError, TimeoutError) as exc:
        raise ConfigError(
            f"--endpoint {public_url(url)}: cannot reach the server ({exc.__class__.__name__}: "
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
    workload: Workload,
    settings: LoadtestSettings,
    deployment: Deployment,
    *,
    headers: dict[str, str] | None = None,
    progress: ProgressFactory | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> LoadtestRun:
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
            problem = await _check_endpoint(
                url, model, settings.connect_timeout + 5, options.headers
            )
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
    return LoadtestRun(
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


def deployment_values(deployment: Deployment) -> dict[str, Any]:
    return {key: getattr(deployment, key) for key in DEPLOYMENT_KEYS}


def manifest(run: LoadtestRun) -> dict[str, Any]:
    values: dict[str, Any] = {
        **deployment_values(run.deployment),
        "run_date": run.started.date().isoformat(),
        "model": run.settings.model,
        "workload": run.workload.name or run.workload.label,
        "dataset": DATASET,
        "label": f"loadtest-{run.deployment.engine}",
        "tool_version": _version(),
    }
    return {k: v for k, v in values.items() if v is not None}


def _version() -> str:
    try:
        return f"enginefit {metadata.version('enginefit')}"
    except metadata.PackageNotFoundError:
        return "enginefit"


def run_record(
    run: LoadtestRun, summaries: list[dict[str, Any]], files: list[str]
) -> dict[str, Any]:
    trace = run.workload.trace
    settings = run.settings.model_dump(mode="json")
    settings["endpoint"] = public_url(run.settings.endpoint or "")
    return {
        "tool": _version(),
        "started_at": run.started.isoformat(),
        "finished_at": run.finished.isoformat(),
        "interrupted": run.interrupted,
        "settings": settings,
        "deployment": {k: v for k, v in deployment_values(run.deployment).items() if v is not None},
        "workload": {
            "label": run.workload.label,
            "trace_requests_loaded": trace.requests,
            "block_size": trace.block_size,
            "hashes_known": trace.hashes_known,
            "output_tokens_filled_with_median": trace.output_filled,
        },
        "rates": summaries,
        "rate_files": files,
    }


def write(run: LoadtestRun, paths: LoadtestRunPaths) -> dict[str, Any]:
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
