"""Settings of the report stage (defaults and their meaning: ``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from pipeline.settings import ConfigPath, ConfigQuarter, Section


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
