"""``grace-matrix pi-status``: parameter-indirection stage results per cell, Triton release and stage.

Reads ``PIStageResult`` rows (recorded by the PI stage suite and by PI inside the grace backend) of the
newest run of each cell key that recorded any (``matrix.readmodel.select_runs``), or of the runs named.
``--json`` prints every row with its cell and run; the table shows, per cell and stage, how many subjects
passed, failed and were skipped, and the first failure. A stage result that neither passed nor was skipped
counts as failed: a status no writer records, or a row holding a value no reader can use (its status reads
``unreadable``, ``matrix.statuses.row_status``). Exit status 1 when any selected stage result failed (PI
breakage), 0 otherwise.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.statuses import ResultStatus, row_status
from matrix.store.db import StoreAccess, open_store
from matrix.store.models import PIStageResult
from matrix.unreadable import describe

STAGE_ORDER = ("locate", "rewrite", "assemble", "load", "patch", "numeric", "vendor_match", "vendor_update")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StageRow:
    """One stored PI stage result with the identity of its cell and run."""

    cell: str
    run: str
    torch: str | None
    triton: str | None
    subject: str
    stage: str
    status: str
    message: str
    nodeid: str
    details: dict[str, Any]

    @property
    def failed(self) -> bool:
        return self.status not in (ResultStatus.PASS, ResultStatus.SKIP)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "run": self.run,
            "torch": self.torch,
            "triton": self.triton,
            "subject": self.subject,
            "stage": self.stage,
            "status": self.status,
            "message": self.message,
            "nodeid": self.nodeid,
            "details": self.details,
        }


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("pi-status", help="parameter-indirection stage results per cell")
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only this cell id (repeatable)")
    parser.add_argument("--stage", action="append", default=[], choices=STAGE_ORDER, help="only this stage")
    parser.add_argument("--failed", action="store_true", help="only failed stage results")
    parser.set_defaults(handler=handle)


def load_rows(
    session: Session,
    runs: list[str] | None = None,
    cells: list[str] | None = None,
    stages: list[str] | None = None,
    failed_only: bool = False,
) -> list[StageRow]:
    """PI stage rows of the named runs, or of the newest run of each cell key that recorded any (runs
    selected by ``matrix.readmodel.select_runs``, as every reader selects them)."""
    recorded = set(session.scalars(select(PIStageResult.run_pk).distinct()))
    pool = [run for run in readmodel.load_runs(session) if run.pk in recorded]
    pick = readmodel.Pick.EVERY if runs else readmodel.Pick.NEWEST
    selection = readmodel.Selection(uids=tuple(runs or ()), cells=tuple(cells or ()), pick=pick)
    chosen = {run.pk: run for run in readmodel.select_runs(pool, selection)}
    query = select(PIStageResult).where(PIStageResult.run_pk.in_(sorted(chosen)))
    if stages:
        query = query.where(PIStageResult.stage.in_(stages))
    rows = [
        StageRow(
            cell=chosen[result.run_pk].cell_id,
            run=chosen[result.run_pk].uid,
            torch=chosen[result.run_pk].torch_version,
            triton=result.triton_version or chosen[result.run_pk].triton_version,
            subject=result.subject,
            stage=result.stage,
            status=str(row_status(result.status, result.details) or result.status),
            message=describe({"details": result.details}) or result.message,
            nodeid=result.nodeid,
            details=dict(result.details) if isinstance(result.details, dict) else {},
        )
        for result in session.scalars(query.order_by(PIStageResult.id))
    ]
    if failed_only:
        rows = [row for row in rows if row.failed]
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}
    return sorted(rows, key=lambda r: (r.cell, r.subject, rank.get(r.stage, len(rank))))


def summarize(rows: list[StageRow]) -> list[dict[str, Any]]:
    """Per (cell, stage): counts of pass/fail/skip and the first failure's subject and message."""
    groups: dict[tuple[str, str], list[StageRow]] = defaultdict(list)
    for row in rows:
        groups[(row.cell, row.stage)].append(row)
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}
    out = []
    for (cell, stage), members in sorted(groups.items(), key=lambda kv: (kv[0][0], rank.get(kv[0][1], 99))):
        failed = [m for m in members if m.failed]
        out.append(
            {
                "cell": cell,
                "torch": members[0].torch,
                "triton": members[0].triton,
                "stage": stage,
                "pass": sum(m.status == "pass" for m in members),
                "fail": len(failed),
                "skip": sum(m.status == "skip" for m in members),
                "first_failure": f"{failed[0].subject}: {failed[0].message}" if failed else None,
            }
        )
    return out


def handle(args: argparse.Namespace) -> int:
    from matrix_cli.commands._output import info, print_json, print_table

    Session = open_store(args.db, StoreAccess.EXISTING)
    with Session.begin() as session:
        rows = load_rows(session, args.run, args.cell, args.stage, args.failed)
    broken = any(r.failed for r in rows)
    if args.json:
        print_json(
            {"format": FORMAT_VERSION, "results": [r.to_dict() for r in rows], "summary": summarize(rows)}
        )
        return 1 if broken else 0
    if not rows:
        info("grace-matrix: no PI stage results (run the PI suite: `nox -s matrix` or pytest -m pi)")
        return 0
    columns = ["cell", "torch", "triton", "stage", "pass", "fail", "skip", "first_failure"]
    print_table(summarize(rows), columns)
    return 1 if broken else 0
