"""A compiled scanner for token-id JSONL records, a batch of whole lines at a time.

It reads the record shape token-id traces write, ``{"ts": …, "session_id": …,
"prompt_token_ids": [ints], "output_token_ids": [ints] or "output_tokens": n, …}`` (in any key
order, with any JSON spacing), straight from the bytes into columns, and claims nothing else:
a line it is not certain of is marked :data:`PYTHON`, and the reader decodes that line with
``json`` and converts it exactly as any JSON Lines reader does
(:meth:`~pipeline.ingest.readers.base.JsonLinesReader.record_row`), which is where every quarantine
reason and detail comes from. The building blocks are :mod:`pipeline.ingest.readers.mooncake_scan`'s.

So a line is :data:`FAST` only when ``json.loads`` would return an object that
:meth:`~pipeline.ingest.readers.token_ids.TokenIdsReader.convert` accepts with the values scanned here:

- the line is ASCII, a JSON object, with JSON whitespace (space, tab, CR) between tokens, and no
  key the reader reads appears twice or is spelled with escapes;
- ``ts`` is a non-negative number: an integer of at most 15 digits (exact as a float), or a
  fraction/exponent whose text the reader converts with ``float`` (as ``json`` does); the
  reader checks its range and units;
- ``prompt_token_ids`` is a list, and ``output_token_ids`` a list or null or absent, of
  integers in ``[0, 2**32)`` written without a sign, at most
  :data:`~pipeline.schema.MAX_PLAUSIBLE_TOKENS` of them;
- ``output_tokens`` and ``turn`` are null, absent or integers of at most 8 digits no larger than
  :data:`~pipeline.schema.MAX_PLAUSIBLE_TOKENS`, and ``output_tokens`` equals the number of
  output ids when both are given;
- ``duration_s`` / ``ttft_s`` are null, absent or non-negative numbers (integers of at most 15
  digits, or fractions/exponents the reader converts and checks are finite);
- the text fields (session: ``session_id``, ``session``, ``conversation_id``,
  ``conversation``, ``thread_id``; tenant: ``tenant``, ``tenant_id``, ``user``, ``user_id``;
  ``model``; request id: ``request_id``, ``id``) are null, absent, strings of printable ASCII
  without escapes, or unsigned integers of at most 18 digits (whose ``str`` is their text);
- any other key's value is a plain string, number, ``true``, ``false`` or ``null``.

A line of whitespace only (as ``bytes.strip`` sees it) is :data:`BLANK`: not a record.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from pipeline.ingest.readers.mooncake_scan import (
    BLANK,
    FAST,
    OBJECT_END,
    PYTHON,
    _digits,
    _literal_end,
    _member_key,
    _next_member,
    _number_end,
    _plain_string_end,
    _scalar_end,
    _skip_ws,
    _unsigned,
    _words,
    line_bounds,
)
from pipeline.schema import MAX_PLAUSIBLE_TOKENS

__all__ = ["BLANK", "FAST", "KEYS", "PYTHON", "TEXT_GROUPS", "scan_lines"]

_TS_DIGITS = 15  # integers below 10**15 are exact as float64, as json's int -> float() is
_COUNT_DIGITS = 8  # MAX_PLAUSIBLE_TOKENS has 8 digits
_ID_DIGITS = 10  # 2**32 - 1 has 10 digits
_TEXT_DIGITS = 18
_TOKEN_ID_MAX = 0xFFFFFFFF

_QUOTE, _COMMA, _COLON, _ZERO = 34, 44, 58, 48
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93
_MINUS, _DOT = 45, 46

# Keys in _word_at's 1-based numbering; the text groups keep the reader's order of preference
# (pipeline.ingest.readers.prompt_text: the first key present with a non-null value wins).
KEYS = (
    "ts",
    "timestamp",
    "prompt_token_ids",
    "output_token_ids",
    "output_tokens",
    "turn",
    "duration_s",
    "ttft_s",
    "session_id",
    "session",
    "conversation_id",
    "conversation",
    "thread_id",
    "tenant",
    "tenant_id",
    "user",
    "user_id",
    "model",
    "request_id",
    "id",
)
_TS, _TIMESTAMP, _PROMPT, _OUTPUT_IDS, _OUTPUT_TOKENS, _TURN, _DURATION, _TTFT = range(1, 9)
_FIRST_TEXT = 9
# Per text key (from _FIRST_TEXT on): its group (session, tenant, model, request id) and its
# rank within the group.
TEXT_GROUPS = ("session_id", "tenant", "model", "request_id")
_TEXT_GROUP = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3], dtype=np.int64)
_TEXT_RANK = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 1], dtype=np.int64)
_KEY_TABLE, _KEY_LENGTHS = _words(KEYS)


@nb.njit(cache=True)
def _id_list(
    buf: npt.NDArray[np.uint8], i: int, end: int, ids: npt.NDArray[np.uint32], id_start: int
) -> tuple[int, int]:
    """Past a list of token ids at ``i``, each stored from ``ids[id_start]``, and how many; -1
    (and 0) when it is not a list of unsigned integers below 2**32 (or holds more than
    :data:`MAX_PLAUSIBLE_TOKENS`). One pass over each id's bytes: this is where a line's bytes
    are, so the digits are read up to the first non-digit without looking at ``end``: the byte
    at ``end`` is a newline or the sentinel after the block (:func:`scan_lines`)."""
    if buf[i] != _LBRACKET:
        return -1, 0
    i = _skip_ws(buf, i + 1, end)
    if i < end and buf[i] == _RBRACKET:
        return i + 1, 0
    n = 0
    room = min(ids.size - id_start, MAX_PLAUSIBLE_TOKENS)
    zero, nine, ten = np.uint64(_ZERO), np.uint64(9), np.uint64(10)
    while True:
        first = i
        value = np.uint64(buf[i]) - zero  # a non-digit wraps past 9
        if value > nine or n >= room:
            return -1, 0
        i += 1
        if value:  # JSON forbids leading zeros: a 0 is the whole integer part
            digit = np.uint64(buf[i]) - zero
            while digit <= nine:
                value = value * ten + digit
                i += 1
                digit = np.uint64(buf[i]) - zero
            # more digits than 2**32 - 1 has: out of range (whatever the wrapped value says)
            if i - first > _ID_DIGITS or value > _TOKEN_ID_MAX:
                return -1, 0
        ids[id_start + n] = value
        n += 1
        if buf[i] == _COMMA:  # the usual case: ", " and the next id (never at ``end``)
            i += 1
            if buf[i] == 32:
                i += 1
            i = _skip_ws(buf, i, end)
            continue
        i = _skip_ws(buf, i, end)  # anything but a separator (".", "e", "-") ends here
        if i < end and buf[i] == _RBRACKET:
            return i + 1, n
        if i >= end or buf[i] != _COMMA:
            return -1, 0
        i = _skip_ws(buf, i + 1, end)


@nb.njit(cache=True)
def _count(buf: npt.NDArray[np.uint8], i: int, end: int) -> tuple[int, int]:
    """Past a plain count at ``i`` (an unsigned integer of at most 8 digits, no larger than
    :data:`MAX_PLAUSIBLE_TOKENS`) and its value; -1 when it is anything else."""
    stop = _digits(buf, i, end)
    if buf[i] == _MINUS or stop < 0 or stop - i > _COUNT_DIGITS:
        return -1, 0
    if stop < end and (buf[stop] == _DOT or buf[stop] == 101 or buf[stop] == 69):
        return -1, 0
    value = _unsigned(buf, i, stop)
    if value > MAX_PLAUSIBLE_TOKENS:
        return -1, 0
    return stop, value


@nb.njit(cache=True)
def _is_null(buf: npt.NDArray[np.uint8], i: int, end: int) -> bool:
    return i + 4 <= end and buf[i] == 110 and _literal_end(buf, i, end) == i + 4


@nb.njit(cache=True)
def _scan_line(
    buf: npt.NDArray[np.uint8],
    start: int,
    end: int,
    row: int,
    ts_int: npt.NDArray[np.int64],
    spans: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    texts: npt.NDArray[np.int64],
    ids: npt.NDArray[np.uint32],
    id_start: int,
) -> int:
    """Scan one line into row ``row``; the number of ids stored from ``id_start``, or -1 when
    the line is not certainly a clean record (the reader then decodes it in Python).

    ``spans[row]``: text spans of ``ts`` (when not a plain integer), ``duration_s``,
    ``ttft_s`` (start, stop; -1 when absent). ``counts[row]``: prompt ids start and count,
    output ids start and count, ``output_tokens`` and ``turn`` (-1 when null).
    ``texts[row]``: per text group, the span of the preferred key's text and its rank."""
    i = _skip_ws(buf, start, end)
    if i >= end or buf[i] != 123:
        return -1
    i = _skip_ws(buf, i + 1, end)
    if i < end and buf[i] == _RBRACE:
        return -1  # {}: the reader says what is missing
    seen = 0
    n_ids = 0
    output_tokens = -1
    has_output_ids = False
    while True:
        i, key, seen = _member_key(buf, i, end, seen, _KEY_TABLE, _KEY_LENGTHS)
        if i < 0:
            return -1
        c = buf[i]
        if key == _TS:
            if c == _MINUS:
                return -1
            stop = _digits(buf, i, end)
            after = _number_end(buf, i, end)
            if stop < 0 or after < 0:
                return -1
            if after == stop:
                if stop - i > _TS_DIGITS:
                    return -1
                ts_int[row] = _unsigned(buf, i, stop)
            else:  # a fraction or an exponent: the reader converts the text with float()
                spans[row, 0] = i
                spans[row, 1] = after
            i = after
        elif _PROMPT <= key <= _OUTPUT_IDS:
            if key == _OUTPUT_IDS and _is_null(buf, i, end):
                i += 4
            else:
                at = id_start + n_ids
                i, n = _id_list(buf, i, end, ids, at)
                if i < 0:
                    return -1
                slot = 0 if key == _PROMPT else 2
                counts[row, slot] = at
                counts[row, slot + 1] = n
                n_ids += n
                has_output_ids = has_output_ids or key == _OUTPUT_IDS
        elif _OUTPUT_TOKENS <= key <= _TURN:
            if _is_null(buf, i, end):
                i += 4
            else:
                i, value = _count(buf, i, end)
                if i < 0:
                    return -1
                if key == _OUTPUT_TOKENS:
                    output_tokens = value
                else:
                    counts[row, 5] = value
        elif _DURATION <= key <= _TTFT:
            if _is_null(buf, i, end):
                i += 4
            else:
                if c == _MINUS:
                    return -1
                stop = _digits(buf, i, end)
                after = _number_end(buf, i, end)
                if stop < 0 or after < 0 or (after == stop and stop - i > _TS_DIGITS):
                    return -1  # a longer integer may not convert to a float (json's int)
                slot = 2 if key == _DURATION else 4
                spans[row, slot] = i
                spans[row, slot + 1] = after
                i = after
        elif key >= _FIRST_TEXT:
            if _is_null(buf, i, end):
                i += 4
            else:
                if c == _QUOTE:
                    after = _plain_string_end(buf, i, end)
                    if after < 0:
                        return -1
                    text_start, text_stop = i + 1, after - 1
                else:
                    after = _digits(buf, i, end)
                    if c == _MINUS or after < 0 or after - i > _TEXT_DIGITS:
                        return -1
                    if after < end and (
                        buf[after] == _DOT or buf[after] == 101 or buf[after] == 69
                    ):
                        return -1
                    text_start, text_stop = i, after
                group = _TEXT_GROUP[key - _FIRST_TEXT]
                rank = _TEXT_RANK[key - _FIRST_TEXT]
                if rank < texts[row, group, 2]:
                    texts[row, group, 0] = text_start
                    texts[row, group, 1] = text_stop
                    texts[row, group, 2] = rank
                i = after
        else:  # another key (``timestamp`` among them): a plain scalar is skipped
            i = _scalar_end(buf, i, end)
            if i < 0:
                return -1
        i = _next_member(buf, i, end)
        if i == OBJECT_END:
            break
        if i < 0:
            return -1
    if not (seen & (1 << _TS)) or not (seen & (1 << _PROMPT)):
        return -1
    if has_output_ids:
        if output_tokens >= 0 and output_tokens != counts[row, 3]:
            return -1  # length_mismatch: the reader quarantines it
        output_tokens = counts[row, 3]
    counts[row, 4] = output_tokens
    return n_ids


def scan_lines(
    block: bytes,
) -> tuple[
    npt.NDArray[np.uint8],
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.uint32],
]:
    """Scan every line of ``block`` (lines end with LF; the last one may lack it).

    Returns the block's bytes as an array (one zero byte longer: the sentinel after its last
    line) and per line: its kind (:data:`BLANK`, :data:`FAST`, :data:`PYTHON`), its byte span
    (``bounds[:, 0:2]``, without the LF), and for :data:`FAST` lines the integer timestamp,
    ``spans`` (``ts`` text when not a plain integer, ``duration_s``, ``ttft_s``: start and stop
    columns 0-5, -1 when absent), ``counts`` (prompt ids start and count, output ids start and
    count in ``ids``, output tokens, turn; -1 for null output tokens or turn) and ``texts``
    (per group of :data:`TEXT_GROUPS`, the span of its text, start -1 when none); then the
    token ids of every :data:`FAST` line.
    """
    buf = np.frombuffer(block + b"\0", dtype=np.uint8)
    return buf, *_scan_lines(buf, len(block))


@nb.njit(cache=True)
def _scan_lines(
    buf: npt.NDArray[np.uint8],
    size: int,
) -> tuple[
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.uint32],
]:
    """:func:`scan_lines` on ``buf[:size]``, ``buf[size]`` being a sentinel byte."""
    kinds, bounds = line_bounds(buf, size)
    n_lines = kinds.size
    ts_int = np.zeros(n_lines, dtype=np.int64)
    spans = np.full((n_lines, 6), -1, dtype=np.int64)
    counts = np.zeros((n_lines, 6), dtype=np.int64)
    texts = np.full((n_lines, len(TEXT_GROUPS), 3), -1, dtype=np.int64)
    ids = np.empty(size // 2 + 1, dtype=np.uint32)  # an id takes a digit and a separator
    used = 0
    for row in range(n_lines):
        if kinds[row] == BLANK:
            continue
        counts[row, 5] = -1
        texts[row, :, 2] = 1 << 30
        start, end = bounds[row, 0], bounds[row, 1]
        n = _scan_line(buf, start, end, row, ts_int, spans, counts, texts, ids, used)
        if n >= 0:
            kinds[row] = FAST
            used += n
        else:  # nothing half-scanned is left behind
            ts_int[row] = 0
            spans[row] = -1
            counts[row] = 0
            texts[row, :, 0:2] = -1
    return kinds, bounds, ts_int, spans, counts, texts, ids[:used]
