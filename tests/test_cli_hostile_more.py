"""More hostile input for the command line: each test is one finding of a probe of ``grace-matrix``.

A value ingest took that every later read of the store crashed on (a latency of zero or NaN, samples
that are not numbers, a run status nobody knows), a store whose folder is a file, a seed factor or a
run label that poisons the store, an output that is a device: one error line, exit 2, nothing changed.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import export_run_line, one_error_line

from matrix_cli.main import main

UID = "00000000-0000-0000-0000-0000000000aa"
MATRIX = str(Path(__file__).resolve().parents[1] / "matrix.toml")


def _lines(run: dict[str, object] | None = None, perf: dict[str, object] | None = None) -> list[str]:
    header = {"format": "grace-matrix-export", "version": 1, "schema": "0002"}
    run_line = {**export_run_line(UID), **(run or {})}
    perf_line = {
        "type": "performance_results",
        "run": UID,
        "record_key": "performance/mlp/grace",
        "mode": "grace",
        "status": "ok",
        "samples_ms": [1.0, 1.1, 0.9],
        "median_ms": 1.0,
        "workload": {"name": "mlp", "code_hash": "h"},
        **(perf or {}),
    }
    return [json.dumps(header), json.dumps(run_line), json.dumps(perf_line)]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (_lines(perf={"median_ms": 0}), "'median_ms' of performance_results must be a number above"),
        (_lines(perf={"median_ms": -2.5}), "must be a number above zero"),
        (_lines(perf={"median_ms": 10**400}), "is out of range for a float"),
        (_lines(perf={"samples_ms": ["a", "b"]}), "field 'samples_ms' of performance_results must hold only"),
        (_lines(perf={"samples_ms": [[1.0]]}), "must hold only numbers above zero"),
        (_lines(perf={"samples_ms": [1.0, 0]}), "must hold only numbers above zero"),
        (_lines(run={"status": "weird"}), "field 'status' of runs is str \"weird\", not one of"),
        (_lines(run={"status": ""}), "field 'status' of runs is str \"\", not one of"),
    ],
)
def test_values_every_reader_would_fail_on_are_refused_at_ingest(
    store, tmp_path, capsys, line, expected
) -> None:
    """Such values used to be stored, and summary, regressions, report and the dashboard then exited 3
    with a traceback on every later call."""
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(line) + "\n", encoding="utf-8")
    before = store.read_bytes()
    capsys.readouterr()
    assert main(["ingest", str(path)]) == 2
    assert expected in one_error_line(capsys)
    assert store.read_bytes() == before
    assert main(["summary", "--all"]) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309"])
def test_numbers_json_has_not_are_refused_anywhere_in_a_line(store, tmp_path, capsys, literal) -> None:
    """Python's json reads NaN and Infinity (and 1e309 as infinity); PostgreSQL's JSON and every latency
    reader refuse them: refused in a column and deep inside a JSON object alike, naming the line."""
    header, run, perf = _lines()
    for where, text in (
        (3, perf.replace('"median_ms": 1.0', f'"median_ms": {literal}')),
        (3, perf.replace('"mode": "grace"', f'"details": {{"a": [{literal}]}}, "mode": "grace"')),
    ):
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join([header, run, text]) + "\n", encoding="utf-8")
        capsys.readouterr()
        assert main(["ingest", str(path)]) == 2
        assert f"bad.jsonl:{where}: {literal} is not a finite number" in one_error_line(capsys)
    assert main(["summary", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []


def test_a_header_whose_version_is_true_is_refused(store, tmp_path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format": "grace-matrix-export", "version": true}\n', encoding="utf-8")
    assert main(["ingest", str(path)]) == 2
    assert "export version True is not valid" in one_error_line(capsys)


@pytest.mark.parametrize("command", [["ingest", "{export}"], ["seed-demo"], ["merge", "{store}"]])
def test_a_store_whose_folder_is_a_file_is_one_line(store, tmp_path, capsys, command) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    export = tmp_path / "ok.jsonl"
    export.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    args = [part.format(export=export, store=store) for part in command]
    capsys.readouterr()
    assert main([*args, "--db", f"sqlite:///{blocker / 'x.sqlite'}"]) == 2
    assert "cannot make the folder of store" in one_error_line(capsys)
    assert blocker.read_text() == "kept"


@pytest.mark.parametrize("factor", ["0", "-1", "nan", "inf"])
def test_seed_demo_refuses_a_factor_that_leaves_no_latency(tmp_path, capsys, factor) -> None:
    """A factor of 0 or NaN had stored latencies that every later read crashed on; now nothing is
    written, not even a new store."""
    path = tmp_path / "new" / "store.sqlite"
    assert main(["seed-demo", f"--factor={factor}", "--db", f"sqlite:///{path}"]) == 2
    assert "--factor" in one_error_line(capsys)
    assert not path.parent.exists()


def test_a_label_longer_than_its_column_is_refused_before_anything_is_written(store, capsys) -> None:
    """SQLite kept a 300-character label that PostgreSQL refuses, and the store's own export could not be
    ingested again ('longer than 128 characters')."""
    before = store.read_bytes()
    assert main(["run", "--config", MATRIX, "--label", "x" * 300, "--install-failed", "boom"]) == 2
    assert "run label of 300 characters; give at most 128" in one_error_line(capsys)
    assert store.read_bytes() == before


@pytest.mark.parametrize("timeout", ["0", "-5", "nan"])
def test_nightly_refuses_a_timeout_that_is_no_duration(store, capsys, timeout) -> None:
    assert main(["nightly", "--config", MATRIX, "--via", "run", "--no-report", "--timeout", timeout]) == 2
    assert f"--timeout {float(timeout)}" in one_error_line(capsys)


@pytest.mark.parametrize("command", ["results-doc", "compatibility", "paper-doc", "export"])
def test_an_output_that_is_a_pipe_is_written_through_not_replaced(store, tmp_path, capsys, command) -> None:
    """Documents were written beside the target and renamed over it: ``-o /dev/full`` (as root) replaced
    the device with a regular file. A device or a pipe is now written through, as export did."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open does not block
    try:
        assert main([command, "-o", str(fifo)]) == 0
        assert os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.skipif(
    not (Path("/dev/full").exists() and stat.S_ISCHR(Path("/dev/full").stat().st_mode)), reason="no /dev/full"
)
@pytest.mark.parametrize("command", ["results-doc", "export"])
def test_an_output_that_cannot_take_the_bytes_is_one_line(store, capsys, command) -> None:
    """``export -o /dev/full`` ended in a traceback (ENOSPC); now one line, exit 2, the device kept."""
    assert main([command, "-o", "/dev/full"]) == 2
    assert "/dev/full: cannot write: No space left on device" in one_error_line(capsys)
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ('"9999"', "export of a store at schema 9999, newer than this grace-matrix knows (0002); upgrade"),
        ("2", "export schema 2 is not valid"),
        ('"x; drop"', "export schema 'x; drop' is not valid"),
    ],
)
def test_a_header_of_a_newer_or_malformed_schema_is_one_line(
    store, tmp_path, capsys, schema, expected
) -> None:
    """A newer store's export failed on its first new field ('unknown field') with no hint to upgrade."""
    header, run, perf = _lines()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([header.replace('"0002"', schema), run, perf]) + "\n", encoding="utf-8")
    before = store.read_bytes()
    assert main(["ingest", str(path)]) == 2
    assert expected in one_error_line(capsys)
    assert store.read_bytes() == before


def test_an_export_of_an_older_schema_is_ingested(store, tmp_path, capsys) -> None:
    header, run, perf = _lines()
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join([header.replace('"0002"', '"0001"'), run, perf]) + "\n", encoding="utf-8")
    assert main(["ingest", str(path)]) == 0


@pytest.mark.parametrize("command", ["results-doc", "compatibility", "export"])
def test_an_output_that_is_a_symbolic_link_writes_what_it_points_at(store, tmp_path, command) -> None:
    """The output was renamed over the link, which became a plain file; the link now stays."""
    real = tmp_path / "real.out"
    real.write_text("old\n", encoding="utf-8")
    link = tmp_path / "link.out"
    link.symlink_to(real)
    assert main([command, "-o", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert real.read_text(encoding="utf-8") not in ("", "old\n")


@pytest.mark.parametrize("workers", ["-5", "two", "1.5", ""])
def test_run_refuses_a_worker_count_before_recording_anything(store, capsys, workers) -> None:
    """``run -n -5`` was handed to pytest-xdist, whose refusal was then recorded as a failed run."""
    before = store.read_bytes()
    assert main(["run", "--config", MATRIX, "-n", workers]) == 2
    assert f"-n/--workers {workers!r}: give a number of at least 0" in one_error_line(capsys)
    assert store.read_bytes() == before
    assert main(["nightly", "--config", MATRIX, "--via", "run", "--no-report", "-n", workers]) == 2
    assert f"-n/--workers {workers!r}" in one_error_line(capsys)


@pytest.mark.skipif(
    not (Path("/dev/full").exists() and stat.S_ISCHR(Path("/dev/full").stat().st_mode)), reason="no /dev/full"
)
@pytest.mark.parametrize("command", [["summary"], ["summary", "--json"], ["export"]])
def test_standard_output_that_cannot_take_the_bytes_is_one_line(store, command) -> None:
    """``summary > /dev/full`` ended in a traceback and exit 3 (an internal error); a closed pipe stays
    exit 0 (``| head``)."""
    assert main(["seed-demo"]) == 0
    cli = [sys.executable, "-m", "matrix_cli", *command]
    with open("/dev/full", "w") as full:
        done = subprocess.run(cli, stdout=full, stderr=subprocess.PIPE, text=True, check=False)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["grace-matrix: error: cannot write the output: No space left on device"], done.stderr
    piped = subprocess.run(
        f"{shlex.join(cli)} | head -c 1 > /dev/null; exit ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", stderr=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    assert piped.returncode == 0 and "Traceback" not in piped.stderr, piped.stderr
