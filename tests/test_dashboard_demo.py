"""The demo: results moved as an export (as committed under results/), ingested into a fresh store, plus a
seeded regression and a seeded PI failure; the dashboard shows both, through the real commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from matrix.regressions.synthetic import SyntheticSpec, seed_history
from matrix.store.db import open_store
from matrix_cli.main import main


def test_exported_results_plus_seeded_faults_show_on_the_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    origin, store = f"sqlite:///{tmp_path / 'gpu.sqlite'}", f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(origin).begin() as session:
        seed_history(session, SyntheticSpec(nights=6))
    assert main(["export", "--db", origin, "-o", str(tmp_path / "results.jsonl")]) == 0
    assert main(["ingest", "--db", store, str(tmp_path / "results.jsonl")]) == 0
    assert main(["regressions", "--db", store]) == 0  # the exported history alone is clean
    capsys.readouterr()
    assert main(["seed-demo", "--db", store, "--json"]) == 0
    seeded = json.loads(capsys.readouterr().out)
    assert main(["regressions", "--db", store, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    new = {
        (r["kind"], r["workload"], r["mode"]) for c in report["cells"] for r in c["regressions"] if r["new"]
    }
    workload, mode = seeded["regression"]
    assert new == {("performance", workload, mode), ("status", seeded["pi_subject"], seeded["pi_stage"])}
    assert main(["dashboard", "--db", store, "--out", str(tmp_path / "site")]) == 0
    regressions = (tmp_path / "site" / "regressions.html").read_text()
    assert f">{workload}</a></strong> / {mode}" in regressions
    assert f"{seeded['pi_subject']}</strong> / {seeded['pi_stage']}" in regressions
    pi = (tmp_path / "site" / "pi.html").read_text()
    assert "seeded PI failure: cuGraphKernelNodeSetParams rejected the slot table &lt;script&gt;" in pi
