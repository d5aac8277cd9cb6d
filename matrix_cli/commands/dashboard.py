"""``grace-matrix dashboard``: render the static site from the results store, and
``grace-matrix seed-demo``: seed a regression and a PI failure into the store to show both on it.

Thin: parses, opens the store, calls ``dashboards.site.build_site`` and ``dashboards.render.write_site``.
The site renders from the store alone (expected statuses are loaded into the store first, as for
``grace-matrix regressions``).
"""

from __future__ import annotations

import argparse
import time
import urllib.parse
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from matrix.paper import Paper, find_paper
from matrix.regressions.synthetic import check_factor, seed_demo
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store
from matrix_cli.commands._output import print_json
from matrix_cli.commands.regressions import add_common_options, prepare

DEFAULT_OUT = "site"


@dataclass(frozen=True)
class Rendered:
    """What one rendering of the site wrote."""

    out: str
    pages: int
    results: int
    runs: int
    new_regressions: int
    regressions: int
    seconds: float

    def line(self) -> str:
        return (
            f"rendered {self.pages} pages from {self.results} results in {self.runs} runs into {self.out}/ "
            f"in {self.seconds:.2f} s; {self.new_regressions} new regressions, {self.regressions} total; "
            f"open {self.out}/index.html"
        )


def render(
    session: Session, thresholds: Thresholds, out: str | Path, base_url: str = "", paper: Paper | None = None
) -> Rendered:
    """Build the site from the store ``session`` reads (and ``paper``'s figures) and write it into ``out``."""
    from dashboards.render import write_site  # dependencies point down: the CLI -> dashboards -> matrix
    from dashboards.site import build_site

    started = time.perf_counter()
    site = build_site(session, thresholds, paper=paper)
    pages = write_site(site, out, base_url=base_url)
    return Rendered(
        out=str(out),
        pages=len(pages),
        results=site.result_count,
        runs=len(site.runs),
        new_regressions=sum(v.regression.new for v in site.regressions),
        regressions=len(site.regressions),
        seconds=time.perf_counter() - started,
    )


def publish(session: Session, thresholds: Thresholds, out: Path) -> str:
    """The nightly pipeline's dashboard step (``matrix.nightly.Publish``), with the paper's figures."""
    return render(session, thresholds, out, paper=find_paper(None)).line()


def run_dashboard(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    paper = None if args.no_paper else find_paper(args.paper)  # a bad file fails before the store opens
    store, thresholds = prepare(args)
    with store() as session:
        rendered = render(session, thresholds, args.out, base_url=args.base_url, paper=paper)
    rendered = replace(rendered, seconds=time.perf_counter() - started)  # opening the store included
    if args.json:
        print_json({**asdict(rendered), "seconds": round(rendered.seconds, 3)})
        return 0
    print(rendered.line())
    return 0


def run_seed_demo(args: argparse.Namespace) -> int:
    check_factor(args.factor)  # before the store is opened: a refused command creates no store
    store = open_store(args.db)
    with store.begin() as session:
        seeded = seed_demo(session, factor=args.factor)
    if args.json:
        print_json(asdict(seeded))
    else:
        workload, mode = seeded.regression
        print(
            f"seeded run {seeded.run_uid} on {seeded.cell_id}: {workload}/{mode} slowed x{seeded.factor}, "
            f"PI stage {seeded.pi_stage} of {seeded.pi_subject} failing; render with `grace-matrix dashboard`"
        )
    return 0


def site_url(text: str) -> str:
    """``--base-url``'s value: empty, or an absolute http(s) URL (a feed reader follows its links)."""
    parts = urllib.parse.urlsplit(text)
    if text and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise argparse.ArgumentTypeError(f"not an absolute http(s) URL: {text!r}")
    return text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="render the static dashboard site from the store",
        description="Render index, regressions, PI breakage, per-workload history, run comparison pages and "
        "an Atom feed of regressions into a folder that works offline.",
    )
    parser.add_argument(
        "--out", metavar="DIR", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        type=site_url,
        default="",
        help="absolute http(s) URL the site is published at, for links in the Atom feed (default: relative "
        "links)",
    )
    paper = parser.add_mutually_exclusive_group()
    paper.add_argument(
        "--paper",
        metavar="PATH",
        default=None,
        help="the GraCE paper's figures for the paper page (default: matrix/paper.toml, shipped)",
    )
    paper.add_argument("--no-paper", action="store_true", help="render the paper page without figures")
    add_common_options(parser)
    parser.set_defaults(handler=run_dashboard)

    demo = subparsers.add_parser(
        "seed-demo",
        help="add a run with a seeded regression and a seeded PI failure (demo of the dashboard)",
        description="Clone the latest complete run that has performance samples into a new run labelled "
        "demo-seeded-*, slow one workload x mode down and fail one PI stage. An empty store first gets a "
        "synthetic history (marked synthetic on the dashboard).",
    )
    demo.add_argument("--factor", type=float, default=1.25, help="slow-down of the seeded regression (1.25)")
    demo.set_defaults(handler=run_seed_demo)
