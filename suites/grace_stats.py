"""Read ``grace.stats.snapshot()`` defensively and attribute its graphs to the mode that made them.

Problem: the performance suite reports bytes copied per replay for grace modes from grace's own stats,
but three grace modes (and their graphs) live in one process. Design: take the set of graph keys before
a mode compiles and after its warm-up; the difference is that mode's graphs. The snapshot is turned
into plain JSON (``{key: {fact: value}}``) whatever its container: a mapping of graph ids, a list of
per-graph entries (keyed by their ``graph_id``/``id``/``key``/``name`` field, else by position), or an
object with a ``graphs`` attribute.

Invariant: nothing here raises: when grace or its stats are absent the snapshot is empty and the
figures are None, so a missing stats API cannot fail a measurement.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

ID_FIELDS = ("graph_id", "id", "key", "name")


def plain(value: Any, depth: int = 0) -> Any:
    """A JSON-serialisable copy of ``value`` (dataclasses, enums, namedtuples, objects with __dict__)."""
    if depth > 6:
        return repr(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return plain(value.value, depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if hasattr(value, "_asdict"):
        return {k: plain(v, depth + 1) for k, v in value._asdict().items()}
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v, depth + 1) for v in value]
    if hasattr(value, "__dict__"):
        return {k: plain(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def _entries(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping | list | tuple) and hasattr(raw, "graphs"):
        return _entries(raw.graphs)
    data = plain(raw)
    if isinstance(data, Mapping):
        if "graphs" in data and isinstance(data["graphs"], Mapping | list):
            return _entries(data["graphs"])
        return {str(k): v for k, v in data.items()}
    if isinstance(data, list):
        out: dict[str, Any] = {}
        for index, entry in enumerate(data):
            key = str(index)
            if isinstance(entry, Mapping):
                key = next((str(entry[f]) for f in ID_FIELDS if f in entry), key)
            out[key] = entry
        return out
    return {}


def snapshot() -> dict[str, Any]:
    """``{graph key: facts}`` from grace.stats.snapshot(), or {} when unavailable."""
    try:
        grace = importlib.import_module("grace")
        raw = grace.stats.snapshot()
    except Exception as exc:
        logger.debug("grace.stats.snapshot() unavailable: %s", exc)
        return {}
    try:
        return _entries(raw)
    except Exception as exc:  # an unexpected shape must not fail a measurement
        logger.warning("could not read grace.stats.snapshot(): %s", exc)
        return {}


def graph_keys() -> set[str]:
    return set(snapshot())


def select(entries: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    wanted = set(keys)
    return {k: v for k, v in entries.items() if k in wanted}


def total(entries: Mapping[str, Any], fact: str) -> int | None:
    """Sum of ``fact`` over the entries that report it as a number; None when none does."""
    values = [
        entry[fact]
        for entry in entries.values()
        if isinstance(entry, Mapping)
        and isinstance(entry.get(fact), int | float)
        and not isinstance(entry.get(fact), bool)
    ]
    return int(sum(values)) if values else None
