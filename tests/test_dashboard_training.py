"""Training beside inference on the dashboard: the workloads index pairs each training workload with its
inference twin, and a training workload's page shows its iteration per mode with kernels in graphs per
phase and memory (dashboards.site, the templates), over the store of tests/training_results.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from training_results import (
    AMP_MS,
    CELL,
    FAILED_REASON,
    INFERENCE_MS,
    PEAKS,
    TRAIN_MS,
    training_store,
)
from training_results import PHASES as RECORDED_PHASES

from dashboards.render import write_site
from dashboards.site import Site, build_site, slug
from matrix.regressions.thresholds import Thresholds
from matrix.report import build_report, fmt
from matrix.store.db import open_store
from matrix.training import PHASES
from matrix.training_report import build_training

_VOID = {"meta", "link", "br", "img", "input", "hr", "col", "wbr", "source", "area", "base", "embed"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return training_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def site(url: str) -> Site:
    with open_store(url)() as session:
        return build_site(session, Thresholds())


@pytest.fixture(scope="module")
def out(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site") / "site"
    write_site(site, target)
    return target


class _Balance(HTMLParser):
    """Fails on an end tag that closes nothing open or another element; collects links."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _VOID:
            self.open.append(tag)
        self.links += [value or "" for name, value in attrs if name == "href"]

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:] or 'nothing'}"
        self.open.pop()


def _page(path: Path) -> tuple[str, _Balance]:
    text = path.read_text()
    parser = _Balance()
    parser.feed(text)
    assert parser.open == [], f"{path}: unclosed {parser.open}"
    for ref in parser.links:
        target = "" if ref.startswith("data:") else ref.split("#", 1)[0].split("?", 1)[0]
        assert not target or (path.parent / target).resolve().is_file(), f"{path}: broken link {ref}"
    return text, parser


def _row(html: str, first_cell: str) -> list[str]:
    """The cells' text of the table row whose first cell reads ``first_cell``."""
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r}")


def test_the_site_shows_what_the_report_shows(site: Site, url: str) -> None:
    with open_store(url)() as session:
        assert site.training == build_training(build_report(session))


def test_workloads_index_pairs_training_with_inference(out: Path) -> None:
    html, _ = _page(out / "workloads.html")
    section = html[html.index('id="training"') :]
    assert f"Cell {CELL}" in section
    train = _row(section, "DistilGPT2_train")
    assert train[5] == fmt("speedup", TRAIN_MS["pt2cg"] / TRAIN_MS["grace"])
    twin = INFERENCE_MS["pt2cg"] / INFERENCE_MS["grace"]
    assert train[6] == "DistilGPT2" and train[7] == fmt("speedup", twin)
    assert f'<a href="workloads/{slug("DistilGPT2")}.html">DistilGPT2</a>' in section
    amp = _row(section, "DistilGPT2_train_amp")
    assert amp[5] == fmt("speedup", AMP_MS["pt2cg"] / AMP_MS["grace"]) and amp[6] == "DistilGPT2"
    bert = _row(section, "BertForMaskedLM_train")
    assert bert[2] == "fail_to_run" and bert[3] == "-" and bert[5] == "-" and bert[6] == "-"
    assert '<span class="badge">training</span>' in html


def test_a_training_workload_page_shows_phases_memory_and_its_twin(out: Path) -> None:
    html, _ = _page(out / "workloads" / f"{slug('DistilGPT2_train')}.html")
    section = html[html.index("<h2>Training iteration</h2>") : html.index("<h2>Latest run per cell</h2>")]
    assert f'<a href="{slug("DistilGPT2")}.html">DistilGPT2</a>' in section
    header = re.sub(r"<[^>]+>", "|", section[section.index("<thead>") : section.index("</thead>")]).split("|")
    columns = [h for h in header if h]
    grace = dict(zip(columns, _row(section, "grace"), strict=True))
    assert [grace[p] for p in PHASES] == [str(RECORDED_PHASES["grace"][p]) for p in PHASES]
    assert grace["memory vs pt2cg"] == fmt("speedup", PEAKS["grace"] / PEAKS["pt2cg"])
    assert grace["calls' peak memory"] == fmt("calls_peak_mem", PEAKS["grace"])
    best = min(TRAIN_MS["inductor"], TRAIN_MS["pt2cg"])
    assert grace["vs best"] == fmt("speedup", best / TRAIN_MS["grace"])


def test_missing_phases_and_a_failed_mode_on_the_page(out: Path) -> None:
    amp, _ = _page(out / "workloads" / f"{slug('DistilGPT2_train_amp')}.html")
    assert "This run recorded no per-phase kernel facts." in amp
    assert "<th>forward</th>" not in amp
    assert _row(amp, "grace")[-2:] == ["-", "-"]  # no memory recorded
    bert, _ = _page(out / "workloads" / f"{slug('BertForMaskedLM_train')}.html")
    grace = _row(bert, "grace")
    assert grace[1] == "fail_to_run" and grace[2] == "-"
    assert f"grace: fail_to_run: {FAILED_REASON}" in bert
    assert "Inference twin: none in this cell." in bert


def test_an_inference_page_links_its_training_workloads(out: Path) -> None:
    html, parser = _page(out / "workloads" / f"{slug('DistilGPT2')}.html")
    assert {f"{slug('DistilGPT2_train')}.html", f"{slug('DistilGPT2_train_amp')}.html"} <= set(parser.links)
    assert "<h2>Training iteration</h2>" not in html


def test_every_page_stays_balanced(out: Path) -> None:
    for path in sorted(out.rglob("*.html")):
        _page(path)
