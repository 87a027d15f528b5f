"""Section 6, the candidates and their mechanisms, from the engine catalog: each engine's
design bet, prefix cache, hardware, cost of a model change, status and what to choose it for,
and the layers above engines."""

from __future__ import annotations

import datetime as dt

from pipeline.decision.catalog import Catalog
from pipeline.report.sections.content import status_words
from pipeline.unknown import ResultModel


class Engine(ResultModel):
    name: str
    bet: str
    cache: str
    hardware: str
    change: str
    status: str
    choose_for: str
    secondary: list[str]  # figures from vendor-authored or second-hand sources


class Layer(ResultModel):
    name: str
    adds: str
    engines: str


class Engines(ResultModel):
    as_of: str
    engines: list[Engine]
    layers: list[Layer]


def catalog(found: Catalog, report_date: dt.date) -> Engines:
    return Engines(
        as_of=found.as_of.isoformat(),
        engines=[
            Engine(
                name=e.name,
                bet=e.design_bet,
                cache=e.prefix_cache.note,
                hardware=", ".join(e.hardware_words(t) for t in e.hardware),
                change=e.change_summary(),
                status=status_words(e.status.state, e.status.since, report_date)
                if e.status.since
                else e.status.state,
                choose_for=e.choose_for,
                secondary=[f.shown() for f in e.secondary_figures],
            )
            for e in found.engines.values()
        ],
        layers=[
            Layer(
                name=layer.name,
                adds=", ".join(a.replace("_", " ") for a in layer.adds),
                engines=", ".join(layer.engines),
            )
            for layer in found.layers.values()
        ],
    )
