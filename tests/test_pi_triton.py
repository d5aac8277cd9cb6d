"""The Triton path's pure parts: specialisation read from Inductor's triton_meta, kernel descriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from grace.pi import triton as triton_path

RESOURCES = Path(__file__).parent / "resources" / "pi"


def test_divisible_args_in_every_triton_form() -> None:
    names = ["in_ptr0", "out_ptr0", "xnumel"]
    new_form = {"configs": [{(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}]}
    assert triton_path._divisible_args(new_form, names) == {"in_ptr0", "xnumel"}

    @dataclass
    class Descriptor30:
        divisible_by_16: set[int] = field(default_factory=lambda: {1})
        equal_to_1: set[int] = field(default_factory=set)

    @dataclass
    class Descriptor32:
        arg_properties: dict[str, list[int]] = field(default_factory=lambda: {"tt.divisibility": [0, 1]})

    assert triton_path._divisible_args({"configs": [Descriptor30()]}, names) == {"out_ptr0"}
    assert triton_path._divisible_args({"configs": [Descriptor32()]}, names) == {"in_ptr0", "out_ptr0"}
    assert triton_path._divisible_args({}, names) is None
    assert triton_path._divisible_args({"configs": [object()]}, names) is None


@dataclass(frozen=True)
class Located:
    autotuner: str = "triton_poi_fused_add_mul_relu_0"
    name: str = "triton_poi_fused_add_mul_relu_0"
    function: int = 0x1234
    ptx: str | None = None
    arg_names: tuple[str, ...] = ("in_ptr0", "out_ptr0", "xnumel", "XBLOCK")
    signature: dict[str, str] = field(
        default_factory=lambda: {
            "in_ptr0": "*fp32",
            "out_ptr0": "*fp32",
            "xnumel": "i32",
            "XBLOCK": "constexpr",
        }
    )
    shared: int = 0
    num_warps: int = 4
    enable_fp_fusion: bool = True
    equal_to_1: tuple[str, ...] = ()
    ptx_source: str = "asm"


def _scratch(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    from grace.compat import triton as triton_compat

    monkeypatch.setattr(triton_compat, "scratch_parameters", lambda: names)


def test_describe_maps_an_inductor_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    _scratch(monkeypatch, ("global_scratch", "profile_scratch"))
    text = (RESOURCES / "triton-3.9_inductor_add_mul_relu.before.ptx").read_text()
    meta = {"configs": [{(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}]}
    kernel = triton_path.describe(Located(ptx=text), meta)
    assert kernel.problem is None and kernel.param_map is not None
    assert kernel.alignment == {0: 16, 1: 1}  # out_ptr0 was not declared 16-divisible
    unknown = triton_path.describe(Located(ptx=text), {})
    assert unknown.alignment == {0: 16, 1: 16}  # unknown specialisation: assume the strictest


def test_describe_says_why_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    _scratch(monkeypatch, ())  # wrong for this 3.9 PTX: the count no longer fits
    text = (RESOURCES / "triton-3.9_inductor_add_mul_relu.before.ptx").read_text()
    assert "param_count_mismatch" in (triton_path.describe(Located(ptx=text), {}).problem or "")
    assert "no PTX" in (triton_path.describe(Located(ptx=None), {}).problem or "")
    with pytest.raises(triton_path.BuildError) as info:
        triton_path.build(triton_path.describe(Located(ptx=None), {}), [0], 90)
    assert info.value.stage == "rewrite"


def test_built_kernels_are_loaded_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded module belongs to one device's context: the same rewrite on another device loads again."""
    from grace.compat import triton as triton_compat
    from grace.pi import driver

    _scratch(monkeypatch, ("global_scratch", "profile_scratch"))
    text = (RESOURCES / "triton-3.9_inductor_add_mul_relu.before.ptx").read_text()
    kernel = triton_path.describe(Located(ptx=text), {})
    loads: list[str] = []
    monkeypatch.setattr(triton_compat, "assemble", lambda ptx, **_: b"cubin")
    monkeypatch.setattr(
        triton_compat, "ptxas_reading", lambda ptx, capability: type("P", (), {"release": "12.8"})()
    )
    monkeypatch.setattr(
        driver,
        "load_kernel",
        lambda image, name, shared=0: loads.append(name) or driver.LoadedKernel(1, len(loads)),
    )
    monkeypatch.setattr(triton_path, "_built", {})
    on_0 = triton_path.build(kernel, [0], 90, device_index=0)
    assert triton_path.build(kernel, [0], 90, device_index=0) is on_0
    on_1 = triton_path.build(kernel, [0], 90, device_index=1)
    assert on_1 is not on_0 and on_1.function != on_0.function and len(loads) == 2
