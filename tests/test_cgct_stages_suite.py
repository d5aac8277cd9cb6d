"""Verdicts of the CGCT stage suite (suites/test_cgct_stages.py): a CGCT that does nothing, changes
values or raises must not be recorded as a pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from grace import cgct
from suites import test_cgct_stages as stages
from suites.records import CorrectnessStatus

CASES = {case.name: case for case in stages.CASES}


def test_every_workload_passes_on_this_torch() -> None:
    outcomes = {name: stages.run_case(case) for name, case in CASES.items()}
    no_indexing = stages.fake_cuda_indexing_unsupported() is not None  # real models are skipped then
    expected = {
        name: CorrectnessStatus.SKIP if case.indexes_fake_cuda and no_indexing else CorrectnessStatus.PASS
        for name, case in CASES.items()
    }
    assert {name: o.status for name, o in outcomes.items()} == expected
    assert outcomes["cgct_cpu_scalars"].cpu_before > 0 and outcomes["cgct_cpu_scalars"].cpu_after == 0
    assert outcomes["cgct_item_left_alone"].details["diagnoses"] == ["data_dependent_sync"]


def test_a_transform_that_does_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def untouched(gm: torch.fx.GraphModule, inputs: list[Any], **_: Any) -> cgct.CGCTResult:
        return cgct.CGCTResult(gm, list(inputs), None, cgct.diagnose(gm, list(inputs)))

    monkeypatch.setattr(cgct, "transform", untouched)
    outcome = stages.run_case(CASES["cgct_position_ids"])
    assert outcome.status is CorrectnessStatus.FAIL_ACCURACY
    assert outcome.reason is not None and "CPU nodes left after CGCT" in outcome.reason


def test_a_transform_that_changes_values_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real_transform = cgct.transform

    def off_by_one(gm: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> cgct.CGCTResult:
        result = real_transform(gm, inputs, **kwargs)
        output = next(n for n in result.gm.graph.nodes if n.op == "output")
        first = output.args[0][0]
        with result.gm.graph.inserting_before(output):
            shifted = result.gm.graph.call_function(torch.add, (first, 1))
        shifted.meta = dict(first.meta)
        output.args = ((shifted, *output.args[0][1:]),)
        result.gm.recompile()
        return result

    monkeypatch.setattr(cgct, "transform", off_by_one)
    outcome = stages.run_case(CASES["cgct_cpu_input_copy"])
    assert outcome.status is CorrectnessStatus.FAIL_ACCURACY
    assert outcome.reason is not None and outcome.reason.startswith("values differ")


def test_an_exception_is_fail_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gm: torch.fx.GraphModule, inputs: list[Any], **_: Any) -> cgct.CGCTResult:
        raise ValueError("broken\nsecond line")

    monkeypatch.setattr(cgct, "transform", broken)
    outcome = stages.run_case(CASES["cgct_cpu_scalars"])
    assert outcome.status is CorrectnessStatus.FAIL_TO_RUN
    assert outcome.reason is not None and "ValueError" in outcome.reason and "\n" not in outcome.reason


def test_a_tensor_left_in_the_graph_fails_the_strict_fake_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What broke Inductor on the GPU: a constant kept as a plain tensor attribute of the graph module
    (neither input, parameter nor buffer) reaches AOTAutograd's fake trace as a real tensor."""
    real_transform = cgct.transform

    def stray_constant(gm: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> cgct.CGCTResult:
        result = real_transform(gm, inputs, **kwargs)
        with FakeTensorMode(allow_non_fake_inputs=True):  # a GPU tensor that is not one of the trace's
            result.gm._stray = torch.ones(8, device="cuda")  # a plain attribute, as folded constants were
        output = next(n for n in result.gm.graph.nodes if n.op == "output")
        first = output.args[0][0]
        with result.gm.graph.inserting_before(output):
            stray = result.gm.graph.get_attr("_stray")
            scaled = result.gm.graph.call_function(torch.mul, (first, stray))
        output.args = ((scaled, *output.args[0][1:]),)
        result.gm.recompile()
        return result

    monkeypatch.setattr(cgct, "transform", stray_constant)
    outcome = stages.run_case(CASES["cgct_cpu_scalars"])
    assert outcome.status is CorrectnessStatus.FAIL_TO_RUN
    assert outcome.reason is not None and "strict fake-tensor run" in outcome.reason
