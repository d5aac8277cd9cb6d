"""Unit tests of the PTX rewrite (grace.pi.ptx) against golden files and hand-made odd shapes.

The golden pairs in tests/resources/pi are real Triton output for sm_90 (see make_goldens.py): Triton
3.0 (``ld.param.u64``, no ``.ptr``), 3.3 (``.ptr .global .align 1``, a global scratch parameter, an
argument specialised as 1), 3.6 (``ld.param.b64``, two scratch parameters, an unused pointer) and 3.9
(``.version 9.4``, an Inductor kernel). These tests need no Triton and no GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from grace.pi import ptx
from grace.pi.ptx import ParamRole, PtxRefused, RefusalReason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RESOURCES = Path(__file__).parent / "resources" / "pi"
CASES: list[dict[str, Any]] = tomllib.loads((RESOURCES / "cases.toml").read_text())["case"]


def _before(case: dict[str, Any]) -> str:
    return (RESOURCES / f"{case['name']}.before.ptx").read_text()


def _map(case: dict[str, Any], text: str | None = None) -> ptx.ParamMap:
    entry = ptx.parse_entry(text if text is not None else _before(case))
    return ptx.derive_param_map(
        entry, case["signature"], specialised=case["specialised"], scratch=tuple(case["scratch"])
    )


@pytest.fixture(params=CASES, ids=[c["name"] for c in CASES])
def case(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.param


def test_rewrite_matches_golden(case: dict[str, Any]) -> None:
    pmap = _map(case)
    indices = [pmap.index_of(a) for a in case["rewrite"]]
    result = ptx.rewrite_pointer_params(_before(case), pmap, indices)
    assert result.ptx == (RESOURCES / f"{case['name']}.after.ptx").read_text()
    assert {pmap.params[i].arg: n for i, n in result.loads_inserted.items()} == case["loads"]


def test_golden_dialect_is_what_the_case_claims(case: dict[str, Any]) -> None:
    text = _before(case)
    assert case["dialect"]["pointer_decl"] in text
    loads = set(re.findall(r"ld\.param\.(u64|b64)\s", text))
    assert loads == {case["dialect"]["ld_param"]}


def test_param_map_roles(case: dict[str, Any]) -> None:
    pmap = _map(case)
    roles = [p.role for p in pmap.params]
    expected_pointers = [n for n, t in case["signature"].items() if t.startswith("*")]
    assert [p.arg for p in pmap.params if p.role is ParamRole.POINTER] == expected_pointers
    assert [p.arg for p in pmap.params if p.role is ParamRole.SCRATCH] == case["scratch"]
    assert roles[-len(case["scratch"]) :] == [ParamRole.SCRATCH] * len(case["scratch"]) or not case["scratch"]
    for name in case["specialised"]:
        with pytest.raises(KeyError):
            pmap.index_of(name)


def test_each_inserted_load_follows_its_param_load(case: dict[str, Any]) -> None:
    pmap = _map(case)
    result = ptx.rewrite_pointer_params(_before(case), pmap, pmap.pointer_indices())
    lines = result.ptx.splitlines()
    inserted = [i for i, line in enumerate(lines) if ptx.MARKER in line]
    assert len(inserted) == sum(result.loads_inserted.values()) > 0
    for i in inserted:
        reg = re.search(r"ld\.global\.u64\s+(%\w+), \[(%\w+)\]", lines[i])
        assert reg is not None and reg.group(1) == reg.group(2)
        previous = re.match(r"\s*ld\.param\.(?:u64|b64)\s+(%\w+), \[(\w+)\];", lines[i - 1])
        assert previous is not None and previous.group(1) == reg.group(1)
        index = int(previous.group(2).rsplit("_", 1)[1])
        assert pmap.params[index].role is ParamRole.POINTER


def test_rewritten_declarations_point_at_slots(case: dict[str, Any]) -> None:
    pmap = _map(case)
    result = ptx.rewrite_pointer_params(_before(case), pmap, pmap.pointer_indices())
    after = ptx.parse_entry(result.ptx)
    before = pmap.entry
    assert [p.name for p in after.params] == [p.name for p in before.params]
    for old, new in zip(before.params, after.params, strict=True):
        if old.index in pmap.pointer_indices() and old.align is not None:
            assert new.align == ptx.SLOT_ALIGNMENT
        else:
            assert new == old


def test_scalars_and_scratch_are_never_rewritten(case: dict[str, Any]) -> None:
    pmap = _map(case)
    for p in pmap.params:
        if p.role is ParamRole.POINTER:
            continue
        with pytest.raises(PtxRefused) as info:
            ptx.rewrite_pointer_params(_before(case), pmap, [p.index])
        assert info.value.reason is RefusalReason.NOT_A_POINTER


def test_rewriting_twice_is_refused(case: dict[str, Any]) -> None:
    pmap = _map(case)
    once = ptx.rewrite_pointer_params(_before(case), pmap, pmap.pointer_indices()).ptx
    with pytest.raises(PtxRefused) as info:
        ptx.rewrite_pointer_params(once, _map(case, once), [])
    assert info.value.reason is RefusalReason.ALREADY_REWRITTEN


# --- refusals of shapes the rewrite does not know -----------------------------------------------

UNUSED = next(c for c in CASES if c["name"] == "triton-3.6_pi_unused")
FIRST_LOAD = "ld.param.b64 \t%rd5, [pi_unused_param_0];"


def _edited(old: str, new: str) -> str:
    text = _before(UNUSED)
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("replacement", "why"),
    [
        ("mov.u64 \t%rd5, pi_unused_param_0;", "address taken"),
        ("ld.param.v2.u64 \t{%rd5, %rd9}, [pi_unused_param_0];", "vector load"),
        ("@%p1 ld.param.b64 \t%rd5, [pi_unused_param_0];", "predicated load"),
        ("ld.param.b64 \t%rd5, [pi_unused_param_0+8];", "load at an offset"),
        ("ld.param.u32 \t%r30, [pi_unused_param_0];", "32-bit load of a pointer"),
        (
            "ld.param.b64 \t%rd5, [pi_unused_param_0]; ld.param.b64 \t%rd9, [pi_unused_param_0];",
            "two loads, one line",
        ),
    ],
)
def test_unknown_uses_of_a_rewritten_param_are_refused(replacement: str, why: str) -> None:
    text = _edited(FIRST_LOAD, replacement)
    pmap = _map(UNUSED, text)
    with pytest.raises(PtxRefused) as info:
        ptx.rewrite_pointer_params(text, pmap, [0])
    assert info.value.reason is RefusalReason.UNKNOWN_PARAM_USE, why
    assert "pi_unused_param_0" in info.value.detail
    # Other parameters are unaffected by that odd use.
    assert ptx.rewrite_pointer_params(text, pmap, [2]).loads_inserted == {2: 1}


def test_use_outside_the_entry_is_refused() -> None:
    text = (
        _before(UNUSED) + "\n.func grace_other()\n{\n\tld.param.b64 \t%rd1, [pi_unused_param_0];\n\tret;\n}\n"
    )
    pmap = _map(UNUSED, text)
    with pytest.raises(PtxRefused) as info:
        ptx.rewrite_pointer_params(text, pmap, [0])
    assert info.value.reason is RefusalReason.UNKNOWN_PARAM_USE


def test_no_entry_and_two_entries_are_refused() -> None:
    with pytest.raises(PtxRefused) as info:
        ptx.parse_entry(".version 8.7\n.target sm_90a\n.address_size 64\n")
    assert info.value.reason is RefusalReason.NO_ENTRY
    text = _before(UNUSED)
    twice = text + text.replace(".entry pi_unused(", ".entry pi_unused_again(")
    with pytest.raises(PtxRefused) as info:
        ptx.parse_entry(twice)
    assert info.value.reason is RefusalReason.MULTIPLE_ENTRIES


@pytest.mark.parametrize(
    "declaration",
    [
        ".param .u64 .weird pi_unused_param_0",
        ".param .align 8 .u64 pi_unused_param_0",
        ".param .u64 .ptr .global .align pi_unused_param_0",
    ],
)
def test_unknown_declarations_are_refused(declaration: str) -> None:
    text = _edited(".param .u64 .ptr .global .align 1 pi_unused_param_0", declaration)
    with pytest.raises(PtxRefused) as info:
        ptx.parse_entry(text)
    assert info.value.reason is RefusalReason.UNKNOWN_DECLARATION


def test_struct_parameters_parse_as_opaque() -> None:
    text = _edited(".param .u32 pi_unused_param_3", ".param .align 64 .b8 pi_unused_param_3[128]")
    entry = ptx.parse_entry(text)
    param = entry.params[3]
    assert param.is_opaque and param.array_size == 128 and param.align == 64 and param.bits == 1024
    with pytest.raises(PtxRefused) as info:  # a descriptor is not the i32 the signature says
        ptx.derive_param_map(entry, UNUSED["signature"], scratch=tuple(UNUSED["scratch"]))
    assert info.value.reason is RefusalReason.PARAM_TYPE_MISMATCH


def test_signature_that_does_not_fit_is_refused() -> None:
    entry = ptx.parse_entry(_before(UNUSED))
    scratch = tuple(UNUSED["scratch"])
    short = {k: v for k, v in UNUSED["signature"].items() if k != "n"}
    with pytest.raises(PtxRefused) as info:
        ptx.derive_param_map(entry, short, scratch=scratch)
    assert info.value.reason is RefusalReason.PARAM_COUNT_MISMATCH
    with pytest.raises(PtxRefused) as info:  # scratch parameters forgotten
        ptx.derive_param_map(entry, UNUSED["signature"])
    assert info.value.reason is RefusalReason.PARAM_COUNT_MISMATCH
    swapped = dict(UNUSED["signature"], x_ptr="i32")
    with pytest.raises(PtxRefused) as info:  # a scalar where the PTX declares .ptr
        ptx.derive_param_map(entry, swapped, scratch=scratch)
    assert info.value.reason is RefusalReason.PARAM_TYPE_MISMATCH
    as_pointer = dict(UNUSED["signature"], n="*i32")
    with pytest.raises(PtxRefused) as info:  # a pointer where the PTX declares a 32-bit scalar
        ptx.derive_param_map(entry, as_pointer, scratch=scratch)
    assert info.value.reason is RefusalReason.PARAM_TYPE_MISMATCH


def test_pointer_in_shared_space_is_refused() -> None:
    text = _edited(
        ".param .u64 .ptr .global .align 1 pi_unused_param_0",
        ".param .u64 .ptr .shared .align 1 pi_unused_param_0",
    )
    with pytest.raises(PtxRefused) as info:
        _map(UNUSED, text)
    assert info.value.reason is RefusalReason.PARAM_TYPE_MISMATCH


def test_index_checks() -> None:
    pmap = _map(UNUSED)
    with pytest.raises(PtxRefused) as info:
        ptx.rewrite_pointer_params(_before(UNUSED), pmap, [42])
    assert info.value.reason is RefusalReason.NO_SUCH_PARAM
    other = next(c for c in CASES if c["name"] == "triton-3.0_pi_add")
    with pytest.raises(PtxRefused) as info:
        ptx.rewrite_pointer_params(_before(UNUSED), _map(other), [0])
    assert info.value.reason is RefusalReason.PARAM_COUNT_MISMATCH


def test_no_indices_changes_nothing() -> None:
    text = _before(UNUSED)
    result = ptx.rewrite_pointer_params(text, _map(UNUSED), [])
    assert result.ptx == text and result.loads_inserted == {}


def test_u64_dialect_without_ptr_keeps_declarations() -> None:
    add = next(c for c in CASES if c["name"] == "triton-3.0_pi_add")
    pmap = _map(add)
    assert not pmap.entry.declares_pointers
    result = ptx.rewrite_pointer_params(_before(add), pmap, pmap.pointer_indices())
    assert ptx.parse_entry(result.ptx) == pmap.entry


def test_assembles_with_installed_triton_where_its_ptxas_reads_the_version() -> None:
    triton_compat = pytest.importorskip("grace.compat.triton")
    if not triton_compat.HAS_TRITON:
        pytest.skip("Triton is not installed")
    from grace.pi import sass

    ran = 0
    for case in CASES:
        after = (RESOURCES / f"{case['name']}.after.ptx").read_text()
        try:
            cubin = triton_compat.assemble(after)
        except triton_compat.ToolError as exc:
            if "version" in exc.log.lower():
                continue  # a newer PTX ISA than this ptxas reads (e.g. 9.4 with ptxas 12.8)
            raise
        before = triton_compat.assemble(_before(case))
        extra = sass.count_64bit_global_loads(
            triton_compat.disassemble(cubin)
        ) - sass.count_64bit_global_loads(triton_compat.disassemble(before))
        assert extra >= sum(case["loads"].values()), case["name"]
        ran += 1
    assert ran > 0
