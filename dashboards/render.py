"""Render the static site: Jinja2 templates (autoescape on) over the view model of ``dashboards.site``.

Problem: the site is published as plain files and opened by people every morning, from a web server or a
local folder, with no network. Test output is hostile text: a failure message can contain markup.

Design: one Jinja2 environment with autoescape on for every template (HTML and the Atom feed alike) and
``StrictUndefined`` so a template typo fails the build instead of rendering blanks. Charts are inline SVG
built with escaped text; the only scripts are our own static file and per-run data files written with
``json.dumps`` (and ``<`` escaped). The site is written into a temporary folder beside the output and
swapped in at the end, so a failed render never leaves a half-written site; the site carries a marker
file (``MARKER``), and only a folder that has it, or an empty one, is ever replaced.

Invariants: nothing from the store is marked safe; every link is relative (the feed may take a base URL);
no page references anything outside the site; a folder that is not ours is never deleted; the files
have the modes the umask gives. The feed's text passes ``matrix.text.xml_text`` (XML 1.0 forbids most
control characters, which autoescape leaves alone).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from dashboards.site import HEADLINES, PI_STAGES, SUITES, RunDigest, Site, slug
from matrix.compatibility import PART_HELP
from matrix.errors import ConfigError
from matrix.outfiles import public_mode
from matrix.paper_doc import figure_subject, format_value, measured_text
from matrix.readmodel import RunInfo, aware
from matrix.report import fmt
from matrix.text import xml_text

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"
SITE_FORMAT = 1
MARKER = ".grace-matrix-site"
"""The file that marks a folder as a site of ours: only such a folder (or an empty one) is replaced."""
_NAMESPACE = uuid.UUID("6f1c6a52-6f55-4b0e-9d87-3c2f4f1f7a10")  # stable ids in the Atom feed


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4g}"


def _times(value: float | None) -> str:
    """A speedup or a ratio as the report prints it (1.23x); "-" when not measured."""
    return fmt("speedup", value)


def _size(value: int | None) -> str:
    """Bytes as the report prints them (1.5 GiB); "-" when not measured."""
    return fmt("calls_peak_mem", value)


def _pvalue(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2g}"


def _iso(value: dt.datetime) -> str:
    return aware(value).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _rfc3339(value: dt.datetime) -> str:
    return aware(value).astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _day(value: dt.datetime) -> str:
    return aware(value).astimezone(dt.timezone.utc).strftime("%Y-%m-%d")


def _minute(value: dt.datetime) -> str:
    return aware(value).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _xml_value(value: Any) -> Any:
    """What an expression of the feed prints: text with the characters XML forbids made visible."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return xml_text(value)
    return value


def environment(xml: bool = False) -> Environment:
    """The templates' environment; ``xml`` for the Atom feed (every printed string passes ``xml_text``)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_xml_value if xml else None,
    )
    env.filters.update(
        ms=_ms, pvalue=_pvalue, iso=_iso, rfc3339=_rfc3339, day=_day, minute=_minute, times=_times, size=_size
    )
    env.globals.update(paper_value=format_value, paper_measured=measured_text, paper_subject=figure_subject)
    return env


@dataclass(frozen=True)
class _PairRow:
    suite: str
    workload: str
    mode: str
    a_status: str
    b_status: str
    a_median: float | None
    b_median: float | None
    ratio: str
    p_value: float | None
    css: str


def _js_data(variable: str, key: str | None, payload: Any) -> str:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    if key is None:
        return f"window.{variable} = {text};\n"
    return f"window.{variable} = window.{variable} || {{}};\nwindow.{variable}[{json.dumps(key)}] = {text};\n"


def _run_file(run: RunInfo) -> str:
    return f"run-{slug(run.uid)}.js"


def _pair_file(base: RunInfo, run: RunInfo) -> str:
    """The comparison page of ``base`` and ``run``: one per pair of full uids (slug is injective, and so
    is the JSON of the pair; two pairs whose uids share their short forms get two pages)."""
    return f"{slug(json.dumps([base.uid, run.uid]))}.html"


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _pair_rows(site: Site, base: RunInfo, run: RunInfo, comparison: Any) -> list[_PairRow]:
    digests = {d.run.pk: d for d in site.digests}
    found: dict[tuple[str, str, str], list[Any]] = {}
    for side, digest in enumerate((digests.get(base.pk), digests.get(run.pk))):
        for suite, workload, mode, status, median in digest.rows if digest else ():
            slot = found.setdefault((suite, workload, mode), [None, None, None, None])
            slot[side] = status
            slot[2 + side] = median
    p_values = {}
    if comparison is not None:
        p_values = {(r.workload, r.mode): r for r in comparison.results}
    band = site.thresholds.pairwise.ratio
    rows = []
    for (suite, workload, mode), (sa, sb, ma, mb) in sorted(found.items()):
        ratio = mb / ma if ma and mb else None
        result = p_values.get((workload, mode)) if suite == "performance" else None
        if result is not None and result.change.value in ("regression", "improvement"):
            css = "bad" if result.change.value == "regression" else "ok"
        elif sa != sb or (ratio is not None and not (1 / (1 + band) <= ratio <= 1 + band)):
            css = "changed"
        else:
            css = ""
        rows.append(
            _PairRow(
                suite,
                workload,
                mode,
                sa or "absent",
                sb or "absent",
                ma,
                mb,
                f"{ratio:.3f}" if ratio is not None else "-",
                result.p_value if result else None,
                css,
            )
        )
    return rows


def _previous(runs: Iterable[RunInfo]) -> dict[str, str]:
    last: dict[str, str] = {}
    previous: dict[str, str] = {}
    for run in runs:
        if run.cell_key in last:
            previous[run.uid] = last[run.cell_key]
        last[run.cell_key] = run.uid
    return previous


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_site(site: Site, out: Path | str, base_url: str = "") -> list[Path]:
    """Render every page of ``site`` into ``out`` (replaced whole). Returns the pages written.

    ``out`` must be absent, an empty folder or a site written before (it holds ``MARKER``); anything else
    is refused with a ``ConfigError`` before a file is touched (see the module invariants)."""
    out = Path(out).resolve()
    check_output_folder(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot make the site's folder there: {exc.strerror or exc}"
        ) from None
    try:
        os.chmod(staging, public_mode(folder=True))  # mkdtemp's 0700 would make the site private
        written = _render_into(site, staging, base_url)
        (staging / MARKER).write_text(f"grace-matrix site, format {SITE_FORMAT}\n", encoding="utf-8")
        if out.exists():
            retired = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("rendered %d pages into %s", len(written), out)
    return [out / p.relative_to(staging) for p in written]


def check_output_folder(out: Path) -> None:
    """Refuse an output that is not absent, an empty folder or a site of ours (``MARKER``)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: not a folder; give a new or empty folder for the site")
    if (out / MARKER).is_file() or not any(out.iterdir()):
        return
    raise ConfigError(
        f"--out {out}: the folder holds files and is not a site written by grace-matrix (no {MARKER}); "
        "nothing was changed: give a new or empty folder"
    )


def _render_into(site: Site, root: Path, base_url: str) -> list[Path]:
    env = environment()
    common = {"site": site, "suites": [s.value for s in SUITES], "headlines": HEADLINES, "stages": PI_STAGES}
    pages: list[Path] = []

    def page(name: str, template: str, depth: int = 0, **context: Any) -> None:
        path = root / name
        _write(path, env.get_template(template).render(root="../" * depth, **common, **context))
        pages.append(path)

    page("index.html", "index.html")
    page("regressions.html", "regressions.html")
    page("pi.html", "pi.html")
    page("compatibility.html", "compatibility.html", parts=PART_HELP)
    page("workloads.html", "workloads.html")
    page("fuzz.html", "fuzz.html")
    page("paper.html", "paper.html")
    for workload in site.workloads:
        page(f"workloads/{workload.slug}.html", "workload.html", depth=1, workload=workload)
    newest_first: list[RunDigest] = sorted(
        site.digests, key=lambda d: (d.run.started_at, d.run.pk), reverse=True
    )
    page("runs.html", "runs.html", digests=newest_first, previous=_previous(site.runs))
    pairs = []
    for base, run, comparison in site.pairs:
        name = _pair_file(base, run)
        rows = _pair_rows(site, base, run, comparison)
        page(
            f"compare/{name}",
            "compare_pair.html",
            depth=1,
            base=base,
            run=run,
            comparison=comparison,
            rows=rows,
        )
        pairs.append((name, base, run))
    page("compare.html", "compare.html", pairs=pairs)

    index = [
        {
            "uid": d.run.uid,
            "cell": d.run.display_name,
            "cell_key": d.run.cell_key,
            "label": d.run.label,
            "started": _minute(d.run.started_at),
            "sha": d.run.short_sha,
            "suites": sorted({r[0] for r in d.rows}),
            "file": _run_file(d.run),
        }
        for d in site.digests
    ]
    _write(root / "data" / "runs.js", _js_data("GRACE_RUN_INDEX", None, index))
    for d in site.digests:
        data_rows = [[s, w, m, st, _clean(med)] for s, w, m, st, med in d.rows]
        _write(
            root / "data" / _run_file(d.run),
            _js_data("GRACE_RUNS", d.run.uid, {"format": SITE_FORMAT, "rows": data_rows}),
        )

    entries = []
    for v in site.regressions:
        ident = uuid.uuid5(_NAMESPACE, f"{v.run.uid}|{v.regression.kind.value}|{v.regression.key.label()}")
        entries.append({"id": f"urn:uuid:{ident}", "view": v})
    updated = max((v.run.started_at for v in site.regressions), default=site.generated_at)
    feed_id = f"urn:uuid:{uuid.uuid5(_NAMESPACE, 'feed|' + base_url)}"
    feed = environment(xml=True).get_template("feed.xml")
    context = {"entries": entries, "updated": updated, "feed_id": feed_id, "base_url": base_url}
    _write(root / "feed.xml", feed.render(root="", **common, **context))
    pages.append(root / "feed.xml")

    (root / "static").mkdir(exist_ok=True)
    for asset in STATIC.iterdir():
        if asset.is_file():
            shutil.copyfile(asset, root / "static" / asset.name)
    return pages
