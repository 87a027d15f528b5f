"""A compiled scanner for Mooncake JSONL records, a batch of whole lines at a time.

It reads the one record shape Mooncake traces write, ``{"timestamp": …, "input_length": …,
"output_length": …, "hash_ids": [ints]}`` (in any key order, with any JSON spacing, and with
extra keys whose values are plain strings, numbers, ``true``, ``false`` or ``null``), straight
from the bytes into columns, and claims nothing else: a line it is not certain of is marked
:data:`PYTHON`, and the reader decodes that line with ``json`` and converts it exactly as any
JSON Lines reader does (:meth:`~pipeline.ingest.readers.base.JsonLinesReader.record_row`), which is
where every quarantine reason and detail comes from.

So a line is :data:`FAST` only when ``json.loads`` would return an object whose four fields
pass the reader's checks with the values scanned here:

- the line is ASCII, a JSON object, with JSON whitespace (space, tab, CR) between tokens;
- each of the four keys appears once, spelled without escapes, none ``null``;
- ``timestamp`` is a non-negative number: an integer of at most 15 digits (exact as a float),
  or a JSON fraction/exponent whose text the reader converts with ``float`` (as ``json`` does);
- the lengths are non-negative integers of at most 8 digits, no more than
  :data:`~pipeline.schema.MAX_PLAUSIBLE_TOKENS`;
- ``hash_ids`` is a list of integers of at most 18 digits (so they fit 64 bits), exactly
  ⌈input_length / 512⌉ of them.

A line of JSON whitespace only (as ``bytes.strip`` sees it: space, tab, CR, LF, VT, FF) is
:data:`BLANK`: not a record. Timestamps are checked (range, units) by the reader, not here.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from pipeline.schema import MAX_PLAUSIBLE_TOKENS

BLANK, FAST, PYTHON = 0, 1, 2
BLOCK_TOKENS = 512
_TS_DIGITS = 15  # integers below 10**15 are exact as float64, as json's int -> float() is
_LENGTH_DIGITS = 8  # MAX_PLAUSIBLE_TOKENS has 8 digits
_ID_DIGITS = 18  # below 10**18 < 2**63

_QUOTE, _BACKSLASH, _COLON, _COMMA = 34, 92, 58, 44
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93
_MINUS, _PLUS, _DOT, _ZERO, _NINE = 45, 43, 46, 48, 57
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
_TIMESTAMP, _INPUT, _OUTPUT, _HASH_IDS = 1, 2, 3, 4


def _words(words: tuple[str, ...]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """ASCII words as rows of a zero-padded byte table, and their lengths (numba constants)."""
    table = np.zeros((len(words), max(map(len, words))), dtype=np.uint8)
    for row, word in enumerate(words):
        table[row, : len(word)] = np.frombuffer(word.encode("ascii"), dtype=np.uint8)
    return table, np.array([len(w) for w in words], dtype=np.int64)


_KEY_TABLE, _KEY_LENGTHS = _words(KEYS)
_LITERAL_TABLE, _LITERAL_LENGTHS = _words(("true", "false", "null"))


@nb.njit(cache=True, inline="always")
def _is_ws(c: int) -> bool:
    return c == 32 or c == 9 or c == 13


@nb.njit(cache=True, inline="always")
def _skip_ws(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    while i < end and _is_ws(buf[i]):
        i += 1
    return i


@nb.njit(cache=True, inline="always")
def _is_digit(c: int) -> bool:
    return _ZERO <= c <= _NINE


@nb.njit(cache=True)
def _digits(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """Past ``-?(0|[1-9][0-9]*)`` at ``i`` (JSON's integer part), or -1 when it is not there."""
    if i < end and buf[i] == _MINUS:
        i += 1
    if i >= end or not _is_digit(buf[i]):
        return -1
    if buf[i] == _ZERO:
        return i + 1
    while i < end and _is_digit(buf[i]):
        i += 1
    return i


@nb.njit(cache=True)
def _number_end(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """Past a whole JSON number at ``i`` (integer, fraction, exponent), or -1."""
    i = _digits(buf, i, end)
    if i < 0:
        return -1
    if i < end and buf[i] == _DOT:
        i += 1
        if i >= end or not _is_digit(buf[i]):
            return -1
        while i < end and _is_digit(buf[i]):
            i += 1
    if i < end and (buf[i] == 101 or buf[i] == 69):  # e, E
        i += 1
        if i < end and (buf[i] == _PLUS or buf[i] == _MINUS):
            i += 1
        if i >= end or not _is_digit(buf[i]):
            return -1
        while i < end and _is_digit(buf[i]):
            i += 1
    return i


@nb.njit(cache=True)
def _plain_string_end(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """Past a string at ``i`` of printable ASCII without escapes, or -1 (anything else)."""
    if i >= end or buf[i] != _QUOTE:
        return -1
    i += 1
    while i < end:
        c = buf[i]
        if c == _QUOTE:
            return i + 1
        if c < 32 or c >= 127 or c == _BACKSLASH:
            return -1
        i += 1
    return -1


@nb.njit(cache=True)
def _word_at(
    buf: npt.NDArray[np.uint8],
    start: int,
    stop: int,
    table: npt.NDArray[np.uint8],
    lengths: npt.NDArray[np.int64],
) -> int:
    """Which word of ``table`` (1-based) ``buf[start:stop]`` is exactly, else 0."""
    n = stop - start
    for row in range(lengths.size):
        if lengths[row] != n:
            continue
        same = True
        for k in range(n):
            if buf[start + k] != table[row, k]:
                same = False
                break
        if same:
            return row + 1
    return 0


@nb.njit(cache=True)
def _literal_end(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """Past ``true``, ``false`` or ``null`` at ``i``, or -1."""
    for row in range(_LITERAL_LENGTHS.size):
        stop = i + int(_LITERAL_LENGTHS[row])
        if stop <= end and _word_at(buf, i, stop, _LITERAL_TABLE, _LITERAL_LENGTHS) == row + 1:
            return stop
    return -1


@nb.njit(cache=True)
def _member_key(
    buf: npt.NDArray[np.uint8],
    i: int,
    end: int,
    seen: int,
    table: npt.NDArray[np.uint8],
    lengths: npt.NDArray[np.int64],
) -> tuple[int, int, int]:
    """The member whose key starts at ``i``: where its value starts, the key's number in
    ``table`` (0: a key not read) and ``seen`` with it; -1 as the position when the member is
    not certainly clean (a repeated key: json keeps the last one; leave that to json)."""
    key_start = i + 1
    i = _plain_string_end(buf, i, end)
    if i < 0:
        return -1, 0, seen
    key = _word_at(buf, key_start, i - 1, table, lengths)
    if key and seen & (1 << key):
        return -1, 0, seen
    seen |= 1 << key
    i = _skip_ws(buf, i, end)
    if i >= end or buf[i] != _COLON:
        return -1, 0, seen
    i = _skip_ws(buf, i + 1, end)
    if i >= end:
        return -1, 0, seen
    return i, key, seen


@nb.njit(cache=True)
def _scalar_end(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """Just after the plain scalar at ``i`` (a string without escapes, a number, ``true``,
    ``false`` or ``null``); -1 for anything else (json decides)."""
    c = buf[i]
    if c == _QUOTE:
        return _plain_string_end(buf, i, end)
    if c == _MINUS or _is_digit(c):
        return _number_end(buf, i, end)
    return _literal_end(buf, i, end)


OBJECT_END = -2  # _next_member: the object closed, and only whitespace follows it


@nb.njit(cache=True)
def _next_member(buf: npt.NDArray[np.uint8], i: int, end: int) -> int:
    """After a member's value ending at ``i``: where the next key starts (past the comma),
    :data:`OBJECT_END` at the closing brace when nothing but whitespace follows it, else -1."""
    i = _skip_ws(buf, i, end)
    if i >= end:
        return -1
    if buf[i] == _RBRACE:
        return OBJECT_END if _skip_ws(buf, i + 1, end) == end else -1
    if buf[i] != _COMMA:
        return -1
    return _skip_ws(buf, i + 1, end)


@nb.njit(cache=True)
def _unsigned(buf: npt.NDArray[np.uint8], i: int, stop: int) -> int:
    value = 0
    while i < stop:
        value = value * 10 + (buf[i] - _ZERO)
        i += 1
    return value


@nb.njit(cache=True)
def _id_list(
    buf: npt.NDArray[np.uint8], i: int, end: int, ids: npt.NDArray[np.int64], id_start: int
) -> tuple[int, int]:
    """Past a list of integers at ``i``, each stored from ``ids[id_start]``, and how many; -1
    (and 0) when it is not a list of integers of at most :data:`_ID_DIGITS` digits. One pass
    over each id's bytes: this is where a Mooncake line's bytes are."""
    if buf[i] != _LBRACKET:
        return -1, 0
    i = _skip_ws(buf, i + 1, end)
    if i < end and buf[i] == _RBRACKET:
        return i + 1, 0
    n = 0
    while True:
        negative = i < end and buf[i] == _MINUS
        if negative:
            i += 1
        if i >= end or not _is_digit(buf[i]) or id_start + n >= ids.size:
            return -1, 0
        first = i
        value = buf[i] - _ZERO
        i += 1
        if value:  # JSON forbids leading zeros: a 0 is the whole integer part
            while i < end and _is_digit(buf[i]):
                value = value * 10 + (buf[i] - _ZERO)
                i += 1
        if i - first > _ID_DIGITS:
            return -1, 0
        ids[id_start + n] = -value if negative else value
        n += 1
        if i < end and buf[i] == _COMMA:  # the usual case: ", " and the next id
            i += 1
            if i < end and buf[i] == 32:
                i += 1
            i = _skip_ws(buf, i, end)
            continue
        i = _skip_ws(buf, i, end)  # anything but a separator (".", "e", a digit) ends here
        if i < end and buf[i] == _RBRACKET:
            return i + 1, n
        if i >= end or buf[i] != _COMMA:
            return -1, 0
        i = _skip_ws(buf, i + 1, end)


@nb.njit(cache=True)
def _scan_line(
    buf: npt.NDArray[np.uint8],
    start: int,
    end: int,
    row: int,
    ts_int: npt.NDArray[np.int64],
    ts_span: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    ids: npt.NDArray[np.int64],
    id_start: int,
) -> int:
    """Scan one line into row ``row``; the number of ids stored from ``id_start``, or -1 when
    the line is not certainly a clean record (the reader then decodes it in Python)."""
    i = _skip_ws(buf, start, end)
    if i >= end or buf[i] != _LBRACE:
        return -1
    i = _skip_ws(buf, i + 1, end)
    seen = 0
    n_ids = 0
    while True:
        i, key, seen = _member_key(buf, i, end, seen, _KEY_TABLE, _KEY_LENGTHS)
        if i < 0:
            return -1
        if key == _TIMESTAMP:
            if buf[i] == _MINUS:
                return -1
            stop = _digits(buf, i, end)
            after = _number_end(buf, i, end)
            if stop < 0 or after < 0:
                return -1
            if after == stop:
                if stop - i > _TS_DIGITS:
                    return -1
                ts_int[row] = _unsigned(buf, i, stop)
                ts_span[row, 0] = -1
            else:  # a fraction or an exponent: the reader converts the text with float()
                ts_span[row, 0] = i
                ts_span[row, 1] = after
            i = after
        elif _INPUT <= key <= _OUTPUT:
            stop = _digits(buf, i, end)
            if buf[i] == _MINUS or stop < 0 or stop - i > _LENGTH_DIGITS:
                return -1
            if stop < end and (buf[stop] == _DOT or buf[stop] == 101 or buf[stop] == 69):
                return -1
            value = _unsigned(buf, i, stop)
            if value > MAX_PLAUSIBLE_TOKENS:
                return -1
            lengths[row, key - _INPUT] = value
            i = stop
        elif key == _HASH_IDS:
            i, n_ids = _id_list(buf, i, end, ids, id_start)
            if i < 0:
                return -1
        else:  # another key: a plain scalar is skipped, anything else goes to json
            i = _scalar_end(buf, i, end)
            if i < 0:
                return -1
        i = _next_member(buf, i, end)
        if i == OBJECT_END:
            break
        if i < 0:
            return -1
    if seen & 0b11110 != 0b11110:
        return -1
    if n_ids != (lengths[row, 0] + BLOCK_TOKENS - 1) // BLOCK_TOKENS:
        return -1
    return n_ids


@nb.njit(cache=True)
def _is_blank(buf: npt.NDArray[np.uint8], start: int, end: int) -> bool:
    for i in range(start, end):
        c = buf[i]
        if not (c == 32 or 9 <= c <= 13):
            return False
    return True


@nb.njit(cache=True)
def line_bounds(
    buf: npt.NDArray[np.uint8], size: int
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """The lines of ``buf[:size]`` (they end with LF; the last one may lack it): each one's
    kind, :data:`BLANK` for whitespace only, else :data:`PYTHON` (a scanner marks what it is
    certain of :data:`FAST`), and its byte span without the LF (``bounds[:, 0:2]``)."""
    n_lines = 0
    for i in range(size):
        n_lines += buf[i] == 10
    if size and buf[size - 1] != 10:
        n_lines += 1
    kinds = np.full(n_lines, PYTHON, dtype=np.int8)
    bounds = np.empty((n_lines, 2), dtype=np.int64)
    pos = 0
    for row in range(n_lines):
        end = pos
        while end < size and buf[end] != 10:
            end += 1
        bounds[row, 0] = pos
        bounds[row, 1] = end
        if _is_blank(buf, pos, end):
            kinds[row] = BLANK
        pos = end + 1
    return kinds, bounds


@nb.njit(cache=True)
def scan_lines(
    buf: npt.NDArray[np.uint8],
) -> tuple[
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]:
    """Scan every line of ``buf`` (lines end with LF; the last one may lack it).

    Returns per line: its kind and byte span (:func:`line_bounds`), and for :data:`FAST` lines
    the integer timestamp (or the span of its text in ``ts_span`` when it has a fraction or an
    exponent; ``ts_span[:, 0]`` is -1 otherwise), the two lengths, and the run of its ids in
    ``ids`` (``id_runs[:, 0]`` start, ``id_runs[:, 1]`` count).
    """
    size = buf.size
    kinds, bounds = line_bounds(buf, size)
    n_lines = kinds.size
    ts_int = np.zeros(n_lines, dtype=np.int64)
    ts_span = np.full((n_lines, 2), -1, dtype=np.int64)
    lengths = np.zeros((n_lines, 2), dtype=np.int64)
    ids = np.empty(size // 2 + 1, dtype=np.int64)  # an id takes a digit and a separator
    id_runs = np.zeros((n_lines, 2), dtype=np.int64)
    used = 0
    for row in range(n_lines):
        if kinds[row] == BLANK:
            continue
        n = _scan_line(
            buf, bounds[row, 0], bounds[row, 1], row, ts_int, ts_span, lengths, ids, used
        )
        if n >= 0:
            kinds[row] = FAST
            id_runs[row, 0] = used
            id_runs[row, 1] = n
            used += n
    return kinds, bounds, ts_int, ts_span, lengths, ids[:used], id_runs
