"""The read model of the store: which runs a reader reads, and how a run is named.

Problem: every report, page and document answers "what does the matrix say now" from the same store.
When each of them selects its runs, folds the parts of a night into one logical run and names a run on
its own, two pages can show two different "latest" runs of one cell, or the same run under two names.

Design: one module owns the three things every reader needs.
- Identity: ``RunInfo`` is a run with its cell's environment (uid, label, cell key, display name, index
  anchor, short sha, start and end); the store's status string becomes a ``RunStatus`` here, at the boundary
  (``RunStatus.read``: a status no writer records reads as ``UNREADABLE``, a finished run judged a failure).
  ``load_runs`` reads every run, oldest first. A result's status text becomes a ``ResultStatus`` where
  results are read (matrix.statuses).
- Logical runs (``group_runs``): the runs of one cell key (a matrix cell id on one GPU) that share a
  non-empty label are one run, whose results are, per key, those of the latest member that recorded it
  (``owners``, ``merge_latest``, ``merge_owned``). A GPU lease is cut into several calls, so one night
  of one cell arrives as several runs.
- Selection (``select_runs``): one function, a ``Selection`` (uids, labels, cells, a run spec) and a
  ``Pick`` that says what comes back: every matching run, every logical run, the latest finished
  logical run of every cell key (what the regressions, the compatibility table, the dashboards and the
  documents show by default), the newest run of every cell key (``summary``'s lines) or the matching
  runs merged per cell key. Readers call it through this module, never by their own query.
- History (``streak_start``): the first run of the unbroken streak that ends at a run, for the "failing
  since" of a broken cell; the caller says what broken means.

Invariants: read-only; ``group_runs`` keeps the order of the cell's history (``RunInfo.order``), is
idempotent and leaves a plain run unchanged; member pks are disjoint across logical runs; every pick
returns runs in history order; no reader of the store builds its own list of runs.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NewType, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix.store.models import Cell, Run, RunStatus
from matrix.text import slug

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

CellKey = NewType("CellKey", str)
SPEC_PREFIX = 4  # the shortest uid prefix a run spec may be


def cell_key(cell_id: str, gpu_name: str | None) -> CellKey:
    """Runs whose figures may be compared: the same matrix cell id on the same GPU."""
    return CellKey(f"{cell_id}@{gpu_name or 'no-gpu'}")


def cell_anchor(key: CellKey) -> str:
    """The id of the cell key's row on the dashboard's index (``site/index.html#<anchor>``)."""
    return "cell-" + slug(key)


@dataclass(frozen=True)
class RunInfo:
    """One run (or logical run) and the environment of its cell, as every reader needs them.

    A logical run (``group_runs``) lists its members' pks and uids, oldest first, in ``members`` and
    ``member_uids``; ``pk``, ``uid``, host, sha and message are those of its latest member, ``started_at``
    that of its first. A plain run has no members."""

    pk: int
    uid: str
    cell_id: str
    cell_key: CellKey
    kind: str
    torch_version: str | None
    triton_version: str | None
    cuda_runtime: str | None
    gpu_name: str | None
    started_at: dt.datetime
    status: RunStatus
    label: str | None = None
    git_sha: str | None = None
    host: str | None = None
    message: str | None = None
    members: tuple[int, ...] = ()  # pks of the runs of a logical run, oldest first; () for a plain run
    member_uids: tuple[str, ...] = ()
    finished_at: dt.datetime | None = None

    @property
    def pks(self) -> tuple[int, ...]:
        """The pks of the runs whose results this run holds, oldest first."""
        return self.members or (self.pk,)

    @property
    def uids(self) -> tuple[str, ...]:
        return self.member_uids or (self.uid,)

    @property
    def order(self) -> tuple[dt.datetime, int]:
        """Position in the history of its cell key (a logical run sits where its first member started)."""
        return (self.started_at, self.pks[0])

    @property
    def finished(self) -> bool:
        return self.status != RunStatus.RUNNING  # also for a status given as its string

    @property
    def short_uid(self) -> str:
        return self.uid[:8]

    @property
    def display_name(self) -> str:
        """The cell as pages name it, unique per cell key: one id may run on several machines."""
        return f"{self.cell_id} ({self.gpu_name or 'no GPU'})"

    @property
    def anchor(self) -> str:
        return cell_anchor(self.cell_key)

    @property
    def short_sha(self) -> str:
        """The code the run ran (the commit, ``-dirty`` kept), shortened; "" when unknown."""
        sha = self.git_sha or ""
        dirty = sha.endswith("-dirty")
        return sha[:9] + ("-dirty" if dirty else "") if sha else ""

    @property
    def stack(self) -> str:
        torch, triton, cuda = self.torch_version or "-", self.triton_version or "-", self.cuda_runtime or "-"
        return f"torch {torch} / triton {triton} / CUDA {cuda}"

    @property
    def duration_s(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


def aware(value: dt.datetime | None) -> dt.datetime:
    """SQLite hands back naive datetimes; the store writes UTC, so say so."""
    if value is None:
        return dt.datetime.fromtimestamp(0, dt.timezone.utc)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def load_runs(session: Session) -> list[RunInfo]:
    """Every run with its cell, oldest first (the input of ``select_runs``)."""
    stmt = (
        select(
            Run.id,
            Run.uid,
            Run.started_at,
            Run.finished_at,
            Run.status,
            Run.label,
            Run.git_sha,
            Run.host,
            Run.message,
            Cell.cell_id,
            Cell.kind,
            Cell.torch_version,
            Cell.triton_version,
            Cell.cuda_runtime,
            Cell.gpu_name,
        )
        .join(Cell, Run.cell_pk == Cell.id)
        .order_by(Run.started_at, Run.id)
    )
    return [
        RunInfo(
            pk=row.id,
            uid=row.uid,
            cell_id=row.cell_id,
            cell_key=cell_key(row.cell_id, row.gpu_name),
            kind=row.kind,
            torch_version=row.torch_version,
            triton_version=row.triton_version,
            cuda_runtime=row.cuda_runtime,
            gpu_name=row.gpu_name,
            started_at=aware(row.started_at),
            status=RunStatus.read(row.status),
            label=row.label,
            git_sha=row.git_sha,
            host=row.host,
            message=row.message,
            finished_at=None if row.finished_at is None else aware(row.finished_at),
        )
        for row in session.execute(stmt)
    ]


# -- logical runs ---------------------------------------------------------------------------------------


def _merged_status(members: Sequence[RunInfo]) -> RunStatus:
    """Running while any member runs, else complete when any member completed, else the latest's."""
    statuses = {m.status for m in members}
    for wanted in (RunStatus.RUNNING, RunStatus.COMPLETE):
        if wanted in statuses:
            return wanted
    return members[-1].status


def merge_runs(parts: Sequence[RunInfo]) -> RunInfo:
    """``parts`` (of one cell key) as one logical run, see ``RunInfo``."""
    parts = sorted(parts, key=lambda r: r.order)
    if len(parts) == 1:
        return parts[0]
    first, last = parts[0], parts[-1]
    return replace(
        last,
        started_at=first.started_at,
        status=_merged_status(parts),
        members=tuple(pk for p in parts for pk in p.pks),
        member_uids=tuple(uid for p in parts for uid in p.uids),
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
    logical = single + [merge_runs(parts) for parts in groups.values()]
    return sorted(logical, key=lambda r: r.order)


def owners(run: RunInfo, keys: Mapping[int, Iterable[K]]) -> dict[K, int]:
    """Which member owns each key: the latest member of ``run`` that recorded it (``keys`` per run pk)."""
    return owners_of(run.pks, keys)


def owners_of(pks: Sequence[int], keys: Mapping[int, Iterable[K]]) -> dict[K, int]:
    """Per key, the last of ``pks`` (runs oldest first) whose ``keys`` hold it."""
    owner: dict[K, int] = {}
    for pk in pks:  # oldest first, so the latest wins
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


# -- selection ------------------------------------------------------------------------------------------


class Pick(enum.Enum):
    """What ``select_runs`` returns of the runs that match a ``Selection``, always in history order."""

    EVERY = "every"  # every matching run as stored
    LOGICAL = "logical"  # every matching logical run
    LATEST = "latest"  # the latest finished logical run of every cell key
    NEWEST = "newest"  # the newest run of every cell key as stored, finished or not
    MERGED = "merged"  # every matching run, merged into one logical run per cell key


@dataclass(frozen=True)
class Selection:
    """Which runs a reader reads: all filters given apply; ``spec`` (a run uid, a uid prefix of 4+
    characters or a label) names the logical runs that hold it (see ``match_spec``)."""

    uids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    cells: tuple[str, ...] = ()
    spec: str | None = None
    pick: Pick = Pick.LATEST


def match_spec(runs: Sequence[RunInfo], spec: str) -> list[RunInfo]:
    """The (logical) runs ``spec`` names: one with a member of that uid, else those with that label, else
    those with a member whose uid starts with it (4+ characters)."""
    exact = [r for r in runs if spec in r.uids]
    if exact:
        return exact
    labelled = [r for r in runs if r.label == spec]
    if labelled:
        return labelled
    if len(spec) >= SPEC_PREFIX:
        return [r for r in runs if any(uid.startswith(spec) for uid in r.uids)]
    return []


def _latest_per_key(runs: Iterable[RunInfo], finished_only: bool) -> list[RunInfo]:
    latest: dict[CellKey, RunInfo] = {}
    for run in runs:  # oldest first, so the last one wins
        if run.finished or not finished_only:
            latest[run.cell_key] = run
    return sorted(latest.values(), key=lambda r: r.order)


def select_runs(runs: Sequence[RunInfo], selection: Selection) -> list[RunInfo]:
    """The runs of ``runs`` (as ``load_runs`` returns them, or logical runs) that ``selection`` picks;
    [] when none matches (the reader says what to do about it)."""
    pool = [
        r
        for r in runs
        if (not selection.cells or r.cell_id in selection.cells)
        and (not selection.labels or r.label in selection.labels)
        and (not selection.uids or any(uid in selection.uids for uid in r.uids))
    ]
    pick = selection.pick
    if pick in (Pick.LOGICAL, Pick.LATEST):
        pool = group_runs(pool)
    if selection.spec is not None:
        pool = match_spec(pool, selection.spec)
    if pick is Pick.LATEST:
        return _latest_per_key(pool, finished_only=True)
    if pick is Pick.NEWEST:
        return _latest_per_key(pool, finished_only=False)
    if pick is Pick.MERGED:
        groups: dict[CellKey, list[RunInfo]] = defaultdict(list)
        for run in pool:
            groups[run.cell_key].append(run)
        return sorted((merge_runs(parts) for parts in groups.values()), key=lambda r: r.order)
    return pool


def streak_start(runs: Sequence[RunInfo], run: RunInfo, broken: Callable[[RunInfo], bool]) -> RunInfo:
    """The earliest run of the streak of consecutive ``broken`` finished runs of ``run``'s cell key that
    ends at ``run`` (``run`` itself when the one before it was not broken). ``run`` is taken as broken;
    ``runs`` are in history order (logical runs when ``run`` is one); runs still running are passed over."""
    earlier = [r for r in runs if r.cell_key == run.cell_key and r.finished and r.order < run.order]
    start = run
    for previous in reversed(earlier):
        if not broken(previous):
            break
        start = previous
    return start
