"""The training view of ``grace-matrix report`` (matrix/training.py, matrix/training_report.py) over a
store of ingested training and inference results (tests/training_results.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from training_results import (
    AMP_MS,
    BERT_MS,
    CELL,
    FAILED_REASON,
    INFERENCE_MS,
    OTHER_CELL,
    PEAKS,
    TRAIN_MS,
    training_store,
)
from training_results import PHASES as RECORDED_PHASES

from matrix.report import build_report
from matrix.store.db import open_store
from matrix.training import PHASES, TRAINING_TAG, inference_twin, is_training, phases_of
from matrix.training_report import TrainingView, build_training, geomean, training_names
from matrix_cli.main import main


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return training_store(tmp_path_factory.mktemp("training"))


@pytest.fixture(scope="module")
def view(url: str) -> TrainingView:
    with open_store(url)() as session:
        return build_training(build_report(session))


def _workload(view: TrainingView, name: str, cell: str = CELL):  # type: ignore[no-untyped-def]
    (found,) = [w for w in view.of_workload(name) if w.cell == cell]
    return found


def test_training_is_what_the_suites_tag_and_name() -> None:
    from suites.training import PHASES as SUITE_PHASES
    from suites.workloads import Tag, all_workloads

    assert Tag.TRAINING.value == TRAINING_TAG
    assert tuple(p.removeprefix("train.") for p in SUITE_PHASES) == PHASES
    names = {w.name: w for w in all_workloads()}
    training = [w for w in names.values() if Tag.TRAINING in w.tags]
    assert training and all(is_training([t.value for t in w.tags]) for w in training)
    for w in training:
        base = w.size("smoke").get("base")
        if base is not None:  # built from an inference workload: the naming rule must find it
            assert inference_twin(w.name) == base, w.name
        twin = inference_twin(w.name)
        assert twin is not None and (twin not in names or Tag.TRAINING not in names[twin].tags), w.name
    assert not any(is_training([t.value for t in w.tags]) for w in names.values() if w not in training)


def test_naming_rule_edges() -> None:
    assert inference_twin("DistilGPT2_train_amp") == "DistilGPT2"
    assert inference_twin("a_train_b_train") == "a_train_b"
    for outside in ("DistilGPT2", "_train", "model_trainer", "model_train_", "model_train_a_b"):
        assert inference_twin(outside) is None, outside


def test_rows_of_training_workloads_carry_their_phases(url: str) -> None:
    with open_store(url)() as session:
        report = build_report(session, workloads=["DistilGPT2*"])
    rows = {(r.workload, r.mode): r for r in report.rows}
    assert not rows[("DistilGPT2", "grace")].training and rows[("DistilGPT2", "grace")].phases == ()
    grace = rows[("DistilGPT2_train", "grace")]
    assert grace.training
    assert {p.phase: p.kernels_in_graphs for p in grace.phases} == RECORDED_PHASES["grace"]
    assert [p.phase for p in grace.phases] == list(PHASES)
    assert (
        rows[("DistilGPT2_train_amp", "grace")].training
        and rows[("DistilGPT2_train_amp", "grace")].phases == ()
    )


def test_phases_of_keeps_only_what_was_recorded() -> None:
    (only,) = phases_of({"phases": {"backward": {"kernels_in_graphs": 3, "graph_launches": "x"}}})
    assert (only.phase, only.kernels_in_graphs, only.kernel_launches, only.graph_launches) == (
        "backward",
        3,
        None,
        None,
    )
    assert phases_of({}) == () and phases_of(None) == () and phases_of({"phases": []}) == ()


def test_training_workloads_pair_with_their_inference_twin_in_the_same_cell(view: TrainingView) -> None:
    train = _workload(view, "DistilGPT2_train")
    assert train.twin is not None and (train.twin.workload, train.twin.tier) == ("DistilGPT2", "standard")
    assert train.twin.grace_vs_pt2cg == pytest.approx(INFERENCE_MS["pt2cg"] / INFERENCE_MS["grace"])
    assert _workload(view, "DistilGPT2_train_amp").twin == train.twin
    assert train.twin.run_uid != train.run_uid  # each side from the run that has it
    assert _workload(view, "BertForMaskedLM_train").twin is None  # no inference workload of that model
    assert _workload(view, "XLNetLMHeadModel_train", OTHER_CELL).twin is None  # twins never cross cells
    assert view.trained_from("DistilGPT2") == ("DistilGPT2_train", "DistilGPT2_train_amp")
    assert [c.cell for c in view.cells] == sorted([CELL, OTHER_CELL])
    assert not view.of_workload("DistilGPT2")  # an inference workload is no training workload


def test_speedups_within_the_run_and_against_the_faster_baseline(view: TrainingView) -> None:
    grace = _workload(view, "DistilGPT2_train").mode("grace")
    assert grace is not None and grace.median_ms == TRAIN_MS["grace"]
    assert grace.speedup_vs_pt2cg == pytest.approx(TRAIN_MS["pt2cg"] / TRAIN_MS["grace"])
    best = min(("inductor", "pt2cg"), key=TRAIN_MS.__getitem__)
    assert grace.best_baseline == best
    assert grace.speedup_vs_best == pytest.approx(TRAIN_MS[best] / TRAIN_MS["grace"])
    assert grace.mem_vs_pt2cg == pytest.approx(PEAKS["grace"] / PEAKS["pt2cg"])
    assert {p: grace.kernels_in_graphs_of(p) for p in PHASES} == RECORDED_PHASES["grace"]
    amp = _workload(view, "DistilGPT2_train_amp").mode("grace")
    assert amp is not None and amp.best_baseline == "pt2cg"  # no inductor timed: pt2cg alone
    assert amp.speedup_vs_best == amp.speedup_vs_pt2cg == pytest.approx(AMP_MS["pt2cg"] / AMP_MS["grace"])


def test_missing_phases_and_memory_stay_missing(view: TrainingView) -> None:
    amp = _workload(view, "DistilGPT2_train_amp")
    assert amp.phases == ()
    for mode in amp.modes:
        assert all(mode.kernels_in_graphs_of(p) is None for p in PHASES)
        assert mode.calls_peak_mem is None and mode.mem_vs_pt2cg is None


def test_a_failed_training_record_shows_as_failed(view: TrainingView) -> None:
    bert = _workload(view, "BertForMaskedLM_train")
    grace, pt2cg = bert.mode("grace"), bert.mode("pt2cg")
    assert grace is not None and grace.failed and grace.status == "fail_to_run"
    assert grace.reason == FAILED_REASON and grace.median_ms is None and grace.speedup_vs_pt2cg is None
    assert pt2cg is not None and not pt2cg.failed and pt2cg.median_ms == BERT_MS["pt2cg"]
    assert bert.grace_vs_pt2cg is None


def test_geomean_over_the_training_workloads_of_a_cell(view: TrainingView) -> None:
    (cell,) = [c for c in view.cells if c.cell == CELL]
    ratios = [TRAIN_MS["pt2cg"] / TRAIN_MS["grace"], AMP_MS["pt2cg"] / AMP_MS["grace"]]  # Bert's grace failed
    assert cell.geomean_workloads == len(ratios)
    assert cell.geomean_vs_pt2cg == pytest.approx(math.prod(ratios) ** (1 / len(ratios)))
    assert cell.twin_geomean_workloads == 1  # DistilGPT2, the twin of both, counted once
    assert cell.twin_geomean_vs_pt2cg == pytest.approx(INFERENCE_MS["pt2cg"] / INFERENCE_MS["grace"])
    assert geomean([]) is None and geomean([4.0, 1.0]) == pytest.approx(2.0)


def test_training_names_select_the_training_workloads_and_their_twins(url: str) -> None:
    with open_store(url)() as session:
        names = training_names(session)
        full = build_training(build_report(session))
        narrow = build_training(build_report(session, workloads=names))
    assert "DistilGPT2" in names and "XLNetLMHeadModel" not in names  # only twins the store holds
    assert narrow == full


def _table(section: str) -> dict[tuple[str, str], dict[str, str]]:
    """The first table of a text section: (workload, mode) -> column -> cell text."""
    header, *lines = section.splitlines()[1:]
    columns = header.split()
    table = {}
    for line in lines:
        if not line or line.startswith("failed:"):
            break
        values = dict(zip(columns, re.split(r"\s{2,}", line.strip()), strict=True))
        table[(values["workload"], values["mode"])] = values
    return table


def test_report_command_prints_and_exports_the_training_view(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--db", url]) == 0
    text = capsys.readouterr().out
    section = text[text.index(f"training, cell {CELL}:") :]
    table = _table(section)
    assert table[("BertForMaskedLM_train", "grace")]["status"] == "fail_to_run"
    assert table[("BertForMaskedLM_train", "grace")]["median_ms"] == "-"
    assert f"BertForMaskedLM_train / grace: fail_to_run: {FAILED_REASON}" in section
    amp = table[("DistilGPT2_train_amp", "grace")]
    assert all(amp[f"kernels_in_graphs_{p}"] == "-" for p in PHASES) and amp["twin"] == "DistilGPT2"
    train = table[("DistilGPT2_train", "grace")]
    assert [train[f"kernels_in_graphs_{p}"] for p in PHASES] == [
        str(RECORDED_PHASES["grace"][p]) for p in PHASES
    ]
    assert main(["report", "--db", url, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    cells = {c["cell"]: c for c in document["training"]["cells"]}
    train = next(w for w in cells[CELL]["workloads"] if w["workload"] == "DistilGPT2_train")
    assert train["twin"]["workload"] == "DistilGPT2"
    grace = next(m for m in train["modes"] if m["mode"] == "grace")
    assert {p["phase"]: p["kernels_in_graphs"] for p in grace["phases"]} == RECORDED_PHASES["grace"]
    rows = {(r["workload"], r["mode"]): r for r in document["rows"]}
    assert rows[("DistilGPT2_train", "grace")]["training"] and not rows[("DistilGPT2", "grace")]["training"]


def test_no_training_workload_no_training_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = training_store(tmp_path)
    assert main(["report", "--db", url, "--workload", "DistilGPT2"]) == 0
    assert "training, cell" not in capsys.readouterr().out
    assert main(["report", "--db", url, "--workload", "DistilGPT2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["cells"] == []
