"""The pointer-to-pointer rewrite of Triton PTX (parameter indirection, DESIGN.md 3.3).

Problem: a CUDA graph bakes every kernel's arguments in. To feed a replay new input tensors without
copying them into static placeholders, a kernel must read each input's address from a slot of a device
pointer table instead of from its own parameter; then a replay only writes the table.

Design: Triton kernels reach a pointer parameter only through ``ld.param.u64 %rdN, [<entry>_param_<i>];``
(``ld.param.b64`` from Triton 3.4 on). After every such load of a rewritten parameter we insert
``ld.global.u64 %rdN, [%rdN];``: the parameter now holds the slot's address, and the register holds the
tensor's address again before its first use. A ``.ptr .global .align N`` declaration (Triton 3.2+)
is changed to ``.align 8``, which is what the parameter now points at (the slot). Which parameters
may be rewritten comes from a ``ParamMap``: the PTX ``.entry`` list aligned with the kernel's source
signature (non-constexpr arguments, minus those specialised as 1, then Triton's trailing scratch
pointers), cross-checked against the declared types.

Invariants:
- Only the exact shapes above are rewritten. Any other reference to a rewritten parameter (address
  taken, vector or predicated load, use outside the entry), an unknown declaration, more or fewer
  entries than one, or a parameter map that does not fit the declarations raises ``PtxRefused`` with
  a ``RefusalReason``: the caller keeps copying that input. Nothing is guessed.
- Scalars and Triton's scratch pointers are never rewritten.
- The rewrite does not change alignment assumptions the kernel was specialised with: the tensor
  address read from the slot must still satisfy them (the runtime checks; ``grace.pi.triton``).
- Rewritten PTX carries the ``MARKER`` comment; rewriting it again is refused.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

MARKER = "// grace-pi: parameter indirection"
SLOT_ALIGNMENT = 8  # what a rewritten parameter points at: one 8-byte slot


class RefusalReason(str, enum.Enum):
    """Why a PTX module, or one parameter of it, is not rewritten."""

    NO_ENTRY = "no_entry"
    MULTIPLE_ENTRIES = "multiple_entries"
    UNKNOWN_DECLARATION = "unknown_declaration"
    PARAM_COUNT_MISMATCH = "param_count_mismatch"
    PARAM_TYPE_MISMATCH = "param_type_mismatch"
    NOT_A_POINTER = "not_a_pointer"
    NO_SUCH_PARAM = "no_such_param"
    UNKNOWN_PARAM_USE = "unknown_param_use"
    ALREADY_REWRITTEN = "already_rewritten"


class PtxRefused(ValueError):
    """The PTX does not have a shape this rewrite knows; ``reason`` says which rule, ``detail`` where."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class PtxParam:
    """One parameter of the entry as declared: ``.param .u64 .ptr .global .align 1 k_param_0``."""

    index: int
    name: str
    ptx_type: str  # u64, b64, u32, f32, b8 ...
    pointer_space: str | None = None  # "global" for `.ptr .global`; None without `.ptr`
    align: int | None = None  # `.align N` of a pointer or of a byte array
    array_size: int | None = None  # `.b8 name[N]`: a struct passed by value (e.g. a TMA descriptor)

    @property
    def bits(self) -> int:
        return int(self.ptx_type[1:]) * (self.array_size or 1)

    @property
    def is_opaque(self) -> bool:
        return self.array_size is not None


@dataclass(frozen=True)
class PtxEntry:
    """The kernel entry of a PTX module: its name, parameters and the module's version and target."""

    name: str
    version: str
    target: str
    params: tuple[PtxParam, ...]

    @property
    def declares_pointers(self) -> bool:
        """True when the PTX marks pointer parameters with ``.ptr`` (Triton 3.2+)."""
        return any(p.pointer_space is not None for p in self.params)


_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.DOTALL)
_PARAM = re.compile(
    r"^\.param\s+"
    r"(?:\.align\s+(?P<array_align>\d+)\s+)?"
    r"\.(?P<type>[busf](?:8|16|32|64))"
    r"(?:\s+\.ptr(?:\s+\.(?P<space>global|const|shared|local))?(?:\s+\.align\s+(?P<align>\d+))?)?"
    r"\s+(?P<name>[\w$]+)(?:\[(?P<size>\d+)\])?$"
)


def parse_entry(ptx: str) -> PtxEntry:
    """Parse the single ``.entry`` of a PTX module; refuse modules with none, several or odd ones."""
    entries = _ENTRY.findall(ptx)
    if not entries:
        raise PtxRefused(RefusalReason.NO_ENTRY, "no .entry directive in the PTX")
    if len(entries) > 1:
        names = ", ".join(name for name, _ in entries)
        raise PtxRefused(RefusalReason.MULTIPLE_ENTRIES, f"{len(entries)} entries ({names}); expected one")
    name, body = entries[0]
    params: list[PtxParam] = []
    declarations = [d.strip() for d in body.split(",")] if body.strip() else []
    for index, decl in enumerate(declarations):
        decl = " ".join(decl.split())
        match = _PARAM.match(decl)
        if match is None:
            raise PtxRefused(RefusalReason.UNKNOWN_DECLARATION, f"parameter {index}: {decl!r}")
        if match["array_align"] and not match["size"]:
            raise PtxRefused(RefusalReason.UNKNOWN_DECLARATION, f"aligned scalar parameter {index}: {decl!r}")
        params.append(
            PtxParam(
                index=index,
                name=match["name"],
                ptx_type=match["type"],
                pointer_space=match["space"] or ("generic" if ".ptr" in decl else None),
                align=int(match["align"] or match["array_align"] or 0) or None,
                array_size=int(match["size"]) if match["size"] else None,
            )
        )
    version = re.search(r"^\s*\.version\s+(\S+)", ptx, re.MULTILINE)
    target = re.search(r"^\s*\.target\s+([\w,\s]+?)\s*$", ptx, re.MULTILINE)
    return PtxEntry(
        name=name,
        version=version.group(1) if version else "",
        target=target.group(1) if target else "",
        params=tuple(params),
    )


class ParamRole(str, enum.Enum):
    POINTER = "pointer"
    SCALAR = "scalar"
    SCRATCH = "scratch"


@dataclass(frozen=True)
class MappedParam:
    """A PTX parameter with what it is in the source: argument name, Triton type, role."""

    index: int
    ptx_name: str
    arg: str  # source argument name, or the scratch parameter's name
    arg_type: str  # Triton type string ("*fp32", "i32"), "scratch" for scratch pointers
    role: ParamRole
    divisible_by_16: bool = False


@dataclass(frozen=True)
class ParamMap:
    """The entry's parameters aligned with the kernel signature; built by ``derive_param_map``."""

    entry: PtxEntry
    params: tuple[MappedParam, ...]

    def pointer_indices(self) -> tuple[int, ...]:
        return tuple(p.index for p in self.params if p.role is ParamRole.POINTER)

    def index_of(self, arg: str) -> int:
        for p in self.params:
            if p.arg == arg:
                return p.index
        raise KeyError(f"{arg!r} is not a parameter of {self.entry.name} (specialised away or constexpr?)")


_SCALAR_BITS = {
    "i1": (8, 16, 32),
    "i8": (8, 16, 32),
    "u8": (8, 16, 32),
    "i16": (16, 32),
    "u16": (16, 32),
    "fp16": (16, 32),
    "bf16": (16, 32),
    "i32": (32,),
    "u32": (32,),
    "fp32": (32,),
    "i64": (64,),
    "u64": (64,),
    "fp64": (64,),
}


def derive_param_map(
    entry: PtxEntry,
    signature: Mapping[str, str],
    *,
    specialised: Collection[str] = (),
    divisible_by_16: Collection[str] = (),
    scratch: Sequence[str] = (),
) -> ParamMap:
    """Align the entry's parameters with the kernel's source signature.

    ``signature`` lists every argument in order with its Triton type (``constexpr`` for constexprs).
    ``specialised`` names arguments folded into the kernel as constants (ints equal to 1 and ``None``
    in Triton 3.0-3.2). ``scratch`` names the pointers Triton appends (``scratch_parameters()``).
    """
    expected: list[tuple[str, str, ParamRole]] = [
        (name, ty, ParamRole.POINTER if ty.startswith("*") else ParamRole.SCALAR)
        for name, ty in signature.items()
        if ty != "constexpr" and name not in specialised
    ]
    expected += [(name, "scratch", ParamRole.SCRATCH) for name in scratch]
    if len(expected) != len(entry.params):
        listed = ", ".join(n for n, _, _ in expected)
        raise PtxRefused(
            RefusalReason.PARAM_COUNT_MISMATCH,
            f"{entry.name} declares {len(entry.params)} parameters; "
            f"the signature gives {len(expected)} ({listed})",
        )
    mapped: list[MappedParam] = []
    for param, (name, ty, role) in zip(entry.params, expected, strict=True):
        _check_declaration(entry, param, name, ty, role)
        mapped.append(MappedParam(param.index, param.name, name, ty, role, name in divisible_by_16))
    return ParamMap(entry, tuple(mapped))


def _check_declaration(entry: PtxEntry, param: PtxParam, name: str, ty: str, role: ParamRole) -> None:
    def mismatch(why: str) -> PtxRefused:
        return PtxRefused(
            RefusalReason.PARAM_TYPE_MISMATCH,
            f"parameter {param.index} ({name}: {ty}) is .{param.ptx_type}: {why}",
        )

    if role is ParamRole.SCALAR:
        if param.pointer_space is not None:
            raise mismatch("a scalar declared .ptr")
        allowed = _SCALAR_BITS.get(ty)
        if allowed is not None and (param.is_opaque or param.bits not in allowed):
            raise mismatch(f"expected {' or '.join(map(str, allowed))} bits")
        return
    if param.is_opaque or param.bits != 64:
        raise mismatch("a pointer must be a 64-bit scalar parameter")
    if entry.declares_pointers and param.pointer_space not in ("global", "generic"):
        raise mismatch("this PTX marks pointers .ptr, but not this one")


@dataclass(frozen=True)
class RewriteResult:
    """Rewritten PTX and what was done: per rewritten parameter index, the loads inserted."""

    ptx: str
    entry: str
    loads_inserted: dict[int, int]

    @property
    def rewritten(self) -> tuple[int, ...]:
        return tuple(sorted(self.loads_inserted))


def _ld_param(name: str) -> re.Pattern[str]:
    return re.compile(
        r"^(?P<indent>\s*)ld\.param\.(?:u64|b64)\s+(?P<reg>%[\w$]+)\s*,\s*\[\s*"
        + re.escape(name)
        + r"\s*\]\s*;"
        r"\s*(?://.*)?$"
    )


def _entry_body_lines(lines: Sequence[str], entry: str) -> tuple[int, int]:
    """Line range ``[start, end)`` of the entry's body, from the header to its closing brace."""
    header = next(
        (i for i, line in enumerate(lines) if re.search(rf"\.entry\s+{re.escape(entry)}\b", line)), None
    )
    if header is None:
        raise PtxRefused(RefusalReason.NO_ENTRY, f"entry {entry} not found")
    depth = 0
    opened = False
    for i in range(header, len(lines)):
        code = lines[i].split("//", 1)[0]
        for ch in code:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
        if opened and depth == 0:
            return header, i + 1
    raise PtxRefused(RefusalReason.UNKNOWN_DECLARATION, f"entry {entry} has no closing brace")


def rewrite_pointer_params(ptx: str, param_map: ParamMap, indices: Iterable[int]) -> RewriteResult:
    """Make the pointer parameters at ``indices`` point-to-pointer; refuse anything unknown."""
    if MARKER in ptx:
        raise PtxRefused(
            RefusalReason.ALREADY_REWRITTEN, "the PTX already carries the parameter indirection marker"
        )
    entry = parse_entry(ptx)
    if entry != param_map.entry:
        raise PtxRefused(RefusalReason.PARAM_COUNT_MISMATCH, "the parameter map was derived from other PTX")
    chosen = sorted(set(indices))
    by_index = {p.index: p for p in param_map.params}
    for index in chosen:
        if index not in by_index:
            raise PtxRefused(RefusalReason.NO_SUCH_PARAM, f"{entry.name} has no parameter {index}")
        if by_index[index].role is not ParamRole.POINTER:
            mapped = by_index[index]
            raise PtxRefused(
                RefusalReason.NOT_A_POINTER,
                f"parameter {index} ({mapped.arg}: {mapped.arg_type}) is {mapped.role.value}",
            )
    lines = ptx.split("\n")
    start, end = _entry_body_lines(lines, entry.name)
    header_end = next(i for i in range(start, end) if ")" in lines[i].split("//", 1)[0])
    inserts: dict[int, str] = {}
    declarations: dict[int, str] = {}
    loads: dict[int, int] = {}
    for index in chosen:
        param = entry.params[index]
        uses = re.compile(r"(?<![\w$])" + re.escape(param.name) + r"(?![\w$])")
        load = _ld_param(param.name)
        loads[index] = 0
        for i, line in enumerate(lines):
            if not uses.search(line.split("//", 1)[0]):
                continue
            if start <= i <= header_end:
                declarations[i] = _retarget_declaration(line, param)
                continue
            match = load.match(line)
            if match is None or not (header_end < i < end):
                raise PtxRefused(
                    RefusalReason.UNKNOWN_PARAM_USE,
                    f"parameter {index} ({param.name}) used at line {i + 1}: {line.strip()!r}",
                )
            reg = match["reg"]
            inserts[i] = f"{match['indent']}ld.global.u64 \t{reg}, [{reg}]; {MARKER}"
            loads[index] += 1
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(declarations.get(i, line))
        if i in inserts:
            out.append(inserts[i])
    return RewriteResult(ptx="\n".join(out), entry=entry.name, loads_inserted=loads)


def _retarget_declaration(line: str, param: PtxParam) -> str:
    """``.ptr .global .align N`` -> ``.align 8``: the parameter now points at an 8-byte slot.

    A declaration without ``.align`` makes no alignment claim and stays as it is.
    """
    if param.pointer_space is None:
        return line
    pattern = re.compile(r"(\.ptr(?:\s+\.\w+)?)\s+\.align\s+\d+(\s+" + re.escape(param.name) + r"(?![\w$]))")
    return pattern.sub(rf"\1 .align {SLOT_ALIGNMENT}\2", line, count=1)
