"""Export, ingest and merge: moving runs between stores as versioned JSON lines.

Problem: results are produced on many machines (a GPU lease, CI runners, laptops) and must end up in
one history: GPU results are committed under ``results/`` as files, nightly runners upload their stores,
and the dashboards read one store. Integer primary keys mean nothing across stores, files may be
ingested twice, and a half-ingested file would leave a history that lies.

Design: an export is JSON lines. The first line is a header (``format``, ``version``, the schema
revision it came from); then, per run, one ``run`` line carrying the run's fields and its cell's full
fingerprint, followed by one line per result row naming its table and its fields. Rows refer to runs
by ``uid`` and to workloads by (name, code hash), never by integer ids; every value is a named field.
Ingest reads such lines inside one transaction of the caller: a run already present is matched by uid
(and finished if the incoming copy finished it), a row already present by (run, record_key) is skipped.
Merge is ingest fed directly from other stores' exports, all in one transaction.

Invariants:
- Ingesting the same export twice changes nothing the second time (idempotent).
- A reader refuses a ``version`` newer than ``EXPORT_VERSION`` with a hint to upgrade; a malformed line
  raises ``TransferError`` naming the line, and the caller's transaction rolls back everything.
- Export then ingest into an empty store reproduces every row, field for field (except integer ids).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from sqlalchemy import DateTime, select
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from matrix.errors import TransferError
from matrix.store.access import get_or_create_workload, insert_or_reread
from matrix.store.db import SCHEMA_VERSION, display_url, open_store
from matrix.store.models import (
    RESULT_TABLES,
    Base,
    Cell,
    CorrectnessResult,
    Diagnostic,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    TestOutcome,
    Workload,
    utcnow,
)

logger = logging.getLogger(__name__)

EXPORT_FORMAT = "grace-matrix-export"
EXPORT_VERSION = 1

ResultModel = (
    type[TestOutcome]
    | type[CorrectnessResult]
    | type[PerformanceResult]
    | type[PIStageResult]
    | type[Diagnostic]
)
_TABLES: dict[str, ResultModel] = {model.__tablename__: model for model in RESULT_TABLES}
_LINKS = {"id", "run_pk", "cell_pk", "workload_pk"}  # integer links, replaced by named references


@dataclasses.dataclass(frozen=True)
class RunFilter:
    uids: Sequence[str] = ()
    labels: Sequence[str] = ()
    cells: Sequence[str] = ()


@dataclasses.dataclass
class TransferStats:
    runs_added: int = 0
    runs_updated: int = 0
    runs_present: int = 0
    rows_added: Counter[str] = dataclasses.field(default_factory=Counter)
    rows_present: Counter[str] = dataclasses.field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs_added": self.runs_added,
            "runs_updated": self.runs_updated,
            "runs_present": self.runs_present,
            "rows_added": dict(self.rows_added),
            "rows_present": dict(self.rows_present),
        }


def _fields(model: type[Base]) -> list[str]:
    return [c.key for c in model.__table__.columns if c.key not in _LINKS]


def _datetime_fields(model: type[Base]) -> set[str]:
    return {c.key for c in model.__table__.columns if isinstance(c.type, DateTime)}


def _dump(row: Base, model: type[Base]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _fields(model):
        value = getattr(row, name)
        out[name] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out


def _load(data: dict[str, Any], model: type[Base], where: str) -> dict[str, Any]:
    allowed = set(_fields(model))
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise TransferError(f"{where}: unknown field {unknown[0]!r} for {model.__tablename__}")
    values = dict(data)
    for name in _datetime_fields(model) & set(values):
        if values[name] is not None:
            try:
                moment = dt.datetime.fromisoformat(values[name])
            except (TypeError, ValueError):
                raise TransferError(
                    f"{where}: field {name!r} is not an ISO datetime: {values[name]!r}"
                ) from None
            # SQLite hands back naive datetimes; every time the store writes is UTC.
            values[name] = moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)
    return values


# -- export ------------------------------------------------------------------------------------------


def header() -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "schema": SCHEMA_VERSION,
        "exported_at": utcnow().isoformat(),
    }


def iter_export(
    session: Session, run_filter: RunFilter = RunFilter(), progress: bool = False
) -> Iterator[dict[str, Any]]:
    """The export's items (header first) as dicts, reading ``session`` lazily."""
    yield header()
    stmt = select(Run).join(Run.cell).order_by(Run.started_at, Run.id)
    if run_filter.uids:
        stmt = stmt.where(Run.uid.in_(run_filter.uids))
    if run_filter.labels:
        stmt = stmt.where(Run.label.in_(run_filter.labels))
    if run_filter.cells:
        stmt = stmt.where(Cell.cell_id.in_(run_filter.cells))
    runs = list(session.scalars(stmt))
    for run in tqdm(runs, desc="export", unit="run", disable=not progress, leave=False):
        yield {"type": "run", **_dump(run, Run), "cell": _dump(run.cell, Cell)}
        for table, model in _TABLES.items():
            rows = session.scalars(select(model).where(model.run_pk == run.id).order_by(model.id)).yield_per(
                1000
            )  # type: ignore[attr-defined]
            for row in rows:
                item = {"type": table, "run": run.uid, **_dump(row, model)}
                if hasattr(row, "workload"):
                    item["workload"] = _dump(row.workload, Workload)
                yield item


def export_jsonl(
    session: Session, out: TextIO, run_filter: RunFilter = RunFilter(), progress: bool = False
) -> Counter[str]:
    """Write an export to ``out``; returns the number of items written per type."""
    counts: Counter[str] = Counter()
    for item in iter_export(session, run_filter, progress):
        out.write(json.dumps(item, sort_keys=True, separators=(",", ":")) + "\n")
        counts[item.get("type", "header")] += 1
    return counts


# -- ingest ------------------------------------------------------------------------------------------


def read_jsonl(lines: Iterable[str], source: str = "<input>") -> Iterator[tuple[str, dict[str, Any]]]:
    """Parse an export's lines into (location, item); the header is checked, then yielded too."""
    first = True
    for number, line in enumerate(lines, start=1):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TransferError(f"{where}: not a JSON line ({exc.msg})") from None
        if not isinstance(item, dict):
            raise TransferError(f"{where}: expected a JSON object, got {type(item).__name__}")
        if first:
            check_header(item, where)
            first = False
        yield where, item
    if first:
        raise TransferError(f"{source}: empty file; expected a grace-matrix export")


def check_header(item: dict[str, Any], where: str) -> None:
    if item.get("format") != EXPORT_FORMAT:
        raise TransferError(
            f"{where}: not a grace-matrix export (first line must carry format={EXPORT_FORMAT!r})"
        )
    version = item.get("version")
    if not isinstance(version, int) or version < 1:
        raise TransferError(f"{where}: export version {version!r} is not valid")
    if version > EXPORT_VERSION:
        raise TransferError(
            f"{where}: export version {version} is newer than this grace-matrix reads ({EXPORT_VERSION}); "
            "upgrade grace-matrix"
        )


class Ingester:
    """Adds export items to a store inside the caller's transaction (see the module invariants)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.stats = TransferStats()
        self._runs: dict[str, int] = {}  # uid -> run pk in this store
        self._present: dict[tuple[str, str], set[str]] = {}  # (uid, table) -> record keys in this store
        self._workloads: dict[tuple[str, str], int] = {}

    def add(self, item: dict[str, Any], where: str) -> None:
        kind = item.get("type")
        if "format" in item and kind is None:
            check_header(item, where)
        elif kind == "run":
            self._add_run(item, where)
        elif kind in _TABLES:
            self._add_row(kind, item, where)
        else:
            raise TransferError(
                f"{where}: unknown item type {kind!r}; expected 'run' or one of {sorted(_TABLES)}"
            )

    def _add_run(self, item: dict[str, Any], where: str) -> None:
        data = dict(item)
        data.pop("type")
        cell_data = data.pop("cell", None)
        if not isinstance(cell_data, dict):
            raise TransferError(f"{where}: run line lacks its 'cell' object")
        values = _load(data, Run, where)
        uid = values.get("uid")
        if not isinstance(uid, str) or not uid:
            raise TransferError(f"{where}: run line lacks its 'uid'")
        existing = self.session.scalars(select(Run).where(Run.uid == uid)).first()
        if existing is not None:
            self._runs[uid] = existing.id
            if existing.status == RunStatus.RUNNING.value and values.get("status") != RunStatus.RUNNING.value:
                for name in ("status", "finished_at", "exit_code", "message"):
                    setattr(existing, name, values.get(name))
                self.stats.runs_updated += 1
            else:
                self.stats.runs_present += 1
            return
        cell = self._cell(cell_data, where)
        try:
            run = Run(cell_pk=cell.id, **values)
        except TypeError as exc:
            raise TransferError(f"{where}: run line is malformed: {exc}") from None
        self.session.add(run)
        self.session.flush()
        self._runs[uid] = run.id
        self.stats.runs_added += 1

    def _cell(self, data: dict[str, Any], where: str) -> Cell:
        values = _load(data, Cell, where + " (cell)")
        fingerprint = values.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise TransferError(f"{where}: cell lacks its 'fingerprint'")
        stmt = select(Cell).where(Cell.fingerprint == fingerprint)
        cell = self.session.scalars(stmt).first()
        if cell is None:  # a concurrent ingest of the same cell may create it first
            cell = insert_or_reread(self.session, Cell(**values), stmt)
        return cell

    def _add_row(self, table: str, item: dict[str, Any], where: str) -> None:
        model = _TABLES[table]
        data = dict(item)
        data.pop("type")
        uid = data.pop("run", None)
        if uid not in self._runs:
            raise TransferError(
                f"{where}: {table} row refers to run {uid!r}, which no earlier run line declares"
            )
        workload = data.pop("workload", None)
        values = _load(data, model, where)
        key = values.get("record_key")
        if not isinstance(key, str):
            raise TransferError(f"{where}: {table} row lacks its 'record_key'")
        present = self._present_keys(uid, table, model)
        if key in present:
            self.stats.rows_present[table] += 1
            return
        if "workload_pk" in model.__table__.columns:
            if not isinstance(workload, dict) or "name" not in workload:
                raise TransferError(f"{where}: {table} row lacks its 'workload'")
            values["workload_pk"] = self._workload(workload)
        try:
            self.session.add(model(run_pk=self._runs[uid], **values))
        except TypeError as exc:
            raise TransferError(f"{where}: {table} row is malformed: {exc}") from None
        present.add(key)
        self.stats.rows_added[table] += 1

    def _present_keys(self, uid: str, table: str, model: ResultModel) -> set[str]:
        if (uid, table) not in self._present:
            stmt = select(model.record_key).where(model.run_pk == self._runs[uid])
            self._present[(uid, table)] = set(self.session.scalars(stmt))
        return self._present[(uid, table)]

    def _workload(self, data: dict[str, Any]) -> int:
        key = (str(data["name"]), str(data.get("code_hash", "")))
        if key not in self._workloads:
            workload = get_or_create_workload(
                self.session, key[0], key[1], str(data.get("tier", "smoke")), list(data.get("tags", []))
            )
            self._workloads[key] = workload.id
        return self._workloads[key]


def ingest_jsonl(
    session: Session, lines: Iterable[str], source: str = "<input>", progress: bool = False
) -> TransferStats:
    """Ingest an export into ``session``'s transaction; raises TransferError on the first bad line."""
    ingester = Ingester(session)
    items = read_jsonl(lines, source)
    for where, item in tqdm(items, desc=f"ingest {source}", unit="row", disable=not progress, leave=False):
        ingester.add(item, where)
    session.flush()
    return ingester.stats


def merge_stores(
    target: sessionmaker[Session], source_urls: Sequence[str], progress: bool = False
) -> TransferStats:
    """Ingest every run of each source store into ``target``, all in one transaction."""
    with target.begin() as session:
        ingester = Ingester(session)
        for url in source_urls:
            Source = open_store(url)
            try:
                with Source() as source:
                    for n, item in enumerate(iter_export(source, progress=progress)):
                        ingester.add(item, f"{display_url(url)} item {n}")
            finally:
                bind = Source.kw.get("bind")
                if bind is not None:
                    bind.dispose()
        session.flush()
        return ingester.stats
