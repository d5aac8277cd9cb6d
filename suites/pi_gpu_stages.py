"""The GPU stages of the PI stage suite, without torch: load, patch a captured graph, run at new addresses.

Problem: the CPU stages prove the rewritten kernel assembles; a GPU cell must also show that it loads,
that a captured kernel node accepts it, and that it computes what the original kernel computes when
its inputs live somewhere else, which is the whole point of parameter indirection.

Design: through the driver API only (grace.pi.driver over cuda-bindings), so a Triton-only GPU cell runs
it too. ``load``: both cubins load. ``patch``: one launch of the original kernel on placeholder buffers is
captured, its node is switched to the rewritten kernel and its pointer parameters to the slots of a
pointer table, and the graph is instantiated. ``numeric``: the original kernel runs directly on input set
A; the graph runs with the table pointing at A, then at a fresh copy B; both outputs must equal the
original's byte for byte. Launch shapes come from ``pi_corpus/launch.toml``; kernels without one stop
after ``load``. Without a GPU every stage is a skip that says so.
"""

from __future__ import annotations

import random
import struct
import sys
from dataclasses import dataclass
from typing import Any

from suites.pi_corpus import HERE, CorpusKernel
from suites.pi_stages import CpuArtifacts, StageOutcome
from suites.records import PIStage, StageStatus

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GPU_STAGES = (PIStage.LOAD, PIStage.PATCH, PIStage.NUMERIC)
_ELEMENT = {"fp32": ("f", 4), "fp16": ("e", 2), "i64": ("q", 8), "i32": ("i", 4)}
_SCALAR = {"u32": "<I", "b32": "<I", "s32": "<i", "f32": "<f", "u64": "<Q", "b64": "<Q", "s64": "<q"}


def _recipes() -> dict[str, Any]:
    data = tomllib.loads((HERE / "launch.toml").read_text())
    return dict(data.get("kernel", {}))


def _skip_all(why: str) -> list[StageOutcome]:
    return [StageOutcome(s, StageStatus.SKIP, why) for s in GPU_STAGES]


def gpu_unavailable() -> str | None:
    """Why the GPU stages cannot run here, or None when they can."""
    try:
        from grace.pi import driver
    except ImportError as exc:  # pragma: no cover - grace.pi always imports
        return f"grace.pi.driver: {exc}"
    try:
        from grace.compat import cuda  # noqa: F401
    except ImportError:
        return "grace.compat.cuda is not part of this checkout"
    if driver.device_count() == 0:
        return "no CUDA device (or no cuda-bindings) in this cell"
    return None


@dataclass
class _Buffers:
    pointers: dict[str, int]
    sizes: dict[str, int]


def run_gpu_stages(kernel: CorpusKernel, art: CpuArtifacts, *, cpu_ok: bool) -> list[StageOutcome]:
    if not cpu_ok or art.compiled is None or art.cubin is None or art.param_map is None:
        return _skip_all("an earlier stage failed")
    why = gpu_unavailable()
    if why is not None:
        return _skip_all(why)
    from grace.compat import cuda as cuda_compat
    from grace.pi import driver

    outcomes: list[StageOutcome] = []
    try:
        cuda_compat.make_primary_context_current(0)
        original = driver.load_kernel(art.compiled.cubin, art.compiled.name, art.compiled.shared)
        rewritten = driver.load_kernel(art.cubin, art.compiled.name, art.compiled.shared)
    except Exception as exc:
        outcomes.append(StageOutcome(PIStage.LOAD, StageStatus.FAIL, f"{type(exc).__name__}: {exc}"))
        outcomes += [StageOutcome(s, StageStatus.SKIP, "load failed") for s in GPU_STAGES[1:]]
        return outcomes
    outcomes.append(StageOutcome(PIStage.LOAD, StageStatus.PASS, "original and rewritten cubins loaded"))
    recipe = _recipes().get(kernel.subject)
    if recipe is None:
        outcomes += [
            StageOutcome(s, StageStatus.SKIP, "no launch recipe in launch.toml") for s in GPU_STAGES[1:]
        ]
        return outcomes
    try:
        outcomes += _patch_and_compare(kernel, art, recipe, original.function, rewritten.function)
    finally:
        driver.unload_module(original.module)
        driver.unload_module(rewritten.module)
    return outcomes


def _fill(kernel: CorpusKernel, recipe: dict[str, Any], name: str, rng: random.Random) -> bytes:
    fmt, size = _ELEMENT[kernel.signature[name].lstrip("*")]
    count = int(recipe["buffers"][name])
    if name in recipe.get("outputs", ()):
        return bytes(count * size)
    bound = recipe.get("index_buffers", {}).get(name)
    if bound is not None:
        return struct.pack(f"<{count}{fmt}", *(rng.randrange(int(bound)) for _ in range(count)))
    return struct.pack(f"<{count}{fmt}", *(rng.uniform(-2.0, 2.0) for _ in range(count)))


def _allocate(contents: dict[str, bytes]) -> _Buffers:
    from grace.pi import driver

    pointers = {}
    for name, data in contents.items():
        pointers[name] = driver.mem_alloc(len(data))
        driver.copy_to_device(pointers[name], data)
    return _Buffers(pointers, {n: len(d) for n, d in contents.items()})


def _free(buffers: _Buffers) -> None:
    from grace.pi import driver

    for ptr in buffers.pointers.values():
        driver.mem_free(ptr)


def _params(art: CpuArtifacts, recipe: dict[str, Any], pointers: dict[str, int]) -> list[bytes]:
    assert art.param_map is not None
    values = []
    for p in art.param_map.params:
        declared = art.param_map.entry.params[p.index]
        if p.role.value == "scratch":
            values.append(bytes(8))  # no scratch memory: these kernels need none
        elif p.role.value == "pointer":
            values.append(struct.pack("<Q", pointers[p.arg]))
        else:
            values.append(struct.pack(_SCALAR[declared.ptx_type], recipe["scalars"][p.arg]))
    return values


def _patch_and_compare(
    kernel: CorpusKernel, art: CpuArtifacts, recipe: dict[str, Any], original: int, rewritten: int
) -> list[StageOutcome]:
    from grace.compat import cuda as cuda_compat
    from grace.pi import driver

    assert art.param_map is not None and art.compiled is not None
    rng = random.Random(0)
    grid = tuple(int(g) for g in recipe["grid"])
    block = (32 * art.compiled.num_warps, 1, 1)
    shared = art.compiled.shared
    pointer_args = [p for p in art.param_map.params if p.role.value == "pointer"]
    contents = {p.arg: _fill(kernel, recipe, p.arg, rng) for p in pointer_args}
    outputs = list(recipe["outputs"])
    placeholders = _allocate({n: bytes(len(d)) for n, d in contents.items()})
    set_a = _allocate(contents)
    set_b = _allocate(contents)
    table = driver.mem_alloc(8 * len(pointer_args))
    graph = graph_exec = 0
    keep: list[Any] = []
    try:
        # Reference: the original kernel on set A.
        params = driver.ParamBuffer(_params(art, recipe, set_a.pointers))
        driver.launch(original, grid, block, shared, params)  # type: ignore[arg-type]
        driver.synchronize()
        reference = {n: driver.copy_from_device(set_a.pointers[n], set_a.sizes[n]) for n in outputs}
        for n in outputs:
            driver.copy_to_device(set_a.pointers[n], bytes(set_a.sizes[n]))
        # Patch: capture the original on placeholders, then point the node at the table.
        captured = driver.ParamBuffer(_params(art, recipe, placeholders.pointers))
        keep.append(captured)
        graph = driver.capture_launch(original, grid, block, shared, captured)  # type: ignore[arg-type]
        nodes = cuda_compat.graph_nodes(graph)
        if len(nodes) != 1:
            return [
                StageOutcome(
                    PIStage.PATCH, StageStatus.FAIL, f"captured graph has {len(nodes)} nodes, expected 1"
                ),
                StageOutcome(PIStage.NUMERIC, StageStatus.SKIP, "patch failed"),
            ]
        slots = {p.index: struct.pack("<Q", table + 8 * k) for k, p in enumerate(pointer_args)}
        driver.patch_kernel_node(nodes[0], rewritten, slots)
        graph_exec = driver.instantiate(graph)
    except Exception as exc:
        _release(placeholders, set_a, set_b, table, graph, graph_exec)
        return [
            StageOutcome(PIStage.PATCH, StageStatus.FAIL, f"{type(exc).__name__}: {exc}"),
            StageOutcome(PIStage.NUMERIC, StageStatus.SKIP, "patch failed"),
        ]
    outcomes = [
        StageOutcome(
            PIStage.PATCH, StageStatus.PASS, f"node switched to the rewritten kernel, {len(slots)} slots"
        )
    ]
    try:
        mismatches = []
        for label, buffers in (("A", set_a), ("B", set_b)):
            addresses = b"".join(struct.pack("<Q", buffers.pointers[p.arg]) for p in pointer_args)
            driver.copy_to_device(table, addresses)
            driver.graph_launch(graph_exec)
            driver.synchronize()
            for n in outputs:
                got = driver.copy_from_device(buffers.pointers[n], buffers.sizes[n])
                if got != reference[n]:
                    differing = sum(1 for x, y in zip(got, reference[n], strict=True) if x != y)
                    mismatches.append(f"{n} at set {label}: {differing} bytes differ")
        if mismatches:
            outcomes.append(StageOutcome(PIStage.NUMERIC, StageStatus.FAIL, "; ".join(mismatches)))
        else:
            outcomes.append(
                StageOutcome(
                    PIStage.NUMERIC,
                    StageStatus.PASS,
                    "outputs equal the original kernel's byte for byte at two moved input sets",
                    {"bytes_per_replay": 8 * len(pointer_args)},
                )
            )
    except Exception as exc:
        outcomes.append(StageOutcome(PIStage.NUMERIC, StageStatus.FAIL, f"{type(exc).__name__}: {exc}"))
    finally:
        _release(placeholders, set_a, set_b, table, graph, graph_exec)
    return outcomes


def _release(*resources: Any) -> None:
    from grace.pi import driver

    placeholders, set_a, set_b, table, graph, graph_exec = resources
    if graph:
        driver.graph_destroy(graph, graph_exec or None)
    for buffers in (placeholders, set_a, set_b):
        _free(buffers)
    driver.mem_free(table)
