"""The capacity curves' step, exact (the whole table flattened and numbered) against the SHARDS
sample taken while the request parts are read (``pipeline.sim.curve_stream``): wall time, peak
resident memory and the sampled curve's largest hit-ratio error against the exact one.

Each size's trace is ``perf.workload``'s model (long profile, 512-token blocks with the prompt's
blocks in the chain, as the Mooncake form the end-to-end benchmark ingests), written as canonical
Parquet parts of 1M requests; every measurement runs in a child process of its own, so its
``VmHWM`` is the step's peak (imports and the part it reads included; :mod:`perf.peak`). The curves are the
bundled grid's single-pass ones without affinity (one replica; four replicas round-robin), so
the sampled path never flattens the table. Generation is not counted.

Run: ``python -m perf.curve_sampled [--requests 1M,10M] [--rates 0.01,0.1]``. Numbers in
docs/simulation-curves.md were measured on the project machine (2 cores, 24 GiB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from perf import workload

_CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from perf.peak import peak_rss_bytes
import polars as pl
from pipeline.config import default_config
from pipeline.sim.blocks import sim_input
from pipeline.sim.compute import capacity_curves, curve_combinations
from pipeline.sim.curve_stream import streamed_curves

folder, rate, out = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
parts = sorted(folder.glob("*.parquet"))
config = default_config()
latency = config.shape.latency
settings = config.simulation.model_copy(
    update={"block_sizes": (512,), "replicas": (1, 4), "routings": ("round-robin",)}
)
start = time.perf_counter()
if rate >= 1:
    curves = capacity_curves(sim_input(pl.scan_parquet(parts), latency_model=latency), settings)
else:
    curves = streamed_curves(
        parts, settings, latency, curve_combinations(settings), lambda: None, rate
    )
seconds = time.perf_counter() - start
np.savez(out, **{f"c{i}": c.capacity_blocks for i, c in enumerate(curves)},
         **{f"h{i}": c.hit_tokens for i, c in enumerate(curves)})
print(json.dumps({
    "seconds": seconds,
    "peak_gib": peak_rss_bytes() / 2**30,
    "errors": [c.hit_ratio_error for c in curves],
    "prompt_tokens": curves[0].coverage.prompt_tokens,
}))
"""


def _count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def _run(folder: Path, rate: float, out: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), str(rate), str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _gap(exact: Path, sampled: Path, prompt_tokens: int) -> list[float]:
    import numpy as np

    from pipeline.sim.curve_stream import _largest_gap

    a, b = np.load(exact), np.load(sampled)
    return [
        _largest_gap((a[f"c{i}"], a[f"h{i}"]), (b[f"c{i}"], b[f"h{i}"]), prompt_tokens)
        for i in range(len(a.files) // 2)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="1M,10M")
    parser.add_argument("--rates", default="0.01,0.1")
    parser.add_argument("--no-exact", action="store_true", help="sampled runs only, no errors")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    for size in args.requests.split(","):
        n = _count(size)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "parts"
            folder.mkdir()
            trace = workload.conversations(workload.spec(n))
            blocks = 0
            for i, frame in enumerate(workload.iter_frames(trace, 512, answers_in_chain=False)):
                blocks += int(frame["prefix_hashes"].list.len().sum())
                frame.write_parquet(folder / f"part-{i:05d}.parquet")
            del trace
            exact_out = Path(tmp) / "exact.npz"
            print(f"{size}: {blocks:,} stored blocks", flush=True)
            exact: dict[str, object] = {}
            if not args.no_exact:
                exact = _run(folder, 1.0, exact_out)
                seconds, peak = exact["seconds"], exact["peak_gib"]
                print(f"  exact: {seconds:.1f} s, peak {peak:.2f} GiB", flush=True)
            for rate in rates:
                out = Path(tmp) / f"sampled-{rate}.npz"
                sampled = _run(folder, rate, out)
                gaps = (
                    _gap(exact_out, out, int(exact["prompt_tokens"]))  # type: ignore[call-overload]
                    if exact
                    else []
                )
                print(
                    f"  sampled {rate:.0%}: {sampled['seconds']:.1f} s, peak "
                    f"{sampled['peak_gib']:.2f} GiB; largest error against exact "
                    f"{', '.join(f'{g:.4f}' for g in gaps)} (estimated "
                    f"{', '.join(f'{e:.4f}' for e in sampled['errors'])})",  # type: ignore[attr-defined]
                    flush=True,
                )


if __name__ == "__main__":
    main()
