"""The command line as a person first meets it: a version, a description per subcommand, the options
the help promises, and a selection that matches nothing said as an error (one line, non-zero exit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.regressions.synthetic import SyntheticSpec, seed_history
from matrix.store.db import open_store
from matrix_cli.main import build_parser, main


def test_version_is_printed_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("grace-matrix ")


def test_every_subcommand_has_a_description() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    missing = [name for name, sub in subparsers.choices.items() if not sub.description]
    assert not missing


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url).begin() as session:
        seed_history(session, SyntheticSpec(nights=2))
    return url


def test_a_selection_that_matches_nothing_is_one_error_line(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("summary", "report"):
        assert main([command, "--db", store, "--cell", "nosuch"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"grace-matrix: error: no {'run' if command == 'summary' else 'result'} in the "
                       "store matches --cell nosuch"]  # fmt: skip
    assert main(["summary", "--db", store]) == 0  # no selection: every cell's latest run
    target = tmp_path / "export.jsonl"
    assert main(["export", "--db", store, "--label", "nosuch", "-o", str(target)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["grace-matrix: error: no run in the store matches --label nosuch"]
    assert not target.exists()  # a typo writes no empty export


def test_report_reads_several_export_files_after_one_input_option(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["export", "--db", store, "-o", str(first)]) == 0
    assert main(["export", "--db", store, "-o", str(second)]) == 0
    capsys.readouterr()
    assert main(["report", "--input", str(first), str(second)]) == 0
    assert "workload" in capsys.readouterr().out


def test_nightly_takes_cell_like_the_other_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["nightly", "--cell", "current", "--cells", "torch-2.9,torch-2.10"])
    assert args.cells == ["current", "torch-2.9,torch-2.10"]
