"""Status against expected (matrix.regressions.status) and expected.toml (matrix.regressions.expected)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from matrix.regressions.errors import RegressionsConfigError
from matrix.regressions.expected import expectations_from_mapping, load_expected_file, sync_expected
from matrix.regressions.loader import load_expectations
from matrix.regressions.observations import Observation, ResultKey, Suite
from matrix.regressions.status import Expectation, Verdict, failing, judge_run
from matrix.store.db import open_store
from matrix.store.models import ExpectedStatus

FAIL_ON = ("FAIL", "MISSING")


def obs(workload: str, mode: str, status: str, suite: Suite = Suite.CORRECTNESS) -> Observation:
    return Observation(ResultKey(suite, workload, mode), status, f"t::test[{workload}-{mode}]", "msg")


def expect(
    workload: str,
    mode: str,
    status: str,
    flaky: bool = False,
    cells: str = "*",
    suite: Suite = Suite.CORRECTNESS,
) -> Expectation:
    return Expectation(cells, suite, workload, mode, status, flaky, "because")


def verdicts(findings):
    return {(f.key.workload, f.key.mode): f.verdict for f in findings}


def test_pass_xfail_fail_improved() -> None:
    expectations = [expect("b", "grace", "fail_to_run"), expect("c", "grace", "fail_accuracy")]
    findings = judge_run(
        "torch-2.11",
        [
            obs("a", "grace", "pass"),
            obs("b", "grace", "fail_to_run"),
            obs("c", "grace", "pass"),
            obs("d", "grace", "fail_accuracy"),
        ],
        expectations,
    )
    assert verdicts(findings) == {
        ("a", "grace"): Verdict.PASS,
        ("b", "grace"): Verdict.XFAIL,
        ("c", "grace"): Verdict.IMPROVED,
        ("d", "grace"): Verdict.FAIL,
    }
    assert [f.key.workload for f in failing(findings, FAIL_ON)] == ["d"]


def test_a_different_failure_than_expected_is_a_fail() -> None:
    findings = judge_run("c", [obs("b", "m", "OOM")], [expect("b", "m", "fail_accuracy")])
    assert verdicts(findings) == {("b", "m"): Verdict.FAIL}


@pytest.mark.parametrize("actual", ["pass", "fail_accuracy", "fail_to_run", "OOM", "skip"])
@pytest.mark.parametrize("expected", ["pass", "fail_accuracy", "skip"])
def test_flaky_entries_never_fail(actual: str, expected: str) -> None:
    entry = expect("w", "grace", expected, flaky=True)
    findings = judge_run("torch-2.11", [obs("w", "grace", actual)], [entry])
    assert failing(findings, FAIL_ON) == []
    (finding,) = findings
    if actual == expected:
        assert finding.verdict in {Verdict.PASS, Verdict.XFAIL}
    else:
        assert finding.verdict is Verdict.FLAKY
        # even a policy that asks every verdict to fail cannot make a flaky mismatch fail
        assert failing(findings, [v.value for v in Verdict]) == []


def test_flaky_entry_absent_from_the_run_is_flaky_not_missing() -> None:
    findings = judge_run("c", [obs("other", "grace", "pass")], [expect("w", "grace", "pass", flaky=True)])
    assert verdicts(findings)[("w", "grace")] is Verdict.FLAKY
    assert failing(findings, FAIL_ON) == []


def test_missing_from_expected_file_and_from_baseline() -> None:
    base_keys = {ResultKey(Suite.CORRECTNESS, "gone", "grace"), ResultKey(Suite.PERFORMANCE, "p", "grace")}
    entries = [expect("listed", "grace", "pass"), expect("gpu-only", "pt2cg", "fail_to_run")]
    findings = judge_run("c", [obs("a", "grace", "pass")], entries, base_keys)
    v = verdicts(findings)
    assert v[("gone", "grace")] is Verdict.MISSING
    assert v[("listed", "grace")] is Verdict.MISSING
    # the run produced no pt2cg result at all (a CPU run of a cell): its expected failure is not missing
    assert ("gpu-only", "pt2cg") not in v
    # the run produced no performance results at all: a correctness-only run is not missing perf
    assert ("p", "grace") not in v


def test_expected_skip_that_left_no_record_is_not_missing() -> None:
    findings = judge_run("c", [obs("a", "grace", "pass")], [expect("s", "grace", "skip")])
    assert ("s", "grace") not in verdicts(findings)


def test_skip_without_entry_is_informational_but_explicit_pass_makes_it_fail() -> None:
    assert verdicts(judge_run("c", [obs("a", "grace", "skip")], []))[("a", "grace")] is Verdict.SKIP
    explicit = judge_run("c", [obs("a", "grace", "skip")], [expect("a", "grace", "pass")])
    assert verdicts(explicit)[("a", "grace")] is Verdict.FAIL


def test_most_specific_entry_wins_and_cell_patterns_apply() -> None:
    entries = [
        expect("*", "grace", "fail_to_run", cells="torch-2.4*"),
        expect("xlnet", "grace", "pass", cells="torch-2.4*"),
    ]
    on_old = judge_run(
        "torch-2.4", [obs("xlnet", "grace", "pass"), obs("mt5", "grace", "fail_to_run")], entries
    )
    assert verdicts(on_old) == {("xlnet", "grace"): Verdict.PASS, ("mt5", "grace"): Verdict.XFAIL}
    on_new = judge_run("torch-2.11", [obs("mt5", "grace", "fail_to_run")], entries)
    assert verdicts(on_new) == {("mt5", "grace"): Verdict.FAIL}


def test_performance_and_pi_passing_statuses() -> None:
    findings = judge_run(
        "c",
        [obs("w", "grace", "ok", Suite.PERFORMANCE), obs("kernel", "assemble", "fail", Suite.PI)],
        [],
    )
    assert verdicts(findings) == {("w", "grace"): Verdict.PASS, ("kernel", "assemble"): Verdict.FAIL}


def test_a_key_recorded_twice_that_failed_once_has_failed() -> None:
    findings = judge_run(
        "c", [obs("a", "m", "pass"), obs("a", "m", "fail_accuracy"), obs("a", "m", "pass")], []
    )
    assert verdicts(findings) == {("a", "m"): Verdict.FAIL}


def test_expected_file_round_trip_into_the_store(tmp_path: Path) -> None:
    path = tmp_path / "expected.toml"
    path.write_text(
        'format = 1\n[[expected]]\ncells = "torch-2.4*"\nsuite = "correctness"\nworkload = "maskrcnn"\n'
        'mode = "pt2cg"\nstatus = "fail_to_run"\nreason = "no mutation support before 2.5"\n'
        '[[expected]]\nsuite = "pi"\nworkload = "*"\nmode = "vendor_update"\nstatus = "skip"\nflaky = true\n'
        'reason = "needs CUDA 12.4"\n'
    )
    entries = load_expected_file(path)
    assert entries[0] == Expectation(
        "torch-2.4*",
        Suite.CORRECTNESS,
        "maskrcnn",
        "pt2cg",
        "fail_to_run",
        False,
        "no mutation support before 2.5",
    )
    store = open_store("sqlite://")
    with store.begin() as session:
        session.add(ExpectedStatus(cell_pattern="old", suite="pi", workload="x", mode="load", status="pass"))
    with store.begin() as session:
        assert sync_expected(session, entries) == 2
    with store() as session:
        assert load_expectations(session) == entries
        assert len(session.execute(select(ExpectedStatus)).all()) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"expected": []}, "missing 'format = 1'"),
        ({"format": 2}, "newer than this reader"),
        ({"format": 1, "rows": []}, "unknown top-level keys"),
        (
            {
                "format": 1,
                "expected": [{"suite": "perf", "workload": "a", "mode": "m", "status": "ok", "reason": "r"}],
            },
            "suite 'perf'",
        ),
        (
            {
                "format": 1,
                "expected": [
                    {"suite": "correctness", "workload": "a", "mode": "m", "status": "ok", "reason": "r"}
                ],
            },
            "not a correctness status",
        ),
        (
            {
                "format": 1,
                "expected": [
                    {"suite": "pi", "workload": "a", "mode": "ptxas", "status": "fail", "reason": "r"}
                ],
            },
            "PI stage 'ptxas'",
        ),
        (
            {"format": 1, "expected": [{"suite": "pi", "workload": "a", "mode": "load", "status": "fail"}]},
            "'reason' must be",
        ),
        (
            {
                "format": 1,
                "expected": [
                    {
                        "suite": "pi",
                        "workload": "a",
                        "mode": "load",
                        "status": "fail",
                        "reason": "r",
                        "flaky": "yes",
                    }
                ],
            },
            "'flaky' must be",
        ),
        (
            {
                "format": 1,
                "expected": [
                    {
                        "suite": "pi",
                        "workload": "a",
                        "mode": "load",
                        "status": "fail",
                        "reason": "r",
                        "why": 1,
                    }
                ],
            },
            "unknown keys",
        ),
        (
            {
                "format": 1,
                "expected": [
                    {"suite": "pi", "workload": "a", "mode": "load", "status": "fail", "reason": "r"}
                ]
                * 2,
            },
            "duplicates expected[0]",
        ),
    ],
)
def test_malformed_expected_data_gives_one_clear_error(data: dict, message: str) -> None:
    with pytest.raises(RegressionsConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expectations_from_mapping(data, "expected.toml")


def test_unreadable_and_invalid_expected_files(tmp_path: Path) -> None:
    with pytest.raises(RegressionsConfigError, match="cannot read expected statuses"):
        load_expected_file(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("format = = 1")
    with pytest.raises(RegressionsConfigError, match="not valid TOML"):
        load_expected_file(bad)


def test_repository_expected_file_is_valid() -> None:
    root = Path(__file__).resolve().parent.parent
    load_expected_file(root / "expected.toml")
