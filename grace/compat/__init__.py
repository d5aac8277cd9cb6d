"""The one place that knows how torch, Triton, CUDA and cuda-bindings differ between versions.

Modules: ``torch`` (Dynamo's registry, Inductor's compile, capture APIs), ``dynamo`` (what CGCT reads of
Dynamo, FX and Inductor), ``dispatch`` (a graph's effects, traced on fake tensors), ``generators`` (RNG
states), ``allocator`` (what a CUDA graph memory pool holds), ``triton`` (PTX, assembly, kernel
loading), ``inductor_kernels`` (the Triton kernels an Inductor module holds), ``cuda`` (the driver API
through cuda-bindings). Each exposes capabilities, not
version checks, probes once, and keeps the signatures of its fallbacks identical. No module outside this
package reads a private torch or Triton attribute (tests/test_structure.py checks it).
"""
