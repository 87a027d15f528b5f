"""The one validation style for configuration: strict, frozen pydantic sections.

Every section of ``enginefit.yaml`` is a :class:`Section`: unknown keys are errors, values are
never coerced from another type (``"16"`` is not a block size, ``true`` is not a count),
non-finite numbers are refused, and the object is immutable. Defaults are not written here or in
the section classes: they live in one place, the documented ``pipeline/defaults.yaml``, which
:mod:`pipeline.config` merges under the user's file before validating.

:func:`validation_message` turns a pydantic error into the message a person can act on: every
problem, each naming the file and the dotted key.
"""

from __future__ import annotations

import copy
import datetime as dt
import difflib
import re
from collections.abc import Callable, Iterable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Self, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import ErrorDetails

from pipeline.errors import ConfigError, InputFormatError

#: The sections of ``enginefit.yaml``, in the order the configuration is printed.
SECTIONS = (
    "workload",
    "paths",
    "shape",
    "prefix",
    "simulation",
    "bench",
    "capacity",
    "requirements",
    "decision",
    "report",
    "loadtest",
    "whatif",
)


class Section(BaseModel):
    """A configuration section: strict types, no unknown keys, no NaN or infinity, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, each validated as the file's values are (so a
        command-line override meets the same rules as the configuration)."""
        current = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self).model_validate({**current, **changes}, context=_KEEP_PATHS)


_KEEP_PATHS = {"base": None}
SectionT = TypeVar("SectionT", bound=Section)


def _resolve_path(value: Any, info: ValidationInfo) -> Any:
    """A path string relative to the configuration file's folder (absolute paths kept)."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a path string, got {value!r}")
    path = Path(value)
    base = (info.context or {}).get("base")
    return path if path.is_absolute() or base is None else Path(base) / path


def _parse_date(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an ISO date (YYYY-MM-DD)") from exc
    return value


def parse_instant(value: Any) -> Any:
    """An ISO-8601 date or datetime as an aware UTC datetime; naive means UTC."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an ISO-8601 date") from exc
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    return value


ConfigPath = Annotated[Path, BeforeValidator(_resolve_path)]
ConfigDate = Annotated[dt.date, BeforeValidator(_parse_date)]
ConfigInstant = Annotated[dt.datetime, BeforeValidator(parse_instant)]
PositiveInt = Annotated[int, Field(gt=0)]
# Tokens per KV-cache block: engines use 1-128 (vLLM's CUDA sizes 1, 8, 16, 32, 64, 128;
# SGLang pages of 1; TensorRT-LLM 32-128), hybrid models realign to a few hundred (a 784-token
# block is reported, vllm#54607), Mooncake traces hash 512-token blocks, and analyses coarsen
# those by a few times. Past 4096 almost no prompt fills one block, so every request would be
# "known, nothing cacheable": a typo, not a setting.
MAX_BLOCK_SIZE = 4096


def _block_size(value: int) -> int:
    if not 1 <= value <= MAX_BLOCK_SIZE:
        raise ValueError(
            f"a block size is 1 to {MAX_BLOCK_SIZE} tokens (engines use 1-128, Mooncake traces 512)"
        )
    return value


BlockSize = Annotated[int, AfterValidator(_block_size)]
QUARTER = re.compile(r"^(\d{4})-Q([1-4])$")


def _quarter(value: Any) -> Any:
    if isinstance(value, str) and not QUARTER.match(value):
        raise ValueError(f"{value!r} is not a quarter: write YYYY-Qn, e.g. 2026-Q3")
    return value


# A calendar quarter, YYYY-Qn (report.quarter, workload.daily_quarter).
ConfigQuarter = Annotated[str, BeforeValidator(_quarter)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# Seeds reach numpy and polars, which take unsigned 64-bit seeds; int64 keeps every consumer safe.
MAX_SEED = 2**63 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
# Retention times and other spans of the traffic: a trace covers a quarter at most, so a year
# is already past any age a cache keeps a block.
SECONDS_PER_YEAR = 366 * 86_400
# YAML lists become tuples (immutable); their items stay strictly typed.
PositiveSecondsList = Annotated[
    tuple[Annotated[float, Field(gt=0, le=SECONDS_PER_YEAR)], ...], Strict(False)
]


def between(low: float, high: float, *, low_open: bool = False) -> Any:
    """A configuration number's sane range, ``low`` (excluded when ``low_open``) to ``high``:
    every number the configuration holds is bounded above as well as below, so none can carry
    an overflow (``1e308``) or an underflow (``1e-300``) into the arithmetic downstream."""
    return Field(gt=low, le=high) if low_open else Field(ge=low, le=high)


def tuple_of(item: Any) -> Any:
    """A YAML list of ``item`` as a tuple (the list itself may be a list; items stay strict)."""
    return Annotated[tuple[item, ...], Strict(False)]


def _dotted(loc: Iterable[int | str]) -> str:
    """``("bench", "slo", 0)`` → ``bench.slo[0]``; a mapping's refused key (pydantic's
    ``(..., key, "[key]")``) → ``...: the key 'x'``."""
    parts = list(loc)
    text = ""
    for i, part in enumerate(parts):
        if i + 1 < len(parts) and parts[i + 1] == "[key]":
            return f"{text}: the key {part!r}"
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the section at ``loc`` (the parent of an unknown key) accepts."""
    current: Any = model
    keyed = False  # the last field was a mapping: the next part is one of its keys
    for part in loc:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        keyed = getattr(annotation, "__origin__", None) is dict
        current = next(
            (
                arg
                for arg in (annotation, *getattr(annotation, "__args__", ()))
                if isinstance(arg, type) and issubclass(arg, BaseModel)
            ),
            None,
        )
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


#: Keys an earlier enginefit read and this one no longer does, by dotted key: what took each one's
#: place. Setting one is still an error (an unknown key), said with its replacement rather
#: than as a typo to correct.
_FIXED_THRESHOLD = (
    "it is a fixed constant beside the code that reads it now, not a setting "
    "(docs/decision-rules.md gives the rules' thresholds and their sources)"
)
REMOVED_KEYS: dict[str, str] = {
    "capacity.far_ratio": (
        "the capacity stage's transfer of a benchmark to the workload's mix is provisional past "
        "the one transfer distance the bench stage's length check also uses, 2x either way "
        "(docs/decision-rules.md#transferability), not a setting of its own"
    ),
    **{
        key: _FIXED_THRESHOLD
        for key in (
            "workload.quarantine_warn_share",
            "shape.concurrency_low_max",
            "shape.concurrency_high_min",
            "shape.min_quanta_per_window",
            "shape.plot_points",
            "prefix.classify_short_window_tokens",
            "prefix.classify_long_window_tokens",
            "prefix.no_sharing_below",
            "prefix.long_context_retention",
            "simulation.pinned_warn_share",
            "simulation.curve_points",
            "bench.length_factor",
            "bench.tail_ratio",
            "decision.prefix_window_tokens",
            "decision.prefix_heavy_share",
            "decision.prefix_light_share",
            "decision.routing_gain_min",
            "decision.high_volume_output_tokens_per_month",
            "decision.trt_max_models",
            "decision.trt_max_changes_per_quarter",
            "decision.long_context_tokens",
            "decision.catalog_max_age_days",
        )
    },
}


class KeyedValueError(ValueError):
    """A section's own parser failed with a message that already names its key and value."""


def collected(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse`` (a section's own parser, raising ConfigError naming its key) as a validator
    whose error pydantic collects with the other problems, said as the parser wrote it (a
    ConfigError would stop the validation at the first)."""

    def validate(value: Any) -> Any:
        try:
            return parse(value)
        except ConfigError as exc:
            raise KeyedValueError(str(exc)) from exc

    return validate


def validation_message(
    exc: ValidationError, model: type[BaseModel], where: str, prefix: str = ""
) -> str:
    """``<file>: <dotted key>: <what is wrong> (got <value>)``; with several problems, a line
    saying how many and then one line per problem, each naming its key."""
    problems = _problems(exc.errors(include_url=False), model, prefix)
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return f"{where}: {len(problems)} problems:" + "".join(f"\n  - {p}" for p in problems)


ModelT = TypeVar("ModelT", bound=BaseModel)


def versioned(
    model: type[ModelT], data: Any, where: str, version: int, what: str, rerun: str
) -> ModelT:
    """A stage's result file (``what``) read back: a ``schema_version`` other than ``version``
    says what to re-run (``rerun``); any other problem is one line naming the file and key."""
    if isinstance(data, dict) and data.get("schema_version") != version:
        raise InputFormatError(
            f"{where}: {what} schema_version {data.get('schema_version')!r} is not {version}; "
            f"{rerun} with this version"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputFormatError(validation_message(exc, model, where)) from exc


def _problems(errors: list[ErrorDetails], model: type[BaseModel], prefix: str) -> list[str]:
    """One text per problem: unknown keys first (with the key they probably meant), then the
    rest in pydantic's order, the required keys missing from one section as one problem."""

    def dotted(loc: tuple[int | str, ...]) -> str:
        return _dotted((*([prefix] if prefix else []), *loc))

    unknown: list[str] = []
    meant: set[tuple[int | str, ...]] = set()
    # A list left empty because its one item was refused is that item's problem, said once.
    errors = [
        error
        for error in errors
        if error["type"] != "too_short"
        or not any(
            len(other["loc"]) > len(error["loc"])
            and tuple(other["loc"][: len(error["loc"])]) == tuple(error["loc"])
            for other in errors
        )
    ]
    for error in errors:
        if error["type"] != "extra_forbidden":
            continue
        loc = tuple(error["loc"])
        removed = REMOVED_KEYS.get(dotted(loc))
        if removed is not None:
            unknown.append(f"unknown key {dotted(loc)}: removed; {removed}; delete it")
            continue
        known = _known_keys(model, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        text = f"unknown key {dotted(loc)}" + (f" (did you mean {hint[0]}?)" if hint else "")
        unknown.append(text + (f"; known keys here: {', '.join(known)}" if known else ""))
        # A misspelt key also leaves the real one missing: one problem, said above.
        meant.update((*loc[:-1], h) for h in hint)
    # In order: a problem's text, or the section whose missing keys are said together there.
    rest: list[str | tuple[int | str, ...]] = []
    missing: dict[tuple[int | str, ...], list[str]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden" or loc in meant:
            continue
        if error["type"] == "missing":
            if loc[:-1] not in missing:
                missing[loc[:-1]] = []
                rest.append(loc[:-1])
            missing[loc[:-1]].append(str(loc[-1]))
            continue
        own = error.get("ctx", {}).get("error")
        if isinstance(own, KeyedValueError):
            rest.append(str(own))
            continue
        text = str(error["msg"]).removeprefix("Value error, ")
        got = error.get("input")
        # A whole-section check (a model validator) has the section as its input: saying what
        # is wrong is enough, echoing the section is noise.
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        rest.append(f"{dotted(loc)}: {text}{shown}" if loc or prefix else f"{text}{shown}")

    def said(entry: str | tuple[int | str, ...]) -> str:
        if isinstance(entry, str):
            return entry
        names = missing[entry]
        if len(names) == 1:
            return f"{dotted((*entry, names[0]))} is required"
        return f"{dotted(entry) or 'top level'}: required keys missing: {', '.join(names)}"

    return unknown + [said(entry) for entry in rest]


class _NoDuplicateKeys(yaml.constructor.SafeConstructor):
    """Refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


class _Loader(_NoDuplicateKeys, yaml.SafeLoader):
    """PyYAML's safe loader without implicit timestamps (``2026-13-45`` stays text, so the
    field's own validator names the key and the problem; PyYAML would raise a bare ValueError)
    and refusing a key given twice in one mapping."""


class _FastLoader(_NoDuplicateKeys, yaml.CSafeLoader):
    """:class:`_Loader` on libyaml's parser (shipped in PyYAML's wheels), five times faster on
    a large document (a team's engine catalog); its syntax-error wording differs a little."""


_NO_TIMESTAMPS = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.yaml_implicit_resolvers = _NO_TIMESTAMPS
_FastLoader.yaml_implicit_resolvers = _NO_TIMESTAMPS
# YAML 1.2 floats that PyYAML (YAML 1.1) reads as text: an exponent without a dot (``1e308``,
# ``1e-9``) or without a sign (``1.5e3``). Tried after YAML 1.1's own resolvers, so an integer
# stays an int. The two loaders share the table, so both read them.
for _first in "-+.0123456789":
    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
        [_first],
    )


def parse_yaml(text: str, *, large: bool = False) -> Any:
    """A YAML document as enginefit reads every YAML file (configuration, catalogs, benchmark
    manifests and results): YAML 1.2 numbers, dates as text, a key given twice refused.
    ``large``: parse with libyaml (a document of thousands of entries). Raises
    ``yaml.YAMLError``; :func:`load_yaml` turns it into a one-line error."""
    return yaml.load(text, Loader=_FastLoader if large else _Loader)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line with the 1-based line and column."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


def load_yaml(text: str, where: str, *, large: bool = False) -> Any:
    """A YAML document (dates as text); invalid YAML is a one-line error naming ``where``.
    ``large``: parse with libyaml (a document of thousands of entries)."""

    try:
        return parse_yaml(text, large=large)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(exc)}") from exc
    except RecursionError as exc:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{where}: nested too deeply to be a configuration") from exc


def with_flags(section: SectionT, flags: dict[str, tuple[str, Any]]) -> SectionT:
    """``section`` with command-line values applied (``field → (flag, value)``), validated as
    the configuration is; a bad value is a one-line error naming the flag."""
    try:
        return section.replace(**{name: value for name, (_, value) in flags.items()})
    except ValidationError as exc:
        raise _flag_error(exc, flags) from exc


def from_flags(model: type[SectionT], flags: dict[str, tuple[str, Any]]) -> SectionT:
    """A section built from command-line values alone (``field → (flag, value)``) by its own
    rules; a bad value is a one-line error naming the flag, as in :func:`with_flags`."""
    try:
        return model.model_validate({name: value for name, (_, value) in flags.items()})
    except ValidationError as exc:
        raise _flag_error(exc, flags) from exc


def _flag_error(exc: ValidationError, flags: dict[str, tuple[str, Any]]) -> Exception:

    first = exc.errors(include_url=False)[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    flag, value = flags.get(name, (name, first.get("input")))
    reason = str(first["msg"]).removeprefix("Value error, ")
    return ConfigError(f"{flag}: {reason} (got {value!r})")


@cache
def _defaults_text() -> str:
    return resources.files("pipeline").joinpath("defaults.yaml").read_text(encoding="utf-8")


@cache
def _defaults_parsed() -> dict[str, Any]:
    raw = load_yaml(_defaults_text(), "pipeline/defaults.yaml")
    assert isinstance(raw, dict)  # a packaging bug, never user input
    return raw


def default_mapping() -> dict[str, Any]:
    """``pipeline/defaults.yaml`` (every default, documented) as a fresh mapping (parsed once a
    process)."""
    return copy.deepcopy(_defaults_parsed())
