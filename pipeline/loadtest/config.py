"""The ``loadtest`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``); every key can also be given as a flag of ``enginefit loadtest``.

The deployment under test (engine, GPU type and count, price) is not here: it is what one run
measures, so it comes from the command's flags and goes into the run's sidecar manifest.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field

from pipeline.settings import ConfigPath, Section, Seed, between

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
#: A load test longer than a day is a typo (a rate's requests are planned in memory).
MAX_DURATION_S = 86_400.0
#: Highest offered rate one client process is planned for (the harness is measured at 500 req/s).
MAX_RATE_RPS = 100_000.0
#: Requests in flight one client process holds open at most (each is a socket).
MAX_IN_FLIGHT_REQUESTS = 100_000


def parse_seconds(value: Any) -> float:
    """``120``, ``"120s"``, ``"2m"``, ``"500ms"``, ``"1h"`` → seconds (finite, ≥ 0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 120s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError(f"expected a duration such as 120s, 2m or 500ms, got {value!r}")
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        raise ValueError(f"a duration is 0 to {MAX_DURATION_S:g} s, got {value!r}")
    return seconds


def parse_rates(value: Any) -> tuple[float, ...]:
    """``"1,2,4"`` or ``[1, 2, 4]`` → rates in req/s, each > 0 and ≤ :data:`MAX_RATE_RPS`."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"expected a list of request rates such as 1,2,4,8, got {value!r}")
    rates: list[float] = []
    for item in items:
        try:
            rate = float(item) if not isinstance(item, bool) else math.nan
        except ValueError:
            rate = math.nan
        if not math.isfinite(rate) or not 0 < rate <= MAX_RATE_RPS:
            raise ValueError(f"a request rate is > 0 and ≤ {MAX_RATE_RPS:g} req/s, got {item!r}")
        rates.append(rate)
    # Rates name their result files to six significant digits (vllm-<rate>qps.json).
    if len({f"{rate:g}" for rate in rates}) != len(rates):
        raise ValueError(f"a rate is listed twice (to 6 significant digits) in {value!r}")
    return tuple(rates)


def check_endpoint(value: str) -> str:
    """An http(s) URL with a host, a port of 1 to 65535 if any, and no credentials (the one
    check of ``loadtest.endpoint`` and ``--endpoint``, before anything is sent)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
        host = parts.hostname
    except ValueError as exc:  # an unclosed or invalid [IPv6] host, a port out of range
        if "port" in str(exc).lower():
            raise ValueError(f"{exc} (a port is 1 to 65535)") from exc
        raise ValueError(f"not a URL ({exc}); e.g. http://127.0.0.1:8000/v1") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("expected an http(s) URL such as http://127.0.0.1:8000/v1")
    if port == 0:
        raise ValueError("port 0 is no server's port (a port is 1 to 65535)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "credentials in the URL would show in process lists and logs; put the token in "
            "$OPENAI_API_KEY (or name another variable with --api-key-env)"
        )
    return value


Seconds = Annotated[float, BeforeValidator(parse_seconds)]
PositiveSeconds = Annotated[float, BeforeValidator(parse_seconds), Field(gt=0)]
Rates = Annotated[tuple[float, ...], BeforeValidator(parse_rates)]
LengthControl = Literal["ignore_eos", "min_tokens"]


def _controls(value: Any) -> Any:
    """``"ignore_eos,min_tokens"`` (a flag) or a YAML list → a tuple; ``""`` → none."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(value) if isinstance(value, list) else value


class LoadtestConfig(Section):
    """How ``enginefit loadtest`` replays the workload against an endpoint."""

    endpoint: Annotated[str, Field(min_length=1), AfterValidator(check_endpoint)] | None
    model: Annotated[str, Field(min_length=1)] | None
    api: Literal["completions", "chat"]
    rates: Rates
    duration: PositiveSeconds
    warmup: Seconds
    arrivals: Literal["trace", "poisson", "gamma"]
    burstiness: Annotated[float, Field(gt=0, le=100)]
    max_in_flight: Annotated[int, between(1, MAX_IN_FLIGHT_REQUESTS)] | None
    on_cap: Literal["drop", "delay"]
    length_control: Annotated[tuple[LengthControl, ...], BeforeValidator(_controls)]
    include_usage: bool
    connect_timeout: PositiveSeconds
    read_timeout: PositiveSeconds
    request_timeout: PositiveSeconds
    seed: Seed
    out_dir: ConfigPath
