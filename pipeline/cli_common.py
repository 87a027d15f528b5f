"""What every trace-reading subcommand shares: the configuration and how traces are loaded.

Each command takes ``--config`` (default: ``./enginefit.yaml`` when present), and reads raw traces
with that file's salt, anchor date, tokenizer and block size, so ``enginefit shape`` on a trace
sees the same table as the ``workload`` asset built from the same configuration.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.config import SALT_ENV_VAR, Config, load_config
from pipeline.errors import ConfigError

DEFAULT_CONFIG = "enginefit.yaml"
# Ad-hoc analyses never persist hashes, so without a configured salt any fixed one will do.
ADHOC_SALT = b"enginefit-adhoc"


def add_trace_arguments(
    parser: argparse.ArgumentParser,
    *,
    block_help: str = "tokens per hashed block (default: config, else 16)",
) -> None:
    """TRACE... (into ``args.paths``), ``--format`` and ``--block-size``."""
    from pipeline.readers import FORMAT_NAMES

    parser.add_argument(
        "paths",
        nargs="+",
        metavar="TRACE",
        help="trace files, globs, directories or canonical Parquet",
    )
    parser.add_argument("--format", default="auto", choices=["auto", *FORMAT_NAMES])
    parser.add_argument("--block-size", type=int, default=None, help=block_help)


def add_config_argument(parser: argparse.ArgumentParser, sections: str) -> None:
    parser.add_argument(
        "--config",
        default=None,
        help=f"configuration for {sections} (default: ./{DEFAULT_CONFIG} when present)",
    )


def cli_config(path: str | Path | None) -> Config | None:
    """The named configuration, else ``./enginefit.yaml`` when it exists, else None."""
    if path is not None:
        return load_config(path)
    return load_config(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).exists() else None


def read_settings(config: Config | None, block_size: int | None) -> dict[str, Any]:
    """Keyword arguments for ``ingest_paths`` / ``load_requests`` from the config and flags."""
    if block_size is not None and block_size <= 0:
        raise ConfigError("--block-size must be positive")
    workload = config.workload if config else None
    salt = os.environ.get(SALT_ENV_VAR) or (workload.hash_salt if workload else "")
    settings: dict[str, Any] = {
        "block_size": block_size or (workload.block_size if workload else 16),
        "salt": salt.encode() if salt else ADHOC_SALT,
    }
    if workload is not None:
        settings["anchor"] = workload.anchor
        if workload.tokenizer:
            settings["tokenizer"] = workload.tokenizer
    return settings


def load_trace_requests(
    paths: Sequence[str | Path], *, fmt: str, block_size: int | None, config: Config | None
) -> pl.LazyFrame:
    from pipeline.ingest import load_requests  # keeps `enginefit --help` light

    return load_requests(paths, fmt=fmt, **read_settings(config, block_size))
