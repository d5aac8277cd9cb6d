"""Regression-detection settings, loaded from the data file ``matrix/thresholds.toml``.

Problem: what counts as a regression (which status verdicts fail a run, how large and how certain a
performance change must be, what makes a step in the nightly history) is policy, and policy belongs in
data that people can read and change in review, not in code.

Design: the TOML file is parsed once into frozen dataclasses. Every key has a default (the values shipped
in the file), so a partial file is valid; an unknown key or a value of the wrong type is refused with an
error that names the key, because a typo in a threshold silently changes what gets flagged.

Invariants:
- ``FLAKY`` can never be a failing verdict (a flaky entry must never fail a run).
- 0 < alpha < 1, ratio >= 0, min_segment >= 2: a single outlier can never form a segment of its own.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from matrix.regressions.errors import RegressionsConfigError, check_format, read_config_toml

THRESHOLDS_FORMAT = 1
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "thresholds.toml"
VERDICT_NAMES = ("PASS", "XFAIL", "FAIL", "IMPROVED", "FLAKY", "MISSING", "SKIP")


@dataclass(frozen=True)
class RatioOverride:
    """A wider (or narrower) pairwise band for workloads and modes matching fnmatch patterns."""

    workload: str = "*"
    mode: str = "*"
    ratio: float = 0.05

    def matches(self, workload: str, mode: str) -> bool:
        return fnmatch.fnmatchcase(workload, self.workload) and fnmatch.fnmatchcase(mode, self.mode)


@dataclass(frozen=True)
class StatusThresholds:
    fail_on: tuple[str, ...] = ("FAIL", "MISSING")


@dataclass(frozen=True)
class PairwiseThresholds:
    ratio: float = 0.05
    alpha: float = 0.01
    min_samples: int = 5
    overrides: tuple[RatioOverride, ...] = ()

    def ratio_for(self, workload: str, mode: str) -> float:
        """The band for one workload x mode: the last matching override, else ``ratio``."""
        chosen = self.ratio
        for override in self.overrides:
            if override.matches(workload, mode):
                chosen = override.ratio
        return chosen


@dataclass(frozen=True)
class HistoryThresholds:
    min_step: float = 0.05
    min_segment: int = 3
    penalty: float = 6.0
    alpha: float = 0.01
    window: int = 90


@dataclass(frozen=True)
class ReproSettings:
    command: str = "nox -s {session} -- -k {test}"
    session: str = "cell({cell})"
    whole_run: str = "nox -s {session}"  # for how a run ended (subject ``<run>``): no test selects it


@dataclass(frozen=True)
class Thresholds:
    status: StatusThresholds = field(default_factory=StatusThresholds)
    pairwise: PairwiseThresholds = field(default_factory=PairwiseThresholds)
    history: HistoryThresholds = field(default_factory=HistoryThresholds)
    repro: ReproSettings = field(default_factory=ReproSettings)


def _section(cls: type[Any], data: Mapping[str, Any], where: str, skip: tuple[str, ...] = ()) -> Any:
    """Build dataclass ``cls`` from ``data``, refusing unknown keys and wrong types by name."""
    known = {f.name: f for f in fields(cls) if f.name not in skip}
    default = cls()
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in skip:
            continue
        if key not in known:
            raise RegressionsConfigError(
                f"{where}: unknown key {key!r}; expected one of {sorted(known)} (check the spelling)"
            )
        expected = getattr(default, key)
        if isinstance(expected, (bool, str)):
            ok = isinstance(value, type(expected))
        elif isinstance(expected, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(expected, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(expected, tuple):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        else:  # pragma: no cover - every field above is one of these types
            ok = True
        if not ok:
            raise RegressionsConfigError(
                f"{where}.{key}: expected a value like {expected!r}, got {value!r} ({type(value).__name__})"
            )
        values[key] = value
    return replace(default, **values)


def _validate(thresholds: Thresholds, source: str) -> None:
    problems = []
    unknown = [v for v in thresholds.status.fail_on if v not in VERDICT_NAMES]
    if unknown:
        problems.append(f"status.fail_on has unknown verdicts {unknown}; known: {list(VERDICT_NAMES)}")
    if "FLAKY" in thresholds.status.fail_on:
        problems.append("status.fail_on lists FLAKY, but a flaky entry must never fail a run")
    for name, alpha in (("pairwise", thresholds.pairwise.alpha), ("history", thresholds.history.alpha)):
        if not 0.0 < alpha < 1.0:
            problems.append(f"{name}.alpha must be between 0 and 1, got {alpha}")
    ratios = [thresholds.pairwise.ratio, thresholds.history.min_step]
    ratios += [o.ratio for o in thresholds.pairwise.overrides]
    if any(r < 0 for r in ratios):
        problems.append("ratio, override ratios and history.min_step must be >= 0")
    if thresholds.history.min_segment < 2:
        problems.append("history.min_segment must be >= 2 so that one outlier cannot form a segment")
    if thresholds.pairwise.min_samples < 2:
        problems.append("pairwise.min_samples must be >= 2")
    if thresholds.history.window < 2 * thresholds.history.min_segment:
        problems.append("history.window must hold at least two segments (2 x min_segment)")
    if problems:
        raise RegressionsConfigError(f"{source}: " + "; ".join(problems))


def thresholds_from_mapping(data: Mapping[str, Any], source: str = "<thresholds>") -> Thresholds:
    """Parse an already-decoded TOML document (see ``load_thresholds``)."""
    fmt = data.get("format", THRESHOLDS_FORMAT)
    check_format(fmt, THRESHOLDS_FORMAT, source)
    sections = {"status", "pairwise", "history", "repro"}
    unknown = sorted(set(data) - sections - {"format"})
    if unknown:
        raise RegressionsConfigError(f"{source}: unknown sections {unknown}; expected {sorted(sections)}")
    for name in sections & set(data):
        if not isinstance(data[name], Mapping):
            raise RegressionsConfigError(f"{source}: [{name}] must be a table")
    pairwise_data = data.get("pairwise", {})
    overrides = []
    raw_overrides = pairwise_data.get("override", [])
    if not isinstance(raw_overrides, list):
        raise RegressionsConfigError(
            f"{source}: pairwise.override must be an array of tables ([[pairwise.override]])"
        )
    for i, item in enumerate(raw_overrides):
        if not isinstance(item, Mapping):
            raise RegressionsConfigError(f"{source}: pairwise.override[{i}] must be a table")
        overrides.append(_section(RatioOverride, item, f"{source}: pairwise.override[{i}]"))
    pairwise = _section(
        PairwiseThresholds, pairwise_data, f"{source}: pairwise", skip=("override", "overrides")
    )
    thresholds = Thresholds(
        status=_section(StatusThresholds, data.get("status", {}), f"{source}: status"),
        pairwise=replace(pairwise, overrides=tuple(overrides)),
        history=_section(HistoryThresholds, data.get("history", {}), f"{source}: history"),
        repro=_section(ReproSettings, data.get("repro", {}), f"{source}: repro"),
    )
    _validate(thresholds, source)
    return thresholds


def load_thresholds(path: Path | str | None = None) -> Thresholds:
    """Read thresholds from ``path`` (default: the ``matrix/thresholds.toml`` shipped with the package)."""
    path = Path(path) if path is not None else DEFAULT_PATH
    return thresholds_from_mapping(read_config_toml(path, "thresholds file"), str(path))
