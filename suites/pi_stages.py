"""The CPU stages of parameter indirection for one kernel: compile, map, rewrite, assemble, check SASS.

Problem: PI breaks when a Triton release changes the PTX it emits (a new parameter, a new load form,
a new ISA version its ptxas needs). That must show up per cell, as stage results in the store, even in
cells that have Triton but no torch and no GPU.

Design: ``run_cpu_stages(kernel)`` runs the stages in pipeline order and returns one ``StageOutcome`` per
stage: ``locate`` (compile for sm_90 and align the PTX entry with the signature), ``rewrite`` (every
pointer argument made point-to-pointer), ``assemble`` (this Triton's ptxas accepts the rewritten PTX and
cuobjdump's SASS has at least one more 64-bit global load per ``ld.param`` that was rewritten). A stage
after a failed one is a skip that names the failure. Nothing here needs torch or a GPU.

Invariant: a refusal of the rewrite (an unknown PTX shape) is a failure of the ``rewrite`` stage with the
refusal's reason, never an exception out of this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from grace.compat import triton as triton_compat
from grace.pi import ptx, sass
from suites.pi_corpus import CorpusKernel
from suites.records import PIStage, StageStatus


@dataclass(frozen=True)
class StageOutcome:
    stage: PIStage
    status: StageStatus
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CpuArtifacts:
    """What the CPU stages produced, for the GPU stages that follow on a GPU cell."""

    compiled: triton_compat.CompiledArtifacts | None = None
    param_map: ptx.ParamMap | None = None
    rewritten: ptx.RewriteResult | None = None
    cubin: bytes | None = None


def _skip_rest(outcomes: list[StageOutcome], stages: tuple[PIStage, ...], why: str) -> None:
    done = {o.stage for o in outcomes}
    outcomes.extend(StageOutcome(s, StageStatus.SKIP, why) for s in stages if s not in done)


CPU_STAGES = (PIStage.LOCATE, PIStage.REWRITE, PIStage.ASSEMBLE)


def run_cpu_stages(kernel: CorpusKernel, capability: int = 90) -> tuple[list[StageOutcome], CpuArtifacts]:
    outcomes: list[StageOutcome] = []
    art = CpuArtifacts()
    started = time.perf_counter()
    try:
        art.compiled = triton_compat.compile_for_target(
            kernel.fn,
            kernel.signature,
            kernel.constexprs,
            divisible_by_16=kernel.divisible_by_16,
            equal_to_1=kernel.equal_to_1,
            capability=capability,
            num_warps=kernel.num_warps,
            num_stages=kernel.num_stages,
            enable_fp_fusion=kernel.enable_fp_fusion,
        )
        entry = ptx.parse_entry(art.compiled.ptx)
        art.param_map = ptx.derive_param_map(
            entry,
            kernel.signature,
            specialised=kernel.equal_to_1,
            divisible_by_16=kernel.divisible_by_16,
            scratch=triton_compat.scratch_parameters(),
        )
    except ptx.PtxRefused as exc:
        outcomes.append(
            StageOutcome(PIStage.LOCATE, StageStatus.FAIL, str(exc), {"reason": exc.reason.value})
        )
        _skip_rest(outcomes, CPU_STAGES, "locate failed")
        return outcomes, art
    except Exception as exc:  # a compile failure of this Triton is a finding, not a crash
        outcomes.append(StageOutcome(PIStage.LOCATE, StageStatus.FAIL, f"compile for sm_{capability}: {exc}"))
        _skip_rest(outcomes, CPU_STAGES, "locate failed")
        return outcomes, art
    pmap = art.param_map
    outcomes.append(
        StageOutcome(
            PIStage.LOCATE,
            StageStatus.PASS,
            f"{entry.name}: PTX {entry.version} for {entry.target}, {len(entry.params)} parameters",
            {
                "ptx_version": entry.version,
                "target": entry.target,
                "params": [f"{p.arg}:{p.role.value}" for p in pmap.params],
                "declares_pointers": entry.declares_pointers,
                "compile_s": round(time.perf_counter() - started, 3),
            },
        )
    )
    try:
        art.rewritten = ptx.rewrite_pointer_params(art.compiled.ptx, pmap, pmap.pointer_indices())
    except ptx.PtxRefused as exc:
        outcomes.append(
            StageOutcome(PIStage.REWRITE, StageStatus.FAIL, str(exc), {"reason": exc.reason.value})
        )
        _skip_rest(outcomes, CPU_STAGES, "rewrite refused")
        return outcomes, art
    loads = art.rewritten.loads_inserted
    outcomes.append(
        StageOutcome(
            PIStage.REWRITE,
            StageStatus.PASS,
            f"{len(loads)} pointer parameters, {sum(loads.values())} loads inserted",
            {"loads_inserted": {pmap.params[i].arg: n for i, n in loads.items()}},
        )
    )
    tool = triton_compat.ptxas_reading(art.compiled.ptx, capability)
    try:
        options = {
            "num_warps": art.compiled.num_warps,
            "enable_fp_fusion": art.compiled.enable_fp_fusion,
            "ptxas": tool,
        }
        original = triton_compat.assemble(art.compiled.ptx, capability=capability, **options)
        art.cubin = triton_compat.assemble(art.rewritten.ptx, capability=capability, **options)
        before = sass.count_64bit_global_loads(triton_compat.disassemble(original))
        after = sass.count_64bit_global_loads(triton_compat.disassemble(art.cubin))
    except triton_compat.ToolError as exc:
        outcomes.append(
            StageOutcome(
                PIStage.ASSEMBLE, StageStatus.FAIL, str(exc).splitlines()[0], {"log": exc.log[-2000:]}
            )
        )
        return outcomes, art
    details = {
        "ptxas": tool.release,
        "ptxas_name": tool.path.name,
        "cuobjdump": triton_compat.cuobjdump().release,
        "ldg64_before": before,
        "ldg64_after": after,
        "cubin_bytes": len(art.cubin),
    }
    expected = sum(loads.values())
    if after - before < expected:
        message = f"SASS has {after - before} more 64-bit global loads; expected at least {expected}"
        outcomes.append(StageOutcome(PIStage.ASSEMBLE, StageStatus.FAIL, message, details))
        return outcomes, art
    message = f"ptxas {tool.release} ({tool.path.name}): LDG.E.64 {before} -> {after}"
    outcomes.append(StageOutcome(PIStage.ASSEMBLE, StageStatus.PASS, message, details))
    return outcomes, art
