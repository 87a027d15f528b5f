"""The ``prefix`` section of ``enginefit.yaml``, validated into a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.sessions import DEFAULT_MIN_SESSION_MATCH_BLOCKS

_KEYS = {
    "min_session_match_blocks",
    "reuse_age_buckets_s",
    "classify_short_window_tokens",
    "classify_long_window_tokens",
    "no_sharing_below",
    "long_context_retention",
    "block_size",
}


@dataclass(frozen=True)
class PrefixConfig:
    """Options of the prefix-sharing analysis (see ``docs/prefix.md``).

    min_session_match_blocks
        Fewest full prompt blocks a request must extend before it counts as continuing an
        earlier request's conversation (session inference).
    reuse_age_buckets_s
        Retention times (seconds, ascending) at which the reuse potential is also reported:
        the prompt tokens a cache that keeps a block this long after its last use could serve.
    classify_short_window_tokens, classify_long_window_tokens
        Windows (tokens) whose sharing ratios classify the curve's shape; the long window is
        capped at the median prompt so that at least half of the requests can reach it.
    no_sharing_below
        Shared-prefix ratio at the short window below which the shape is "no sharing".
    long_context_retention
        Ratio share(long) / share(short) at or above which the shape is "long shared context".
    block_size
        Analyse at this coarser block size (a multiple of the table's; ``None`` = the table's).
    """

    min_session_match_blocks: int = DEFAULT_MIN_SESSION_MATCH_BLOCKS
    reuse_age_buckets_s: tuple[float, ...] = (60.0, 600.0, 3600.0)
    classify_short_window_tokens: int = 256
    classify_long_window_tokens: int = 4096
    no_sharing_below: float = 0.2
    long_context_retention: float = 0.5
    block_size: int | None = None


def _int(raw: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"prefix.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _fraction(raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"prefix.{key} must be a number in [0, 1], got {value!r}")
    return float(value)


def parse_prefix_config(raw: dict[str, Any]) -> PrefixConfig:
    """Validate the ``prefix`` section (a mapping, possibly empty) into a :class:`PrefixConfig`."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"prefix: unknown option(s) {', '.join(unknown)}; known: {sorted(_KEYS)}")
    buckets_raw = raw.get("reuse_age_buckets_s", [60, 600, 3600])
    if not isinstance(buckets_raw, list) or not all(
        isinstance(b, int | float) and not isinstance(b, bool) and b > 0 for b in buckets_raw
    ):
        raise ConfigError(
            f"prefix.reuse_age_buckets_s must be a list of positive seconds, got {buckets_raw!r}"
        )
    buckets = tuple(float(b) for b in buckets_raw)
    if list(buckets) != sorted(set(buckets)):
        raise ConfigError(
            f"prefix.reuse_age_buckets_s must be strictly ascending, got {buckets_raw!r}"
        )
    block_size = raw.get("block_size")
    if block_size is not None:
        block_size = _int(raw, "block_size", 16, 1)
    short = _int(raw, "classify_short_window_tokens", 256, 1)
    long = _int(raw, "classify_long_window_tokens", 4096, 1)
    if long <= short:
        raise ConfigError(
            "prefix.classify_long_window_tokens must exceed classify_short_window_tokens "
            f"({long} <= {short})"
        )
    return PrefixConfig(
        min_session_match_blocks=_int(
            raw, "min_session_match_blocks", DEFAULT_MIN_SESSION_MATCH_BLOCKS, 1
        ),
        reuse_age_buckets_s=buckets,
        classify_short_window_tokens=short,
        classify_long_window_tokens=long,
        no_sharing_below=_fraction(raw, "no_sharing_below", 0.2),
        long_context_retention=_fraction(raw, "long_context_retention", 0.5),
        block_size=block_size,
    )
