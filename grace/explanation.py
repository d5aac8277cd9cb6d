"""``grace.explain(model, *inputs)``: per compiled graph, what grace captured and why not.

Problem: a user whose model got no speed-up needs to see, per Dynamo graph, whether a CUDA graph was
captured, which variant runs, and every reason something was declined (CPU tensors, mutations, PI,
SCG's timings), plus CGCT's diagnoses of what it could not transform.

Design: compile the model with a backend equal only to itself while collecting the backend's
``CompiledGraphInfo`` records, call it enough times to pass warm-up and the deciding call, then join the
records with the live stats of the runners they produced, and release those runners' graphs.
``ExplainReport`` is a frozen value whose ``str()`` is the printable report; ``.diagnoses`` lists
CGCT's diagnosis objects unchanged.

Invariant: explaining never touches another compile of the same code. Backends with equal options
compare equal (so compiling twice does not recompile), and Dynamo serves a frame from any cache entry
whose backend compares equal and whose guards pass; a second instance of a model class passes the
guards of the first one's entry. A backend equal to other grace backends would therefore run explain's
calls through the user's runners (re-capturing them for the copy's parameters, and leaving the report
empty because nothing compiled). Explain's backend compiles its own entries; their graphs and pools are
released before the report is returned, so explaining leaves no GPU memory behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grace.backend import GraceBackend
from grace.options import GraceOptions
from grace.scg import uses_graph


class _ExplainBackend(GraceBackend):
    """A grace backend equal only to itself: Dynamo never shares its cache entries with other compiles."""

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


@dataclass(frozen=True)
class GraphExplanation:
    callable_id: int
    graph_hash: str
    num_nodes: int
    num_inputs: int
    static_inputs: int
    dynamic_inputs: int
    mutated_inputs: tuple[int, ...]
    cgct_transformed: bool
    notes: tuple[str, ...]
    slots: tuple[dict[str, Any], ...]
    diagnoses: tuple[Any, ...] = ()

    @property
    def captured(self) -> bool:
        return any(uses_graph(s["variant"]) for s in self.slots)


@dataclass(frozen=True)
class ExplainReport:
    graphs: tuple[GraphExplanation, ...]
    diagnoses: list[Any] = field(default_factory=list)
    techniques: dict[str, str | None] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"grace explain: {len(self.graphs)} compiled graph(s)"]
        for name, reason in self.techniques.items():
            lines.append(f"  technique {name}: {'available' if reason is None else reason}")
        for g in self.graphs:
            state = "captured" if g.captured else "not captured"
            lines.append(
                f"graph {g.callable_id} [{g.graph_hash}]: {state}; {g.num_nodes} FX nodes, "
                f"{g.num_inputs} inputs "
                f"({g.static_inputs} static, {g.dynamic_inputs} dynamic), "
                f"CGCT {'transformed' if g.cgct_transformed else 'not applied'}"
            )
            if g.mutated_inputs:
                lines.append(f"  mutates inputs {list(g.mutated_inputs)}")
            for note in g.notes:
                lines.append(f"  note: {note}")
            for s in g.slots:
                decision = s.get("decision") or {}
                medians = decision.get("medians_ms") or {}
                timing = ", ".join(f"{k} {v:.4f} ms" for k, v in medians.items())
                lines.append(
                    f"  signature {s['signature']}: variant {s['variant']}"
                    + (f" ({decision.get('source')})" if decision else "")
                    + (f"; medians {timing}" if timing else "")
                    + (f"; {s['kernel_nodes']} kernel nodes" if s.get("kernel_nodes") is not None else "")
                    + (
                        f"; copies {s['copy_bytes_per_replay']} B/replay"
                        if s["variant"] != "no_graph"
                        else ""
                    )
                )
                for reason in s["skip_reasons"]:
                    lines.append(f"    why: {reason['code']}: {reason['detail']}")
            for d in g.diagnoses:
                lines.append(f"  diagnosis: {d}")
        return "\n".join(lines)


def explain(
    model: Any, *inputs: Any, options: GraceOptions | None = None, calls: int | None = None
) -> ExplainReport:
    """Compile ``model`` with grace, call it ``calls`` times (default: warm-up + 2) and report."""
    import torch

    from grace import stats
    from grace.backend import collect_compiled_graphs, stop_collecting
    from grace.runner import release_callables
    from grace.techniques import available

    opts = GraceOptions.from_value(options)
    compiled = torch.compile(model, backend=_ExplainBackend(opts))
    sink = collect_compiled_graphs()
    try:
        for _ in range(calls if calls is not None else opts.warmup_calls + 2):
            compiled(*inputs)
    finally:
        stop_collecting(sink)
    by_callable: dict[int, list[dict[str, Any]]] = {}
    for record in stats.snapshot():
        by_callable.setdefault(record["callable_id"], []).append(record)
    release_callables({info.callable_id for info in sink})
    graphs = []
    all_diagnoses: list[Any] = []
    for info in sink:
        notes = [str(r) for r in (info.skip, info.cgct_note, info.pi_note) if r is not None]
        all_diagnoses.extend(info.diagnoses)
        graphs.append(
            GraphExplanation(
                callable_id=info.callable_id,
                graph_hash=info.graph_hash,
                num_nodes=info.num_nodes,
                num_inputs=info.num_inputs,
                static_inputs=info.static_inputs,
                dynamic_inputs=info.dynamic_inputs,
                mutated_inputs=info.mutated_inputs,
                cgct_transformed=info.cgct_transformed,
                notes=tuple(notes),
                slots=tuple(by_callable.get(info.callable_id, [])),
                diagnoses=tuple(info.diagnoses),
            )
        )
    return ExplainReport(graphs=tuple(graphs), diagnoses=all_diagnoses, techniques=available())
