"""The streamed replays of a workload published from days, resumed where they ended.

Streaming a replay (:mod:`pipeline.sim.stream`) carries every cache's state through the quarter
in time order, so a day cannot be replayed on its own. What can be kept is where the pass
stood: after the last day it read, the pass (:class:`~pipeline.sim.stream.StreamPass`: the
slot tables, the replicas' queues, the requests still running, the routers' counters and random
generator, the session inference, the sums, and each request's hit tokens when they are asked
for) is kept with the days it covers, each with the digest of the set the union held of it
(:func:`pipeline.ingest.days.united_days`): the scenario grid's under ``simulation/resume/``,
each of the capacity stage's fleet replays under ``capacity/resume/``. The sampled capacity
curves' gathering (:class:`~pipeline.sim.curve_stream.CurveGathering`: the SHARDS sample and
the curves' routers) is kept the same way, under ``simulation/resume/curves/``, while its rate
stays put (a power of two: until the table doubles). The next time it runs, if the union still
starts with exactly those days, the pass is read back and fed only the parts of the days after
them; its summaries are those of one pass over every day (``tests/test_sim_resume.py``). So a
day appended to the quarter replays that day, not the quarter.

It is not resumed, and the whole table is replayed (and the pass kept again), when a day it
covers was ingested again, removed or put before its last one; when the scenarios, the
replay's settings, the latency model or enginefit's code changed; when the whole table's facts
changed (its block size, or a request without a logged session where there was none); or when
the kept files are missing, damaged or another run's. Each time, one line says which. A pass
that cannot be kept (a full disk, a bucket that refuses it) is said too, and the replay's
results stand.

How a pass is kept, checked and read back, here and in a bucket: :mod:`pipeline.resume`.

Disk: a kept pass is about the size of its caches' block state (139.5 MiB for the default grid
over a generated 10M-request quarter), plus 8 bytes a request before compression for a fleet
replay's hit tokens; one pass a replay, replaced each time a day is added.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from pipeline.layout import WorkloadLayout
from pipeline.mirror import folders_below
from pipeline.present.text import sample_rate as sample_rate_text
from pipeline.resume import DayPasses, KeptPass
from pipeline.sim.config import Scenario, SimConfig
from pipeline.sim.curve import Curve
from pipeline.sim.curve_stream import Combination, CurveGathering, gathering_facts
from pipeline.sim.stream import (
    RequestStream,
    StreamedRun,
    StreamPass,
    TableFacts,
    routes_by_session,
)

# Settings that a replay does not read: the curves', and the grid (the replay's scenarios are
# in the key themselves, so a fleet replay's pass outlives a change to the grid).
_NOT_REPLAYED = frozenset(
    {
        "curve_exact_max_blocks",
        "curve_sample_rate",
        "block_sizes",
        "replicas",
        "cache_tokens",
        "routings",
        "compare_isolation",
    }
)


@dataclass(frozen=True)
class DailyStream(DayPasses):
    """A workload published from days, as a streamed replay reads it: its days and the folder
    its passes are kept in (:class:`pipeline.resume.DayPasses`) with the table's ``stream``
    (:meth:`forget_unused` removes the passes of replays no longer asked for)."""

    stream: RequestStream = field(kw_only=True)

    @classmethod
    def streamed(
        cls, layout: WorkloadLayout, stream: RequestStream, folder: Path, *, keeps: bool = True
    ) -> Self | None:
        """``stream`` with the union's days (:meth:`DayPasses.of`; None: streamed whole)."""
        days = DayPasses.of(layout, folder, keeps=keeps)
        if days is None:
            return None
        return cls(days.days, days.parts, folder, days.remote, days.keeps, stream=stream)

    def simulate_many(self, scenarios: list[Scenario], settings: SimConfig) -> list[StreamedRun]:
        """:meth:`RequestStream.simulate_many`, resumed (:meth:`_resumed`) as ``scenarios``."""
        return self._resumed(SCENARIOS, scenarios, settings, with_instant=True, per_request=False)

    def simulate(
        self,
        scenario: Scenario,
        settings: SimConfig,
        *,
        with_instant: bool = True,
        per_request: bool = False,
    ) -> StreamedRun:
        """:meth:`RequestStream.simulate`, resumed (:meth:`_resumed`) under the scenario's key
        (every request's hit tokens, ``per_request``, kept with the pass)."""
        name = (
            scenario.key + ("" if with_instant else _ALONE) + (_PER_REQUEST if per_request else "")
        )
        (run,) = self._resumed(
            name, [scenario], settings, with_instant=with_instant, per_request=per_request
        )
        return run

    def _resumed(
        self,
        name: str,
        scenarios: list[Scenario],
        settings: SimConfig,
        *,
        with_instant: bool,
        per_request: bool,
    ) -> list[StreamedRun]:
        """The runs of one pass over the table (:meth:`carried` as ``name``)."""
        stream = self.stream
        facts = TableFacts.of(
            stream.chunks, any(routes_by_session(s.routing) for s in scenarios), self.parts
        )
        replayed = settings.model_dump(mode="json", exclude=set(_NOT_REPLAYED))
        made_of = {
            "scenarios": [dataclasses.asdict(s) for s in scenarios],
            "settings": replayed,
            "facts": dataclasses.asdict(facts),
            "with_instant": with_instant,
            "per_request": per_request,
        }
        streamed = self.carried(
            name,
            "scenario replay" if name == SCENARIOS else f"replay {name}",
            made_of,
            _facts_named(facts),
            StreamPass,
            lambda _: StreamPass(
                scenarios,
                settings,
                facts,
                latency_model=stream.latency_model,
                max_rows=stream.max_rows,
                with_instant=with_instant,
                per_request=per_request,
            ),
        )
        return streamed.finish()

    def gathered_curves(
        self, settings: SimConfig, combinations: list[Combination], rate: float
    ) -> list[Curve]:
        """:func:`pipeline.sim.curve_stream.streamed_curves` of every day, its gathering
        (:class:`CurveGathering`) carried on from the days read before (:meth:`carried` as
        ``curves``) while the rate stays put (it halves each time the table doubles,
        :func:`pipeline.sim.curve_stream.sample_rate`)."""
        stream = self.stream
        facts = gathering_facts(stream.chunks, combinations, self.parts)
        # every setting but those the gathering does not read (its rate is named instead)
        read = settings.model_dump(mode="json", exclude=set(_NOT_GATHERED))
        made_of = {
            "pass": CURVES,
            "combinations": combinations,
            "rate": rate,
            "settings": read,
            "facts": dataclasses.asdict(facts),
        }
        latency = stream.latency_model
        gathering = self.carried(
            CURVES,
            "sampled curves",
            made_of,
            {"sample rate": sample_rate_text(rate), **_facts_named(facts)},
            CurveGathering,
            lambda _: CurveGathering(settings, combinations, rate, facts, latency),
        )
        return gathering.finish()

    def forget_unused(self) -> None:
        """Remove the kept passes of replays this process did not make (a fleet replay the
        capacity stage no longer asks for), here and in the bucket (named in ``forgotten``)."""
        if not self.keeps:
            return
        names = folders_below(self.folder, self.remote)
        gone = sorted(n for n in names if _PASS_NAME.match(n) and n not in self.used)
        for name in gone:
            KeptPass(self.folder / name, self.remote).forget()
        self.forgotten.extend(gone)

    def _key(self, made_of: dict[str, Any]) -> str:
        """:meth:`DayPasses._key`, with the stream's latency model and flattening size."""
        return super()._key(
            {
                "latency_model": dataclasses.asdict(self.stream.latency_model),
                "max_rows": self.stream.max_rows,
                **made_of,
            }
        )


def _facts_named(facts: TableFacts) -> dict[str, Any]:
    """The whole table's facts a kept pass depends on, as its line names them when they
    changed (a new day with another block size, or the first request without a session)."""
    return {"block size": facts.block_size, "sessions inferred": facts.infer_sessions}


# Settings the curves' gathering does not read: the rate's own (the rate is in the key) and the
# scenarios' replay (cache sizes, isolation compared, the cache-aware router, lifetimes, slots,
# the request timeout); its routers read the seed and the affinity margin, its keys isolation.
_NOT_GATHERED = frozenset(
    {
        "curve_exact_max_blocks",
        "curve_sample_rate",
        "cache_tokens",
        "compare_isolation",
        "cache_aware",
        "request_lifetime",
        "replica_slots",
        "request_timeout_s",
    }
)


# The kept passes' folder names: the curves' gathering, the scenario grid's, and one scenario's
# (its key, with or without the instant replay beside it, with or without every request's hit
# tokens).
CURVES = "curves"
SCENARIOS = "scenarios"
_ALONE = "-alone"
_PER_REQUEST = "-per-request"
_PASS_NAME = re.compile(r"^(scenarios|b\d+_r\d+_c\d+_[a-z_]+(-alone)?(-per-request)?)$")
