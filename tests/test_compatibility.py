"""``grace-matrix compatibility`` (matrix.compatibility, matrix.compatibility_doc) over a small store."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from matrix.compatibility import Part, Verdict, build_table, clean_text
from matrix.compatibility_doc import render_markdown
from matrix.regressions.expected import sync_expected
from matrix.regressions.observations import Suite
from matrix.regressions.status import Expectation
from matrix.store.db import open_store
from matrix.store.models import Cell, CorrectnessResult, Diagnostic, PIStageResult, Run, Workload
from matrix_cli.commands import COMMAND_MODULES
from matrix_cli.main import main

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
LEAKY = "values differ: max abs 0.5 at /home/alice/envs/c/lib/python3.11/site-packages/torch/fx/graph.py:12"
EXPECTED_REASON = "torch 2.4 has no fake CUDA tensors for CGCT (see issue 12)"


class Builder:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.workloads: dict[str, Workload] = {}
        self.minutes = 0

    def run(
        self,
        cell_id: str,
        *,
        kind: str = "venv",
        torch: str | None = "2.11.0",
        triton: str = "3.6.0",
        gpu: str | None = None,
        status: str = "complete",
        label: str | None = None,
        message: str | None = None,
    ) -> Run:
        cell = Cell(
            fingerprint=f"{cell_id}-{gpu}-{torch}", cell_id=cell_id, kind=kind, torch_version=torch,
            triton_version=triton, cuda_runtime="13.0" if gpu else None, gpu_name=gpu,
            python_version="3.11", platform="linux-x86_64",
        )  # fmt: skip
        existing = self.session.query(Cell).filter_by(fingerprint=cell.fingerprint).one_or_none()
        self.minutes += 1
        run = Run(
            uid=str(uuid.UUID(int=self.minutes)), cell=existing or cell, status=status, label=label,
            started_at=T0 + dt.timedelta(minutes=self.minutes), message=message,
        )  # fmt: skip
        self.session.add(run)
        self.session.flush()
        return run

    def correctness(self, run: Run, workload: str, mode: str, status: str = "pass", reason: str = "") -> None:
        if workload not in self.workloads:
            self.workloads[workload] = Workload(name=workload, code_hash="h", tier="smoke", tags=[])
        self.session.add(
            CorrectnessResult(
                run=run, workload=self.workloads[workload], mode=mode, status=status, reason=reason or None,
                record_key=f"c-{workload}-{mode}",
            )
        )  # fmt: skip

    def pi(self, run: Run, subject: str, stage: str, status: str = "pass", message: str = "") -> None:
        self.session.add(
            PIStageResult(
                run=run, subject=subject, stage=stage, status=status, message=message,
                record_key=f"p-{subject}-{stage}", triton_version="3.6.0",
            )
        )  # fmt: skip

    def diagnostic(self, run: Run, workload: str) -> None:
        self.correctness(run, workload, "cgct-fake-cuda")
        self.session.add(
            Diagnostic(
                run=run, workload=self.workloads[workload], mode="cgct-fake-cuda", code="cpu_device",
                record_key=f"d-{workload}",
            )
        )  # fmt: skip


def ptx_passes(b: Builder, run: Run) -> None:
    for stage in ("locate", "rewrite", "assemble"):
        b.pi(run, "triton_poi_fused_add_0", stage)


def seed(session: Session) -> None:
    b = Builder(session)
    # a CPU cell where everything passes (an older run of it failed: superseded)
    old = b.run("torch-2.11")
    b.correctness(old, "mlp", "grace-cpu", "fail_to_run", "an old failure")
    cpu = b.run("torch-2.11")
    for name in ("mlp", "mt5"):
        b.correctness(cpu, name, "grace-cpu")
        b.diagnostic(cpu, name)
        b.correctness(cpu, name, "grace", "skip", "no CUDA device: grace replays CUDA graphs")
    ptx_passes(b, cpu)
    # a CPU cell whose CGCT fails
    cgct = b.run("torch-2.9", torch="2.9.1")
    b.correctness(cgct, "mlp", "grace-cpu")
    b.correctness(cgct, "mlp", "cgct-fake-cuda")
    b.correctness(cgct, "mt5", "cgct-fake-cuda", "fail_accuracy", LEAKY)
    ptx_passes(b, cgct)
    # a cell whose failures expected.toml covers
    known = b.run("torch-2.4", torch="2.4.1")
    b.correctness(known, "mlp", "grace-cpu")
    b.correctness(known, "mt5", "grace-cpu", "fail_to_run", "RuntimeError: no lowering")
    b.correctness(known, "mlp", "cgct-fake-cuda", "fail_to_run", "TypeError: FakeTensorMode()")
    # grace does not import
    broken = b.run("torch-2.5", torch="2.5.1")
    b.correctness(broken, "mlp", "grace-cpu", "skip", "grace cannot be imported: ImportError: no _C")
    # the environment could not be built
    b.run("torch-2.15", torch="2.15.0", status="install_failed", message="no torch==2.15.0 on the index")
    # Triton without torch: PTX checks only, one rewrite failing
    triton = b.run("triton-3.2", kind="triton-only", torch=None, triton="3.2.0")
    b.pi(triton, "k0", "locate")
    b.pi(triton, "k0", "rewrite", "fail", "unknown PTX: ld.param.b64 <script>")
    b.pi(triton, "k0", "assemble", "skip", "ptxas not found")
    # a GPU cell, recorded over two runs sharing a label
    first = b.run("torch-2.11", gpu="NVIDIA H200", label="nightly-1")
    b.correctness(first, "mlp", "grace", "fail_accuracy", "superseded by the re-run")
    second = b.run("torch-2.11", gpu="NVIDIA H200", label="nightly-1")
    b.correctness(second, "mlp", "grace")
    b.correctness(second, "mlp", "grace-cgct")
    b.correctness(second, "mlp", "grace-cgct-pi", "skip", "grace technique unavailable (pi: not ready)")
    ptx_passes(b, second)
    for stage in ("load", "patch", "numeric"):
        b.pi(second, "triton_poi_fused_add_0", stage)
    c, failed = Suite.CORRECTNESS, "fail_to_run"
    expectations = [
        Expectation("torch-2.4*", c, "*", "cgct-fake-cuda", failed, reason=EXPECTED_REASON),
        Expectation("torch-2.4", c, "mt5", "grace-cpu", failed, reason="no lowering in 2.4"),
        Expectation("*", c, "mt5", "cgct-fake-cuda", failed, reason="a status other than the actual one"),
    ]
    sync_expected(session, expectations)


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Session = open_store(url)
    with Session.begin() as session:
        seed(session)
    return url, Session


def table_cells(markdown: str) -> dict[str, list[str]]:
    """Summary-table rows keyed by cell and GPU: the part columns."""
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if match:
            values = [v.strip() for v in match.group(2).split("|")]
            rows[f"{match.group(1)}@{values[3]}"] = values[4:]
    return rows


def test_verdicts_per_cell_and_part(store: tuple[str, sessionmaker[Session]]) -> None:
    with store[1]() as session:
        table = build_table(
            session, order=("torch-2.4", "torch-2.5", "torch-2.9", "torch-2.11", "torch-2.15")
        )
    rows = {f"{r.cell_id}@{r.gpu_name or 'no GPU'}": r for r in table.rows}
    assert list(rows) == [
        "torch-2.4@no GPU",
        "torch-2.5@no GPU",
        "torch-2.9@no GPU",
        "torch-2.11@no GPU",
        "torch-2.11@NVIDIA H200",
        "torch-2.15@no GPU",
        "triton-3.2@no GPU",  # not in the given order: after it
    ]
    cpu = rows["torch-2.11@no GPU"]
    assert [p.text for p in cpu.parts] == ["pass 6/6", "pass 2/2", "pass 2/2", "pass 3/3", "-"]
    assert cpu.part(Part.GPU).note == "no GPU in this cell"
    cgct = rows["torch-2.9@no GPU"].part(Part.CGCT)
    assert cgct.verdict is Verdict.FAIL and cgct.text == "FAIL 1/2"
    (failure,) = cgct.failures
    assert failure.subject == "mt5 / cgct-fake-cuda" and failure.status == "fail_accuracy"
    assert "/home/alice" not in failure.reason and "<site-packages>/torch/fx/graph.py:12" in failure.reason
    known = rows["torch-2.4@no GPU"]
    assert known.part(Part.BACKEND).text == "partial 1/2"
    assert (
        known.part(Part.CGCT).verdict is Verdict.EXPECTED_FAIL
        and known.part(Part.CGCT).text == "expected 0/1"
    )
    (expected,) = known.part(Part.CGCT).failures
    assert expected.expected and expected.reason == EXPECTED_REASON
    assert expected.message == "TypeError: FakeTensorMode()"
    broken = rows["torch-2.5@no GPU"]
    assert broken.part(Part.IMPORT).text == "FAIL 0/1"
    assert "grace cannot be imported: ImportError: no _C" in broken.part(Part.IMPORT).failures[0].reason
    assert broken.part(Part.BACKEND).verdict is Verdict.NOT_RUN
    assert broken.part(Part.BACKEND).not_judged == (
        ("skip: grace cannot be imported: ImportError: no _C", 1),
    )
    install = rows["torch-2.15@no GPU"]
    assert all(p.text == "FAIL 0/1" for p in install.parts)
    assert install.part(Part.GPU).failures[0].reason == "no torch==2.15.0 on the index"
    triton = rows["triton-3.2@no GPU"]
    assert [p.text for p in triton.parts] == ["n/a", "n/a", "n/a", "FAIL 1/2", "-"]
    assert triton.part(Part.PTX).not_judged == (("skip: ptxas not found", 1),)
    gpu = rows["torch-2.11@NVIDIA H200"]
    assert gpu.run_uids == (str(uuid.UUID(int=8)), str(uuid.UUID(int=9)))  # the label's runs as one
    assert [p.text for p in gpu.parts] == ["pass 3/3", "pass 2/2", "-", "pass 3/3", "pass 5/5"]


def test_markdown_table_reasons_and_determinism(store: tuple[str, sessionmaker[Session]]) -> None:
    with store[1]() as session:
        text = render_markdown(build_table(session))
    with store[1]() as session:
        assert render_markdown(build_table(session)) == text
    cells = table_cells(text)
    assert cells["torch-2.9@no GPU"] == ["pass 3/3", "pass 1/1", "FAIL 1/2", "pass 3/3", "-"]
    assert cells["torch-2.4@no GPU"][1:3] == ["partial 1/2", "expected 0/1"]
    assert cells["triton-3.2@no GPU"] == ["n/a", "n/a", "n/a", "FAIL 1/2", "-"]
    assert cells["torch-2.15@no GPU"] == ["FAIL 0/1"] * 5
    assert "Generated by `grace-matrix compatibility`" in text
    assert "- mt5 / cgct-fake-cuda: `fail_accuracy`: values differ" in text
    assert f"- expected: mlp / cgct-fake-cuda: `fail_to_run`: {EXPECTED_REASON}" in text
    assert "unknown PTX: ld.param.b64 &lt;script&gt;" in text and "<script>" not in text
    assert "/home/" not in text and "superseded" not in text and "an old failure" not in text
    assert "## `torch-2.11` (no GPU)" not in text  # no findings, no section
    assert "not judged, 1x skip: ptxas not found" in text


def test_workload_filter_and_label_selection(store: tuple[str, sessionmaker[Session]]) -> None:
    with store[1]() as session:
        table = build_table(session, cells=["torch-2.9"], workloads=["mlp"])
        assert [p.text for p in table.rows[0].parts][:3] == ["pass 2/2", "pass 1/1", "pass 1/1"]
        (row,) = build_table(session, labels=["nightly-1"]).rows
        assert row.gpu_name == "NVIDIA H200" and len(row.run_uids) == 2
        (row,) = build_table(session, uids=[str(uuid.UUID(int=8))]).rows
        assert row.part(Part.BACKEND).text == "FAIL 0/1"


def test_clean_text() -> None:
    assert clean_text("a\n  b") == "a b"
    assert clean_text("x" * 300).endswith("...") and len(clean_text("x" * 300)) == 200
    assert clean_text("in /tmp/pytest-of-bob/pytest-7/t0/f.py") == "in <tmp>/t0/f.py"


def test_command(
    store: tuple[str, sessionmaker[Session]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "compatibility" in COMMAND_MODULES
    monkeypatch.chdir(tmp_path)  # no matrix.toml, no expected.toml here: the store's expectations
    url = store[0]
    assert main(["compatibility", "--db", url]) == 0
    doc = tmp_path / "docs" / "COMPATIBILITY.md"
    first = doc.read_bytes()
    assert main(["compatibility", "--db", url]) == 0
    assert doc.read_bytes() == first
    assert table_cells(first.decode())["torch-2.4@no GPU"][2] == "expected 0/1"
    capsys.readouterr()
    assert main(["compatibility", "--db", url, "-o", str(tmp_path / "c.md"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == 1 and data["output"].endswith("c.md") and len(data["cells"]) == 7
    assert main(["compatibility", "--db", url, "-o", "-"]) == 0
    assert capsys.readouterr().out.encode() == first
    # an expected-status file replaces the store's: without the entries, the failures are red
    (tmp_path / "expected.toml").write_text("format = 1\n")
    assert main(["compatibility", "--db", url, "-o", "-"]) == 0
    assert table_cells(capsys.readouterr().out)["torch-2.4@no GPU"][1:3] == ["FAIL 1/2", "FAIL 0/1"]
    for bad in (["--label", "nope"], ["--run", "nope"], ["--cell", "torch-9"], ["--input", "missing.jsonl"]):
        assert main(["compatibility", "--db", url, *bad]) == 2, bad
    assert main(["compatibility", "--db", url, "--json", "-o", "-"]) == 2
    assert "no run has label nope" in capsys.readouterr().err


def test_command_over_an_export(
    store: tuple[str, sessionmaker[Session]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "results.jsonl"
    assert main(["export", "--db", store[0], "-o", str(export)]) == 0
    expected = tmp_path / "expected.toml"
    expected.write_text(
        'format = 1\n[[expected]]\ncells = "torch-2.4"\nsuite = "correctness"\nworkload = "mlp"\n'
        f'mode = "cgct-fake-cuda"\nstatus = "fail_to_run"\nreason = "{EXPECTED_REASON}"\n'
    )
    capsys.readouterr()
    argv = ["compatibility", "--input", str(export), "--expected", str(expected), "-o", "-"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert table_cells(text)["torch-2.4@no GPU"][1:3] == ["FAIL 1/2", "expected 0/1"]
    assert main(["compatibility", "--input", str(export), "--no-expected", "-o", "-"]) == 0
    assert table_cells(capsys.readouterr().out)["torch-2.4@no GPU"][2] == "FAIL 0/1"


def test_dashboard_page(store: tuple[str, sessionmaker[Session]], tmp_path: Path) -> None:
    from dashboards.render import write_site
    from dashboards.site import build_site
    from matrix.regressions.thresholds import Thresholds

    with store[1]() as session:
        site = build_site(session, Thresholds())
    write_site(site, tmp_path / "site")
    page = (tmp_path / "site" / "compatibility.html").read_text()
    assert 'href="compatibility.html">Compatibility</a>' in (tmp_path / "site" / "index.html").read_text()
    assert re.search(r'<td class="bad">FAIL 1/2</td>', page)
    assert re.search(r'<td class="warn">expected 0/1</td>', page)
    assert re.search(r'<td class="ok">pass 6/6</td>', page)
    assert re.search(r'<td class="none" title="no torch in a triton-only cell">n/a</td>', page)
    assert EXPECTED_REASON in page and "values differ: max abs 0.5" in page
    assert "ld.param.b64 &lt;script&gt;" in page and "<script>" not in page
    for anchor in re.findall(r'href="#(cell-\d+)"', page):
        assert f'id="{anchor}"' in page
