"""``enginefit loadtest``: replay the workload open loop against an OpenAI-compatible endpoint.

Without TRACE the configured workload's ingested requests are replayed; with TRACE the traces
named (read with the configuration's settings, never persisted). Every ``loadtest`` key of the
configuration is also a flag here; the deployment under test (``--engine``, ``--gpu-type``,
``--gpu-count``, ``--price``) becomes the run's sidecar manifest.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from pipeline.bench.manifest import BenchManifestError, validate_manifest
from pipeline.commands.common import add_config_argument, command_config
from pipeline.commands.ingest import add_trace_arguments, adhoc_requests
from pipeline.errors import ConfigError
from pipeline.layout import LoadtestRunPaths
from pipeline.loadtest import stage
from pipeline.loadtest.compute import endpoint_url, plan_rates, public_url
from pipeline.loadtest.config import LoadtestConfig
from pipeline.loadtest.present import (
    nothing_completed,
    plan_lines,
    plan_problems,
    rate_line,
    summary_lines,
)
from pipeline.loadtest.result import Deployment
from pipeline.store import read_requests

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
#: The ``loadtest`` keys a flag of the same name overrides (``include_usage`` is --no-usage;
#: --out names the run's own folder, not ``out_dir``).
SETTING_FLAGS = tuple(
    k for k in LoadtestConfig.model_fields if k not in ("include_usage", "out_dir")
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "loadtest",
        help="replay the workload open loop against an OpenAI-compatible endpoint",
        description=(
            "Send the workload's requests (its prompt and output lengths and its shared "
            "prefixes, with synthetic text) to an OpenAI-compatible server at each offered "
            "rate, open loop, and write vllm-bench-serve-compatible results with a sidecar "
            "manifest that `enginefit bench` reads. Without TRACE: the configured workload. "
            "Exit code 0 when at least one request completed, 1 when none did (what was "
            "measured is still written), 2 for a bad flag, file or setting (nothing sent), "
            "130 when interrupted."
        ),
    )
    add_trace_arguments(parser)
    add_config_argument(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--endpoint", metavar="URL", help="e.g. http://127.0.0.1:8000/v1")
    server.add_argument("--model", metavar="NAME", help="the model name the server serves")
    server.add_argument(
        "--api",
        choices=["completions", "chat"],
        help="completions (prompt text) or chat (one user message); default loadtest.api",
    )
    server.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=DEFAULT_KEY_ENV,
        help="environment variable holding a bearer token, if set (default OPENAI_API_KEY); "
        "never written anywhere",
    )
    load = parser.add_argument_group("load")
    load.add_argument("--rates", metavar="R,R,...", help="offered rates in req/s, e.g. 1,2,4,8")
    load.add_argument("--duration", metavar="TIME", help="per rate, e.g. 120s or 2m")
    load.add_argument("--warmup", metavar="TIME", help="discarded start of each rate")
    load.add_argument(
        "--arrivals",
        choices=["trace", "poisson", "gamma"],
        help="trace: the trace's own gaps scaled to each rate; poisson; gamma with "
        "--burstiness (default loadtest.arrivals)",
    )
    load.add_argument("--burstiness", type=float, metavar="CV", help="gamma gaps' CV (1 = Poisson)")
    load.add_argument("--max-in-flight", type=int, metavar="N", help="cap (default: none)")
    load.add_argument(
        "--on-cap",
        choices=["drop", "delay"],
        help="a send over --max-in-flight: drop it (counted as dropped_cap) or delay it "
        "(counted as late); default loadtest.on_cap",
    )
    load.add_argument(
        "--length-control",
        metavar="LIST",
        help="ignore_eos,min_tokens (default both) or '' for neither",
    )
    load.add_argument(
        "--no-usage", action="store_true", help="do not ask for stream usage (include_usage)"
    )
    load.add_argument("--connect-timeout", metavar="TIME", help="time allowed to connect, e.g. 10s")
    load.add_argument(
        "--read-timeout", metavar="TIME", help="time allowed between two bytes of an answer"
    )
    load.add_argument(
        "--request-timeout", metavar="TIME", help="time allowed for one whole request"
    )
    load.add_argument(
        "--seed", type=int, help="seeds the arrivals and the prompt words (default 0)"
    )
    deployment = parser.add_argument_group("deployment under test (the sidecar manifest)")
    deployment.add_argument("--engine", help="vllm, sglang, tensorrt-llm, tgi, llama.cpp …")
    deployment.add_argument("--engine-version", help="the engine's version, e.g. 0.11.0")
    deployment.add_argument("--gpu-type", help="e.g. H100-80GB")
    deployment.add_argument("--gpu-count", type=int, help="accelerators serving (all replicas)")
    deployment.add_argument(
        "--quantization", help="the served weights' quantization, e.g. bf16, fp8, awq-int4"
    )
    deployment.add_argument("--price", type=float, metavar="USD", help="$ per GPU-hour")
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=None,
        help="the run's folder (new or empty; default <loadtest.out_dir>/loadtest-<engine>-<time>)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and send nothing")
    parser.set_defaults(func=run_loadtest)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def resolve_settings(args: argparse.Namespace, configured: LoadtestConfig) -> LoadtestConfig:
    """The configuration's ``loadtest`` section with the flags given applied, each validated as
    the file's values are; a bad value is one line naming its flag."""
    changes = {key: getattr(args, key) for key in SETTING_FLAGS}
    changes = {key: value for key, value in changes.items() if value is not None}
    if args.no_usage:
        changes["include_usage"] = False
    try:
        return configured.replace(**changes)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        key = str(error["loc"][0]) if error["loc"] else "?"
        what = str(error["msg"]).removeprefix("Value error, ")
        source = _flag(key) if key in changes else f"loadtest.{key}"
        got = f" (got {error.get('input')!r})" if "got" not in what else ""
        raise ConfigError(f"{source}: {what}{got}") from exc


#: Manifest key → the flag that sets it (for messages).
_DEPLOYMENT_FLAGS = {
    "engine": "--engine",
    "gpu_type": "--gpu-type",
    "gpu_count": "--gpu-count",
    "engine_version": "--engine-version",
    "quantization": "--quantization",
    "price_per_gpu_hour_usd": "--price",
}


def deployment_from(args: argparse.Namespace) -> Deployment:
    """The deployment under test, validated by the bench manifest's own rules before anything
    is sent (a value the bench stage would refuse must not cost a whole sweep)."""
    missing = [
        _flag(name) for name in ("engine", "gpu_type", "gpu_count") if getattr(args, name) is None
    ]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} required: they name the deployment under test in the "
            "sidecar manifest `enginefit bench` needs (e.g. --engine vllm --gpu-type H100-80GB "
            "--gpu-count 1)"
        )
    values = {
        key: getattr(args, "price" if flag == "--price" else key)
        for key, flag in _DEPLOYMENT_FLAGS.items()
    }
    try:
        return validate_manifest({k: v for k, v in values.items() if v is not None}, "flags")
    except BenchManifestError as exc:
        text = str(exc).removeprefix("flags: ")
        for key, flag in _DEPLOYMENT_FLAGS.items():
            text = text.replace(f"manifest key '{key}'", flag)
        raise ConfigError(text) from exc


def api_headers(args: argparse.Namespace) -> dict[str, str] | None:
    """A bearer token from the named environment variable; a variable named on purpose but
    unset is an error (the default, OPENAI_API_KEY, may be unset)."""
    token = os.environ.get(args.api_key_env) if args.api_key_env else None
    if token is None and args.api_key_env != DEFAULT_KEY_ENV:
        raise ConfigError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    return {"Authorization": f"Bearer {token}"} if token else None


def check_target(settings: LoadtestConfig) -> None:
    """Endpoint and model: present and well formed (the server is asked only when running)."""
    if settings.endpoint is None:
        raise ConfigError("--endpoint URL required (or loadtest.endpoint): the server to load")
    if settings.model is None:
        raise ConfigError("--model NAME required (or loadtest.model): the model the server serves")
    endpoint_url(settings.endpoint, settings.api)


def _progress_factory(bars: list[Any]) -> stage.ProgressFactory | None:
    if not sys.stderr.isatty():
        return None

    def factory(plan: Any) -> Any:
        bar = tqdm(total=plan.sends, desc=f"{plan.rate_rps:g} req/s", unit="req", leave=True)
        bars.append(bar)

        def update(event: str) -> None:
            if event == "done":
                bar.update(1)

        return update

    return factory


def run_loadtest(args: argparse.Namespace) -> int:
    config = command_config(args, paths=args.paths)
    # Everything a person can get wrong is checked before the trace is read or a byte is sent,
    # in a dry run too.
    settings = resolve_settings(args, config.loadtest)
    check_target(settings)
    deployment = deployment_from(args)
    headers = api_headers(args)
    if args.out is not None:
        stage.check_new_folder(args.out)
    if args.paths:
        requests, label, name = adhoc_requests(args, config), ", ".join(args.paths), None
    else:
        requests, label = read_requests(config.layout()), config.require_workload().name
        name = label
    workload = stage.read_inputs(requests, settings, label=label, name=name)
    plans = plan_rates(workload.trace, settings)
    for line in plan_lines(workload.trace, plans, settings):
        print(line, file=sys.stderr)
    problems = plan_problems(plans)
    if problems:
        raise ConfigError(problems[0])
    if args.dry_run:
        return 0
    bars: list[Any] = []
    print(
        f"replaying {workload.label} against {public_url(settings.endpoint or '')} "
        f"({settings.model}, {deployment.engine} on {deployment.gpu_count}× "
        f"{deployment.gpu_type}); Ctrl-C stops and keeps what was measured",
        file=sys.stderr,
    )
    result = stage.run(
        workload,
        settings,
        deployment,
        headers=headers,
        progress=_progress_factory(bars),
        warn=lambda text: print(f"warning: {text}", file=sys.stderr),
    )
    for bar in bars:
        bar.close()
    paths = (
        LoadtestRunPaths(args.out)
        if args.out is not None
        else stage.run_folder(settings.out_dir, deployment, result.started)
    )
    record = stage.write(result, paths)
    for summary in record["rates"]:
        print(rate_line(summary), file=sys.stderr)
    print("\n".join(summary_lines(record)))
    files = record["rate_files"]
    print(f"wrote {paths.root} ({len(files)} rate file(s), per-request table, run record)")
    if files:
        print(f"read it with: enginefit bench {paths.root}")
    if result.interrupted:
        print(
            "interrupted: the cut-short rate is kept in the per-request table only",
            file=sys.stderr,
        )
        return 130
    if not any(s["completed"] for s in record["rates"]):
        print(f"enginefit: no request completed: {nothing_completed(record)}", file=sys.stderr)
        return 1
    return 0
