"""CGCT stage suite: the CPU-tensor workloads of CGCT, traced and transformed in every torch cell.

Problem: CGCT reads private Dynamo/FX/Inductor structures that differ between torch releases
(grace/compat/dynamo.py). The matrix must show, for each torch it covers, whether CGCT still finds the
CPU work in a graph, moves it, and leaves values unchanged, without a GPU.

Design: each workload is traced with fake ``cuda:0`` tensors through a recording Dynamo backend
(suites/cgct_harness.py). Inside the backend, the devices of every node are taken before
``grace.cgct.transform`` runs; the transformed graph's devices after it. CPU module attributes stay
where the user put them (the graph reads GPU mirrors; no retrace): a workload that has them must come
out with one mirror step per attribute and a single trace. Values:
the traced graph and CGCT's result are both run for real on the CPU with ``cuda:0`` mapped to ``cpu``
(grace.cgct.verify) and must be bit-identical. Before that, CGCT's graph runs once under a fake-tensor
mode that refuses real tensors, as AOTAutograd's trace in front of Inductor does: a tensor that a
transform leaves in the graph outside its inputs, parameters and buffers fails there (on a GPU it failed
Inductor's compile with "Please convert all Tensors to FakeTensors first").

Records, per workload (mode ``cgct-fake-cuda``): one ``CorrectnessRecord``: ``pass``;
``fail_accuracy`` when values differ or the graph after CGCT is not what the workload requires (CPU
nodes left, a host read transformed); ``fail_to_run`` when anything raised or the strict fake-tensor run
failed (the reason is the exception); ``skip`` when this torch cannot make fake CUDA tensors.
``errors`` holds the number of CPU nodes before and after; ``details`` the diagnosis codes. Then one
``DiagnosticRecord`` per diagnosis. A test fails after its records are emitted when its status is not
``pass``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("torch", reason="the CGCT stage suite needs torch (Triton-only cells run the PI checks)")

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

from grace import cgct
from grace.cgct import verify
from grace.cgct.adapter import MirrorStep
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode
from grace.compat import dynamo as compat
from suites.cgct_harness import (
    DEVICE_MAP,
    Capture,
    Twins,
    capture,
    devices_of,
    real_inputs,
    strict_fake_run,
)
from suites.cgct_models import Detector, position_ids
from suites.records import CorrectnessRecord, CorrectnessStatus, DiagnosticRecord, WorkloadRef
from suites.workloads import WorkloadUnavailable
from suites.workloads.registry import Tier, Workload, code_hash
from suites.workloads.registry import get as get_workload

pytestmark = pytest.mark.cgct

MODE = "cgct-fake-cuda"
CPU_CODES = {ReasonCode.CPU_DEVICE, ReasonCode.PARTITION_SPLIT_CPU_OP}

# -- the workloads --------------------------------------------------------------------------------------


class ScaledLinear(torch.nn.Module):
    """CPU scalars: ``torch.tensor`` constants and NumPy scalars in GPU arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x) * torch.tensor(0.5)
        y = y + torch.tensor(np.float64(0.25)).to(y.dtype)
        return y * np.float32(1.5)


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A CPU input copied to the GPU inside the model."""
    return x * mask.to(x.device).unsqueeze(0)


def host_read(x: torch.Tensor) -> torch.Tensor:
    """``.item()``: the host waits for a GPU value; CGCT must report it and leave it alone."""
    return x * x.sum().item()


@dataclass(frozen=True)
class Case:
    """How to build and trace one workload, and what CGCT must make of it."""

    name: str
    build: Callable[[Twins], tuple[Callable[..., Any], list[Any]]]
    code: tuple[Any, ...]
    dynamo_config: dict[str, Any] = field(default_factory=dict)
    mirrors_attributes: bool = False
    leaves_host_read: bool = False
    indexes_fake_cuda: bool = False  # a real model: needs fake_cuda_indexing_unsupported() to be None


def _registered(name: str, cpu: tuple[int, ...] = ()) -> Case:
    """A suite workload (suites/workloads) at its smoke size, its inputs on cuda:0 but those at ``cpu``.
    Real models index fake CUDA tensors, which not every torch can without a GPU: there it is a skip."""
    workload = get_workload(name)

    def build(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
        model, inputs = workload.factory(Tier.SMOKE)(torch.device("cpu"), torch.float32)
        return twins.module(model.eval()), twins.inputs(*inputs, cpu=cpu)

    return Case(
        f"cgct_{name}",
        build,
        workload.code or (workload.builder,),
        dynamo_config={"capture_scalar_outputs": True},  # a .item() stays in the graph, not between graphs
        indexes_fake_cuda=True,
    )


def _scalars(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
    return twins.module(ScaledLinear()), twins.inputs(torch.randn(4, 8))


def _positions(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
    return position_ids, twins.inputs(torch.randn(2, 6))


def _anchors(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
    model = twins.module(Detector(), cpu_attributes=["anchors", "scale", "grids"])
    return model, twins.inputs(torch.randn(4, 4))


def _input_copy(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
    return masked, twins.inputs(torch.randn(3, 5), torch.randint(0, 2, (5,)).float(), cpu=[1])


def _item(twins: Twins) -> tuple[Callable[..., Any], list[Any]]:
    return host_read, twins.inputs(torch.randn(4))


CASES = (
    Case("cgct_cpu_scalars", _scalars, (ScaledLinear,)),
    Case("cgct_position_ids", _positions, (position_ids,)),
    Case("cgct_detection_anchors", _anchors, (Detector,), mirrors_attributes=True),
    Case("cgct_cpu_input_copy", _input_copy, (masked,)),
    Case(
        "cgct_item_left_alone",
        _item,
        (host_read,),
        dynamo_config={"capture_scalar_outputs": True},
        leaves_host_read=True,
    ),
    # The models whose CGCT graphs failed Inductor's compile on the H200 (a folded constant kept as a
    # tensor attribute): a CPU-built mask (speech), CPU scalars and position tables (Deberta).
    _registered("speech_transformer", cpu=(1,)),
    _registered("DebertaForQuestionAnswering"),
    _registered("DebertaV2ForQuestionAnswering"),
)


# -- running one workload ---------------------------------------------------------------------------------


@dataclass
class Traced:
    """What the recording backend saw for one graph: CPU nodes and diagnoses before, CGCT's outcome."""

    cpu_before: set[str] = field(default_factory=set)
    diagnoses_before: list[Diagnosis] = field(default_factory=list)
    result: cgct.CGCTResult | None = None
    restarted: bool = False
    original: torch.fx.GraphModule | None = None  # a copy: Dynamo empties a graph it retraces


@dataclass
class Outcome:
    status: CorrectnessStatus
    reason: str | None
    cpu_before: int = 0
    cpu_after: int = 0
    diagnoses: list[Diagnosis] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _cpu_nodes(gm: torch.fx.GraphModule, inputs: list[Any]) -> set[str]:
    return {name for name, devices in devices_of(gm, inputs).items() if "cpu" in devices}


def _fake_cuda_failure(real: torch.Tensor, ops: Callable[[torch.Tensor], Any]) -> BaseException | None:
    """What ``ops`` raise on a fake ``cuda:0`` copy of ``real`` on this machine, or None."""
    twins = Twins(FakeTensorMode(allow_non_fake_inputs=True))
    try:
        fake = twins.fake(real, torch.device("cuda", 0))
        with twins.mode:
            ops(fake)
    except Exception as error:  # any failure means: not on this torch, on this machine
        return error
    return None


def fake_cuda_unsupported() -> str | None:
    """Why this torch cannot trace with fake CUDA tensors on this machine, or None when it can."""
    error = _fake_cuda_failure(torch.ones(2), lambda t: (t * 2 + torch.ones(2).to(t.device)).sum())
    return None if error is None else f"fake CUDA tensors are not available on this torch: {_one_line(error)}"


def fake_cuda_indexing_unsupported() -> str | None:
    """Why this torch cannot index fake CUDA tensors here (real models do), or None when it can. A CPU
    build of torch has no CUDA kernels to dispatch to; torch 2.6 asks the CUDA driver, which a machine
    without a GPU lacks."""
    error = _fake_cuda_failure(torch.ones(2, 4, dtype=torch.bool), lambda t: (t[:, None, None, :], t[:, :2]))
    return (
        None
        if error is None
        else f"this torch cannot index fake CUDA tensors without a GPU: {_one_line(error)}"
    )


def _one_line(error: BaseException) -> str:
    """The root cause in one line: Dynamo wraps what a backend raises (BackendCompilerFailed)."""
    root = error
    while (
        inner := getattr(root, "inner_exception", None) or root.__cause__
    ) is not None and inner is not root:
        root = inner
    lines = str(root).strip().splitlines()
    text = f"{type(root).__name__}: {lines[0]}" if lines else type(root).__name__
    return text if root is error else f"{text} (raised through {type(error).__name__})"


def _differences(expected: Any, actual: Any) -> list[str]:
    # Two traces of one frame: the same outputs in the same order, whatever container holds them.
    expected_flat, actual_flat = tree_flatten(expected)[0], tree_flatten(actual)[0]
    if len(expected_flat) != len(actual_flat):
        return [f"{len(actual_flat)} outputs instead of {len(expected_flat)}"]
    problems = []
    for index, (want, got) in enumerate(zip(expected_flat, actual_flat, strict=True)):
        if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)):
            if want != got:
                problems.append(f"output {index}: {got!r} != {want!r}")
        elif want.dtype != got.dtype or want.shape != got.shape or not torch.equal(want, got):
            problems.append(f"output {index} differs")
    return problems


def _values(graphs: list[Capture], traced: list[Traced], result: cgct.CGCTResult, twins: Twins) -> list[str]:
    """Differences between the first traced graph and CGCT's final result, run for real on the CPU."""
    first, last = graphs[0], graphs[-1]
    if len(graphs) == 1:
        inputs = real_inputs(first.example_inputs, twins)
        return verify.compare(first.gm, result, inputs, DEVICE_MAP, twins.real_of)
    # Retraced after CGCT moved attributes: the copy of the first graph reads them from their CPU twins.
    original = traced[0].original
    if original is None:
        return ["the first traced graph was not kept"]
    expected = verify.emulate(original, real_inputs(first.example_inputs, twins), DEVICE_MAP, twins.real_of)
    inputs = real_inputs(last.example_inputs, twins)
    if result.input_adapter is not None:
        inputs = result.input_adapter.apply(inputs, DEVICE_MAP)
    return _differences(expected, verify.emulate(result.gm, inputs, DEVICE_MAP, twins.real_of))


def run_case(case: Case) -> Outcome:
    """Trace, transform and check one workload; never raises (a failure is an outcome)."""
    if (reason := fake_cuda_unsupported()) is not None:
        return Outcome(CorrectnessStatus.SKIP, reason)
    if case.indexes_fake_cuda and (reason := fake_cuda_indexing_unsupported()) is not None:
        return Outcome(CorrectnessStatus.SKIP, reason)
    twins = Twins(FakeTensorMode(allow_non_fake_inputs=True))
    restart = compat.restart_exception_type()
    traced: list[Traced] = []

    def on_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        record = Traced(_cpu_nodes(gm, example_inputs), cgct.diagnose(gm, example_inputs))
        traced.append(record)
        if restart is not None:
            record.original = compat.clone_graph_module(gm)
        try:
            record.result = cgct.transform(gm, example_inputs)
        except BaseException as error:
            record.restarted = restart is not None and isinstance(error, restart)
            raise
        return record.result

    try:
        fn, inputs = case.build(twins)
        graphs = capture(fn, inputs, twins.mode, on_graph=on_graph, **case.dynamo_config)
        return _check(case, graphs, traced, twins)
    except WorkloadUnavailable as error:
        status = CorrectnessStatus.MODEL_FAIL_TO_LOAD if error.installed else CorrectnessStatus.SKIP
        return Outcome(status, str(error))
    except Exception as error:
        return Outcome(
            CorrectnessStatus.FAIL_TO_RUN,
            _one_line(error),
            details={"traceback_tail": traceback.format_exc().splitlines()[-3:]},
        )


def _check(case: Case, graphs: list[Capture], traced: list[Traced], twins: Twins) -> Outcome:
    final = traced[-1]
    if final.result is None:
        raise RuntimeError(f"the last of {len(traced)} graphs has no CGCT result")
    result = final.result
    restarted = [t for t in traced if t.restarted]
    cpu_after = _cpu_nodes(result.gm, result.example_inputs)
    cpu_before = traced[0].cpu_before
    diagnoses = _first_trace_diagnoses(traced[0], moved=not cpu_after) if restarted else []
    diagnoses += result.diagnoses
    details: dict[str, Any] = {
        "torch": str(torch.__version__),  # a str subclass that xdist cannot serialise
        "diagnoses": sorted({d.code.value for d in diagnoses}),
        "transformed": sorted({d.code.value for d in diagnoses if d.transformed}),
        "graphs": len(graphs),
        "retraced": bool(restarted),
        "attribute_policy": "move" if restarted else "mirror",
        "cpu_nodes_before": sorted(cpu_before),
        "cpu_nodes_after": sorted(cpu_after),
    }
    outcome = Outcome(CorrectnessStatus.PASS, None, len(cpu_before), len(cpu_after), diagnoses, details)
    problems = _expectations(case, graphs, traced, result, cpu_before, cpu_after)
    if problems:
        outcome.status, outcome.reason = CorrectnessStatus.FAIL_ACCURACY, "; ".join(problems)
        return outcome
    try:
        strict_fake_run(result.gm, result.example_inputs)
    except Exception as error:
        outcome.status = CorrectnessStatus.FAIL_TO_RUN
        why = _one_line(error)
        outcome.reason = f"the graph after CGCT fails a strict fake-tensor run (as AOTAutograd's): {why}"
        return outcome
    differences = _values(graphs, traced, result, twins)
    if differences:
        outcome.status = CorrectnessStatus.FAIL_ACCURACY
        outcome.reason = "values differ from the traced graph: " + "; ".join(differences)
    return outcome


def _first_trace_diagnoses(first: Traced, moved: bool) -> list[Diagnosis]:
    """The first trace's diagnoses: its CPU attributes were moved to the GPU before the retrace."""
    return [
        Diagnosis(
            code=d.code,
            node=d.node,
            source=d.source,
            message=f"first trace, moved to the GPU before Dynamo retraced: {d.message}",
            transformed=moved,
            effect=Effect.NONE if moved else d.effect,  # as grace.cgct.diagnose marks what it fixed
        )
        if d.code is ReasonCode.CPU_ATTRIBUTE
        else d
        for d in first.diagnoses_before
    ]


def _expectations(
    case: Case,
    graphs: list[Capture],
    traced: list[Traced],
    result: cgct.CGCTResult,
    cpu_before: set[str],
    cpu_after: set[str],
) -> list[str]:
    """What this workload requires of CGCT on any torch; the unmet requirements."""
    problems = []
    rejected = [d.message for d in result.diagnoses if d.code is ReasonCode.TRANSFORM_REJECTED]
    if rejected:
        problems.append(rejected[0])
    if case.leaves_host_read:
        sync = [d for d in result.diagnoses if d.code is ReasonCode.DATA_DEPENDENT_SYNC]
        if not sync:
            problems.append("the host read (.item()) was not reported")
        if any(d.transformed for d in sync):
            problems.append("a host read (.item()) was marked transformed")
        if not any(n.op == "call_method" and n.target == "item" for n in result.gm.graph.nodes):
            problems.append("the .item() call is gone from the transformed graph")
        return problems
    if not cpu_before:
        problems.append("the traced graph has no CPU node: the workload does not exercise CGCT here")
    if cpu_after:
        problems.append(f"CPU nodes left after CGCT: {', '.join(sorted(cpu_after))}")
    restarted = any(t.restarted for t in traced)
    steps = result.input_adapter.steps if result.input_adapter is not None else []
    mirrors = [s for s in steps if isinstance(s, MirrorStep)]
    if case.mirrors_attributes and (restarted or not mirrors):
        problems.append("CGCT did not mirror the CPU attributes (they must stay as the user left them)")
    if len(graphs) != 1 + sum(t.restarted for t in traced):
        problems.append(f"Dynamo made {len(graphs)} graphs for {len(traced)} traces")
    return problems


# -- the test -------------------------------------------------------------------------------------------


def _ref(case: Case) -> WorkloadRef:
    hashed = Workload(
        name=case.name,
        builder=case.build,
        sizes={tier: {} for tier in Tier},
        code=(*case.code, _check, _expectations, _values),
        tags=(),
    )
    return WorkloadRef(name=case.name, tier=Tier.SMOKE.value, tags=("cgct",), code_hash=code_hash(hashed))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cgct_stages(case: Case, grace_record: Callable[[Any], None]) -> None:
    outcome = run_case(case)
    ref = _ref(case)
    grace_record(
        CorrectnessRecord(
            workload=ref,
            mode=MODE,
            status=outcome.status,
            reason=outcome.reason,
            errors={"cpu_nodes_before": outcome.cpu_before, "cpu_nodes_after": outcome.cpu_after},
            details=outcome.details,
        )
    )
    for diagnosis in outcome.diagnoses:
        grace_record(
            DiagnosticRecord(
                workload=ref,
                mode=MODE,
                code=diagnosis.code.value,
                node=diagnosis.node,
                source=diagnosis.source,
                message=diagnosis.message,
                transformed=diagnosis.transformed,
                effect=diagnosis.effect.value,
            )
        )
    if outcome.status is CorrectnessStatus.SKIP:
        pytest.skip(outcome.reason or "skipped")
    assert outcome.status is CorrectnessStatus.PASS, f"{outcome.status.value}: {outcome.reason}"
