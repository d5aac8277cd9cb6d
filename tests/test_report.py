"""``grace-matrix report`` and ``results-doc`` (matrix/report.py) over a small store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from report_store import Store

from matrix.report import build_report, render_markdown, render_text, speedup
from matrix_cli.commands import COMMAND_MODULES, results_doc
from matrix_cli.commands import report as report_command


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path)


def rows_by_mode(report: Any, workload: str) -> dict[str, Any]:
    return {row.mode: row for row in report.rows if row.workload == workload}


def test_speedup() -> None:
    assert speedup(2.0, 1.0) == 2.0
    assert speedup(None, 1.0) is None and speedup(1.0, None) is None and speedup(0.0, 1.0) is None


def test_speedups_within_one_run(store: Store) -> None:
    with store.Session.begin() as session:
        cell = store.cell(session)
        run = store.run(session, cell, 0)
        store.results(session, run, "XLNet", {"eager": 4.0, "inductor": 2.0, "pt2cg": 1.0, "grace": 0.8})
    with store.Session() as session:
        report = build_report(session)
    rows = rows_by_mode(report, "XLNet")
    assert list(rows) == ["eager", "inductor", "pt2cg", "grace"]  # canonical mode order
    assert rows["eager"].speedup_vs_inductor == pytest.approx(0.5)
    assert rows["inductor"].speedup_vs_inductor == pytest.approx(1.0)
    assert rows["grace"].speedup_vs_inductor == pytest.approx(2.5)
    assert rows["grace"].speedup_vs_pt2cg == pytest.approx(1.25)
    assert rows["pt2cg"].kernels_in_graphs == 7 and rows["pt2cg"].copy_bytes_per_replay == 4096
    assert rows["grace"].status == "pass" and rows["grace"].run_uid == run.uid


def test_memory_after_the_compiling_call_against_pt2cg(store: Store) -> None:
    mib = 1 << 20
    peaks = {"inductor": 30 * mib, "pt2cg": 40 * mib, "grace": 42 * mib}
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        details = {
            mode: {"calls_peak_mem_bytes": peak, "calls_peak_reserved_bytes": 2 * peak}
            for mode, peak in peaks.items()
        }
        store.results(session, run, "alexnet", {"eager": 1.0, **dict.fromkeys(peaks, 0.5)}, details=details)
    with store.Session() as session:
        report = build_report(session)
    rows = rows_by_mode(report, "alexnet")
    assert rows["grace"].calls_peak_mem == 42 * mib and rows["grace"].mem_vs_pt2cg == pytest.approx(1.05)
    assert rows["eager"].calls_peak_mem is None and rows["eager"].mem_vs_pt2cg is None
    assert rows["pt2cg"].mem_vs_pt2cg == pytest.approx(1.0)
    assert rows["grace"].calls_peak_reserved == 84 * mib and rows["grace"].reserved_vs_pt2cg == pytest.approx(
        1.05
    )
    assert rows["eager"].calls_peak_reserved is None and rows["eager"].reserved_vs_pt2cg is None
    text = render_text(report).splitlines()
    line = next(line for line in text if line.startswith("alexnet") and " grace " in line)
    assert line.split()[-6:] == ["42.0", "MiB", "1.05x", "84.0", "MiB", "1.05x"]


def test_modes_against_the_raw_graph_reference_of_the_same_run(store: Store) -> None:
    """vs_raw, host_overhead_us and the back-to-back figures come from the raw-graph reference timed in
    the same run; its columns appear only in tables of runs that timed one."""
    medians = {"pt2cg": 0.240, "grace": 0.120, "raw-graph": 0.020, "raw-graph-copy": 0.050}
    b2b = {"pt2cg": 0.100, "grace": 0.030, "raw-graph": 0.010, "raw-graph-copy": 0.020}
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        details = {mode: {"b2b_ms_median": value} for mode, value in b2b.items()}
        store.results(session, run, "seed", medians, details=details)
        store.results(session, run, "mlp", {"inductor": 1.0, "grace": 0.5})
    with store.Session() as session:
        report = build_report(session)
    rows = rows_by_mode(report, "seed")
    assert rows["grace"].vs_raw == pytest.approx(6.0) and rows["grace"].b2b_vs_raw == pytest.approx(3.0)
    assert rows["grace"].host_overhead_us == pytest.approx(100.0) and rows["grace"].b2b_ms == pytest.approx(
        0.03
    )
    assert rows["raw-graph"].vs_raw == pytest.approx(1.0) and rows["raw-graph"].host_overhead_us == 0.0
    assert rows["pt2cg"].host_overhead_us == pytest.approx(220.0)
    assert rows_by_mode(report, "mlp")["grace"].vs_raw is None  # no reference for that workload
    header = next(line for line in render_text(report).splitlines() if line.startswith("workload"))
    assert header.split()[-4:] == ["b2b_ms", "vs_raw", "b2b_vs_raw", "host_overhead_us"]


def test_tables_without_a_reference_keep_their_columns(store: Store) -> None:
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        store.results(session, run, "mlp", {"inductor": 1.0, "grace": 0.5})
    with store.Session() as session:
        text = render_text(build_report(session))
    header = next(line for line in text.splitlines() if line.startswith("workload"))
    assert "vs_raw" not in header and header.split()[-3:] == [
        "mem_vs_pt2cg",
        "calls_peak_reserved",
        "reserved_vs_pt2cg",
    ]


def test_missing_or_skipped_baseline_gives_none(store: Store) -> None:
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        store.results(session, run, "mlp", {"eager": 1.0, "inductor": None, "grace": 0.5})
    with store.Session() as session:
        rows = rows_by_mode(build_report(session), "mlp")
    assert rows["inductor"].median_ms is None and rows["inductor"].perf_status == "skip"
    assert all(r.speedup_vs_inductor is None and r.speedup_vs_pt2cg is None for r in rows.values())


def test_never_mixes_runs(store: Store) -> None:
    with store.Session.begin() as session:
        cell = store.cell(session)
        old = store.run(session, cell, 0)
        new = store.run(session, cell, 10)
        store.results(session, old, "dlrm", {"inductor": 2.0, "grace": 1.0})
        store.results(session, old, "alexnet", {"inductor": 3.0, "pt2cg": 1.5})
        store.results(session, new, "dlrm", {"grace": 0.9})  # the newer run lacks inductor for dlrm
    with store.Session() as session:
        report = build_report(session)
    dlrm, alexnet = rows_by_mode(report, "dlrm"), rows_by_mode(report, "alexnet")
    assert list(dlrm) == ["grace"] and dlrm["grace"].run_uid == new.uid
    assert dlrm["grace"].speedup_vs_inductor is None  # not computed against the old run's inductor
    assert alexnet["pt2cg"].run_uid == old.uid and alexnet["pt2cg"].speedup_vs_inductor == pytest.approx(2.0)
    assert [r.uid for r in report.runs] == [old.uid, new.uid]


def test_selection_by_run_cell_and_workload(store: Store) -> None:
    with store.Session.begin() as session:
        a, b = store.cell(session, "torch-2.11"), store.cell(session, "torch-2.9")
        run_a, run_b = store.run(session, a, 0), store.run(session, b, 1)
        store.results(session, run_a, "mlp", {"eager": 1.0})
        store.results(session, run_b, "mlp", {"eager": 2.0})
        store.results(session, run_b, "dlrm", {"eager": 2.0})
    with store.Session() as session:
        assert build_report(session).cells() == ["torch-2.11", "torch-2.9"]
        assert build_report(session, cells=["torch-2.9"]).cells() == ["torch-2.9"]
        assert {r.run_uid for r in build_report(session, uids=[run_a.uid]).rows} == {run_a.uid}
        assert {r.workload for r in build_report(session, workloads=["dl*"]).rows} == {"dlrm"}
        assert build_report(session, labels=["none"]).rows == ()


def test_text_and_markdown(store: Store) -> None:
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        store.results(
            session, run, "speech", {"inductor": 2.0, "grace": 1.0},
            correctness={"grace": "fail_accuracy"}, reasons={"grace": "max_abs=3 | <script>"},
        )  # fmt: skip
    with store.Session() as session:
        report = build_report(session)
    text = render_text(report)
    assert "cell torch-2.11: torch 2.11.0, triton 3.6.0, CUDA 13.0, NVIDIA H200" in text
    assert "2.00x" in text and "4.0 KiB" in text
    assert "not passing:\n  speech / grace: fail_accuracy: max_abs=3 | <script>" in text
    markdown = render_markdown(report)
    assert "Do not edit by hand" in markdown and "| speech | standard | grace | fail_accuracy |" in markdown
    assert "max_abs=3 \\| &lt;script&gt;" in markdown  # escaped, one line
    assert "No results" in render_markdown(build_report_empty(store))


def build_report_empty(store: Store) -> Any:
    with store.Session() as session:
        return build_report(session, uids=["nope"])


def namespace(store: Store, **kw: Any) -> argparse.Namespace:
    return argparse.Namespace(db=store.url, json=False, run=[], label=[], cell=[], workload=[], **kw)


def test_commands(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert {"report", "results_doc"} <= set(COMMAND_MODULES)
    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        store.results(session, run, "mlp", {"inductor": 2.0, "pt2cg": 1.0})
    args = namespace(store)
    args.json = True
    assert report_command.handle(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == 1 and data["columns"][0] == "status"
    assert {r["mode"]: r["speedup_vs_inductor"] for r in data["rows"]} == {"inductor": 1.0, "pt2cg": 2.0}
    assert report_command.handle(namespace(store)) == 0
    assert "pt2cg" in capsys.readouterr().out
    target = tmp_path / "docs" / "RESULTS.md"
    assert results_doc.handle(namespace(store, output=str(target))) == 0
    assert "| mlp | standard | pt2cg | pass |" in target.read_text()


def test_register_adds_parsers() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    report_command.register(sub)
    results_doc.register(sub)
    args = parser.parse_args(["report", "--cell", "torch-2.11", "--workload", "dl*"])
    assert args.handler is report_command.handle and args.cell == ["torch-2.11"]
    args = parser.parse_args(["results-doc", "-o", "-"])
    assert args.handler is results_doc.handle and args.output == "-"


def test_report_over_export_files(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matrix.transfer", reason="needs the export format of grace-matrix export")
    from matrix_cli.main import main

    with store.Session.begin() as session:
        run = store.run(session, store.cell(session), 0)
        store.results(session, run, "mlp", {"inductor": 3.0, "grace": 1.0})
    export = tmp_path / "results.jsonl"
    assert main(["export", "--db", store.url, "-o", str(export)]) == 0
    capsys.readouterr()
    assert main(["report", "--input", str(export), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["mode"]: r["speedup_vs_inductor"] for r in rows} == {"inductor": 1.0, "grace": 3.0}
    assert main(["report", "--input", str(tmp_path / "missing.jsonl")]) == 2
