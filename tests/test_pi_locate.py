"""Finding Inductor's compiled Triton kernels and their PTX (grace.compat.inductor_kernels), without a GPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

triton_compat = pytest.importorskip("grace.compat.triton")
if not triton_compat.HAS_TRITON:
    pytest.skip("Triton is not installed", allow_module_level=True)

from grace.compat import inductor_kernels  # noqa: E402


class CachingAutotuner:  # the name is what locate_inductor_kernels recognises
    def __init__(self, fn: Any, triton_meta: dict[str, Any], compile_results: list[Any]) -> None:
        self.fn = fn
        self.triton_meta = triton_meta
        self.compile_results = compile_results
        self.launchers: list[Any] = []


def _compiled() -> Any:
    import triton
    from triton.backends.compiler import GPUTarget

    from grace.compat._triton_probe import grace_scratch_probe

    sig = {"x_ptr": "*fp32"}
    version = triton_compat.triton_version()
    assert version is not None
    if version.release < (3, 3):
        src = triton.compiler.ASTSource(fn=grace_scratch_probe, signature=sig, constants={})
    else:
        src = triton.compiler.ASTSource(fn=grace_scratch_probe, signature=sig, constexprs={})
    return grace_scratch_probe, triton.compile(src, target=GPUTarget("cuda", 90, 32))


def test_locates_compiled_kernels_with_their_ptx() -> None:
    fn, kernel = _compiled()
    meta = {"signature": {"x_ptr": "*fp32"}, "configs": [{(0,): [["tt.divisibility", 16]]}]}
    tuner = CachingAutotuner(fn, meta, [SimpleNamespace(kernel=kernel)])
    located = inductor_kernels.locate_inductor_kernels({"triton_probe": tuner, "other": object()})
    assert len(located) == 1
    k = located[0]
    assert k.autotuner == "triton_probe" and k.name == "grace_scratch_probe"
    assert k.ptx_source == "asm" and k.ptx is not None and ".entry grace_scratch_probe" in k.ptx
    assert k.arg_names == ("x_ptr",) and k.signature == {"x_ptr": "*fp32"}


def test_static_launcher_kernels_are_read_from_the_triton_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = "ab" * 32
    key = digest
    try:
        from triton.runtime.cache import _base32

        key = _base32(digest)
    except ImportError:
        pass
    (tmp_path / key).mkdir()
    (tmp_path / key / "k.ptx").write_text(".version 8.7\n.visible .entry k()\n{\n}\n")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    static = SimpleNamespace(name="k", hash=digest, cubin_path=None, function=0x99, shared=0, num_warps=4)
    fn = SimpleNamespace(arg_names=[], __name__="k")
    tuner = CachingAutotuner(fn, {"signature": {}}, [SimpleNamespace(kernel=static)])
    (located,) = inductor_kernels.locate_inductor_kernels({"k": tuner})
    assert located.ptx_source == "cache" and located.function == 0x99
    assert located.ptx is not None and ".entry k()" in located.ptx
    missing = SimpleNamespace(name="gone", hash=digest, cubin_path=None, function=1)
    tuner = CachingAutotuner(fn, {"signature": {}}, [SimpleNamespace(kernel=missing)])
    (located,) = inductor_kernels.locate_inductor_kernels({"k": tuner})
    assert located.ptx is None and located.ptx_source == ""
