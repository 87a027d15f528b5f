"""Section 3, the workload's shape: its size, rates, concurrency and lengths, each arrival
window's peak and burstiness, the shape stage's findings and figures."""

from __future__ import annotations

from pipeline.present.text import number
from pipeline.report.sections.content import Figure, ReportContent, figures
from pipeline.unknown import ResultModel, Unknown


class Fact(ResultModel):
    label: str
    value: str


class Window(ResultModel):
    window: str
    peak: str
    dispersion: str


class Shape(ResultModel):
    facts: list[Fact]
    windows: list[Window]
    estimate_note: str | None
    findings: list[str]
    figures: list[Figure]


def shape(inputs: ReportContent) -> Shape:
    metrics = inputs.shape
    arrivals, conc, lengths = metrics.arrivals, metrics.concurrency, metrics.lengths
    prompt, output = lengths.prompt_tokens, lengths.output_tokens
    facts = {
        "Requests": number(metrics.requests),
        "Span": number(arrivals.span_s / 3600, 1, "h"),
        "Mean arrival rate": number(arrivals.mean_rate_rps, 2, "req/s"),
        "Peak concurrency": number(conc.peak)
        + (" (estimated)" if conc.estimated else " (exact, logged durations)"),
        "Prompt tokens p50 / p99": f"{number(prompt.p50)} / {number(prompt.p99)}",
        "Output tokens p50 / p99": f"{number(output.p50)} / {number(output.p99)}",
    }
    sketch = metrics.percentiles_sketched
    if sketch is not None:
        facts["Percentiles"] = (
            f"sketched (more than {sketch.exact_max_requests:,} requests): each within "
            f"{sketch.relative_error:.1%} of the exact value (DDSketch, Masson et al. 2019)"
        )
    return Shape(
        facts=[Fact(label=label, value=value) for label, value in facts.items()],
        windows=[
            Window(window=name, peak="not supported", dispersion=w.reason)
            if isinstance(w, Unknown)
            else Window(
                window=name,
                peak=number(w.peak_rate_rps, 2, "req/s"),
                dispersion=number(w.index_of_dispersion, 2),
            )
            for name, w in arrivals.windows.items()
        ],
        estimate_note=conc.label if conc.estimated else None,
        findings=[f.message for f in metrics.findings],
        figures=figures(inputs, ("arrivals", "lengths", "concurrency")),
    )
