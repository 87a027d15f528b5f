"""Hostile input to the readers: files that are not what they seem, damaged
compression, odd encodings, detection limits, units and block counts that do not add up.

Each test states the hand-computed expectation: the exact error (type and the message's key
parts) or the exact rows, dates and counts.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import zstandard

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ingest.compute import ingest_paths, ingest_sources
from pipeline.ingest.present import summary_text
from pipeline.ingest.readers import ReadContext, ReadResult, SourceFile, detect_reader, reader_named
from pipeline.ingest.readers import source as source_module
from pipeline.schema import conform
from pipeline.sim.blocks import sim_input
from tests.conftest import DEFAULTS, write_config
from tests.test_readers_text_formats import WordTokenizer, ref_chain, words

ANCHOR = datetime(2025, 3, 1, tzinfo=UTC)
SALT = b"test-salt"
CTX = ReadContext(block_size=4, salt=SALT, anchor=ANCHOR, tokenizer=WordTokenizer())


def jline(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def token_lines(n: int) -> bytes:
    """``n`` token-id records, ts = line index (seconds after the anchor)."""
    return b"".join(jline({"ts": i, "prompt_token_ids": [i, 1, 2, 3, 4]}) for i in range(n))


def read(path: Path, context: ReadContext = CTX) -> tuple[str, ReadResult]:
    source = SourceFile.of(path)
    reader = detect_reader(source)
    return reader.name, reader.read(source, context)


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a command that must fail with exit code 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("enginefit: error: ")
    assert "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.fixture(autouse=True)
def _salt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "hostile-test")
    monkeypatch.chdir(tmp_path)  # no ./enginefit.yaml: built-in defaults


# ---------------------------------------------------------------------------------------------
# 1. Truncated compressed files are errors, never shorter traces


def test_truncated_zstd_is_an_error_naming_the_file(tmp_path: Path) -> None:
    whole = zstandard.ZstdCompressor().compress(token_lines(2000))
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputFormatError) as info:
        read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: truncated compressed file")
    assert "ends in the middle of a frame" in message


def test_truncated_gzip_is_the_same_error(tmp_path: Path) -> None:
    whole = gzip.compress(token_lines(2000))
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputFormatError, match=r"truncated compressed file") as info:
        read(path)
    assert str(info.value).startswith(f"{path}: ")


def test_truncated_zstd_fails_the_ingest_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = zstandard.ZstdCompressor().compress(token_lines(2000))
    (tmp_path / "t.jsonl.zst").write_bytes(whole[:-10])
    line = cli_error(["ingest", "t.jsonl.zst", "--out", "out"], capsys)
    assert line.startswith("enginefit: error: t.jsonl.zst: truncated compressed file")
    assert not (tmp_path / "out" / "requests").exists()


def test_complete_and_concatenated_zstd_frames_read_in_full(tmp_path: Path) -> None:
    data = token_lines(2000)
    cut = data.index(b"\n", len(data) // 2) + 1
    compressor = zstandard.ZstdCompressor()
    one = tmp_path / "one.zst"
    one.write_bytes(compressor.compress(data))
    two = tmp_path / "two.zst"  # `cat a.zst b.zst`, as pzstd and log rotation write
    two.write_bytes(compressor.compress(data[:cut]) + compressor.compress(data[cut:]))
    for path in (one, two):
        name, result = read(path)
        assert name == "token-ids" and result.records_read == result.requests.height == 2000
        assert result.requests["source_line"].to_list() == list(range(1, 2001))


def test_corrupt_gzip_body_is_a_clean_error(tmp_path: Path) -> None:
    whole = bytearray(gzip.compress(token_lines(200)))
    whole[40:60] = bytes(20)  # damage the deflate stream, keep the header
    path = tmp_path / "bad.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(InputFormatError, match=r"cannot decompress|truncated") as info:
        read(path)
    assert str(info.value).startswith(f"{path}: ")


# ---------------------------------------------------------------------------------------------
# 2. Non-regular files are refused at once (never a hang)

NOT_REGULAR = "is a FIFO or pipe, not a regular file"


def finishes(action: Any, seconds: float = 120.0) -> BaseException | None:
    """Run ``action`` in a thread; fail (rather than hang the suite) when it blocks. The wait
    is long enough that only a real block, never a busy machine, reaches it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            action()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"blocked for {seconds} s"
    return outcome[0]


def test_fifo_without_writer_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    for action in (lambda: read(fifo), lambda: SourceFile.of(fifo).size()):
        exc = finishes(action)
        assert isinstance(exc, InputFormatError)
        assert str(exc).startswith(f"{fifo}: {NOT_REGULAR}")
        assert "save the stream to a file first" in str(exc)


def test_fifo_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "trace.fifo")
    for argv in (["ingest", "trace.fifo", "--out", "out"], ["shape", "trace.fifo"]):
        code: list[int] = []
        assert finishes(lambda argv=argv, code=code: code.append(main(argv))) is None
        assert code == [2]
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (
            f"enginefit: error: trace.fifo: {NOT_REGULAR}; a trace is read more than once "
            "(to detect its format, to read it, to checksum it), so save the stream to a file "
            "first (e.g. `cat … > trace.jsonl`) and name that file"
        )


def test_process_substitution_pipe_is_refused() -> None:
    # `<(cat trace)` hands the command /dev/fd/N, the read end of a pipe.
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, token_lines(3))
        exc = finishes(lambda: read(Path(f"/dev/fd/{read_end}")))
        assert isinstance(exc, InputFormatError)
        assert str(exc).startswith(f"/dev/fd/{read_end}: {NOT_REGULAR}")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_character_device_is_refused() -> None:
    with pytest.raises(InputFormatError, match=r"^/dev/null: is a character device, not a regular"):
        read(Path("/dev/null"))


# ---------------------------------------------------------------------------------------------
# 3-4. Missing files, broken and looping links, permissions: what is wrong, by name


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["ingest", "nope.jsonl", "--out", "out"], capsys)
    assert line == "enginefit: error: nope.jsonl: file not found"


def test_dangling_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "link.jsonl").symlink_to("gone.jsonl")
    line = cli_error(["shape", "link.jsonl"], capsys)
    assert line == (
        "enginefit: error: link.jsonl: broken symbolic link: it points to gone.jsonl, which does "
        "not exist"
    )


def test_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.jsonl").symlink_to("b.jsonl")
    (tmp_path / "b.jsonl").symlink_to("a.jsonl")
    line = cli_error(["ingest", "a.jsonl", "--out", "out"], capsys)
    assert line == (
        "enginefit: error: a.jsonl: symbolic link loop: the link leads back to itself; fix or "
        "remove it"
    )


def test_symlink_to_a_trace_reads_the_trace(tmp_path: Path) -> None:
    (tmp_path / "real.jsonl").write_bytes(token_lines(3))
    (tmp_path / "link.jsonl").symlink_to("real.jsonl")
    name, result = read(tmp_path / "link.jsonl")
    assert name == "token-ids" and result.requests.height == 3


PERMISSION = "permission denied: the file (or a folder above it) is not readable by you"


def test_permission_error_is_not_a_decompression_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root here, which reads any file: the refusal is simulated at os.open.
    path = tmp_path / "secret.jsonl.gz"
    path.write_bytes(gzip.compress(token_lines(3)))
    real_open = os.open

    def denied(target: Any, flags: int, *args: Any) -> int:
        if Path(target) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(target))
        return real_open(target, flags, *args)

    monkeypatch.setattr(source_module.os, "open", denied)
    for action in (lambda: read(path), lambda: SourceFile.of(path).size()):
        with pytest.raises(InputFormatError) as info:
            action()
        assert str(info.value) == f"{path}: {PERMISSION}"
        assert "decompress" not in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_for_real(tmp_path: Path) -> None:
    path = tmp_path / "secret.jsonl"
    path.write_bytes(token_lines(3))
    path.chmod(0)
    with pytest.raises(InputFormatError) as info:
        read(path)
    assert str(info.value) == f"{path}: {PERMISSION}"


# ---------------------------------------------------------------------------------------------
# 5. A UTF-8 byte-order mark is not part of line 1

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("codec", ["plain", "gzip", "zstd"])
def test_bom_on_json_lines(tmp_path: Path, codec: str) -> None:
    data = BOM + token_lines(3)
    if codec == "gzip":
        data = gzip.compress(data)
    elif codec == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(data)
    name, result = read(path)
    assert name == "token-ids"
    assert result.quarantine.height == 0
    assert result.requests["source_line"].to_list() == [1, 2, 3]
    assert result.requests["arrival"].to_list() == [
        ANCHOR + timedelta(seconds=s) for s in (0, 1, 2)
    ]


def test_bom_on_chat_logs_and_csv(tmp_path: Path) -> None:
    chat = {
        "created": 1767225600,
        "request": {"messages": [{"role": "user", "content": "hello there"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
    }
    (tmp_path / "chat.jsonl").write_bytes(BOM + jline(chat))
    name, result = read(tmp_path / "chat.jsonl")
    assert (name, result.requests.height, result.quarantine.height) == ("openai-chat", 1, 0)
    csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"
    (tmp_path / "azure.csv").write_bytes(BOM + csv.encode())
    name, result = read(tmp_path / "azure.csv")
    assert (name, result.requests.height, result.quarantine.height) == ("azure", 1, 0)
    assert result.requests["prompt_tokens"].to_list() == [4808]


def test_utf16_is_named(tmp_path: Path) -> None:
    path = tmp_path / "u16.jsonl"
    path.write_bytes(token_lines(2).decode().encode("utf-16"))
    with pytest.raises(InputFormatError, match=r"file is UTF-16 text; traces are read as UTF-8"):
        read(path)


# ---------------------------------------------------------------------------------------------
# 6. A header-only CSV says so, and the counts still reconcile


def test_header_only_csv_says_header_and_no_records(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\n")
    result = ingest_paths([path], salt=SALT, anchor=ANCHOR)
    s = result.summary
    assert (s.records_read, s.ingested, s.quarantined) == (0, 0, 0)
    assert s.notes == [
        f"{path}: the file has a header and no records",
        "no record to ingest: the input holds no records",
    ]
    text = summary_text(s)
    assert "see the quarantine" not in text
    assert f"note: {path}: the file has a header and no records" in text


def test_quarantine_note_only_when_something_was_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,-1,10\n")
    s = ingest_paths([path], salt=SALT, anchor=ANCHOR).summary
    assert (s.records_read, s.ingested, s.quarantined) == (1, 0, 1)
    assert s.notes == ["no record could be ingested; see the quarantine for why"]


# ---------------------------------------------------------------------------------------------
# 7. Mooncake timestamps: ms since start, or epoch ms, never 2053


def mooncake(ts: Any) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}


def test_mooncake_epoch_milliseconds_are_absolute(tmp_path: Path) -> None:
    stamps = [
        0,  # trace start: the anchor
        27_000,  # 27 s into the trace
        1_767_225_600_000,  # 2026-01-01T00:00:00Z in epoch ms
        1_767_225_600_500,  # half a second later
        1_700_000_000_000,  # 2023-11-14T22:13:20Z (not 2053-11-14)
    ]
    (tmp_path / "m.jsonl").write_bytes(b"".join(jline(mooncake(t)) for t in stamps))
    name, result = read(tmp_path / "m.jsonl")
    assert name == "mooncake" and result.quarantine.height == 0
    assert result.requests["arrival"].to_list() == [
        ANCHOR,
        ANCHOR + timedelta(seconds=27),
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC),
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
    ]


def test_mooncake_finer_epochs_are_unit_mismatches(tmp_path: Path) -> None:
    stamps = [1_767_225_600_000_000, 1_767_225_600_000_000_000, -5]
    (tmp_path / "m.jsonl").write_bytes(
        jline(mooncake(0)) + b"".join(jline(mooncake(t)) for t in stamps)
    )
    _, result = read(tmp_path / "m.jsonl")
    q = result.quarantine.sort("source_line")
    assert q.select("source_line", "field", "reason", "detail").rows() == [
        (2, "timestamp", "timestamp_unit_mismatch", "value looks like µs, expected ms"),
        (3, "timestamp", "timestamp_unit_mismatch", "value looks like ns, expected ms"),
        (4, "timestamp", "negative", "value -5.0"),
    ]


# ---------------------------------------------------------------------------------------------
# 8. Block size: bounded, and a prompt shorter than a block is known to have no block

BLOCK_BOUND = "a block size is 1 to 4096 tokens (engines use 1-128, Mooncake traces 512)"


@pytest.mark.parametrize("size", [0, 4097, 10**9])
def test_config_block_size_is_bounded(tmp_path: Path, size: int) -> None:
    path = write_config(tmp_path, ["t.jsonl"], block_size=size)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: workload.block_size: {BLOCK_BOUND} (got {size})"


def test_config_block_size_bounds_are_inclusive(tmp_path: Path) -> None:
    for size in (1, 512, 4096):
        path = write_config(tmp_path, ["t.jsonl"], block_size=size)
        assert load_config(path).require_workload().block_size == size
    assert DEFAULTS.prefix.replace(block_size=4096).block_size == 4096


@pytest.mark.parametrize("command", ["ingest", "shape", "prefix"])
@pytest.mark.parametrize("size", ["0", "-3", "1000000000"])
def test_block_size_flag_is_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, size: str
) -> None:
    (tmp_path / "t.jsonl").write_bytes(token_lines(3))
    argv = [command, "t.jsonl", "--block-size", size] + (
        ["--out", "out"] if command == "ingest" else []
    )
    line = cli_error(argv, capsys)
    assert line == f"enginefit: error: --block-size: {BLOCK_BOUND} (got {int(size)})"


def test_prompt_shorter_than_a_block(tmp_path: Path) -> None:
    lines = [
        {"ts": 0, "prompt_token_ids": [1, 2, 3]},  # 3 < 4 tokens: no full block
        {"ts": 1, "prompt_token_ids": [1, 2, 3], "output_token_ids": [9, 9]},  # 1 block w/ output
        {"ts": 2, "prompt_token_ids": [1, 2, 3, 4, 5]},  # 1 full block
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(jline(x) for x in lines))
    result = ingest_paths([path], block_size=4, salt=SALT, anchor=ANCHOR)
    got = result.requests.select("prompt_blocks", "hashes_known", "prefix_hashes").rows()
    assert got == [
        (0, True, []),
        (0, True, ref_chain([1, 2, 3, 9, 9], 4)),
        (1, True, ref_chain([1, 2, 3, 4, 5], 4)),
    ]
    assert (
        "2 of 3 request(s) with content have prompts shorter than one block (4 tokens): no full "
        "block, so a prefix cache can never serve them"
    ) in result.summary.notes


# ---------------------------------------------------------------------------------------------
# 9. Detection sees the first whole record, whatever its size


def test_chat_log_with_a_large_first_record_is_detected(tmp_path: Path) -> None:
    big = " ".join(["word"] * 200_000)  # ~1 MB, four times the old 256 KiB head
    chat = {
        "created": 1767225600,
        "request": {"messages": [{"role": "user", "content": big}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
    }
    path = tmp_path / "chat.jsonl"
    path.write_bytes(jline(chat) + jline({**chat, "created": 1767225601}))
    name, result = read(path)
    assert name == "openai-chat" and result.requests.height == 2
    # "<|im_start|>user" + 200,000 words + "<|im_end|>" + "<|im_start|>assistant"
    assert result.requests["prompt_tokens"].to_list() == [200_003, 200_003]


def test_fifty_megabyte_first_line_is_detected(tmp_path: Path) -> None:
    record = {
        "provider": "codex",
        "session_id": "codex:s",
        "round_index": 0,
        "input_tokens_total": 100,
        "output_tokens": 9,
        "timing_events": [{"event_type": "user_message", "timestamp": "2026-03-21T10:05:59Z"}],
    }
    path = tmp_path / "round_trace.jsonl"
    path.write_bytes(jline({**record, "notes": "x" * 50_000_000}) + jline(record))
    source = SourceFile.of(path)
    assert detect_reader(source).name == "tracelab"


def test_first_record_beyond_the_detection_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_module, "DETECT_MAX_BYTES", 1024 * 1024)
    monkeypatch.setattr(source_module, "CHUNK_BYTES", 256 * 1024)
    path = tmp_path / "huge.jsonl"
    path.write_bytes(jline({"ts": 0, "prompt_token_ids": [1] * 1_000_000}))
    with pytest.raises(InputFormatError) as info:
        detect_reader(SourceFile.of(path))
    assert str(info.value) == (
        f"{path}: the first record is longer than 1 MiB, too long to detect the format; name it "
        "with --format (or the trace's `format:` in the configuration)"
    )
    # Named, the format reads without detection.
    result = reader_named("token-ids").read(SourceFile.of(path), CTX)
    assert result.requests["prompt_tokens"].to_list() == [1_000_000]


def test_a_damaged_first_line_is_quarantined_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"ts": 0, "prompt_token_ids": [1, 2\n' + token_lines(2))
    name, result = read(path)
    assert name == "token-ids"
    assert result.quarantine.select("source_line", "reason").rows() == [(1, "invalid_json")]
    assert result.requests["source_line"].to_list() == [2, 3]


def test_prose_is_still_unrecognised(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"{ not json\n" + b"plain words\n" * 20)
    with pytest.raises(InputFormatError, match="unrecognised trace format"):
        read(path)


# ---------------------------------------------------------------------------------------------
# 10. Logged prompt_tokens below the rendering: capped blocks, and the workload replays


def chat(content: str, prompt_tokens: int | None, created: int = 1767225600) -> dict[str, Any]:
    response: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "x y"}}]}
    if prompt_tokens is not None:
        response["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 3}
    return {
        "created": created,
        "request": {"messages": [{"role": "user", "content": content}]},
        "response": response,
    }


def test_chat_prompt_blocks_capped_at_the_logged_count(tmp_path: Path) -> None:
    # Rendering: "<|im_start|>user" + 8 words + "<|im_end|>" + "<|im_start|>assistant" = 11
    # tokens, 2 full blocks of 4; reply "x y" + "<|im_end|>" makes 14 tokens, 3 blocks.
    text = "a b c d e f g h"
    path = tmp_path / "chat.jsonl"
    path.write_bytes(
        jline(chat(text, 5))  # provider counted 5: 1 block
        + jline(chat(text, 3, 1767225601))  # 3: no full block
        + jline(chat(text, 11, 1767225602))  # agrees with the rendering
        + jline(chat(text, None, 1767225603))  # no usage: the rendering's own count
    )
    source = SourceFile.of(path)
    result = ingest_sources([source], CTX)
    rendered = words(f"<|im_start|>user {text} <|im_end|> <|im_start|>assistant x y <|im_end|>")
    chain = ref_chain(rendered, 4, SALT)
    got = result.requests.select("prompt_tokens", "prompt_blocks", "prefix_hashes").rows()
    assert got == [(5, 1, chain), (3, 0, chain), (11, 2, chain), (11, 2, chain)]
    assert result.summary.prompt_blocks_capped == 2
    assert (
        "2 request(s) hashed to more full prompt blocks than their logged prompt token count "
        "fills (an approximate tokenizer counting more than the provider); their prompt blocks "
        "were capped at the logged count"
    ) in result.summary.notes
    replay = sim_input(result.requests, latency_model=DEFAULTS.shape.latency)
    assert replay.prompt_blocks.tolist() == [1, 0, 2, 2]
    view = replay.blocks(4)
    # Hits may cover at most ⌊(P − 1) / B⌋ blocks of the logged prompt.
    assert view.hit_limit.tolist() == [1, 0, 2, 2]


def test_capped_count_in_the_summary_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "chat.jsonl").write_bytes(jline(chat("a b c d e f g h", 5)))
    assert main(["ingest", "chat.jsonl", "--block-size", "4", "--out", "out", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["prompt_blocks_capped"] == 1
    stored = json.loads((tmp_path / "out" / "ingest_summary.json").read_text())
    assert stored["prompt_blocks_capped"] == 1


def test_canonical_rows_that_cannot_replay_are_quarantined(tmp_path: Path) -> None:
    frame = conform(
        pl.DataFrame(
            {
                "request_id": ["ok", "over_tokens", "over_chain"],
                "arrival": [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(3)],
                "prompt_tokens": [8, 7, 8],
                "output_tokens": [1, 1, 1],
                "block_size": [4, 4, 4],
                "prefix_hashes": [[1, 2], [1, 2], [1]],
                "prompt_blocks": [2, 2, 2],
                "hashes_known": [True, True, True],
                "tokens_approximate": [False, False, False],
            }
        )
    )
    path = tmp_path / "c.parquet"
    frame.write_parquet(path)
    name, result = read(path)
    assert name == "canonical-parquet"
    assert result.requests["request_id"].to_list() == ["ok"]
    assert result.quarantine.select("source_line", "field", "reason").rows() == [
        (2, "prompt_blocks", "exceeds_prompt_tokens"),
        (3, "prompt_blocks", "exceeds_prefix_hashes"),
    ]


# A \u escape naming half a UTF-16 pair is valid JSON but no text: quarantined, whichever reader.

LONE_SURROGATE_LINES = {
    "token-ids": {
        "ts": 1.0,
        "session_id": "\ud800",
        "prompt_token_ids": [1, 2],
        "output_tokens": 1,
    },
    "prompt-text": {"ts": 1.0, "prompt": "hello \udc00 world", "output_tokens": 2, "duration_s": 1},
    "mooncake": {
        "timestamp": 5,
        "input_length": 20,
        "output_length": 2,
        "hash_ids": [1],
        "x": "\ud800",
    },
}


@pytest.mark.parametrize("fmt", sorted(LONE_SURROGATE_LINES))
def test_a_lone_surrogate_escape_is_quarantined_not_a_crash(tmp_path: Path, fmt: str) -> None:
    bad = json.dumps(LONE_SURROGATE_LINES[fmt])  # ensure_ascii: written as a \u escape
    assert "\\ud" in bad
    good = {k: v for k, v in LONE_SURROGATE_LINES[fmt].items() if k != "x"}
    good = {k: ("text" if isinstance(v, str) else v) for k, v in good.items()}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(good) + "\n" + bad + "\n")
    reader = reader_named(fmt)
    result = reader.read(SourceFile.of(path), CTX)
    assert result.requests.height == 1 and result.records_read == 2
    row = result.quarantine.row(0, named=True)
    assert (row["source_line"], row["reason"]) == (2, "invalid_utf8")
    assert "lone surrogate" in row["detail"]
