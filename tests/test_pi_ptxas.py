"""Which ptxas assembles a rewritten kernel (grace.compat.triton.ptxas_reading).

Inductor's compile workers hand Triton the ptxas torch ships, so a kernel compiled there can declare a
``.version`` that the calling process's Triton ptxas rejects (torch 2.11 CUDA 13 builds: 9.0 against
Triton 3.6's ptxas 12.8). The choice keeps Triton's own tool unless it cannot read the PTX. The
assembly tests run the ptxas binaries bundled with the installed Triton (3.7 bundles 12.8 and a 13.x
``ptxas-blackwell``) and need no GPU.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from grace.compat import torch as torch_compat

triton_compat = pytest.importorskip("grace.compat.triton")
if not triton_compat.HAS_TRITON:
    pytest.skip("Triton is not installed", allow_module_level=True)

RESOURCES = Path(__file__).parent / "resources" / "pi"
PTX_87 = (RESOURCES / "triton-3.6_pi_unused.after.ptx").read_text()


def _with_version(text: str, version: str) -> str:
    return re.sub(r"^\.version \d+\.\d+", f".version {version}", text, count=1, flags=re.MULTILINE)


def _fake_ptxas(tmp_path: Path, release: str) -> Path:
    path = tmp_path / f"ptxas-{release}"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_ptx_isa_reads_the_version_directive() -> None:
    assert triton_compat.ptx_isa(PTX_87) == 87
    assert triton_compat.ptx_isa(_with_version(PTX_87, "9.0")) == 90
    assert triton_compat.ptx_isa(".target sm_90a\n") is None


def test_isa_of_ptxas_follows_the_cuda_releases() -> None:
    assert [triton_compat.isa_of_ptxas(r) for r in ("12.4", "12.8", "13.0", "13.1")] == [84, 87, 90, 91]


def test_own_ptxas_is_kept_when_it_reads_the_ptx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_compat, "inductor_worker_ptxas", lambda: str(_fake_ptxas(tmp_path, "13.0")))
    own = triton_compat.ptxas_for(90)
    assert triton_compat.ptxas_reading(_with_version(PTX_87, "8.0"), 90) == own


def test_worker_ptxas_is_taken_only_when_it_reads_what_triton_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = triton_compat.ptxas_for(90)
    beyond = triton_compat.isa_of_ptxas(own.release) + 3
    newer = _with_version(PTX_87, f"{beyond // 10}.{beyond % 10}")
    monkeypatch.setattr(torch_compat, "inductor_worker_ptxas", lambda: None)
    assert triton_compat.ptxas_reading(newer, 90) == own  # nothing better: Triton's, which will refuse
    same = str(_fake_ptxas(tmp_path, own.release))
    monkeypatch.setattr(torch_compat, "inductor_worker_ptxas", lambda: same)
    assert triton_compat.ptxas_reading(newer, 90) == own  # the worker's reads no more
    worker = _fake_ptxas(tmp_path, "13.9")
    monkeypatch.setattr(torch_compat, "inductor_worker_ptxas", lambda: str(worker))
    chosen = triton_compat.ptxas_reading(newer, 90)
    assert chosen.path == worker and chosen.release == "13.9"


def test_worker_ptxas_is_the_variable_then_the_one_torch_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/named/ptxas")
    assert torch_compat.inductor_worker_ptxas() == "/named/ptxas"
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    root = Path(torch_compat.torch.__file__).parent
    shipped = [p for p in (root / "bin" / "ptxas", root / "_inductor" / "bin" / "ptxas") if p.is_file()]
    assert torch_compat.inductor_worker_ptxas() == (str(shipped[0]) if shipped else None)


def _bundled(name: str) -> Path:
    import triton.backends.nvidia as nv

    path = Path(nv.__file__).parent / "bin" / name
    if not path.is_file():
        pytest.skip(f"this Triton bundles no {name}")
    return path


def test_worker_written_ptx_assembles_with_the_chosen_ptxas_and_the_environment_is_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newer_tool = _bundled("ptxas-blackwell")
    own = triton_compat.ptxas_for(90)
    newer_isa = triton_compat.isa_of_ptxas(triton_compat._tool(newer_tool).release)
    if newer_isa <= triton_compat.isa_of_ptxas(own.release):
        pytest.skip("the bundled ptxas-blackwell reads no newer PTX than Triton's ptxas")
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH", raising=False)
    worker_written = _with_version(PTX_87, f"{newer_isa // 10}.{newer_isa % 10}")
    with pytest.raises(triton_compat.ToolError) as refused:
        triton_compat.assemble(worker_written)  # what grace did before: Triton's own ptxas
    assert "version" in refused.value.log.lower()
    monkeypatch.setattr(torch_compat, "inductor_worker_ptxas", lambda: str(newer_tool))
    chosen = triton_compat.ptxas_reading(worker_written, 90)
    assert chosen.path == newer_tool
    cubin = triton_compat.assemble(worker_written, ptxas=chosen)
    assert cubin[:4] == b"\x7fELF"
    assert "TRITON_PTXAS_PATH" not in os.environ and "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ
