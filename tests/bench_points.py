"""Hand-built load-point fields shared by the bench tests."""

from __future__ import annotations

from typing import Any


def kept_up_run(rate: float, requests: int = 100, latency_s: float = 1.0) -> dict[str, Any]:
    """Counts and timings of a healthy open-loop run at ``rate`` req/s.

    ``requests`` are sent over ``requests / rate`` s and each takes ``latency_s``, so the run
    lasts ``requests / rate + latency_s`` and its drain-corrected completion rate
    ``requests ÷ (duration − latency_s)`` is exactly ``rate``: keep-up share 1.0.
    """
    return {
        "num_requests": requests,
        "completed": requests,
        "failed": 0,
        "duration_s": requests / rate + latency_s,
        "duration_kind": "first_send_to_last_done",
        "e2e_mean_ms": latency_s * 1000.0,
    }
