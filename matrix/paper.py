"""The GraCE paper's published figures as data: ``matrix/paper.toml``, read and checked.

Problem: a person comparing grace with the paper needs the paper's numbers (speedup over PyTorch2-CG,
what PI and SCG each bring, compile time) beside ours, workload by workload, with both sides' hardware
and versions. Numbers copied into a page by hand drift from the file and from each other; a figure
without a place in the paper cannot be checked; a metric we cannot measure must say so, not show 0.

Design: the file is the source of truth. ``[paper]``: the source, its hardware and software.
``[[figure]]``: one stated number (a metric; a scope, one workload or an aggregate over the evaluated
workloads; the task, where it has one; the value; where the paper states it). ``[metrics.NAME]``: how we
measure that metric in one run, the ratio of one report field (``median_ms``, ``compile_s``, ...) of two
modes (``numerator / denominator``) or the field of one mode; a metric without a definition is shown
with the paper's value only. ``[[workload]]``: the paper's workloads, each with the name of ours
(``ours``) where we have that model. ``[[difference]]``: why the two sides differ, where we know, for
a metric, a workload, both or neither. ``load_paper`` validates everything and raises ``PaperError``
(one line naming the file and the entry); ``matrix.paper_compare`` sets the figures beside one run's.

File format (version 1)::

    format = 1
    [paper]        title, arxiv, version, hardware, software (strings)
    [metrics.NAME] title, field, numerator (a mode), denominator (a mode; optional)
    [[figure]]     metric, scope ("workload" | "mean" | "geomean" | "max"), workload (the paper's
                   name, for scope "workload"), task ("inference" | "training"; optional for an
                   aggregate: over both), value (a positive ratio or count), note, where
    [[workload]]   name (the paper's), task, batch_size, ours (our workload's name; optional)
    [[difference]] why, metric (optional), workload (the paper's name; optional)

Invariants: read-only; every figure has a ``where``; a figure of one workload names one the file lists
for its task; every mode a metric names is one of the suites' modes; a value is positive.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrix.errors import ConfigError
from matrix.regressions.errors import read_config_toml
from suites.options import MODE_NAMES

DEFAULT_PATH = Path(__file__).resolve().parent / "paper.toml"  # shipped with the package
FORMAT = 1
FIELDS = ("median_ms", "compile_s", "kernels_in_graphs", "copy_bytes_per_replay")  # report row fields


class PaperError(ConfigError):
    """paper.toml is unreadable or malformed; the message names the file and the entry; exit status 2."""


class Scope(str, enum.Enum):
    WORKLOAD = "workload"
    MEAN = "mean"
    GEOMEAN = "geomean"
    MAX = "max"


class Task(str, enum.Enum):
    INFERENCE = "inference"
    TRAINING = "training"


@dataclass(frozen=True)
class Source:
    title: str
    arxiv: str
    version: str
    hardware: str
    software: str


@dataclass(frozen=True)
class Figure:
    metric: str
    scope: Scope
    task: Task | None  # None: an aggregate over both tasks
    value: float
    where: str
    note: str = ""
    workload: str | None = None  # the paper's name, for Scope.WORKLOAD


@dataclass(frozen=True)
class Metric:
    """How we measure a metric in one run: ``field`` of ``numerator`` over that of ``denominator``, or
    ``field`` of ``numerator`` alone when there is no denominator."""

    name: str
    title: str
    field: str
    numerator: str
    denominator: str | None = None


@dataclass(frozen=True)
class PaperWorkload:
    name: str  # the paper's
    task: Task
    batch_size: int | None = None
    ours: str | None = None  # our workload of that model, if we have one


@dataclass(frozen=True)
class Difference:
    why: str
    metric: str | None = None
    workload: str | None = None  # the paper's name

    def applies(self, metric: str | None, workload: str | None) -> bool:
        return self.metric in (None, metric) and self.workload in (None, workload)


@dataclass(frozen=True)
class Paper:
    source: Source
    figures: tuple[Figure, ...]
    metrics: Mapping[str, Metric]
    workloads: tuple[PaperWorkload, ...]
    differences: tuple[Difference, ...] = ()

    def workloads_of(self, task: Task | None) -> tuple[PaperWorkload, ...]:
        return tuple(w for w in self.workloads if task is None or w.task is task)

    def our_name(self, task: Task, paper_name: str) -> str | None:
        return next((w.ours for w in self.workloads if (w.task, w.name) == (task, paper_name)), None)

    def why(self, metric: str | None, workload: str | None) -> tuple[str, ...]:
        """What we know of why our figure differs from the paper's, most specific first (the general
        differences, which hold for every figure, are for the page's header: see ``general``)."""
        found = [d for d in self.differences if (d.metric, d.workload) != (None, None)]
        found = [d for d in found if d.applies(metric, workload)]
        found.sort(key=lambda d: (d.workload is None, d.metric is None))
        return tuple(d.why for d in found)

    def general(self) -> tuple[str, ...]:
        return tuple(d.why for d in self.differences if (d.metric, d.workload) == (None, None))


def _text(entry: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise PaperError(f"{where}: '{key}' must be a non-empty string")
    return value.strip()


def _choice(enum_type: type[enum.Enum], entry: Mapping[str, Any], key: str, where: str) -> Any:
    value = _text(entry, key, where)
    try:
        return enum_type(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in enum_type)
        raise PaperError(f"{where}: '{key}' is {value!r}; choose from {choices}") from None


def _table(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise PaperError(f"{where}: must be a table")
    return entry


def _figure(entry: dict[str, Any], where: str) -> Figure:
    value = entry.get("value")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise PaperError(f"{where}: 'value' must be a positive number (a ratio: +29% is 1.29), not {value!r}")
    scope = _choice(Scope, entry, "scope", where)
    workload = _text(entry, "workload", where, required=scope is Scope.WORKLOAD) or None
    if scope is not Scope.WORKLOAD and workload is not None:
        raise PaperError(f"{where}: 'workload' is only for scope = \"workload\"")
    task = _choice(Task, entry, "task", where) if "task" in entry or scope is Scope.WORKLOAD else None
    note = _text(entry, "note", where, required=False)
    return Figure(
        _text(entry, "metric", where), scope, task, float(value), _text(entry, "where", where), note, workload
    )


def _metric(name: str, entry: dict[str, Any], where: str) -> Metric:
    denominator = _text(entry, "denominator", where, required=False) or None
    metric = Metric(
        name,
        _text(entry, "title", where),
        _text(entry, "field", where),
        _text(entry, "numerator", where),
        denominator,
    )
    if metric.field not in FIELDS:
        raise PaperError(f"{where}: 'field' is {metric.field!r}; choose from {', '.join(FIELDS)}")
    for mode in (metric.numerator, metric.denominator):
        if mode is not None and mode not in MODE_NAMES:
            raise PaperError(f"{where}: {mode!r} is not a mode; choose from {', '.join(MODE_NAMES)}")
    return metric


def _workload(entry: dict[str, Any], where: str) -> PaperWorkload:
    batch = entry.get("batch_size")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise PaperError(f"{where}: 'batch_size' must be a positive integer, not {batch!r}")
    ours = _text(entry, "ours", where, required=False) or None
    return PaperWorkload(_text(entry, "name", where), _choice(Task, entry, "task", where), batch, ours)


def _difference(entry: dict[str, Any], where: str, workloads: set[str]) -> Difference:
    difference = Difference(
        _text(entry, "why", where),
        _text(entry, "metric", where, required=False) or None,
        _text(entry, "workload", where, required=False) or None,
    )
    if difference.workload is not None and difference.workload not in workloads:
        raise PaperError(f"{where}: workload {difference.workload!r} is not in the [[workload]] list")
    return difference


def _entries(data: Mapping[str, Any], key: str, path: Path) -> list[tuple[dict[str, Any], str]]:
    """The tables of the array ``[[key]]``, each with the name errors give it."""
    value = data.get(key, [])
    if not isinstance(value, list):
        raise PaperError(f"{path}: '{key}' must be an array of tables ([[{key}]])")
    return [(_table(e, f"{path} {key} {i + 1}"), f"{path} {key} {i + 1}") for i, e in enumerate(value)]


def parse_paper(data: Mapping[str, Any], path: Path) -> Paper:
    """A ``Paper`` from the parsed TOML of ``path`` (named in every error)."""
    fmt = data.get("format")
    if type(fmt) is not int or fmt != FORMAT:  # TOML's true and 1.0 are equal to 1 in Python
        raise PaperError(f"{path}: 'format' must be {FORMAT}, not {json.dumps(fmt, default=str)}")
    source = _table(data.get("paper"), f"{path} [paper]")
    keys = ("title", "arxiv", "version", "hardware", "software")
    paper_source = Source(*(_text(source, k, f"{path} [paper]") for k in keys))
    metrics_table = _table(data.get("metrics", {}), f"{path} [metrics]")
    metrics = {
        n: _metric(n, _table(e, f"{path} [metrics.{n}]"), f"{path} [metrics.{n}]")
        for n, e in metrics_table.items()
    }
    workloads = tuple(_workload(e, where) for e, where in _entries(data, "workload", path))
    listed = {(w.task, w.name) for w in workloads}
    figures = []
    for entry, where in _entries(data, "figure", path):
        figure = _figure(entry, where)
        if figure.workload is not None and (figure.task, figure.workload) not in listed:
            raise PaperError(
                f"{where}: workload {figure.workload!r} ({figure.task}) is not in the [[workload]] list"
            )
        figures.append(figure)
    names = {w.name for w in workloads}
    differences = tuple(_difference(e, where, names) for e, where in _entries(data, "difference", path))
    return Paper(paper_source, tuple(figures), metrics, workloads, differences)


def load_paper(path: Path | str) -> Paper:
    """The paper's figures from ``path``; PaperError (exit status 2) for an unreadable or bad file."""
    path = Path(path)
    try:
        data = read_config_toml(path, "the paper's figures")
    except ConfigError as exc:
        raise PaperError(str(exc)) from None
    return parse_paper(data, path)


def find_paper(path: Path | str | None) -> Paper:
    """The paper's figures from ``path``, or from the file shipped with the package when None."""
    return load_paper(DEFAULT_PATH if path is None else path)
