"""A pytest plugin that appends every suite record to a JSON-lines file, independent of any store.

Use: ``PYTHONPATH=scripts/gpu pytest -p record_jsonl --record-jsonl out/records.jsonl suites/...``.
It is the safety net of the GPU scripts: whatever happens to the store or the recorder, the raw records
of a lease survive in a plain file. One line per record: ``{"format": 1, "nodeid", "when", "outcome",
"record"}``; a record reported in several test phases is written once (from the first phase that
carried it, normally ``call``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from suites.records import USER_PROPERTY_KEY

FORMAT = 1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-jsonl", default=None, help="append suite records to this JSON-lines file")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-jsonl")
    if path:
        config.pluginmanager.register(JsonlWriter(Path(path)), "record-jsonl-writer")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


class JsonlWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: set[str] = set()
        path.parent.mkdir(parents=True, exist_ok=True)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        lines = []
        for key, value in report.user_properties:
            if key != USER_PROPERTY_KEY:
                continue
            ident = f"{report.nodeid}\0{_json(value)}"
            if ident in self.seen:
                continue
            self.seen.add(ident)
            line = {
                "format": FORMAT,
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "record": value,
            }
            lines.append(_json(line))
        if lines:
            with self.path.open("a") as handle:
                handle.write("\n".join(lines) + "\n")
