"""After a suites run on the GPU: copy the store, export it, report it, and list what is left to run.

Usage: ``python scripts/gpu/suites_post.py --db URL --records FILE --out DIR --workloads GLOBS --tier T``

Every step is independent and logged; a failing step never stops the next one (a lease must bring
back whatever exists). Files written to DIR:
- ``suites-store.sqlite``: a consistent copy of the SQLite store (sqlite3 backup API).
- ``suites-export.jsonl``: ``grace-matrix export`` of every run in the store; where that command does
  not exist, ``suites-store-dump.jsonl`` instead (one ``{"format", "table", "row"}`` line per row).
- ``report.txt``, ``report.json``, ``RESULTS.md``: the report over the store.
- ``remaining.txt``: selected workloads without any record in FILE (pass them to the next call);
  ``incomplete.txt``: workloads whose correctness records exist but whose performance records do not
  (the run died or was interrupted inside them: look at the log before running them again).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

logger = logging.getLogger("suites_post")


def sqlite_file(url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def copy_store(url: str, out: Path) -> None:
    path = sqlite_file(url)
    if path is None or not path.exists():
        logger.warning("no SQLite store at %s to copy", url)
        return
    target = out / "suites-store.sqlite"
    with sqlite3.connect(path) as source, sqlite3.connect(target) as copy:
        source.backup(copy)
    logger.info("copied the store to %s (%d bytes)", target, target.stat().st_size)


def export(url: str, out: Path) -> None:
    try:
        from matrix_cli.main import main
    except ImportError as exc:  # the store's dependencies missing on this machine
        logger.warning("grace-matrix export unavailable (%s): dumping the store's tables instead", exc)
        dump_tables(url, out / "suites-store-dump.jsonl")
        return
    code = main(["export", "--db", url, "-o", str(out / "suites-export.jsonl")])
    if code != 0:
        logger.warning("grace-matrix export exited %d: dumping the store's tables instead", code)
        dump_tables(url, out / "suites-store-dump.jsonl")


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


def dump_tables(url: str, target: Path) -> None:
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    with engine.connect() as conn, target.open("w") as handle:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(text(f'SELECT * FROM "{table}"')).mappings():
                line = {"format": 1, "table": table, "row": {k: _plain(v) for k, v in row.items()}}
                handle.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    logger.info("dumped the store to %s", target)


def report(url: str, out: Path) -> None:
    from matrix.report import build_report, render_markdown, render_text
    from matrix.store.db import open_store

    Session = open_store(url)
    with Session() as session:
        result = build_report(session)
    (out / "report.txt").write_text(render_text(result))
    (out / "report.json").write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    (out / "RESULTS.md").write_text(render_markdown(result))
    sys.stdout.write(render_text(result))


def remaining(records: Path, patterns: str, out: Path) -> None:
    """Workloads done (a performance record exists: that test runs last for a workload), started but
    cut short (correctness records only: the process died or was interrupted) and not started."""
    from suites.workloads import select

    started: set[str] = set()
    done: set[str] = set()
    statuses: Counter[str] = Counter()
    if records.exists():
        for line in records.read_text().splitlines():
            record = json.loads(line)["record"]
            if "workload" in record:
                started.add(record["workload"]["name"])
                if record["kind"] == "performance":
                    done.add(record["workload"]["name"])
                statuses[f"{record['kind']}:{record.get('status', record.get('code'))}"] += 1
    selected = [wl.name for wl in select(patterns)]
    left = [name for name in selected if name not in started]
    cut = [name for name in selected if name in started and name not in done]
    (out / "remaining.txt").write_text("".join(f"{name}\n" for name in left))
    (out / "incomplete.txt").write_text("".join(f"{name}\n" for name in cut))
    logger.info("record counts: %s", dict(sorted(statuses.items())))
    if cut:
        logger.warning(
            "%d workload(s) started but not finished (crash or interrupt?): %s", len(cut), ",".join(cut)
        )
    if left:
        logger.warning("%d workload(s) not run; resume with: --workloads '%s'", len(left), ",".join(left))
    if not left and not cut:
        logger.info("every selected workload has all its records")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default="*")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="suites_post: %(levelname)s %(message)s", stream=sys.stdout
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    steps = (
        ("copy store", lambda: copy_store(args.db, args.out)),
        ("export", lambda: export(args.db, args.out)),
        ("report", lambda: report(args.db, args.out)),
        ("remaining", lambda: remaining(args.records, args.workloads, args.out)),
    )
    failed = 0
    for name, step in steps:
        try:
            step()
        except Exception:
            failed += 1
            logger.exception("step %r failed", name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
