"""The differential fuzzer (suites/fuzz): generators, comparator, executor, recording, dashboard page.

The executor is tested against fake backends that are wrong in the ways grace must never be (a
perturbed output, a dropped mutation, a held output overwritten, a generator consumed, a mirrored
attribute gone stale, state shared between threads, an exception): each must be caught; an honest
backend (the model itself) must pass every generated case.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dashboards.fuzz import fuzz_rows  # noqa: E402
from dashboards.render import write_site  # noqa: E402
from dashboards.site import build_site  # noqa: E402
from matrix.regressions.thresholds import Thresholds  # noqa: E402
from matrix.store.db import open_store  # noqa: E402
from matrix.store.models import CorrectnessResult, Run, Workload  # noqa: E402
from suites.fuzz.compare import MismatchKind, compare  # noqa: E402
from suites.fuzz.execute import Case, CaseResult, make_case, make_cases, run_case  # noqa: E402
from suites.fuzz.models import ModelSpec, build_module  # noqa: E402
from suites.fuzz.recording import to_record  # noqa: E402
from suites.fuzz.schedules import CallSpec, Schedule, Step  # noqa: E402
from suites.fuzz.session import fuzz, summarize  # noqa: E402
from suites.fuzz.settings import (  # noqa: E402
    SETTINGS_PATH,
    Known,
    SettingsError,
    Tolerance,
    load_settings,
    parse_settings,
)
from suites.records import CorrectnessStatus, record_from_property  # noqa: E402

CPU = torch.device("cpu")
SETTINGS = load_settings(SETTINGS_PATH)
CASES = 60  # generated cases checked against the honest backend


def honest(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    return module


def _spec(body: tuple[str, ...], outputs: tuple[str, ...], **kw: Any) -> ModelSpec:
    fields: dict[str, Any] = {
        "seed": 7,
        "dtype": "float64",
        "inputs": (("x0", 4),),
        "linears": (),
        "buffers": (),
        "cpu_attributes": (),
        "body": body,
        "outputs": outputs,
    }
    fields.update(kw)
    return ModelSpec(**fields)


def _call(seed: int, rows: int = 5, hold: bool = False, placement: str = "fresh", **kw: Any) -> CallSpec:
    return CallSpec(rows, (placement,), seed, ((1, 0, 0),), hold=hold, **kw)


def _case(model: ModelSpec, steps: tuple[Step, ...], **options: Any) -> Case:
    return Case(0, 0, "test", tuple(sorted(options.items())), model, Schedule("no_grad", steps))


def _calls(*specs: CallSpec) -> tuple[Step, ...]:
    return tuple(Step("call", (s,)) for s in specs)


def _run(case: Case, compiler: Callable[..., Any]) -> CaseResult:
    return run_case(case, compiler, CPU, SETTINGS)


SCALE = _spec(("v0 = torch.tanh(x0) * 2.0",), ("v0",))
MUTATE = _spec(("x0.add_(1.0)", "v0 = x0 * 2.0"), ("v0",), mutated_inputs=("x0",))


# -- settings -----------------------------------------------------------------------------------------


def test_settings_load_and_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SETTINGS.deadline_for("cpu") > 0 and SETTINGS.profiles
    per_case = SETTINGS.profiles_per_case["cpu"]
    assert SETTINGS.profiles_for(1, "cpu") == SETTINGS.profiles[per_case : 2 * per_case]
    monkeypatch.setenv("GRACE_FUZZ_SECONDS", "3")
    monkeypatch.setenv("GRACE_FUZZ_SEED", "11")
    overridden = load_settings()
    assert overridden.deadline_for("cuda") == 3.0 and overridden.base_seed == 11
    monkeypatch.setenv("GRACE_FUZZ_SECONDS", "soon")
    with pytest.raises(SettingsError, match="GRACE_FUZZ_SECONDS"):
        load_settings()


def test_settings_refuse_unknown_keys_and_formats() -> None:
    with pytest.raises(SettingsError, match="unknown key"):
        parse_settings({"format": 1, "profiles": [{"name": "a"}], "deadlines": {}})
    with pytest.raises(SettingsError, match="format"):
        parse_settings({"format": 2})
    with pytest.raises(SettingsError, match="no profile"):
        SETTINGS.profile_named("nonexistent")


# -- generators ---------------------------------------------------------------------------------------


def test_cases_are_deterministic_and_round_trip_through_json() -> None:
    first, again = make_case(SETTINGS, 5, 3, "cpu"), make_case(SETTINGS, 5, 3, "cpu")
    assert first == again
    assert make_case(SETTINGS, 5, 4, "cpu").model != first.model
    data = json.loads(json.dumps(first.to_dict()))
    assert Schedule.from_dict(data["schedule"]) == first.schedule
    assert data["model"]["source"] == first.model.source


def test_a_case_runs_one_model_and_schedule_under_each_of_its_profiles() -> None:
    cases = make_cases(SETTINGS, 0, 1, "cpu")
    assert [c.profile for c in cases] == [p.name for p in SETTINGS.profiles_for(1, "cpu")]
    assert len(cases) > 1 and len({(c.model, c.schedule) for c in cases}) == 1
    assert len({c.options for c in cases}) == len(cases)
    (only,) = make_cases(SETTINGS, 0, 1, "cpu", cases[1].profile)
    assert only == cases[1]
    with pytest.raises(SettingsError, match="runs under"):
        make_cases(SETTINGS, 0, 1, "cpu", "nonexistent")


def test_generated_models_build_equal_and_independent_modules() -> None:
    spec = next(
        make_case(SETTINGS, 0, i, "cpu").model
        for i in range(100)
        if make_case(SETTINGS, 0, i, "cpu").model.linears
    )
    a, b = build_module(spec, CPU), build_module(spec, CPU)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
        assert pa.data_ptr() != pb.data_ptr()


def test_generators_cover_what_the_fuzzer_is_for() -> None:
    features: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    placements: Counter[str] = Counter()
    grad_modes: set[str] = set()
    shape_changes = 0
    for i in range(200):
        case = make_case(SETTINGS, 0, i, "cuda")
        features.update(case.model.features)
        grad_modes.add(case.schedule.grad_mode)
        rows = set()
        for step in case.schedule.steps:
            steps[step.kind] += 1
            for call in step.calls:
                placements.update(call.placements)
                rows.add(call.rows)
        shape_changes += len(rows) > 2
    for feature in (
        "elementwise", "matmul", "reduction", "view", "buffer", "buffer_update", "cpu_attribute", "random",
        "inplace_add_", "inplace_mul_", "inplace_foreach", "inplace_copy_slice", "multiple_outputs",
        "output_aliases_input",
    ):  # fmt: skip
        assert features[feature], feature
    for kind in ("call", "concurrent", "stream", "write_attribute", "release"):
        assert steps[kind], kind
    assert set(placements) == {"fresh", "view", "reuse"}
    assert grad_modes == {"no_grad", "inference_mode", "grad"}
    assert shape_changes > 10


def test_concurrent_and_stream_steps_only_where_they_are_sound() -> None:
    for i in range(200):
        case = make_case(SETTINGS, 0, i, "cpu")
        kinds = {s.kind for s in case.schedule.steps}
        assert "stream" not in kinds  # no CUDA
        if "concurrent" in kinds:
            assert case.model.pure and dict(case.options).get("clone_outputs")
        if case.model.random_ops:
            assert all(c.manual_seed is not None for s in case.schedule.steps for c in s.calls)


def test_every_generated_case_passes_against_the_model_itself() -> None:
    results = [_run(make_case(SETTINGS, 0, i, "cpu"), honest) for i in range(CASES)]
    assert [r.eager_error for r in results if r.eager_error] == []
    assert [(r.case.index, r.mismatches[:1]) for r in results if r.failed] == []
    assert sum(r.calls for r in results) >= 4 * CASES


# -- comparator ---------------------------------------------------------------------------------------


def test_compare_tolerance_nan_and_metadata() -> None:
    tol = Tolerance(atol=1e-6, rtol=1e-6)
    a = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    assert compare(a, a.clone(), tol, "x", 0) is None
    off = compare(a, a + torch.tensor([1e-3, 0, 0], dtype=torch.float64), tol, "x", 0)
    assert off is not None and off.kind == MismatchKind.VALUES.value and off.max_abs == pytest.approx(1e-3)
    assert compare(a, a.float(), tol, "x", 0).kind == MismatchKind.METADATA.value  # type: ignore[union-attr]
    assert compare(a, a[:2], tol, "x", 0).kind == MismatchKind.METADATA.value  # type: ignore[union-attr]


# -- wrong backends are caught -----------------------------------------------------------------------


def perturbing(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        first, *rest = module(*args)
        return (first + 1e-3, *rest)

    return run


def dropping_mutations(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    return lambda *args: module(*(a.clone() for a in args))


def one_output_buffer(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    """Like a graph whose pool every call reuses: each call's outputs are written over the last ones."""
    pool: dict[tuple[int, ...], torch.Tensor] = {}

    def run(*args: Any) -> Any:
        outputs = []
        for out in module(*args):
            slot = pool.setdefault(tuple(out.shape), torch.empty_like(out))
            outputs.append(slot.copy_(out))
        return tuple(outputs)

    return run


def test_a_perturbed_output_is_caught_at_every_call() -> None:
    result = _run(_case(SCALE, _calls(_call(1), _call(2), _call(3))), perturbing)
    assert [(m.call, m.where, m.kind) for m in result.mismatches] == [
        (i, "output 0", "values") for i in range(3)
    ]


def test_a_dropped_mutation_is_caught_in_the_input() -> None:
    result = _run(_case(MUTATE, _calls(_call(1), _call(2, placement="view"))), dropping_mutations)
    assert {(m.call, m.where) for m in result.mismatches} == {(0, "input x0"), (1, "input x0")}


def test_a_held_output_overwritten_is_caught_where_the_contract_promises_it() -> None:
    steps = _calls(_call(1, hold=True), _call(2), _call(3, rows=6))
    promised = _run(_case(SCALE, steps, clone_outputs=True), one_output_buffer)
    held = "held output of call 0, output 0"
    assert [(m.call, m.where) for m in promised.mismatches] == [(1, held), (2, held)]
    # Without clone_outputs, the second call (same signature) may overwrite it: not a mismatch...
    assert not _run(_case(SCALE, steps), one_output_buffer).mismatches
    # ...nor may one with the same shapes at other strides (the same graph may serve it)...
    padded_view = CallSpec(5, ("view",), 2, ((1, 0, 3),))  # rows of 3 more columns: other strides
    strided = _calls(_call(1, hold=True), padded_view)
    assert not _run(_case(SCALE, strided), one_output_buffer).mismatches
    # ...but a call of another signature may not (an evicted graph's pool must live while it is held).
    other = _calls(_call(1, hold=True), _call(3, rows=6), _call(4, rows=7))
    evicted = _run(_case(SCALE, other), lambda m, o: _shared_pool(m))
    assert [(m.call, m.where) for m in evicted.mismatches] == [(1, held), (2, held)]


def _shared_pool(module: torch.nn.Module) -> Callable[..., Any]:
    """One flat pool that every signature reuses from its start (a freed pool given to the next graph)."""
    pool = torch.empty(256, dtype=torch.float64)

    def run(*args: Any) -> Any:
        (out,) = module(*args)
        return (pool[: out.numel()].view(out.shape).copy_(out),)

    return run


def test_a_consumed_generator_is_caught() -> None:
    noisy = _spec(("v0 = x0 * torch.rand_like(x0)",), ("v0",), random_ops=True)

    def extra_draw(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            torch.rand(1)  # a deciding run that draws from the generator
            return module(*args)

        return run

    steps = _calls(_call(1, manual_seed=5), _call(2, manual_seed=6))
    result = _run(_case(noisy, steps), extra_draw)
    assert {m.kind for m in result.mismatches} == {"values", "rng_state"}
    assert not _run(_case(noisy, steps), honest).mismatches


def test_a_stale_mirror_of_a_module_attribute_is_caught() -> None:
    spec = _spec(("v0 = x0 * self.buf0",), ("v0",), buffers=(4,))

    def mirroring(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        mirror = module.buf0.clone()  # a copy made at compile time; a write through .data is not seen

        def run(x: torch.Tensor) -> Any:
            return (x * mirror,)

        return run

    steps = (
        Step("call", (_call(1),)),
        Step("write_attribute", attribute="buf0", factor=2.0),
        Step("call", (_call(2),)),
    )
    result = _run(_case(spec, steps), mirroring)
    assert [(m.call, m.where) for m in result.mismatches] == [(1, "output 0")]


def test_an_attribute_moved_or_changed_is_caught() -> None:
    spec = _spec(("v0 = x0 * self.cpu0",), ("v0",), cpu_attributes=(None,))

    def converting(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        module.cpu0 = module.cpu0.float()  # what the user holds is no longer what they put there
        return lambda x: (x * module.cpu0.double(),)

    result = _run(_case(spec, _calls(_call(1))), converting)
    assert ("attribute cpu0", "metadata") in [(m.where, m.kind) for m in result.mismatches]


def test_state_shared_between_threads_is_caught() -> None:
    def racy(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        shared: dict[str, torch.Tensor] = {}
        lock = threading.Lock()

        def run(x: torch.Tensor) -> Any:
            with lock:
                shared["input"] = x  # one placeholder for every caller, as an unlocked replay has
            time.sleep(0.05)
            return tuple(o.clone() for o in module(shared["input"]))

        return run

    steps = (Step("call", (_call(1),)), Step("concurrent", (_call(2), _call(3))))
    result = _run(_case(SCALE, steps, clone_outputs=True), racy)
    assert [(m.call, m.where) for m in result.mismatches] in ([(1, "output 0")], [(2, "output 0")])
    assert not _run(_case(SCALE, steps, clone_outputs=True), honest).mismatches


def test_an_exception_is_a_mismatch_and_the_schedule_goes_on() -> None:
    def flaky(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        calls = Counter[str]()

        def run(*args: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:
                raise IndexError("list index out of range")
            return module(*args)

        return run

    result = _run(_case(SCALE, _calls(_call(1), _call(2), _call(3))), flaky)
    assert result.calls == 3
    assert [(m.call, m.kind) for m in result.mismatches] == [(1, "exception")]


# -- session and recording ----------------------------------------------------------------------------


def test_fuzz_runs_cases_until_the_deadline_or_the_count() -> None:
    assert fuzz(SETTINGS, CPU, compiler=honest, deadline_s=0.0, reset=lambda: None).cases == 0
    summary = fuzz(
        SETTINGS, CPU, compiler=honest, deadline_s=60.0, max_cases=3, first_case=10, reset=lambda: None
    )
    assert (summary.cases, summary.failed_cases, summary.first_case) == (3, 0, 10)
    assert summary.calls >= 12 and sum(summary.profiles.values()) == 3


def test_a_case_that_raises_outside_its_calls_fails_alone() -> None:
    def broken(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
        raise RuntimeError("cannot compile")

    summary = fuzz(
        SETTINGS, CPU, compiler=broken, control=None, deadline_s=60.0, max_cases=2, reset=lambda: None
    )
    assert (summary.cases, summary.failed_cases) == (2, 2)
    assert summary.failures[0].mismatches[0].detail == "RuntimeError: cannot compile"
    assert summary.failures[0].control_mismatches is None


def test_a_failing_case_says_whether_the_control_differs_too() -> None:
    """Note: [The control run]: the control informs, the verdict stays a failure either way."""
    run = {"compiler": perturbing, "deadline_s": 60.0, "max_cases": 1, "reset": lambda: None}
    grace_only = fuzz(SETTINGS, CPU, control=honest, **run)
    both = fuzz(SETTINGS, CPU, control=perturbing, **run)
    assert grace_only.failed_cases == both.failed_cases == 1
    assert grace_only.failures[0].control_mismatches == 0 and grace_only.failures[0].control_first is None
    assert both.failures[0].control_mismatches == len(both.failures[0].mismatches) > 0
    details = to_record(both, "grace-cpu", "smoke").details["failures"][0]["control"]
    assert details["compiler"] == "inductor" and details["first"].startswith("call 0 output 0: values")


def test_known_failures_are_recorded_apart_and_do_not_fail() -> None:
    failing = [_run(make_case(SETTINGS, 0, i, "cpu"), perturbing) for i in range(2)]
    settings = SETTINGS.__class__(**{**SETTINGS.__dict__, "known": (Known(0, 1, "cpu", "issue 99"),)})
    summary = summarize(settings, failing, 0, "cpu", 10.0, 1.0)
    assert (summary.failed_cases, summary.known_cases) == (1, 1)
    assert summary.known[0][1] == "issue 99"


def test_the_record_carries_counts_and_replayable_failures() -> None:
    results = [_run(make_case(SETTINGS, 0, i, "cpu"), perturbing) for i in range(2)]
    summary = summarize(SETTINGS, results, 0, "cpu", 10.0, 1.0)
    record = to_record(summary, "grace-cpu", "smoke")
    assert record.status is CorrectnessStatus.FAIL_ACCURACY
    assert record.errors["failed_cases"] == 2 and record.errors["calls"] == summary.calls
    failure = record.details["failures"][0]
    assert failure["replay"] == "python -m suites.fuzz --seed 0 --case 0 --profile default --device cpu"
    assert Schedule.from_dict(failure["schedule"]) == results[0].case.schedule
    prop = json.loads(json.dumps(record.to_property()))
    assert record_from_property(prop).to_property() == prop
    passing = to_record(summarize(SETTINGS, [], 0, "cpu", 10.0, 1.0), "grace-cpu", "smoke")
    assert passing.status is CorrectnessStatus.PASS and passing.errors["cases"] == 0


def test_the_dashboard_shows_fuzz_counts_and_failing_schedules_escaped(tmp_path: Any) -> None:
    from matrix.regressions.synthetic import SyntheticSpec, seed_history

    results = [_run(make_case(SETTINGS, 0, 0, "cpu"), perturbing)]
    record = to_record(summarize(SETTINGS, results, 0, "cpu", 10.0, 1.0), "grace-cpu", "smoke")
    record.details["failures"][0]["source"] = "<script>alert(1)</script>"
    store = open_store("sqlite://")
    with store.begin() as session:
        seed_history(session, SyntheticSpec(nights=1))
        run = session.query(Run).order_by(Run.id.desc()).first()
        workload = Workload(name="fuzz", code_hash=record.workload.code_hash, tier="smoke", tags=["fuzz"])
        session.add(workload)
        session.flush()
        session.add(
            CorrectnessResult(
                run_pk=run.id, record_key="fuzz#0", nodeid="suites/fuzz/test_fuzz_suite.py::test_fuzz",
                workload_pk=workload.id, mode=record.mode, status=record.status.value, reason=record.reason,
                errors=record.errors, tolerance={}, details=record.details,
            )
        )  # fmt: skip
    with store() as session:
        site = build_site(session, Thresholds())
        assert len(fuzz_rows(session, site.runs)) == 1
    (row,) = site.fuzz
    assert row.counts["failed_cases"] == 1 and row.failures[0].replay.endswith(
        "--case 0 --profile default --device cpu"
    )
    write_site(site, tmp_path / "site")
    page = (tmp_path / "site" / "fuzz.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "python -m suites.fuzz --seed 0 --case 0 --profile default --device cpu" in page
    assert 'href="fuzz.html"' in (tmp_path / "site" / "index.html").read_text()


def test_the_dashboard_and_the_settings_need_no_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    modules = "dashboards.site, dashboards.fuzz, suites.fuzz.settings"
    code = f"import sys, {modules}; assert 'torch' not in sys.modules"
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)}, check=True)


# -- on a GPU: one schedule per class of wrong result the fuzzer exists to find -----------------------
# Each runs grace (torch.compile(backend="grace")) against eager, float64, every call compared; a class
# that grace gets wrong shows as mismatches (listed in the assertion message with the replay data).


def _gpu_cases() -> dict[str, Case]:
    pure = _spec(("v0 = torch.tanh(self.lin0(x0))", "v1 = v0 * 2.0 + x0.sum(1, keepdim=True)"),
                 ("v0", "v1"), linears=((4, 4),))  # fmt: skip
    foreach = _spec(("torch._foreach_add_([x0, x1], 1.5)", "v0 = x0 * x1 + 1.0"), ("v0",),
                    inputs=(("x0", 4), ("x1", 4)), mutated_inputs=("x0", "x1"))  # fmt: skip
    attributes = _spec(("v0 = x0 * self.cpu0", "v1 = v0 + self.cpu1.to(v0.device)"), ("v1",),
                       cpu_attributes=(None, 4))  # fmt: skip
    scalars = _spec(("v0 = x0 * s0 + s1", "v1 = v0 * s0"), ("v0", "v1"),
                    inputs=(("x0", 4), ("s0", None), ("s1", None)))  # fmt: skip
    noisy = _spec(("v0 = x0 * torch.rand_like(x0)", "v1 = v0 * (torch.randn_like(v0) > 0.0)"),
                  ("v1",), random_ops=True)  # fmt: skip

    def calls(n: int, start: int = 1, **kw: Any) -> tuple[Step, ...]:
        return _calls(*(_call(start + i, placement="view" if i % 2 else "fresh", **kw) for i in range(n)))

    def fresh2(seed: int) -> CallSpec:
        return CallSpec(5, ("fresh", "fresh"), seed)

    def case(model: ModelSpec, steps: tuple[Step, ...], grad_mode: str = "no_grad", **options: Any) -> Case:
        opts = {"persist_decisions": False, **options}
        return Case(0, 0, "gpu", tuple(sorted(opts.items())), model, Schedule(grad_mode, steps))

    concurrent = tuple(Step("concurrent", (_call(2 * i), _call(2 * i + 1))) for i in range(1, 31))
    streams = tuple(Step("stream", (_call(2 * i, hold=True), _call(2 * i + 1))) for i in range(1, 9))
    # Rows 4 compile a static graph, 5 on the dynamic one; the output held from rows 5 must outlive the
    # eviction of its graph (bound 2) by rows 6 and 7, and the one held from rows 6 that of rows 7 and 4.
    rows = ((4, False), (5, True), (6, False), (7, False), (6, True), (7, False), (4, False), (5, False))
    shapes = tuple(Step("call", (_call(1 + i, rows=r, hold=h),)) for i, (r, h) in enumerate(rows))
    write = (*calls(3), Step("write_attribute", attribute="cpu1", factor=2.0), *calls(3, start=9))
    return {
        "mutation_foreach_inference_mode": case(
            foreach, tuple(Step("call", (fresh2(i),)) for i in range(8)), "inference_mode", warmup_calls=0
        ),
        "mutation_foreach_no_grad": case(
            foreach, tuple(Step("call", (fresh2(i),)) for i in range(8)), warmup_calls=0
        ),
        "two_threads": case(pure, (*calls(2), *concurrent), clone_outputs=True, scg=False),
        "two_streams": case(pure, (*calls(2), *streams), scg=False),
        "cpu_attributes_stay_and_follow_writes": case(attributes, write),
        "held_output_past_the_graph_bound": case(pure, shapes, max_graphs_per_callable=2),
        "several_cpu_tensor_inputs": case(scalars, calls(6)),
        "seeded_random_ops": case(noisy, calls(6, manual_seed=1234)),
    }


def test_the_gpu_schedules_are_valid_and_pass_against_the_model_itself() -> None:
    for name, case in _gpu_cases().items():
        result = _run(case, honest)
        assert result.eager_error is None and not result.mismatches, name
        assert result.calls == case.schedule.calls, name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(_gpu_cases()))
def test_each_class_of_wrong_result_on_the_gpu(name: str) -> None:
    from suites.fuzz.execute import grace_compiler
    from suites.fuzz.session import fuzz_environment
    from suites.modes import reset_compilers

    case = _gpu_cases()[name]
    device = torch.device("cuda")
    reset_compilers()
    try:
        with fuzz_environment(SETTINGS, device.type):
            result = run_case(case, grace_compiler, device, SETTINGS)
    finally:
        reset_compilers()
    assert result.eager_error is None, result.eager_error
    assert result.calls == case.schedule.calls
    assert not result.mismatches, json.dumps([m.to_dict() for m in result.mismatches], indent=1)
