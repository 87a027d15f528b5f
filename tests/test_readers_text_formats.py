"""Readers for content-bearing traces (prompt text, OpenAI chat, token ids), TraceLab and BurstGPT.

Expectations are hand-computed from the fixtures in ``tests/data/traces``; block hashes are
checked against an independent BLAKE2b chain written here, with a whitespace tokenizer whose
counts can be read off the fixture text.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import statistics
import struct
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import zstandard
from polars.testing import assert_frame_equal

from pipeline.ingest.compute import ingest_paths
from pipeline.ingest.readers import READERS, ReadContext, ReadResult, SourceFile, detect_reader
from pipeline.ingest.readers.prompt_text import PromptTextReader
from pipeline.ingest.stage import write as write_workload
from pipeline.ingest.tokenize import ApproximateTokenizer, HuggingFaceTokenizer
from pipeline.layout import WorkloadLayout
from pipeline.schema import CANONICAL_SCHEMA
from tests.conftest import write_requests

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "traces"
SHARED = REPO.parent / "shared"
TRACELAB_SHARED = SHARED / "traces" / "tracelab-examples"
ANCHOR = datetime(2025, 3, 1, tzinfo=UTC)
SALT = b"test-salt"


@dataclass(frozen=True)
class WordTokenizer:
    """Whitespace words mapped to CRC-32 ids: counts are the word counts of the fixture text."""

    name: str = "words"
    approximate: bool = False

    def encode(self, text: str) -> list[int]:
        return [word_id(w) for w in text.split()]


def word_id(word: str) -> int:
    return zlib.crc32(word.encode())


def words(text: str) -> list[int]:
    return [word_id(w) for w in text.split()]


def ref_chain(ids: list[int], block: int, salt: bytes = SALT) -> list[int]:
    """Independent reference: BLAKE2b-64 keyed with the salt over 0x01 || parent || block ids."""
    parent, out = bytes(8), []
    for k in range(len(ids) // block):
        payload = b"".join(struct.pack("<I", t) for t in ids[k * block : (k + 1) * block])
        parent = hashlib.blake2b(b"\x01" + parent + payload, key=salt, digest_size=8).digest()
        out.append(int.from_bytes(parent, "little"))
    return out


def ctx(block: int = 4, tokenizer: Any = None) -> ReadContext:
    return ReadContext(
        block_size=block, salt=SALT, anchor=ANCHOR, tokenizer=tokenizer or WordTokenizer()
    )


def read(path: Path, context: ReadContext | None = None) -> ReadResult:
    source = SourceFile.of(path)
    return detect_reader(source).read(source, context or ctx())


def rows(result: ReadResult) -> list[dict[str, Any]]:
    return result.requests.to_dicts()


# ---------------------------------------------------------------------------------------------
# Detection


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("prompt_text.jsonl", "prompt-text"),
        ("openai_chat.jsonl", "openai-chat"),
        ("token_ids.jsonl", "token-ids"),
        ("burstgpt_v1.csv", "burstgpt"),
        ("burstgpt_v2.csv", "burstgpt"),
    ],
)
def test_detect_by_content(name: str, expected: str, tmp_path: Path) -> None:
    # The extension plays no part: the same bytes under a misleading name are detected alike.
    renamed = tmp_path / "trace.parquet.csv"
    renamed.write_bytes((DATA / name).read_bytes())
    assert detect_reader(SourceFile.of(renamed)).name == expected


def test_tracelab_copy_detected() -> None:
    assert detect_reader(SourceFile.of(REPO / "traces/tracelab/round_trace.jsonl")).name == (
        "tracelab"
    )


def test_more_specific_json_readers_come_first() -> None:
    names = [r.name for r in READERS]
    assert names[0] == "canonical-parquet"
    # A token-id line that also carries chat-style keys must not be read as chat or prompt text.
    line = {"ts": 1, "prompt": "x", "messages": [], "prompt_token_ids": [1]}
    first = next(r for r in READERS if r.detect(json.dumps(line).encode()))
    assert first.name == "token-ids"


# ---------------------------------------------------------------------------------------------
# Prompt-text JSONL


def test_prompt_text_fields_and_hashes() -> None:
    result = read(DATA / "prompt_text.jsonl")
    assert result.records_read == 3 and result.quarantine.height == 0
    r1, r2, r3 = rows(result)
    p1 = words("alpha bravo charlie delta echo foxtrot golf hotel zanzibarquux")
    o1 = words("india juliet kilo lima")
    assert r1["request_id"] == "r1"
    assert r1["arrival"] == ANCHOR + timedelta(seconds=0.5)
    assert (r1["session_id"], r1["tenant"], r1["model"]) == ("s1", "acme", "m1")
    assert (r1["prompt_tokens"], r1["output_tokens"], r1["e2e_ms"]) == (9, 4, 1250.0)
    assert r1["prefix_hashes"] == ref_chain(p1 + o1, 4)  # 13 tokens: 3 full blocks
    assert r1["prompt_blocks"] == 2
    assert r1["hashes_known"] is True and r1["tokens_approximate"] is False

    # Turn 2 repeats turn 1's prompt and output, so it starts with all of turn 1's blocks.
    assert (r2["session_id"], r2["tenant"], r2["turn"]) == ("s1", "acme", 1)
    assert (r2["prompt_tokens"], r2["output_tokens"], r2["e2e_ms"]) == (15, 7, 500.0)
    assert r2["prefix_hashes"] == ref_chain(p1 + o1 + words("mike november"), 4)
    assert r2["prefix_hashes"][:3] == r1["prefix_hashes"]
    assert r2["request_id"] == f"{DATA / 'prompt_text.jsonl'}:2"

    # Epoch seconds; the output_tokens field outranks the output text's count (3 words).
    assert r3["arrival"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert (r3["session_id"], r3["prompt_tokens"], r3["output_tokens"]) == ("s2", 2, 2)
    assert r3["prefix_hashes"] == ref_chain(words("oscar papa quebec romeo sierra"), 4)
    assert r3["prompt_blocks"] == 0 and r3["e2e_ms"] is None


def test_prompt_text_approximate_tokenizer_flags_rows() -> None:
    result = read(DATA / "prompt_text.jsonl", ctx(tokenizer=ApproximateTokenizer()))
    prompt = "alpha bravo charlie delta echo foxtrot golf hotel zanzibarquux"
    first = rows(result)[0]
    assert first["tokens_approximate"] is True
    assert first["prompt_tokens"] == len(ApproximateTokenizer().encode(prompt))


# ---------------------------------------------------------------------------------------------
# OpenAI chat


def _chat_rows(block: int = 4) -> list[dict[str, Any]]:
    result = read(DATA / "openai_chat.jsonl", ctx(block=block))
    assert result.quarantine.height == 0
    return rows(result)


def test_openai_chat_usage_is_authoritative() -> None:
    c1, c2, _ = _chat_rows()
    assert c1["request_id"] == "chatcmpl-1" and c2["request_id"] == "chatcmpl-2"
    assert c1["arrival"] == datetime(2026, 1, 1, tzinfo=UTC)  # "timestamp" outranks created
    assert c2["arrival"] == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert (c1["prompt_tokens"], c1["output_tokens"], c1["cached_tokens"]) == (40, 12, 0)
    assert (c2["prompt_tokens"], c2["output_tokens"], c2["cached_tokens"]) == (70, 6, 32)
    assert (c1["session_id"], c1["tenant"], c1["model"]) == ("c1", "tenant-a", "gpt-x-2026")
    assert c1["tools"] is True and c1["structured_output"] is False
    assert c1["lora_adapter"] is None and c1["hashes_known"] is True


def test_openai_chat_flat_counts_from_rendering() -> None:
    *_, c3 = _chat_rows()
    assert c3["request_id"] == "chatcmpl-3"
    assert c3["arrival"] == datetime.fromtimestamp(1767225700, tz=UTC)
    # Rendered with the word tokenizer: "<|im_start|>user", 5 text words, "<|image_url|>",
    # "<|im_end|>", "<|im_start|>assistant" = 9 prompt tokens; output '{"a":1}' + "<|im_end|>".
    assert (c3["prompt_tokens"], c3["output_tokens"], c3["cached_tokens"]) == (9, 2, None)
    assert c3["structured_output"] is True and c3["tools"] is False
    assert c3["lora_adapter"] == "sql-lora" and c3["model"] == "gpt-y"
    expected = words(
        "<|im_start|>user what is in this picture <|image_url|> <|im_end|> <|im_start|>assistant"
        ' {"a":1} <|im_end|>'
    )
    assert c3["prefix_hashes"] == ref_chain(expected, 4)
    assert c3["prompt_blocks"] == 2


def test_openai_chat_next_turn_extends_previous_prompt_and_reply() -> None:
    # Token-granular blocks: turn 1's prompt + reply must be an exact prefix of turn 2's prompt.
    c1, c2, _ = _chat_rows(block=1)
    chain1 = c1["prefix_hashes"]
    assert len(chain1) > c1["prompt_blocks"]  # the reply's blocks are there
    assert c2["prefix_hashes"][: len(chain1)] == chain1
    assert c2["prompt_blocks"] > len(chain1)


def test_openai_chat_prefix_property_with_approximate_tokenizer(tmp_path: Path) -> None:
    system = {"role": "system", "content": "You are a careful assistant.\nAnswer briefly."}
    user1 = {"role": "user", "content": [{"type": "text", "text": "Summarise: the cat sat"}]}
    reply = {"role": "assistant", "content": "A cat sat,\n on a mat!"}
    user2 = {"role": "user", "content": "and then?"}
    lines = [
        {"created": 1767225600, "messages": [system, user1], "choices": [{"message": reply}]},
        {"created": 1767225601, "messages": [system, user1, reply, user2]},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    r1, r2 = rows(read(path, ctx(block=1, tokenizer=ApproximateTokenizer())))
    assert r2["prefix_hashes"][: len(r1["prefix_hashes"])] == r1["prefix_hashes"]
    assert r1["tokens_approximate"] is True and r2["output_tokens"] is None


@pytest.mark.parametrize(
    "line",
    [
        # nested request/response
        {
            "request": {"messages": [{"role": "user", "content": "hi there"}], "user": "u"},
            "response": {
                "id": "x",
                "created": 1767225600,
                "choices": [{"message": {"role": "assistant", "content": "yo"}}],
            },
        },
        # OpenAI batch style: bodies wrapped in "body"
        {
            "request": {
                "body": {"messages": [{"role": "user", "content": "hi there"}], "user": "u"}
            },
            "response": {
                "status_code": 200,
                "body": {
                    "id": "x",
                    "created": 1767225600,
                    "choices": [{"message": {"role": "assistant", "content": "yo"}}],
                },
            },
        },
        # flat
        {
            "id": "x",
            "created": 1767225600,
            "user": "u",
            "messages": [{"role": "user", "content": "hi there"}],
            "choices": [{"message": {"role": "assistant", "content": "yo"}}],
        },
    ],
)
def test_openai_chat_shapes_agree(line: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (row,) = rows(read(path, ctx(block=2)))
    expected = words("<|im_start|>user hi there <|im_end|> <|im_start|>assistant yo <|im_end|>")
    assert (row["request_id"], row["tenant"]) == ("x", "u")
    assert (row["prompt_tokens"], row["output_tokens"]) == (5, 2)
    assert row["prefix_hashes"] == ref_chain(expected, 2)
    assert row["prompt_blocks"] == 2


def test_openai_chat_rejects_cached_above_prompt(tmp_path: Path) -> None:
    line = {
        "created": 1767225600,
        "messages": [{"role": "user", "content": "x"}],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 9},
        },
    }
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(line) + "\n")
    result = read(path)
    assert result.requests.height == 0
    assert result.quarantine.row(0, named=True)["reason"] == "exceeds_prompt_tokens"


# ---------------------------------------------------------------------------------------------
# Token ids


def test_token_ids_exact() -> None:
    result = read(DATA / "token_ids.jsonl")
    assert result.quarantine.height == 0
    t1, t2, t3 = rows(result)
    assert t1["arrival"] == ANCHOR + timedelta(seconds=10)
    assert (t1["prompt_tokens"], t1["output_tokens"], t1["e2e_ms"]) == (10, 4, 2000.0)
    assert t1["prefix_hashes"] == ref_chain(list(range(1, 15)), 4)  # 14 ids: 3 blocks
    assert t1["prompt_blocks"] == 2 and t1["tokens_approximate"] is False
    assert (t2["turn"], t2["prompt_tokens"], t2["output_tokens"]) == (1, 16, 5)
    assert t2["prefix_hashes"] == ref_chain(list(range(1, 17)), 4)
    assert t2["prefix_hashes"][:3] == t1["prefix_hashes"]
    assert (t3["request_id"], t3["tenant"], t3["prompt_tokens"]) == ("x3", "acme", 0)
    assert t3["prefix_hashes"] == [] and t3["arrival"] == datetime(2026, 1, 1, tzinfo=UTC)


def test_token_ids_count_mismatch_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps(
            {"ts": 1, "prompt_token_ids": [1], "output_token_ids": [2, 3], "output_tokens": 3}
        )
        + "\n"
    )
    result = read(path)
    assert result.quarantine.select("source_line", "field", "reason").row(0) == (
        1,
        "output_tokens",
        "length_mismatch",
    )


# ---------------------------------------------------------------------------------------------
# Compressed inputs stream transparently


@pytest.mark.parametrize("name", ["prompt_text.jsonl", "openai_chat.jsonl", "token_ids.jsonl"])
@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_inputs(name: str, codec: str, tmp_path: Path) -> None:
    raw = (DATA / name).read_bytes()
    packed = gzip.compress(raw) if codec == "gzip" else zstandard.ZstdCompressor().compress(raw)
    target = tmp_path / "trace.bin"  # no telling extension
    target.write_bytes(packed)
    plain = read(DATA / name).requests
    unpacked = read(target).requests
    lineage = ["source_file", "request_id"]
    assert_frame_equal(unpacked.drop(lineage), plain.drop(lineage))
    assert unpacked["source_file"].unique().to_list() == [str(target)]


# ---------------------------------------------------------------------------------------------
# A real tokenizer.json (built here, no download): exact counts and hashes


def test_huggingface_tokenizer_exact(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab_words = (
        "[UNK] alpha bravo charlie delta echo foxtrot golf hotel zanzibarquux india juliet"
    )
    vocab = {w: i for i, w in enumerate(vocab_words.split())}
    hf = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tokenizer = HuggingFaceTokenizer.from_file(path)
    result = read(DATA / "prompt_text.jsonl", ctx(tokenizer=tokenizer))
    r1 = rows(result)[0]
    prompt = [
        vocab[w]
        for w in [
            "alpha",
            "bravo",
            "charlie",
            "delta",
            "echo",
            "foxtrot",
            "golf",
            "hotel",
            "zanzibarquux",
        ]
    ]
    output = [vocab["india"], vocab["juliet"], 0, 0]  # kilo, lima are unknown
    assert (r1["prompt_tokens"], r1["output_tokens"]) == (9, 4)
    assert r1["prefix_hashes"] == ref_chain(prompt + output, 4)
    assert r1["tokens_approximate"] is False


# ---------------------------------------------------------------------------------------------
# BurstGPT (the lead's reader; no public sample exists, so a hand-written fixture)


def test_burstgpt_published_header() -> None:
    result = read(DATA / "burstgpt_v1.csv")
    assert result.records_read == 3 and result.quarantine.height == 0
    got = result.requests.select(
        "arrival", "model", "prompt_tokens", "output_tokens", "tenant", "source_line", "session_id"
    )
    expected = pl.DataFrame(
        {
            "arrival": [ANCHOR + timedelta(seconds=s) for s in (5, 45, 118.5)],
            "model": ["ChatGPT", "GPT-4", "ChatGPT"],
            "prompt_tokens": [472, 1087, 25],
            "output_tokens": [18, 0, 154],
            "tenant": ["Conversation log", "API log", "Conversation log"],
            "source_line": [2, 3, 4],
            "session_id": [None, None, None],
        },
        schema={k: CANONICAL_SCHEMA[k] for k in got.columns},
    )
    assert_frame_equal(got, expected)
    assert not result.requests["hashes_known"].any()


def test_burstgpt_later_release_columns() -> None:
    result = read(DATA / "burstgpt_v2.csv")
    assert result.quarantine.height == 0
    got = result.requests.select("arrival", "session_id", "e2e_ms", "prompt_tokens")
    expected = pl.DataFrame(
        {
            "arrival": [ANCHOR + timedelta(seconds=s) for s in (0, 7, 9)],
            "session_id": ["sess-1", "sess-1", None],
            "e2e_ms": [2500.0, 1250.0, 750.0],
            "prompt_tokens": [100, 150, 60],
        },
        schema={k: CANONICAL_SCHEMA[k] for k in got.columns},
    )
    assert_frame_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# TraceLab round_trace.jsonl


def _tracelab_paths() -> list[Any]:
    paths: list[Any] = [pytest.param(REPO / "traces/tracelab/round_trace.jsonl", id="repo-copy")]
    for sub in ("sanitized", "derived"):
        candidate = TRACELAB_SHARED / sub / "round_trace.jsonl"
        if candidate.exists():
            paths.append(pytest.param(candidate, id=f"shared-{sub}", marks=pytest.mark.shared))
    return paths


@pytest.mark.parametrize("path", _tracelab_paths())
def test_tracelab_measured_facts(path: Path) -> None:
    result = read(path)
    frame = result.requests
    assert result.records_read == 19 and result.quarantine.height == 0
    assert frame["session_id"].n_unique() == 2
    assert frame.height == 19 and not frame["hashes_known"].any()
    assert frame["prefix_hashes"].list.len().sum() == 0
    by = frame.with_columns(pl.col("model").str.starts_with("claude").alias("claude"))
    claude, codex = by.filter(pl.col("claude")), by.filter(~pl.col("claude"))
    assert (claude.height, codex.height) == (10, 9)

    def share(f: pl.DataFrame) -> float:
        return int(f["cached_tokens"].sum()) / int(f["prompt_tokens"].sum())

    assert round(100 * share(claude), 1) == 94.2
    assert round(100 * share(codex), 1) == 83.0
    assert claude["prompt_tokens"].max() == 48_305 and codex["prompt_tokens"].max() == 12_097
    assert statistics.median(codex["prompt_tokens"].to_list()) == 10_436
    assert int(statistics.median(claude["prompt_tokens"].to_list())) == 42_232
    assert statistics.median(codex["output_tokens"].to_list()) == 233
    assert claude["turn"].sort().to_list() == list(range(10))
    assert claude["arrival"].min() == datetime(2026, 6, 1, 5, 40, 20, 151000, tzinfo=UTC)
    assert codex["arrival"].min() == datetime(2026, 3, 21, 10, 5, 59, 328000, tzinfo=UTC)
    assert frame["tools"].all() and frame["tokens_approximate"].not_().all()


def test_tracelab_timing_against_raw_events() -> None:
    path = REPO / "traces/tracelab/round_trace.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    frame = read(path).requests

    def at(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    for record, row in zip(raw, frame.iter_rows(named=True), strict=True):
        events = [(e["event_type"], at(e["timestamp"])) for e in record["timing_events"]]
        # Independent reading: the request goes out once its last input arrived.
        start = max(t for k, t in events if k in ("user_message", "tool_result"))
        assert row["arrival"] == start
        assert row["request_id"] == record["trace_key"]
        assert row["cached_tokens"] == record["prefix_tokens"]
        assert row["tenant"] == record.get("project")
    first = frame.row(0, named=True)  # claude round 0: user 20.151, thinking 29.420, last 31.647
    assert (first["ttft_ms"], first["e2e_ms"]) == (9269.0, 11496.0)
    codex0 = frame.filter(pl.col("model") == "gpt-5.4").row(0, named=True)
    # codex round 0: user 59.328, reasoning 02.939, usage_report 05.542
    assert (codex0["ttft_ms"], codex0["e2e_ms"]) == (3611.0, 6214.0)


@pytest.mark.shared
def test_tracelab_reader_on_derived_rows_uses_user_as_tenant() -> None:
    path = TRACELAB_SHARED / "derived" / "round_trace.jsonl"
    if not path.exists():
        pytest.skip("../shared TraceLab example absent")
    frame = read(path).requests
    assert frame["tenant"].unique().to_list() == ["user"]


# ---------------------------------------------------------------------------------------------
# Privacy: no prompt words or token ids reach the Parquet or the quarantine


def test_no_prompt_text_or_token_ids_persisted(tmp_path: Path) -> None:
    secret_words = ["zanzibarquux", "quokkavault", "picture", "juliet", "terse"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"ts": 1, "prompt": 12345, "output": "zanzibarquux"})
        + "\n"
        + json.dumps({"ts": "zanzibarquux", "prompt": "quokkavault"})
        + "\n"
        + json.dumps({"ts": 1, "prompt": "quokkavault", "output_tokens": "zanzibarquux"})
        + "\n"
        + '{"ts": 1, "prompt": "zanzibarquux quokkavault\n'
    )
    results = [
        read(DATA / "prompt_text.jsonl"),
        read(DATA / "openai_chat.jsonl"),
        read(DATA / "token_ids.jsonl"),
        PromptTextReader().read(SourceFile.of(bad), ctx()),
    ]
    requests = pl.concat([r.requests for r in results])
    quarantine = pl.concat([r.quarantine for r in results])
    assert quarantine.height == 4
    write_requests(requests, tmp_path / "workload")
    quarantine.write_parquet(tmp_path / "quarantine.parquet", compression="uncompressed")
    requests.write_parquet(tmp_path / "plain.parquet", compression="uncompressed")
    blobs = [
        p.read_bytes() + json.dumps(pl.read_parquet(p).to_dicts(), default=str).encode()
        for p in tmp_path.rglob("*.parquet")
    ]
    texts = [
        json.dumps(requests.drop("prefix_hashes").to_dicts(), default=str),
        json.dumps(quarantine.to_dicts()),
    ]
    for secret in secret_words:
        assert all(secret.encode() not in blob for blob in blobs), secret
        assert all(secret not in text for text in texts), secret
    # Token ids (as little-endian u32, the hashing payload) and word-ids never appear either.
    needle = b"".join(struct.pack("<I", t) for t in words("zanzibarquux india juliet"))
    assert all(needle not in blob for blob in blobs)
    persisted = set(requests.columns)
    assert persisted == set(CANONICAL_SCHEMA.names())


def test_ingested_workload_holds_no_prompt_text(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"ts": 1, "prompt": "zanzibarquux", "duration_s": "quokkavault"}) + "\n"
        '{"ts": 2, "prompt": "quokkavault zanzibarquux'
    )
    paths = [DATA / "prompt_text.jsonl", DATA / "openai_chat.jsonl", bad]
    result = ingest_paths(paths, block_size=4, salt=SALT, anchor=ANCHOR)
    assert result.summary.quarantined == 2
    write_workload(result, WorkloadLayout(tmp_path / "workload"))
    written = [p for p in (tmp_path / "workload").rglob("*") if p.is_file()]
    assert {p.suffix for p in written} >= {".parquet", ".json"}
    for path in written:
        # Parquet parts are compressed: search their decoded values as well as the raw bytes.
        blob = path.read_bytes()
        if path.suffix == ".parquet":
            blob += json.dumps(pl.read_parquet(path).to_dicts(), default=str).encode()
        for secret in ("zanzibarquux", "quokkavault", "describe the", "juliet"):
            assert secret.encode() not in blob, (path.name, secret)


def test_openai_chat_segment_cache_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.ingest.readers import openai_chat

    system = {"role": "system", "content": "a long shared system prompt " * 4}
    history: list[dict[str, str]] = [system]
    lines = []
    for turn in range(4):
        history.append({"role": "user", "content": f"question {turn} " * 10})
        reply = {"role": "assistant", "content": f"answer {turn} " * 12}
        lines.append(
            {
                "created": 1767225600 + turn,
                "messages": list(history),
                "choices": [{"message": reply}],
            }
        )
        history.append(reply)
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cached = read(path, ctx(block=2)).requests
    monkeypatch.setattr(openai_chat.SegmentCache, "MIN_CHARS", 10**9)  # cache never used
    uncached = read(path, ctx(block=2)).requests
    assert_frame_equal(cached, uncached)
    hashes = cached["prefix_hashes"].to_list()
    for earlier, later in itertools.pairwise(hashes):
        assert later[: len(earlier)] == earlier  # each turn extends the previous exchange
