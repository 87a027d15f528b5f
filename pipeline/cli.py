"""``enginefit``: the command line. Each area registers its own subcommands.

Every subcommand is a function ``run(args) -> int`` registered by ``register(subparsers)`` in
its area's ``cli`` module; this file only builds the parser, dispatches, and turns an
:class:`~pipeline.errors.EnginefitError` into a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pipeline.errors import EnginefitError

# Each module here has ``register(subparsers)``; keep one line per area, with the commands it
# registers. A command line imports only the area of its command (``enginefit --help``, no
# command or an unknown one import every area), so ``enginefit simulate`` does not load the
# load-test client or the benchmark figures.
_AREAS: dict[str, tuple[str, ...]] = {
    "pipeline.commands.config": ("config",),
    "pipeline.commands.ingest": ("ingest",),
    "pipeline.commands.shape": ("shape",),
    "pipeline.commands.prefix": ("prefix",),
    "pipeline.commands.sim": ("simulate", "curve"),
    "pipeline.commands.bench": ("bench",),
    "pipeline.commands.capacity": ("capacity",),
    "pipeline.commands.loadtest": ("loadtest",),
    "pipeline.commands.decision": ("explain",),
    "pipeline.commands.report": ("audit",),
    "pipeline.commands.whatif": ("whatif",),
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming what is wrong and where help is, exit 2
    (argparse prints its whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"enginefit: error: {message}; see `{self.prog} --help`\n")


def areas_for(argv: Sequence[str]) -> list[str]:
    """The area modules a command line needs: its command's, else (help, no command, a command
    no area registers) all of them."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    owner = [module for module, commands in _AREAS.items() if command in commands]
    return owner or list(_AREAS)


def build_parser(
    extra: Sequence[Callable[[Any], None]] = (), argv: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """The parser for the command line ``argv`` (default: this process's)."""
    parser = _OneLineParser(
        prog="enginefit",
        description="Which LLM inference engine fits your traffic, and what it costs at your SLO.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in areas_for(sys.argv[1:] if argv is None else argv):
        importlib.import_module(module).register(subparsers)
    for register in extra:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(argv=argv), argv)


# What to do about the operating-system errors a person can fix; the rest say only what failed.
_OS_ADVICE = {
    errno.ENOSPC: "free some space or write elsewhere (--out DIR, paths.data_dir)",
    errno.EFBIG: "the file system refuses a file this large; write elsewhere",
    errno.EDQUOT: "disk quota exceeded; free some space or write elsewhere",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.ELOOP: "a symbolic link points back to itself",
}


def os_error_line(exc: OSError) -> str:
    """An operating-system error as one line naming the path, what failed and what to do."""
    where = exc.filename if exc.filename is not None else "enginefit"
    what = exc.strerror or exc.__class__.__name__
    advice = _OS_ADVICE.get(exc.errno or 0)
    return f"{where}: {what}" + (f"; {advice}" if advice else "")


# Advice that names --out, as said to a command without that flag (capacity, whatif, decide,
# report): the configuration's data folder is its only other place to write.
_WITHOUT_OUT = {
    "--out DIR, or paths.data_dir in the configuration": "paths.data_dir in the configuration",
    "--out DIR, paths.data_dir": "paths.data_dir",
    "write elsewhere with --out DIR": "write elsewhere (paths.data_dir in the configuration)",
}


# Commands that only read: "write elsewhere" is no advice to them.
_READING_ONLY = frozenset({"audit", "explain", "config"})


def _for_the_command(args: argparse.Namespace, line: str) -> str:
    """``line`` with advice to use ``--out`` only when the command has that flag, and to
    write elsewhere only when it writes."""
    if getattr(args, "command", None) in _READING_ONLY:
        line = line.replace("check the permissions, or write elsewhere", "check the permissions")
    if hasattr(args, "out"):
        return line
    for said, instead in _WITHOUT_OUT.items():
        line = line.replace(said, instead)
    return line


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not as noise at exit
    except BrokenPipeError as exc:
        if not _stdout_is_a_pipe():
            print(f"enginefit: error: {os_error_line(exc)}", file=sys.stderr)
            return 2
        return _reader_gone()
    except EnginefitError as exc:
        print(f"enginefit: error: {_for_the_command(args, str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        # Faults of the machine rather than the input (disk full, permissions): still one
        # line, never a traceback.
        print(f"enginefit: error: {_for_the_command(args, os_error_line(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("enginefit: interrupted", file=sys.stderr)
        return 130
    return code


def _stdout_is_a_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError):  # no file descriptor (a captured stream)
        return False


def _reader_gone() -> int:
    """The reader of the output closed it (``enginefit shape --json | head``): stop quietly as
    Unix tools do, with the code a shell gives a command SIGPIPE ended (128 + 13)."""
    # Python flushes stdout once more at exit; pointed at /dev/null, that flush cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
