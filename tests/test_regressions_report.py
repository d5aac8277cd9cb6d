"""Regression reports over synthetic stores (matrix.regressions.report) and the
``grace-matrix regressions`` / ``seed-demo`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from matrix.regressions import report
from matrix.regressions.errors import RegressionsError
from matrix.regressions.observations import RUN_SUBJECT, TEST_MODE, ResultKey, Suite
from matrix.regressions.synthetic import (
    SCRIPT_PAYLOAD,
    SeededFailure,
    SeededRegression,
    SyntheticSpec,
    seed_demo,
    seed_history,
)
from matrix.regressions.thresholds import ReproSettings, Thresholds
from matrix.store.db import open_store
from matrix_cli.commands import COMMAND_MODULES
from matrix_cli.main import main

TH = Thresholds()
SPEC = SyntheticSpec(
    nights=12,
    regressions=(SeededRegression("torch-2.11", "xlnet_lm", "grace", 1.10, night=7),),
    failures=(
        SeededFailure(
            "torch-2.10", "pi", "triton_poi_fused_add_0", "assemble", "fail", "ptxas " + SCRIPT_PAYLOAD, 11
        ),
        SeededFailure("torch-2.9", "correctness", "mt5_small", "grace", "fail_accuracy", "max_abs 0.3", 10),
    ),
)


@pytest.fixture
def store() -> sessionmaker[Session]:
    factory = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
    return factory


def found(rep: report.RegressionReport) -> set[tuple[str, str, str, str, bool]]:
    return {(r.cell_id, r.kind.value, r.key.workload, r.key.mode, r.new) for r in rep.regressions}


def test_latest_runs_flag_new_and_ongoing_failures(store: sessionmaker[Session]) -> None:
    with store() as session:
        rep = report.detect(session, TH)
    assert {c.run.cell_id for c in rep.cells} == {"torch-2.9", "torch-2.10", "torch-2.11"}
    assert found(rep) == {
        ("torch-2.10", "status", "triton_poi_fused_add_0", "assemble", True),  # first failed tonight
        ("torch-2.9", "status", "mt5_small", "grace", False),  # failing since last night: ongoing
    }
    assert all(c.baseline is not None and c.baseline.cell_key == c.run.cell_key for c in rep.cells)


def test_seeded_step_is_flagged_pairwise_on_its_night_and_by_history_once_confirmed(
    store: sessionmaker[Session],
) -> None:
    per_night: dict[int, set[tuple[str, str, str]]] = {}
    new: dict[int, list[str]] = {}
    with store() as session:
        for night in range(1, 13):
            rep = report.detect(session, TH, run_spec=f"synthetic-nightly-2026-01-{night:02d}")
            per_night[night] = {
                (r.kind.value, r.key.workload, r.key.mode)
                for r in rep.regressions
                if r.cell_id == "torch-2.11"
            }
            new[night] = [r.kind.value for r in rep.new_regressions if r.cell_id == "torch-2.11"]
    assert per_night[8] == {("performance", "xlnet_lm", "grace")}  # night index 7 is the 8th night
    history_nights = [n for n, regs in per_night.items() if ("history", "xlnet_lm", "grace") in regs]
    # confirmed once, as soon as enough nights follow the step for the segments to differ significantly
    # (with 7 nights before it, three after cannot reach p < 0.01 in a two-sided rank test: four are needed)
    assert history_nights == [8 + TH.history.min_segment]
    assert all(not regs for n, regs in per_night.items() if n not in (8, *history_nights))
    # one alert per change: the sudden jump was new on its night; the confirmed step is ongoing
    assert {n: kinds for n, kinds in new.items() if kinds} == {8: ["performance"]}


def test_explicit_baseline_and_unknown_runs(store: sessionmaker[Session]) -> None:
    with store() as session:
        rep = report.detect(
            session, TH, run_spec="synthetic-nightly-2026-01-12", baseline_spec="synthetic-nightly-2026-01-05"
        )
        cell = next(c for c in rep.cells if c.run.cell_id == "torch-2.11")
        assert cell.baseline is not None and cell.baseline.label == "synthetic-nightly-2026-01-05"
        assert ("performance", "xlnet_lm", "grace") in {
            (r.kind.value, r.key.workload, r.key.mode) for r in cell.regressions
        }
        with pytest.raises(RegressionsError, match="no run matches 'nope'"):
            report.detect(session, TH, run_spec="nope")
        with pytest.raises(RegressionsError, match="no baseline run matches"):
            report.detect(session, TH, baseline_spec="nope")


def test_aggregates_cover_only_common_workloads(store: sessionmaker[Session]) -> None:
    with store() as session:
        rep = report.detect(session, TH)
    for cell in rep.cells:
        assert cell.comparison is not None
        assert {a.workloads for a in cell.comparison.aggregates} == {len(SPEC.workloads)}


def test_repro_command_selects_the_nox_cell_and_the_test() -> None:
    key = ResultKey(Suite.PERFORMANCE, "xlnet", "grace")
    command = report.repro_command(
        ReproSettings(), "torch-2.11", "suites/test_perf.py::test_perf[xlnet-grace]", key
    )
    assert command == "nox -s 'cell(torch-2.11)' -- -k 'test_perf[xlnet-grace]'"
    # node ids pytest -k cannot take as one identifier fall back to an "and" of their words
    odd = report.test_selector("t.py::test_x[a b=1]", key)
    assert odd == "test_x and a and b and 1"
    assert report.test_selector("", key) == "xlnet and grace"
    # how a run ended is no test: the whole cell reproduces it
    run_end = ResultKey(Suite.TESTS, RUN_SUBJECT, TEST_MODE)
    assert report.repro_command(ReproSettings(), "torch-2.11", "", run_end) == "nox -s 'cell(torch-2.11)'"


def test_empty_store_gives_an_empty_report() -> None:
    factory = open_store("sqlite://")
    with factory() as session:
        rep = report.detect(session, TH)
    assert rep.cells == () and rep.new_regressions == []


def test_report_json_is_versioned_and_complete(store: sessionmaker[Session]) -> None:
    with store() as session:
        data = report.report_to_json(report.detect(session, TH))
    json.dumps(data)
    assert data["format"] == report.REPORT_FORMAT
    assert data["new_regressions"] == 1 and data["regressions"] == 2
    pi = next(r for c in data["cells"] for r in c["regressions"] if r["suite"] == "pi")
    assert (
        pi["message"].endswith(SCRIPT_PAYLOAD)
        and pi["verdict"] == "FAIL"
        and pi["repro"].startswith("nox -s")
    )


# --- the commands -----------------------------------------------------------------------------------


def cli(argv: list[str]) -> int:
    return main(argv)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)  # no expected.toml here unless a test writes one
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


def test_command_exit_codes_and_json(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    open_store(db).kw["bind"].dispose()  # regressions reads a store, never creates one
    assert cli(["regressions", "--db", db]) == 0
    assert "nothing to judge" in capsys.readouterr().out
    with open_store(db).begin() as session:
        seed_history(session, SyntheticSpec(nights=6))
    assert cli(["regressions", "--db", db]) == 0
    assert "0 new regressions" in capsys.readouterr().out
    assert cli(["seed-demo", "--db", db, "--json"]) == 0
    seeded = json.loads(capsys.readouterr().out)
    assert cli(["regressions", "--db", db, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    kinds = {
        (r["kind"], r["workload"], r["mode"]) for c in data["cells"] for r in c["regressions"] if r["new"]
    }
    assert ("performance", *seeded["regression"]) in kinds
    assert ("status", seeded["pi_subject"], seeded["pi_stage"]) in kinds
    assert cli(["regressions", "--db", db, "--run", "nope"]) == 1
    assert capsys.readouterr().err.startswith("grace-matrix: error: no run matches 'nope'")


def test_command_loads_expected_file_and_reports_config_errors(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(db).begin() as session:
        seed_history(
            session,
            SyntheticSpec(
                nights=4,
                failures=(
                    SeededFailure("torch-2.9", "correctness", "pyhpc_eos", "grace", "fail_to_run", "boom", 3),
                ),
            ),
        )
    assert cli(["regressions", "--db", db]) == 1
    capsys.readouterr()
    (tmp_path / "expected.toml").write_text(
        'format = 1\n[[expected]]\ncells = "torch-2.9"\nsuite = "correctness"\nworkload = "pyhpc_eos"\n'
        'mode = "grace"\nstatus = "fail_to_run"\nreason = "known: tracked upstream"\n'
    )
    assert cli(["regressions", "--db", db]) == 0  # now an expected failure (XFAIL)
    assert "1 XFAIL" in capsys.readouterr().out
    assert cli(["regressions", "--db", db, "--no-expected"]) == 0  # the store kept the synced table
    capsys.readouterr()
    (tmp_path / "bad.toml").write_text("format = 1\n[[expected]]\nsuite = 'nope'\n")
    assert cli(["regressions", "--db", db, "--expected", str(tmp_path / "bad.toml")]) == 2
    assert "bad.toml" in capsys.readouterr().err
    assert cli(["regressions", "--db", db, "--thresholds", str(tmp_path / "absent.toml")]) == 2
    assert "cannot read thresholds file" in capsys.readouterr().err


def test_commands_are_registered() -> None:
    assert {"regressions", "dashboard"} <= set(COMMAND_MODULES)


def test_seed_demo_clones_the_latest_run(db: str) -> None:
    factory = open_store(db)
    with factory.begin() as session:
        seeded = seed_demo(session)  # empty store: a synthetic history first
    with factory() as session:
        rep = report.detect(session, TH, run_spec=seeded.run_uid)
    (cell,) = rep.cells
    kinds = {(r.kind.value, r.key.workload, r.key.mode) for r in cell.regressions}
    assert ("performance", *seeded.regression) in kinds
    assert ("status", seeded.pi_subject, seeded.pi_stage) in kinds
    assert cell.comparison is not None and len(cell.comparison.regressions) == 1  # nothing else moved


def test_gradual_drift_that_pairwise_misses_is_a_new_history_regression() -> None:
    # +3% a night for three nights: every night stays inside the 5% pairwise band; the level moved ~9%
    ramp = tuple(SeededRegression("torch-2.11", "pyhpc_eos", "grace", 1.03, night) for night in (10, 11, 12))
    factory = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SyntheticSpec(nights=20, night_noise=0.005, regressions=ramp))
    alerts = []
    with factory() as session:
        for night in range(1, 21):
            rep = report.detect(session, TH, run_spec=f"synthetic-nightly-2026-01-{night:02d}")
            alerts += [(night, r.kind.value, r.new) for r in rep.regressions if r.key.workload == "pyhpc_eos"]
    kinds = {kind for _, kind, _ in alerts}
    assert kinds == {"history"}, alerts
    assert [(kind, new) for _, kind, new in alerts] == [("history", True)]
