"""``enginefit audit PATH [--json]``: check a published report version against its manifest
(exit code 1 when anything differs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.report.audit import audit, audit_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="re-hash a published report version's inputs and outputs and list what differs",
        description="Re-hash every input and output a published version recorded (its PDF, "
        "HTML and decision record, the trace and benchmark files, the catalog) and say exactly "
        "what differs; exit code 1 when anything does. PATH: a version folder "
        "reports/<workload>/<quarter>/v<N>/ or its manifest.json.",
    )
    parser.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="a published version, reports/<workload>/<YYYY-Qn>/v<N>",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (ok, checked, differences)")
    parser.set_defaults(func=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    result = audit(args.path)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        print(audit_text(result))
    return 0 if result.ok else 1
