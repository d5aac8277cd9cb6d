"""Run one fuzz case under eager and under a compiler in lockstep, comparing every call with eager.

Problem: a wrong result can show in a call's outputs, in an input the model mutates (or in the larger
buffer an input views), in module state (a buffer, a CPU attribute that must stay where the user put
it), in the generator's state after a seeded call, or only later, in an output the caller kept. The
comparison must cover each of those at every call, never stop at the first difference, and never
compare what the documented contract leaves open.

Design: ``run_case`` builds the model twice from its spec (eager's and the candidate's are independent
objects with equal weights) and walks the schedule step by step; each call runs on eager first, then on
the candidate (``Compiler``: grace through ``torch.compile(backend="grace", options=...)``, or a fake in
the unit tests), on equal but separate inputs, and is checked right away (``_Run._check``). Outputs
held by the schedule are kept on both sides and compared, at every later call, with the values eager's
held outputs have at that moment (so outputs that alias inputs are judged as eager sees them). Note:
[Held outputs and the contract]: a held output is checked while the options promise it: always with
``clone_outputs=True``; without it, only until a later call with the same input shapes and dtypes
(strides and addresses may differ), since that call's graph replay may overwrite it by contract; a graph
being evicted by ``max_graphs_per_callable`` or a call with other shapes is no licence to overwrite it.

Invariants: an exception from eager makes the case invalid (a generator bug, reported as such); one from
the candidate is a mismatch and the schedule goes on; every comparison is recorded as a ``Mismatch``,
at most ``MAX_MISMATCHES_PER_CASE`` per case.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from suites.fuzz.compare import Mismatch, MismatchKind, compare, compare_all
from suites.fuzz.models import ModelSpec, build_module, generate_model
from suites.fuzz.schedules import CallSpec, GradMode, Placement, Schedule, Step, StepKind, generate_schedule
from suites.fuzz.settings import Settings, SettingsError, Tolerance

Compiler = Callable[[torch.nn.Module, dict[str, Any]], Callable[..., Any]]
MAX_MISMATCHES_PER_CASE = 20
THREAD_TIMEOUT_S = 120.0
SIDE_STREAM_SLEEP_CYCLES = 20_000_000  # the reader stream spins this long before it reads held outputs


def grace_compiler(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    return torch.compile(module, backend="grace", options=dict(options))


def inductor_compiler(module: torch.nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    """The control: Inductor alone, without CUDA graphs (grace's options do not apply)."""
    return torch.compile(module, backend="inductor")


@dataclass(frozen=True)
class Case:
    """Case ``index`` of ``base_seed``: the model, the schedule and the options it runs under."""

    base_seed: int
    index: int
    profile: str
    options: tuple[tuple[str, Any], ...]
    model: ModelSpec
    schedule: Schedule

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_seed": self.base_seed,
            "case": self.index,
            "profile": self.profile,
            "options": dict(self.options),
            "model": self.model.to_dict(),
            "schedule": self.schedule.to_dict(),
        }


def make_cases(
    settings: Settings, base_seed: int, index: int, device_type: str, profile: str | None = None
) -> list[Case]:
    """Case ``index`` of ``base_seed`` under each of its profiles (``Settings.profiles_for``), or under
    ``profile`` alone (one of them): one model and one schedule (deterministic: a string-seeded
    ``random.Random``), drawn so that every profile of the case can run it."""
    rng = random.Random(f"grace-fuzz:{base_seed}:{index}")
    model = generate_model(rng, settings.limits.max_ops, tuple(settings.tolerances))
    group = settings.profiles_for(index, device_type)
    options = [settings.options_of(p) for p in group]
    bounds = [o["max_graphs_per_callable"] for o in options if "max_graphs_per_callable" in o]
    schedule = generate_schedule(
        rng,
        model,
        max_calls=settings.limits.max_calls,
        max_held=settings.limits.max_held,
        clone_outputs=all(o.get("clone_outputs", False) for o in options),
        cuda=device_type == "cuda",
        graph_bound=min(bounds) if bounds else None,
    )
    cases = [
        Case(base_seed, index, p.name, tuple(sorted(o.items())), model, schedule)
        for p, o in zip(group, options, strict=True)
    ]
    if profile is None:
        return cases
    chosen = [c for c in cases if c.profile == profile]
    if not chosen:
        raise SettingsError(f"case {index} runs under {[p.name for p in group]}, not under {profile!r}")
    return chosen


def make_case(settings: Settings, base_seed: int, index: int, device_type: str) -> Case:
    """The first profile's run of case ``index`` (see ``make_cases``)."""
    return make_cases(settings, base_seed, index, device_type)[0]


@dataclass(frozen=True)
class CaseResult:
    case: Case
    calls: int  # calls compared with eager
    mismatches: tuple[Mismatch, ...]
    eager_error: str | None = None  # eager raised: the case is invalid, not a grace failure
    seconds: float = 0.0
    # A failing case run again under the control (Inductor alone): its mismatches, first of them.
    control_mismatches: int | None = None
    control_first: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.mismatches)


@dataclass
class _Held:
    call: int
    signature: tuple[Any, ...]
    eager: tuple[Any, ...]
    candidate: tuple[Any, ...]


@dataclass
class _Side:
    module: torch.nn.Module
    fn: Callable[..., Any]
    last_args: list[torch.Tensor] = field(default_factory=list)
    last_bases: list[torch.Tensor] = field(default_factory=list)
    held: list[_Held] = field(default_factory=list)


@dataclass
class _Outcome:
    outputs: tuple[Any, ...] | None = None
    rng_state: tuple[torch.Tensor, ...] | None = None
    error: str | None = None


class EagerFailed(Exception):
    """Eager itself raised: the generated case is invalid."""


@contextlib.contextmanager
def _grad_mode(mode: str) -> Iterator[None]:
    if mode == GradMode.INFERENCE.value:
        with torch.inference_mode():
            yield
    elif mode == GradMode.NO_GRAD.value:
        with torch.no_grad():
            yield
    else:
        with torch.enable_grad():
            yield


def _rng_state(device: torch.device) -> tuple[torch.Tensor, ...]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return tuple(states)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _signature(args: list[torch.Tensor]) -> tuple[Any, ...]:
    """What the outputs contract keys on (Note: [Held outputs and the contract]): no strides."""
    return tuple((tuple(a.shape), a.dtype, a.device.type) for a in args)


def _same_generator_state(eager: _Outcome, candidate: _Outcome) -> bool:
    if eager.rng_state is None or candidate.rng_state is None:
        return True
    return all(torch.equal(a, b) for a, b in zip(eager.rng_state, candidate.rng_state, strict=True))


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


class _Run:
    """The state of one case while it runs (both sides, the signatures seen, the mismatches)."""

    def __init__(self, case: Case, compiler: Compiler, device: torch.device, tolerance: Tolerance) -> None:
        self.case, self.device, self.tolerance = case, device, tolerance
        self.dtype = getattr(torch, case.model.dtype)
        self.clone_outputs = bool(dict(case.options).get("clone_outputs", False))
        eager_module = build_module(case.model, device)
        candidate_module = build_module(case.model, device)
        self.eager = _Side(eager_module, eager_module)
        self.candidate = _Side(candidate_module, compiler(candidate_module, dict(case.options)))
        self.signatures: list[tuple[int, tuple[Any, ...]]] = []
        self.mismatches: list[Mismatch] = []
        self.calls = 0

    # -- inputs ---------------------------------------------------------------------------------------
    def _values(self, spec: CallSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per input, (base, argument) on the CPU: the argument is the base or a view into it."""
        generator = torch.Generator().manual_seed(spec.data_seed)
        values, tensor_index = [], 0
        for _, cols in self.case.model.inputs:
            if cols is None:
                scalar = torch.rand((), generator=generator, dtype=self.dtype) + 0.5
                values.append((scalar, scalar))
                continue
            row_offset, col_offset, pad = spec.offsets[tensor_index] if spec.offsets else (0, 0, 0)
            if spec.placements[tensor_index] == Placement.VIEW.value:
                base = torch.randn(
                    spec.rows + row_offset + 1, cols + pad, generator=generator, dtype=self.dtype
                )
                values.append(
                    (base, base[row_offset : row_offset + spec.rows, col_offset : col_offset + cols])
                )
            else:
                base = torch.randn(spec.rows, cols, generator=generator, dtype=self.dtype)
                values.append((base, base))
            tensor_index += 1
        return values

    def _inputs(self, side: _Side, spec: CallSpec) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The call's arguments for ``side`` and the bases to compare after it (REUSE: the last call's)."""
        args, bases, tensor_index = [], [], 0
        for (_, cols), (base, arg) in zip(self.case.model.inputs, self._values(spec), strict=True):
            if cols is None:  # a 0-d input stays on the CPU: on a GPU it is a CPU tensor input
                args.append(arg.clone())
                bases.append(args[-1])
                continue
            if spec.placements[tensor_index] == Placement.REUSE.value and side.last_args:
                args.append(side.last_args[tensor_index])
                bases.append(side.last_bases[tensor_index])
            else:
                moved = base.to(self.device, copy=True)
                args.append(moved.as_strided(arg.shape, arg.stride(), arg.storage_offset()))
                bases.append(moved)
            tensor_index += 1
        tensors = [a for a, (_, cols) in zip(args, self.case.model.inputs, strict=True) if cols is not None]
        side.last_args = tensors
        side.last_bases = [
            b for b, (_, cols) in zip(bases, self.case.model.inputs, strict=True) if cols is not None
        ]
        return args, bases

    # -- calls ----------------------------------------------------------------------------------------
    def _invoke(self, side: _Side, args: list[torch.Tensor], spec: CallSpec) -> _Outcome:
        try:
            with _grad_mode(self.case.schedule.grad_mode):
                if spec.manual_seed is not None:
                    torch.manual_seed(spec.manual_seed)
                outputs = _as_tuple(side.fn(*args))
            state = _rng_state(self.device) if spec.manual_seed is not None else None
            return _Outcome(outputs, state)
        except Exception as exc:
            return _Outcome(error=_error_text(exc))

    def _eager(self, args: list[torch.Tensor], spec: CallSpec) -> _Outcome:
        outcome = self._invoke(self.eager, args, spec)
        if outcome.error is not None:
            raise EagerFailed(outcome.error)
        return outcome

    def _note(self, found: list[Mismatch] | Mismatch | None) -> None:
        for mismatch in found if isinstance(found, list) else [found] if found else []:
            if len(self.mismatches) < MAX_MISMATCHES_PER_CASE:
                self.mismatches.append(mismatch)

    def _state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        state = dict(module.named_buffers())
        state.update(
            {f"cpu{i}": getattr(module, f"cpu{i}") for i in range(len(self.case.model.cpu_attributes))}
        )
        return state

    def _check(self, index: int, spec: CallSpec, args: list[torch.Tensor], done: tuple[Any, ...]) -> None:
        """Compare call ``index`` with eager: outputs, inputs, module state, generator; hold; held."""
        eager, candidate, eager_bases, candidate_bases = done
        self.calls += 1
        signature = _signature(args)
        self.signatures.append((index, signature))
        if candidate.error is not None:
            self._note(Mismatch(index, "call", MismatchKind.EXCEPTION.value, candidate.error))
        else:
            self._note(compare_all(eager.outputs, candidate.outputs, self.tolerance, "output", index))
        names = [name for name, _ in self.case.model.inputs]
        for name, e, c in zip(names, eager_bases, candidate_bases, strict=True):
            self._note(compare(e, c, self.tolerance, f"input {name}", index))
        eager_state, candidate_state = self._state(self.eager.module), self._state(self.candidate.module)
        for name, value in eager_state.items():
            self._note(compare(value, candidate_state.get(name), self.tolerance, f"attribute {name}", index))
        if not _same_generator_state(eager, candidate):
            detail = f"after torch.manual_seed({spec.manual_seed}) and the call"
            self._note(Mismatch(index, "generator state", MismatchKind.RNG_STATE.value, detail))
        self._check_held(index)
        if spec.hold and candidate.outputs is not None:
            self.eager.held.append(_Held(index, signature, eager.outputs, ()))
            self.candidate.held.append(_Held(index, signature, (), candidate.outputs))

    def _promised(self, held: _Held) -> bool:
        """Note: [Held outputs and the contract] (module docstring)."""
        if self.clone_outputs:
            return True
        return not any(i > held.call and s == held.signature for i, s in self.signatures)

    def _check_held(self, index: int) -> None:
        keep_eager, keep_candidate = [], []
        for e, c in zip(self.eager.held, self.candidate.held, strict=True):
            if not self._promised(e):
                continue
            where = f"held output of call {e.call}, output"
            self._note(compare_all(e.eager, c.candidate, self.tolerance, where, index))
            keep_eager.append(e)
            keep_candidate.append(c)
        self.eager.held, self.candidate.held = keep_eager, keep_candidate

    def call(self, index: int, spec: CallSpec, stream: Any = None) -> tuple[_Outcome, _Outcome]:
        eager_args, eager_bases = self._inputs(self.eager, spec)
        candidate_args, candidate_bases = self._inputs(self.candidate, spec)
        eager = self._eager(eager_args, spec)
        if stream is None:
            candidate = self._invoke(self.candidate, candidate_args, spec)
        else:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                candidate = self._invoke(self.candidate, candidate_args, spec)
            torch.cuda.synchronize(self.device)
        self._check(index, spec, candidate_args, (eager, candidate, eager_bases, candidate_bases))
        return eager, candidate

    def concurrent(self, index: int, specs: tuple[CallSpec, ...]) -> None:
        """Eager runs the calls one after the other; the candidate runs them from two threads at once."""
        prepared = [(self._inputs(self.eager, s), self._inputs(self.candidate, s)) for s in specs]
        eager = [self._eager(e[0], s) for (e, _), s in zip(prepared, specs, strict=True)]
        candidate: list[_Outcome] = [_Outcome(error="the thread did not finish")] * len(specs)
        barrier = threading.Barrier(len(specs))

        def work(slot: int) -> None:
            barrier.wait()
            candidate[slot] = self._invoke(self.candidate, prepared[slot][1][0], specs[slot])

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(specs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(THREAD_TIMEOUT_S)
        for i, spec in enumerate(specs):
            (_, eager_bases), (candidate_args, candidate_bases) = prepared[i]
            self._check(
                index + i, spec, candidate_args, (eager[i], candidate[i], eager_bases, candidate_bases)
            )

    def stream(self, index: int, specs: tuple[CallSpec, ...]) -> None:
        """Call; a side stream reads its outputs after a delay on the GPU; the next call runs on a third
        stream meanwhile. The late read must see the first call's values."""
        first, second = specs
        eager, candidate = self.call(index, first)
        if candidate.outputs is None or eager.outputs is None:
            self.call(index + 1, second)
            return
        current = torch.cuda.current_stream(self.device)
        reader, runner = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
        reader.wait_stream(current)
        with torch.cuda.stream(reader):
            torch.cuda._sleep(SIDE_STREAM_SLEEP_CYCLES)
            late = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in candidate.outputs)
        self.call(index + 1, second, stream=runner)
        torch.cuda.synchronize(self.device)
        self._note(
            compare_all(eager.outputs, late, self.tolerance, "output read late on a side stream", index)
        )

    def step(self, index: int, step: Step) -> None:
        kind = StepKind(step.kind)
        if kind is StepKind.RELEASE:
            self.eager.held, self.candidate.held = [], []
        elif kind is StepKind.WRITE_ATTRIBUTE:
            for module in (self.eager.module, self.candidate.module):
                with torch.no_grad():
                    getattr(module, str(step.attribute)).data.mul_(step.factor)
        elif kind is StepKind.CONCURRENT:
            self.concurrent(index, step.calls)
        elif kind is StepKind.STREAM and self.device.type == "cuda":
            self.stream(index, step.calls)
        else:  # CALL, and a STREAM step replayed without CUDA: its calls one after the other
            for offset, spec in enumerate(step.calls):
                self.call(index + offset, spec)


def run_case(case: Case, compiler: Compiler, device: torch.device, settings: Settings) -> CaseResult:
    """Run ``case`` under eager and ``compiler`` (module docstring); never raises for the candidate."""
    started = time.monotonic()
    run = _Run(case, compiler, device, settings.tolerance_for(case.model.dtype))
    index = 0
    try:
        for step in case.schedule.steps:
            run.step(index, step)
            index += len(step.calls)
    except EagerFailed as exc:
        return CaseResult(case, run.calls, tuple(run.mismatches), str(exc), time.monotonic() - started)
    return CaseResult(case, run.calls, tuple(run.mismatches), None, time.monotonic() - started)
