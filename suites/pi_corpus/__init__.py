"""The kernels the PI stage suite compiles, rewrites and assembles: hand-written and Inductor-generated.

Problem: PI breakage must be detected in every Triton release, including Triton-only cells without
torch. Hand-written kernels cover the argument shapes; Inductor's own kernels cover what grace meets in
practice. The Inductor sources are committed (``inductor/*.py.txt``, see ``generate_inductor.py``) and
compiled through ``inductor_shim`` so torch is never imported.

Design: ``corpus()`` returns ``CorpusKernel`` descriptions: the jit function, its full signature (every
argument, constexprs included, in order), constexpr values, the arguments specialised as 16-divisible or
as 1, and launch options. The Inductor kernels take their signature and specialisation from their own
``triton_meta`` and their constexpr values from ``inductor/configs.toml`` by heuristic kind.

Invariant: importing this package imports nothing of Triton; ``corpus()`` does (it needs Triton).
"""

from __future__ import annotations

import atexit
import importlib.util
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 cells
    import tomli as tomllib

HERE = Path(__file__).parent
INDUCTOR_DIR = HERE / "inductor"
CONFIGS_FORMAT = 1


@dataclass(frozen=True)
class CorpusKernel:
    """One kernel to compile for the PI stages, with everything ``compile_for_target`` needs."""

    subject: str
    origin: str  # "handwritten" | "inductor"
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    divisible_by_16: tuple[str, ...] = ()
    equal_to_1: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    enable_fp_fusion: bool = True

    @property
    def pointer_args(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.signature.items() if t.startswith("*"))


def _handwritten() -> list[CorpusKernel]:
    from suites.pi_corpus import handwritten as hw

    ptrs16 = ("x_ptr", "y_ptr", "out_ptr")
    return [
        CorpusKernel(
            "handwritten/pi_add",
            "handwritten",
            hw.pi_add,
            {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            divisible_by_16=(*ptrs16, "n"),
        ),
        CorpusKernel(
            "handwritten/pi_axpy_strided",
            "handwritten",
            hw.pi_axpy_strided,
            {
                "x_ptr": "*fp32",
                "out_ptr": "*fp32",
                "alpha": "fp32",
                "stride": "i32",
                "n": "i64",
                "BLOCK": "constexpr",
            },
            {"BLOCK": 512},
            divisible_by_16=("x_ptr", "out_ptr"),
            equal_to_1=("stride",),
        ),
        CorpusKernel(
            "handwritten/pi_unused",
            "handwritten",
            hw.pi_unused,
            {"x_ptr": "*fp32", "unused_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 256},
            divisible_by_16=("x_ptr", "unused_ptr", "out_ptr"),
        ),
        CorpusKernel(
            "handwritten/pi_gather",
            "handwritten",
            hw.pi_gather,
            {"src_ptr": "*fp32", "idx_ptr": "*i64", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 256},
            divisible_by_16=("idx_ptr", "out_ptr"),  # src_ptr unaligned: a view at an odd offset
        ),
        CorpusKernel(
            "handwritten/pi_matmul",
            "handwritten",
            hw.pi_matmul,
            {
                "a_ptr": "*fp16",
                "b_ptr": "*fp16",
                "c_ptr": "*fp16",
                "M": "i32",
                "N": "i32",
                "K": "i32",
                "stride_am": "i32",
                "stride_bk": "i32",
                "stride_cm": "i32",
                "BLOCK_M": "constexpr",
                "BLOCK_N": "constexpr",
                "BLOCK_K": "constexpr",
            },
            {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32},
            divisible_by_16=("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
        ),
        CorpusKernel(
            "handwritten/pi_atomic_sum",
            "handwritten",
            hw.pi_atomic_sum,
            {"x_ptr": "*fp32", "total_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            divisible_by_16=("x_ptr", "total_ptr"),
        ),
    ]


_IMPORT_LINE = re.compile(
    r"^(from torch\.\S+ import .*|import torch.*|triton_helpers\.set_driver_to_\w+\(\))$"
)
_SHIM_IMPORT = (
    "from suites.pi_corpus.inductor_shim import (  # noqa: F401\n"
    "    AutotuneHint, DeviceProperties, ReductionHint, TileHint, libdevice, tl_math, triton_helpers,\n"
    "    triton_heuristics,\n"
    ")\n"
)
_module_dir: Path | None = None


def _scratch_dir() -> Path:
    global _module_dir
    if _module_dir is None:
        _module_dir = Path(tempfile.mkdtemp(prefix="grace-pi-corpus-"))
        atexit.register(shutil.rmtree, _module_dir, True)
    return _module_dir


def load_inductor_source(path: Path) -> Any:
    """Import an Inductor kernel source with its torch imports replaced by ``inductor_shim``.

    Written to a real file first: Triton's ``jit`` reads the function's source through ``inspect``.
    """
    lines = path.read_text().splitlines()
    body = "\n".join(line for line in lines if not _IMPORT_LINE.match(line.strip()))
    module_name = f"grace_pi_corpus_{path.name.split('.')[0]}"
    target = _scratch_dir() / f"{module_name}.py"
    target.write_text(_SHIM_IMPORT + body + "\n")
    spec = importlib.util.spec_from_file_location(module_name, target)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {target}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _divisible_indices(configs: Any) -> set[int]:
    """Argument indices marked 16-divisible in Inductor's ``configs`` (the 3.3+ attribute dict form)."""
    indices: set[int] = set()
    for config in configs or ():
        if not isinstance(config, Mapping):
            raise ValueError(f"unsupported triton_meta config form {config!r}; regenerate the corpus")
        for key, attrs in config.items():
            if any(list(a) == ["tt.divisibility", 16] for a in attrs):
                indices.add(key[0])
    return indices


def _inductor() -> list[CorpusKernel]:
    from suites.pi_corpus.inductor_shim import INDUCTOR_META_ATTRIBUTE

    configs = tomllib.loads((INDUCTOR_DIR / "configs.toml").read_text())
    if configs.get("format") != CONFIGS_FORMAT:
        raise ValueError(f"inductor/configs.toml format {configs.get('format')!r}, expected {CONFIGS_FORMAT}")
    kernels: list[CorpusKernel] = []
    for path in sorted(INDUCTOR_DIR.glob("*.py.txt")):
        module = load_inductor_source(path)
        fns = [v for v in vars(module).values() if hasattr(v, INDUCTOR_META_ATTRIBUTE)]
        if len(fns) != 1:
            raise ValueError(f"{path.name}: expected one decorated kernel, found {len(fns)}")
        fn = fns[0]
        meta = getattr(fn, INDUCTOR_META_ATTRIBUTE)
        triton_meta = meta["triton_meta"]
        kind = dict(configs[meta["kind"]])
        override = configs.get("kernels", {}).get(fn.__name__, {})
        kind["constexprs"] = {**kind["constexprs"], **override.get("constexprs", {})}
        kind.update({k: v for k, v in override.items() if k != "constexprs"})
        signature = dict(triton_meta["signature"])
        names = list(signature)
        constants = dict(triton_meta.get("constants", {}))
        equal_to_1 = tuple(n for n, v in constants.items() if v == 1 and signature.get(n) != "constexpr")
        constexprs = {
            n: constants.get(n, kind["constexprs"].get(n)) for n, t in signature.items() if t == "constexpr"
        }
        missing = [n for n, v in constexprs.items() if v is None]
        if missing:
            raise ValueError(
                f"{path.name}: no value for constexpr {missing} in configs.toml [{meta['kind']}]"
            )
        kernels.append(
            CorpusKernel(
                subject=f"inductor/{fn.__name__}",
                origin="inductor",
                fn=fn,
                signature=signature,
                constexprs=constexprs,
                divisible_by_16=tuple(
                    names[i] for i in sorted(_divisible_indices(triton_meta.get("configs")))
                ),
                equal_to_1=equal_to_1,
                num_warps=int(kind["num_warps"]),
                num_stages=int(kind["num_stages"]),
                enable_fp_fusion=bool(triton_meta.get("enable_fp_fusion", True)),
            )
        )
    return kernels


def corpus() -> list[CorpusKernel]:
    """Every kernel of the corpus, hand-written first. Imports Triton."""
    return [*_handwritten(), *_inductor()]
