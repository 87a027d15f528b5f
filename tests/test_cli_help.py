"""``enginefit … --help`` is plain text with a line for everything: every command and every
argument of every command has help, and no help shows reStructuredText markup. And what the
README shows a person typing exists."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from assets.cli import register
from pipeline.cli import build_parser
from tests.conftest import REPO


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


def _code_in(markdown: str) -> list[str]:
    """The README's code: fenced blocks (continuation lines joined to their command) and inline
    code spans."""
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", markdown, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M))
    commands = []
    for block in fenced:
        for line in block.splitlines():
            if commands and (line.startswith(" ") or commands[-1].endswith("\\")):
                commands[-1] += " " + line.strip()
            else:
                commands.append(line)
    indented = re.findall(r"^    (\S.*)$", markdown, flags=re.M)  # indented examples
    return commands + indented + inline


def test_every_command_and_flag_the_readme_shows_exists() -> None:
    """What the README tells a new user to type parses: each `enginefit COMMAND` is a command
    and each --flag after it one of that command's options; each `make TARGET` a target."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    parsers = {name.split(" ", 1)[1]: sub for name, sub, _ in commands(enginefit_parser())}
    shown: dict[str, set[str]] = {}
    for code in _code_in(readme):
        for match in re.finditer(r"(?<![\w./-])enginefit ([a-z]+)(.*)", code):
            command, rest = match.groups()
            rest = re.split(r"(?<![\w./-])enginefit |#", rest)[0]  # up to the next command
            shown.setdefault(command, set()).update(
                re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
            )
    assert set(shown) >= {"ingest", "shape", "report", "decide", "audit", "loadtest"}
    unknown = {
        command: sorted(flags - set(parsers[command]._option_string_actions))
        for command, flags in shown.items()
        if command not in parsers or flags - set(parsers[command]._option_string_actions)
    }
    assert unknown == {}
    targets = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    made = {
        target
        for code in _code_in(readme)
        for target in re.findall(r"(?<![\w-])make ([a-z][a-z-]*)", code)
    }
    assert made and made <= targets, made - targets
