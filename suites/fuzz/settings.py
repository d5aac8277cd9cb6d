"""The fuzzer's settings: suites/fuzz/fuzz.toml loaded once into frozen dataclasses.

Problem: how long the fuzzer runs, from which seed, under which grace options and with which
tolerances are decisions to review like data, not constants inside the executor; CI and the GPU cell
need other deadlines without editing code.

Design: ``load_settings`` reads the TOML file, checks its format and every key (an unknown key is an
error naming its path), and applies the environment overrides ``GRACE_FUZZ_SECONDS`` (deadline) and
``GRACE_FUZZ_SEED`` (base seed). No torch import: the pytest wiring reads these before torch loads.

Invariant: a profile's options are plain GraceOptions keyword arguments over ``base_options``; grace
checks them when the case compiles (an invalid option fails the case, it is never dropped).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SETTINGS_PATH = Path(__file__).with_name("fuzz.toml")
SETTINGS_FORMAT = 1
ENV_SECONDS = "GRACE_FUZZ_SECONDS"
ENV_SEED = "GRACE_FUZZ_SEED"


class SettingsError(ValueError):
    """fuzz.toml (or an override) is invalid; the message names the key and what is accepted."""


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Profile:
    """A named set of GraceOptions keyword arguments (over the settings' ``base_options``)."""

    name: str
    options: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Known:
    """A case that fails at a known bug (grace's or upstream): it runs and is recorded as known, not as
    a failure."""

    seed: int
    case: int
    device: str
    issue: str


@dataclass(frozen=True)
class Limits:
    max_calls: int
    max_held: int
    max_failures_kept: int
    max_ops: int


@dataclass(frozen=True)
class Settings:
    base_seed: int
    deadline_s: dict[str, float]  # device type -> seconds
    compile_threads: dict[str, int]  # device type -> Inductor's compile_threads during a run
    limits: Limits
    tolerances: dict[str, Tolerance]  # dtype name (float32) -> tolerance
    base_options: tuple[tuple[str, Any], ...]
    profiles: tuple[Profile, ...]
    known: tuple[Known, ...] = ()
    profiles_per_case: dict[str, int] = field(default_factory=dict)  # device type -> profiles per case

    def deadline_for(self, device_type: str) -> float:
        if device_type not in self.deadline_s:
            raise SettingsError(f"fuzz.toml [deadline] has no entry for device {device_type!r}")
        return self.deadline_s[device_type]

    def profiles_for(self, case: int, device_type: str) -> tuple[Profile, ...]:
        """The profiles case ``case`` runs under: the next ``profiles_per_case`` of the list, in turn."""
        count = min(max(1, self.profiles_per_case.get(device_type, 1)), len(self.profiles))
        start = case * count
        return tuple(self.profiles[(start + j) % len(self.profiles)] for j in range(count))

    def profile_named(self, name: str) -> Profile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise SettingsError(f"no profile {name!r}; fuzz.toml has {[p.name for p in self.profiles]}")

    def options_of(self, profile: Profile) -> dict[str, Any]:
        return {**dict(self.base_options), **dict(profile.options)}

    def tolerance_for(self, dtype_name: str) -> Tolerance:
        if dtype_name not in self.tolerances:
            raise SettingsError(f"fuzz.toml has no [tolerance.{dtype_name}]; add one for that dtype")
        return self.tolerances[dtype_name]

    def known_issue(self, seed: int, case: int, device_type: str) -> str | None:
        for entry in self.known:
            if (entry.seed, entry.case, entry.device) == (seed, case, device_type):
                return entry.issue
        return None


_TOP_KEYS = {
    "format",
    "profiles_per_case",
    "base_seed",
    "deadline",
    "inductor",
    "limits",
    "tolerance",
    "base_options",
    "profiles",
    "known",
}


def _table(data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise SettingsError(f"{path}: {key} must be a table")
    return value


def _number(table: Mapping[str, Any], key: str, path: str, kind: type = float) -> Any:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise SettingsError(f"{path}: {key} must be a non-negative number, got {value!r}")
    if kind is int and not isinstance(value, int):
        raise SettingsError(f"{path}: {key} must be an integer, got {value!r}")
    return kind(value)


def _env_override(name: str, kind: type) -> Any:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    try:
        return kind(text)
    except ValueError:
        raise SettingsError(f"${name} must be a number, got {text!r}") from None


def parse_settings(data: Mapping[str, Any], source: str = "fuzz.toml") -> Settings:
    """Settings from the parsed TOML ``data`` (no environment overrides)."""
    if data.get("format") != SETTINGS_FORMAT:
        raise SettingsError(f"{source}: format {data.get('format')!r} is not {SETTINGS_FORMAT}")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SettingsError(f"{source}: unknown key(s) {unknown}; expected {sorted(_TOP_KEYS)}")
    deadline = _table(data, "deadline", source)
    threads = _table(_table(data, "inductor", source), "compile_threads", f"{source} [inductor]")
    limits = _table(data, "limits", source)
    tolerances = _table(data, "tolerance", source)
    profiles = data.get("profiles", [])
    if not profiles:
        raise SettingsError(f"{source}: at least one [[profiles]] entry is needed")
    return Settings(
        base_seed=_number(data, "base_seed", source, int),
        deadline_s={str(k): _number(deadline, k, f"{source} [deadline]") for k in deadline},
        compile_threads={
            str(k): _number(threads, k, f"{source} [inductor.compile_threads]", int) for k in threads
        },
        limits=Limits(
            **{k: _number(limits, k, f"{source} [limits]", int) for k in Limits.__dataclass_fields__}
        ),
        tolerances={
            str(name): Tolerance(
                _number(t, "atol", f"{source} [tolerance.{name}]"),
                _number(t, "rtol", f"{source} [tolerance.{name}]"),
            )
            for name, t in tolerances.items()
        },
        base_options=tuple(sorted(_table(data, "base_options", source).items())),
        profiles=tuple(
            Profile(str(p["name"]), tuple(sorted(_table(p, "options", f"{source} [[profiles]]").items())))
            for p in profiles
        ),
        profiles_per_case={
            str(k): _number(
                _table(data, "profiles_per_case", source), k, f"{source} [profiles_per_case]", int
            )
            for k in _table(data, "profiles_per_case", source)
        },
        known=tuple(
            Known(int(k["seed"]), int(k["case"]), str(k["device"]), str(k["issue"]))
            for k in data.get("known", [])
        ),
    )


def load_settings(path: Path | None = None) -> Settings:
    """fuzz.toml with ``GRACE_FUZZ_SECONDS`` (every device's deadline) and ``GRACE_FUZZ_SEED`` applied."""
    source = path or SETTINGS_PATH
    try:
        data = tomllib.loads(source.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read {source.name}: {exc}") from exc
    settings = parse_settings(data, source.name)
    seconds = _env_override(ENV_SECONDS, float)
    seed = _env_override(ENV_SEED, int)
    changes: dict[str, Any] = {}
    if seconds is not None:
        changes["deadline_s"] = {device: seconds for device in settings.deadline_s}
    if seed is not None:
        changes["base_seed"] = seed
    if not changes:
        return settings
    from dataclasses import replace

    return replace(settings, **changes)
