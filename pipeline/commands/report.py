"""``enginefit audit PATH [--json]``: check a published report version against its manifest
(exit code 1 when anything differs)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.report.audit import audit, audit_text

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# How much of a malformed value an error echoes.
_ECHO = 80


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="re-hash a published report version's inputs and outputs and list what differs",
        description="Check the ledger's hash chain and its entry for the version, then the "
        "manifest's signature (when signed), then re-hash every output and input the version "
        "recorded (its PDF, HTML and decision record; the configuration, trace and benchmark "
        "files, the files their readers opened, the catalog) and say exactly what differs. "
        "Exit code 1 when anything differs or the ledger does not vouch for the version, 2 when "
        "a file is not what a published version holds. PATH: a version folder "
        "reports/<workload>/<quarter>/v<N>/ or its manifest.json.",
    )
    parser.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="a published version, reports/<workload>/<YYYY-Qn>/v<N>",
    )
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        default=None,
        help="your trusted copy of the allowed signers file: the manifest's signature is "
        "then required and checked against it (default: the file the version names, when "
        "it was signed)",
    )
    parser.add_argument(
        "--chain-head",
        metavar="SHA256",
        default=None,
        help="a ledger chain head recorded earlier (each audit prints the current one): the "
        "ledger must still contain it, which catches a consistent rewrite of the ledger",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON (ok, checked, differences, problems, chain_head, signature)",
    )
    parser.set_defaults(func=run_audit)


def chain_head_flag(value: str | None) -> str | None:
    """``--chain-head`` as an audit prints it (64 hex digits, either case): anything else is a
    mistyped flag, not a rewritten ledger."""
    if value is None:
        return None
    head = value.strip().lower()
    if not _SHA256.match(head):
        shown = value if len(value) <= _ECHO else value[:_ECHO] + "…"
        raise ConfigError(
            f"--chain-head: expected the 64 hex digits an audit prints as the chain head, got "
            f"{shown!r} ({len(value):,} characters)"
        )
    return head


def run_audit(args: argparse.Namespace) -> int:
    head = chain_head_flag(args.chain_head)
    result = audit(args.path, allowed_signers=args.allowed_signers, recorded_head=head)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        print(audit_text(result))
    return 0 if result.ok else 1
