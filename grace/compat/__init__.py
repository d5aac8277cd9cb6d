"""The one place that knows how torch, Triton, CUDA and cuda-bindings differ between versions.

Modules: ``torch`` (Dynamo, Inductor, capture APIs), ``triton`` (PTX, assembly, kernel loading),
``cuda`` (driver API through cuda-bindings). Each exposes capabilities (``HAS_RAW_CUDA_GRAPH``), not
version checks, probes once, and keeps the signatures of its fallbacks identical.
"""
