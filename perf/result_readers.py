"""Benchmark: reading a large vLLM ``--save-detailed`` result with per-request arrays.

Writes one JSON Lines file with ``--points`` load points (default 4), each with ``--requests``
requests (default 5,000) of ~``--tokens`` output tokens (default 500), so per-gap ITL arrays
hold points × requests × tokens floats (10M by default), then times
``read_bench_files`` (parse + validation + recomputation of every percentile).

Run: ``.venv/bin/python -m perf.result_readers [--points P] [--requests N] [--tokens T]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.peak import peak_rss_bytes
from pipeline.bench.readers import read_bench_files


def _record(rng: np.random.Generator, n: int, tokens: int, rate: float) -> dict[str, object]:
    out = rng.integers(tokens // 2, tokens * 3 // 2, n)
    ttft = rng.uniform(0.02, 0.4, n)
    itls = [np.round(rng.uniform(0.005, 0.05, int(k) - 1), 6).tolist() for k in out]
    lat = ttft + np.array([sum(x) for x in itls])
    return {
        "date": "20260101-000000",
        "backend": "vllm",
        "model_id": "m",
        "num_prompts": n,
        "request_rate": rate,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 100.0,
        "completed": n,
        "failed": 0,
        "mean_ttft_ms": 1.0,
        "p99_ttft_ms": 1.0,
        "input_lens": [512] * n,
        "output_lens": out.tolist(),
        "ttfts": ttft.tolist(),
        "itls": itls,
        "latencies": lat.tolist(),
        "start_times": np.cumsum(rng.exponential(1 / rate, n)).tolist(),
        "errors": [""] * n,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--tokens", type=int, default=500)
    args = parser.parse_args(sys.argv[1:] if __name__ == "__main__" else [])
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.json"
        t0 = time.perf_counter()
        with path.open("w") as fh:
            for p in range(args.points):
                fh.write(json.dumps(_record(rng, args.requests, args.tokens, 2.0 * (p + 1))))
                fh.write("\n")
        gen_s = time.perf_counter() - t0
        size_mb = path.stat().st_size / 1e6
        t0 = time.perf_counter()
        result = read_bench_files([path], manifest={"engine": "x", "gpu_type": "y", "gpu_count": 1})
        read_s = time.perf_counter() - t0
    gaps = 0
    if result.per_request is not None:
        gaps = int(result.per_request.get_column("itl_ms").list.len().sum())
    rss_mb = peak_rss_bytes() / 2**20
    print(
        json.dumps(
            {
                "points": result.load_points.height,
                "requests": args.points * args.requests,
                "itl_gaps": int(gaps),
                "file_mb": round(size_mb, 1),
                "generate_s": round(gen_s, 2),
                "read_s": round(read_s, 2),
                "gaps_per_s": round(gaps / read_s),
                "peak_rss_mb": round(rss_mb),
            },
            indent=2,
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
