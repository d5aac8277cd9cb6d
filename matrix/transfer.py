"""Export, ingest and merge: moving runs between stores as versioned JSON lines.

Problem: results are produced on many machines (a GPU lease, CI runners, laptops) and must end up in
one history: GPU results are committed under ``results/`` as files, nightly runners upload their stores,
and the dashboards read one store. Integer primary keys mean nothing across stores, files may be
ingested twice, and a half-ingested file would leave a history that lies.

Design: an export is JSON lines. The first line is a header (``format``, ``version``, the schema
revision it came from); then, per run, one ``run`` line carrying the run's fields and its cell's full
fingerprint, followed by one line per result row naming its table and its fields. Rows refer to runs
by ``uid`` and to workloads by (name, code hash), never by integer ids; every value is a named field.
Ingest reads such lines (``matrix.exportlines``) inside one transaction of the caller: a run already
present is matched by uid (and finished if the incoming copy finished it), a row already present by
(run, record_key) is skipped, except in a run the incoming copy finished: there the finished copy's row
replaces it (the recorder worsens a test's outcome while its run goes on). A run stored finished never
changes: a finished copy bringing a row of it with other values is refused (keeping either would hide
the other); a running copy of it is older than what is stored, and its rows are skipped.
Merge is ingest fed directly from other stores' exports, all in one transaction; the sources are
opened read-only.

Invariants:
- Ingesting the same export twice changes nothing the second time (idempotent).
- A reader refuses a ``version`` newer than ``EXPORT_VERSION`` with a hint to upgrade; a malformed line
  raises ``TransferError`` naming the line, and the caller's transaction rolls back everything.
- Export then ingest into an empty store reproduces every row, field for field (except integer ids).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO, cast

from sqlalchemy import Column, Table, TypeDecorator, select
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from matrix.errors import ConfigError, StoreError, TransferError
from matrix.exportfields import LINKS, load_fields
from matrix.exportlines import EXPORT_FORMAT, EXPORT_VERSION, check_header, read_jsonl
from matrix.store.access import get_or_create, insert_ignoring_conflict
from matrix.store.check import CHECK_COMMAND, find_unreadable
from matrix.store.db import SCHEMA_VERSION, StoreAccess, display_url, open_store
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

ResultModel = (
    type[TestOutcome]
    | type[CorrectnessResult]
    | type[PerformanceResult]
    | type[PIStageResult]
    | type[Diagnostic]
)
_TABLES: dict[str, ResultModel] = {model.__tablename__: model for model in RESULT_TABLES}


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
    rows_updated: Counter[str] = dataclasses.field(default_factory=Counter)  # of a running copy finished

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs_added": self.runs_added,
            "runs_updated": self.runs_updated,
            "runs_present": self.runs_present,
            "rows_added": dict(self.rows_added),
            "rows_present": dict(self.rows_present),
            "rows_updated": dict(self.rows_updated),
        }


def _fields(model: type[Base]) -> list[str]:
    return [c.key for c in model.__table__.columns if c.key not in LINKS]


def _dump(row: Base, model: type[Base]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _fields(model):
        value = getattr(row, name)
        out[name] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out


# -- export ------------------------------------------------------------------------------------------


def header() -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "schema": SCHEMA_VERSION,
        "exported_at": utcnow().isoformat(),
    }


def selected_runs(session: Session, run_filter: RunFilter = RunFilter()) -> list[Run]:
    """The runs ``run_filter`` selects, oldest first."""
    stmt = select(Run).join(Run.cell).order_by(Run.started_at, Run.id)
    if run_filter.uids:
        stmt = stmt.where(Run.uid.in_(run_filter.uids))
    if run_filter.labels:
        stmt = stmt.where(Run.label.in_(run_filter.labels))
    if run_filter.cells:
        stmt = stmt.where(Cell.cell_id.in_(run_filter.cells))
    return list(session.scalars(stmt))


def iter_export(
    session: Session, run_filter: RunFilter = RunFilter(), progress: bool = False, source: str | None = None
) -> Iterator[dict[str, Any]]:
    """The export's items (header first) as dicts, reading ``session`` lazily. Selected runs holding a
    value no reader can use (``matrix.store.check``) are a ``StoreError`` before the first item: ingest
    would refuse their export whole (``source``: the store's URL for the message, when not --db's)."""
    runs = selected_runs(session, run_filter)
    unreadable = find_unreadable(session, [run.id for run in runs])
    if unreadable:
        command = CHECK_COMMAND + (f" --db {source}" if source else "")
        raise StoreError(
            f"{len(unreadable)} row(s) of the runs to copy{f' from {source}' if source else ''} hold values "
            f"no reader can use, which ingest refuses (first: {unreadable[0].line()}); `{command}` lists "
            "them: repair them, or export the other runs (--run, --label, --cell)"
        )
    yield header()
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


class Ingester:
    """Adds export items to a store inside the caller's transaction (see the module invariants)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.stats = TransferStats()
        self._runs: dict[str, int] = {}  # uid -> run pk in this store
        self._present: dict[tuple[str, str], set[str]] = {}  # (uid, table) -> record keys in this store
        self._workloads: dict[tuple[str, str], int] = {}
        self._fresh: set[str] = set()  # uids of the runs this ingester inserted
        self._finished: set[str] = set()  # uids of stored running runs this ingester finished
        self._settled: set[str] = set()  # uids of runs stored finished, their latest copy finished too
        self._stored: dict[tuple[str, str], dict[str, Any]] = {}  # (uid, table) -> record key -> row
        # per uid, the rows its latest run line brought: (table, record key) -> (digest, where)
        self._copy: dict[str, dict[tuple[str, str], tuple[str, str]]] = {}

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
        values = load_fields(data, Run, where)
        uid = values.get("uid")
        if not isinstance(uid, str) or not uid:
            raise TransferError(f"{where}: run line lacks its 'uid'")
        self._copy[uid] = {}  # a new copy of the run (two exports concatenated): its rows start afresh
        existing = self.session.scalars(select(Run).where(Run.uid == uid)).first()
        if existing is None:
            cell = self._cell(cell_data, where)
            # An upsert: a concurrent ingest of the same run wins or loses, never fails.
            if insert_ignoring_conflict(self.session, Run, {**values, "cell_pk": cell.id}, ("uid",)):
                self._runs[uid] = self.session.scalars(select(Run.id).where(Run.uid == uid)).one()
                self._fresh.add(uid)
                self.stats.runs_added += 1
                return
            existing = self.session.scalars(select(Run).where(Run.uid == uid)).one()
        self._runs[uid] = existing.id
        if existing.status == RunStatus.RUNNING.value and values.get("status") != RunStatus.RUNNING.value:
            for name in ("status", "finished_at", "exit_code", "message"):
                setattr(existing, name, values.get(name))
            self.stats.runs_updated += 1
            self._finished.add(uid)
        else:
            self.stats.runs_present += 1
            finished = RunStatus.RUNNING.value not in (existing.status, values.get("status"))
            (self._settled.add if finished else self._settled.discard)(uid)  # a running copy is older

    def _cell(self, data: dict[str, Any], where: str) -> Cell:
        values = load_fields(data, Cell, where + " (cell)")
        fingerprint = values.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise TransferError(f"{where}: cell lacks its 'fingerprint'")
        missing = sorted(c.key for c in _columns(Cell) if _required(c) and c.key not in values)
        if missing:
            raise TransferError(f"{where}: cell lacks its {missing[0]!r}")
        return get_or_create(self.session, Cell, values, ("fingerprint",))

    def _add_row(self, table: str, item: dict[str, Any], where: str) -> None:
        model = _TABLES[table]
        data = dict(item)
        data.pop("type")
        uid = data.pop("run", None)
        if not isinstance(uid, str) or uid not in self._runs:
            raise TransferError(
                f"{where}: {table} row refers to run {uid!r}, which no earlier run line declares"
            )
        workload = data.pop("workload", None)
        values = load_fields(data, model, where)
        key = values.get("record_key")
        if not isinstance(key, str):
            raise TransferError(f"{where}: {table} row lacks its 'record_key'")
        missing = sorted(c.key for c in _columns(model) if _required(c) and c.key not in values)
        if missing:
            raise TransferError(f"{where}: {table} row lacks its {missing[0]!r}")
        if self._repeated(uid, table, key, (values, workload), where):
            self.stats.rows_present[table] += 1
            return
        present = self._present_keys(uid, table, model)
        if key in present and uid not in self._finished and uid not in self._settled:
            self.stats.rows_present[table] += 1
            return
        if "workload_pk" in model.__table__.columns:
            if not isinstance(workload, dict):
                raise TransferError(f"{where}: {table} row lacks its 'workload'")
            values["workload_pk"] = self._workload(workload, where)
        if key in present and uid in self._settled:
            self._check_unchanged(model, uid, key, values, where)
            self.stats.rows_present[table] += 1
            return
        values["run_pk"] = self._runs[uid]
        if key in present:  # of a run this ingest finished
            (self.stats.rows_updated if self._replace(model, values) else self.stats.rows_present)[table] += 1
            return
        present.add(key)
        if uid in self._fresh:  # a run this transaction created: no one else can add its rows
            self.session.add(model(**values))
        elif not insert_ignoring_conflict(self.session, model, values, ("run_pk", "record_key")):
            self.stats.rows_present[table] += 1  # a concurrent ingest of the same run added it
            return
        self.stats.rows_added[table] += 1

    def _repeated(self, uid: str, table: str, key: str, row: object, where: str) -> bool:
        """Whether this copy of run ``uid`` already brought the row ``key`` of ``table``, as it is now;
        a ``TransferError`` when it brought a different one (a copy holds each record once: keeping either
        would hide the other, a failed test stored as passed)."""
        digest = hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()
        earlier = self._copy[uid].setdefault((table, key), (digest, where))
        if earlier[0] == digest:
            return earlier[1] != where
        raise TransferError(
            f"{where}: {table} row {key!r} of run {uid} differs from the one at {earlier[1]}; a run's "
            "export holds each record once: repair the file or export the run again"
        )

    def _replace(self, model: ResultModel, values: dict[str, Any]) -> bool:
        """Give the stored row of ``values``' run and record key the fields of ``values`` (the finished
        copy's: the recorder worsens a test's outcome while its run goes on); True when one differed."""
        row = self.session.scalars(
            select(model).where(model.run_pk == values["run_pk"], model.record_key == values["record_key"])
        ).one()
        changed = {name: value for name, value in values.items() if not _same(getattr(row, name), value)}
        for name, value in changed.items():
            setattr(row, name, value)
        return bool(changed)

    def _check_unchanged(
        self, model: ResultModel, uid: str, key: str, values: dict[str, Any], where: str
    ) -> None:
        """A ``TransferError`` unless the stored row ``key`` of finished run ``uid`` has ``values`` (as the
        store would write them: text cleaned, times in UTC); the run's rows are read once per table."""
        table = model.__tablename__
        rows = self._stored.get((uid, table))
        if rows is None:
            found = self.session.execute(
                select(model.record_key, model).where(model.run_pk == self._runs[uid])
            )
            rows = self._stored[(uid, table)] = {record: row for record, row in found}
        row, columns = rows[key], model.__table__.columns
        dialect = self.session.get_bind().dialect
        for name, value in values.items():
            kind = columns[name].type
            if value is not None and isinstance(kind, TypeDecorator):
                value = kind.process_bind_param(value, dialect)
            if not _same(getattr(row, name), value):
                raise TransferError(
                    f"{where}: {table} row {key!r} of run {uid} differs from the stored one in {name!r}; "
                    "a finished run's rows never change: ingest the export its store writes now"
                )

    def _present_keys(self, uid: str, table: str, model: ResultModel) -> set[str]:
        if (uid, table) not in self._present:
            keys: set[str] = set()
            if uid not in self._fresh:
                keys.update(
                    self.session.scalars(select(model.record_key).where(model.run_pk == self._runs[uid]))
                )
            self._present[(uid, table)] = keys
        return self._present[(uid, table)]

    def _workload(self, data: dict[str, Any], where: str) -> int:
        values = load_fields(data, Workload, where + " (workload)")
        if not isinstance(values.get("name"), str):
            raise TransferError(f"{where}: workload lacks its 'name'")
        values.setdefault("code_hash", "")
        key = (values["name"], values["code_hash"])
        if key not in self._workloads:
            values.setdefault("tier", "smoke")
            values.setdefault("tags", [])
            self._workloads[key] = get_or_create(self.session, Workload, values, ("name", "code_hash")).id
        return self._workloads[key]


def _same(stored: Any, incoming: Any) -> bool:
    """Whether a stored value equals an incoming one (SQLite reads times back without their UTC offset)."""
    if isinstance(stored, dt.datetime) and isinstance(incoming, dt.datetime) and stored.tzinfo is None:
        stored = stored.replace(tzinfo=dt.timezone.utc)
    return bool(stored == incoming)


def _columns(model: type[Base]) -> list[Column[Any]]:
    return list(cast(Table, model.__table__).columns)


def _required(column: Column[Any]) -> bool:
    """A column an export line must give: not null, no default, not a link."""
    return not column.nullable and column.default is None and column.key not in LINKS


def ingest_jsonl(
    session: Session, lines: Iterable[str] | Iterable[bytes], source: str = "<input>", progress: bool = False
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
            Source = open_store(url, StoreAccess.READ_ONLY)
            try:
                with Source() as source:
                    items = iter_export(source, progress=progress, source=display_url(url))
                    for n, item in enumerate(items):
                        ingester.add(item, f"{display_url(url)} item {n}")
            finally:
                bind = Source.kw.get("bind")
                if bind is not None:
                    bind.dispose()
        session.flush()
        return ingester.stats


def store_of_exports(paths: Sequence[str], option: str = "") -> sessionmaker[Session]:
    """An in-memory store holding the exports at ``paths``, for commands that read exports directly.
    An unreadable file is a ConfigError naming it (after ``option``, the flag that gave it, if any)."""
    Session_ = open_store("sqlite://")
    with Session_.begin() as session:
        for path in paths:
            try:
                handle = open(path, "rb")  # noqa: SIM115 - closed below; decoded per line by ingest
            except OSError as exc:
                raise ConfigError(f"{option} {path}: cannot read: {exc.strerror}".lstrip()) from None
            with handle:
                ingest_jsonl(session, handle, path)
    return Session_
