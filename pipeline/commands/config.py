"""``enginefit config``: the configuration a command would run with, every default filled in."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from pipeline.commands.common import add_config_argument, command_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config",
        help="print the merged configuration (file over pipeline/defaults.yaml), validated",
        description="Load and validate the configuration (--config FILE, else ./enginefit.yaml, "
        "else the built-in defaults) and print every setting with its value. The hash salt is "
        "shown only as its fingerprint.",
    )
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    parser.set_defaults(func=run_config)


def run_config(args: argparse.Namespace) -> int:
    config = command_config(args)
    data = config.as_dict()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return 0
