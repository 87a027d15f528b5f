"""Throughput of the content-bearing readers (prompt text, OpenAI chat, token ids) and TraceLab.

Synthetic files are written to a temporary directory (nothing is kept); each reader reads its
file once and the records per second are printed. Run: ``python -m perf.trace_readers``.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.ingest.readers import ReadContext, SourceFile, reader_named

WORDS = [f"w{i}" for i in range(5000)]


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def prompt_text_lines(rng: random.Random, n: int) -> list[dict[str, object]]:
    system = _text(rng, 300)
    return [
        {
            "ts": i * 0.1,
            "prompt": system + " " + _text(rng, 200),
            "output": _text(rng, 100),
            "duration_s": 1.0,
        }
        for i in range(n)
    ]


def chat_lines(rng: random.Random, n: int) -> list[dict[str, object]]:
    """Conversations of 10 turns; every request repeats the conversation so far."""
    system = {"role": "system", "content": _text(rng, 300)}
    out: list[dict[str, object]] = []
    while len(out) < n:
        history: list[dict[str, str]] = [system]
        for _ in range(10):
            history.append({"role": "user", "content": _text(rng, 60)})
            reply = {"role": "assistant", "content": _text(rng, 100)}
            out.append(
                {
                    "created": 1767225600 + len(out),
                    "messages": list(history),
                    "choices": [{"message": reply}],
                    "usage": {"prompt_tokens": 900, "completion_tokens": 120},
                }
            )
            history.append(reply)
    return out[:n]


def token_id_lines(rng: random.Random, n: int) -> list[dict[str, object]]:
    shared = [rng.randrange(150_000) for _ in range(1000)]
    return [
        {
            "ts": i * 0.1,
            "prompt_token_ids": shared + [rng.randrange(150_000) for _ in range(1000)],
            "output_tokens": 100,
        }
        for i in range(n)
    ]


def tracelab_lines(n: int) -> list[dict[str, object]]:
    sample = Path(__file__).resolve().parents[1] / "traces" / "tracelab" / "round_trace.jsonl"
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    return [rows[i % len(rows)] for i in range(n)]


def bench(name: str, make: Callable[[], list[dict[str, object]]], directory: Path) -> None:
    lines = make()
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reader = reader_named(name)
    start = time.perf_counter()
    result = reader.read(SourceFile.of(path), ReadContext(block_size=16, salt=b"bench"))
    seconds = time.perf_counter() - start
    mib = path.stat().st_size / 2**20
    print(
        f"{name:12s} {result.records_read:8,d} records  {mib:7.1f} MiB  {seconds:6.2f} s  "
        f"{result.records_read / seconds:9,.0f} records/s  {mib / seconds:6.1f} MiB/s"
    )


def main() -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        bench("prompt-text", lambda: prompt_text_lines(rng, 5_000), directory)
        bench("openai-chat", lambda: chat_lines(rng, 5_000), directory)
        bench("token-ids", lambda: token_id_lines(rng, 5_000), directory)
        bench("tracelab", lambda: tracelab_lines(20_000), directory)


if __name__ == "__main__":
    main()
