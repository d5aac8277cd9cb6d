"""Logical runs: the runs of one cell that share a label are judged, shown and compared as one run.

Problem: a GPU lease is cut into several calls, so one cell's results for one night arrive as several
runs sharing one label: one run records some workloads, the next the others, a third re-runs a few after
a fix. Judged one by one, everything absent from the latest part is MISSING and the part before it
becomes its baseline, so one night reads as dozens of new regressions.

Design: ``group_runs`` folds the runs of one cell key (same matrix cell id on the same GPU, as history
grouping does) that share a non-empty label into one ``RunInfo`` whose ``members`` are the runs' pks,
oldest first. A run without a label stays its own logical run. The logical run carries the uid, pk, host,
git sha and message of its latest member (its merged data is keyed by that pk), and the start of its
first member (its place in the cell's history, see ``RunInfo.order``). Its status: running while any
member runs, else complete when any member completed, else its latest member's status.

Results merge per key (suite, workload and mode; PI subject and stage; a pytest outcome's record key):
the latest member that recorded a key owns it, and everything the key has in the logical run (status,
message, samples, median) comes from that member alone, so a re-run's newer status wins even when the
earlier one passed and its samples are not mixed with older ones. ``merge_latest`` does this for lists of
rows, ``merge_owned`` for values that exist only for some statuses (samples and medians of successful
results), given the owners computed from every status.

Invariants: ``group_runs`` keeps the order of the cell's history (``RunInfo.order``) and is idempotent;
a plain run comes back unchanged, so unlabelled runs behave exactly as before; member pks are disjoint
across logical runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from sqlalchemy.orm import Session

from matrix.regressions import loader
from matrix.regressions.observations import CellKey, Observation, RunInfo, Suite
from matrix.regressions.pairwise import PerfKey
from matrix.store.models import RunStatus

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _status(members: Sequence[RunInfo]) -> str:
    statuses = [m.status for m in members]
    if RunStatus.RUNNING.value in statuses:
        return RunStatus.RUNNING.value
    if RunStatus.COMPLETE.value in statuses:
        return RunStatus.COMPLETE.value
    return members[-1].status


def _fold(parts: Sequence[RunInfo]) -> RunInfo:
    if len(parts) == 1:
        return parts[0]
    parts = sorted(parts, key=lambda r: r.order)
    pks = tuple(pk for p in parts for pk in p.pks)
    uids = tuple(uid for p in parts for uid in p.uids)
    first, last = parts[0], parts[-1]
    return replace(
        last,
        started_at=first.started_at,
        status=_status(parts),
        members=pks,
        member_uids=uids,
    )


def group_runs(runs: Iterable[RunInfo]) -> list[RunInfo]:
    """Logical runs of ``runs``: those of one cell key with the same non-empty label become one; sorted
    by their place in history (``RunInfo.order``)."""
    groups: dict[tuple[CellKey, str], list[RunInfo]] = defaultdict(list)
    single: list[RunInfo] = []
    for run in runs:
        if run.label:
            groups[(run.cell_key, run.label)].append(run)
        else:
            single.append(run)
    logical = single + [_fold(parts) for parts in groups.values()]
    return sorted(logical, key=lambda r: r.order)


def owners(run: RunInfo, keys: Mapping[int, Iterable[K]]) -> dict[K, int]:
    """Which member owns each key: the latest member of ``run`` that recorded it (``keys`` per run pk)."""
    owner: dict[K, int] = {}
    for pk in run.pks:  # oldest first, so the latest member wins
        for key in keys.get(pk, ()):
            owner[key] = pk
    return owner


def merge_latest(run: RunInfo, rows: Mapping[int, Sequence[T]], key: Callable[[T], K]) -> list[T]:
    """The rows of ``run``'s members (``rows`` per run pk) whose key its latest member recording that
    key owns; every row of the owner is kept (a run may record one key more than once)."""
    owner = owners(run, {pk: [key(r) for r in rows.get(pk, ())] for pk in run.pks})
    return [r for pk in run.pks for r in rows.get(pk, ()) if owner[key(r)] == pk]


def merge_owned(owner: Mapping[K, int], values: Mapping[int, Mapping[K, V]]) -> dict[K, V]:
    """The value of every owned key taken from its owner (keys the owner has no value for are left out:
    a failed re-run leaves no samples, and older samples must not stand in for it)."""
    merged: dict[K, V] = {}
    for key, pk in owner.items():
        found = values.get(pk, {})
        if key in found:
            merged[key] = found[key]
    return merged


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
