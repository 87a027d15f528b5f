"""``enginefit … --help`` is plain text with a line for everything: every command and every
argument of every command has help, and no help shows reStructuredText markup."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from assets.cli import register
from pipeline.cli import build_parser


def enginefit_parser() -> argparse.ArgumentParser:
    """The whole command line, every area loaded (as ``enginefit --help`` loads them)."""
    return build_parser(extra=[register], argv=["--help"])


def commands(
    parser: argparse.ArgumentParser, prog: str = "enginefit"
) -> Iterator[tuple[str, argparse.ArgumentParser, argparse._SubParsersAction]]:
    """Every parser below ``parser`` with its command line and the subparsers action holding it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prog} {name}", sub, action
                yield from commands(sub, f"{prog} {name}")


def test_every_command_and_argument_has_plain_help() -> None:
    parser = enginefit_parser()
    found = list(commands(parser))
    assert {name for name, _, _ in found} >= {
        "enginefit ingest",
        "enginefit loadtest",
        "enginefit report",
        "enginefit decide",
        "enginefit audit",
    }
    problems = []
    for name, sub, holder in found:
        listed = {a.dest: a.help for a in holder._choices_actions}
        command_help = listed.get(name.rsplit(" ", 1)[1])
        if not command_help or "``" in command_help:
            problems.append(f"{name}: command help {command_help!r}")
        if "``" in (sub.description or ""):
            problems.append(f"{name}: description has ``")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            what = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS or not action.help.strip():
                problems.append(f"{name} {what}: no help")
            elif "``" in action.help:
                problems.append(f"{name} {what}: help has ``")
    assert problems == []
