"""Selective CUDA graphs: time the variants of a graph slot, keep the fastest correct one, remember it.

Problem: a CUDA graph removes launch overhead but PyTorch2-CG copies every dynamic input before each
replay; for large inputs and few kernels the copy costs more than the launches it saves (figures in
docs/design/runtime.md). The paper decides from one timed sample per
variant, keeps nothing across runs and ignores shapes.

Design: ``time_variants`` runs every candidate on the caller's real inputs, interleaved in a seeded
random order per round (no variant always follows the same other one), with a device synchronisation
before each sample so every sample starts from an idle GPU, measures with CUDA events and keeps the raw
samples; ``choose`` takes the smallest median. ``outputs_match`` is the numeric check against the
no-graph output. ``DecisionCache`` persists decisions as versioned JSON keyed by ``DecisionKey`` (graph
hash, input signature, GPU, driver, CUDA runtime, torch, Triton, candidates); a new key, or a stored
variant that is not a candidate now, means re-deciding.

Invariants: a variant that failed its numeric check is never a candidate; a decision file written by
another format version is neither read nor overwritten.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

DECISIONS_FORMAT = "grace-scg-decisions"
DECISIONS_FORMAT_VERSION = 1
DECISIONS_FILE = "scg-decisions.json"


class Variant(str, enum.Enum):
    """How a graph slot runs its compiled callable."""

    PENDING = "pending"
    NO_GRAPH = "no_graph"
    GRAPH_COPIES = "graph_copies"
    GRAPH_PI = "graph_pi"

    @property
    def uses_graph(self) -> bool:
        return uses_graph(self)


def uses_graph(variant: Any) -> bool:
    """Whether ``variant`` replays a graph: every variant but ``pending`` and ``no_graph`` (the graph
    variants are grace.variants' specs, registered by their ``Variant``)."""
    return getattr(variant, "value", variant) not in (Variant.PENDING.value, Variant.NO_GRAPH.value)


class DecisionSource(str, enum.Enum):
    PROFILED = "profiled"
    CACHE = "cache"
    ONLY_CANDIDATE = "only_candidate"
    SCG_OFF = "scg_off"
    NOT_PROFILED_MUTATION = "not_profiled_mutation"


@dataclass(frozen=True)
class DecisionKey:
    """Everything a timing decision depends on; ``digest`` is the cache key."""

    graph_hash: str
    signature: str
    gpu: str
    driver: str
    cuda_runtime: str
    torch: str
    triton: str
    candidates: tuple[str, ...]

    @property
    def digest(self) -> str:
        payload = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Decision:
    variant: Variant
    source: DecisionSource
    medians_ms: Mapping[str, float] = field(default_factory=dict)
    samples_ms: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    numeric_checks: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant.value,
            "source": self.source.value,
            "medians_ms": dict(self.medians_ms),
            "samples_ms": {k: list(v) for k, v in self.samples_ms.items()},
            "numeric_checks": dict(self.numeric_checks),
            "key": self.key,
        }


# --- timing ------------------------------------------------------------------------------------


T = TypeVar("T")


def interleaved_order(names: Sequence[T], rounds: int, seed: int = 0) -> list[list[T]]:
    """``rounds`` orders of ``names``: a random permutation per round, the same for the same seed (so
    that no name always runs right after the same other one, and a plan can be repeated)."""
    import random

    rng = random.Random(seed)
    return [rng.sample(list(names), len(names)) for _ in range(rounds if names else 0)]


def time_variants(
    runs: Mapping[Variant, Callable[[], Any]],
    *,
    samples: int,
    warmup: int,
    device: Any,
    untimed_setup: Mapping[Variant, Callable[[], None]] | None = None,
) -> dict[Variant, list[float]]:
    """Milliseconds per run of each variant: interleaved in a seeded random order per round, CUDA
    events, GPU idle at each start. ``untimed_setup[variant]``, when given, runs before each of that
    variant's runs (warm-up included), with the GPU idle and outside the timed region."""
    import torch

    setup = dict(untimed_setup or {})
    order = list(runs)
    for variant in order:
        for _ in range(warmup):
            if variant in setup:
                torch.cuda.synchronize(device)
                setup[variant]()
            runs[variant]()
    torch.cuda.synchronize(device)
    events: dict[Variant, list[tuple[Any, Any]]] = {v: [] for v in order}
    for round_order in interleaved_order(order, samples):
        for variant in round_order:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            if variant in setup:
                setup[variant]()
            start.record()
            runs[variant]()
            end.record()
            events[variant].append((start, end))
    torch.cuda.synchronize(device)
    return {v: [float(s.elapsed_time(e)) for s, e in pairs] for v, pairs in events.items()}


def medians(samples: Mapping[Variant, Sequence[float]]) -> dict[Variant, float]:
    return {v: float(statistics.median(s)) for v, s in samples.items() if s}


def choose(medians_ms: Mapping[Variant, float], margin: float = 0.0) -> Variant:
    """The variant with the smallest median; ties go to the earlier variant in ``Variant`` order (a
    variant of another enum, registered in grace.variants, after those). No graph wins only when it is
    faster than the fastest graph variant by more than ``margin`` (a fraction of its median): a
    near-tie goes to the graph, which also frees the host (option ``scg_margin``)."""
    if not medians_ms:
        raise ValueError("choose() needs at least one timed variant")
    rank = {v: i for i, v in enumerate(Variant)}
    best = min(medians_ms, key=lambda v: (medians_ms[v], rank.get(v, len(rank))))
    graphs = [v for v in medians_ms if v != Variant.NO_GRAPH]
    if best != Variant.NO_GRAPH or not graphs or margin <= 0:
        return best
    best_graph = min(graphs, key=lambda v: (medians_ms[v], rank.get(v, len(rank))))
    return best_graph if medians_ms[best_graph] <= medians_ms[best] * (1.0 + margin) else best


# --- numeric check -----------------------------------------------------------------------------

# (rtol, atol) per dtype: a graph replays the same kernels, so differences come only from
# non-deterministic reductions (atomics, split-K); these bounds are far below a wrong result.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "torch.float64": (1e-7, 1e-9),
    "torch.float32": (1e-4, 1e-5),
    "torch.float16": (1e-2, 1e-3),
    "torch.bfloat16": (2e-2, 1e-2),
}


COMPARE_CHUNK = 1 << 16  # elements per comparison step: bounds the temporaries a check allocates
# (about five chunk-sized tensors at once: small next to the outputs compared)


def _chunk_pairs(reference: Any, candidate: Any) -> Iterator[tuple[Any, Any]]:
    """Flat chunks of ``COMPARE_CHUNK`` elements of both tensors, on the candidate's device (the
    reference's when only the reference is on a GPU): a tensor held in host memory (grace.hostref)
    travels one chunk at a time."""
    flat_ref, flat_cand = reference.reshape(-1), candidate.reshape(-1)
    device = flat_ref.device if flat_ref.is_cuda and not flat_cand.is_cuda else flat_cand.device
    for start in range(0, flat_cand.numel(), COMPARE_CHUNK):
        end = start + COMPARE_CHUNK
        yield flat_ref[start:end].to(device), flat_cand[start:end].to(device)


def _allclose_in_chunks(reference: Any, candidate: Any, rtol: float, atol: float) -> bool:
    """``torch.allclose`` (NaNs equal), computed over flat chunks of ``COMPARE_CHUNK`` elements.

    ``allclose`` of two N-element tensors allocates several N-element temporaries at once; for a
    graph whose output is as large as its input that is a multiple of the graph's own memory, on the
    deciding call. Chunks keep the temporaries at ``COMPARE_CHUNK`` elements; the per-chunk verdicts
    are combined on the device, so the host waits once."""
    import torch

    verdicts = [
        torch.isclose(ref, cand, rtol=rtol, atol=atol, equal_nan=True).all()
        for ref, cand in _chunk_pairs(reference, candidate)
    ]
    return bool(torch.stack(verdicts).all()) if verdicts else True


def _equal_in_chunks(reference: Any, candidate: Any) -> bool:
    import torch

    verdicts = [torch.equal(ref, cand) for ref, cand in _chunk_pairs(reference, candidate)]
    return all(verdicts)


def count_differences(reference: Any, candidate: Any) -> int:
    """How many elements differ, chunk by chunk (either tensor may be held in host memory)."""
    import torch

    counts = [(ref != cand).sum() for ref, cand in _chunk_pairs(reference, candidate)]
    return int(torch.stack(counts).sum()) if counts else 0


def max_abs_difference(reference: Any, candidate: Any) -> float:
    """The largest ``|reference - candidate|`` in float64, chunk by chunk. Elements that are equal count
    zero, equal infinities and two NaNs among them (as ``isclose(equal_nan=True)`` has them); a NaN
    against anything else, or an infinity against another value, counts as infinite."""
    import torch

    worst = [_abs_difference(ref, cand).max() for ref, cand in _chunk_pairs(reference, candidate)]
    return float(torch.stack(worst).max()) if worst else 0.0


def _abs_difference(reference: Any, candidate: Any) -> Any:
    """Element-wise difference for ``max_abs_difference``: ``inf - inf`` is NaN, which must not make two
    equal infinities look infinitely far apart."""
    import torch

    ref, cand = reference.double(), candidate.double()
    same = (ref == cand) | (ref.isnan() & cand.isnan())
    return torch.nan_to_num((ref - cand).abs(), nan=math.inf, posinf=math.inf).masked_fill_(same, 0.0)


def output_devices(value: Any) -> tuple[str, ...]:
    """The device type of each leaf of an output structure, in order ("" for a leaf that is no tensor),
    so that a flat output's positions are its items' (see ``devices_differ``)."""
    import torch

    if isinstance(value, torch.Tensor):
        return (value.device.type,)
    if isinstance(value, (list, tuple)):
        return tuple(d for item in value for d in output_devices(item))
    return ("",)


def devices_differ(graph: Sequence[str], no_graph: Sequence[str], free: Collection[int] = ()) -> str | None:
    """What differs between the devices of a replay's outputs and a no-graph run's (``output_devices``),
    or None. A graph must give the same as a no-graph run: a tensor on another device is another value
    to its reader; only positions in ``free`` may differ (Note: [Philox seeds of attention] in
    grace.philox)."""
    if len(graph) != len(no_graph):
        return f"output devices differ: graph {list(graph)} vs no graph {list(no_graph)}"
    for i, (got, want) in enumerate(zip(graph, no_graph, strict=True)):
        if got != want and i not in free:
            return f"output devices differ at output {i}: graph {got!r} vs no graph {want!r}"
    return None


MUTATED = "mutated"  # where outputs_match names a callable's written inputs: ``"mutated[0]"``, ...


def outputs_match(
    reference: Any,
    candidate: Any,
    path: str = "output",
    noise: Mapping[str, float] | None = None,
    at: str = "",
    undefined: Collection[int] = (),
) -> str | None:
    """None when ``candidate`` equals ``reference`` within tolerance (and, per place in ``noise``,
    within the callable's own run-to-run spread: Note: [Run-to-run noise] in grace.noise), else what
    differs. ``at``: the place of ``reference`` in the structure (as ``run_to_run_noise`` names it).
    ``undefined``: positions of a sequence of outputs whose values no run defines, left out (Note:
    [Random state of an op that draws nothing] in grace.philox)."""
    import torch

    if isinstance(reference, torch.Tensor) or isinstance(candidate, torch.Tensor):
        if not (isinstance(reference, torch.Tensor) and isinstance(candidate, torch.Tensor)):
            return f"{path}: type {type(reference).__name__} vs {type(candidate).__name__}"
        if reference.shape != candidate.shape or reference.dtype != candidate.dtype:
            return (
                f"{path}: {tuple(reference.shape)}/{reference.dtype} "
                f"vs {tuple(candidate.shape)}/{candidate.dtype}"
            )
        if reference.dtype.is_floating_point or reference.dtype.is_complex:
            rtol, atol = _TOLERANCES.get(str(reference.dtype), (1e-2, 1e-2))
            if not _allclose_in_chunks(reference, candidate, rtol, atol):
                worst = max_abs_difference(reference, candidate)
                allowed = (noise or {}).get(at)
                if allowed is not None and worst <= allowed:
                    return None
                spread = f", run-to-run spread allowed {allowed:.3g}" if allowed is not None else ""
                return f"{path}: max abs difference {worst:.3g} (rtol {rtol}, atol {atol}{spread})"
            return None
        if not _equal_in_chunks(reference, candidate):
            flips = count_differences(reference, candidate)
            allowed = (noise or {}).get(at)
            if allowed is not None and flips <= allowed:
                return None  # Note: [Flips beside noise] in grace.noise
            beside = f", run-to-run flips allowed {int(allowed)}" if allowed is not None else ""
            return f"{path}: integer/bool values differ ({flips} of {reference.numel()}{beside})"
        return None
    if isinstance(reference, (list, tuple)) and isinstance(candidate, (list, tuple)):
        if len(reference) != len(candidate):
            return f"{path}: {len(reference)} vs {len(candidate)} items"
        for i, (r, c) in enumerate(zip(reference, candidate, strict=True)):
            if i in undefined:
                continue
            problem = outputs_match(r, c, f"{path}[{i}]", noise, f"{at}[{i}]")
            if problem:
                return problem
        return None
    if reference != candidate:
        return f"{path}: {reference!r} vs {candidate!r}"
    return None


# --- persistent decisions ----------------------------------------------------------------------


class DecisionCache:
    """Decisions of one cache directory: read once, merged and replaced atomically on each store."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / DECISIONS_FILE
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] | None = None
        self._foreign = False  # the file exists in another format: neither read nor write it

    def _read_file(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            logger.warning("grace: cannot read SCG decisions %s (%s); deciding again", self.path, exc)
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            logger.warning(
                "grace: %s is not valid JSON; deciding again (delete it to start afresh)", self.path
            )
            return {}
        if not isinstance(data, dict) or data.get("format") != DECISIONS_FORMAT:
            logger.warning("grace: %s is not a grace decision file; ignoring it", self.path)
            self._foreign = True
            return {}
        version = data.get("format_version")
        if version != DECISIONS_FORMAT_VERSION:
            logger.warning(
                "grace: %s has decision format version %r, this grace reads %d; ignoring it "
                "(upgrade grace or delete the file)",
                self.path,
                version,
                DECISIONS_FORMAT_VERSION,
            )
            self._foreign = True
            return {}
        decisions = data.get("decisions", {})
        return decisions if isinstance(decisions, dict) else {}

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = self._read_file()
        return self._entries

    def lookup(self, key: DecisionKey) -> dict[str, Any] | None:
        with self._lock:
            entry = self._load().get(key.digest)
        if entry is None or entry.get("key_fields") != _json_roundtrip(asdict(key)):
            return None
        return entry

    def store(self, key: DecisionKey, decision: Decision) -> None:
        entry = {
            "variant": decision.variant.value,
            "medians_ms": {k: v for k, v in decision.medians_ms.items()},
            "samples": {k: len(v) for k, v in decision.samples_ms.items()},
            "key_fields": _json_roundtrip(asdict(key)),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with self._lock:
            self._load()[key.digest] = entry
            if self._foreign:
                return
            merged = self._read_file()
            if self._foreign:
                return
            merged.update(self._entries or {})
            self._entries = merged
            self._write(merged)

    def _write(self, decisions: dict[str, dict[str, Any]]) -> None:
        payload = {
            "format": DECISIONS_FORMAT,
            "format_version": DECISIONS_FORMAT_VERSION,
            "decisions": decisions,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".scg-", suffix=".json", dir=self.path.parent)
            with os.fdopen(fd, "w") as handle:
                json.dump(payload, handle, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning(
                "grace: cannot write SCG decisions to %s (%s); they stay in memory", self.path, exc
            )


def _json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


_caches: dict[str, DecisionCache] = {}
_caches_lock = threading.Lock()


def decision_cache(directory: Path) -> DecisionCache:
    """The shared ``DecisionCache`` of ``directory``."""
    key = str(Path(directory).resolve())
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = DecisionCache(Path(directory))
        return cache


def forget_caches() -> None:
    """Drop in-memory copies (the files stay); the next lookup reads the file again."""
    with _caches_lock:
        _caches.clear()
