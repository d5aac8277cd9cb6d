"""The committed results (results/*.jsonl), through the real commands: ingested into a fresh store, judged,
then given the seeded demo faults and rendered.

The committed results hold real failures. They must show as FAIL unless an expected.toml entry names
that very status with a reason (then they are known failures, XFAIL), and nothing any run of a label
recorded may show as MISSING: one night of one cell arrives as several runs sharing a label, judged as
one logical run (matrix.readmodel.group_runs). The expected FAIL set is computed here from the files
themselves, per label the latest run's status of each result, less what expected.toml explains.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from matrix.regressions.expected import load_expected_file
from matrix.regressions.observations import ResultKey, Suite
from matrix.regressions.status import expectation_for
from matrix_cli.main import main

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = sorted((ROOT / "results").glob("*.jsonl"))
PASSING = {"correctness": "pass", "performance": "ok", "pi": "pass"}
TABLES = {
    "correctness_results": "correctness",
    "performance_results": "performance",
    "pi_stage_results": "pi",
}

pytestmark = pytest.mark.skipif(not RESULTS, reason="no committed results under results/")


def failing_in_files(paths: list[Path]) -> dict[tuple[str, str, str, str], str]:
    """(cell, suite, workload, mode) -> status of every result whose latest status within its label (or
    its own run, unlabelled) is neither passing nor a skip."""
    runs: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("type") == "run":
                runs[record["uid"]] = record
            elif record.get("type") in TABLES:
                rows.append(record)
    latest: dict[tuple[str, ...], tuple[str, str]] = {}
    for row in rows:
        run = runs[row["run"]]
        suite = TABLES[row["type"]]
        workload = row["subject"] if suite == "pi" else row["workload"]["name"]
        mode = row["stage"] if suite == "pi" else row["mode"]
        cell = run["cell"]
        group = run["label"] or run["uid"]
        key = (cell["cell_id"], cell.get("gpu_name") or "", group, suite, workload, mode)
        stamp = (run["started_at"], run["uid"])
        if key not in latest or stamp >= tuple(latest[key][0].split("|")):
            latest[key] = (f"{stamp[0]}|{stamp[1]}", row["status"])
    return {
        (k[0], k[3], k[4], k[5]): status
        for k, (_, status) in latest.items()
        if status not in (PASSING[k[3]], "skip")
    }


def _regressions(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def _summary(report: dict[str, Any]) -> str:
    parts = [f"{report['new_regressions']} new, {report['regressions']} total"]
    for cell in report["cells"]:
        parts.append(f"{cell['cell']} ({len(cell['runs'])} runs of {cell['label']}): {cell['verdicts']}")
    return "; ".join(parts)


def test_committed_results_then_seeded_demo(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    record_property: Any,
) -> None:
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    expected = ["--expected", str(ROOT / "expected.toml")]
    assert main(["ingest", "--db", store, *map(str, RESULTS)]) == 0

    code, report = _regressions(capsys, ["regressions", "--db", store, "--json", *expected])
    log.info("committed results: %s", _summary(report))
    record_property("committed_results", _summary(report))
    verdicts: dict[str, int] = defaultdict(int)
    for cell in report["cells"]:
        for verdict, n in cell["verdicts"].items():
            verdicts[verdict] += n
    assert "MISSING" not in verdicts  # every run of a label counts
    fails = {
        (c["cell"], r["suite"], r["workload"], r["mode"])
        for c in report["cells"]
        for r in c["regressions"]
        if r.get("verdict") == "FAIL"
    }
    failing = failing_in_files(RESULTS)
    entries = load_expected_file(ROOT / "expected.toml")
    explained = set()
    for (cell, suite, workload, mode), actual in failing.items():
        entry = expectation_for(entries, cell, ResultKey(Suite(suite), workload, mode))
        if entry is not None and entry.status == actual:
            assert entry.reason.strip(), f"{entry} explains {cell}/{workload}/{mode} without a reason"
            explained.add((cell, suite, workload, mode))
    assert fails == set(failing) - explained  # an entry explains only the status it names
    assert code == (1 if fails else 0)

    capsys.readouterr()
    assert main(["seed-demo", "--db", store, "--json"]) == 0
    seeded = json.loads(capsys.readouterr().out)
    code, after = _regressions(capsys, ["regressions", "--db", store, "--json", *expected])
    log.info("after seed-demo: %s", _summary(after))
    record_property("after_seed_demo", _summary(after))
    assert code == 1
    workload, mode = seeded["regression"]
    new = {
        (r["kind"], r["workload"], r["mode"]) for c in after["cells"] for r in c["regressions"] if r["new"]
    }
    assert ("performance", workload, mode) in new
    assert ("status", seeded["pi_subject"], seeded["pi_stage"]) in new
    seeded_cell = [c for c in after["cells"] if c["run"] == seeded["run_uid"]]
    assert seeded_cell and "MISSING" not in seeded_cell[0]["verdicts"]

    assert main(["dashboard", "--db", store, "--out", str(tmp_path / "site"), *expected]) == 0
    regressions = (tmp_path / "site" / "regressions.html").read_text()
    pi = (tmp_path / "site" / "pi.html").read_text()
    assert f">{workload}</a></strong> / {mode}" in regressions
    assert f"{seeded['pi_subject']}</strong> / {seeded['pi_stage']}" in regressions
    assert seeded["pi_subject"] in pi and "seeded PI failure" in pi
    real = sorted(fails)
    if real:
        shown = [
            f
            for f in real
            if f"{f[2]}</a></strong> / {f[3]}" in regressions or f"{f[2]}</strong> / {f[3]}" in regressions
        ]
        assert shown, "no real failure of the committed results on regressions.html"
    real_pi = [f for f in real if f[1] == "pi"]
    if real_pi:
        assert any(f[2] in pi for f in real_pi)
