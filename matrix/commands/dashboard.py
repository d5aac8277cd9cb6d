"""``grace-matrix dashboard``: render the static site from the results store, and
``grace-matrix seed-demo``: seed a regression and a PI failure into the store to show both on it.

Thin: parses, opens the store, calls ``dashboards.site.build_site`` and ``dashboards.render.write_site``.
The site renders from the store alone (expected statuses are loaded into the store first, as for
``grace-matrix regressions``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from matrix.commands._output import print_json
from matrix.commands.regressions import add_common_options, prepare
from matrix.regressions.synthetic import seed_demo
from matrix.store.db import open_store

DEFAULT_OUT = "site"


def run_dashboard(args: argparse.Namespace) -> int:
    from dashboards.render import write_site  # dependencies point down: dashboards -> matrix
    from dashboards.site import build_site

    started = time.perf_counter()
    store, thresholds = prepare(args)
    with store() as session:
        site = build_site(session, thresholds)
    pages = write_site(site, args.out, base_url=args.base_url)
    elapsed = time.perf_counter() - started
    new = sum(v.regression.new for v in site.regressions)
    if args.json:
        print_json(
            {
                "out": str(args.out),
                "pages": len(pages),
                "results": site.result_count,
                "runs": len(site.runs),
                "new_regressions": new,
                "regressions": len(site.regressions),
                "seconds": round(elapsed, 3),
            }
        )
        return 0
    print(
        f"rendered {len(pages)} pages from {site.result_count} results in {len(site.runs)} runs "
        f"into {args.out}/ in {elapsed:.2f} s; {new} new regressions, {len(site.regressions)} total; "
        f"open {args.out}/index.html"
    )
    return 0


def run_seed_demo(args: argparse.Namespace) -> int:
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
        default="",
        help="absolute URL the site is published at, for links in the Atom feed (default: relative links)",
    )
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
