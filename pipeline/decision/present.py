"""The decision record for people: the rationale as plain text a reviewer reads top to bottom
(``enginefit explain``), the candidates as a table, the triggers as a frame, and the sentences
the cost ranking's findings become (:func:`finding_text`)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping

import polars as pl

from pipeline.decision import measures
from pipeline.decision.context import Finding
from pipeline.decision.result import (
    AxisFlip,
    Candidate,
    DecisionRecord,
    Payback,
    Ranking,
    Trigger,
    TriggerCheck,
)
from pipeline.present.tables import cell, markdown_table
from pipeline.present.text import (
    NOTHING,
    UNKNOWN,
    measurement,
    money,
    money_band,
    months,
    months_band,
    number,
    share,
    significant,
    usd,
)

WIDTH = 96
# A rule's ``fired``: it applied, it did not, or an input it needs is unknown.
RULE_OUTCOME_WORDS = {True: "applied", False: "did not apply", None: UNKNOWN}


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ") or [
        indent
    ]


def rationale_text(record: DecisionRecord) -> str:
    """The record as a memo a VP reads top to bottom: the answer and how sure it is, how the
    engines were compared, each candidate with its cost and payback, what would change the
    answer and when to revisit it (sentences, plain numbers), then routing, isolation, the
    rules with their evidence, and the inputs' digests."""
    rec = record.recommendation
    name = record_names(record)
    lines = [
        f"Engine decision for workload {record.workload} (as of {record.as_of or UNKNOWN})",
        "",
    ]
    lines += _wrap(rec.headline)
    lines.append(f"Confidence: {rec.confidence}; state: {rec.state}.")
    for reason in rec.confidence_reasons:
        lines += _wrap(f"- {reason}")
    if record.ranking is not None:
        lines += ["", "How the engines were compared"]
        lines += _wrap(ranking_text(record.ranking))
    lines += ["", "Candidates"]
    for c in record.candidates:
        lines += _wrap(f"- {c.name} [{c.status}]{_candidate_figures(c)}")
        for detail in candidate_details(c):
            lines += _wrap(detail, "    ")
        prediction = record.measured(measures.PREDICTION_CHECK.key(c.engine))
        if isinstance(prediction, str):
            lines += _wrap(prediction, "    ")
        for reason in c.reasons:
            lines += _wrap(reason, "    ")
        if c.payback is not None and c.status != "excluded":
            lines += _wrap(f"{payback_label(c.payback, name)}: {payback_text(c.payback)}", "    ")
        if c.flip_condition:
            lines += _wrap(f"becomes the answer: {c.flip_condition}", "    ")
    if record.flips:
        lines += ["", "What would change the answer (each input moved alone, the decision re-run)"]
        for flip in record.flips:
            lines += _wrap(f"- {flip_sentence(flip, name)}")
    lines += ["", "Revisit the decision when"]
    settings = [t for t in record.triggers if t.metric.startswith(REQUIREMENT_METRIC)]
    for t in record.triggers:
        if t not in settings:
            sentence = trigger_sentence(t.metric, t.comparator, t.threshold, t.value.value, name)
            lines += _wrap(f"- {sentence} ({STATUS_WORDS[t.status]}) Why: {t.why}")
    if settings:
        lines += _wrap(f"- {requirements_sentence(settings)}")
    if record.previous is not None:
        prev = record.previous
        lines += [
            "",
            f"The previous decision ({prev.as_of or 'undated'}: {name(prev.engine or '')}), "
            "its triggers now",
        ]
        for check in prev.triggers:
            sentence = trigger_sentence(
                check.metric, check.comparator, check.threshold, check.value.value, name
            )
            lines += _wrap(
                f"- {sentence} It was {_metric_value(check.metric, check.previous_value.value)} then: "
                f"{PREVIOUS_STATUS_WORDS[check.status]}."
            )
    routing = record.routing
    lines += ["", "Prefix-aware routing"]
    lines += _wrap(routing.reason or "not evaluated")
    if routing.layer_choice:
        lines += _wrap(f"layer: {routing.layer_choice}")
    lines += _wrap(f"cache per replica: {routing.cache_tokens_source}")
    if routing.monthly_usd_saved is not None:
        lines += _wrap(
            f"saves about {number(routing.monthly_prompt_tokens_saved)} prompt tokens of prefill "
            f"and {money(routing.monthly_usd_saved)} a month ({routing.method})"
        )
    elif routing.method:
        lines += _wrap(f"method: {routing.method}")
    lines += ["", "Tenant isolation"]
    lines += _wrap(record.isolation.reason)
    lines += ["", "Appendix: the rules, in the order they were applied"]
    for i, rule in enumerate(record.rationale, 1):
        lines += _wrap(
            f"{i}. {rule.title} ({rule.rule}): {RULE_OUTCOME_WORDS[rule.fired]}. {rule.effect}"
        )
        lines += _wrap(f"source: {rule.source}", "    ")
        for key, value in rule.evidence.items():
            lines += _wrap(f"{key} = {measurement(value)}", "    ")
    lines += ["", "Inputs (sha256)"]
    lines += [f"- {name}: {digest}" for name, digest in record.inputs.items()]
    lines.append(f"- catalog {record.catalog['source']}: {record.catalog['sha256']}")
    return "\n".join(lines) + "\n"


STATUS_WORDS = {"fired": "fired now.", "not_fired": "not fired today.", "unknown": "unknown today."}
PREVIOUS_STATUS_WORDS = {"fired": "fired", "not_fired": "did not fire", "unknown": UNKNOWN}


# The measurement of each requirement (pipeline.decision.compute): one trigger each.
REQUIREMENT_METRIC = measures.SETTING.name + "["


def requirements_sentence(triggers: list[Trigger]) -> str:
    """The requirement triggers in one sentence: revisit when any requirement changes."""
    fired = [t.metric[len(REQUIREMENT_METRIC) : -1] for t in triggers if t.status == "fired"]
    today = "; ".join(
        f"{t.metric[len(REQUIREMENT_METRIC) : -1]} {_setting(t.threshold)}" for t in triggers
    )
    status = f"changed now: {', '.join(fired)}." if fired else "none has changed today."
    return f"Revisit if any requirement changes from what this decision read ({today}); {status}"


def record_names(record: DecisionRecord) -> Callable[[str], str]:
    """Engine key → its name, from the record's candidates (every catalog engine is one)."""
    names = {c.engine: c.name for c in record.candidates}
    return lambda engine: names.get(engine, engine)


def ranking_text(ranking: Ranking) -> str:
    """How the engines were compared and when a gap is a tie, in a few sentences."""
    if ranking.basis is None:
        text = "Nothing was priced, so nothing was compared on cost."
    else:
        text = f"Compared on {BASIS_WORDS[ranking.basis]}: {ranking.basis_note}."
    if ranking.gap is not None:
        text += f" The top two are {share(ranking.gap)} apart."
    if ranking.bands_overlap is not None:
        text += (
            " Their bands (the capacity's band carried into the cost) overlap, which is a tie."
            if ranking.bands_overlap
            else " Their bands (the capacity's band carried into the cost) do not overlap."
        )
    band = share(ranking.tie_band)
    if ranking.tie_band_set_by == "noise":
        text += (
            f" A gap under {band} is a tie: the benchmarks' measured repeat-run noise sets the "
            f"band, wider than the {share(ranking.margin, 0)} margin ({ranking.noise_note})."
        )
    else:
        text += (
            f" A gap under {band} is a tie: the configured margin sets the band "
            f"({ranking.noise_note})."
        )
    return text


def payback_label(payback: Payback, name: Callable[[str], str]) -> str:
    """What a candidate's payback is of: a switch from the engine running today, or (a new
    deployment) choosing it over the other of the top two."""
    if payback.kind == "choice" and payback.against is not None:
        return f"payback of choosing it over {name(payback.against)}"
    return "payback of switching to it"


def payback_text(payback: Payback) -> str:
    """A payback in words: the months with how they were worked, never, or unknown and why."""
    band = (
        f" (over the capacity band: {months_band(payback.months_band)})"
        if payback.months_band is not None
        else ""
    )
    if payback.status == "months":
        return f"{months(payback.months)}: {payback.reason}{band}"
    return payback.reason + band if payback.status == "never" else f"{UNKNOWN} — {payback.reason}"


def payback_cell(payback: Payback | None) -> str:
    """A payback in a table cell: months, ``never``, ``unknown``, or ``—`` (no switch)."""
    if payback is None:
        return NOTHING
    return {"months": months(payback.months), "never": "never"}.get(payback.status, UNKNOWN)


# What each axis's flip moves, its subject in a sentence and how its values read.
def _axis_subject(axis: str, name: Callable[[str], str]) -> str:
    if axis.startswith("cost["):
        return f"{name(axis[5:-1])}'s cost per 1M output tokens"
    return {
        "volume": "monthly output volume",
        "model_changes": "the number of model changes a quarter",
        "prefix_share": "the shared-prefix share",
        "gpu_price": "the GPU price (every engine's alike)",
        "hardware": "the hardware",
    }[axis]


def _axis_value(unit: str, value: object) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    if not isinstance(value, int | float):
        return UNKNOWN
    return {
        "output tokens a month": f"{significant(value)} output tokens",
        "model changes a quarter": significant(value),
        "shared-prefix share": share(value),
        "$ per GPU-hour": f"{money(value, 2)} per GPU-hour",
        "$ per 1M output tokens": usd(value),
    }.get(unit, significant(value))


def flip_sentence(flip: AxisFlip, name: Callable[[str], str]) -> str:
    """One axis's flip as a sentence: which engine becomes the answer at which value (today's
    beside it), no flip within the range searched, or unknown and why."""
    subject = _axis_subject(flip.axis, name)
    today = _axis_value(flip.unit, flip.today)
    if flip.reason is not None:
        return f"Unknown where {subject} would flip the answer: {flip.reason}."
    winner = (
        f"{name(flip.engine)} becomes the answer" if flip.engine else "No engine is recommended"
    )
    if flip.direction == "change":
        if flip.threshold is None:
            tried = "; ".join(_axis_value(flip.unit, h) for h in flip.searched)
            return (
                f"No change of one hardware target changes the answer (today {today}; tried "
                f"{tried})."
            )
        becomes = _axis_value(flip.unit, flip.threshold)
        return f"{winner} if the hardware becomes {becomes} (today {today})."
    if flip.threshold is None:
        low, high = (_axis_value(flip.unit, v) for v in flip.searched)
        edge, moves = (high, "rise") if flip.direction == "up" else (low, "fall")
        return f"No flip: {subject} can {moves} from {today} to {edge} without changing the answer."
    moves = "rises to" if flip.direction == "up" else "falls to"
    return (
        f"{winner} if {subject} {moves} {_axis_value(flip.unit, flip.threshold)} (today {today})."
    )


# A trigger's metric (key, and the engine or requirement in brackets) as the subject of a
# sentence, and how its values read.
_METRIC_SUBJECTS: dict[str, tuple[str, Callable[[object], str]]] = {}


def _format_with(unit: str) -> Callable[[object], str]:
    return lambda value: _axis_value(unit, value)


def _days(value: object) -> str:
    return f"{measurement(value)} days" if isinstance(value, int | float) else UNKNOWN


def _months_value(value: object) -> str:
    if value == "never":
        return "never"
    return months(value) if isinstance(value, int | float) else UNKNOWN


def _setting(value: object) -> str:
    """A requirement as the record measures it (canonical JSON) in words; null: unset."""
    if not isinstance(value, str):
        return UNKNOWN
    decoded = json.loads(value)
    if isinstance(decoded, bool):
        return "yes" if decoded else "no"
    return "unset" if decoded is None else measurement(decoded)


_METRIC_SUBJECTS.update(
    {
        measures.PEAK_CONCURRENCY.name: ("peak concurrency", measurement),
        measures.PEAK_RATE.name: (
            "the peak arrival rate",
            lambda v: f"{measurement(v)} req/s" if isinstance(v, int | float) else UNKNOWN,
        ),
        measures.OUTPUT_TOKENS_PER_MONTH.name: (
            "monthly output volume",
            _format_with("output tokens a month"),
        ),
        measures.SHARED_PREFIX_RATIO.name: (
            "the shared-prefix share",
            _format_with("shared-prefix share"),
        ),
        measures.CATALOG_AGE_DAYS.name: ("the engine catalog's age", _days),
        measures.OLDEST_FACT_AGE_DAYS.name: (
            "the age of the oldest catalog fact used",
            lambda v: "undated (the oldest there is)" if v == "undated" else _days(v),
        ),
        measures.MIN_CUDA_MAJOR.name: (
            "the CUDA major release {engine}'s current release needs",
            measurement,
        ),
        measures.BENCH_AGE_DAYS.name: ("{engine}'s benchmark's age", _days),
        measures.ENGINE_STATUS.name: ("{engine}'s status in the catalog", measurement),
        measures.MISSING_FEATURES.name: (
            "the number of required features {engine} lacks",
            measurement,
        ),
        measures.COST_PER_1M_OUTPUT.name: (
            "{engine}'s cost per 1M output tokens",
            _format_with("$ per 1M output tokens"),
        ),
        measures.BENCH_COST_PER_1M_OUTPUT.name: (
            "{engine}'s benchmark cost per 1M output tokens",
            _format_with("$ per 1M output tokens"),
        ),
        measures.MONTHLY_TOTAL.name: (
            "{engine}'s monthly total",
            lambda v: money(v) if isinstance(v, int | float) else UNKNOWN,
        ),
        measures.PAYBACK_MONTHS.name: ("the payback of choosing {engine}", _months_value),
        measures.GPU_HOUR_USD.name: ("{engine}'s GPU price", _format_with("$ per GPU-hour")),
        measures.COST_GAP_TOP_TWO.name: (
            "the cost gap between the top two",
            lambda v: share(v) if isinstance(v, int | float) else UNKNOWN,
        ),
        measures.MODEL_CHANGES_PER_QUARTER.name: (
            "the number of model changes a quarter",
            _format_with("model changes a quarter"),
        ),
        measures.FIXED_SKU.name: (
            "the fleet",
            lambda v: ("one fixed SKU" if v else "mixed SKUs") if isinstance(v, bool) else UNKNOWN,
        ),
        measures.SETTING.name: ("the requirement {engine}", _setting),
    }
)
_VERBS = {
    ">": "rises above {}",
    ">=": "reaches {} or more",
    "<": "falls below {}",
    "<=": "falls to {} or less",
    "==": "becomes {}",
    "!=": "is no longer {}",
}


def _metric_subject(metric: str, name: Callable[[str], str]) -> tuple[str, Callable[[object], str]]:
    key, _, arg = metric.partition("[")
    subject, fmt = _METRIC_SUBJECTS.get(key, (key, measurement))
    arg = arg.rstrip("]")
    engine = arg if key == measures.SETTING.name else name(arg)
    return subject.format(engine=engine), fmt


def _metric_value(metric: str, value: object) -> str:
    return _metric_subject(metric, str)[1](value)


def trigger_sentence(
    metric: str, comparator: str, threshold: object, value: object, name: Callable[[str], str]
) -> str:
    """A revisit trigger as a sentence: "Revisit if SGLang's cost per 1M output tokens falls
    below $0.1305; today $0.1500." (never the metric's key and comparator)."""
    subject, fmt = _metric_subject(metric, name)
    condition = _VERBS[comparator].format(fmt(threshold))
    return f"Revisit if {subject} {condition}; today {fmt(value)}."


def _candidate_figures(c: Candidate) -> str:
    """The headline figures of a candidate: the workload's cost with the benchmark's beside it,
    the fleet at the peak and its monthly cost."""
    text = ""
    if c.cost_per_1m_output_usd is not None:
        if c.cost_basis == "workload":
            text += (
                f", {usd(c.cost_per_1m_output_usd)} per 1M output tokens of this workload "
                f"(benchmark's {usd(c.benchmark_cost_per_1m_output_usd)})"
            )
        else:
            text += f", {usd(c.cost_per_1m_output_usd)} per 1M output tokens (the benchmark's)"
    if c.replicas is not None:
        text += f", {c.replicas} replica{'s' if c.replicas != 1 else ''} at peak"
    monthly_usd = c.monthly_bill()
    if monthly_usd is not None:
        text += f", {money(monthly_usd)}/month"
    return text


def candidate_details(c: Candidate) -> list[str]:
    """The workload's capacity and price sheet of a candidate, each a line of plain text."""
    out = []
    if c.workload_capacity_rps is not None:
        band = c.workload_capacity_band_rps
        band_text = f" ({number(band[0], 2)}–{number(band[1], 2)})" if band else ""
        out.append(
            f"capacity on this workload: {number(c.workload_capacity_rps, 2)} req/s per replica"
            f"{band_text}, {c.capacity_basis}; the benchmark measured "
            f"{number(c.capacity_rps, 2)} req/s on its own mix"
        )
    if c.transfer:
        out.append(c.transfer)
    if c.capacity_arrivals:
        out.append(f"arrivals: {c.capacity_arrivals}")
    if c.capacity_cache:
        out.append(c.capacity_cache)
    if c.capacity_binding:
        out.append(f"what binds it: {c.capacity_binding}")
    if c.capacity_sensitivity:
        out.append(f"what moves the capacity: {c.capacity_sensitivity}")
    if c.capacity_band_basis:
        out.append(f"the band: {c.capacity_band_basis}")
    bill_band = c.monthly_bill_band()
    if c.replicas_band is not None and bill_band is not None:
        fewest, most = c.replicas_band
        replicas = f"{fewest}" if fewest == most else f"{fewest}–{most}"
        per_1m = c.cost_per_1m_output_band_usd
        out.append(
            f"over the band: {replicas} replica{'s' if most != 1 else ''} at peak, "
            f"{money_band(bill_band)}/month"
            + (
                f", {usd(per_1m[0])}–{usd(per_1m[1])} per 1M output tokens (all-in)"
                if per_1m
                else ""
            )
        )
    if c.cost_basis == "workload":
        out.append(
            "per 1M tokens of this workload: output "
            f"{usd(c.cost_per_1m_output_decode_usd)} (decode share), input "
            f"{usd(c.cost_per_1m_input_usd)}, cached input {usd(c.cost_per_1m_cached_input_usd)}; "
            f"the fleet at the mean rate {usd(c.fleet_cost_per_1m_output_usd)} per 1M output"
        )
    elif c.cost_note and c.benchmarked:
        out.append(c.cost_note)
    return out


#: The triggers table: every column text (a measurement in words).
TRIGGER_COLUMNS = [
    "record",
    "id",
    "metric",
    "comparator",
    "threshold",
    "previous_value",
    "value",
    "status",
    "why",
]


def triggers_frame(record: DecisionRecord) -> pl.DataFrame:
    """One row per trigger (this record's, then the previous record's evaluated now)."""
    checks: list[tuple[str, Trigger | TriggerCheck, str | None]]
    checks = [("current", t, None) for t in record.triggers]
    if record.previous is not None:
        checks += [
            ("previous", c, measurement(c.previous_value.value)) for c in record.previous.triggers
        ]
    rows = [
        (
            which,
            t.id,
            t.metric,
            t.comparator,
            measurement(t.threshold),
            previous,
            measurement(t.value.value),
            t.status,
            t.why,
        )
        for which, t, previous in checks
    ]
    return pl.DataFrame(rows, schema=dict.fromkeys(TRIGGER_COLUMNS, pl.String), orient="row")


def _band_cell(band: tuple[float, float] | None) -> str | None:
    """A band's ends as one table cell (None: no band, shown as unknown)."""
    return None if band is None else f"{cell(float(band[0]))}–{cell(float(band[1]))}"


def candidates_table(record: DecisionRecord) -> str:
    rows = [
        {
            "engine": c.name,
            "status": c.status,
            "$/1M out": c.cost_per_1m_output_usd,
            "$/1M out band": _band_cell(c.cost_per_1m_output_band_usd),
            "benchmark $/1M out": c.benchmark_cost_per_1m_output_usd,
            "basis": c.cost_basis,
            "req/s per replica": c.workload_capacity_rps,
            "replicas": c.replicas,
            "$/month (GPUs + changes)": c.monthly_bill(),
            "$/month band": _band_cell(c.monthly_bill_band()),
            "payback": payback_cell(c.payback),
            "why": "; ".join(c.reasons[:2]),
        }
        for c in record.candidates
    ]
    return markdown_table(rows)


BASIS_WORDS = {
    "fleet_fraction_total_usd": (
        "monthly total cost (GPU fleet the peak needs, before rounding up to whole replicas, "
        "plus model changes)"
    ),
    "fleet_fraction_gpu_usd": (
        "monthly GPU cost (the fleet the peak needs, before rounding up to whole replicas)"
    ),
    "cost_per_1m_output_usd": "cost per 1M output tokens at the SLO",
}
# Why the ranking compares what it compares (the record's ``ranking.basis_note``).
BASIS_NOTES = {
    "fleet_fraction_total_usd": (
        "engines are compared on the GPU fleet the peak needs before rounding up to whole "
        "replicas (peak rate ÷ capacity per replica at the SLO, with the headroom and any N+1 "
        "spare), priced, plus model changes: for one traffic that is each engine's cost per 1M "
        "output tokens at the SLO times one volume, so whole-replica rounding neither hides a "
        "gap (both need one replica) nor inflates one (one replica against two); the monthly "
        "bills and the payback stay whole replicas"
    ),
    "cost_per_1m_output_usd": (
        "engines are compared on cost per 1M output tokens at the SLO (a fleet could not be "
        "sized for every engine), which whole-replica rounding does not touch"
    ),
}
BASIS_NOTES["fleet_fraction_gpu_usd"] = BASIS_NOTES["fleet_fraction_total_usd"].replace(
    ", plus model changes", " (model-change costs unknown)"
)


def basis_note(basis: str | None) -> str:
    return BASIS_NOTES[basis] if basis else "nothing was priced"


def noise_note(
    noise_by_engine: Mapping[str, float | None],
    repeats: Mapping[str, int | None],
    name: Callable[[str], str],
) -> str:
    """The compared benchmarks' repeat-run noise, engine by engine."""
    if not noise_by_engine:
        return "no benchmark to measure noise on"
    parts = [
        f"{name(e)} {share(v)} over {repeats.get(e) or 'several'} runs"
        if v is not None
        else f"{name(e)} not repeated"
        for e, v in sorted(noise_by_engine.items())
    ]
    if all(v is None for v in noise_by_engine.values()):
        return "repeat-run noise unknown (" + "; ".join(parts) + ": run the capacity load again)"
    return "repeat-run noise " + "; ".join(parts)


# What decided a tie, about the chosen engine (``first``) and the other (``second``).
TIE_BREAK_WORDS = {
    "maintained": "it is actively maintained and {second} is not",
    "runs_today": "it runs today (no migration)",
    "shorter_migration": "its migration is shorter ({first_weeks:g} vs {second_weeks:g} "
    "engineer-weeks)",
    "releases": "it released more often in the last six months ({first_releases:g} vs "
    "{second_releases:g} releases), the better maintenance trajectory",
    "alphabetical": "nothing else separates them, so alphabetical order decides",
}
# What was equal before the deciding criterion, about both.
TIE_EQUAL_WORDS = {
    "maintained": "both are actively maintained",
    "runs_today": "neither runs today",
    "shorter_migration": "both take {first_weeks:g} engineer-weeks to migrate to",
    "tree_order": "the decision tree points to neither",
    "releases": "both released {first_releases:g} times in six months",
}
NO_CANDIDATE = "no engine the decision tree points to meets the requirements"
NO_PRICED_BENCHMARK = "no benchmark with a cost at the SLO for a viable engine on your deployment"


def finding_text(finding: Finding, name: Callable[[str], str]) -> str:
    """A cost-ranking finding as the sentence the record keeps (``name``: engine → its name).

    ``engines`` are named in the order each code's sentence uses them (the engine the finding
    is about first, then its rival); ``details`` carry a basis, a tie-break criterion, a missing
    input or upstream text as is."""
    code, f, details = finding.code, finding.figures, finding.details
    n = [name(e) for e in finding.engines]
    if code == "bench_mismatch":
        return f"{n[0]}'s benchmark is not about your deployment ({'; '.join(details)}): its cost is not used"
    if code == "no_candidate":
        why = "; ".join(f"{engine}: {reason}" for engine, reason in zip(n, details, strict=True))
        return f"{NO_CANDIDATE} ({why})" if why else NO_CANDIDATE
    if code == "no_benchmark":
        return (
            f"no benchmark on this traffic ({details[0] or NO_PRICED_BENCHMARK}): run an open-loop "
            f"benchmark of {' and '.join(n)}"
        )
    if code == "cost_unmeasured":
        return f"{UNKNOWN}: {details[0] or NO_PRICED_BENCHMARK}; the decision tree's choice stands"
    if code in ("tie", "margin_tie"):
        return ("tie: " if code == "margin_tie" else "") + _tie_text(n, f, details)
    if code == "no_runner_up":
        return "no runner-up with a cost"
    if code == "margin_exceeded":
        apart = (
            f" and their bands do not overlap ({_bands_text(details[0], n[0], n[1], f)})"
            if "first_low" in f
            else ""
        )
        return f"the gap, {share(f['gap'])}, exceeds the tie band{apart}"
    if code == "only_cost":
        return f"{n[0]} is the only engine with a cost at the SLO on your deployment"
    if code in ("lowest", "lowest_tie"):
        return f"{n[0]} has the lowest {BASIS_WORDS[details[0]]}" + (
            " (tie)" if code == "lowest_tie" else ""
        )
    if code == "favourite_unpriced" or code == "favourite_unbenchmarked":
        # Said so that recommending n[1] and asking for a benchmark of n[0] do not contradict.
        return (
            f"{n[1]} is the cheapest engine with a cost here, but the decision tree favours "
            f"{n[0]} for this traffic, which "
            + (
                "was benchmarked but has no cost at the SLO on it"
                if code == "favourite_unpriced"
                else "has no benchmark on it"
            )
            + f": benchmark {n[0]} on your traffic before committing to {n[1]}"
        )
    if code == "measured_cheaper":
        return (
            f"{n[0]} wins if its cost per 1M output tokens at the SLO, measured on your traffic, "
            f"is more than {share(f['band'])} below {n[1]}'s"
        )
    if code in (
        "cost_below_rival",
        "changes_too_dear",
        "cost_below_per_token",
        "cost_below_margin",
    ):
        return _cost_below_text(code, n, f, details)
    return _payback_text(code, n, f, details)


def _cost_below_text(
    code: str, n: list[str], f: Mapping[str, float], details: tuple[str, ...]
) -> str:
    # The rival's figure is this workload's (capacity stage) or its benchmark's own mix.
    rival = f"{n[1]}'s" + (" for this workload" if details[:1] == ("workload",) else "")
    if code == "cost_below_rival":
        return (
            f"{n[0]} wins if its cost per 1M output tokens at the SLO is more than "
            f"{share(f['band'])} below {rival}"
        )
    if code == "changes_too_dear":
        return (
            f"{n[0]} cannot win while its model changes cost {money(f['change'])} a month against "
            f"{n[1]}'s {money(f['rival_change'])}"
        )
    if code == "cost_below_per_token":
        return (
            f"{n[0]} wins if its cost per 1M output tokens at the SLO falls below "
            f"{usd(f['threshold'])} (more than {share(f['band'])} below {rival} "
            f"{usd(f['rival_cost'])}, its model changes, {money(f['change'])} a month against "
            f"{money(f['rival_change'])}, counted in)"
        )
    if code == "cost_below_margin":
        return (
            f"{n[0]} wins if its cost per 1M output tokens at the SLO falls below "
            f"{usd(f['threshold'])} (more than {share(f['band'])} below {rival} "
            f"{usd(f['rival_cost'])})"
        )
    raise ValueError(f"no wording for the cost finding {code!r}")


SUPPLY = {
    "engineer_week_usd": "requirements.engineer_week_usd",
    "current_monthly_cost": "a monthly cost of {current} at your peak",
    "new_monthly_cost": "a monthly cost of {new} at your peak",
}


def _supply(details: tuple[str, ...], current: str, new: str) -> str:
    """What to supply for a payback (details: the missing input's code, then why it is
    missing, when known)."""
    what = SUPPLY[details[0]].format(current=current, new=new)
    return what + (f" ({details[1]})" if len(details) > 1 and details[1] else "")


# The bills a payback compares: both engines' totals, or both GPU bills when a model-change
# cost is not known.
BILL_WORDS = {"total": "whole replicas and model changes", "gpu": "GPU bills alone"}


def _tie_text(n: list[str], f: Mapping[str, float], details: tuple[str, ...]) -> str:
    """Two engines within the tie band: what set the band, what was equal, and what decided
    for ``n[2]``."""
    basis, set_by, criterion, why_first, why_second, *equal = details
    first, second = n[2], n[3]
    if criterion == "tree_order":
        because = (
            f"the decision tree puts it first: {why_first}"
            if why_second
            else f"the decision tree points to it and not to {second}: {why_first}"
        )
    else:
        because = TIE_BREAK_WORDS[criterion].format(second=second, **f)
    same = [TIE_EQUAL_WORDS[c].format(**f) for c in equal]
    alike = (", ".join(same[:-1]) + " and " + same[-1] if len(same) > 1 else "".join(same)) + (
        ": " if same else ""
    )
    decided = f"{alike}{first} is chosen because {because}"
    bands = _bands_text(basis, n[2], n[3], f) if "first_low" in f else ""
    if set_by == "bands":
        return (
            f"{n[0]} and {n[1]} are {share(f['gap'])} apart on {BASIS_WORDS[basis]}, but their "
            f"bands overlap ({bands}): the capacity's band cannot tell them apart; {decided}"
        )
    band = (
        f"the {share(f['band'], 0)} margin"
        if set_by == "margin"
        else f"the benchmarks' {share(f['band'])} repeat-run noise, wider than the margin"
    )
    overlap = f", and their bands overlap ({bands})" if bands else ""
    return (
        f"{n[0]} and {n[1]} are within {share(f['gap'])} on {BASIS_WORDS[basis]} (inside "
        f"{band}){overlap}; {decided}"
    )


def _bands_text(basis: str, first: str, second: str, f: Mapping[str, float]) -> str:
    """Two engines' bands of the compared figure, each named."""

    def one(low: float, high: float) -> str:
        if basis == "cost_per_1m_output_usd":
            return f"{usd(low)}–{usd(high)} per 1M output tokens"
        return f"{money_band((low, high))} a month"

    return (
        f"{first} {one(f['first_low'], f['first_high'])}, "
        f"{second} {one(f['second_low'], f['second_high'])}"
    )


def _payback_text(code: str, n: list[str], f: Mapping[str, float], details: tuple[str, ...]) -> str:
    if code.startswith("choice_") or code.endswith("_choice"):
        return _choice_text(code, n, f, details)
    if code == "nothing_runs":
        return "no engine runs today (requirements.current_engine): nothing to switch from"
    if code == "current_stays":
        return f"{n[0]} runs today and stays: no switch"
    if code == "current_excluded":
        return (
            f"{n[0]} cannot stay ({'; '.join(details)}): migrate to {n[1]} "
            f"({money(f.get('switch'))} of migration work) and keep {n[0]} running until then"
        )
    if code in (
        "payback_unknown",
        "payback_unknown_rule",
        "payback_shown",
        "payback_missing_switch",
    ):
        current, new = (n[1], n[0]) if code == "payback_shown" else (n[0], n[1])
        supply = _supply(details, current, new)
        if code == "payback_missing_switch":
            return f"the switch cannot be costed: supply {supply}"
        if code == "payback_shown":
            return (
                f"{n[0]} wins once switching is shown to pay back within {f['limit']:g} months "
                f"(supply {supply})"
            )
        if code == "payback_unknown_rule":
            return f"{UNKNOWN}: supply {supply}; {n[0]} stays until a switch is shown to pay back"
        return (
            f"{n[0]} runs today and stays: whether switching to {n[1]} pays back is {UNKNOWN} "
            f"(supply {supply})"
        )
    if code == "payback_never_switch":
        return (
            f"never: {n[0]} would cost {money(f['there'])} a month against {n[1]}'s "
            f"{money(f['here'])} today ({BILL_WORDS[details[0]]}), so switching saves "
            "nothing to pay the migration back from"
        )
    if code == "payback_worked_switch":
        return (
            f"({money(f['switch_cost_usd'])} of migration work + {money(f['parallel_run_usd'])} "
            f"for {n[0]}'s fleet while both engines run {f['parallel_weeks']:g} weeks) ÷ "
            f"{money(f['saving'])} saved a month = {months(f['months'])}"
        )
    cost = (
        f"{money(f['switch'])} of migration work and {money(f['parallel'])} of running both "
        f"engines for {f['weeks']:g} weeks"
    )
    if code == "saving_needed":
        return (
            f"{n[0]} wins when switching saves at least {money(f['needed'])} a month (payback "
            f"of {cost} within {f['limit']:g} months; today it saves {money(f['saving'])})"
        )
    if code == "payback_never_rule":
        return (
            f"switching to {n[0]} saves nothing a month ({money(f['saving'])}): it never pays "
            f"back {cost}: keep {n[1]}"
        )
    if code == "payback_never_stays":
        return f"switching to {n[0]} never pays back (it saves nothing a month): {n[1]} stays"
    saves = f"switching to {n[0]} saves {money(f['saving'])} a month"
    if code == "payback_too_long_rule":
        return (
            f"{saves} and costs {cost}: pays back in {months(f['months'])} "
            f"(> {f['limit']:g}): keep {n[1]}"
        )
    if code == "payback_too_long_stays":
        return (
            f"{n[0]} is cheaper to run but its migration pays back in {months(f['months'])} "
            f"(> {f['limit']:g}): {n[1]} stays"
        )
    if code == "pays_back":
        return f"{saves} for {cost}: pays back in {months(f['months'])} (≤ {f['limit']:g})"
    raise ValueError(f"no wording for the cost finding {code!r}")


def _choice_text(code: str, n: list[str], f: Mapping[str, float], details: tuple[str, ...]) -> str:
    """A new deployment's payback: ``n[0]``'s extra adoption work over ``n[1]``'s against what
    it saves a month."""
    if code == "payback_missing_choice":
        return f"the choice cannot be costed: supply {_supply(details, n[0], n[1])}"
    if code == "choice_unknown":
        return (
            f"{UNKNOWN}: whether {n[0]}'s extra adoption work over {n[1]}'s pays back (supply "
            f"{_supply(details, n[1], n[0])})"
        )
    extra = f"{money(f.get('switch_cost_usd', f.get('switch')))} more adoption work than {n[1]}"
    if code == "payback_never_choice":
        return (
            f"never: {n[0]} would cost {money(f['there'])} a month against {n[1]}'s "
            f"{money(f['here'])} ({BILL_WORDS[details[0]]}), so its {extra} is never paid back"
        )
    if code == "payback_worked_choice":
        if not f["switch_cost_usd"]:
            return (
                f"at once: no more adoption work than {n[1]}, and {money(f['saving'])} a month "
                "less to run"
            )
        return f"({extra}) ÷ {money(f['saving'])} saved a month = {months(f['months'])}"
    if code == "choice_saving_needed":
        return (
            f"{n[0]} wins when it saves at least {money(f['needed'])} a month over {n[1]} "
            f"(paying back its {money(f['switch'])} of extra adoption work within "
            f"{f['limit']:g} months; today it saves {money(f['saving'])})"
        )
    if code == "choice_no_extra":
        return f"{n[0]} takes no more adoption work than {n[1]}: nothing to pay back"
    if code == "choice_pays_back":
        return (
            f"{n[0]} saves {money(f['saving'])} a month over {n[1]} for {money(f['switch'])} more "
            f"adoption work: pays back in {months(f['months'])} (≤ {f['limit']:g})"
        )
    if code in ("choice_never", "choice_never_stays"):
        return (
            f"{n[0]} saves nothing a month over {n[1]} ({money(f['saving'])}) and takes "
            f"{money(f['switch'])} more adoption work: {n[1]} is recommended"
        )
    if code in ("choice_too_long", "choice_too_long_stays"):
        return (
            f"{n[0]} saves {money(f['saving'])} a month over {n[1]} but takes {money(f['switch'])} "
            f"more adoption work: pays back in {months(f['months'])} (> {f['limit']:g}): {n[1]} "
            "is recommended"
        )
    raise ValueError(f"no wording for the cost finding {code!r}")
