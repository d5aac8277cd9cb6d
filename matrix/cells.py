"""The matrix as data: matrix.toml loaded into frozen dataclasses.

Problem: the cells of the compatibility matrix (which torch, which Triton, which CUDA, which suites)
drive the nox sessions, the ``cells`` command, the CI plan, the store's cell rows and the dashboards'
filters. If each of them read the file its own way, they would drift, and a typo in a version would
only surface as a confusing installer failure halfway through a nightly run.

Design: ``load_matrix`` reads matrix.toml once into a ``Matrix`` of ``CellSpec``s; everything else is
derived from that object. Per-kind defaults (``[kinds.<kind>]``) and global defaults (``[defaults]``)
are merged into each cell here, so consumers never apply defaults themselves. This module imports only
the standard library and ``packaging``, so the noxfile can import it from the interpreter running nox.

Invariants:
- A loaded ``Matrix`` is valid: ids are unique and well formed; torch and Triton pins are exact PEP 440
  versions (checked before they reach an installer); kinds, installers and keys are known.
- Every validation failure is one ``ConfigError`` naming the file, the key path (``cells[3].torch``)
  and the problem.
- A file whose ``format`` is newer than ``MATRIX_FORMAT`` is refused with a hint to upgrade.
"""

from __future__ import annotations

import enum
import fnmatch
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.errors import ConfigError
from matrix.infiles import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

MATRIX_FORMAT = 1
ENV_CONFIG = "GRACE_MATRIX_CONFIG"
DEFAULT_CONFIG_NAME = "matrix.toml"

TIERS = ("smoke", "standard", "full")
# Whole-string patterns, used with fullmatch only: `$` would let a trailing newline through, which
# splits a command in the generated CI workflow.
_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TAG_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_CUDA_RE = re.compile(r"(\d{2})\.(\d{1,2})")
_EXTRA_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_VARIANT_RE = re.compile(r"cu\d{3,4}|cpu|rocm[\d.]+")


class CellKind(str, enum.Enum):
    VENV = "venv"  # nox builds a virtualenv with the pinned torch and Triton
    CURRENT = "current"  # the interpreter that runs nox, with whatever stack it has (GPU images)
    TRITON_ONLY = "triton-only"  # Triton without torch: the parameter-indirection PTX checks


class Installer(str, enum.Enum):
    PIP = "pip"
    UV = "uv"


class IndexMode(str, enum.Enum):
    REPLACE = "replace"  # --index-url: the only index
    EXTRA = "extra"  # --extra-index-url: in addition to the default index


@dataclass(frozen=True)
class PackageIndex:
    """A package index for one CUDA variant (``cu121``), for users whose builds live elsewhere."""

    variant: str
    url: str
    mode: IndexMode = IndexMode.EXTRA

    def installer_args(self) -> tuple[str, ...]:
        flag = "--index-url" if self.mode is IndexMode.REPLACE else "--extra-index-url"
        return (flag, self.url)


@dataclass(frozen=True)
class Exclusion:
    """Cells (an fnmatch pattern over ids) that cannot run in some environments, with the reason."""

    cells: str
    reason: str
    python: SpecifierSet | None = None
    platform: str | None = None  # fnmatch pattern over ``platform_tag()``, e.g. "darwin-*"

    def matches(self, cell_id: str, python_version: str, platform_name: str) -> bool:
        if not fnmatch.fnmatchcase(cell_id, self.cells):
            return False
        if self.python is not None and not self.python.contains(python_version, prereleases=True):
            return False
        return self.platform is None or fnmatch.fnmatchcase(platform_name, self.platform)


@dataclass(frozen=True)
class CellSpec:
    """One cell as declared, with defaults applied."""

    id: str
    kind: CellKind
    torch: Version | None
    triton: Version | None
    cuda: str | None
    tags: tuple[str, ...]
    installer: Installer
    tier: str
    paths: tuple[str, ...]
    markers: str | None
    extras: tuple[str, ...]
    description: str = ""
    deadline_s: float | None = None  # the cell's pytest is stopped after this long (None: never)

    @property
    def cuda_variant(self) -> str | None:
        """``12.1`` -> ``cu121``: the key of ``[indexes]`` and of PyTorch's wheel variants."""
        return None if self.cuda is None else "cu" + self.cuda.replace(".", "")

    @property
    def torch_requirement(self) -> str | None:
        return None if self.torch is None else f"torch=={self.torch}"

    @property
    def triton_requirement(self) -> str | None:
        return None if self.triton is None else f"triton=={self.triton}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "torch": None if self.torch is None else str(self.torch),
            "triton": None if self.triton is None else str(self.triton),
            "cuda": self.cuda,
            "tags": list(self.tags),
            "installer": self.installer.value,
            "tier": self.tier,
            "paths": list(self.paths),
            "markers": self.markers,
            "extras": list(self.extras),
            "description": self.description,
        }


@dataclass(frozen=True)
class Matrix:
    source: str
    format: int
    default_tag: str
    cells: tuple[CellSpec, ...]
    indexes: Mapping[str, PackageIndex] = field(default_factory=dict)
    exclusions: tuple[Exclusion, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.cells)

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted({t for c in self.cells for t in c.tags}))

    def cell(self, cell_id: str) -> CellSpec:
        for cell in self.cells:
            if cell.id == cell_id:
                return cell
        raise ConfigError(f"{self.source}: no cell {cell_id!r}; known cells: {', '.join(self.ids)}")

    def select(self, tags: Iterable[str] = (), ids: Iterable[str] = ()) -> tuple[CellSpec, ...]:
        """Cells carrying any of ``tags`` or named in ``ids``, in file order. Both empty: the default tag."""
        tags, ids = list(tags), list(ids)
        for tag in tags:
            if tag not in self.tags:
                raise ConfigError(f"{self.source}: no cell carries tag {tag!r}; tags: {', '.join(self.tags)}")
        wanted = {self.cell(i).id for i in ids}
        if not tags and not ids:
            tags = [self.default_tag]
        return tuple(c for c in self.cells if c.id in wanted or set(tags) & set(c.tags))

    def exclusion_for(
        self, cell: CellSpec, python_version: str | None = None, platform_name: str | None = None
    ) -> Exclusion | None:
        """The first exclusion that keeps ``cell`` from running here (or in the given environment)."""
        py = python_version or platform.python_version()
        plat = platform_name or platform_tag()
        return next((e for e in self.exclusions if e.matches(cell.id, py, plat)), None)

    def index_for(self, cell: CellSpec) -> PackageIndex | None:
        variant = cell.cuda_variant
        return None if variant is None else self.indexes.get(variant)


def platform_tag() -> str:
    """``linux-x86_64``, ``darwin-arm64``: what exclusions match against."""
    return f"{sys.platform}-{platform.machine().lower()}"


def default_config_path() -> Path:
    return Path(os.environ.get(ENV_CONFIG, DEFAULT_CONFIG_NAME))


def load_matrix(path: str | os.PathLike[str] | None = None) -> Matrix:
    """Read and validate matrix.toml; raises ConfigError with the key and the problem."""
    path = Path(path) if path is not None else default_config_path()
    try:
        text = read_text(path)
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); TOML files are UTF-8"
        ) from None
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: matrix file not found; run from the project root or pass --config PATH"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the matrix file: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    return parse_matrix(data, str(path))


class _Reader:
    """Typed access to one TOML table that names the key path in every error."""

    def __init__(self, source: str, where: str, table: Any, allowed: Iterable[str]) -> None:
        self.source, self.where = source, where
        if not isinstance(table, Mapping):
            self.fail(f"expected a table, got {type(table).__name__}")
        self.table: Mapping[str, Any] = table
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(allowed))}", unknown[0])

    def path(self, key: str | None = None) -> str:
        if key is None:
            return self.where or "<top level>"
        return f"{self.where}.{key}" if self.where else key

    def fail(self, problem: str, key: str | None = None) -> Any:
        raise ConfigError(f"{self.source}: {self.path(key)}: {problem}")

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False
    ) -> Any:
        if key not in self.table:
            if required:
                self.fail("is required", key)
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(f"expected {names}, got {type(value).__name__} {value!r}", key)
        return value

    def strings(
        self, key: str, default: tuple[str, ...], pattern: re.Pattern[str] | None = None
    ) -> tuple[str, ...]:
        value = self.get(key, list, default=None)  # a string here is an error, never its letters
        if value is None:
            return default
        for item in value:
            if not isinstance(item, str) or (pattern is not None and not pattern.fullmatch(item)):
                self.fail(f"item {item!r} is not a valid name", key)
        return tuple(value)

    def version(self, key: str) -> Version | None:
        raw = self.get(key, str)
        if raw is None:
            return None
        try:
            version = Version(raw)
        except InvalidVersion:
            return self.fail(f"{raw!r} is not a PEP 440 version (expected an exact pin such as '2.4.1')", key)
        if raw != str(version):
            return self.fail(f"{raw!r} is not in canonical form; write {str(version)!r}", key)
        return version

    def enum(self, key: str, enum_type: type[enum.Enum], default: Any) -> Any:
        raw = self.get(key, str, default=None)
        if raw is None:
            return default
        try:
            return enum_type(raw)
        except ValueError:
            return self.fail(f"{raw!r} is not one of {', '.join(m.value for m in enum_type)}", key)


_TOP_KEYS = ("format", "default_tag", "defaults", "kinds", "indexes", "cells", "exclude")
_SETTING_KEYS = ("installer", "tier", "tags", "paths", "markers", "extras", "deadline_minutes")
_CELL_KEYS = ("id", "kind", "torch", "triton", "cuda", "description", *_SETTING_KEYS)


def parse_matrix(data: Mapping[str, Any], source: str = "matrix.toml") -> Matrix:
    """Validate parsed TOML and build the Matrix (see the module invariants)."""
    top = _Reader(source, "", data, _TOP_KEYS)
    fmt = top.get("format", int, required=True)
    if fmt > MATRIX_FORMAT:
        top.fail(
            f"format {fmt} is newer than this grace-matrix reads ({MATRIX_FORMAT}); upgrade grace-matrix",
            "format",
        )
    if fmt < 1:
        top.fail(f"format {fmt} is not a valid format version (expected {MATRIX_FORMAT})", "format")

    defaults_reader = _Reader(source, "defaults", top.get("defaults", dict, {}), _SETTING_KEYS)
    _check_settings(defaults_reader)
    defaults = defaults_reader.table
    kinds_reader = _Reader(source, "kinds", top.get("kinds", dict, {}), [k.value for k in CellKind])
    kind_defaults = {}
    for kind, table in kinds_reader.table.items():
        kind_reader = _Reader(source, f"kinds.{kind}", table, _SETTING_KEYS)
        _check_settings(kind_reader)
        kind_defaults[kind] = kind_reader.table

    raw_cells = top.get("cells", list, required=True)
    cells: list[CellSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_cells):
        cell = _parse_cell(source, f"cells[{i}]", raw, defaults, kind_defaults)
        if cell.id in seen:
            raise ConfigError(f"{source}: cells[{i}].id: duplicate cell id {cell.id!r}")
        seen.add(cell.id)
        cells.append(cell)
    if not cells:
        top.fail("declares no cells", "cells")

    default_tag = top.get("default_tag", str, required=True)
    if not any(default_tag in c.tags for c in cells):
        top.fail(f"no cell carries the default tag {default_tag!r}", "default_tag")

    indexes: dict[str, PackageIndex] = {}
    index_table = top.get("indexes", dict, {})
    for variant, raw in index_table.items():
        where = f"indexes.{variant}"
        if not _VARIANT_RE.fullmatch(variant):
            raise ConfigError(f"{source}: {where}: variant must look like 'cu121', 'cpu' or 'rocm6.2'")
        r = _Reader(source, where, raw, ("url", "mode"))
        url = r.get("url", str, required=True)
        if not re.match(r"^(https?|file)://", url):
            r.fail(f"{url!r} is not an http(s):// or file:// URL", "url")
        indexes[variant] = PackageIndex(variant, url, r.enum("mode", IndexMode, IndexMode.EXTRA))

    exclusions: list[Exclusion] = []
    for i, raw in enumerate(top.get("exclude", list, [])):
        r = _Reader(source, f"exclude[{i}]", raw, ("cells", "reason", "python", "platform"))
        spec = r.get("python", str)
        try:
            python = None if spec is None else SpecifierSet(spec)
        except InvalidSpecifier:
            r.fail(f"{spec!r} is not a PEP 440 version specifier (e.g. '>=3.13')", "python")
        exclusions.append(
            Exclusion(
                cells=r.get("cells", str, required=True),
                reason=r.get("reason", str, required=True),
                python=python,
                platform=r.get("platform", str),
            )
        )
    return Matrix(source, fmt, default_tag, tuple(cells), indexes, tuple(exclusions))


def _check_settings(r: _Reader) -> None:
    """Type-check a table of settings where it is written ([defaults], [kinds.*]), so an error names it."""
    r.strings("tags", (), _TAG_RE)
    r.strings("paths", ())
    r.strings("extras", (), _EXTRA_RE)
    for key in ("installer", "tier", "markers"):
        r.get(key, str)


def _parse_cell(
    source: str,
    where: str,
    raw: Any,
    defaults: Mapping[str, Any],
    kind_defaults: Mapping[str, Mapping[str, Any]],
) -> CellSpec:
    r = _Reader(source, where, raw, _CELL_KEYS)
    cell_id = r.get("id", str, required=True)
    if not _ID_RE.fullmatch(cell_id):
        r.fail(f"{cell_id!r} is not a valid id (lower-case letters, digits, '.', '_', '-')", "id")
    kind = r.enum("kind", CellKind, None)
    if kind is None:
        r.fail("is required (venv, current or triton-only)", "kind")
    # Settings: the cell's own value, else its kind's default, else the global default.
    merged = _Reader(source, where, {**defaults, **kind_defaults.get(kind.value, {}), **r.table}, _CELL_KEYS)
    # Tags add up: [defaults], then the kind's, then the cell's own (the other settings override).
    kind_tags = tuple(kind_defaults.get(kind.value, {}).get("tags", ()))
    tags = tuple(dict.fromkeys(tuple(defaults.get("tags", ())) + kind_tags + r.strings("tags", (), _TAG_RE)))
    torch, triton, cuda = r.version("torch"), r.version("triton"), r.get("cuda", str)
    if cuda is not None and not _CUDA_RE.fullmatch(cuda):
        r.fail(f"{cuda!r} is not a CUDA version such as '12.8'", "cuda")
    if kind is CellKind.VENV and (torch is None or triton is None):
        r.fail("a venv cell pins both torch and triton", "torch" if torch is None else "triton")
    if kind is CellKind.TRITON_ONLY and (torch is not None or triton is None):
        r.fail("a triton-only cell pins triton and no torch", "torch" if torch is not None else "triton")
    if kind is CellKind.CURRENT and any(v is not None for v in (torch, triton, cuda)):
        r.fail("a current cell uses the running interpreter's stack; it pins no versions", "torch")
    paths = merged.strings("paths", ("suites",))
    if not paths:
        merged.fail("needs at least one path", "paths")
    for p in paths:
        if not p or Path(p).is_absolute() or ".." in Path(p).parts:
            merged.fail(f"{p!r} must be a path inside the project", "paths")
        if p.startswith("-") or any(c in p for c in "\n\r\x00"):
            merged.fail(f"{p!r} is not a path (pytest would read it as an option); write './{p}'", "paths")
    markers = merged.get("markers", str)
    tier = merged.get("tier", str, "smoke")
    if tier not in TIERS:
        merged.fail(f"{tier!r} is not a suite tier ({', '.join(TIERS)})", "tier")
    deadline = merged.get("deadline_minutes", (int, float))
    if deadline is not None and not 0 < deadline <= 7 * 24 * 60:
        merged.fail(f"{deadline!r} is not a number of minutes between 0 and a week", "deadline_minutes")
    return CellSpec(
        id=cell_id,
        kind=kind,
        torch=torch,
        triton=triton,
        cuda=cuda,
        tags=tags,
        installer=merged.enum("installer", Installer, Installer.PIP),
        tier=tier,
        paths=paths,
        markers=markers or None,
        extras=merged.strings("extras", (), _EXTRA_RE),
        description=r.get("description", str, ""),
        deadline_s=None if deadline is None else float(deadline) * 60,
    )
