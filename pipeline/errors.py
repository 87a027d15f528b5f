"""Errors a user can act on. Each message names the file (and line or field) and what is wrong."""

from __future__ import annotations


class EnginefitError(Exception):
    """Base for every error enginefit raises on purpose (the CLI prints these without a traceback)."""


class ConfigError(EnginefitError):
    """The configuration file is missing, malformed or inconsistent."""


class InputFormatError(EnginefitError):
    """An input file cannot be read at all: empty, unknown format, or missing required columns."""


class StageOutputMissingError(InputFormatError):
    """An earlier stage's output was never written: the stage has not run (a reader may go on
    without it and say so). An output that exists but cannot be read is never this."""


class StageOutputUnreadableError(InputFormatError):
    """An earlier stage's output exists but cannot be read (damaged, replaced, cut short): the
    message names the file and the command that rewrites it."""


class StageOutputStaleError(InputFormatError):
    """An earlier stage's output was computed from inputs that changed since (or it recorded
    none): the message names the file, what changed and the command that rewrites it."""


def os_reason(exc: OSError) -> str:
    """What the operating system said, without Python's ``[Errno N]`` and the repeated path
    (the message names the path itself): ``No such file or directory``."""
    return exc.strerror or exc.__class__.__name__
