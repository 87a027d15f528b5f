"""The report stage: read_inputs → run → write, shared by the ``engine_selection_report``
asset and ``enginefit report``'s last step.

It renders the decision and the stages' results into ``engine-selection.pdf`` and ``.html``
and publishes them as a new version under ``<reports_dir>/<workload>/<quarter>/v<N>/`` with
the decision record and a manifest — unless nothing it was made from changed since the
quarter's latest version (same inputs, upstream outputs, configuration, catalog and code), in
which case it publishes nothing and says so.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.metadata
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline import dates, results
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import BenchPolicy
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.result import CapacityResult
from pipeline.decision.catalog import BUNDLED, load_catalog
from pipeline.decision.result import DecisionRecord
from pipeline.decision.stage import read_record
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ingest.result import IngestSummary
from pipeline.ingest.stage import read_summary
from pipeline.layout import WorkloadLayout
from pipeline.ledger import (
    BUNDLED_INPUT,
    HTML,
    INSTALLATION,
    PDF,
    RECORD,
    SIGNATURE,
    Entry,
    Filing,
    ReportTree,
    sha256_bytes,
    sha256_of,
)
from pipeline.prefix import stage as prefix_stage
from pipeline.prefix.result import PrefixSummary
from pipeline.report.compute import build
from pipeline.report.config import JsonDocument, Provenance, ReportConfig
from pipeline.report.result import Published, ReportResult
from pipeline.report.sections.accuracy import published_errors
from pipeline.report.sections.changes import lineage
from pipeline.report.sections.content import PreviousVersion, ReportContent
from pipeline.report.sections.dates import quarter_holds_traffic, traffic_quarters
from pipeline.report.signing import NAMESPACE, Signer, sign
from pipeline.safe_read import parse_json, read_json
from pipeline.settings import SECTIONS
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage
from pipeline.sim.present import curve_sampling_note
from pipeline.whatif import stage as whatif_stage


def code_version() -> dict[str, str | bool | None]:
    """The package version and, in a git checkout, the commit and whether the code that
    renders and decides (pipeline/, assets/, templates/) has uncommitted changes."""
    try:
        version = importlib.metadata.version("enginefit")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    commit, dirty = None, False
    if (INSTALLATION / ".git").exists():
        try:
            commit = _git("rev-parse", "HEAD") or None
            dirty = bool(_git("status", "--porcelain", "--", "pipeline", "assets", "templates"))
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"package_version": version, "git_commit": commit, "git_dirty": dirty}


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(INSTALLATION), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def _relative(path: Path, base: Path) -> str:
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)


# What a version is made from: the files of these results are its ``derived`` outputs (the
# decision record is published in the version itself; the what-if is a function of the same
# inputs as the decision, so a later `enginefit whatif --map ...` must not fail an audit).
STEP = results.Step(
    results.REPORT,
    upstream=(
        results.INGEST_SUMMARY,
        results.SHAPE.reading(
            "summary", "facts", "concurrency", "lengths_svg", "arrivals_svg", "concurrency_svg"
        ),
        results.PREFIX.reading("summary", "curve", "sessions", "curve_svg"),
        results.SCENARIOS.reading("summary", "scenarios"),
        results.CURVES,
        results.SIMULATION_FIGURES.reading(),  # drawn from the two tables above
        # The per-request rows are the result files' own, hashed among the inputs.
        results.LOAD_POINTS.reading("load_points", "read_notes"),
        results.BENCH.reading(
            "points",
            "capacity",
            "fleet",
            "findings",
            "findings_json",
            "analysis",
            "latency_svg",
            "cost_svg",
        ),
        results.LATENCY_FITS.reading("concurrency", "concurrency_json"),
        results.CAPACITY,
        results.DECISION.reading(),
        results.TRIGGERS.reading(),
        results.WHATIF.reading(),
    ),
    sections=SECTIONS,  # a version records the whole configuration
)


def raw_inputs(
    provenance: Provenance,
    settings: ReportConfig,
    tree: ReportTree,
    layout: WorkloadLayout,
    points: pl.DataFrame,
    record: DecisionRecord,
) -> dict[str, str]:
    """sha256 of every file a stage read: the traces (as ingest hashed them), the benchmark
    result files, the files their readers opened beside them (an inference-perf run's
    ``config.yaml`` …) and their manifests, the configuration file, the tokenizer, the allowed
    signers of a signed version, the engine catalog and a previous decision record the user
    named (paths relative to the configuration's folder)."""

    base = provenance.base
    out = {f"trace:{f.file}": f.sha256 for f in read_summary(layout).files}
    # The readers hashed each result file and each companion file as they read it; sidecar
    # manifests are hashed here.
    if {"source_file", "source_sha256"} <= set(points.columns):
        files = points.select("source_file", "source_sha256").drop_nulls().unique()
        for name, digest in files.iter_rows():
            out[f"bench:{_relative(Path(name).resolve(), base)}"] = digest
    if "companion_files" in points.columns:
        for text in points.get_column("companion_files").drop_nulls().unique().to_list():
            for name, digest in parse_json(text, layout.bench.load_points).items():
                out[f"bench:{_relative(Path(name).resolve(), base)}"] = digest
    manifests = [*points.get_column("manifest_file").drop_nulls().unique().to_list()]
    configured = [provenance.bench_manifest] if provenance.bench_manifest else []
    for name in [*manifests, *configured]:
        digest = sha256_of(Path(name))
        if digest is not None:
            out[f"bench:{_relative(Path(name).resolve(), base)}"] = digest
    source = provenance.source
    if source is not None:
        out[f"config:{_relative(source.resolve(), base)}"] = sha256_of(source) or ""
    # The private signing key is read too, but nothing derived from a secret is recorded.
    named = {"tokenizer": provenance.tokenizer}
    named["signers"] = settings.allowed_signers if settings.signing_key else None
    for kind, path in named.items():
        if path is not None:
            out[f"{kind}:{_relative(path.resolve(), base)}"] = sha256_of(path) or ""
    catalog, catalog_sha256 = provenance.catalog, str(record.catalog.get("sha256", ""))
    if catalog is not None:
        out[f"catalog:{_relative(catalog.resolve(), base)}"] = catalog_sha256
    else:  # named inside the installation, so the key is the same wherever enginefit lives
        out[f"{BUNDLED_INPUT}:pipeline/decision/{BUNDLED}"] = catalog_sha256
    # A previous record given by the user; one the decision found among the published versions
    # is theirs to vouch for (their own audit), and not a source of this one.
    published = tree.root.resolve()
    for key, digest in record.inputs.items():
        previous = Path(key.removeprefix("previous:")).resolve()
        if key.startswith("previous:") and not previous.is_relative_to(published):
            out[f"previous:{_relative(previous, base)}"] = digest
    return dict(sorted(out.items()))


def input_roots(
    provenance: Provenance, settings: ReportConfig, layout: WorkloadLayout, inputs: dict[str, str]
) -> list[str]:
    """The places a version's inputs may be (what ``audit`` confines itself to): the
    configuration's folder, the workload folder, the configured traces, benchmark folders
    (a result file's folder: readers open files beside it), sidecar manifest, tokenizer,
    allowed signers and catalog, and a previous decision record the user named."""
    base = provenance.base
    named = [
        *(_fixed_part(Path(trace)) for trace in provenance.traces),
        *(p if p.is_dir() else p.parent for p in map(Path, provenance.bench_results)),
        *([provenance.bench_manifest] if provenance.bench_manifest else []),
        *([provenance.tokenizer] if provenance.tokenizer else []),
        *([settings.allowed_signers] if settings.allowed_signers else []),
        *([provenance.catalog] if provenance.catalog else []),
        *(base / k.partition(":")[2] for k in inputs if k.startswith("previous:")),
    ]
    roots = {base, layout.root.resolve(), *(p.resolve() for p in named)}
    return sorted(str(r) for r in roots)


def derived_outputs(layout: WorkloadLayout) -> dict[str, str]:
    """sha256 of every upstream stage output the document reads (relative to the workload)."""
    return {
        str(p.relative_to(layout.root)): d
        for p in sorted(set(results.fingerprints(STEP, layout)))
        if (d := sha256_of(p)) is not None
    }


@dataclass(frozen=True)
class ReportInputs:
    """What a version is made from, and the document's inputs."""

    document: ReportContent
    identity: str
    manifest: JsonDocument
    compared_with: Entry | None


def read_inputs(
    layout: WorkloadLayout,
    settings: ReportConfig,
    provenance: Provenance,
    filing: Filing,
    policy: BenchPolicy,
    *,
    quarter: str | None = None,
) -> ReportInputs:
    """The upstream results (:data:`STEP`), what the configuration names (``provenance``),
    where versions are filed and the bench section's report date and age limit (``policy``),
    for ``quarter`` (else the filing's)."""
    workload = layout.name
    summary = read_summary(layout)
    quarter = quarter or filing.quarter_for(summary.last_arrival)
    refuse_quarter_without_traffic(quarter, summary, settings, provenance.where)
    record = read_record(layout)
    analysis = bench_stage.read_analysis(layout)
    try:
        prefix: PrefixSummary | None = prefix_stage.read_result(layout).summary
    except InputFormatError:
        prefix = None
    try:
        workload_capacity: CapacityResult | None = capacity_stage.read_result(layout)
    except InputFormatError:
        workload_capacity = None
    # None: `enginefit whatif` (the decision_map asset) has not run; a damaged file is an error.
    whatif = whatif_stage.read_result(layout) if layout.whatif.result.exists() else None
    tree = filing.tree
    tree.reconcile()
    configuration = provenance.configuration
    configuration_sha256 = sha256_bytes(json.dumps(configuration, sort_keys=True).encode())
    code = code_version()
    points = bench_stage.read_written_results(layout).load_points
    inputs = raw_inputs(provenance, settings, tree, layout, points, record)
    derived = derived_outputs(layout)
    identity_parts = {
        "inputs": inputs,
        "derived": derived,
        "configuration": configuration,
        "catalog_sha256": record.catalog.get("sha256"),
        "code": code,
        "quarter": quarter,
    }
    identity = sha256_bytes(json.dumps(identity_parts, sort_keys=True).encode())
    version = _next_number(tree, quarter, identity)
    against = _compared_with(tree, quarter, identity)
    previous = _previous(tree, against)
    dated = record.as_of
    published = _published_as(tree, quarter, identity)
    if published is not None:
        # A re-render of that version: its own record and report date, so the bytes match.
        record = published.record
        stamped = published.manifest.get("report_date")
        dated = stamped if isinstance(stamped, str) and stamped else record.as_of
    report_date = dt.date.fromisoformat(dated) if dated else dates.today()
    configured, configured_by = policy.as_of, policy.as_of_source
    document = ReportContent(
        workload=workload,
        quarter=quarter,
        version=version,
        title=settings.title,
        organisation=settings.organisation,
        record=record,
        ingest=summary,
        shape=shape_stage.read_result(layout).metrics,
        prefix=prefix,
        scenarios=sim_stage.read_summaries(layout),
        capacity=analysis.capacity_rows(),
        findings=analysis.finding_rows(),
        slo=analysis.settings.slo.describe(),
        prices=analysis.settings.prices,
        catalog=load_catalog(provenance.catalog),
        configuration=configuration,
        configuration_sha256=configuration_sha256,
        code=code,
        inputs=lineage(inputs, derived),
        figures=_figures(layout),
        previous=previous,
        workload_capacity=workload_capacity,
        whatif=whatif,
        prediction_history=published_errors(tree.read_ledger(), quarter, version),
        curve_note=_curve_note(layout),
        report_date=report_date,
        report_date_source=f"given by {configured_by}"
        if configured == report_date
        else "the day this version was first published",
        bench_runs=_run_dates(analysis.evaluated),
        max_age_days=policy.max_age_days,
    )
    manifest: JsonDocument = {
        "schema_version": 1,
        "workload": workload,
        "quarter": quarter,
        "version": version,
        "headline": record.recommendation.headline,
        "identity": identity,
        "base": str(provenance.base),
        "workload_folder": str(layout.root.resolve()),
        "inputs": inputs,
        "roots": input_roots(provenance, settings, layout, inputs),
        "signature": _signature(settings),
        "derived": derived,
        "configuration": configuration,
        "configuration_sha256": configuration_sha256,
        "code": code,
        "catalog": record.catalog,
        "compared_with": None if against is None else f"{against.quarter}/v{against.version}",
        "report_date": report_date.isoformat(),
    }
    return ReportInputs(document, identity, manifest, against)


def _fixed_part(path: Path) -> Path:
    """A trace path up to its first pattern (a glob, a daily ``{day}``): what it may match."""
    parts = path.parts
    fixed = next((i for i, part in enumerate(parts) if any(m in part for m in "*?[{")), None)
    return path if fixed is None else Path(*parts[:fixed])


def _signature(settings: ReportConfig) -> dict[str, str] | None:
    """How the version's manifest is signed (None: it is not)."""
    if settings.signing_key is None or settings.allowed_signers is None:
        return None
    return {
        "tool": "ssh-keygen -Y sign",
        "namespace": NAMESPACE,
        "file": SIGNATURE,
        "allowed_signers": str(settings.allowed_signers.resolve()),
    }


def _next_number(tree: ReportTree, quarter: str, identity: str) -> int:
    """The number this run's document carries: the latest version's when nothing changed
    (nothing will be published), else the next one."""
    latest = tree.latest(quarter)
    if latest is not None and latest.identity == identity:
        return latest.version
    return tree.next_version(quarter)


def _compared_with(tree: ReportTree, quarter: str, identity: str) -> Entry | None:
    """What this document compares with: for a new version, the latest one before it; for
    sources identical to the quarter's latest version, what that version compared with (so a
    re-render reproduces it)."""
    latest = tree.latest(quarter)
    if latest is None or latest.identity != identity:
        return tree.compared_with(quarter)
    manifest = tree.read_manifest(latest)
    label = manifest.get("compared_with")
    if not label:
        return None
    q, _, v = str(label).partition("/v")
    return next((e for e in tree.read_ledger() if (e.quarter, str(e.version)) == (q, v)), None)


def refuse_quarter_without_traffic(
    quarter: str, summary: IngestSummary, settings: ReportConfig, where: str
) -> None:
    """A report filed under a quarter the traffic does not reach would describe traffic it does
    not contain: refused unless ``report.allow_other_quarter`` says it is meant (``where``: the
    configuration file, for the error)."""
    span = traffic_quarters(summary)
    if span is None or settings.allow_other_quarter:
        return
    if quarter_holds_traffic(quarter, summary):
        return
    raise ConfigError(
        f"{where}: report.quarter: {quarter} holds none of the traffic ({span}); set "
        "report.quarter to the traffic's quarter (or null: the quarter of its last arrival), or "
        "report.allow_other_quarter: true to file it there anyway"
    )


def _published_as(tree: ReportTree, quarter: str, identity: str) -> PreviousVersion | None:
    """The quarter's latest version when it was made from these very sources (this run
    re-renders it), else None."""
    latest = tree.latest(quarter)
    if latest is None or latest.identity != identity:
        return None
    return _previous(tree, latest)


def _run_dates(points: pl.DataFrame) -> dict[str, dt.date | None]:
    """Each benchmark candidate's oldest run date (None: not recorded)."""
    if points.is_empty() or not {"candidate", "run_date"} <= set(points.columns):
        return {}
    oldest = points.group_by("candidate").agg(pl.col("run_date").min()).sort("candidate")
    return dict(oldest.iter_rows())


def _previous(tree: ReportTree, entry: Entry | None) -> PreviousVersion | None:
    if entry is None:
        return None
    folder = tree.root / entry.path
    manifest = tree.read_manifest(entry)
    record = DecisionRecord.from_json(read_json(folder / RECORD), str(folder / RECORD))
    return PreviousVersion(entry.quarter, entry.version, manifest, record)


def _curve_note(layout: WorkloadLayout) -> str | None:
    """The capacity curves' sampling, when they were sampled (none written: nothing to say)."""
    if not layout.simulation.curves.is_file():
        return None
    return curve_sampling_note(pl.read_parquet(layout.simulation.curves))


def _figures(layout: WorkloadLayout) -> dict[str, bytes]:
    wanted = {
        "arrivals": layout.shape.arrivals_svg,
        "lengths": layout.shape.lengths_svg,
        "concurrency": layout.shape.concurrency_svg,
        "prefix_curve": layout.prefix.curve_svg,
        "hit_ratio": layout.simulation.hit_ratio_svg,
        "imbalance": layout.simulation.imbalance_svg,
        "latency": layout.bench.latency_svg,
        "cost": layout.bench.cost_svg,
        "decision_map": layout.whatif.map_svg,
    }
    return {name: path.read_bytes() for name, path in wanted.items() if path.is_file()}


def run(sources: ReportInputs) -> ReportResult:
    # import here: WeasyPrint is slow to load
    from pipeline.report.present import render_html, render_pdf

    record = sources.document.record
    record_bytes = (
        json.dumps(record.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    ).encode()
    document = build(sources.document).model_dump() | {"colophon": colophon(sources, record_bytes)}
    return ReportResult(
        sources.document.quarter,
        sources.document.version,
        sources.identity,
        sources.manifest,
        record.recommendation.headline,
        render_html(document, standalone=True),
        render_pdf(render_html(document, standalone=False)),
        record_bytes,
    )


def colophon(sources: ReportInputs, record_bytes: bytes) -> list[dict[str, str]]:
    """What ties a printed copy to its ledger entry: the version's identity (the ledger lists
    it), the digests of the configuration file and its parsed form, of the decision record
    published beside the PDF and of the catalog, and the code with its uncommitted-changes
    flag. The manifest's own digest cannot be printed: the manifest records this PDF's."""
    made_from = sources.document
    config_file = next(
        (
            f"{k.removeprefix('config:')} {v}"
            for k, v in made_from.inputs.items()
            if k.startswith("config:")
        ),
        "not recorded",
    )
    code = made_from.code
    commit = code.get("git_commit") or "not a git checkout"
    return [
        {"what": "Version identity (listed in the ledger)", "value": sources.identity},
        {"what": "Configuration file sha256", "value": config_file},
        {"what": "Configuration (as parsed) sha256", "value": made_from.configuration_sha256},
        {"what": f"Decision record ({RECORD}) sha256", "value": sha256_bytes(record_bytes)},
        {"what": "Engine catalog sha256", "value": str(made_from.record.catalog.get("sha256"))},
        {
            "what": "Code",
            "value": f"enginefit {code.get('package_version')}, commit {commit}"
            + (
                ", with uncommitted changes"
                if code.get("git_dirty")
                else ", no uncommitted changes"
            ),
        },
    ]


def unchanged(quarter: str, identity: str, tree: ReportTree) -> Published | None:
    """The quarter's latest version when it was made from exactly these sources, else None."""
    latest = tree.latest(quarter)
    if latest is None or latest.identity != identity:
        return None
    folder = tree.root / latest.path
    return Published(False, quarter, latest.version, folder, folder / PDF)


def publish(sources: ReportInputs, tree: ReportTree, settings: ReportConfig) -> Published:
    """Render and publish a new version in ``tree``, or say which identical version exists
    (without rendering); ``settings`` say whether and how to sign it."""
    return unchanged(sources.document.quarter, sources.identity, tree) or write(
        run(sources), tree, settings
    )


def write(result: ReportResult, tree: ReportTree, settings: ReportConfig) -> Published:
    existing = unchanged(result.quarter, result.identity, tree)
    if existing is not None:
        return existing
    manifest = {**result.manifest, "decision_sha256": sha256_bytes(result.record)}
    key, signers = settings.signing_key, settings.allowed_signers
    signer = None if key is None or signers is None else Signer(key, signers)
    entry, folder = tree.publish(
        result.quarter,
        result.version,
        {PDF: result.pdf, HTML: result.html.encode("utf-8"), RECORD: result.record},
        manifest,
        result.headline,
        None if signer is None else functools.partial(sign, signer),
    )
    return Published(True, result.quarter, entry.version, folder, folder / PDF)
