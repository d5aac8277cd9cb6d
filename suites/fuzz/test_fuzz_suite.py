"""The fuzz suite: grace against eager on random models and schedules until the deadline (marker fuzz).

Run: ``pytest suites/fuzz -m fuzz`` (deadline from suites/fuzz/fuzz.toml per device, or
``GRACE_FUZZ_SECONDS``; base seed from the file or ``GRACE_FUZZ_SEED``). It runs where the grace mode of
the device is selected (``--modes``): ``grace`` on CUDA (the graph paths), ``grace-cpu`` without (the
no-graph path). One ``CorrectnessRecord`` of workload ``fuzz`` carries the counts and the failing
schedules (suites/fuzz/recording.py); the test fails after recording when a case differs from eager
(a case where eager itself raises is invalid: counted, kept in the record and warned about).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="the fuzz suite needs torch (Triton-only cells run the PI checks)")

import torch

from suites.fuzz.recording import WORKLOAD, fuzz_code_hash, replay_command, to_record
from suites.fuzz.session import fuzz
from suites.fuzz.settings import load_settings
from suites.modes import Mode, parse_modes, unavailable_reason
from suites.options import SuiteOptions
from suites.records import CorrectnessRecord, CorrectnessStatus, Record, WorkloadRef

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def test_fuzz(suite_options: SuiteOptions, grace_record: Callable[[Record], None]) -> None:
    device = _device(suite_options.device)
    mode = Mode.GRACE if device.type == "cuda" else Mode.GRACE_CPU
    if mode not in parse_modes(suite_options.modes):
        pytest.skip(f"mode {mode.value} is not selected (--modes): the fuzzer runs grace in that mode")
    reason = unavailable_reason(mode, device.type)
    if reason is not None:
        ref = WorkloadRef(WORKLOAD, suite_options.tier, ("fuzz",), fuzz_code_hash())
        grace_record(CorrectnessRecord(ref, mode.value, CorrectnessStatus.SKIP, reason))
        pytest.skip(reason)
    summary = fuzz(load_settings(), device)
    grace_record(to_record(summary, mode.value, suite_options.tier))
    if summary.invalid_cases:  # eager itself raised: a generator bug, recorded, not a grace failure
        message = f"{summary.invalid_cases} fuzz cases were invalid (eager raised); see the record"
        warnings.warn(message, stacklevel=1)
    if summary.failed_cases:
        lines = [f"{summary.failed_cases} of {summary.cases} cases differ from eager"]
        for result in summary.failures:
            first = result.mismatches[0]
            what = f"call {first.call} {first.where}: {first.kind}: {first.detail}"
            lines.append(f"  {replay_command(result, device.type)}  # {what}")
        pytest.fail("\n".join(lines), pytrace=False)
