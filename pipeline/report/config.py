"""Settings of the report stage (defaults and their meaning: ``pipeline/defaults.yaml``), and
what a version records of the configuration it was made with (:class:`Provenance`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator

from pipeline.settings import ConfigPath, ConfigQuarter, Section

#: A JSON document the report copies, compares and prints but does not interpret: the
#: configuration as `enginefit config` prints it, a version's manifest.
JsonDocument = dict[str, object]


class ReportConfig(Section):
    """``quarter``: the quarter the report is for (null: the quarter of the workload's last
    arrival); ``allow_other_quarter``: file it under a quarter the traffic does not reach;
    ``title`` and ``organisation`` appear on the title page; ``signing_key`` and
    ``allowed_signers``: sign each version's manifest (:mod:`pipeline.report.signing`)."""

    quarter: ConfigQuarter | None
    allow_other_quarter: bool
    title: Annotated[str, Field(min_length=1, max_length=120)]
    organisation: Annotated[str, Field(max_length=120)] | None
    signing_key: ConfigPath | None
    allowed_signers: ConfigPath | None

    @model_validator(mode="after")
    def _signing_needs_signers(self) -> Self:
        if self.signing_key is not None and self.allowed_signers is None:
            raise ValueError(
                "signing_key is set without allowed_signers: name the allowed "
                "signers file that lists the key's public part (ssh-keygen ALLOWED SIGNERS "
                "format), so each signature is checked when it is made"
            )
        return self


@dataclass(frozen=True)
class Provenance:
    """What a version records of the configuration it was made with: the file (``source``;
    None: the built-in defaults) and every setting as `enginefit config` prints it
    (``configuration``), and the files it names that the stages read: the trace paths as
    configured, the tokenizer, the benchmark results and their sidecar manifest, and the engine
    catalog (None: the bundled one)."""

    source: Path | None
    configuration: JsonDocument
    traces: tuple[str, ...]
    tokenizer: Path | None
    bench_results: tuple[Path, ...]
    bench_manifest: Path | None
    catalog: Path | None

    @property
    def where(self) -> str:
        return str(self.source) if self.source else "<defaults>"

    @property
    def base(self) -> Path:
        """The folder the configuration's relative paths (and a manifest's inputs) start from."""
        return self.source.resolve().parent if self.source else Path.cwd()
