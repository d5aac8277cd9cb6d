"""Regression report: the three detectors applied to chosen runs, each against its baseline.

Problem: "what broke last night" needs, per cell, the run to judge, the run to compare it with, and one
list of regressions with their evidence, whichever detector found them, marked new or ongoing so that a
nightly job fails once per new regression and not forever.

Design: everything here works on logical runs (``matrix.readmodel.group_runs``): the runs of one cell
key that share a non-empty label are one run, whose results are, per key, those of the latest of them
that recorded the key; a run without a label is its own logical run. ``select_runs`` picks the logical
runs through the read model's selector (default: the latest finished one of every cell key; ``--run``
may name a label, a uid or uid prefix of any member) and ``pick_baseline`` their baselines (default: the
previous complete logical run of the same cell key, i.e. the same matrix cell on the same GPU: the previous
label's runs, or the previous unlabelled run). ``detect`` then runs, per logical run:
- status against expected (``status``), also on the baseline; a failing key that already failed in the
  baseline is ongoing, otherwise new;
- pairwise performance against the baseline (``pairwise``); always new (it is relative to the baseline);
- step detection over the cell key's history up to the run (``history``); new when the run confirmed it,
  unless the jump already passed the pairwise band on the step's own night (see Note [One alert per
  change]).
A broken run (a status finding in ``fail_on``) carries ``failing_since``: the first run of its cell key's
streak of broken runs (Note: [Failing since]).

Invariant: this module reads through ``loader`` only and never writes to the store.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.readmodel import RunInfo
from matrix.regressions import history, loader, logical, pairwise, status
from matrix.regressions.errors import RegressionsError
from matrix.regressions.observations import RUN_SUBJECT, ResultKey, Suite, natural_key
from matrix.regressions.thresholds import ReproSettings, Thresholds
from matrix.store.models import RunStatus

REPORT_FORMAT = 1
_K_IDENT = re.compile(r"^[\w:+\-.\[\]/]+$")  # what pytest -k accepts as one identifier
_K_TOKEN = re.compile(r"[A-Za-z0-9_.\-]+")


class Kind(str, enum.Enum):
    STATUS = "status"
    PERFORMANCE = "performance"
    HISTORY = "history"


@dataclass(frozen=True)
class Regression:
    kind: Kind
    cell_id: str
    run_uid: str
    baseline_uid: str | None
    key: ResultKey
    new: bool
    summary: str
    repro: str
    nodeid: str = ""
    message: str = ""
    finding: status.StatusFinding | None = None
    comparison: pairwise.PairwiseResult | None = None
    step: history.Step | None = None
    step_run_uid: str | None = None  # the first run after the step


@dataclass(frozen=True)
class CellReport:
    run: RunInfo
    baseline: RunInfo | None
    findings: tuple[status.StatusFinding, ...]
    comparison: pairwise.PairwiseReport | None
    regressions: tuple[Regression, ...]
    improvements: tuple[str, ...] = ()
    failing_since: RunInfo | None = None  # a broken run: the first of its cell key's broken streak

    @property
    def broken(self) -> bool:
        """Whether the run has a status finding in ``fail_on`` (``broken.broken_cells`` lists it)."""
        return self.failing_since is not None


@dataclass(frozen=True)
class RegressionReport:
    cells: tuple[CellReport, ...]

    @property
    def regressions(self) -> list[Regression]:
        return [r for c in self.cells for r in c.regressions]

    @property
    def new_regressions(self) -> list[Regression]:
        return [r for r in self.regressions if r.new]


def test_selector(nodeid: str, key: ResultKey) -> str:
    """A pytest ``-k`` expression that selects the test behind a result."""
    name = nodeid.rsplit("::", 1)[-1] if nodeid else ""
    if name and _K_IDENT.match(name) and name not in {"and", "or", "not"}:
        return name
    tokens = (
        _K_TOKEN.findall(name) if name else [*_K_TOKEN.findall(key.workload), *_K_TOKEN.findall(key.mode)]
    )
    tokens = [t for t in tokens if t not in {"and", "or", "not"}]
    return " and ".join(tokens) if tokens else key.workload


def repro_command(settings: ReproSettings, cell_id: str, nodeid: str, key: ResultKey) -> str:
    session = shlex.quote(settings.session.format(cell=cell_id))
    if key.workload == RUN_SUBJECT and not nodeid:  # how the run ended: the whole cell again
        return settings.whole_run.format(session=session)
    return settings.command.format(session=session, test=shlex.quote(test_selector(nodeid, key)))


def select_runs(runs: Sequence[RunInfo], spec: str | None = None) -> list[RunInfo]:
    """Logical runs to judge (``readmodel.select_runs``): ``spec`` (a run uid or uid prefix of 4+
    characters, naming the logical run that holds it, or a label: its logical run in every cell), or by
    default the latest finished logical run of every cell key, in natural order of cell ids. ``runs`` are
    logical runs in history order (``readmodel.group_runs``)."""
    if spec is not None:
        chosen = readmodel.select_runs(runs, readmodel.Selection(spec=spec, pick=readmodel.Pick.LOGICAL))
        if not chosen:
            labels = sorted({r.label for r in runs if r.label})[-5:]
            raise RegressionsError(
                f"no run matches {spec!r}; give a run uid, a uid prefix or a label"
                + (
                    f" (recent labels: {', '.join(labels)})"
                    if labels
                    else " (the store has no labelled runs)"
                )
            )
        return chosen
    latest = readmodel.select_runs(runs, readmodel.Selection(pick=readmodel.Pick.LATEST))
    return sorted(latest, key=lambda r: (natural_key(r.cell_id), r.gpu_name or ""))


def pick_baseline(runs: Sequence[RunInfo], run: RunInfo, spec: str | None = None) -> RunInfo | None:
    """The logical run to compare ``run`` with: from ``spec`` (same cell key preferred; a spec naming
    exactly one logical run is used even across cells), else the latest complete logical run of the same
    cell key before it in history (``RunInfo.order``)."""
    if spec is not None:
        candidates = [r for r in readmodel.match_spec(runs, spec) if r.uid != run.uid]
        if not candidates:
            raise RegressionsError(f"no baseline run matches {spec!r} (other than the run being judged)")
        same = [r for r in candidates if r.cell_key == run.cell_key]
        if same:
            return same[-1]
        return candidates[0] if len(candidates) == 1 else None
    earlier = [
        r
        for r in runs
        if r.cell_key == run.cell_key
        and r.uid != run.uid
        and r.status == RunStatus.COMPLETE.value
        and r.order < run.order
    ]
    return earlier[-1] if earlier else None


@dataclass
class _Context:
    session: Session
    runs: list[RunInfo]
    thresholds: Thresholds
    expectations: list[status.Expectation]
    medians: dict[int, dict[pairwise.PerfKey, float]] = field(default_factory=dict)


def _history_regressions(ctx: _Context, run: RunInfo, baseline: RunInfo | None) -> list[Regression]:
    series_runs = [r for r in ctx.runs if r.cell_key == run.cell_key and r.order <= run.order]
    series_runs = series_runs[-(ctx.thresholds.history.window + 1) :]
    if run.pk not in ctx.medians:
        return []
    found: list[Regression] = []
    for perf_key, _latest in sorted(ctx.medians[run.pk].items()):
        points = [(r, ctx.medians.get(r.pk, {}).get(perf_key)) for r in series_runs]
        kept = [(r, v) for r, v in points if v is not None]
        values = [v for _, v in kept]
        for step in history.new_steps(values, ctx.thresholds.history):
            if not step.slower:
                continue
            offset = max(len(values) - ctx.thresholds.history.window, 0)
            at = offset + step.index
            step_run = kept[at][0]
            key = ResultKey(Suite.PERFORMANCE, *perf_key)
            # Note [One alert per change]: a jump that already passed the pairwise band on the step's own
            # night was flagged then (pairwise, against that night's baseline); the confirmed step is then
            # reported as ongoing, so a nightly job fails once per change, not twice.
            band = ctx.thresholds.pairwise.ratio_for(*perf_key)
            sudden = at > 0 and values[at] / values[at - 1] > 1.0 + band
            seen = f"; first flagged pairwise on {step_run.started_at:%Y-%m-%d}" if sudden else ""
            found.append(
                Regression(
                    kind=Kind.HISTORY,
                    cell_id=run.cell_id,
                    run_uid=run.uid,
                    baseline_uid=baseline.uid if baseline else None,
                    key=key,
                    new=not sudden,
                    summary=f"step x{step.ratio:.3f} ({step.before_ms:.4g} -> {step.after_ms:.4g} ms) "
                    f"from run {step_run.short_uid}, p={step.p_value:.2g}{seen}",
                    repro=repro_command(ctx.thresholds.repro, run.cell_id, "", key),
                    step=step,
                    step_run_uid=step_run.uid,
                )
            )
    return found


def _judge_cell(ctx: _Context, run: RunInfo, baseline: RunInfo | None) -> CellReport:
    pks = [*run.pks, *(baseline.pks if baseline else ())]
    per_pk = loader.load_observations(ctx.session, pks)
    run_obs = readmodel.merge_latest(run, per_pk, lambda o: o.key)
    base_obs = readmodel.merge_latest(baseline, per_pk, lambda o: o.key) if baseline else []
    base_keys = {o.key for o in base_obs}
    findings = status.judge_run(run.cell_id, run_obs, ctx.expectations, base_keys)
    fail_on = ctx.thresholds.status.fail_on
    known_failing: set[ResultKey] = set()
    if baseline is not None:
        base_findings = status.judge_run(baseline.cell_id, base_obs, ctx.expectations)
        known_failing = {f.key for f in status.failing(base_findings, fail_on)}
    regressions: list[Regression] = []
    for f in status.failing(findings, fail_on):
        expected = f"expected {f.expected}" + (" (expected.toml)" if f.explicit else "")
        regressions.append(
            Regression(
                kind=Kind.STATUS,
                cell_id=run.cell_id,
                run_uid=run.uid,
                baseline_uid=baseline.uid if baseline else None,
                key=f.key,
                new=f.key not in known_failing,
                summary=f"{f.verdict.value}: {f.actual or 'no result'}, {expected}",
                repro=repro_command(ctx.thresholds.repro, run.cell_id, f.nodeid, f.key),
                nodeid=f.nodeid,
                message=f.message,
                finding=f,
            )
        )
    comparison = None
    if baseline is not None:
        samples = loader.load_perf_samples(ctx.session, pks)
        keys = logical.perf_keys(per_pk)
        comparison = pairwise.compare_runs(
            readmodel.merge_owned(readmodel.owners(baseline, keys), samples),
            readmodel.merge_owned(readmodel.owners(run, keys), samples),
            ctx.thresholds.pairwise,
        )
        for c in comparison.regressions:
            key = ResultKey(Suite.PERFORMANCE, c.workload, c.mode)
            note = " (workload code changed)" if c.code_changed else ""
            regressions.append(
                Regression(
                    kind=Kind.PERFORMANCE,
                    cell_id=run.cell_id,
                    run_uid=run.uid,
                    baseline_uid=baseline.uid,
                    key=key,
                    new=True,
                    summary=f"x{c.ratio:.3f} ({c.baseline_median_ms:.4g} -> {c.new_median_ms:.4g} ms), "
                    f"p={c.p_value:.2g}{note}",
                    repro=repro_command(ctx.thresholds.repro, run.cell_id, c.nodeid, key),
                    nodeid=c.nodeid,
                    comparison=c,
                )
            )
    regressions.extend(_history_regressions(ctx, run, baseline))
    improved = tuple(f.key.label() for f in findings if f.verdict is status.Verdict.IMPROVED)
    return CellReport(run, baseline, tuple(findings), comparison, tuple(regressions), improved)


def detect(
    session: Session,
    thresholds: Thresholds,
    run_spec: str | None = None,
    baseline_spec: str | None = None,
    runs: list[RunInfo] | None = None,
    medians: dict[int, dict[pairwise.PerfKey, float]] | None = None,
    expectations: Sequence[status.Expectation] | None = None,
) -> RegressionReport:
    """Judge the selected logical runs (see ``select_runs``) against their baselines (see
    ``pick_baseline``). ``runs`` (physical or logical: they are grouped) and ``medians`` (merged per
    logical run, ``logical.merge_medians``) may be passed when the caller already loaded them (the
    dashboards do); ``expectations`` judge instead of those in the store (a reader that must not write
    expected.toml into it)."""
    all_runs = readmodel.group_runs(runs if runs is not None else readmodel.load_runs(session))
    chosen = select_runs(all_runs, run_spec)
    keys = {r.cell_key for r in chosen}
    if medians is None:
        medians = logical.load_medians(session, [r for r in all_runs if r.cell_key in keys])
    ctx = _Context(
        session=session,
        runs=all_runs,
        thresholds=thresholds,
        expectations=list(expectations) if expectations is not None else loader.load_expectations(session),
        medians=medians,
    )
    cells = [_judge_cell(ctx, run, pick_baseline(all_runs, run, baseline_spec)) for run in chosen]
    return RegressionReport(tuple(_with_streak(ctx, cell) for cell in cells))


def _broken(ctx: _Context, run: RunInfo) -> bool:
    """Whether ``run``, judged against its default baseline, has a status finding in ``fail_on``."""
    baseline = pick_baseline(ctx.runs, run)
    per_pk = loader.load_observations(ctx.session, [*run.pks, *(baseline.pks if baseline else ())])
    observations = readmodel.merge_latest(run, per_pk, lambda o: o.key)
    base_keys = (
        {o.key for o in readmodel.merge_latest(baseline, per_pk, lambda o: o.key)} if baseline else set()
    )
    findings = status.judge_run(run.cell_id, observations, ctx.expectations, base_keys)
    return bool(status.failing(findings, ctx.thresholds.status.fail_on))


def _with_streak(ctx: _Context, cell: CellReport) -> CellReport:
    """``cell`` with its ``failing_since`` when broken: the earliest run of the consecutive broken runs of
    its cell key that ends at it (Note: [Failing since])."""
    if not status.failing(cell.findings, ctx.thresholds.status.fail_on):
        return cell
    # Note: [Failing since]
    # A broken cell says since when it is broken, so a person can find the change that broke it: walk its
    # cell key's finished runs back from the judged one while they are broken too, each judged as
    # ``detect`` would have judged it then (against its own default baseline). The walk stops at the
    # first run that was not broken, so a long-broken cell costs as many judgements as its streak.
    since = readmodel.streak_start(ctx.runs, cell.run, lambda r: _broken(ctx, r))
    return replace(cell, failing_since=since)


def _key_json(key: ResultKey) -> dict[str, str]:
    return {"suite": key.suite.value, "workload": key.workload, "mode": key.mode}


def regression_to_json(r: Regression) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": r.kind.value,
        "cell": r.cell_id,
        "run": r.run_uid,
        "baseline": r.baseline_uid,
        **_key_json(r.key),
        "new": r.new,
        "summary": r.summary,
        "repro": r.repro,
        "nodeid": r.nodeid,
        "message": r.message,
    }
    if r.finding is not None:
        data.update(verdict=r.finding.verdict.value, actual=r.finding.actual, expected=r.finding.expected)
    if r.comparison is not None:
        c = r.comparison
        data.update(
            baseline_median_ms=c.baseline_median_ms,
            new_median_ms=c.new_median_ms,
            ratio=c.ratio,
            p_value=c.p_value,
            samples=[c.n_baseline, c.n_new],
            band=c.band,
            code_changed=c.code_changed,
        )
    if r.step is not None:
        data.update(
            before_ms=r.step.before_ms,
            after_ms=r.step.after_ms,
            ratio=r.step.ratio,
            p_value=r.step.p_value,
            step_run=r.step_run_uid,
        )
    return data


def report_to_json(report: RegressionReport) -> dict[str, Any]:
    cells = []
    for c in report.cells:
        verdicts: dict[str, int] = defaultdict(int)
        for f in c.findings:
            verdicts[f.verdict.value] += 1
        cells.append(
            {
                "cell": c.run.cell_id,
                "gpu": c.run.gpu_name,
                "run": c.run.uid,
                "runs": list(c.run.uids),
                "label": c.run.label,
                "baseline": c.baseline.uid if c.baseline else None,
                "baseline_runs": list(c.baseline.uids) if c.baseline else [],
                "verdicts": dict(sorted(verdicts.items())),
                "improved": list(c.improvements),
                "aggregates": [
                    {"mode": a.mode, "geomean_ratio": a.geomean_ratio, "workloads": a.workloads}
                    for a in (c.comparison.aggregates if c.comparison else ())
                ],
                "regressions": [regression_to_json(r) for r in c.regressions],
            }
        )
    return {
        "format": REPORT_FORMAT,
        "new_regressions": len(report.new_regressions),
        "regressions": len(report.regressions),
        "cells": cells,
    }
