"""A command line imports only the area of its command (pipeline.cli)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

from pipeline import cli

REPO = Path(__file__).resolve().parents[1]


def test_every_area_registers_exactly_the_commands_listed_for_it() -> None:
    for module, commands in cli._AREAS.items():
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(subparsers)
        assert tuple(subparsers.choices) == commands, module


def test_a_command_imports_its_area_and_help_imports_all() -> None:
    assert cli.areas_for(["simulate", "t.parquet", "--block-size", "16"]) == [
        "pipeline.commands.sim"
    ]
    assert cli.areas_for(["curve", "--json"]) == ["pipeline.commands.sim"]
    for argv in ([], ["--help"], ["report", "--config", "x"], ["simulat"]):
        assert cli.areas_for(argv) == list(cli._AREAS)


def test_simulate_loads_neither_the_load_test_client_nor_matplotlib() -> None:
    code = (
        "import sys\n"
        "from assets.cli import build_parser, register\n"
        "build_parser(extra=[register], argv=['simulate', 't.parquet'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('aiohttp', 'matplotlib', "
        "'pipeline.commands.loadtest', 'pipeline.loadtest.client', 'pipeline.bench.stage'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
