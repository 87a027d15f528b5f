"""Hand-built load-point fields shared by the bench tests."""

from __future__ import annotations

from typing import Any


def kept_up_run(rate: float, requests: int = 100, latency_s: float | None = None) -> dict[str, Any]:
    """Counts and timings of a healthy open-loop run at ``rate`` req/s.

    ``requests`` are sent over ``requests / rate`` s and each takes ``latency_s`` (default 1 s, at
    most a tenth of the sending window), so the run lasts ``requests / rate + latency_s``: its
    completion rate with the drain left in is at least 1 ÷ 1.1 = 91 % of ``rate``, which the
    aggregates accept as kept up (tolerance 15 %), and no longer than the longest latency.
    """
    window = requests / rate
    latency = min(1.0, window / 10.0) if latency_s is None else latency_s
    return {
        "num_requests": requests,
        "completed": requests,
        "failed": 0,
        "duration_s": window + latency,
        "duration_kind": "first_send_to_last_done",
        "e2e_mean_ms": latency * 1000.0,
    }
