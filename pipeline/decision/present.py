"""The decision record for people: the rationale as plain text a reviewer reads top to bottom
(``enginefit explain``), the candidates as a table, the triggers as a frame, and the sentences
the cost ranking's findings become (:func:`finding_text`)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping

import polars as pl

from pipeline.decision.context import Finding
from pipeline.decision.result import Candidate, DecisionRecord
from pipeline.present.tables import markdown_table
from pipeline.present.text import UNKNOWN, measurement, money, months, number, usd

WIDTH = 96
# A rule's ``fired``: it applied, it did not, or an input it needs is unknown.
RULE_OUTCOME_WORDS = {True: "applied", False: "did not apply", None: UNKNOWN}


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ") or [
        indent
    ]


def rationale_text(record: DecisionRecord) -> str:
    """The whole record as prose: the answer, why, every candidate, the rules in order with
    their evidence, what routing buys, and the triggers that would reopen it."""
    rec = record.recommendation
    lines = [
        f"Engine decision for workload {record.workload} (as of {record.as_of or UNKNOWN})",
        "",
    ]
    lines += _wrap(rec.headline)
    lines.append(f"Confidence: {rec.confidence}; state: {rec.state}.")
    for reason in rec.confidence_reasons:
        lines += _wrap(f"- {reason}")
    lines += ["", "Candidates"]
    for c in record.candidates:
        lines += _wrap(f"- {c.name} [{c.status}]{_candidate_figures(c)}")
        for detail in candidate_details(c):
            lines += _wrap(detail, "    ")
        for reason in c.reasons:
            lines += _wrap(reason, "    ")
        if c.flip_condition:
            lines += _wrap(f"flips the answer: {c.flip_condition}", "    ")
    lines += ["", "Rules, in the order they were applied"]
    for i, rule in enumerate(record.rationale, 1):
        lines += _wrap(
            f"{i}. {rule.title} ({rule.rule}): {RULE_OUTCOME_WORDS[rule.fired]}. {rule.effect}"
        )
        lines += _wrap(f"source: {rule.source}", "    ")
        for key, value in rule.evidence.items():
            lines += _wrap(f"{key} = {measurement(value)}", "    ")
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
    lines += ["", "Revisit triggers (reopen the decision when one fires)"]
    for t in record.triggers:
        lines += _wrap(
            f"- {t.id}: {t.metric} {t.comparator} {measurement(t.threshold)} (today {measurement(t.value)}; "
            f"{t.status}). {t.why}"
        )
    if record.previous is not None:
        prev = record.previous
        lines += [
            "",
            f"Previous decision ({prev.as_of or 'undated'}: {prev.engine}), its triggers now",
        ]
        for check in prev.triggers:
            lines += _wrap(
                f"- {check.id}: {check.metric} {check.comparator} {measurement(check.threshold)}: was "
                f"{measurement(check.previous_value)}, now {measurement(check.value)} → {check.status}"
            )
    lines += ["", "Inputs (sha256)"]
    lines += [f"- {name}: {digest}" for name, digest in record.inputs.items()]
    lines.append(f"- catalog {record.catalog['source']}: {record.catalog['sha256']}")
    return "\n".join(lines) + "\n"


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
    monthly_usd = c.monthly_total_usd if c.monthly_total_usd is not None else c.monthly_cost_usd
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


def triggers_frame(record: DecisionRecord) -> pl.DataFrame:
    """One row per trigger (this record's, then the previous record's evaluated now)."""
    rows = [
        {
            "record": "current",
            "id": t.id,
            "metric": t.metric,
            "comparator": t.comparator,
            "threshold": measurement(t.threshold),
            "previous_value": None,
            "value": measurement(t.value),
            "status": t.status,
            "why": t.why,
        }
        for t in record.triggers
    ]
    if record.previous is not None:
        rows += [
            {
                "record": "previous",
                "id": c.id,
                "metric": c.metric,
                "comparator": c.comparator,
                "threshold": measurement(c.threshold),
                "previous_value": measurement(c.previous_value),
                "value": measurement(c.value),
                "status": c.status,
                "why": c.why,
            }
            for c in record.previous.triggers
        ]
    schema = {
        k: pl.String
        for k in (
            "record",
            "id",
            "metric",
            "comparator",
            "threshold",
            "previous_value",
            "value",
            "status",
            "why",
        )
    }
    return pl.DataFrame(rows, schema=schema)


def candidates_table(record: DecisionRecord) -> str:
    frame = pl.DataFrame(
        [
            {
                "engine": c.name,
                "status": c.status,
                "$/1M out": c.cost_per_1m_output_usd,
                "benchmark $/1M out": c.benchmark_cost_per_1m_output_usd,
                "basis": c.cost_basis,
                "req/s per replica": c.workload_capacity_rps,
                "replicas": c.replicas,
                "$/month (GPUs + changes)": c.monthly_total_usd
                if c.monthly_total_usd is not None
                else c.monthly_cost_usd,
                "payback (months)": c.payback_months,
                "why": "; ".join(c.reasons[:2]),
            }
            for c in record.candidates
        ],
        schema={
            "engine": pl.String,
            "status": pl.String,
            "$/1M out": pl.Float64,
            "benchmark $/1M out": pl.Float64,
            "basis": pl.String,
            "req/s per replica": pl.Float64,
            "replicas": pl.Int64,
            "$/month (GPUs + changes)": pl.Float64,
            "payback (months)": pl.Float64,
            "why": pl.String,
        },
    )
    return markdown_table(frame)


BASIS_WORDS = {
    "monthly_total_usd": "monthly total cost (GPU fleet at the peak rate plus model changes)",
    "monthly_gpu_usd": "monthly GPU cost (fleet at the peak rate)",
    "cost_per_1m_output_usd": "cost per 1M output tokens at the SLO",
}
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


def _on_basis(basis: str, value: float) -> str:
    return (
        usd(value) + " per 1M output tokens"
        if basis == "cost_per_1m_output_usd"
        else money(value) + " a month"
    )


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
        return "the gap exceeds the margin"
    if code == "only_cost":
        return f"{n[0]} is the only engine with a cost at the SLO on your deployment"
    if code in ("lowest", "lowest_tie"):
        return f"{n[0]} has the lowest {BASIS_WORDS[details[0]]}" + (
            " (tie)" if code == "lowest_tie" else ""
        )
    if code == "favourite_unpriced" or code == "favourite_unbenchmarked":
        return (
            f"the decision tree points to {n[0]}, which "
            + (
                "was benchmarked but has no cost at the SLO on this traffic"
                if code == "favourite_unpriced"
                else "has no benchmark on this traffic"
            )
            + f": benchmark {n[0]} on your traffic before committing"
        )
    if code == "measured_cheaper":
        return (
            f"{n[0]} wins if its measured cost per 1M output tokens at the SLO is more than "
            f"{f['margin']:.0%} below {n[1]}'s on your traffic"
        )
    if code == "cost_below_rival":
        return f"{n[0]} wins if its measured cost at the SLO is more than {f['margin']:.0%} below {n[1]}'s"
    if code == "changes_too_dear":
        return (
            f"{n[0]} cannot win while its model changes cost {money(f['change'])} a month against "
            f"{n[1]}'s {money(f['rival_change'])}"
        )
    if code == "cost_below_per_token":
        return (
            f"{n[0]} wins if its measured cost per 1M output tokens at the SLO is below "
            f"{usd(f['threshold'])} (more than {f['margin']:.0%} below {n[1]}'s "
            f"{usd(f['rival_cost'])}, its model changes, {money(f['change'])} a month against "
            f"{money(f['rival_change'])}, counted per token)"
        )
    if code == "cost_below_margin":
        return (
            f"{n[0]} wins if its measured cost per 1M output tokens at the SLO is more than "
            f"{f['margin']:.0%} below {n[1]}'s {usd(f['rival_cost'])} (below {usd(f['threshold'])})"
        )
    if code == "fewer_changes":
        volume = (
            f", or when monthly volume exceeds {f['volume']:,.0f} output tokens (today "
            f"{f['volume_today']:,.0f})"
            if "volume" in f
            else ""
        )
        return (
            f"{n[0]} wins when model changes fall to ≤ {f['changes']:g} per quarter (today "
            f"{f['changes_today']:g}){volume}"
        )
    if code == "basis_below":
        basis = details[0]
        return (
            f"{n[0]} wins if its {BASIS_WORDS[basis]} falls below {_on_basis(basis, f['threshold'])} "
            f"(more than {f['margin']:.0%} below {n[1]}'s {_on_basis(basis, f['rival_value'])}; "
            f"today {_on_basis(basis, f['value'])})"
        )
    return _payback_text(code, n, f, details)


def _tie_text(n: list[str], f: Mapping[str, float], details: tuple[str, ...]) -> str:
    """Two engines within the margin: what was equal, and what decided for ``n[2]``."""
    basis, criterion, why_first, why_second, *equal = details
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
    return (
        f"{n[0]} and {n[1]} are within {f['gap']:.1%} on {BASIS_WORDS[basis]} (under the "
        f"{f['margin']:.0%} margin); {alike}{first} is chosen because {because}"
    )


def _payback_text(code: str, n: list[str], f: Mapping[str, float], details: tuple[str, ...]) -> str:
    if code == "nothing_runs":
        return "no engine runs today (requirements.current_engine): nothing to switch from"
    if code == "current_stays":
        return f"{n[0]} runs today and stays: no switch"
    if code == "current_excluded":
        return (
            f"{n[0]} cannot stay ({'; '.join(details)}): migrate to {n[1]} "
            f"({money(f.get('switch'))} of migration work) and keep {n[0]} running until then"
        )
    if code in ("payback_unknown", "payback_unknown_rule", "payback_shown"):
        current = n[1] if code == "payback_shown" else n[0]
        supply = (
            "requirements.engineer_week_usd"
            if details[0] == "engineer_week_usd"
            else f"a benchmark of {current} with a monthly cost"
        )
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
    if code == "saving_needed":
        return (
            f"{n[0]} wins when switching saves at least {money(f['needed'])} a month (payback "
            f"within {f['limit']:g} months; today it saves {money(f['saving'])})"
        )
    saves = f"switching to {n[0]} saves {money(f['saving'])} a month"
    if code == "payback_too_long_rule":
        return (
            f"{saves} and costs {money(f['switch'])}: pays back in {months(f['months'])} "
            f"(> {f['limit']:g}): keep {n[1]}"
        )
    if code == "payback_too_long":
        return (
            f"{n[0]} is cheaper to run but its migration pays back in {months(f['months'])} "
            f"(> {f['limit']:g}): {n[1]} stays"
        )
    if code == "pays_back":
        return (
            f"{saves} for {money(f['switch'])}: pays back in {months(f['months'])} "
            f"(≤ {f['limit']:g})"
        )
    raise ValueError(f"no wording for the cost finding {code!r}")
