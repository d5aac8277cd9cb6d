"""PI stage suite: every cell compiles real Triton kernels for sm_90, rewrites them and assembles them.

Runs in every cell that has Triton, including Triton-only cells without torch or a GPU: hand-written
kernels and Inductor-generated ones (suites/pi_corpus) are compiled for ``GPUTarget("cuda", 90, 32)``,
their pointer parameters rewritten point-to-pointer, the result assembled with this Triton's own ptxas
and disassembled with its cuobjdump (suites/pi_stages.py). On a cell with a GPU and cuda-bindings, the
rewritten kernels are also loaded, patched into a captured graph and run at moved input addresses
(suites/pi_gpu_stages.py). Each stage is emitted as a ``PIStageRecord`` through ``grace_record``; a test
fails when a stage fails, after its records are emitted.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from suites.records import PIStage, PIStageRecord, StageStatus

pytestmark = pytest.mark.pi

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _corpus() -> list[Any]:
    if not HAS_TRITON:
        return []
    from suites.pi_corpus import corpus

    return corpus()


KERNELS = _corpus()


def _emit(grace_record: Callable[[Any], None], subject: str, outcomes: list[Any]) -> None:
    from grace.compat import triton as triton_compat

    version = str(triton_compat.triton_version())
    for outcome in outcomes:
        grace_record(
            PIStageRecord(
                subject=subject,
                stage=outcome.stage,
                status=outcome.status,
                message=outcome.message,
                triton_version=version,
                details=dict(outcome.details),
            )
        )


def _failures(outcomes: list[Any]) -> list[str]:
    return [f"{o.stage.value}: {o.message}" for o in outcomes if o.status is StageStatus.FAIL]


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed in this cell")
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.subject for k in KERNELS])
def test_pi_stages(kernel: Any, grace_record: Callable[[Any], None]) -> None:
    from suites import pi_gpu_stages
    from suites.pi_stages import run_cpu_stages

    outcomes, artifacts = run_cpu_stages(kernel)
    outcomes += pi_gpu_stages.run_gpu_stages(kernel, artifacts, cpu_ok=not _failures(outcomes))
    _emit(grace_record, kernel.subject, outcomes)
    assert [o.stage for o in outcomes][:3] == [PIStage.LOCATE, PIStage.REWRITE, PIStage.ASSEMBLE]
    failures = _failures(outcomes)
    assert not failures, "; ".join(failures)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed in this cell")
def test_scratch_parameters_match_known_releases(grace_record: Callable[[Any], None]) -> None:
    """The probe of trailing parameters agrees with what is known of each release (DESIGN.md 3.3)."""
    from packaging.version import Version

    from grace.compat import triton as triton_compat

    version = triton_compat.triton_version()
    assert version is not None
    probed = triton_compat.scratch_parameters()
    known = {
        Version("3.0"): (),
        Version("3.3"): ("global_scratch",),
        Version("3.5"): ("global_scratch", "profile_scratch"),
    }
    expected = next(v for k, v in sorted(known.items(), reverse=True) if version >= k)
    status = StageStatus.PASS if probed == expected else StageStatus.FAIL
    grace_record(
        PIStageRecord(
            subject="triton/entry-layout",
            stage=PIStage.LOCATE,
            status=status,
            message=f"trailing parameters {list(probed)}; expected {list(expected)} for {version}",
            triton_version=str(version),
            details={"scratch": list(probed), "ptxas": triton_compat.ptxas_for(90).release},
        )
    )
    assert probed == expected
