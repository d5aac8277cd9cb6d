"""Logical runs' figures: the medians and outcome counts of runs whose parts share a label.

Problem: a GPU lease is cut into several calls, so one cell's results for one night arrive as several
runs sharing one label: one run records some workloads, the next the others, a third re-runs a few after
a fix. Judged one by one, everything absent from the latest part is MISSING and the part before it
becomes its baseline, so one night reads as dozens of new regressions.

Design: ``matrix.readmodel.group_runs`` folds such runs into one logical ``RunInfo`` and owns the merge
rule (``owners``, ``merge_latest``, ``merge_owned``): per key (suite, workload and mode; PI subject and
stage; a pytest outcome's record key) the latest member that recorded a key owns it, and everything the
key has in the logical run (status, message, samples, median) comes from that member alone, so a
re-run's newer status wins even when the earlier one passed and its samples are not mixed with older
ones. This module applies that rule to what the loader reads per physical run: performance keys,
medians (``merge_medians``, ``load_medians``) and pytest outcome counts (``outcome_counts``).

Invariants: read-only; a plain run's figures come back unchanged; a logical run's figures are keyed by
its pk (that of its latest member).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from sqlalchemy.orm import Session

from matrix.readmodel import RunInfo, merge_owned, owners
from matrix.regressions import loader
from matrix.regressions.observations import Observation, Suite
from matrix.regressions.pairwise import PerfKey


def perf_keys(observations: Mapping[int, Sequence[Observation]]) -> dict[int, list[PerfKey]]:
    """The performance workload x mode keys among observations per run pk (every status: for
    ``owners``)."""
    return {
        pk: [(o.key.workload, o.key.mode) for o in found if o.key.suite is Suite.PERFORMANCE]
        for pk, found in observations.items()
    }


def merge_medians(
    session: Session, runs: Sequence[RunInfo], medians: Mapping[int, Mapping[PerfKey, float]]
) -> dict[int, dict[PerfKey, float]]:
    """Median latencies of each logical run, keyed by its pk, from ``medians`` per physical run pk
    (``loader.load_perf_medians``). The members' performance keys are read only for runs with several."""
    multi = [r for r in runs if len(r.pks) > 1]
    keys = loader.load_perf_keys(session, {pk for r in multi for pk in r.pks}) if multi else {}
    merged: dict[int, dict[PerfKey, float]] = {}
    for run in runs:
        if len(run.pks) == 1:
            if run.pk in medians:
                merged[run.pk] = dict(medians[run.pk])
            continue
        merged[run.pk] = merge_owned(owners(run, keys), medians)
    return merged


def load_medians(session: Session, runs: Sequence[RunInfo]) -> dict[int, dict[PerfKey, float]]:
    physical = loader.load_perf_medians(session, {pk for r in runs for pk in r.pks})
    return merge_medians(session, runs, physical)


def outcome_counts(session: Session, runs: Sequence[RunInfo]) -> dict[int, Counter[str]]:
    """pytest outcomes counted per logical run (a test re-run by a later member counts once, as re-run)."""
    per_pk = loader.load_outcomes(session, {pk for r in runs for pk in r.pks})
    counts: dict[int, Counter[str]] = {}
    for run in runs:
        owner = owners(run, per_pk)
        counts[run.pk] = Counter(per_pk[pk][record] for record, pk in owner.items())
    return counts
