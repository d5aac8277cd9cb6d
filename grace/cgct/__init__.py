"""CGCT, CUDA-graph-aware code transformation: find what keeps a graph out of CUDA graphs and, where it
can be done without changing results, move it out of the way.

Public API (used by grace.backend):
- ``diagnose(gm, example_inputs) -> list[Diagnosis]``: every reason Inductor would refuse or split
  CUDA graphs for this graph on the running torch and configuration, with node and source line.
- ``transform(gm, example_inputs) -> CGCTResult``: the rewritten graph, its example inputs, the input
  adapter to apply to real inputs before each call (or None), and the diagnoses (``transformed`` says
  which ones CGCT fixed). May raise Dynamo's retrace request after moving CPU module attributes.

Modules: ``analysis`` (fake run, facts per node), ``plan`` (what may move), ``diagnose``,
``transforms/*`` (one rewrite each), ``adapter`` (work done in front of the graph), ``pipeline``
(``transform``), ``verify`` (CPU-only equivalence check), ``reasons`` (codes and Diagnosis),
``ops`` (operator tables).
"""

from __future__ import annotations

from grace.cgct.adapter import HoistStep, InputAdapter, MirrorStep
from grace.cgct.diagnose import diagnose
from grace.cgct.pipeline import CGCTResult, transform
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode
from grace.cgct.transforms.attributes import AttributePolicy, reset_moved_registry

__all__ = [
    "AttributePolicy",
    "CGCTResult",
    "Diagnosis",
    "Effect",
    "HoistStep",
    "InputAdapter",
    "MirrorStep",
    "ReasonCode",
    "diagnose",
    "reset_moved_registry",
    "transform",
]
