"""Every dashboard page in headless Chromium: loads from a local server with no console error, no
exception, no request leaving the site, no script from the store executed; screenshots are kept.

Driven through the DevTools protocol (``--remote-debugging-port=0``, the port read from the profile's
``DevToolsActivePort`` file, a websocket client). Skipped when Chromium or the websocket client is
missing, unless ``GRACE_MATRIX_REQUIRE_BROWSER=1`` (CI sets it), which turns a missing browser into a
failure. Screenshots go to ``$GRACE_MATRIX_ARTIFACTS/screenshots`` when that is set, else to the test's
temporary folder.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dashboards.render import write_site
from dashboards.site import build_site, slug
from matrix.paper import find_paper
from matrix.regressions.synthetic import (
    SCRIPT_PAYLOAD,
    DemoSeed,
    SeededFailure,
    SyntheticSpec,
    seed_demo,
    seed_history,
)
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store

pytestmark = pytest.mark.browser

REQUIRE_ENV = "GRACE_MATRIX_REQUIRE_BROWSER"
CHROMIUM_ENV = "GRACE_MATRIX_CHROMIUM"
ARTIFACTS_ENV = "GRACE_MATRIX_ARTIFACTS"
SCREENSHOTS_ENV = "GRACE_MATRIX_SCREENSHOTS"  # a folder for the published site's named screenshots
RESULTS = sorted((Path(__file__).resolve().parent.parent / "results").glob("*.jsonl"))
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--window-size=1280,900",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
TIMEOUT_S = 30.0


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 requires the browser test to run", pytrace=False)
    pytest.skip(reason)


def _chromium() -> str:
    explicit = os.environ.get(CHROMIUM_ENV)
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            _unavailable(f"{CHROMIUM_ENV}={explicit} is not an executable")
        return str(found)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    _unavailable(
        "headless Chromium not found (install the Debian package 'chromium' or set GRACE_MATRIX_CHROMIUM)"
    )
    raise AssertionError("unreachable")


@dataclass
class DevTools:
    """A minimal DevTools protocol client over one page target: commands, and the events seen."""

    socket: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            if "method" in message:
                self.events.append(message)
        raise TimeoutError(f"no answer to {method} within {TIMEOUT_S} s")

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        seen = 0
        while time.monotonic() < deadline:
            for event in self.events[seen:]:
                if event["method"] == method:
                    return event
            seen = len(self.events)
            message = json.loads(self.socket.recv())
            if "method" in message:
                self.events.append(message)
        raise TimeoutError(f"no {method} event within {TIMEOUT_S} s")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")


@dataclass(frozen=True)
class PageReport:
    url: str
    problems: list[str]
    screenshot: Path


def _problems(events: list[dict[str, Any]], origin: str) -> list[str]:
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            problems.append(
                f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
            )
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"console.{params['type']}: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            problems.append(f"log error: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            problems.append(f"failed to load: {params.get('errorText')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not (url.startswith(origin) or url.startswith("data:") or url == "about:blank"):
                problems.append(f"request outside the site: {url}")
        elif method == "Network.responseReceived":
            status = params.get("response", {}).get("status", 200)
            if status >= 400:
                problems.append(f"HTTP {status}: {params['response'].get('url')}")
    return problems


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = _chromium()
    try:
        import websocket  # noqa: F401
    except ImportError:
        _unavailable("the websocket-client package is missing (pip install 'grace-matrix[test]')")
    return binary


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = open_store("sqlite://")
    spec = SyntheticSpec(
        nights=10,
        failures=(
            SeededFailure(
                "torch-2.9", "correctness", "mt5_small", "grace", "fail_accuracy", SCRIPT_PAYLOAD, 9
            ),
        ),
    )
    with store.begin() as session:
        seed_history(session, spec)
        seed_demo(session)
    with store() as session:
        site = build_site(session, Thresholds())
    out = tmp_path_factory.mktemp("browser") / "site"
    write_site(site, out)
    broken = out.parent / "control"
    broken.mkdir()
    (broken / "broken.html").write_text(
        "<!doctype html><title>control</title>"
        "<script>console.error('control error'); missing_function();</script>"
    )
    return out


@pytest.fixture(scope="module")
def published(site_dir: Path) -> tuple[Path, DemoSeed]:
    """The site of the committed results (results/*.jsonl) plus a seeded regression and PI failure,
    beside the synthetic one (the same server serves both)."""
    from matrix.transfer import ingest_jsonl

    if not RESULTS:
        pytest.skip("no committed results under results/")
    store = open_store("sqlite://")
    with store.begin() as session:
        for path in RESULTS:
            with path.open("rb") as handle:
                ingest_jsonl(session, handle, str(path))
        seeded = seed_demo(session)
    with store() as session:
        site = build_site(session, Thresholds(), paper=find_paper(None))  # the paper page with figures
    out = site_dir.parent / "published"
    write_site(site, out)
    return out, seeded


@pytest.fixture(scope="module")
def server(site_dir: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site_dir.parent))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def devtools(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    import websocket

    profile = tmp_path_factory.mktemp("chromium-profile")
    log = (profile.parent / "chromium.log").open("wb")
    process = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (profile.parent / "chromium.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"Chromium did not start its DevTools endpoint:\n{tail}", pytrace=False)
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=TIMEOUT_S) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        socket = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=TIMEOUT_S, suppress_origin=True
        )
        client = DevTools(socket)
        for domain in ("Page", "Runtime", "Log", "Network"):
            client.call(f"{domain}.enable")
        yield client
        with contextlib.suppress(Exception):  # the browser may close the socket before it answers
            client.call("Browser.close")
        socket.close()
    finally:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get(ARTIFACTS_ENV)
    path = Path(root) / "screenshots" if root else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def visit(client: DevTools, url: str, origin: str, shots: Path, ready: str | None = None) -> PageReport:
    client.events.clear()
    client.call("Page.navigate", url=url)
    client.wait_for("Page.loadEventFired")
    if ready is not None:
        deadline = time.monotonic() + TIMEOUT_S
        while not client.evaluate(ready):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: page never became ready ({ready})")
            time.sleep(0.05)
    client.call("Runtime.evaluate", expression="0")  # drain events queued by the page so far
    problems = _problems(client.events, origin)
    if client.evaluate("typeof window.__grace_pwned") != "undefined":
        problems.append("a script from a test message ran")
    name = (
        url.removeprefix(origin).replace("/", "_").replace("?", "_").replace("&", "_").replace("=", "-")
        or "root"
    )
    shot = shots / f"{name}.png"
    data = client.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
    shot.write_bytes(base64.b64decode(data))
    return PageReport(url, problems, shot)


def test_every_page_loads_without_console_errors(
    devtools: DevTools, server: str, site_dir: Path, artifacts: Path
) -> None:
    origin = server
    names = sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html"))
    assert len(names) >= 10
    reports = [visit(devtools, f"{origin}site/{name}", origin, artifacts) for name in names]
    reports.append(visit(devtools, f"{origin}site/feed.xml", origin, artifacts))
    failures = {r.url: r.problems for r in reports if r.problems}
    assert failures == {}
    for report in reports:
        assert report.screenshot.stat().st_size > 5000, f"{report.url}: screenshot looks empty"


def test_compare_page_combines_two_runs_in_the_browser(
    devtools: DevTools, server: str, site_dir: Path, artifacts: Path
) -> None:
    index = (site_dir / "data" / "runs.js").read_text()
    runs = json.loads(index.split("=", 1)[1].strip().rstrip(";"))
    first, last = runs[0]["uid"], runs[-1]["uid"]
    url = f"{server}site/compare.html?a={first}&b={last}"
    report = visit(
        devtools,
        url,
        server,
        artifacts,
        ready="document.querySelectorAll('#compare-table tbody tr').length > 0",
    )
    assert report.problems == []
    status = devtools.evaluate("document.getElementById('compare-status').textContent")
    assert "results" in status and "differ" in status
    rows = devtools.evaluate("document.querySelectorAll('#compare-table tbody tr').length")
    coloured = devtools.evaluate(
        "document.querySelectorAll('#compare-table tbody tr.worse, #compare-table tbody tr.better').length"
    )
    assert rows > 0 and coloured <= rows  # only differences by default, coloured by which way they go
    devtools.evaluate("document.getElementById('only-changes').click()")  # every row (loaded again)
    count = "document.querySelectorAll('#compare-table tbody tr').length"
    deadline = time.monotonic() + TIMEOUT_S
    while devtools.evaluate(count) <= max(10, rows) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert devtools.evaluate(count) > max(10, rows)
    # the seeded message is in the data of the run: shown as text by the table, never run
    assert devtools.evaluate("typeof window.__grace_pwned") == "undefined"
    # an unknown run in the query string is reported on the page, not as a console error
    report = visit(devtools, f"{server}site/compare.html?a=deadbeef&b=", server, artifacts)
    assert report.problems == []
    assert "no run deadbeef" in devtools.evaluate("document.getElementById('compare-status').textContent")


def _text(client: DevTools, selector: str) -> str:
    return str(client.evaluate(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''"))


def test_the_published_site_names_the_seeded_faults_first_and_its_pages_agree(
    devtools: DevTools, server: str, published: tuple[Path, DemoSeed], artifacts: Path
) -> None:
    """The committed results with a seeded regression and PI failure: the index's verdict header names
    both before anything else; the workload page, the regressions page and the header agree on the
    regression; the compare page opens on two runs of one cell; screenshots of each page are kept
    (``GRACE_MATRIX_SCREENSHOTS``: the folder docs/screenshots/ is made from)."""
    out, seeded = published
    workload, mode = seeded.regression
    shots = Path(os.environ[SCREENSHOTS_ENV]) if os.environ.get(SCREENSHOTS_ENV) else artifacts
    shots.mkdir(parents=True, exist_ok=True)
    pages = {
        "index": "published/index.html",
        "workload": f"published/workloads/{slug(workload)}.html",
        "regressions": "published/regressions.html",
        "compare": "published/compare.html",
        "pi": "published/pi.html",
        "paper": "published/paper.html",
    }
    texts: dict[str, str] = {}
    selected: list[str] = []
    for name, page in pages.items():
        filled = "document.querySelectorAll('#compare-table tbody tr').length > 0"
        ready = filled if name == "compare" else None
        report = visit(devtools, f"{server}{page}", server, artifacts, ready=ready)
        assert report.problems == [], (page, report.problems)
        texts[name] = str(devtools.evaluate("document.body.innerText"))
        if name == "compare":
            selected = devtools.evaluate(
                "[document.getElementById('run-a').value, document.getElementById('run-b').value]"
            )
        if shots is not artifacts:
            (shots / f"{name}.png").write_bytes(report.screenshot.read_bytes())
    header = texts["index"].split("Latest run per cell", 1)[1].split("cell\t", 1)[0]
    assert f"{workload} / {mode} (performance" in header, header
    assert f"{seeded.pi_subject} / {seeded.pi_stage}" in header, header
    assert f"{workload}" in texts["regressions"] and seeded.pi_subject in texts["regressions"]
    assert "NEW performance" in texts["workload"]  # the workload page flags what the regressions page lists
    assert "3.36x" in texts["paper"] and "speedup over PyTorch2-CG" in texts["paper"]  # the paper beside ours
    index = json.loads((out / "data" / "runs.js").read_text().split("=", 1)[1].strip().rstrip(";"))
    by_uid = {run["uid"]: run for run in index}
    a, b = (by_uid[uid] for uid in selected)
    assert a["cell_key"] == b["cell_key"] and a["uid"] != b["uid"]  # one cell, two of its runs


def test_harness_catches_console_errors(devtools: DevTools, server: str, artifacts: Path) -> None:
    report = visit(devtools, f"{server}control/broken.html", server, artifacts)
    assert any("control error" in p for p in report.problems)
    assert any("missing_function" in p for p in report.problems)
