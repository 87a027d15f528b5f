"""The model table: the shapes of common open models (``models.yaml``, each figure with its
config.json source), so a benchmarked deployment's attention, KV and weights are priced from
the model it served even when the configuration does not describe it.

A name is found without its hub organisation, case and punctuation ignored, then without the
release suffixes that do not change the shape (``-Instruct``, ``-FP8``, ``-AWQ`` …):
``meta-llama/Llama-3.1-8B-Instruct``, ``llama-3.1-8b`` and ``Llama-3.1-8B-Instruct-FP8`` are
one model (the last one's quantisation comes from its manifest, not from its name).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Annotated, Literal, Self

from pydantic import Field, PrivateAttr, Strict, ValidationError, model_validator

from pipeline.capacity.prior import ModelShape
from pipeline.errors import ConfigError
from pipeline.settings import ConfigDate, PositiveInt, Section, load_yaml, validation_message

TABLE = "models.yaml"
#: Name parts that name a release or a quantisation of a model, not another shape.
RELEASE_SUFFIXES = ("instruct", "chat", "it", "base", "hf", "fp8", "awq", "gptq", "int4", "int8")


class ModelEntry(Section):
    """One model's shape (the keys are explained at the top of ``models.yaml``)."""

    aliases: Annotated[tuple[str, ...], Strict(False)] = ()
    layers: PositiveInt
    attention_heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    params_billion: Annotated[float, Field(gt=0)]
    active_params_billion: Annotated[float, Field(gt=0)] | None = None
    weight_bytes: Annotated[float, Field(gt=0)]
    full_attention_layers: PositiveInt | None = None
    kv_latent_dim: PositiveInt | None = None
    qk_head_dim: PositiveInt | None = None
    v_head_dim: PositiveInt | None = None
    source: Annotated[str, Field(pattern=r"^https://")]
    checked: ConfigDate

    def shape(self, kv_bytes: float = 2.0) -> ModelShape:
        """The model as the prior and the floors take it, its KV cached ``kv_bytes`` wide."""
        return ModelShape(
            params_billion=self.params_billion,
            weight_bytes=self.weight_bytes,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            kv_bytes=kv_bytes,
            attention_heads=self.attention_heads,
            active_params_billion=self.active_params_billion,
            full_attention_layers=self.full_attention_layers,
            kv_latent_dim=self.kv_latent_dim,
            qk_head_dim=self.qk_head_dim,
            v_head_dim=self.v_head_dim,
            source=f"{self.source} (read {self.checked.isoformat()})",
        )


class ModelTable(Section):
    schema_version: Literal[1]
    models: dict[str, ModelEntry]
    # Squashed key or alias → table key, built once at validation.
    _index: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        index: dict[str, str] = {}
        for key, entry in self.models.items():
            for name in (key, *entry.aliases):
                if index.setdefault(_squashed(name), key) != key:
                    raise ValueError(
                        f"the name {name!r} is both {index[_squashed(name)]} and {key}"
                    )
        self._index = index
        return self

    def find(self, name: str | None) -> tuple[str, ModelEntry] | None:
        """The table's key and entry for a model named ``name`` (module docstring), or None."""
        if not name:
            return None
        words = [w for w in re.split(r"[^a-z0-9.]+", name.rsplit("/", 1)[-1].casefold()) if w]
        while words:
            key = self._index.get("".join(words))
            if key is not None:
                return key, self.models[key]
            if words[-1] not in RELEASE_SUFFIXES:
                return None
            words.pop()
        return None


def _squashed(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "", name.casefold())


@cache
def model_table() -> ModelTable:
    """The bundled table, validated strictly (an error names the file and key)."""
    where = f"pipeline/capacity/{TABLE}"
    raw = load_yaml(resources.files("pipeline.capacity").joinpath(TABLE).read_text("utf-8"), where)
    try:
        return ModelTable.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, ModelTable, where)) from exc


def deployment_shape(
    team_shape: ModelShape | None,
    benchmarked: str | None,
    *,
    weight_bytes: float | None,
    kv_bytes: float | None,
    table: ModelTable | None = None,
) -> tuple[ModelShape | None, str]:
    """The shape that prices a benchmarked deployment, and whose it is: ``team_shape``
    (``requirements.kv_cache``, when it describes the benchmarked model: the caller decides)
    with its query heads from the model table when it leaves them out, else the table's entry
    for the benchmarked model, else none (the reason says why). The deployment's own
    quantisation (``weight_bytes`` from its manifest, ``kv_bytes`` from its ``kv_cache_dtype``;
    None: the shape's own) is applied."""
    found = (table or model_table()).find(benchmarked)
    if team_shape is not None:
        source = "requirements.kv_cache"
        if team_shape.attention_heads is None and found is not None:
            team_shape = team_shape.model_copy(update={"attention_heads": found[1].attention_heads})
            source += f", query heads from the model table ({found[1].source})"
        shape = team_shape
    elif found is not None:
        shape = found[1].shape()
        source = f"the model table's {found[0]} ({found[1].source})"
    else:
        return None, (
            f"none: {benchmarked or 'the benchmarked model'} is not in the model table "
            "(pipeline/capacity/models.yaml) and requirements.kv_cache does not describe it"
        )
    return shape.with_quantisation(weight_bytes, kv_bytes), source
