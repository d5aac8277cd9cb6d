"""matrix/paper.toml (matrix/paper.py), the comparison with a run (matrix/paper_compare.py), docs/PAPER.md
(matrix/paper_doc.py, ``grace-matrix paper-doc``) and the dashboards' paper page."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from cli_support import one_error_line
from report_store import Store

from dashboards.render import write_site
from dashboards.site import build_site
from matrix.paper import DEFAULT_PATH, PaperError, Scope, Task, load_paper
from matrix.paper_compare import compare_run, head_runs
from matrix.paper_doc import render_paper_markdown
from matrix.regressions.thresholds import Thresholds
from matrix_cli.main import main
from suites.workloads import names as workload_names

PAPER = """\
format = 1
[paper]
title = "A paper"
arxiv = "0000.00000"
version = "v1"
hardware = "one GPU"
software = "torch 2.4"

[metrics.speedup_vs_pt2cg]
title = "speedup over pt2cg"
field = "median_ms"
numerator = "pt2cg"
denominator = "grace"

[metrics.kernels_in_graphs]
title = "kernels in graphs"
field = "kernels_in_graphs"
numerator = "grace"

[[figure]]
metric = "speedup_vs_pt2cg"
scope = "workload"
workload = "XLNet"
task = "inference"
value = 3.36
where = "Figure 10"

[[figure]]
metric = "speedup_vs_pt2cg"
scope = "mean"
task = "inference"
value = 1.29
where = "section 5.1"

[[figure]]
metric = "compile_time_ratio"
scope = "mean"
value = 2.21
where = "Table 3"

[[workload]]
name = "XLNet"
task = "inference"
batch_size = 8
ours = "xlnet"

[[workload]]
name = "EOS"
task = "inference"
ours = "eos"

[[workload]]
name = "DALLE2"
task = "inference"

[[difference]]
why = "other hardware"

[[difference]]
workload = "XLNet"
why = "a smaller XLNet"
"""


def write(tmp_path: Path, text: str = PAPER) -> Path:
    path = tmp_path / "paper.toml"
    path.write_text(text)
    return path


# -- the file ------------------------------------------------------------------------------------------


def test_the_committed_paper_file_loads_and_maps_to_workloads_we_have() -> None:
    paper = load_paper(DEFAULT_PATH)
    assert len(paper.figures) >= 10 and paper.source.hardware and paper.source.software
    ours = {w.ours for w in paper.workloads if w.ours}
    assert ours and ours <= set(workload_names()), sorted(ours - set(workload_names()))
    stated = {(f.metric, f.workload) for f in paper.figures}
    assert ("speedup_vs_pt2cg", "XLNetLMHeadModel") in stated
    assert {f.task for f in paper.figures} >= {Task.INFERENCE, Task.TRAINING}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("format = 1", "format = 2"), "'format' must be 1"),
        (("value = 3.36", "value = 0"), "'value' must be a positive number"),
        (("value = 3.36", "value = nan"), "'value' must be a positive number"),
        (('numerator = "pt2cg"', 'numerator = "pt2-cg"'), "'pt2-cg' is not a mode"),
        (('field = "median_ms"', 'field = "mean_ms"'), "'field' is 'mean_ms'"),
        (('workload = "XLNet"\ntask', 'workload = "XLNet2"\ntask'), "'XLNet2' (Task.INFERENCE) is not in"),
        (('task = "inference"\nvalue', 'task = "inferance"\nvalue'), "'task' is 'inferance'; choose from"),
        (('workload = "XLNet"\nwhy', 'workload = "XLNot"\nwhy'), "difference 2: workload 'XLNot'"),
        (('where = "Figure 10"', ""), "figure 1: 'where' must be a non-empty string"),
        (("batch_size = 8", "batch_size = -8"), "'batch_size' must be a positive integer"),
    ],
)
def test_a_bad_paper_file_is_one_line_and_exit_2(tmp_path, capsys, change, message) -> None:
    old, new = change
    assert old in PAPER
    path = write(tmp_path, PAPER.replace(old, new, 1))
    db = Store(tmp_path).url
    code = main(["paper-doc", "--paper", str(path), "--db", db, "-o", str(tmp_path / "PAPER.md")])
    assert code == 2
    line = one_error_line(capsys)
    assert message in line and str(path) in line, line
    assert not (tmp_path / "PAPER.md").exists()


def test_a_missing_or_unparsable_paper_file_is_one_line(tmp_path, capsys) -> None:
    for path in (tmp_path / "nowhere.toml", write(tmp_path, "format = = 1")):
        with pytest.raises(PaperError, match=str(path.name)):
            load_paper(path)
        assert main(["dashboard", "--paper", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
        assert path.name in one_error_line(capsys)
    assert not (tmp_path / "x.db").exists()  # the file is checked before the store is opened


# -- the comparison ------------------------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path) -> Store:
    store = Store(tmp_path)
    with store.Session.begin() as s:
        cell = store.cell(s)
        old = store.run(s, cell, 0)
        store.results(s, old, "xlnet", {"pt2cg": 9.0, "grace": 1.0})  # an older run: not the head
        run = store.run(s, cell, 60)
        run.git_sha, run.label = "a" * 40, "head | run"
        store.results(s, run, "xlnet", {"pt2cg": 3.0, "grace": 1.0})
        store.results(s, run, "eos", {"pt2cg": 2.0, "grace": 4.0}, correctness={"grace": "fail_accuracy"})
    return store


def comparisons(store: Store, paper_path: Path):
    paper = load_paper(paper_path)
    with store.Session() as s:
        return paper, [compare_run(s, paper, r) for r in head_runs(s)]


def test_ours_is_the_head_runs_ratio_and_a_failed_mode_gives_no_value(filled, tmp_path) -> None:
    _, [comparison] = comparisons(filled, write(tmp_path))
    by_name = {(f.figure.scope, f.figure.metric): f for f in comparison.figures}
    xlnet = by_name[(Scope.WORKLOAD, "speedup_vs_pt2cg")]
    assert xlnet.ours.value == pytest.approx(3.0) and xlnet.ours_name == "xlnet"
    assert xlnet.why == ("a smaller XLNet",)
    mean = by_name[(Scope.MEAN, "speedup_vs_pt2cg")]
    # EOS failed its correctness check under grace: the mean is over XLNet alone, and says so
    assert (mean.ours.value, mean.ours.measured, mean.ours.listed) == (pytest.approx(3.0), 1, 2)
    eos = next(w for w in comparison.workloads if w.workload.name == "EOS")
    assert eos.ours["speedup_vs_pt2cg"].value is None
    assert eos.ours["speedup_vs_pt2cg"].missing == "grace: fail_accuracy"
    dalle = next(w for w in comparison.workloads if w.workload.name == "DALLE2")
    assert dalle.ours["speedup_vs_pt2cg"].missing == "no such workload of ours"
    compile_time = by_name[(Scope.MEAN, "compile_time_ratio")]
    assert compile_time.ours.value is None and compile_time.ours.missing == "we do not measure this"
    assert len(comparison.commits) == 1 and comparison.commits[0].startswith("aaaaaaa")
    assert comparison.one_commit


def test_the_largest_tier_of_a_workload_is_the_one_compared(tmp_path) -> None:
    store = Store(tmp_path)
    with store.Session.begin() as s:
        run = store.run(s, store.cell(s), 0)
        store.results(s, run, "xlnet", {"pt2cg": 2.0, "grace": 1.0})
        store.results(s, run, "xlnet", {"pt2cg": 50.0, "grace": 1.0}, tier="smoke")
    _, [comparison] = comparisons(store, write(tmp_path))
    xlnet = next(w for w in comparison.workloads if w.workload.name == "XLNet")
    assert xlnet.ours["speedup_vs_pt2cg"].value == pytest.approx(2.0)
    assert xlnet.ours["kernels_in_graphs"].value == 7


def test_geomean_and_max_aggregate_what_was_measured(tmp_path) -> None:
    store = Store(tmp_path)
    with store.Session.begin() as s:
        run = store.run(s, store.cell(s), 0)
        store.results(s, run, "xlnet", {"pt2cg": 4.0, "grace": 1.0})
        store.results(s, run, "eos", {"pt2cg": 1.0, "grace": 1.0})
    text = PAPER.replace('scope = "mean"\ntask', 'scope = "geomean"\ntask')
    text += '[[figure]]\nmetric = "speedup_vs_pt2cg"\nscope = "max"\nvalue = 3.36\nwhere = "x"\n'
    _, [comparison] = comparisons(store, write(tmp_path, text))
    values = {
        f.figure.scope: f.ours.value for f in comparison.figures if f.figure.metric != "compile_time_ratio"
    }
    assert values[Scope.GEOMEAN] == pytest.approx(math.sqrt(4.0))
    assert values[Scope.MAX] == pytest.approx(4.0)


# -- docs/PAPER.md and the page -------------------------------------------------------------------------


def test_the_markdown_escapes_stored_text_and_states_both_sides(filled, tmp_path) -> None:
    paper, found = comparisons(filled, write(tmp_path))
    text = render_paper_markdown(paper, found)
    assert "label `head \\| run`" in text  # a | in a label cannot break the table
    assert "one GPU; torch 2.4" in text and "NVIDIA H200" in text
    assert "| 3.36x | 3.00x |" in text
    assert "| - (grace: fail_accuracy) |" in text
    assert "3.00x (over 1 of 2)" in text


def test_paper_doc_writes_the_file_and_rejects_a_selection_that_matches_nothing(
    filled, tmp_path, capsys
) -> None:
    out = tmp_path / "docs" / "PAPER.md"
    args = ["paper-doc", "--paper", str(write(tmp_path)), "--db", filled.url, "-o", str(out)]
    assert main(args) == 0
    assert "3.00x" in out.read_text() and "wrote" in capsys.readouterr().err
    before = out.read_text()
    assert main([*args, "--label", "no-such-label"]) == 2
    assert "no run has label no-such-label; the store has labels: head | run" in one_error_line(capsys)
    assert out.read_text() == before  # nothing written on an error


def test_paper_doc_on_an_empty_store_says_there_is_nothing_of_ours(tmp_path, capsys) -> None:
    store = Store(tmp_path)
    assert main(["paper-doc", "--paper", str(write(tmp_path)), "--db", store.url, "-o", "-"]) == 0
    assert "No GPU run in the store" in capsys.readouterr().out


def render_page(store: Store, tmp_path: Path, with_paper: bool) -> str:
    paper = load_paper(write(tmp_path)) if with_paper else None
    with store.Session() as s:
        site = build_site(s, Thresholds(), paper=paper)
    write_site(site, tmp_path / "site")
    return (tmp_path / "site" / "paper.html").read_text()


def test_the_dashboard_has_a_paper_page_beside_the_head_run(filled, tmp_path) -> None:
    page = render_page(filled, tmp_path, with_paper=True)
    assert "3.36x" in page and "3.00x" in page and "over 1 of 2" in page
    assert "head | run" in page and "grace: fail_accuracy" in page
    assert "Stitched" not in page  # one commit
    assert "without the paper's figures" in render_page(filled, tmp_path / "b", with_paper=False)


def test_paper_page_shows_the_empty_state_without_gpu_runs(tmp_path) -> None:
    assert "nothing of ours" in render_page(Store(tmp_path), tmp_path, with_paper=True)


def test_a_run_with_no_figure_of_ours_is_neither_stitched_nor_of_an_unknown_commit(tmp_path) -> None:
    # A GPU run that recorded nothing the paper compares (a fuzz run, say): no commit is behind our
    # figures because there are none, and one commit is no stitching.
    store = Store(tmp_path)
    with store.Session.begin() as s:
        run = store.run(s, store.cell(s), 0)
        run.git_sha = "b" * 40
    paper, found = comparisons(store, write(tmp_path))
    [comparison] = found
    assert comparison.commits == () and not comparison.stitched
    text = render_paper_markdown(paper, found)
    assert "commit(s) none (no figure of ours comes from this run)." in text
    assert "stitched" not in text
    page = render_page(store, tmp_path, with_paper=True)
    assert "none (no figure of ours comes from this run)" in page and "Stitched" not in page


def test_figures_from_runs_at_two_commits_are_stitched(filled, tmp_path) -> None:
    with filled.Session.begin() as s:
        later = filled.run(s, filled.cell(s), 120)
        later.git_sha, later.label = "c" * 40, "head | run"
        filled.results(s, later, "eos", {"pt2cg": 2.0, "grace": 1.0})
    paper, found = comparisons(filled, write(tmp_path))
    stitched = [c for c in found if c.stitched]
    assert stitched and all(len(c.commits) == 2 for c in stitched)
    assert "Ours is stitched from several commits, not one." in render_paper_markdown(paper, found)
