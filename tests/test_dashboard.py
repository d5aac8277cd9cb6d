"""The static site (dashboards.site, dashboards.render, dashboards.workloads) and ``grace-matrix dashboard``.

The charts themselves: tests/test_dashboard_charts.py."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dashboards import render
from dashboards.render import write_site
from dashboards.site import Site, build_site, slug
from matrix.regressions.synthetic import (
    SCRIPT_PAYLOAD,
    DemoSeed,
    SeededFailure,
    SeededRegression,
    SyntheticSpec,
    seed_demo,
    seed_history,
)
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store
from matrix_cli.main import main

ROOT = Path(__file__).resolve().parent.parent
ATOM = "{http://www.w3.org/2005/Atom}"
SPEC = SyntheticSpec(
    nights=14,
    regressions=(SeededRegression("torch-2.10", "pyhpc_eos", "pt2cg", 1.12, night=6),),
    failures=(
        SeededFailure(
            "torch-2.9",
            "pi",
            "triton_red_fused_sum_1",
            "rewrite",
            "fail",
            "unknown PTX " + SCRIPT_PAYLOAD,
            13,
        ),
        SeededFailure(
            "torch-2.9",
            "correctness",
            "mt5_small",
            "grace",
            "fail_accuracy",
            "rel_l2 0.2 " + SCRIPT_PAYLOAD,
            13,
        ),
    ),
)


@pytest.fixture(scope="module")
def demo() -> tuple[sessionmaker[Session], DemoSeed]:
    store = open_store("sqlite://")
    with store.begin() as session:
        seed_history(session, SPEC)
        seeded = seed_demo(session)
    return store, seeded


@pytest.fixture(scope="module")
def site(demo: tuple[sessionmaker[Session], DemoSeed]) -> Site:
    with demo[0]() as session:
        return build_site(session, Thresholds())


@pytest.fixture(scope="module")
def out(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site") / "site"
    write_site(site, target)
    return target


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.scripts: list[dict[str, str | None]] = []
        self.inline_scripts = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("href", "src"):
            if values.get(name) is not None:
                self.refs.append((tag, name, values[name] or ""))
        if tag == "script":
            self.scripts.append(values)
            self._in_script = "src" not in values

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


def pages(out: Path) -> list[Path]:
    return sorted(out.rglob("*.html"))


def test_every_page_is_written(out: Path, site: Site) -> None:
    for name in (
        "index.html",
        "regressions.html",
        "pi.html",
        "compatibility.html",
        "workloads.html",
        "runs.html",
        "compare.html",
        "feed.xml",
    ):
        assert (out / name).is_file(), name
    assert {p.stem for p in (out / "workloads").glob("*.html")} == {w.slug for w in site.workloads}
    assert len(list((out / "compare").glob("*.html"))) == len(site.pairs) == 3
    assert len(list((out / "data").glob("run-*.js"))) == len(site.runs)


def test_seeded_regression_and_pi_failure_show_on_the_dashboard(
    out: Path, demo: tuple[sessionmaker[Session], DemoSeed]
) -> None:
    seeded = demo[1]
    workload, mode = seeded.regression
    regressions = (out / "regressions.html").read_text()
    row = re.search(rf'<tr id="r-{seeded.run_uid}-\d+" class="new">(.*?)</tr>', regressions, re.S)
    assert row is not None
    rows = re.findall(r'<tr id="r-[^"]+" class="(new|ongoing)">(.*?)</tr>', regressions, re.S)
    perf = [
        body for _, body in rows if f">{workload}</a></strong> / {mode}" in body and "performance" in body
    ]
    assert len(perf) == 1
    assert re.search(r'class="num">1\.2\d\d</td>', perf[0])  # the ratio
    assert re.search(r'class="num">\d\.\de-\d+</td>', perf[0])  # the p-value
    assert f"nox -s &#39;cell({seeded.cell_id})&#39; -- -k" in perf[0]
    pi_rows = [body for _, body in rows if f"{seeded.pi_subject}</strong> / {seeded.pi_stage}" in body]
    assert len(pi_rows) == 1 and html.escape(seeded.message, quote=False) in pi_rows[0].replace("&#39;", "'")
    pi = (out / "pi.html").read_text()
    assert f"<td>{seeded.pi_stage}</td><td>{seeded.pi_subject}" in pi
    assert pi.count('class="bad">fail</td>') == 2  # the seeded one and the one from the history
    index = (out / "index.html").read_text()
    row_html = re.search(rf"<strong>{re.escape(seeded.cell_id)} \(.*?</tr>", index, re.S)
    assert row_html is not None and ">2 new, 2 total</a>" in row_html.group(0)
    header = index.split('<table class="grid">', 1)[0]  # the verdict header, before the grid
    new = len(re.findall(r'<tr id="r-[^"]+" class="new">', regressions))  # the regressions page's count
    assert new >= 2 and f'<a href="regressions.html">{new} new regressions</a>' in header
    assert re.search(r'<a href="pi.html">[1-9]\d* PI breakages?</a>', header)


def test_script_in_a_failure_message_renders_inert(out: Path) -> None:
    escaped = "&lt;script&gt;window.__grace_pwned = 1&lt;/script&gt;"
    for path in pages(out):
        text = path.read_text()
        assert SCRIPT_PAYLOAD not in text, path
        parser = _Links()
        parser.feed(text)
        assert parser.inline_scripts == 0, path
        assert all(s.get("src", "").endswith(".js") for s in parser.scripts), path
    assert escaped in (out / "regressions.html").read_text()
    assert escaped in (out / "pi.html").read_text()
    data = "".join(p.read_text() for p in (out / "data").glob("run-*.js"))
    assert "<" not in data and ">" not in data
    feed = (out / "feed.xml").read_text()
    assert SCRIPT_PAYLOAD not in feed and escaped in feed


def test_links_are_local_and_resolve(out: Path) -> None:
    for path in pages(out):
        parser = _Links()
        parser.feed(path.read_text())
        for tag, attr, ref in parser.refs:
            if ref.startswith("data:"):
                continue
            assert not re.match(r"^[a-z][a-z0-9+.-]*:|^//", ref, re.I), f"{path}: external {tag} {attr}={ref}"
            target = ref.split("#", 1)[0].split("?", 1)[0]
            if target:
                assert (path.parent / target).resolve().is_file(), f"{path}: broken link {ref}"
    css = (out / "static" / "style.css").read_text()
    assert "url(" not in css and "@import" not in css


def test_atom_feed_is_valid_and_lists_every_regression(out: Path, site: Site) -> None:
    root = ET.parse(out / "feed.xml").getroot()
    assert root.tag == f"{ATOM}feed"
    for required in ("id", "title", "updated", "author"):
        assert root.find(f"{ATOM}{required}") is not None
    entries = root.findall(f"{ATOM}entry")
    assert len(entries) == len(site.regressions) >= 3
    ids = [e.findtext(f"{ATOM}id") for e in entries]
    assert len(set(ids)) == len(ids) and all(i and i.startswith("urn:uuid:") for i in ids)
    for entry in entries:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry.findtext(f"{ATOM}updated") or "")
        href = entry.find(f"{ATOM}link").get("href")  # type: ignore[union-attr]
        assert href.startswith("regressions.html#r-")
    contents = " ".join(e.findtext(f"{ATOM}content") or "" for e in entries)
    assert SCRIPT_PAYLOAD in contents  # plain text once parsed, never markup
    assert "reproduce: nox -s" in contents


def test_workload_pages_have_history_charts_with_steps(out: Path, site: Site) -> None:
    view = next(w for w in site.workloads if w.name == "pyhpc_eos")
    steps = {c.cell_key: c.steps for c in view.charts}
    assert any("pt2cg: x1.1" in s for s in steps["torch-2.10@NVIDIA H200"])
    assert not any(steps[k] for k in steps if k != "torch-2.10@NVIDIA H200")
    text = (out / "workloads" / f"{view.slug}.html").read_text()
    assert text.count("<svg") == len(view.charts) == 3
    assert "stroke-dasharray" in text  # the step mark
    assert text.count('<g class="panel">') == 3 * len(SPEC.modes)  # one panel per cell and mode
    assert "median ms" in text and "run start date" in text


def test_the_workload_page_flags_what_the_regressions_page_lists(
    out: Path, site: Site, demo: tuple[sessionmaker[Session], DemoSeed]
) -> None:
    """One list of findings: a result the regressions page flags is flagged (and not green) on its
    workload page too, and one it does not flag carries no flag."""
    workload, mode = demo[1].regression
    listed = {
        (v.regression.key.workload, v.regression.key.mode, v.run.display_name) for v in site.regressions
    }
    view = next(w for w in site.workloads if w.name == workload)
    for row in view.latest:
        assert bool(row.regressions) == ((workload, row.mode, row.cell) in listed), row
    seeded = [row for row in view.latest if row.mode == mode and row.regressions]
    assert seeded and any(f.startswith("NEW performance: ") for f in seeded[0].regressions)
    assert seeded[0].regressed_suites == {"performance"}
    text = (out / "workloads" / f"{view.slug}.html").read_text()
    assert "NEW performance" in text


def test_workload_page_lists_cells_in_version_order(out: Path, site: Site) -> None:
    view = next(w for w in site.workloads if w.name == "pyhpc_eos")
    order = ["torch-2.9", "torch-2.10", "torch-2.11"]
    assert [c.cell_key.split("@")[0] for c in view.charts] == order
    assert list(dict.fromkeys(row[0].split(" (")[0] for row in view.latest)) == order
    assert [row[1] for row in view.latest[: len(SPEC.modes)]] == ["eager", "inductor", "pt2cg", "grace"]
    text = (out / "workloads" / f"{view.slug}.html").read_text()
    positions = [text.index(f"pyhpc_eos on {cell}@") for cell in order]
    assert positions == sorted(positions)


def test_an_unconfirmed_jump_of_the_latest_run_is_marked(
    out: Path, site: Site, demo: tuple[sessionmaker[Session], DemoSeed]
) -> None:
    seeded = demo[1]
    workload, mode = seeded.regression
    view = next(w for w in site.workloads if w.name == workload)
    (chart,) = [c for c in view.charts if c.cell_key.startswith(f"{seeded.cell_id}@")]
    (note,) = chart.suspects
    found = re.fullmatch(
        rf"{mode}: last run: \+([0-9.]+)% vs previous median, not yet confirmed as a step", note
    )
    assert found and abs(float(found[1]) - (seeded.factor - 1) * 100) < 3, note
    assert 'class="suspect"' in chart.svg and not chart.steps
    others = [c for w in site.workloads for c in w.charts if c is not chart]
    assert not any(c.suspects for c in others)  # night-to-night noise is not a jump
    text = (out / "workloads" / f"{view.slug}.html").read_text()
    assert "unconfirmed:" in text and "vs previous median, not yet confirmed as a step" in text


def test_headline_speedups_and_grid(site: Site) -> None:
    assert [row.run.cell_id for row in site.grid] == ["torch-2.9", "torch-2.10", "torch-2.11"]
    for row in site.grid:
        grace = next(s for s in row.speedups if (s.mode, s.reference) == ("grace", "inductor"))
        assert grace.value is not None and grace.value > 1.0 and grace.workloads == len(SPEC.workloads)
        assert row.synthetic
    torch29 = site.grid[0]
    states = {s.suite: s.state for s in torch29.suites}
    assert states == {"correctness": "bad", "performance": "ok", "pi": "bad"}


def test_slugs_are_safe_and_unique() -> None:
    assert slug("xlnet_lm") == "xlnet_lm"
    assert slug("../etc/passwd") != slug("__etc_passwd")
    assert "/" not in slug("a/b") and not slug(".hidden").startswith(".")


def test_empty_store_renders(tmp_path: Path) -> None:
    store = open_store("sqlite://")
    with store() as session:
        site = build_site(session, Thresholds())
    write_site(site, tmp_path / "site")
    assert "no finished runs yet" in (tmp_path / "site" / "index.html").read_text()
    ET.parse(tmp_path / "site" / "feed.xml")


def test_failed_render_keeps_the_previous_site(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "site"
    write_site(site, target)
    before = (target / "index.html").read_text()

    def broken(*_args: object, **_kwargs: object) -> list[Path]:
        raise RuntimeError("disk full")

    monkeypatch.setattr(render, "_render_into", broken)
    with pytest.raises(RuntimeError):
        write_site(site, target)
    assert (target / "index.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no staging folder left behind


def test_dashboard_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(db).begin() as session:
        seed_demo(session)
    argv = ["dashboard", "--db", db, "--out", str(tmp_path / "out"), "--base-url", "https://example.org/m/"]
    assert main(argv) == 0
    assert "rendered" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["new_regressions"] == 2 and figures["pages"] > 10
    feed = ET.parse(tmp_path / "out" / "feed.xml").getroot()
    assert all(link.get("href", "").startswith("https://example.org/m/") for link in feed.iter(f"{ATOM}link"))


def test_dashboards_never_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from matrix.store.db import open_store\n"
        "from matrix.regressions.synthetic import seed_demo\n"
        "from matrix.regressions.thresholds import Thresholds\n"
        "from dashboards.site import build_site\n"
        "from dashboards.render import write_site\n"
        "import matrix_cli.commands.dashboard, matrix_cli.commands.regressions\n"
        "s = open_store('sqlite://')\n"
        "with s.begin() as session: seed_demo(session)\n"
        "with s() as session: site = build_site(session, Thresholds())\n"
        f"write_site(site, {str(tmp_path / 'site')!r})\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}
    )
