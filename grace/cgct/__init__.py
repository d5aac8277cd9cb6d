"""CGCT, CUDA-graph-aware code transformation: find what keeps a graph out of CUDA graphs and, where it
can be done without changing results, move it out of the way.

Public API (used by grace.backend):
- ``diagnose(gm, example_inputs) -> list[Diagnosis]``: every reason Inductor would refuse or split
  CUDA graphs for this graph on the running torch and configuration, with node and source line.
- ``transform(gm, example_inputs) -> CGCTResult``: the rewritten graph, its example inputs, the input
  adapter to apply to real inputs before each call (or None), and the diagnoses (``transformed`` says
  which ones CGCT fixed). The user's objects are never changed: CPU module attributes stay on the
  CPU and the graph reads GPU mirrors of them.

Modules: ``analysis`` (fake run, facts per node), ``plan`` (what may move), ``diagnose``,
``transforms/*`` (one rewrite each), ``adapter`` (work done in front of the graph), ``pipeline``
(``transform``), ``verify`` (CPU-only equivalence check), ``reasons`` (codes and Diagnosis),
``ops`` (operator tables).
"""

from __future__ import annotations

from grace.cgct.adapter import HoistStep, InputAdapter, MirrorStep, MirrorSync
from grace.cgct.diagnose import diagnose
from grace.cgct.pipeline import CGCTResult, transform
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode

__all__ = [
    "CGCTResult",
    "Diagnosis",
    "Effect",
    "HoistStep",
    "InputAdapter",
    "MirrorStep",
    "MirrorSync",
    "ReasonCode",
    "diagnose",
    "transform",
]
